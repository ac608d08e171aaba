"""Reading policy text: YAML with line numbers, the schema, references, warnings.

One pass over the document checks every field and keeps going after a problem,
so an admin sees all errors of an edit at once; the policy objects are built
only when no error was found. Issues carry the path of the offending field
(``spec.teams[1].quota.max.devices``) because that is stable across
reformatting, plus a line number for editors.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from functools import lru_cache
from zoneinfo import ZoneInfo, available_timezones

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from scheduling.engine.durations import parse_duration
from scheduling.engine.policy_fields import (
    API_VERSION,
    KIND,
    ORDERING_FIELDS,
    QUOTA_FIELDS,
    SPEC_FIELDS,
    PolicyField,
    section_keys,
)
from scheduling.engine.policy_model import (
    DEVICES,
    DirectoryRoles,
    Ordering,
    Policy,
    PolicyError,
    PolicyIssue,
    PriorityClass,
    Quota,
    Reservation,
    Schedule,
    Severity,
    TeamDirectory,
    TeamPolicy,
    merge_quota,
    quota_for_team,
)
from scheduling.engine.schedules import (
    DAY_INDEX,
    DAY_NAMES,
    MINUTES_PER_DAY,
    MINUTES_PER_WEEK,
    first_minute,
    format_week_minute,
    parse_between,
    week_intervals,
    week_mask,
)

#: The classes of a policy that does not list any.
DEFAULT_PRIORITY_CLASSES: tuple[PriorityClass, ...] = (
    PriorityClass("critical", 0, frozenset({"normal", "low"}), preemptible=False),
    PriorityClass("high", 1, frozenset({"low"})),
    PriorityClass("normal", 2, default=True),
    PriorityClass("low", 3),
)

_TOP_FIELDS = ("apiVersion", "kind", "metadata", "spec")
_METADATA_FIELDS = ("name",)
_SPEC_FIELDS = (
    "timezone",
    "priorityClasses",
    "ordering",
    *section_keys(SPEC_FIELDS),
    "reservations",
    "departments",
    "teams",
    "defaults",
    "directory",
)
_CLASS_FIELDS = ("name", "preempts", "preemptible", "default", "starvationAfter")
_ORDERING_FIELDS = section_keys(ORDERING_FIELDS)
_RESERVATION_FIELDS = ("name", "ratio", "chipModels", "forPriorityClasses")
_DEPARTMENT_FIELDS = ("name", "shares")
_TEAM_FIELDS = ("name", "department", "shares", "quota", "schedules", "directory")
_TEAM_DIRECTORY_FIELDS = ("members", "leads")
_DIRECTORY_ROLE_FIELDS = ("finance", "admins")
# A DN: comma-separated attribute=value pairs (values may hold escaped commas), e.g. cn=ml,ou=groups,dc=example,dc=org.
_DN_PATTERN = re.compile(r"^\s*[A-Za-z][\w.-]*\s*=(?:[^,\\]|\\.)+(?:,\s*[A-Za-z][\w.-]*\s*=(?:[^,\\]|\\.)+)*$")
_DEFAULTS_FIELDS = ("shares", "quota", "schedules")
_QUOTA_FIELDS = section_keys(QUOTA_FIELDS)
_SCHEDULE_FIELDS = ("name", "days", "between", "quota", "dates")
_DATES_FIELDS = ("from", "until")

# Generous for any real policy; stops alias bombs ("billion laughs").
_MAX_NODES = 200_000
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Invalid:
    """A value that could not even be read; its error is already reported."""

    def __repr__(self) -> str:
        return "<invalid>"


_INVALID = _Invalid()


# --------------------------------------------------------------------------
# Public entry points (re-exported by scheduling.engine.policy)


def load_policy(
    text: str,
    *,
    chip_models: Collection[str] | None = None,
    capacity: Mapping[str, float] | None = None,
) -> tuple[Policy | None, list[PolicyIssue]]:
    """``(policy, issues)``; never raises. ``policy`` is ``None`` on any error."""
    ctx = _Context(chip_models, capacity)
    try:
        policy = _Reader(ctx).policy(text)
    except RecursionError:
        ctx.error("", "the document is nested too deeply")
        policy = None
    issues = sorted(ctx.issues, key=lambda i: i.line if i.line is not None else 0)
    if ctx.has_errors:
        return None, issues
    return policy, issues


def parse_policy(
    text: str,
    *,
    chip_models: Collection[str] | None = None,
    capacity: Mapping[str, float] | None = None,
) -> Policy:
    """The policy in ``text``; raises :class:`PolicyError` with every issue."""
    policy, issues = load_policy(text, chip_models=chip_models, capacity=capacity)
    if policy is None:
        raise PolicyError(issues)
    return policy


def validate_policy(
    text: str,
    *,
    chip_models: Collection[str] | None = None,
    capacity: Mapping[str, float] | None = None,
) -> list[PolicyIssue]:
    """Every error and warning in ``text`` at once, in document order.

    ``chip_models``: the cluster's chip models; when given, naming another one
    is an error. ``capacity``: healthy capacity per resource key, in device
    units; when given, guarantees summing above it are a warning.
    """
    return load_policy(text, chip_models=chip_models, capacity=capacity)[1]


# --------------------------------------------------------------------------
# Issue collection


class _Context:
    """Collects issues and knows on which line each path was written."""

    def __init__(self, chip_models: Collection[str] | None, capacity: Mapping[str, float] | None) -> None:
        self.issues: list[PolicyIssue] = []
        self.lines: dict[str, int] = {}
        self.chip_models = None if chip_models is None else frozenset(chip_models)
        self.capacity = capacity
        self.has_errors = False

    def error(self, path: str, message: str) -> None:
        self._add(path, message, "error")

    def warn(self, path: str, message: str) -> None:
        self._add(path, message, "warning")

    def _add(self, path: str, message: str, severity: Severity) -> None:
        if severity == "error":
            self.has_errors = True
        self.issues.append(PolicyIssue(path, message, severity, self.line(path)))

    def line(self, path: str) -> int | None:
        """The line of ``path``, or of its nearest written ancestor (for "required")."""
        while path:
            if path in self.lines:
                return self.lines[path]
            cut = max(path.rfind("."), path.rfind("["))
            path = path[:cut] if cut > 0 else ""
        return self.lines.get("")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _show(value: object) -> str:
    """A value as it would appear in the YAML, short enough for a message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _hint(word: str, known: Collection[str], *, noun: str = "") -> str:
    """`` (did you mean 'x'?)`` or `` (known: a, b)`` for an unknown name."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]!r}?)"
    if not known:
        return f" (no {noun} defined)" if noun else ""
    listed = ", ".join(list(known)[:12])
    return f" (known: {listed}{', ...' if len(known) > 12 else ''})"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


# --------------------------------------------------------------------------
# YAML to plain values, keeping line numbers


class _YamlReader:
    """Builds plain Python values from the node tree.

    Done by hand rather than with ``yaml.safe_load`` so that every path gets a
    line number and duplicate keys are reported instead of silently dropped.
    """

    def __init__(self, ctx: _Context) -> None:
        self.ctx = ctx
        self.constructor = SafeConstructor()
        self.count = 0
        self.active: set[int] = set()
        self.inherited: dict[int, int] = {}  # mapping node id -> number of merged-in pairs

    def document(self, text: str) -> object:
        try:
            node = yaml.compose(text, Loader=_LOADER)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = exc.problem or exc.context or "invalid YAML"
            self.ctx.issues.append(
                PolicyIssue("", f"YAML syntax error{where}: {problem}", "error", mark.line + 1 if mark else None)
            )
            self.ctx.has_errors = True
            return _INVALID
        except yaml.YAMLError as exc:
            self.ctx.error("", f"YAML syntax error: {exc}")
            return _INVALID
        if node is None:
            self.ctx.error("", "the policy is empty")
            return _INVALID
        return self.value(node, "")

    def value(self, node: Node, path: str) -> object:
        self.count += 1
        if self.count > _MAX_NODES:
            if self.count == _MAX_NODES + 1:
                self.ctx.error(path, f"the document has more than {_MAX_NODES} values")
            return _INVALID
        self.ctx.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, ScalarNode):
            return self._scalar(node, path)
        if id(node) in self.active:
            self.ctx.error(path, "recursive YAML alias")
            return _INVALID
        self.active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                if node.tag != _SEQ_TAG:
                    self.ctx.error(path, f"unsupported YAML tag {node.tag!r}")
                    return _INVALID
                return [self.value(child, f"{path}[{i}]") for i, child in enumerate(node.value)]
            assert isinstance(node, MappingNode)
            return self._mapping(node, path)
        finally:
            self.active.discard(id(node))

    def _scalar(self, node: ScalarNode, path: str) -> object:
        if node.tag == _STR_TAG:  # most scalars; skips the constructor's bookkeeping
            return node.value
        try:
            return self.constructor.construct_object(node)
        except ConstructorError as exc:
            self.ctx.error(path, f"cannot read value: {exc.problem}")
            return _INVALID

    def _mapping(self, node: MappingNode, path: str) -> object:
        if node.tag != _MAP_TAG:
            self.ctx.error(path, f"unsupported YAML tag {node.tag!r}")
            return _INVALID
        inherited = self.inherited.get(id(node))
        if inherited is None:  # first visit (an alias brings the same, already flattened node)
            explicit = sum(1 for key_node, _ in node.value if key_node.tag != _MERGE_TAG)
            try:
                self.constructor.flatten_mapping(node)  # YAML merge keys (<<): merged pairs go first
            except ConstructorError as exc:
                self.ctx.error(path, f"cannot read mapping: {exc.problem}")
                return _INVALID
            inherited = self.inherited[id(node)] = len(node.value) - explicit
        out: dict[str, object] = {}
        written: set[str] = set()
        for index, (key_node, value_node) in enumerate(node.value):
            key = self._scalar(key_node, path) if isinstance(key_node, ScalarNode) else None
            if not isinstance(key, str):
                self.ctx.lines.setdefault(path, key_node.start_mark.line + 1)
                self.ctx.error(path, f"keys must be strings, got {_show(key)}")
                continue
            child = _join(path, key)
            if index >= inherited:  # written here, not merged in: may override a merged key
                self.ctx.lines[child] = key_node.start_mark.line + 1
                if key in written:
                    self.ctx.error(child, "duplicate key (YAML would silently keep the last one)")
                written.add(key)
            out[key] = self.value(value_node, child)
        return out


# --------------------------------------------------------------------------
# Typed field readers. Each reports its own error and returns None when the
# value is unusable, so callers simply skip what they cannot build.


def _mapping(
    ctx: _Context,
    value: object,
    path: str,
    allowed: Collection[str] | None,
    required: Sequence[str] = (),
) -> dict[str, object] | None:
    """A mapping whose keys are all in ``allowed`` (``None``: any key, checked by the caller)."""
    if value is _INVALID:
        return None
    if not isinstance(value, dict):
        ctx.error(path, f"must be a mapping, got {_show(value)}")
        return None
    for key in value if allowed is not None else ():
        if allowed is not None and key not in allowed:
            close = difflib.get_close_matches(key, list(allowed), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else "expected one of: " + ", ".join(allowed)
            ctx.error(_join(path, key), f"unknown field ({hint})")
    for key in required:
        if key not in value:
            ctx.error(_join(path, key), "required")
    return value


def _list(ctx: _Context, value: object, path: str, *, nonempty: str = "") -> list[object] | None:
    """``nonempty`` is the reason given when an empty list is refused."""
    if value is _INVALID:
        return None
    if not isinstance(value, list):
        ctx.error(path, f"must be a list, got {_show(value)}")
        return None
    if nonempty and not value:
        ctx.error(path, f"must not be empty ({nonempty})")
        return None
    return value


def _string(ctx: _Context, value: object, path: str) -> str | None:
    if value is _INVALID:
        return None
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        ctx.error(path, f"must be a string, got {_show(value)} (quote it: '{value}')")
    else:
        ctx.error(path, f"must be a non-empty string, got {_show(value)}")
    return None


def _strings(ctx: _Context, value: object, path: str, *, nonempty: str = "") -> list[tuple[str, str]] | None:
    """A list of strings as ``(value, path)`` pairs, for reference checks."""
    items = _list(ctx, value, path, nonempty=nonempty)
    if items is None:
        return None
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    ok = True
    for i, item in enumerate(items):
        text = _string(ctx, item, f"{path}[{i}]")
        if text is None:
            ok = False
        elif text in seen:
            ctx.warn(f"{path}[{i}]", f"{text!r} is listed twice")
        else:
            seen.add(text)
            out.append((text, f"{path}[{i}]"))
    return out if ok else None


def _number(
    ctx: _Context,
    value: object,
    path: str,
    *,
    integer: bool = False,
    below_one: bool = False,
) -> float | None:
    """A finite number >= 0 (``integer``: whole; ``below_one``: in [0, 1))."""
    if value is _INVALID:
        return None
    if below_one:
        expected = "a number in [0, 1)"
    else:
        expected = "an integer >= 0" if integer else "a number >= 0"
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
        and (not integer or float(value).is_integer())
        and (not below_one or value < 1)
    )
    if not ok:
        ctx.error(path, f"must be {expected}, got {_show(value)}")
        return None
    return float(value)  # type: ignore[arg-type]


def _bool(ctx: _Context, value: object, path: str) -> bool | None:
    if value is _INVALID:
        return None
    if not isinstance(value, bool):
        ctx.error(path, f"must be true or false, got {_show(value)}")
        return None
    return value


def _choice(ctx: _Context, value: object, path: str, choices: Sequence[str]) -> str | None:
    if value is _INVALID:
        return None
    if isinstance(value, str) and value in choices:
        return value
    hint = _hint(value, choices) if isinstance(value, str) else ""
    if hint.startswith(" (known"):
        hint = ""
    ctx.error(path, f"must be one of {', '.join(choices)}, got {_show(value)}{hint}")
    return None


def _duration(ctx: _Context, value: object, path: str, *, positive: bool) -> float | None:
    if value is _INVALID:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        ctx.error(path, str(exc))
        return None
    if positive and seconds <= 0:
        ctx.error(path, f"must be a duration > 0, got {_show(value)}")
        return None
    return seconds


# Names admins reach for that are not IANA zones; difflib would suggest a
# random neighbour (Asia/Beijing -> Asia/Brunei).
_ZONE_ALIASES = {
    "asia/beijing": "Asia/Shanghai",
    "beijing": "Asia/Shanghai",
    "china": "Asia/Shanghai",
    "cst": "Asia/Shanghai",
    "utc+8": "Asia/Shanghai",
    "gmt+8": "Asia/Shanghai",
    "asia/shenzhen": "Asia/Shanghai",
    "asia/hangzhou": "Asia/Shanghai",
}


@lru_cache(maxsize=1)
def _all_timezones() -> tuple[str, ...]:
    return tuple(sorted(available_timezones()))


def _timezone(ctx: _Context, value: object, path: str) -> str | None:
    name = _string(ctx, value, path)
    if name is None:
        return None
    try:
        ZoneInfo(name)
    except Exception:  # ZoneInfoNotFoundError, ValueError, OSError for odd keys
        close = [_ZONE_ALIASES[name.lower()]] if name.lower() in _ZONE_ALIASES else []
        close = close or difflib.get_close_matches(name, _all_timezones(), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else " (use an IANA name like Asia/Shanghai)"
        ctx.error(path, f"unknown timezone {name!r}{hint}")
        return None
    return name


# --------------------------------------------------------------------------
# The document


@dataclass
class _ClassEntry:
    name: str | None
    path: str
    preempts: list[tuple[str, str]]
    preemptible: bool
    default: bool
    starvation_after_s: float | None = None


@dataclass
class _TeamEntry:
    """A team as read, with the paths needed for cross checks."""

    path: str
    team: TeamPolicy | None
    schedule_paths: list[str] = field(default_factory=list)


class _Reader:
    """Reads one policy document; cross references are checked at the end."""

    def __init__(self, ctx: _Context) -> None:
        self.ctx = ctx
        self.class_refs: list[tuple[str, str]] = []  # (path, class name)
        self.department_refs: list[tuple[str, str]] = []
        self.chip_refs: list[tuple[str, str]] = []
        self.allowed_lists: list[tuple[str, frozenset[str]]] = []
        # None when a section failed to read: reference checks against it would be noise.
        self.class_names: frozenset[str] | None = None
        self.default_class: str | None = None
        self.department_names: frozenset[str] | None = frozenset()

    # -- top level --------------------------------------------------------

    def policy(self, text: str) -> Policy | None:
        ctx = self.ctx
        doc = _YamlReader(ctx).document(text)
        if doc is _INVALID:
            return None
        top = _mapping(ctx, doc, "", _TOP_FIELDS, required=("apiVersion", "kind", "spec"))
        if top is None:
            return None
        for key, expected in (("apiVersion", API_VERSION), ("kind", KIND)):
            if key in top and top[key] != expected and top[key] is not _INVALID:
                ctx.error(key, f"must be {expected!r}, got {_show(top[key])}")
        name = "default"
        metadata = top.get("metadata")
        if metadata is not None:
            meta = _mapping(ctx, metadata, "metadata", _METADATA_FIELDS)
            if meta is not None and "name" in meta:
                name = _string(ctx, meta["name"], "metadata.name") or name
        spec_value = top.get("spec")
        if spec_value is None:
            spec_value = {}
        spec = _mapping(ctx, spec_value, "spec", _SPEC_FIELDS)
        if spec is None:
            return None
        return self.spec(name, spec)

    def spec(self, name: str, spec: dict[str, object]) -> Policy | None:
        ctx = self.ctx
        timezone = "UTC"
        if spec.get("timezone") is not None:
            timezone = _timezone(ctx, spec["timezone"], "spec.timezone") or timezone
        classes = self.priority_classes(spec.get("priorityClasses"), "spec.priorityClasses")
        ordering = self.ordering(spec.get("ordering"), "spec.ordering")
        settings = self.section(spec, "spec", SPEC_FIELDS)
        reservations = self.reservations(spec.get("reservations"), "spec.reservations")
        departments = self.departments(spec.get("departments"), "spec.departments")
        teams = self.teams(spec.get("teams"), "spec.teams")
        directory = DirectoryRoles()
        if spec.get("directory") is not None:
            directory = self.directory_roles(spec["directory"], "spec.directory") or directory
        defaults = TeamPolicy("*", None, 1.0, Quota())
        if spec.get("defaults") is not None:
            entry = self.team(spec["defaults"], "spec.defaults", is_defaults=True)
            defaults = entry.team or defaults

        self.check_references(classes, departments)
        if ctx.capacity:
            _capacity_warnings(ctx, [t.team for t in teams if t.team is not None], ctx.capacity)
        if ctx.has_errors or classes is None:
            return None
        return Policy(
            name=name,
            timezone=timezone,
            priority_classes=classes,
            ordering=ordering,
            reservations=reservations,
            departments=departments,
            teams={t.team.name: t.team for t in teams if t.team is not None},
            defaults=defaults,
            directory=directory,
            **{**{f.attr: f.default for f in SPEC_FIELDS}, **settings},  # type: ignore[arg-type]  # each value read by its row
        )

    # -- priority classes ---------------------------------------------------

    def priority_classes(self, value: object, path: str) -> tuple[PriorityClass, ...] | None:
        ctx = self.ctx
        if value is None:
            self.class_names = frozenset(pc.name for pc in DEFAULT_PRIORITY_CLASSES)
            self.default_class = "normal"
            return DEFAULT_PRIORITY_CLASSES
        self.class_names = None
        self.default_class = None
        items = _list(ctx, value, path, nonempty="a policy needs at least one class")
        if items is None:
            return None
        entries: list[_ClassEntry | None] = []
        for i, item in enumerate(items):
            p = f"{path}[{i}]"
            m = _mapping(ctx, item, p, _CLASS_FIELDS, required=("name",))
            if m is None:
                entries.append(None)
                continue
            name = _string(ctx, m["name"], f"{p}.name") if "name" in m else None
            preempts = _strings(ctx, m.get("preempts") or [], f"{p}.preempts") or []
            preemptible = _bool(ctx, m["preemptible"], f"{p}.preemptible") if "preemptible" in m else True
            default = _bool(ctx, m["default"], f"{p}.default") if "default" in m else False
            after = None
            if m.get("starvationAfter") is not None:
                after = _duration(ctx, m["starvationAfter"], f"{p}.starvationAfter", positive=True)
            entries.append(_ClassEntry(name, p, preempts, preemptible is not False, default is True, after))

        ranks: dict[str, int] = {}
        for rank, entry in enumerate(entries):
            if entry is None or entry.name is None:
                continue
            if entry.name in ranks:
                first = entries[ranks[entry.name]]
                ctx.error(
                    f"{entry.path}.name",
                    f"duplicate priority class {entry.name!r} (also {first.path if first else ''})",
                )
            else:
                ranks[entry.name] = rank
        self.class_names = frozenset(ranks)

        marked = [e for e in entries if e is not None and e.default and e.name is not None]
        for extra in marked[1:]:
            ctx.error(
                f"{extra.path}.default",
                f"only one class may be the default (already {marked[0].name!r})",
            )
        named = [e for e in entries if e is not None and e.name is not None]
        if marked:
            default_name = marked[0].name
        elif "normal" in ranks:
            default_name = "normal"
        else:
            default_name = named[-1].name if named else None
        self.default_class = default_name

        for rank, entry in enumerate(entries):
            if entry is None:
                continue
            for target, target_path in entry.preempts:
                if target == entry.name:
                    ctx.error(target_path, "a class cannot preempt itself")
                elif target not in ranks:
                    ctx.error(
                        target_path,
                        f"unknown priority class {target!r}{_hint(target, list(ranks))}",
                    )
                elif ranks[target] < rank:
                    ctx.error(
                        target_path,
                        f"cannot preempt higher class {target!r} (classes are listed highest first)",
                    )
                else:
                    victim = entries[ranks[target]]
                    if victim is not None and not victim.preemptible:
                        ctx.warn(
                            target_path,
                            f"{target!r} is not preemptible, so this has no effect",
                        )

        if any(e is None or e.name is None for e in entries) or len(ranks) != len(entries):
            return None
        return tuple(
            PriorityClass(
                name=e.name,
                rank=rank,
                preempts=frozenset(t for t, _ in e.preempts),
                preemptible=e.preemptible,
                default=e.name == default_name,
                starvation_after_s=e.starvation_after_s,
            )
            for rank, e in enumerate(entries)
            if e is not None and e.name is not None
        )

    # -- ordering ----------------------------------------------------------

    def ordering(self, value: object, path: str) -> Ordering:
        ctx = self.ctx
        base = Ordering()
        if value is None:
            return base
        m = _mapping(ctx, value, path, _ORDERING_FIELDS)
        if m is None:
            return base
        values = self.section(m, path, ORDERING_FIELDS)
        return Ordering(**values)  # type: ignore[arg-type]  # each value read by its row

    def section(self, m: Mapping[str, object], path: str, fields: Sequence[PolicyField]) -> dict[str, object]:
        """The values ``m`` sets of the rows of ``fields``, by attribute; a field left out keeps its default.

        Rows in table order, each sub-mapping (``weights``, ``preemption``) checked where its first
        row is, so errors come in the order of the document's sections.
        """
        ctx = self.ctx
        groups: dict[str, Mapping[str, object] | None] = {"": m}
        values: dict[str, object] = {}
        for f in fields:
            if f.group not in groups:
                inner = m.get(f.group)
                required = tuple(g.key for g in fields if g.group == f.group and g.required)
                allowed = section_keys(fields, f.group)
                where = _join(path, f.group)
                groups[f.group] = None if inner is None else _mapping(ctx, inner, where, allowed, required)
            mapping = groups[f.group]
            if mapping is None or f.key not in mapping:
                continue
            raw = mapping[f.key]
            if raw is None and f.null != "read":
                if f.null == "unset":
                    values[f.attr] = None
                continue
            value = f.read(self, raw, _join(path, f.yaml), False)
            if value is not None:
                values[f.attr] = value
        return values

    # -- reservations --------------------------------------------------------

    def reservations(self, value: object, path: str) -> tuple[Reservation, ...]:
        ctx = self.ctx
        if value is None:
            return ()
        items = _list(ctx, value, path)
        if items is None:
            return ()
        out: list[Reservation] = []
        seen: dict[str, str] = {}
        for i, item in enumerate(items):
            p = f"{path}[{i}]"
            m = _mapping(ctx, item, p, _RESERVATION_FIELDS, required=("name", "ratio", "forPriorityClasses"))
            if m is None:
                continue
            name = _string(ctx, m["name"], f"{p}.name") if "name" in m else None
            if name is not None:
                if name in seen:
                    ctx.error(f"{p}.name", f"duplicate reservation {name!r} (also {seen[name]})")
                seen.setdefault(name, p)
            ratio = _number(ctx, m["ratio"], f"{p}.ratio", below_one=True) if "ratio" in m else None
            chips: frozenset[str] | None = None
            if m.get("chipModels") is not None:
                listed = _strings(ctx, m["chipModels"], f"{p}.chipModels", nonempty="omit it for all chips")
                if listed is not None:
                    chips = frozenset(c for c, _ in listed)
                    self.chip_refs.extend((cp, c) for c, cp in listed)
            classes = None
            if "forPriorityClasses" in m:
                listed = _strings(
                    ctx,
                    m["forPriorityClasses"],
                    f"{p}.forPriorityClasses",
                    nonempty="a reservation must be for some class",
                )
                if listed is not None:
                    classes = frozenset(c for c, _ in listed)
                    self.class_refs.extend((cp, c) for c, cp in listed)
            if name is not None and ratio is not None and classes is not None:
                out.append(Reservation(name, ratio, chips, classes))

        groups: dict[str, list[Reservation]] = {}
        for r in out:
            for chip in sorted(r.chip_models) if r.chip_models is not None else [None]:
                groups.setdefault("all chips" if chip is None else f"chip {chip}", []).append(r)
        for label, members in groups.items():
            total = sum(r.ratio for r in members)
            if round(total, 9) >= 1:
                names = ", ".join(r.name for r in members)
                ctx.error(path, f"ratios for {label} sum to {total:g} ({names}); they must stay below 1")
        return tuple(out)

    # -- departments -----------------------------------------------------------

    def departments(self, value: object, path: str) -> dict[str, float]:
        ctx = self.ctx
        if value is None:
            return {}
        items = _list(ctx, value, path)
        if items is None:
            self.department_names = None
            return {}
        out: dict[str, float] = {}
        seen: dict[str, str] = {}
        complete = True
        for i, item in enumerate(items):
            p = f"{path}[{i}]"
            m = _mapping(ctx, item, p, _DEPARTMENT_FIELDS, required=("name",))
            if m is None:
                complete = False
                continue
            name = _string(ctx, m["name"], f"{p}.name") if "name" in m else None
            shares = _number(ctx, m["shares"], f"{p}.shares") if "shares" in m else 1.0
            if name is None:
                complete = False
                continue
            if name in seen:
                ctx.error(f"{p}.name", f"duplicate department {name!r} (also {seen[name]})")
                continue
            seen[name] = p
            out[name] = 1.0 if shares is None else shares
        # Unknown-department errors would be noise if a department failed to read.
        self.department_names = frozenset(out) if complete else None
        return out

    # -- teams -------------------------------------------------------------------

    def teams(self, value: object, path: str) -> list[_TeamEntry]:
        ctx = self.ctx
        if value is None:
            return []
        items = _list(ctx, value, path)
        if items is None:
            return []
        entries = [self.team(item, f"{path}[{i}]", is_defaults=False) for i, item in enumerate(items)]
        seen: dict[str, str] = {}
        unique: list[_TeamEntry] = []
        for entry in entries:
            if entry.team is None:
                continue
            name = entry.team.name
            if name in seen:
                ctx.error(f"{entry.path}.name", f"duplicate team {name!r} (also {seen[name]})")
                continue
            seen[name] = entry.path
            unique.append(entry)
        return unique

    def team(self, value: object, path: str, *, is_defaults: bool) -> _TeamEntry:
        ctx = self.ctx
        fields = _DEFAULTS_FIELDS if is_defaults else _TEAM_FIELDS
        m = _mapping(ctx, value, path, fields, required=() if is_defaults else ("name",))
        if m is None:
            return _TeamEntry(path, None)
        ok = True
        name: str | None = "*"
        if not is_defaults:
            name = _string(ctx, m["name"], f"{path}.name") if "name" in m else None
            if name == "*":
                ctx.error(f"{path}.name", "'*' is reserved for spec.defaults")
                name = None
        department: str | None = None
        if m.get("department") is not None:
            department = _string(ctx, m["department"], f"{path}.department")
            if department is None:
                ok = False
            else:
                self.department_refs.append((f"{path}.department", department))
        shares: float | None = 1.0
        if m.get("shares") is not None:
            shares = _number(ctx, m["shares"], f"{path}.shares")
        base: Quota | None = Quota()
        if m.get("quota") is not None:
            base = self.base_quota(m["quota"], f"{path}.quota")
        schedules: list[Schedule] = []
        entry = _TeamEntry(path, None)
        if m.get("schedules") is not None:
            items = _list(ctx, m["schedules"], f"{path}.schedules")
            if items is None:
                ok = False
            else:
                seen: dict[str, str] = {}
                for i, item in enumerate(items):
                    sp = f"{path}.schedules[{i}]"
                    schedule = self.schedule(item, sp, base)
                    if schedule is None:
                        ok = False
                        continue
                    if schedule.name in seen:
                        ctx.error(
                            f"{sp}.name",
                            f"duplicate schedule {schedule.name!r} (also {seen[schedule.name]})",
                        )
                        ok = False
                        continue
                    seen[schedule.name] = sp
                    schedules.append(schedule)
                    entry.schedule_paths.append(sp)
                _overlap_warnings(ctx, schedules, entry.schedule_paths)
        directory: TeamDirectory | None = None
        if m.get("directory") is not None:
            directory = self.team_directory(m["directory"], f"{path}.directory")
            ok = ok and directory is not None
        if not ok or name is None or shares is None or base is None:
            return entry
        entry.team = TeamPolicy(name, department, shares, base, tuple(schedules), directory)
        return entry

    # -- directory groups ------------------------------------------------------------

    def group(self, value: object, path: str) -> str | None:
        """A directory group: its cn (``ml-team``) or its DN (``cn=ml-team,ou=groups,dc=example,dc=org``)."""
        text = _string(self.ctx, value, path)
        if text is None:
            return None
        if not text.strip() or text != text.strip():
            self.ctx.error(path, "a group's cn or DN, without spaces around it")
            return None
        if "=" in text and not _DN_PATTERN.match(text):
            self.ctx.error(path, f"{text!r} is not a DN (attribute=value pairs joined by commas)")
            return None
        return text

    def team_directory(self, value: object, path: str) -> TeamDirectory | None:
        m = _mapping(self.ctx, value, path, _TEAM_DIRECTORY_FIELDS, required=("members",))
        if m is None or "members" not in m:
            return None
        members = self.group(m["members"], f"{path}.members")
        leads = self.group(m["leads"], f"{path}.leads") if m.get("leads") is not None else None
        if members is None or (m.get("leads") is not None and leads is None):
            return None
        return TeamDirectory(members, leads)

    def directory_roles(self, value: object, path: str) -> DirectoryRoles | None:
        m = _mapping(self.ctx, value, path, _DIRECTORY_ROLE_FIELDS)
        if m is None:
            return None
        found = {key: self.group(m[key], f"{path}.{key}") for key in _DIRECTORY_ROLE_FIELDS if m.get(key) is not None}
        if any(group is None for group in found.values()):
            return None
        return DirectoryRoles(**found)

    # -- quotas ------------------------------------------------------------------

    def base_quota(self, value: object, path: str) -> Quota | None:
        override = self.quota_fields(value, path, partial=False)
        if override is None:
            return None
        # Built directly, not with merge_quota: its clamp would hide the error below.
        values: dict[str, object] = {f.attr: override.get(f.yaml) for f in QUOTA_FIELDS}
        values.update({f.attr: dict(override.get(f.yaml) or {}) for f in QUOTA_FIELDS if f.resources})  # type: ignore[call-overload]
        quota = Quota(**values)  # type: ignore[arg-type]
        for key in sorted(set(quota.guaranteed) & set(quota.max)):
            if quota.max[key] < quota.guaranteed[key]:
                self.ctx.error(
                    f"{path}.max.{key}",
                    f"must be >= guaranteed.{key} ({_num(quota.guaranteed[key])})",
                )
        cap = quota.max.get(DEVICES)
        for key, amount in sorted(quota.guaranteed.items()):
            if key != DEVICES and cap is not None and amount > cap:
                self.ctx.warn(
                    f"{path}.guaranteed.{key}",
                    f"exceeds max.{DEVICES} ({_num(cap)}), so it can never be used in full",
                )
        if quota.allowed_priority_classes is not None:
            self.allowed_lists.append((f"{path}.allowedPriorityClasses", quota.allowed_priority_classes))
        return quota

    def quota_fields(self, value: object, path: str, *, partial: bool) -> dict[str, object] | None:
        """The quota mapping normalised; ``partial`` allows ``null`` resource values."""
        ctx = self.ctx
        m = _mapping(ctx, value, path, _QUOTA_FIELDS)
        if m is None:
            return None
        out: dict[str, object] = {}
        ok = True
        for f in QUOTA_FIELDS:
            if f.yaml not in m:
                continue
            raw = m[f.yaml]
            if raw is None and not f.resources:  # null: unlimited (or, in a schedule, lifted)
                out[f.yaml] = None
                continue
            value = f.read(self, raw, f"{path}.{f.yaml}", partial)
            if value is None:
                ok = False
            else:
                out[f.yaml] = value
        return out if ok else None

    # -- what a row of the field tables may ask (policy_fields.FieldReader) --------------

    def number(self, value: object, path: str, *, integer: bool = False) -> float | None:
        return _number(self.ctx, value, path, integer=integer)

    def duration(self, value: object, path: str, *, positive: bool) -> float | None:
        return _duration(self.ctx, value, path, positive=positive)

    def flag(self, value: object, path: str) -> bool | None:
        return _bool(self.ctx, value, path)

    def choice(self, value: object, path: str, choices: Sequence[str]) -> str | None:
        return _choice(self.ctx, value, path, choices)

    def class_list(self, value: object, path: str) -> frozenset[str] | None:
        """Names of priority classes, checked against the policy's classes at the end."""
        listed = _strings(self.ctx, value, path)
        if listed is None:
            return None
        if not listed:
            self.ctx.warn(path, "is empty, so the team cannot run any job")
        self.class_refs.extend((cp, c) for c, cp in listed)
        return frozenset(c for c, _ in listed)

    def resources(self, value: object, path: str, *, allow_null: bool) -> dict[str, float | None] | None:
        ctx = self.ctx
        if value is None and allow_null:
            return {}
        m = _mapping(ctx, value, path, allowed=None)
        if m is None:
            return None
        out: dict[str, float | None] = {}
        ok = True
        for key, amount in m.items():
            p = f"{path}.{key}"
            if not self.resource_key(key, p):
                ok = False
                continue
            if amount is None and allow_null:
                out[key] = None
                continue
            number = _number(ctx, amount, p)
            if number is None:
                ok = False
            else:
                out[key] = number
        return out if ok else None

    def resource_key(self, key: str, path: str) -> bool:
        if key == DEVICES:
            return True
        prefix = f"{DEVICES}/"
        chip = key[len(prefix) :] if key.startswith(prefix) else ""
        if chip and "/" not in chip and chip.strip() == chip:
            self.chip_refs.append((path, chip))
            return True
        hint = " (did you mean 'devices'?)" if difflib.get_close_matches(key, [DEVICES], 1, 0.6) else ""
        self.ctx.error(
            path,
            f"unknown resource {key!r}: resource keys are 'devices' or 'devices/<chip model>'{hint}",
        )
        return False

    # -- schedules ----------------------------------------------------------------

    def schedule(self, value: object, path: str, base: Quota | None) -> Schedule | None:
        ctx = self.ctx
        m = _mapping(ctx, value, path, _SCHEDULE_FIELDS, required=("name", "between"))
        if m is None:
            return None
        ok = True
        name = _string(ctx, m["name"], f"{path}.name") if "name" in m else None
        days: frozenset[int] | None = None
        if m.get("days") is not None:
            listed = _strings(ctx, m["days"], f"{path}.days", nonempty="omit days for every day")
            if listed is None:
                ok = False
            else:
                numbers: set[int] = set()
                for day, dp in listed:
                    index = DAY_INDEX.get(day.lower())
                    if index is None:
                        close = difflib.get_close_matches(day.lower(), DAY_NAMES, 1, 0.5)
                        hint = f"did you mean {close[0]!r}?" if close else "use " + ", ".join(DAY_NAMES)
                        ctx.error(dp, f"unknown day {day!r} ({hint})")
                        ok = False
                    else:
                        numbers.add(index)
                days = frozenset(numbers)
        window: tuple[int, int] | None = None
        if "between" in m:
            between = m["between"]
            if isinstance(between, str):
                try:
                    window = parse_between(between)
                except ValueError as exc:
                    ctx.error(f"{path}.between", str(exc))
            elif between is not _INVALID:
                ctx.error(f"{path}.between", f'must be a string like "09:00-18:00", got {_show(between)}')
        override: dict[str, object] | None = {}
        if m.get("quota") is not None:
            override = self.quota_fields(m["quota"], f"{path}.quota", partial=True)
        dates: tuple[date, date] | None = None
        if m.get("dates") is not None:
            dates = self.dates(m["dates"], f"{path}.dates")
            ok = ok and dates is not None
        if not ok or name is None or window is None or override is None:
            return None
        resolved = None
        if base is not None:
            resolved = merge_quota(base, override)
            self.check_override(base, override, f"{path}.quota")
        return Schedule(name, days, window[0], window[1], override, resolved, dates)

    def dates(self, value: object, path: str) -> tuple[date, date] | None:
        """``{from: 2026-12-10, until: 2026-12-20}``: local dates, both included."""
        m = _mapping(self.ctx, value, path, _DATES_FIELDS, required=_DATES_FIELDS)
        if m is None or any(key not in m for key in _DATES_FIELDS):
            return None
        found: list[date] = []
        for key in _DATES_FIELDS:
            raw = m[key]
            if isinstance(raw, datetime):
                raw = raw.date()
            if isinstance(raw, date):
                found.append(raw)
                continue
            try:
                found.append(date.fromisoformat(str(raw)))
            except ValueError:
                self.ctx.error(f"{path}.{key}", f"must be a date like 2026-12-10, got {_show(raw)}")
        if len(found) != 2:
            return None
        if found[1] < found[0]:
            self.ctx.error(f"{path}.until", f"{found[1]} is before from ({found[0]})")
            return None
        return found[0], found[1]

    def check_override(self, base: Quota, override: Mapping[str, object], path: str) -> None:
        """The schedule must not guarantee more than it allows.

        Only what the schedule itself names is checked: a cap below an
        *inherited* guarantee is legal and lowers that guarantee (see
        :func:`merge_quota`).
        """
        named_max = override.get("max") or {}
        named_guaranteed = override.get("guaranteed") or {}
        assert isinstance(named_max, Mapping) and isinstance(named_guaranteed, Mapping)
        for key, low in sorted(named_guaranteed.items()):
            if low is None:
                continue
            if key in named_max:
                high = named_max[key]
                if high is not None and high < low:
                    self.ctx.error(f"{path}.max.{key}", f"must be >= guaranteed.{key} ({_num(low)})")
            elif key in base.max and base.max[key] < low:
                self.ctx.error(
                    f"{path}.guaranteed.{key}",
                    f"must be <= max.{key} ({_num(base.max[key])}, from the base quota)",
                )
        if "allowedPriorityClasses" in override and override["allowedPriorityClasses"] is not None:
            allowed = override["allowedPriorityClasses"]
            assert isinstance(allowed, frozenset)
            self.allowed_lists.append((f"{path}.allowedPriorityClasses", allowed))

    # -- cross references -----------------------------------------------------------

    def check_references(self, classes: tuple[PriorityClass, ...] | None, departments: Mapping[str, float]) -> None:
        ctx = self.ctx
        known_classes = self.class_names
        if known_classes is not None:
            order = [pc.name for pc in classes] if classes else sorted(known_classes)
            for path, name in self.class_refs:
                if name not in known_classes:
                    ctx.error(path, f"unknown priority class {name!r}{_hint(name, order)}")
            default = self.default_class
            for path, allowed in self.allowed_lists:
                if default is not None and allowed and default not in allowed:
                    ctx.warn(
                        path,
                        f"does not include the default class {default!r}, which jobs submitted without a class get",
                    )
        if self.department_names is not None:
            for path, name in self.department_refs:
                if name not in self.department_names:
                    ctx.error(
                        path,
                        f"unknown department {name!r}{_hint(name, list(departments), noun='departments')}",
                    )
        if ctx.chip_models is not None:
            known = sorted(ctx.chip_models)
            for path, chip in self.chip_refs:
                if chip not in ctx.chip_models:
                    ctx.error(path, f"unknown chip model {chip!r}{_hint(chip, known, noun='chip models')}")


