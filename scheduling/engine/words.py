"""Sizes and times as a team lead reads them, for every refusal and wait detail the engine writes.

A refusal says "a 25 h run is more than the team's 24 h limit on run time" and "an 11-card job",
never a policy key (``maxJobDuration``) or a count of seconds (``90000s``): the people who read
them wrote neither. Policy files keep their own notation (``24h``, :mod:`durations`).
"""

from __future__ import annotations

#: Units of :func:`duration_words`, largest first.
_UNITS: tuple[tuple[str, int], ...] = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))


def duration_words(seconds: float) -> str:
    """``24 h``, ``1 h 30 min``, ``7 d``, ``45 s``: at most the two largest units, rounded to the second.

    Days from two days on, as the policy's own ``24h`` reads: a day-long limit is ``24 h``.
    """
    whole = max(0, round(seconds))
    if whole == 0:
        return "0 s"
    parts: list[str] = []
    rest = whole
    for unit, size in _UNITS:
        if unit == "d" and whole < 2 * size:
            continue
        if rest >= size:
            parts.append(f"{rest // size} {unit}")
            rest %= size
        if len(parts) == 2:
            break
        if parts and unit != "s" and rest == 0:
            break
    return " ".join(parts)


def sized_job(cards: float) -> str:
    """``a 4-card job``, ``an 11-card job``, ``an 8-card job``; ``a 0.5-card job`` for a slice."""
    text = f"{cards:g}"
    return f"{article(text)} {text}-card job"


def a_run(seconds: float) -> str:
    """``a 30 h run``, ``an 8 d run``, ``an 11 h run``."""
    text = duration_words(seconds)
    return f"{article(text)} {text} run"


def article(number: str) -> str:
    """``an`` before a number said with a vowel first (8, 11, 18, 80-89, 800-899, 11,000...), else ``a``.

    ``number`` is the text that follows (``11``, ``8 d``, ``0.5``): its leading digits decide.
    """
    digits = ""
    for ch in number.lstrip("-"):
        if not ch.isdigit():
            break
        digits += ch
    if not digits:
        return "a"
    lead = int(digits)
    while lead >= 1000:  # "eleven thousand", "eighteen thousand", "eight thousand"
        lead //= 1000
    return "an" if str(lead).startswith("8") or lead in (11, 18) else "a"


def count(n: float, thing: str) -> str:
    """``1 device``, ``3 devices``, ``0.5 devices``."""
    return f"{n:g} {thing}" if n == 1 else f"{n:g} {thing}s"
