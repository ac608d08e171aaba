"""A job's output: read from the node's agent while it has it, and from the copy kept when a run ended.

Each start of a job is a *run* (``attempt`` 1, 2, …, the ``<job>.<attempt>`` ids of the agents) on one
or more nodes. The agent writes each run's stdout and stderr, interleaved, to one file per node and
serves byte ranges of it; when a run ends the poll keeps its last :attr:`JobOutput.KEPT_BYTES` here,
so the output outlives the node. Offsets are byte offsets of the node's file either way: a follower
(the job page, ``npuctl logs -f``) asks again from ``next_offset`` and never sees a byte twice.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from devices.agent.jobs import log_lines
from devices.executors import get_executor
from devices.models import Node
from devices.services.agent_client import AgentClient, AgentError
from scheduling.launch_spec import output_file as output_file  # where it lived before
from scheduling.models import Allocation, Job, JobOutput

log = logging.getLogger(__name__)

#: ``?tail=N`` answers at most this many lines (the agent's own bound too).
MAX_TAIL_LINES = 10000


class OutputError(ValueError):
    """A question about output that has no answer; ``field`` names the parameter (a 400)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Run:
    attempt: int
    nodes: tuple[str, ...]  # by name, the first server first


def runs_of(job: Job) -> list[Run]:
    """Every start of ``job`` in order, with the nodes it ran on (from its allocations)."""
    starts: dict[object, set[str]] = {}
    for start, node in Allocation.objects.filter(job=job).order_by("start").values_list("start", "device__node__name"):
        starts.setdefault(start, set()).add(node)
    return [Run(i, tuple(sorted(nodes))) for i, nodes in enumerate(starts.values(), start=1)]


#: sbatch's file name patterns an output path may hold (``--output=logs/%x-%j.out``).


def run_id(job_id: int, attempt: int) -> str:
    """The id the agents know a run by (``devices.services.polling.agent_job_id``)."""
    return f"{job_id}.{attempt}"


def read_output(
    job: Job,
    *,
    offset: int | None = None,
    tail: int | None = None,
    attempt: int | None = None,
    node: str | None = None,
) -> dict[str, Any]:
    """``{"offset", "next_offset", "data", "complete", ...}`` of one run on one node (default: the latest, the first).

    ``complete`` is true once the run has ended and the answer reaches the end of what it wrote
    (or nothing more can be had): a follower stops there.
    """
    if offset is not None and tail is not None:
        raise OutputError("tail", "give offset or tail, not both")
    found_run = _locate(job, attempt, node)
    if found_run is None:
        start = offset or 0
        return _answer(start, start, "", job.is_final, attempt=None, attempts=0, node=None, nodes=[], source="none")
    attempt, node, ended, where = found_run
    saved = JobOutput.objects.filter(job=job, attempt=attempt, node=node).first()
    if saved is not None and (tail is not None or offset is None or offset >= saved.offset):
        return _from_saved(saved, offset, tail, where)
    client = _agent(node)
    try:
        found = client.log(run_id(job.pk, attempt), offset=offset, tail=tail) if client else None
        note = None if found is not None else f"node {node} no longer has this run's output"
    except AgentError as exc:
        found, note = None, f"node {node} did not answer ({exc})"
    if found is not None and found.get("removed_at"):  # removed to keep the node's output budget: say when
        note = f"node {node}: {found.get('note') or 'the output was removed'}"
        ended, found = True, None
    if found is not None:
        if found.get("complete") and saved is None:
            keep_output(job.pk, attempt, node)
        complete = bool(found.get("complete")) or (ended and found.get("state") in (None, "lost"))
        answer = _answer(
            int(found["offset"]), int(found["next_offset"]), found["data"], complete, source="agent", **where
        )
        answer["size"] = _whole(found.get("size"))
        answer["lines"] = _whole(found.get("lines"))  # tail answers only: the agent counts them then
        return answer
    if saved is not None:
        answer = _from_saved(saved, None, None, where)
        answer["note"] = f"{note}; the end of its output is kept from byte {saved.offset}"
        return answer
    start = offset or 0
    return _answer(start, start, "", ended, source="none", note=note, **where)


def _locate(job: Job, attempt: int | None, node: str | None) -> tuple[int, str, bool, dict[str, Any]] | None:
    """``(attempt, node, ended, where)`` of the run asked for (default: the latest, its first node); ``None``
    when the job never started. ``OutputError`` names ``attempt`` or ``node`` when there is no such run."""
    runs = runs_of(job)
    if not runs:
        if attempt is not None:
            raise OutputError("attempt", f"job {job.pk} has not started yet, so it has no runs")
        return None
    if attempt is None:
        attempt = len(runs)
    elif not 1 <= attempt <= len(runs):
        raise OutputError("attempt", f"job {job.pk} has runs 1 to {len(runs)}, not {attempt}")
    run = runs[attempt - 1]
    if node is None:
        node = run.nodes[0]
    elif node not in run.nodes:
        raise OutputError("node", f"run {attempt} of job {job.pk} ran on {', '.join(run.nodes)}, not {node!r}")
    ended = attempt < len(runs) or job.state != Job.State.RUNNING
    return attempt, node, ended, {"attempt": attempt, "attempts": len(runs), "node": node, "nodes": list(run.nodes)}


@dataclass(frozen=True)
class Download:
    """One run's whole output on one node, as a file: its name and its bytes, read as they are sent."""

    filename: str
    chunks: Iterator[bytes]


