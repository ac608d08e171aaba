"""``manage.py``'s entry point: Django's commands, with failures of their surroundings as one line.

A bad environment variable, a database that does not answer, Ctrl-C or a reader of
stdout that went away (``manage.py policy export | head``) are not bugs of the
command run, so they get one line on stderr and an exit code of their own instead
of a traceback. ``--traceback`` (Django's own option) still shows the traceback.

Exit codes added to each command's own (0 ok, 1 refused or invalid, 2 usage error):

====  =====================================================================
3     the database cannot be used (not reachable, refused the login, ...)
78    a setting from the environment is wrong (sysexits' ``EX_CONFIG``)
130   interrupted (Ctrl-C)
141   stdout was closed early, as for a program stopped by SIGPIPE
====  =====================================================================
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

DATABASE, CONFIG, INTERRUPTED, BROKEN_PIPE = 3, 78, 130, 141


def _say(prog: str, message: str) -> None:
    print(f"{prog}: {message}", file=sys.stderr)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def _one_line(exc: BaseException) -> str:
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__


def _is_config_error(exc: BaseException) -> bool:
    """A wrong setting: Django's ImproperlyConfigured (settings' ``BadSetting`` is one) or a bad engine choice.

    The engine's ``EngineChoiceError`` is raised while ``scheduling.engine`` is first imported, so it
    is known by name: the class cannot be imported to compare with.
    """
    from django.core.exceptions import ImproperlyConfigured

    return isinstance(exc, ImproperlyConfigured) or type(exc).__name__ == "EngineChoiceError"


def database_location() -> str:
    """Where the default database is, for a message: host:port and name, or the SQLite file; never a password."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    if str(db.get("ENGINE", "")).endswith("sqlite3"):
        return f"the SQLite file {db.get('NAME')}"
    default_port = {"postgresql": 5432, "mysql": 3306}.get(str(db.get("ENGINE", "")).rsplit(".", 1)[-1], "")
    host = db.get("HOST") or "localhost"
    return f"{host}:{db.get('PORT') or default_port} (database {db.get('NAME')!r})"


def _silence_stdout() -> None:
    """Point stdout at /dev/null so Python's flush at exit does not fail again (Python's recipe for EPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``manage.py`` with ``argv``; the process's exit code."""
    argv = list(sys.argv if argv is None else argv)
    prog = os.path.basename(argv[0]) if argv else "manage.py"
    show_traceback = "--traceback" in argv
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "npuportal.settings")
    try:
        # Read the settings before Django does: its command runner keeps an ImproperlyConfigured
        # from the settings to itself and then reports an unknown command instead.
        from django.conf import settings

        settings.INSTALLED_APPS  # noqa: B018 -- imports the settings module
    except Exception as exc:
        if show_traceback or not _is_config_error(exc):
            raise
        _say(prog, f"configuration error: {_one_line(exc)}")
        return CONFIG

    from django.core.management import execute_from_command_line
    from django.db.utils import OperationalError

    try:
        execute_from_command_line(argv)
        sys.stdout.flush()  # inside the try: a reader that went away shows here, not at exit
    except OperationalError as exc:
        if show_traceback:
            raise
        _say(prog, f"cannot use the database at {database_location()}: {_first_line(exc)}")
        return DATABASE
    except BrokenPipeError:
        _silence_stdout()
        return BROKEN_PIPE
    except KeyboardInterrupt:
        return INTERRUPTED
    except Exception as exc:
        if show_traceback or not _is_config_error(exc):
            raise
        _say(prog, f"configuration error: {_one_line(exc)}")
        return CONFIG
    return 0
