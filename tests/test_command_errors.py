"""Bad input to ``npuctl`` and ``manage.py`` gives one line and a documented exit code, never a traceback.

Each case runs the real program in a subprocess (``python -m npuctl``, ``python manage.py``)
from this tree. The ``manage.py`` cases start together (each pays ~2 s of Django start-up)
and are checked one by one.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.waiting import ceiling

ROOT = Path(__file__).resolve().parent.parent
NOT_UTF8 = b"apiVersion: npuportal/v1\nkind: SchedulingPolicy\n# caf\xe9\n"  # a Latin-1 é
BYTE_AT = f"(byte 0xe9 at offset {NOT_UTF8.index(0xE9)})"


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    """This tree's sources, a scratch var/ (a fresh SQLite file), no PostgreSQL/Redis of the caller's."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(
        PYTHONPATH=str(ROOT), NPUPORTAL_VAR_DIR=str(tmp / "var"), NPUPORTAL_URL=f"http://127.0.0.1:{free_port()}"
    )
    env.pop("NPUPORTAL_TOKEN", None)
    env.update(extra)
    return env


def _one_line_no_traceback(done: subprocess.CompletedProcess[str] | tuple[int, str, str]) -> str:
    """The one line on stderr (asserting there is just one, and no traceback anywhere)."""
    _, out, err = (done.returncode, done.stdout, done.stderr) if not isinstance(done, tuple) else done
    assert "Traceback" not in err and "Traceback" not in out, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


# -- npuctl ------------------------------------------------------------------------------------


def npuctl(tmp: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "npuctl", *argv],
        cwd=ROOT,
        env=_env(tmp, NPUPORTAL_TOKEN="whatever", **env),
        capture_output=True,
        text=True,
        timeout=ceiling(120),
    )


@pytest.mark.parametrize(
    ("argv", "env", "says"),
    [
        (["--url", "not-a-url", "nodes"], {}, "argument --url: 'not-a-url' is not a server URL"),
        (["--url", "ftp://host", "nodes"], {}, "(http or https, and a host)"),
        (["--url", "http://host:99999", "nodes"], {}, "the port must be a number from 1 to 65535"),
        (["nodes"], {"NPUPORTAL_URL": "127.0.0.1:8000"}, "NPUPORTAL_URL: '127.0.0.1:8000' is not a server URL"),
        (["--timeout", "-1", "nodes"], {}, "argument --timeout: '-1' must be more than 0"),
        (["--timeout", "0", "nodes"], {}, "argument --timeout: '0' must be more than 0"),
        (["--timeout", "inf", "nodes"], {}, "at most 86400 seconds"),
        (["--timeout", "soon", "nodes"], {}, "'soon' is not a number of seconds"),
        (["policy", "apply", "{bad}", "--comment", "  "], {}, "apply needs --comment"),
    ],
)
def test_npuctl_usage_errors_are_one_line_and_exit_2(tmp_path, argv, env, says) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("kind: SchedulingPolicy\n")
    done = npuctl(tmp_path, *[a.replace("{bad}", str(bad)) for a in argv], **env)
    assert done.returncode == 2, done.stderr
    line = _one_line_no_traceback(done)
    assert line.startswith("npuctl") and says in line
    assert "Operation now in progress" not in line


@pytest.mark.parametrize("action", [["validate"], ["apply", "--comment", "why"], ["diff", "active"]])
def test_npuctl_names_a_policy_file_that_is_not_utf8(tmp_path, action) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(NOT_UTF8)
    argv = ["policy", action[0], str(bad), *action[1:]]
    done = npuctl(tmp_path, *argv)
    assert done.returncode == 2
    assert _one_line_no_traceback(done) == f"npuctl: policy file {bad} is not UTF-8 text {BYTE_AT}"


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A port that takes connections and never answers (the kernel accepts them; nobody reads)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_npuctl_a_server_that_does_not_answer_in_time_is_exit_3(tmp_path, silent_server) -> None:
    done = npuctl(tmp_path, "--url", silent_server, "--timeout", "0.3", "nodes")
    assert done.returncode == 3
    assert _one_line_no_traceback(done) == f"npuctl: cannot reach {silent_server}: no answer within 0.3 s (--timeout)"