def download_output(job: Job, *, attempt: int | None = None, node: str | None = None) -> Download:
    """The whole output of one run on one node (default: the latest run, its first node), for a download.

    Read from the node's agent a page at a time while it is sent, so a 64 MiB log is never held
    whole; where the node no longer has it, the kept end follows a line saying which bytes are
    missing and why, so a downloaded file never passes for whole when it is not.
    """
    found_run = _locate(job, attempt, node)
    if found_run is None:
        return Download(f"job-{job.pk}.log", iter([b"[npuportal: this job has not started, so it has no output]\n"]))
    attempt, node, _ended, _where = found_run
    saved = JobOutput.objects.filter(job=job, attempt=attempt, node=node).first()
    client = _agent(node)
    name = f"job-{job.pk}-run-{attempt}-{re.sub(r'[^A-Za-z0-9._-]', '_', node)}.log"
    return Download(name, _chunks(client, run_id(job.pk, attempt), node, saved))


def _chunks(client: AgentClient | None, rid: str, node: str, saved: JobOutput | None) -> Iterator[bytes]:
    """The bytes of a run's log from its agent, page by page; the kept end (or a line why not) for the rest."""
    offset = 0
    while saved is None or offset < saved.offset:
        try:
            found = client.log(rid, offset=offset) if client is not None else None
            why = f"node {node} no longer has this run's output" if found is None else ""
        except AgentError as exc:
            found, why = None, f"node {node} did not answer ({exc})"
        if found is None:
            if saved is None:
                yield f"[npuportal: the output from byte {offset} on could not be read: {why}]\n".encode()
                return
            yield f"[npuportal: bytes {offset} to {saved.offset} of this output were left out: {why}]\n".encode()
            break
        data = str(found.get("data") or "").encode()
        yield data
        offset = int(found["next_offset"])
        if not data or offset >= int(found.get("size", offset)):
            return  # the end of what the run has written (a kept end is a copy of its last part)
    if saved is not None:
        raw = saved.data.encode()
        yield raw[max(0, offset - saved.offset) :]


def _agent(name: str) -> AgentClient | None:
    """What serves the output of runs on node ``name``: its agent, or the executor's own reader (Slurm's files)."""
    reader = getattr(get_executor(), "output_reader", None)
    if reader is not None:
        return reader(name)  # the agent client's ``log``, read from the run's file
    node = Node.objects.filter(name=name).exclude(agent_url="").first()
    return AgentClient(node) if node is not None else None


def _answer(offset: int, next_offset: int, data: str, complete: bool, **extra: Any) -> dict[str, Any]:
    return {
        "offset": offset,
        "next_offset": next_offset,
        "data": data,
        "complete": complete,
        "note": None,
        "size": None,
        "lines": None,
        **extra,
    }


def _whole(value: object) -> int | None:
    """A count from an agent's answer, or ``None`` when it gave none (an older agent) or not a number."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def line_count(text: str) -> int:
    """Lines in ``text`` as a terminal shows them: a last line without its newline counts too."""
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def _from_saved(saved: JobOutput, offset: int | None, tail: int | None, where: dict[str, Any]) -> dict[str, Any]:
    raw = saved.data.encode()
    end = saved.offset + len(raw)
    if tail is not None:
        lines = log_lines(raw)
        chunk = b"".join(lines[-tail:]) if tail > 0 else b""
        begin = end - len(chunk)
    else:
        begin = min(max(offset or saved.offset, saved.offset), end)
        chunk = raw[begin - saved.offset :]
    answer = _answer(begin, end, chunk.decode("utf-8", errors="replace"), True, source="saved", **where)
    answer["size"] = saved.size
    answer["lines"] = saved.lines if saved.lines is not None else (line_count(saved.data) if not saved.offset else None)
    return answer


def keep_output(job_id: int, attempt: int, node: str) -> bool:
    """Copy the end of an ended run's output from its node into the database; False if it could not be read."""
    client = _agent(node)
    if client is None:
        return False
    rid = run_id(job_id, attempt)
    try:
        first = client.log(rid, offset=0)
        if first is None or first.get("removed_at"):  # gone from the node: nothing to keep
            return False
        size = int(first.get("size", first["next_offset"]))
        if size <= first["next_offset"] and size <= JobOutput.KEPT_BYTES:
            begin, data = 0, first["data"]
        else:
            last = client.log(rid, offset=max(0, size - JobOutput.KEPT_BYTES))
            if last is None:
                return False
            begin, data = int(last["offset"]), last["data"]
            if begin > 0 and "\n" in data:  # start at a line, as a tail would
                cut = data.index("\n") + 1
                begin += len(data[:cut].encode())
                data = data[cut:]
            size = int(last.get("size", size))
        # How many lines the whole log has, for "the last 500 of 50,001 lines" once the node is gone.
        lines = line_count(data) if begin == 0 else _whole((client.log(rid, tail=0) or {}).get("lines"))
    except (AgentError, KeyError, TypeError, ValueError) as exc:
        log.info("could not keep the output of run %s from %s: %s", rid, node, exc)
        return False
    JobOutput.objects.update_or_create(
        job_id=job_id,
        attempt=attempt,
        node=node,
        defaults={"offset": begin, "size": size, "lines": lines, "data": data},
    )
    return True


def keep_outputs(job_ids: Iterable[int]) -> int:
    """After a poll: keep the output of the latest run of each job that just ended, on each of its nodes."""
    kept = 0
    for job in Job.objects.filter(pk__in=list(job_ids)):
        runs = runs_of(job)
        if not runs:
            continue
        run = runs[-1]
        for node in run.nodes:
            if not JobOutput.objects.filter(job=job, attempt=run.attempt, node=node).exists():
                kept += keep_output(job.pk, run.attempt, node)
    return kept