# --------------------------------------------------------------------------
# Warnings that need the whole week


def _overlap_warnings(ctx: _Context, schedules: Sequence[Schedule], paths: Sequence[str]) -> None:
    """Warn about windows sharing a weekday-minute: only the first of them applies there.

    Dated schedules are left out: standing in for the weekly ones on their dates is what they are for.
    """
    weekly = [(s, p) for s, p in zip(schedules, paths, strict=True) if s.dates is None]
    schedules = [s for s, _ in weekly]
    paths = [p for _, p in weekly]
    masks = [week_mask(s.days, s.start_min, s.end_min) for s in schedules]
    covered = 0
    for j, (schedule, mask) in enumerate(zip(schedules, masks, strict=True)):
        if mask and mask & ~covered == 0:
            ctx.warn(
                paths[j],
                f"schedule {schedule.name!r} is never in force: earlier schedules cover all its times",
            )
        else:
            for i in range(j):
                shared = masks[i] & mask
                if shared:
                    ctx.warn(
                        paths[j],
                        f"overlaps schedule {schedules[i].name!r} (e.g. "
                        f"{format_week_minute(first_minute(shared))}); "
                        f"{schedules[i].name!r} wins where both apply",
                    )
        covered |= mask


def _capacity_warnings(ctx: _Context, teams: Sequence[TeamPolicy], capacity: Mapping[str, float]) -> None:
    """Warn when guarantees add up above healthy capacity at any time of the week.

    The week is cut at every schedule boundary; within a piece every team's
    quota is constant, so checking one minute per piece is exact.
    """
    static: dict[str, float] = {}
    timed: list[TeamPolicy] = []
    for team in teams:
        if team.schedules:
            timed.append(team)
        else:
            for key, amount in team.quota.guaranteed.items():
                static[key] = static.get(key, 0.0) + amount
    cuts = {0}
    for team in timed:
        for schedule in team.schedules:
            for begin, end in week_intervals(schedule.days, schedule.start_min, schedule.end_min):
                cuts.add(begin)
                cuts.add(end % MINUTES_PER_WEEK)
    worst: dict[str, tuple[float, int, list[str]]] = {}
    for cut in sorted(cuts):
        weekday, minute = divmod(cut, MINUTES_PER_DAY)
        totals = dict(static)
        active: list[str] = []
        for team in timed:
            quota, in_force = quota_for_team(team, weekday, minute)
            if in_force is not None:
                active.append(f"{team.name}/{in_force}")
            for key, amount in quota.guaranteed.items():
                totals[key] = totals.get(key, 0.0) + amount
        for key, cap in capacity.items():
            total = totals.get(key, 0.0)
            if total > cap + 1e-9 and (key not in worst or total > worst[key][0]):
                worst[key] = (total, cut, active)
    for key, cap in capacity.items():
        if key not in worst:
            continue
        total, cut, active = worst[key]
        when = ""
        if timed:
            when = f" at {format_week_minute(cut)}"
            when += f" (schedules in force: {', '.join(active)})" if active else " (base quotas)"
        ctx.warn(
            "spec.teams",
            f"guaranteed {key} sum to {_num(total)}{when}, above the cluster's healthy capacity of {_num(cap)}",
        )
