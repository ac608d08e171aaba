"""Batch scripts: their ``#NPU`` and ``#SBATCH`` directives read into a job request, the script made its command.

``npuctl batch job.sh`` and the console's submit form both read a script here, so a directive means
the same wherever the script is given. Standard library only: ``npuctl`` installs alone, and the
portal imports this very module.

**Directives** are read as sbatch reads them: comment lines at the top of the script (after its
``#!`` line), up to the first line that is neither blank nor a comment. Each ``#SBATCH`` or ``#NPU``
line holds one or more options (``#SBATCH --gres=npu:2 --time=1:00:00``; ``# ...`` after them is a
comment). ``#NPU`` lines take ``npuctl submit``'s own options; ``#SBATCH`` lines take sbatch's, of
which :data:`SBATCH_OPTIONS` says what each becomes. A directive that cannot be honoured is never
dropped in silence: it is named, with why, in :attr:`Batch.not_honoured` (one warning line). A
value that cannot be read (``--time=soon``) is an error naming the line, as sbatch refuses it.

**The command** runs the script's text, exactly, by the interpreter of its ``#!`` line (``bash``
when it has none), with the given arguments: the text travels inside the job's command as a
here-document on file descriptor 3, and the interpreter reads it from ``/dev/fd/3``. Node agents
run a command with ``/bin/sh -c``, so this needs nothing of them; the script's standard input is
left alone (a script read from stdin would be eaten by the first program that reads it).
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from npuctl.durations import parse_duration

#: The here-document's end marker; a script holding this line gets a numbered one.
_END = "NPUPORTAL_SCRIPT"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ScriptError(ValueError):
    """A script that cannot be submitted as it is; ``str()`` names the line and the reason."""


@dataclass
class Batch:
    """What a script asks for: request fields, the directives not honoured, and the command that runs it."""

    command: str
    #: API submit fields the directives set (``num_devices``, ``max_duration_s``, ``env``, ...).
    fields: dict[str, Any] = field(default_factory=dict)
    #: Each directive not honoured, with why: ``--partition=debug (line 3: no partitions here)``.
    not_honoured: list[str] = field(default_factory=list)
    #: ``estimated_duration_s`` came from sbatch's ``--time`` (a limit): it follows a lower limit given later.
    estimate_is_limit: bool = False

    def request(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The submission: the directives' fields under ``given`` (command-line flags or form fields win).

        ``env`` is merged variable by variable. An estimate that was only sbatch's ``--time`` is
        lowered to a smaller ``max_duration_s`` given on top, as the limit it stood for.
        """
        body = {**self.fields, **{k: v for k, v in given.items() if v is not None}}
        if "env" in self.fields and given.get("env"):
            body["env"] = {**self.fields["env"], **given["env"]}
        if (
            self.estimate_is_limit
            and given.get("estimated_duration_s") is None
            and isinstance(body.get("max_duration_s"), int)
            and body["estimated_duration_s"] > body["max_duration_s"]
        ):
            body["estimated_duration_s"] = body["max_duration_s"]
        body["command"] = self.command
        return body

    def warning(self) -> str | None:
        """The one warning line naming every directive not honoured, or ``None`` when all were."""
        if not self.not_honoured:
            return None
        return "directives not honoured: " + "; ".join(self.not_honoured)


# -- the command ----------------------------------------------------------------------------------


def interpreter(text: str) -> list[str]:
    """The program and its one optional argument from the script's ``#!`` line (as Linux splits it); ``bash``."""
    first = text.split("\n", 1)[0]
    if not first.startswith("#!"):
        return ["bash"]
    parts = re.split(r"[ \t]+", first[2:].strip(), maxsplit=1)
    if not parts[0]:
        return ["bash"]
    return [parts[0], parts[1].strip()] if len(parts) > 1 and parts[1].strip() else [parts[0]]