def test_npuctl_a_port_that_is_not_http_is_exit_3(tmp_path) -> None:
    with socket.socket() as listener:  # answers each connection by closing it, as a non-HTTP server may
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        child = subprocess.Popen(
            [sys.executable, "-m", "npuctl", "--url", url, "nodes"],
            cwd=ROOT,
            env=_env(tmp_path, NPUPORTAL_TOKEN="x"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        listener.settimeout(ceiling(60))
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.close()
        out, err = child.communicate(timeout=ceiling(60))
    assert child.returncode == 3
    assert _one_line_no_traceback((child.returncode, out, err)).startswith(f"npuctl: cannot reach {url}")


@pytest.mark.django_db(transaction=True)
def test_npuctl_piped_into_head_stops_quietly_with_141(tmp_path, live_server, demo, user_factory) -> None:
    """Far more output than a pipe holds, so ``head`` is gone before npuctl has written it all."""
    from quotas.access.tokens import issue_token

    lead = user_factory("pipe-lead", team="training", role="lead")
    env = _env(tmp_path, NPUPORTAL_URL=live_server.url, NPUPORTAL_TOKEN=issue_token(lead, "cli")[1])
    npuctl_cmd = f"{sys.executable} -m npuctl"
    submitted = subprocess.run(
        f"{npuctl_cmd} submit --array 150 --vnpu vir01 --time 1h -- sleep 60",
        shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=ceiling(120),
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    piped = subprocess.run(
        ["bash", "-c", f'{npuctl_cmd} queue --json | head -1; echo "npuctl exit ${{PIPESTATUS[0]}}" >&2'],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=ceiling(120),
    )  # fmt: skip
    assert piped.stdout == "[\n"
    assert "Traceback" not in piped.stderr and "BrokenPipe" not in piped.stderr and "Exception" not in piped.stderr
    assert piped.stderr.strip().splitlines() == ["npuctl exit 141"]
    table = subprocess.run(
        ["bash", "-c", f'{npuctl_cmd} queue | head -3; echo "npuctl exit ${{PIPESTATUS[0]}}" >&2'],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=ceiling(120),
    )  # fmt: skip
    assert table.stdout.splitlines()[0].split()[:2] == ["JOBID", "NAME"] and len(table.stdout.splitlines()) == 3
    assert table.stderr.strip().splitlines()[-1] in ("npuctl exit 141", "npuctl exit 0")  # 150 rows may fit a pipe
    assert "Traceback" not in table.stderr


# -- manage.py ---------------------------------------------------------------------------------

#: name → (argv after manage.py, extra environment, exit code, the one line on stderr); ``{bad}`` is a
#: policy file that is not UTF-8, ``{port}`` a port nobody listens on.
NOT_UTF8_LINE = "policy file {bad} is not UTF-8 text " + BYTE_AT
MANAGE_CASES: dict[str, tuple[list[str], dict[str, str], int, str]] = {
    "policy validate, not UTF-8": (["policy", "validate", "{bad}"], {}, 2, NOT_UTF8_LINE),
    "policy apply, not UTF-8": (["policy", "apply", "{bad}", "-m", "why", "--author", "admin"], {}, 2, NOT_UTF8_LINE),
    "policy diff, not UTF-8": (["policy", "diff", "{bad}", "active"], {}, 2, NOT_UTF8_LINE),
    "nodes add, token file not UTF-8": (
        ["nodes", "add", "n1", "--agent-url", "http://127.0.0.1:{port}", "--token-file", "{bad}"], {}, 2,
        "--token-file: token file {bad} is not UTF-8 text " + BYTE_AT,
    ),
    "chargeback adjust 1e30": (
        ["chargeback", "adjust", "--team", "t", "--month", "2026-11", "--amount", "1e30", "--reason", "x"], {}, 2,
        "amount: '1e30' is too large: at most 12 digits before the point (up to 999999999999.99)",
    ),
    "loadgen --interval -1": (
        ["loadgen", "--interval", "-1"], {}, 2,
        "CommandError: --interval: -1 must be more than 0 and at most 86400 seconds",
    ),
    "a bad number in the environment": (
        ["policy", "history"], {"NPUPORTAL_TICK_INTERVAL": "fast"}, 78,
        "manage.py: configuration error: NPUPORTAL_TICK_INTERVAL='fast': expected a number",
    ),
    "a bad NPUPORTAL_ENGINE": (
        ["policy", "history"], {"NPUPORTAL_ENGINE": "turbo"}, 78,
        "manage.py: configuration error: NPUPORTAL_ENGINE='turbo': expected auto, python or compiled",
    ),
    "a database nobody answers at": (
        ["policy", "history"], {"DATABASE_URL": "postgres://postgres:s3cret@127.0.0.1:{port}/npu_nowhere"}, 3,
        "manage.py: cannot use the database at 127.0.0.1:{port} (database 'npu_nowhere'): connection failed: "
        'connection to server at "127.0.0.1", port {port} failed: Connection refused',
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def manage_runs(tmp_path_factory) -> dict[str, tuple[int, str, str, dict[str, str]]]:
    """Every case of :data:`MANAGE_CASES`, started at once: name → (exit code, stdout, stderr, its fill-ins)."""
    tmp = tmp_path_factory.mktemp("manage")
    bad = tmp / "latin1.yaml"
    bad.write_bytes(NOT_UTF8)
    fill = {"bad": str(bad), "port": str(free_port())}
    children = {}
    for name, (argv, extra, _, _) in MANAGE_CASES.items():
        children[name] = subprocess.Popen(
            [sys.executable, "manage.py", *(a.format(**fill) for a in argv)],
            cwd=ROOT,
            env=_env(tmp, **{k: v.format(**fill) for k, v in extra.items()}),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    results = {}
    try:
        for name, child in children.items():
            out, err = child.communicate(timeout=ceiling(180))
            results[name] = (child.returncode, out, err, fill)
    finally:
        for child in children.values():  # none is left running when one hung
            if child.poll() is None:
                child.kill()
                child.wait()
    return results


@pytest.mark.parametrize("name", list(MANAGE_CASES))
def test_manage_py_gives_one_line_and_its_exit_code(manage_runs, name) -> None:
    _, _, code, line = MANAGE_CASES[name]
    got, out, err, fill = manage_runs[name]
    assert got == code, err
    assert _one_line_no_traceback((got, out, err)) == line.format(**fill)
    assert "s3cret" not in err  # a database URL's password is never shown
