"""``manage.py slurm check`` and ``slurm import`` on the real test cluster: their words, exit codes and refusals.

The cluster (``tests/slurm/conftest.py``) has ``ascend-b4-01`` and ``-02`` with a GRES type per card and
``ascend-b4-03`` with ``npu:8``, all with ``Features=910B4``; the demo site has the first two, the
fixture adds the third, and the demo's ``ascend-a-01`` and ``ascend-310p-01`` are not in Slurm.
A controller that does not answer is a copy of the cluster's ``slurm.conf`` naming a port nothing
listens on: the session's cluster stays up for the other tests.
"""

from __future__ import annotations

from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from devices.models import Device, InventoryEvent, Node
from devices.services.registration import remove_node
from devices.slurm.cluster import LocalCluster, free_port
from quotas.models import AuditEvent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def slurm(*argv: str) -> tuple[int, str, str]:
    """``manage.py slurm ...``: exit code, stdout, stderr."""
    out, err = StringIO(), StringIO()
    try:
        call_command("slurm", *argv, stdout=out, stderr=err)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


@pytest.fixture
def controller_down(slurm_site: LocalCluster, settings: Any, tmp_path: Path) -> Path:
    """The portal pointed at a copy of the cluster's configuration whose controller port nobody listens on."""
    conf = tmp_path / "slurm.conf"
    lines = slurm_site.conf.read_text().splitlines()
    conf.write_text(
        "\n".join(f"SlurmctldPort={free_port()}" if line.startswith("SlurmctldPort=") else line for line in lines)
        + "\n"
    )
    (tmp_path / "gres.conf").write_text((slurm_site.conf.parent / "gres.conf").read_text())
    settings.NPUPORTAL_SLURM_CONF = str(conf)
    return conf


def test_check_says_what_slurm_offers_and_that_it_is_usable(slurm_site: LocalCluster) -> None:
    code, out, err = slurm("check")
    assert (code, err) == (0, ""), out
    lines = out.splitlines()
    assert lines[0].startswith("Slurm 2") and lines[0].endswith(f"configuration {slurm_site.conf}")
    assert lines[1].startswith("controller: reachable (Slurmctld(primary) at ") and lines[1].endswith(" is UP)")
    assert "partitions: main (default, up, nodes ascend-b4-[01-03])" in lines
    assert "nodes: 3" in lines
    text = "\n".join(lines)
    assert "  ascend-b4-01  IDLE       Gres=npu:c0:1,…,npu:c7:1  chip 910B4\n" in text
    assert "8 card(s), exact-card placement (each card its own GRES type)" in text
    assert "  ascend-b4-03  IDLE       Gres=npu:8  chip 910B4\n" in text
    assert "8 card(s), node-level placement, cards read back (a count of npu; Slurm picks the cards)" in text
    if slurm_site.accounting:
        assert "accounting: accounting_storage/slurmdbd, reachable (sacct answers)" in lines
    else:
        assert "accounting: none (AccountingStorageType=accounting_storage/none)" in lines
    assert lines[-1] == "usable: yes, the portal can run jobs on this Slurm"


def test_check_names_a_partition_the_settings_want_and_slurm_lacks(slurm_site: LocalCluster, settings: Any) -> None:
    settings.NPUPORTAL_SLURM_PARTITION = "gpu"
    code, out, _ = slurm("check")
    assert code == 1
    assert "problem: NPUPORTAL_SLURM_PARTITION='gpu' is no partition of this cluster (main)" in out.splitlines()
    assert out.splitlines()[-1] == "usable: NO"


def test_with_the_controller_down_check_says_so_and_import_refuses_in_one_line(controller_down: Path) -> None:
    code, out, err = slurm("check")
    assert code == 1 and "Traceback" not in out + err
    lines = out.splitlines()
    assert lines[1].startswith("controller: NOT reachable (Slurmctld(primary) at ") and lines[1].endswith(" is DOWN)")
    assert [line for line in lines if line.startswith("problem: ")] == [
        f"problem: the controller does not answer ({lines[1].split('(', 1)[1]}: nothing can be submitted"
    ]
    assert lines[-1] == "usable: NO"

    before = Node.objects.count()
    code, out, err = slurm("import", "--replace")
    assert (code, out) == (1, "")
    line = one_line(err)
    assert line.startswith("slurm import: Slurm's controller does not answer: Slurmctld(primary) at ")
    assert line.endswith(" is DOWN")
    assert Node.objects.count() == before


def test_import_refuses_an_unknown_chip_or_partition_and_changes_nothing(slurm_site: LocalCluster) -> None:
    events = InventoryEvent.objects.count()
    code, out, err = slurm("import", "--chip", "H100")
    assert (code, out) == (2, "")
    assert one_line(err).startswith("slurm import: --chip 'H100' is not an Ascend chip model (one of 310, 310P3, 910A,")
    code, out, err = slurm("import", "--partition", "gpu")
    assert (code, out) == (1, "")
    assert one_line(err) == "slurm import: no partition 'gpu' in Slurm (its partitions: main)"
    assert InventoryEvent.objects.count() == events


