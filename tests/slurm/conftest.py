"""A real single-host Slurm for the Slurm executor's tests (``devices.slurm.cluster``), and a portal site on it.

One cluster per test session (per xdist worker): three nodes named as the portal's 910B4 nodes, exact
cards (``npu:c0:1,…``) on two and a plain ``npu:8`` on the third, slurmdbd on the local MariaDB when
there is one. Every daemon is stopped by pid at the end. Without Slurm's commands the tests are
skipped, saying so (``make test`` installs them when run as root).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devices.slurm.cluster import ClusterError, LocalCluster, SlurmNode, missing_commands
from tests.conftest import training_lead_submitter
from tests.test_lifecycle_harness import eager_celery
from tests.waiting import wait_for

__all__ = ["eager_celery"]

#: Named as the demo's 910B4 nodes, plus a third the site fixture adds.
SLURM_NODES = (
    SlurmNode("ascend-b4-01", per_card=True),
    SlurmNode("ascend-b4-02", per_card=True),
    SlurmNode("ascend-b4-03", per_card=False),
)
COUNT_NODE = "ascend-b4-03"


def session_cluster() -> Iterator[LocalCluster]:
    """The session's Slurm cluster, as the ``slurm_cluster`` fixture (tests/conftest.py) yields it.

    The fixture is defined there, once, so that these tests and the executor journey
    (tests/test_executor_journey.py) share one cluster per session rather than starting two.
    """
    started = time.monotonic()
    cluster, root = _start(bool(shutil.which("mariadb") or shutil.which("mysql")))
    print(f"\nSlurm test cluster up in {time.monotonic() - started:.1f} s (accounting: {cluster.accounting})")
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def _start(accounting: bool) -> tuple[LocalCluster, Path]:
    """A cluster of the test nodes in a folder of its own under ``/tmp``; skipped without Slurm."""
    missing = missing_commands()
    if missing:
        pytest.skip(f"Slurm is not installed here (no {', '.join(missing)}): `make test` installs it as root")
    # Under /tmp itself, not pytest's 0700 folders: jobs run as another account read and write here.
    root = Path(tempfile.mkdtemp(prefix="npuportal-slurm-"))
    # ReturnToService=1: a node a test sets DOWN stays down until it is resumed, as on a site.
    cluster = LocalCluster(root, nodes=SLURM_NODES, accounting=accounting, return_to_service=1)
    try:
        try:
            cluster.start()
        except ClusterError:
            if not accounting:
                raise
            cluster = LocalCluster(root, nodes=SLURM_NODES, accounting=False, return_to_service=1)  # no MariaDB
            cluster.start()
    except ClusterError as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"the test Slurm cluster did not start: {exc}")
    return cluster, root


@pytest.fixture
def own_slurm_cluster() -> Iterator[LocalCluster]:
    """A cluster for one test alone: its accounting holds only that test's jobs, and it may be broken.

    For the tests that stop Slurm's daemons or read a month's whole accounting; a few seconds to start.
    """
    cluster, root = _start(bool(shutil.which("mariadb") or shutil.which("mysql")))
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def own_slurm_site(demo, eager_celery, own_slurm_cluster: LocalCluster, settings: Any) -> LocalCluster:
    """:func:`slurm_site` on a cluster of the test's own (:func:`own_slurm_cluster`)."""
    return _site(own_slurm_cluster, settings)


@pytest.fixture
def slurm_site(demo, eager_celery, slurm_cluster: LocalCluster, settings: Any) -> LocalCluster:
    """The demo site run by the Slurm cluster: ``NPUPORTAL_EXECUTOR=slurm`` and a third 910B4 node."""
    return _site(slurm_cluster, settings)


def _site(cluster: LocalCluster, settings: Any) -> LocalCluster:
    """Point the portal at ``cluster`` and add the third 910B4 node.

    The training lead's jobs run as ``nobody`` when the tests run as root (the portal's test
    users have no POSIX accounts), else as the tests' own account.
    """
    from django.contrib.auth import get_user_model

    from devices.models import Device, Node
    from quotas.models import UserProfile

    settings.NPUPORTAL_EXECUTOR = "slurm"
    settings.NPUPORTAL_SLURM_CONF = str(cluster.conf)
    settings.NPUPORTAL_SLURM_OUTPUT_DIR = str(cluster.root / "out")
    in_service(cluster)
    node = Node.objects.create(name=COUNT_NODE, labels={"rack": "r1"})
    for device in Device.objects.filter(node__name="ascend-b4-01").order_by("index"):
        Device.objects.create(
            node=node,
            index=device.index,
            chip_model=device.chip_model,
            hbm_mb=device.hbm_mb,
            ai_cores=device.ai_cores,
            ai_cpus=device.ai_cpus,
            topology_group=device.topology_group,
        )
    if os.geteuid() == 0:
        lead = get_user_model().objects.get(username="lead-training")
        UserProfile.objects.update_or_create(user=lead, defaults={"posix_user": "nobody"})
    return cluster


def in_service(cluster: LocalCluster) -> None:
    """Every node of the session's cluster back in service: a test before may have drained or downed one.

    The database starts afresh with each test, Slurm does not: a drain the portal or a test left
    would hold the next test's jobs pending. A node just resumed reads ``IDLE+NOT_RESPONDING``
    until the controller's next ping of it (a second or so), so that is waited for too.
    """
    from devices.slurm import survey
    from devices.slurm.commands import run

    for node in survey.nodes():
        if node.drained or node.down:
            run(["scontrol", "update", f"NodeName={node.name}", "State=RESUME"])

    def ready(node: survey.NodeReport) -> bool:
        answering = "NOT_RESPONDING" not in node.flags and not node.state.split("+", 1)[0].endswith("*")
        return answering and not (node.drained or node.down)

    wait_for(
        survey.nodes,
        until=lambda nodes: all(ready(n) for n in nodes),
        interval=0.2,
        message="every Slurm node back in service and answering",
    )


def outside_job(node: str, cards: list[int]) -> str:
    """``sbatch`` on ``node``'s ``cards`` with no portal comment, as a person with a shell on the cluster would.

    Returns Slurm's id of that job once it runs.
    """
    from devices.executors.slurm import squeue
    from devices.slurm.commands import run

    argv = ["sbatch", "--parsable", f"--nodelist={node}", "--gres=" + ",".join(f"npu:c{c}:1" for c in cards)]
    argv += ["--chdir=/tmp", "--output=/dev/null", "--job-name=outside", "--wrap=sleep 600"]
    if os.geteuid() == 0:
        argv.append("--uid=nobody")
    slurm_id = run(argv).strip().split(";")[0]
    wait_for(
        lambda: squeue().get(slurm_id),
        until=lambda q: q is not None and q.state == "RUNNING",
        message=f"outside Slurm job {slurm_id} to run",
    )
    return slurm_id


@pytest.fixture
def submit_slurm(demo) -> Callable[..., Any]:
    """Submit a 910B4 job as the training lead (on whichever Slurm site the test asked for)."""
    return training_lead_submitter()
