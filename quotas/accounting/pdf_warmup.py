"""Have a web process ready to write a PDF statement before anyone asks for one.

A process's first PDF pays for importing WeasyPrint, cffi parsing the C declarations of pango and
cairo, and fontconfig finding the fonts: about a second on a 2-core machine, three times what a
statement takes afterwards. Each web worker does that once in the background, a while after it
starts (so it never competes with start-up), with a small page in the statement's own styles; the
first statement someone opens is then as quick as the next.
"""

from __future__ import annotations

import logging
import os
import threading
import time

log = logging.getLogger(__name__)

#: Seconds after a web worker starts before it warms up.
DELAY_S = 30.0

#: A page like a statement: the fonts, a bold heading, a table with right-aligned numbers and an SVG.
_PAGE = """<!doctype html><html><head><meta charset="utf-8"><style>
@page { size: A4; margin: 16mm 14mm; @bottom-right { content: "page " counter(page); font-size: 9pt; } }
body { font: 10.5pt/1.4 "DejaVu Sans", sans-serif; } h1 { font-size: 18pt; }
table { border-collapse: collapse; width: 100%; } th, td { border-bottom: 1px solid #d0d7de; }
td.num { text-align: right; font-variant-numeric: tabular-nums; } tfoot td { font-weight: bold; }
</style></head><body><h1>Statement · warm-up</h1><p>Closed 2026-12-01 00:00 · currency CNY</p>
<table><thead><tr><th>Kind</th><th class="num">Device-hours</th><th class="num">Amount</th></tr></thead>
<tbody><tr><td>Usage</td><td class="num">72.000000</td><td class="num">1036.80</td></tr></tbody>
<tfoot><tr><td colspan="2">Total</td><td class="num">1036.80 CNY</td></tr></tfoot></table>
<svg xmlns="http://www.w3.org/2000/svg" width="300" height="80" viewBox="0 0 300 80" font-family="DejaVu Sans">
<text x="10" y="20" font-size="14" font-weight="bold">Chart</text><rect x="10" y="30" width="40" height="40"
fill="#0b5cad"/><line x1="10" y1="70" x2="290" y2="70" stroke="#57606a"/></svg></body></html>"""

_started = threading.Event()


def warm_up() -> float:
    """Write one small PDF now; seconds it took. Raises what WeasyPrint raises when it cannot run."""
    began = time.perf_counter()
    import weasyprint

    weasyprint.HTML(string=_PAGE).write_pdf()
    return time.perf_counter() - began


def warm_up_in_background(delay_s: float = DELAY_S) -> None:
    """Warm up once per process, ``delay_s`` seconds from now, in a daemon thread at the lowest priority."""
    if _started.is_set():
        return
    _started.set()

    def run() -> None:
        time.sleep(delay_s)
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread only (Linux)
        except (AttributeError, OSError):
            pass
        try:
            log.debug("PDF statements warmed up in %.2f s", warm_up())
        except Exception as exc:  # no WeasyPrint or pango here: the statement view says so when asked
            log.debug("PDF warm-up skipped: %s", exc)

    threading.Thread(target=run, name="pdf-warm-up", daemon=True).start()
