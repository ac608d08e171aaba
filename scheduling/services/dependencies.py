"""A job's dependencies (``depends_on``), as Slurm's ``--dependency`` writes them: read, checked, and where they stand.

**Syntax** (docs/api.md#dependencies): clauses joined by commas, all of which must hold (Slurm's
``,``; its ``?``, *any of*, is not taken), each ``TYPE:REF[:REF...]``:

* ``afterok`` — the jobs completed (exit 0); ``afterany`` — they ended, however; ``afternotok`` —
  they ended without completing (failed, timeout, out of memory, node failure, cancelled, preempted);
* a ``REF`` is a job id (``12``), an array (``A12``, every copy), or one copy of an array by index
  (``12_3`` or ``A12_3``, Slurm's ``<array job id>_<index>``). As in Slurm, the id of an array's
  first job is the array's id (``SLURM_ARRAY_JOB_ID``): ``afterok:12`` waits for every copy of
  array ``A12``; ``12_0`` is that first copy alone.

The API takes the string, or a list whose items are such clauses, bare job ids (``afterok``) or
``{"type": "afterok", "job": 12}`` objects. What is stored is the normalised string, each REF
resolved: ``12`` is then job 12 and ``A12`` the whole array, so a stored dependency is read back
without looking anything up.

**Who may depend on what**: a job of your teams (an admin: any). A REF that does not exist and one of
another team get the same refusal, so ids of other teams' jobs cannot be probed.

**Where they stand** (:func:`standings`, read by the tick's snapshot): satisfied, not yet (the job
waits with ``Dependency``), or never (cancelled with ``DependencyNeverSatisfied``); the rule is
the engine's (``scheduling.engine.dependency``), the reading of job states is here.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count

from quotas.tenancy.visibility import only_visible
from scheduling.engine.snapshot import Dependencies
from scheduling.models import Job

#: Dependency types, Slurm's names; what each waits for, in words.
KINDS = {"afterok": "complete", "afterany": "end", "afternotok": "end without completing"}
#: Jobs and arrays one job may depend on, and the characters of their stored form (a list row stays bounded).
MAX_REFERENCES = 100
MAX_CHARS = 1024
_REF = re.compile(r"(?P<array>A)?(?P<id>\d{1,18})(?:_(?P<index>\d{1,9}))?")


class DependencyError(ValueError):
    """``depends_on`` cannot be taken; the message says why (the caller names the field)."""


@dataclass(frozen=True)
class Ref:
    """One job (``job``) or every copy of one array (``array``, ``"A12"``) that a job depends on."""

    kind: str
    job: int | None = None
    array: str | None = None

    @property
    def token(self) -> str:
        return self.array if self.array is not None else str(self.job)


def parse(value: object) -> list[tuple[str, str]]:
    """``(type, REF as written)`` of every reference in ``value``; ``DependencyError`` saying what is wrong."""
    if value is None or value == "":
        return []
    clauses: list[str] = []
    if isinstance(value, str):
        clauses = value.split(",")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, bool):
                raise DependencyError("list items are job ids, 'type:id' strings or {type, job} objects")
            if isinstance(item, int):
                clauses.append(f"afterok:{item}")
            elif isinstance(item, str):
                clauses.append(item)
            elif isinstance(item, dict) and set(item) <= {"type", "job"} and "job" in item:
                job = item["job"]
                if isinstance(job, bool) or not isinstance(job, int | str):
                    raise DependencyError("each object's job is a job id such as 12 (or an array such as A12)")
                clauses.append(f"{item.get('type', 'afterok')}:{job}")
            else:
                raise DependencyError("list items are job ids, 'type:id' strings or {type, job} objects")
    else:
        raise DependencyError("must be a string such as 'afterok:12:13,afterany:14' or a list")
    if any("?" in clause for clause in clauses):
        raise DependencyError("'?' (any of) is not supported; give clauses that must all hold, joined by ','")
    refs: list[tuple[str, str]] = []
    for clause in clauses:
        kind, sep, rest = clause.strip().partition(":")
        if kind not in KINDS:
            shown = kind or clause.strip()
            raise DependencyError(f"{shown!r} is not a dependency type; one of {', '.join(KINDS)}")
        tokens = rest.split(":") if sep else []
        if not tokens or any(not t.strip() for t in tokens):
            raise DependencyError(f"{kind} needs job ids after it, such as {kind}:12 or {kind}:12:13")
        for token in tokens:
            token = token.strip()
            if not _REF.fullmatch(token):
                raise DependencyError(f"{token!r} is not a job id (12), an array (A12) or an array's copy (12_3)")
            refs.append((kind, token))
    if len(refs) > MAX_REFERENCES:
        raise DependencyError(f"names {len(refs)} jobs; at most {MAX_REFERENCES}")
    return refs


def resolve(value: object, user: AbstractBaseUser) -> str:
    """The stored form of ``value`` for a job ``user`` submits: each REF checked and resolved ('' for none).

    One query for the jobs named by id, one for the arrays and copies; a REF ``user`` may not see
    reads exactly as one that does not exist.
    """
    written = parse(value)
    if not written:
        return ""
    visible = only_visible(Job.objects.all(), user)
    ids = {int(m["id"]) for _, t in written if (m := _REF.fullmatch(t)) and not m["array"] and not m["index"]}
    arrays = {f"A{m['id']}" for _, t in written if (m := _REF.fullmatch(t)) and (m["array"] or m["index"])}
    jobs = dict(visible.filter(pk__in=ids).values_list("pk", "array_id")) if ids else {}
    copies: dict[tuple[str, int], int] = {}
    known_arrays: set[str] = set()
    if arrays:
        for pk, array_id, index in visible.filter(array_id__in=arrays).values_list("pk", "array_id", "array_index"):
            known_arrays.add(array_id)
            copies[(array_id, index)] = pk
    refs: list[Ref] = []
    for kind, token in written:
        m = _REF.fullmatch(token)
        assert m is not None
        if m["index"] is not None:
            array = f"A{m['id']}"
            pk = copies.get((array, int(m["index"])))
            if pk is None:
                raise DependencyError(f"job {token}: no such job in your teams")
            refs.append(Ref(kind, job=pk))
        elif m["array"]:
            if token not in known_arrays:
                raise DependencyError(f"array {token}: no such array in your teams")
            refs.append(Ref(kind, array=token))
        else:
            pk = int(m["id"])
            if pk not in jobs:
                raise DependencyError(f"job {token}: no such job in your teams")
            # Slurm's array job id is its first job's id: the whole array.
            refs.append(Ref(kind, array=f"A{pk}") if jobs[pk] == f"A{pk}" else Ref(kind, job=pk))
    text = text_of(refs)
    if len(text) > MAX_CHARS:
        raise DependencyError(f"is {len(text):,} characters once resolved; at most {MAX_CHARS:,}")
    return text


def text_of(refs: Iterable[Ref]) -> str:
    """``afterok:12:A14,afterany:15``: each type once, in the order first given, each REF once."""
    by_kind: dict[str, list[str]] = {}
    for ref in refs:
        tokens = by_kind.setdefault(ref.kind, [])
        if ref.token not in tokens:
            tokens.append(ref.token)
    return ",".join(f"{kind}:{':'.join(tokens)}" for kind, tokens in by_kind.items())


def stored(text: str) -> list[Ref]:
    """The references of a stored ``depends_on`` (resolved when it was submitted)."""
    refs = []
    for kind, token in parse(text):
        refs.append(Ref(kind, array=token) if token.startswith("A") else Ref(kind, job=int(token)))
    return refs


def standings(rows: Iterable[tuple[int, str]]) -> dict[int, Dependencies]:
    """For each ``(job id, stored depends_on)``, where its dependencies stand, if not all satisfied.

    Two queries whatever the number of jobs: the states of the jobs named, and the states of
    the copies of the arrays named, counted per array.
    """
    parsed = {text: stored(text) for _, text in rows}
    if not parsed:
        return {}
    ids = {ref.job for refs in parsed.values() for ref in refs if ref.job is not None}
    arrays = {ref.array for refs in parsed.values() for ref in refs if ref.array is not None}
    states: dict[int, str] = dict(Job.objects.filter(pk__in=ids).values_list("pk", "state")) if ids else {}
    copies: dict[str, Counter[str]] = {}
    if arrays:
        for array_id, state, n in (
            Job.objects.filter(array_id__in=arrays).order_by().values_list("array_id", "state").annotate(n=Count("id"))
        ):
            copies.setdefault(array_id, Counter())[state] += n
    verdicts: dict[str, Dependencies | None] = {text: _standing(refs, states, copies) for text, refs in parsed.items()}
    return {job_id: found for job_id, text in rows if (found := verdicts[text]) is not None}


def _standing(refs: list[Ref], states: dict[int, str], copies: dict[str, Counter[str]]) -> Dependencies | None:
    """``None`` when every reference is satisfied; else what it waits for, or the first that never will be."""
    waiting: list[str] = []
    for ref in refs:
        verdict, words = _one(ref, states, copies)
        if verdict == "never":
            return Dependencies(True, f"{ref.kind}:{ref.token} can never be satisfied: {words}")
        if verdict == "wait":
            waiting.append(words)
    return Dependencies(False, "waits for " + "; ".join(waiting)) if waiting else None


def _one(ref: Ref, states: dict[int, str], copies: dict[str, Counter[str]]) -> tuple[str, str]:
    """``("ok" | "wait" | "never", words)`` for one reference."""
    final, bad = Job.FINAL_STATES, Job.UNSUCCESSFUL_STATES
    verb = KINDS[ref.kind]
    if ref.job is not None:
        state = states.get(ref.job)
        if state is None:
            return "never", f"job {ref.job} no longer exists"
        if ref.kind == "afterok":
            if state == Job.State.COMPLETED:
                return "ok", ""
            if state in bad:
                return "never", f"job {ref.job} ended {state}"
        elif ref.kind == "afterany":
            if state in final:
                return "ok", ""
        elif state in bad:  # afternotok
            return "ok", ""
        elif state == Job.State.COMPLETED:
            return "never", f"job {ref.job} completed"
        return "wait", f"job {ref.job} to {verb}"
    assert ref.array is not None
    counts = copies.get(ref.array)
    if not counts:
        return "never", f"array {ref.array} no longer exists"
    total = sum(counts.values())
    ended = sum(n for state, n in counts.items() if state in final)
    done = counts.get(Job.State.COMPLETED, 0)
    unsuccessful = ended - done
    if ref.kind == "afterok":
        if unsuccessful:
            return "never", f"{unsuccessful} of the {total} copies of array {ref.array} did not complete"
        if done == total:
            return "ok", ""
        return "wait", f"array {ref.array} to complete ({done} of {total} copies completed)"
    if ended < total:
        return "wait", f"array {ref.array} to {verb} ({ended} of {total} copies ended)"
    if ref.kind == "afternotok" and not unsuccessful:
        return "never", f"every copy of array {ref.array} completed"
    return "ok", ""