def script_command(text: str, args: Sequence[str] = ()) -> str:
    """The shell command that runs ``text`` by its interpreter with ``args``; ``ScriptError`` for DOS line breaks.

    ``exec INTERPRETER /dev/fd/3 ARGS 3<<'NPUPORTAL_SCRIPT'``, then the script, then the marker line.
    """
    if "\r\n" in text:
        raise ScriptError("the script has DOS line breaks (\\r\\n); save it with Unix ones (dos2unix), as sbatch asks")
    if not text.strip():
        raise ScriptError("the script is empty")
    lines = set(text.split("\n"))
    end, number = _END, 0
    while end in lines:
        number += 1
        end = f"{_END}_{number}"
    body = text if text.endswith("\n") else text + "\n"
    argv = shlex.join([*interpreter(text), "/dev/fd/3", *args])
    return f"exec {argv} 3<<'{end}'\n{body}{end}\n"


# -- directives -----------------------------------------------------------------------------------


@dataclass
class _Reading:
    """The state of one script's directives while they are read."""

    line: int = 0
    fields: dict[str, Any] = field(default_factory=dict)
    not_honoured: list[str] = field(default_factory=list)
    environ: Mapping[str, str] | None = None
    per_node: int | None = None
    total: int | None = None
    nodes: int | None = None
    output_file: tuple[str, str, int] | None = None
    error_file: str | None = None
    estimate_is_limit: bool = False

    def skip(self, option: str, why: str) -> None:
        self.not_honoured.append(f"{option} (line {self.line}: {why})")

    def fail(self, option: str, why: str) -> ScriptError:
        return ScriptError(f"line {self.line}: {option}: {why}")