def test_import_adds_and_updates_slurms_nodes_then_replace_removes_the_others(slurm_site: LocalCluster) -> None:
    remove_node("ascend-b4-03", actor=None, reason="gone for the test")
    Device.objects.filter(node__name="ascend-b4-02", index=7).update(chip_model="910B3")
    Device.objects.filter(node__name="ascend-b4-01", index=0).update(schedulable=False)
    Device.objects.create(node=Node.objects.get(name="ascend-b4-01"), index=8, chip_model="910B4")

    code, out, err = slurm("import")
    assert (code, err) == (0, ""), out
    assert out.splitlines() == [
        "changed node ascend-b4-01: card 0 is back; card 8 gone (kept, no longer scheduled)",
        "changed node ascend-b4-02: card 7 is 910B4, was 910B3",
        "re-added node ascend-b4-03: 8 card(s) 0-7 (910B4), node-level placement, cards read back",
        "import from Slurm: 1 added, 2 changed",
    ]
    assert Node.objects.get(name="ascend-b4-03").removed_at is None
    b4_01 = Device.objects.filter(node__name="ascend-b4-01")
    assert sorted(d.index for d in b4_01 if d.usable) == list(range(8)), "card 8 is not Slurm's: not scheduled"
    assert AuditEvent.objects.filter(action="node.update", target="ascend-b4-02").last().detail == (
        "from Slurm: card 7 is 910B4, was 910B3"
    )
    joined = InventoryEvent.objects.filter(node_name="ascend-b4-03").order_by("-id").first()
    assert (joined.status, joined.cause) == ("usable", "rejoined: registered from Slurm")
    assert set(Node.objects.filter(removed_at__isnull=True).values_list("name", flat=True)) >= {
        "ascend-a-01",
        "ascend-310p-01",
    }, "without --replace the portal's other nodes stay"

    history = (InventoryEvent.objects.count(), AuditEvent.objects.count())
    code, out, err = slurm("import", "--partition", "main")
    assert (code, out, err) == (
        0,
        "nothing to change: the portal's nodes are those of Slurm partition main (3 unchanged)\n",
        "",
    )
    assert (InventoryEvent.objects.count(), AuditEvent.objects.count()) == history, "a repeated import writes nothing"

    code, out, err = slurm("import", "--replace")
    assert (code, err) == (0, ""), out
    assert out.splitlines() == [
        "removed node ascend-310p-01: not in Slurm",
        "removed node ascend-a-01: not in Slurm",
        "import from Slurm: 2 removed, 3 unchanged",
    ]
    assert sorted(Node.objects.filter(removed_at__isnull=True).values_list("name", flat=True)) == [
        "ascend-b4-01",
        "ascend-b4-02",
        "ascend-b4-03",
    ]
    gone = InventoryEvent.objects.filter(node_name="ascend-a-01").order_by("-id").first()
    assert (gone.status, gone.cause) == ("removed", "node removed; removed: not in Slurm (slurm import --replace)")
    code, out, _ = slurm("import", "--replace")
    assert (code, out) == (0, "nothing to change: the portal's nodes are those of Slurm (3 unchanged)\n")
    code, out, _ = slurm("import", "--chip", "910B3")
    assert (code, out.splitlines()) == (
        0,
        [
            "changed node ascend-b4-01: cards 0-7 are 910B3, were 910B4",
            "changed node ascend-b4-02: cards 0-7 are 910B3, were 910B4",
            "changed node ascend-b4-03: cards 0-7 are 910B3, were 910B4",
            "import from Slurm: 3 changed",
        ],
    ), "--chip wins over Slurm's feature"


def test_a_node_slurm_names_no_chip_for_is_left_out_until_chip_is_given(db, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm's answers stand in for a cluster whose nodes have no chip feature (no Slurm needed)."""
    from devices.slurm import survey

    lines = (
        "NodeName=npu9 AvailableFeatures=ib Gres=npu:4 State=IDLE Partitions=main\n"
        "NodeName=cpu1 AvailableFeatures=(null) Gres=(null) State=IDLE Partitions=main\n"
    )
    monkeypatch.setattr(survey, "ping", lambda: (True, "Slurmctld(primary) at vm is UP"))
    monkeypatch.setattr(survey, "nodes", lambda: survey.parse_nodes(lines))
    monkeypatch.setattr(survey, "partitions", lambda: [survey.Partition("main", True, "UP", "npu9,cpu1")])
    code, out, err = slurm("import")
    assert (code, err) == (1, "")
    assert out.splitlines() == [
        "skipped node cpu1: it declares no npu GRES (Gres=(none))",
        "skipped node npu9: no chip model: its GRES type and features (ib) name none; give --chip",
        "import from Slurm: 1 left out",
    ]
    assert not Node.objects.filter(name="npu9").exists()
    code, out, _ = slurm("import", "--chip", "910B2")
    assert code == 0
    assert "added node npu9: 4 card(s) 0-3 (910B2), node-level placement, cards read back" in out.splitlines()
    assert Device.objects.get(node__name="npu9", index=3).ai_cores == 24, "the chip's published figures"
