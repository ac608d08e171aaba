"""Slurm's command-line tools as the portal calls them: the cluster's ``SLURM_CONF``, a timeout, no shell.

The executor (``devices.executors.slurm``), the survey of the cluster (``devices.slurm.survey``)
and the commands of ``manage.py slurm`` all call Slurm through :func:`run`, so each call has the
same environment, timeout and error words.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence

from django.conf import settings

#: Seconds any one Slurm command may take before it counts as failed (the controller is down, say).
COMMAND_TIMEOUT_S = 30.0


class SlurmError(RuntimeError):
    """A Slurm command failed, timed out or is missing; the message is its own words."""


def slurm_env() -> dict[str, str]:
    """This process's environment with the cluster's ``SLURM_CONF`` (the setting wins over the environment)."""
    env = dict(os.environ)
    conf = getattr(settings, "NPUPORTAL_SLURM_CONF", "") or env.get("SLURM_CONF", "")
    if conf:
        env["SLURM_CONF"] = conf
    return env


def run(argv: Sequence[str], *, stdin: str | None = None, timeout: float = COMMAND_TIMEOUT_S) -> str:
    """Run one Slurm command (no shell) and return its standard output; :class:`SlurmError` otherwise."""
    try:
        done = subprocess.run(
            list(argv),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=slurm_env(),
        )
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} did not answer within {timeout:.0f} s") from None
    except OSError as exc:
        raise SlurmError(f"{argv[0]}: {exc.strerror or exc}") from None
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise SlurmError(f"{argv[0]}: {why[-1] if why else f'exit status {done.returncode}'}")
    return done.stdout


def key_values(line: str) -> dict[str, str]:
    """``Key=value`` pairs of one line of ``scontrol show … -o`` (a value ends at the next space)."""
    return dict(re.findall(r"(\w+)=(\S*)", line))


def parse_gres(text: str) -> tuple[tuple[int, ...], bool]:
    """``(cards, per card)`` of a node's ``Gres=``: ``npu:c0:1,npu:c1:1`` → ``((0, 1), True)``, ``npu:8`` → 8 cards."""
    typed: list[int] = []
    count = 0
    per_card = True
    for item in text.split(","):
        parts = re.sub(r"\(.*?\)", "", item).split(":")
        if parts[0] != "npu":
            continue
        if len(parts) == 3 and re.fullmatch(r"c[0-9]+", parts[1]) and parts[2] == "1":
            typed.append(int(parts[1][1:]))
        else:
            per_card = False
            count += int(parts[-1]) if parts[-1].isdigit() else 0
    if typed and per_card:
        return tuple(sorted(typed)), True
    return tuple(range(count + len(typed))), False


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed node list in full: ``npu[1-2,4],gpu7`` → ``['npu1', 'npu2', 'npu4', 'gpu7']``.

    ``squeue``'s ``%N`` and ``scontrol show job -d``'s ``Nodes=`` group nodes so; a range keeps its
    zero padding (``ascend-b4-[01-02]``). A name with several bracket groups expands each in turn.
    """
    found: list[str] = []
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text.strip()):
        bracket = re.match(r"([^\[]*)\[([^\]]*)\](.*)", item)
        if bracket is None:
            found.append(item)
            continue
        prefix, ranges, rest = bracket.groups()
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                continue
            for number in range(int(low), int(high or low) + 1):
                found.extend(prefix + str(number).zfill(len(low)) + tail for tail in expand_hostlist(rest) or [""])
    return found


def expand_indexes(text: str) -> list[int]:
    """``0-1,4`` → ``[0, 1, 4]``."""
    found: list[int] = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            found.extend(range(int(low), int(high or low) + 1))
    return found