def _count(reading: _Reading, option: str, value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise reading.fail(option, f"{value!r} is not a whole number of at least 1")
    return int(value)


def _time(reading: _Reading, option: str, value: str, *, bare: str) -> int:
    try:
        return parse_duration(value, bare="minutes" if bare == "minutes" else "seconds")
    except ValueError as exc:
        raise reading.fail(option, str(exc)) from None


def _devices(reading: _Reading, option: str, value: str, *, kinds: tuple[str, ...]) -> tuple[str | None, int] | None:
    """``npu:2``, ``npu:910B4:2``, ``npu`` (one), or for ``--gpus`` a bare ``2``: (chip model or None, count)."""
    parts = value.split(":")
    if parts[0] not in kinds:
        reading.skip(option, f"only {' and '.join(kinds)} are scheduled here")
        return None
    if len(parts) == 1:
        return None, 1
    if len(parts) > 3:
        raise reading.fail(option, f"{value!r} is not like npu:2 or npu:910B4:2")
    chip = parts[1] if len(parts) == 3 else None
    return chip, _count(reading, option, parts[-1])


def _sbatch_gres(reading: _Reading, option: str, value: str) -> None:
    found = _devices(reading, option, value, kinds=("npu", "gpu"))
    if found is not None:
        chip, reading.per_node = found
        if chip:
            reading.fields["chip_model"] = chip


def _sbatch_gpus(reading: _Reading, option: str, value: str) -> None:
    found = _devices(reading, option, f"gpu:{value}", kinds=("gpu",))  # [type:]count
    if found is None:
        return
    chip, count = found
    if option.startswith("--gpus-per-node"):
        reading.per_node = count
    else:
        reading.total = count
    if chip:
        reading.fields["chip_model"] = chip


def _sbatch_nodes(reading: _Reading, option: str, value: str) -> None:
    low, _, high = value.partition("-")
    if high and high != low:
        reading.skip(option, "a job runs on a fixed number of nodes; give one number")
        return
    reading.nodes = _count(reading, option, low)


def _sbatch_tasks(reading: _Reading, option: str, value: str) -> None:
    if _count(reading, option, value) != 1:
        reading.skip(
            option,
            "the script runs once on each node; start one process per card from it "
            "(torchrun --nproc-per-node $NPROC_PER_NODE)",
        )


def _sbatch_time(reading: _Reading, option: str, value: str) -> None:
    if value.upper() in ("UNLIMITED", "INFINITE"):
        return  # no limit: what a job without --time has
    seconds = _time(reading, option, value, bare="minutes")
    reading.fields["max_duration_s"] = seconds
    reading.fields.setdefault("estimated_duration_s", seconds)
    reading.estimate_is_limit = reading.fields["estimated_duration_s"] == seconds


def _output(reading: _Reading, option: str, value: str) -> None:
    reading.output_file = (value, option, reading.line)  # a relative path is read from --chdir, at the end


def _sbatch_error(reading: _Reading, option: str, value: str) -> None:
    reading.error_file = value  # compared with --output once every directive is read


def _chdir(reading: _Reading, option: str, value: str) -> None:
    if not value.startswith("/"):
        raise reading.fail(option, f"{value!r} is not an absolute path (it is a directory on the nodes)")
    reading.fields["cwd"] = value


_ARRAY = re.compile(r"\d+(?:-\d+(?::\d+)?)?(?:,\d+(?:-\d+(?::\d+)?)?)*(?:%\d+)?")
_DEPENDENCY_KINDS = frozenset({"afterok", "afterany", "afternotok"})


def _sbatch_array(reading: _Reading, option: str, value: str) -> None:
    """Slurm's index list as it is (``0-15``, ``1,3,5``, ``0-15:4``, ``%4`` at the end): the API reads it."""
    if _ARRAY.fullmatch(value) is None:
        raise reading.fail(option, f"{value!r} is not an index list like 0-15, 1,3,5, 0-15:4 or 0-15%4")
    reading.fields["array"] = value


def _sbatch_export(reading: _Reading, option: str, value: str) -> None:
    env = reading.fields.setdefault("env", {})
    for item in value.split(","):
        name, sep, text = item.partition("=")
        if not sep and name == "ALL":
            reading.skip("--export=ALL", "a job starts with a clean environment; name its variables")
        elif not sep and name in ("NONE", "NIL"):
            continue  # what every job gets: a clean environment
        elif not _ENV_NAME.fullmatch(name):
            raise reading.fail(option, f"{item!r} is not NAME or NAME=value")
        elif sep:
            env[name] = text
        elif reading.environ is not None and name in reading.environ:
            env[name] = reading.environ[name]
        else:
            reading.skip(f"--export={name}", "no value here to pass on; give NAME=value")
    if not env:
        del reading.fields["env"]


def _sbatch_dependency(reading: _Reading, option: str, value: str) -> None:
    """``afterok``/``afterany``/``afternotok`` lists, sent as written (the API checks the job ids)."""
    for part in value.split(","):
        kind, _, rest = part.partition(":")
        if kind not in _DEPENDENCY_KINDS or not rest:
            reading.skip(option, "only afterok, afterany and afternotok:ID[:ID] are taken")
            return
    reading.fields["depends_on"] = value


def _setter(name: str) -> Callable[[_Reading, str, str], None]:
    def set_field(reading: _Reading, option: str, value: str) -> None:
        reading.fields[name] = value

    return set_field


def _unsupported(why: str) -> Callable[[_Reading, str, str], None]:
    def skip(reading: _Reading, option: str, value: str) -> None:
        reading.skip(option, why)

    return skip


_NOT_SCHEDULED = "not a resource scheduled here"
#: sbatch's options read from ``#SBATCH`` lines: (long name, short letter or "", takes a value, what it does).
SBATCH_OPTIONS: tuple[tuple[str, str, bool, Callable[[_Reading, str, str], None]], ...] = (
    ("job-name", "J", True, _setter("name")),
    ("gres", "", True, _sbatch_gres),
    ("gpus", "G", True, _sbatch_gpus),
    ("gpus-per-node", "", True, _sbatch_gpus),
    ("nodes", "N", True, _sbatch_nodes),
    ("ntasks-per-node", "", True, _sbatch_tasks),
    ("ntasks", "n", True, _sbatch_tasks),
    ("time", "t", True, _sbatch_time),
    ("output", "o", True, _output),
    ("error", "e", True, _sbatch_error),
    ("chdir", "D", True, _chdir),
    ("array", "a", True, _sbatch_array),
    ("export", "", True, _sbatch_export),
    ("dependency", "d", True, _sbatch_dependency),
    ("account", "A", True, _setter("team")),
    ("qos", "q", True, _setter("priority_class")),
    ("partition", "p", True, _unsupported("no partitions here: the policy decides where a job runs")),
    ("mem", "", True, _unsupported(_NOT_SCHEDULED)),
    ("mem-per-cpu", "", True, _unsupported(_NOT_SCHEDULED)),
    ("mem-per-gpu", "", True, _unsupported(_NOT_SCHEDULED)),
    ("cpus-per-task", "c", True, _unsupported(_NOT_SCHEDULED)),
    ("cpus-per-gpu", "", True, _unsupported(_NOT_SCHEDULED)),
    ("exclusive", "", False, _unsupported("whole nodes go to jobs that ask for all their cards")),
    ("mail-type", "", True, _unsupported("no mail is sent")),
    ("mail-user", "", True, _unsupported("no mail is sent")),
)


def _npu_devices(reading: _Reading, option: str, value: str) -> None:
    reading.fields["num_devices"] = _count(reading, option, value)


def _npu_duration(name: str) -> Callable[[_Reading, str, str], None]:
    def set_duration(reading: _Reading, option: str, value: str) -> None:
        reading.fields[name] = _time(reading, option, value, bare="seconds")
        if name == "estimated_duration_s":
            reading.estimate_is_limit = False

    return set_duration


def _npu_array(reading: _Reading, option: str, value: str) -> None:
    """``--array`` as ``npuctl submit`` takes it: a count, or Slurm's index list."""
    if value.isdigit():
        reading.fields["array"] = _count(reading, option, value)
    else:
        _sbatch_array(reading, option, value)


def _npu_env(reading: _Reading, option: str, value: str) -> None:
    name, sep, text = value.partition("=")
    if not sep or not _ENV_NAME.fullmatch(name):
        raise reading.fail(option, f"{value!r} is not NAME=VALUE")
    reading.fields.setdefault("env", {})[name] = text


#: ``npuctl submit``'s options read from ``#NPU`` lines, with the same meaning (durations: plain numbers are seconds).
NPU_OPTIONS: tuple[tuple[str, str, bool, Callable[[_Reading, str, str], None]], ...] = (
    ("name", "", True, _setter("name")),
    ("devices", "n", True, _npu_devices),
    ("chip", "", True, _setter("chip_model")),
    ("vnpu", "", True, _setter("vnpu_template")),
    ("class", "", True, _setter("priority_class")),
    ("time", "t", True, _npu_duration("estimated_duration_s")),
    ("max-time", "", True, _npu_duration("max_duration_s")),
    ("checkpoint-interval", "", True, _npu_duration("checkpoint_interval_s")),
    ("team", "", True, _setter("team")),
    ("array", "", True, _npu_array),
    ("env", "", True, _npu_env),
    ("chdir", "D", True, _chdir),
    ("output", "o", True, _output),
)


def _options(words: list[str], table: Sequence[tuple[str, str, bool, Any]]) -> list[tuple[str, str, Any]]:
    """``(as written, value, handler)`` for each option in ``words``; an unknown one has handler ``None``."""
    longs = {name: (takes, handler) for name, _, takes, handler in table}
    shorts = {letter: (name, takes, handler) for name, letter, takes, handler in table if letter}
    out: list[tuple[str, str, Any]] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word.startswith("--"):
            name, sep, value = word[2:].partition("=")
            if name not in longs:
                if not sep and i < len(words) and not words[i].startswith("-"):
                    word, i = f"{word}={words[i]}", i + 1  # its value, most likely: name the two together
                out.append((word, "", None))
                continue
            takes, handler = longs[name]
            if takes and not sep:
                if i >= len(words):
                    out.append((word, "", "missing"))
                    continue
                value = words[i]
                i += 1
            out.append((f"--{name}={value}" if takes else word, value, handler))
        elif word.startswith("-") and len(word) >= 2 and word[1] in shorts:
            name, takes, handler = shorts[word[1]]
            value = word[2:]
            if takes and not value:
                if i >= len(words):
                    out.append((word, "", "missing"))
                    continue
                value = words[i]
                i += 1
            out.append((f"--{name}={value}" if takes else word, value, handler))
        else:
            if len(word) == 2 and word[0] == "-" and i < len(words) and not words[i].startswith("-"):
                word, i = f"{word} {words[i]}", i + 1
            out.append((word, "", None))
    return out


def read_script(
    text: str,
    args: Sequence[str] = (),
    *,
    name: str = "",
    environ: Mapping[str, str] | None = None,
) -> Batch:
    """Read a batch script: its directives into request fields, and the command that runs it with ``args``.

    ``name`` (the script's file name) is the job's name unless a directive gives one, as in sbatch.
    ``environ`` is the submitter's environment, for ``--export=NAME`` without a value (the console
    has none to give). Raises :class:`ScriptError` naming the line for what cannot be read.
    """
    command = script_command(text, args)
    reading = _Reading(environ=environ)
    in_header = True
    for number, raw in enumerate(text.split("\n"), start=1):
        reading.line = number
        line = raw.strip()
        if number == 1 and line.startswith("#!"):
            continue
        prefix = next((p for p in ("#SBATCH", "#NPU") if line.startswith(p)), None)
        if prefix is not None and line[len(prefix) : len(prefix) + 1] not in ("", " ", "\t"):
            prefix = None  # "#SBATCHX", "#NPUS": a comment, not a directive
        if in_header and line and not line.startswith("#"):
            in_header = False
        if prefix is None:
            continue
        if not in_header:
            reading.skip(f"{prefix}{line[len(prefix) :]}".strip(), "after the first command: sbatch ignores it too")
            continue
        try:
            words = shlex.split(line[len(prefix) :], comments=True)
        except ValueError as exc:
            raise ScriptError(f"line {number}: {prefix}: {exc}") from None
        table = SBATCH_OPTIONS if prefix == "#SBATCH" else NPU_OPTIONS
        for written, value, handler in _options(words, table):
            if handler is None:
                reading.skip(f"{prefix} {written}" if prefix == "#NPU" else written, "unknown option")
            elif handler == "missing":
                raise reading.fail(written, "needs a value")
            else:
                handler(reading, written, value)
    return _finish(reading, command, name)


def _absolute(fields: Mapping[str, Any], path: str) -> str | None:
    """``path`` on the nodes: as it is when absolute, else under ``--chdir`` (``None`` without one), as sbatch."""
    if path.startswith("/"):
        return path
    return posixpath.join(fields["cwd"], path) if fields.get("cwd") else None


def _finish(reading: _Reading, command: str, name: str) -> Batch:
    """What can only be decided once every directive is read: the card count, ``--error``, the name."""
    reading.line = 0
    fields = reading.fields
    nodes = reading.nodes
    if reading.total is not None:
        fields["num_devices"] = reading.total
    elif reading.per_node is not None:
        fields["num_devices"] = reading.per_node * (nodes or 1)
    elif nodes is not None and nodes > 1:
        reading.not_honoured.append(f"--nodes={nodes} (give the cards each node runs with --gres=npu:N)")
    if reading.output_file is not None:
        path, option, reading.line = reading.output_file
        if _absolute(fields, path) is None:
            reading.skip(option, "a relative path needs --chdir; give an absolute one")
        else:
            fields["output"] = _absolute(fields, path)
        reading.line = 0
    if reading.error_file is not None:
        if _absolute(fields, reading.error_file) != fields.get("output"):
            reading.not_honoured.append(
                f"--error={reading.error_file} (errors go with the output, into --output and the job's log)"
            )
    if "name" not in fields and name:
        fields["name"] = os.path.basename(name)[:200]
    return Batch(
        command=command,
        fields=fields,
        not_honoured=reading.not_honoured,
        estimate_is_limit=reading.estimate_is_limit,
    )
