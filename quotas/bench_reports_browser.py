"""Time the reports and quota pages in a real browser: navigation start to the last chart drawn.

``python -m quotas.bench_reports_browser`` seeds a throw-away demo (its own
``NPUPORTAL_VAR_DIR``), collects the static files as ``make run`` does, starts
gunicorn on a free port and opens each page in Debian's chromium (Playwright)
as the demo's ``finance`` login and a team lead. A page counts as drawn when
the page has loaded and every chart container (``.chart``, ``.heatmap``)
has Plotly's ``.main-svg`` (or the page's message that there is nothing to draw); the figure is
``performance.now()`` at that moment, i.e. milliseconds since navigation
start. Each page is opened ``--runs`` times in a fresh browser context (an
empty cache, as a first visit) and reloaded once (cached); the medians of
both are printed.

It prints figures and asserts nothing: docs/chargeback.md keeps the table.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VIEWPORT = {"width": 1280, "height": 900}
PAGES = ["/reports/", "/reports/?month={previous}", "/quota/"]

# Every chart div drawn (Plotly adds .main-svg), or the page says there is nothing to draw.
DRAWN = """() => {
  if (document.readyState !== 'complete') return false;
  const charts = [...document.querySelectorAll('.chart, .heatmap')];
  return charts.every(c => c.querySelector('.main-svg') || c.querySelector('p'));
}"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _manage(env: dict[str, str], *args: str) -> None:
    subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)


def _wait_up(url: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(200):
        if proc.poll() is not None:
            raise SystemExit("gunicorn exited before answering")
        try:
            urllib.request.urlopen(url + "/login/", timeout=1)
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.1)
    raise SystemExit("gunicorn did not answer in 20 s")


def _logins(var: Path) -> dict[str, str]:
    pairs = (line.split("\t") for line in (var / "demo_logins.txt").read_text().splitlines() if "\t" in line)
    return {u: p for u, p in pairs}


def measure(
    base: str, logins: dict[str, str], users: list[str], runs: int
) -> list[tuple[str, str, float, float, float, int]]:
    """(user, page, median ms with an empty cache, median ms reloaded, median ms until
    the page's HTML had arrived, Plotly SVG layers) per user and page."""
    from playwright.sync_api import sync_playwright

    previous = _previous_month()
    results = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        for user in users:
            context = browser.new_context(base_url=base, viewport=VIEWPORT)
            page = context.new_page()
            page.goto("/login/")
            page.get_by_label("Username").fill(user)
            page.get_by_label("Password").fill(logins[user])
            page.get_by_role("button", name="Log in").click()
            page.wait_for_url("**/")
            state = context.storage_state()
            context.close()
            for path in PAGES:
                path = path.format(previous=previous)
                cold, warm, html = [], [], []
                # A fresh context per run: an empty cache, as on a first visit (then one warm reload).
                for _ in range(runs):
                    context = browser.new_context(
                        base_url=base, viewport={"width": 1280, "height": 900}, storage_state=state
                    )
                    page = context.new_page()
                    errors: list[str] = []
                    page.on("pageerror", lambda exc, errors=errors: errors.append(str(exc)))
                    for times in (cold, warm):
                        page.goto(path, wait_until="commit")
                        page.wait_for_function(DRAWN, timeout=30_000, polling="raf")
                        times.append(float(page.evaluate("performance.now()")))
                    html.append(float(page.evaluate("performance.getEntriesByType('navigation')[0].responseEnd")))
                    charts = page.locator(".main-svg").count()
                    context.close()
                    if errors:
                        raise SystemExit(f"{path}: script error {errors[0]}")
                results.append(
                    (user, path, statistics.median(cold), statistics.median(warm), statistics.median(html), charts)
                )
        browser.close()
    return results


def _previous_month() -> str:
    import datetime as dt

    today = dt.datetime.now(dt.UTC).date().replace(day=1) - dt.timedelta(days=1)
    return f"{today.year:04d}-{today.month:02d}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="loads of each page (default 5)")
    parser.add_argument("--url", help="an already running server (then --user/--password are needed)")
    parser.add_argument("--user", action="append", help="login name (repeatable)")
    parser.add_argument("--password", action="append", help="password of each --user, in order")
    args = parser.parse_args(argv)
    if args.url:
        logins = dict(zip(args.user or [], args.password or [], strict=True))
        rows = measure(args.url.rstrip("/"), logins, list(logins), args.runs)
    else:
        with tempfile.TemporaryDirectory(prefix="npuportal-bench-") as tmp:
            env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
            env |= {"NPUPORTAL_VAR_DIR": tmp, "DJANGO_SETTINGS_MODULE": "npuportal.settings"}
            _manage(env, "migrate", "--noinput", "-v0")
            _manage(env, "seed_demo", "--no-agents")
            _manage(env, "collectstatic", "--noinput", "-v0")
            port = _free_port()
            web = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "npuportal.wsgi", "-b", f"127.0.0.1:{port}", "-w", "2"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                base = f"http://127.0.0.1:{port}"
                _wait_up(base, web)
                logins = _logins(Path(tmp))
                lead = next(u for u in logins if u.startswith("lead"))
                rows = measure(base, logins, ["finance", lead], args.runs)
            finally:
                web.terminate()
                web.wait(10)
    print(f"{'user':<16} {'page':<28} {'cold ms':>8} {'warm ms':>8} {'html ms':>8} {'svg layers':>10}")
    for user, path, cold, warm, html, charts in rows:
        print(f"{user:<16} {path:<28} {cold:>8.0f} {warm:>8.0f} {html:>8.0f} {charts:>10}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
