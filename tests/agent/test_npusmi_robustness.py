"""npu-smi / nvidia-smi parsers under damaged and unfamiliar input.

The promise under test: never raise, and never call a chip healthy unless both of its rows were read
in full. Truncation points, column widths and whitespace are drawn by hypothesis (bounded, derandomised
so CI runs are repeatable).
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devices.agent.npusmi import HEALTH_SEVERITY, parse_any, parse_npu_smi_info
from devices.agent.nvsmi import parse_nvidia_smi

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "npu-smi"
INFO_FILES = sorted(
    p.name for p in FIXTURES.glob("*.txt") if p.name[:2] in {"02", "03", "04", "05", "06", "09", "11", "20", "21"}
)
TEXTS = {name: (FIXTURES / name).read_text(encoding="utf-8") for name in INFO_FILES}
ALL_TEXTS = {str(p.relative_to(FIXTURES)): p.read_text(encoding="utf-8") for p in sorted(FIXTURES.rglob("*.txt"))}
HEALTHS = set(HEALTH_SEVERITY)

FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# A chip row (row 2): ids, then a bus id (or NA), then the data cell, closed by '|'.
ROW2_RE = re.compile(
    r"^\|[ \t]*\d+(?:[ \t]+\d+)?[ \t]*\|[ \t]*(?:NA|[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])"
    r"[ \t]*\|[^|\n]*\|",
    re.MULTILINE,
)


def comparable(chip: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in chip.items() if k != "processes"}


def test_row2_pattern_finds_every_chip_row() -> None:
    """Guard for the truncation test below: it relies on locating each chip's second row."""
    for name, text in TEXTS.items():
        assert len(ROW2_RE.findall(text)) == len(parse_npu_smi_info(text).chips), name


@FUZZ
@given(name=st.sampled_from(INFO_FILES), data=st.data())
def test_truncated_output_never_reports_a_cut_chip_healthy(name: str, data: st.DataObject) -> None:
    text = TEXTS[name]
    cut = data.draw(st.integers(min_value=0, max_value=len(text)), label="cut")
    full = parse_npu_smi_info(text).chips
    row2_ends = [m.end() for m in ROW2_RE.finditer(text)]
    result = parse_npu_smi_info(text[:cut])
    assert len(result.chips) <= len(full)
    for i, chip in enumerate(result.chips):
        assert chip["health"] in HEALTHS
        assert chip["npu_id"] == full[i]["npu_id"]
        if chip["health"] == "OK":
            assert row2_ends[i] <= cut, f"chip {i} reported OK although its row was cut at {cut}"
            assert comparable(chip) == comparable(full[i])
    if cut < len(text.rstrip()) and result.chips:
        complete_rows = sum(1 for end in row2_ends if end <= cut)
        # Anything cut inside the chip rows must be visible as an error, not only as missing chips.
        if complete_rows < len(result.chips):
            assert result.errors


def widen(text: str, widths: list[int]) -> str:
    """Insert padding before every inner and closing column bar, as a release with wider columns would."""
    out = []
    for line in text.splitlines():
        if not line or line[0] not in "+|":
            out.append(line)
            continue
        border = not re.search(r"[A-Za-z0-9]", line)
        pieces = []
        for pos, ch in enumerate(line):
            if pos > 0 and ch in "+|":
                pad = widths[pos % len(widths)]
                fill = line[pos - 1] if border and line[pos - 1] in "-=" else " "
                pieces.append(fill * pad)
            pieces.append(ch)
        out.append("".join(pieces))
    return "\n".join(out) + "\n"


@FUZZ
@given(name=st.sampled_from(INFO_FILES), widths=st.lists(st.integers(0, 12), min_size=1, max_size=6))
def test_wider_columns_parse_the_same(name: str, widths: list[int]) -> None:
    original = parse_npu_smi_info(TEXTS[name])
    widened = parse_npu_smi_info(widen(TEXTS[name], widths))
    assert widened.chips == original.chips
    assert len(widened.errors) == len(original.errors)


@FUZZ
@given(name=st.sampled_from(INFO_FILES), seed=st.integers(0, 2**32 - 1))
def test_shuffled_whitespace_parses_the_same(name: str, seed: int) -> None:
    text = TEXTS[name]
    rng = random.Random(seed)  # one draw per space run would make hypothesis examples huge and slow
    shuffled = re.sub(r"[ ]+", lambda _: rng.choice([" ", "  ", "\t", " \t ", "      "]), text)
    result = parse_npu_smi_info(shuffled)
    assert result.chips == parse_npu_smi_info(text).chips
    assert len(result.errors) == len(parse_npu_smi_info(text).errors)


def test_fully_collapsed_whitespace_parses_the_same() -> None:
    for name, text in TEXTS.items():
        collapsed = re.sub(r"[ ]+", " ", text)
        assert parse_npu_smi_info(collapsed).chips == parse_npu_smi_info(text).chips, name


@FUZZ
@given(text=st.text(max_size=400))
def test_garbage_text_never_raises(text: str) -> None:
    result = parse_npu_smi_info(text)
    assert all(c["health"] in HEALTHS for c in result.chips)
    data, errors, anything = parse_any(text)
    assert isinstance(errors, list) and all(isinstance(e, str) for e in errors)
    assert isinstance(data, list | dict)
    if not anything:
        assert errors  # nothing parsed is always explained
    assert parse_nvidia_smi(text).gpus is not None


@FUZZ
@given(
    text=st.lists(
        st.sampled_from(
            ["|", "+", "-", "=", " ", "/", "0", "7", "OK", "Critical", "NA", "910B4", "\n", ":", "0000:C1:00.0"]
        ),
        max_size=120,
    ).map("".join)
)
def test_table_shaped_garbage_never_raises(text: str) -> None:
    result = parse_npu_smi_info(text)
    for chip in result.chips:
        assert chip["health"] in HEALTHS
        assert isinstance(chip["npu_id"], int)


@FUZZ
@given(name=st.sampled_from(sorted(ALL_TEXTS)), data=st.data())
def test_mutated_fixtures_never_raise(name: str, data: st.DataObject) -> None:
    text = ALL_TEXTS[name]
    pos = data.draw(st.integers(0, max(0, len(text) - 1)))
    junk = data.draw(st.text(min_size=0, max_size=5))
    mutated = text[:pos] + junk + text[pos + 1 :]
    for kind in ("auto", "info", "info-vnpu", "health", "kv"):
        parse_any(mutated, kind)
    for kind in ("auto", "csv", "q", "table"):
        for gpu in parse_nvidia_smi(mutated, kind).gpus:
            assert gpu["health"] in HEALTHS


@FUZZ
@given(name=st.sampled_from(sorted(n for n in ALL_TEXTS if n.startswith("nvidia/"))), data=st.data())
def test_truncated_nvidia_output_is_never_ok_unless_complete(name: str, data: st.DataObject) -> None:
    text = ALL_TEXTS[name]
    full = parse_nvidia_smi(text).gpus
    cut = data.draw(st.integers(0, len(text) - 1))
    result = parse_nvidia_smi(text[:cut], "csv" if "query-gpu" in name else "auto")
    for gpu in result.gpus:
        assert gpu["health"] in HEALTHS
        if gpu["health"] == "OK":
            match = next(g for g in full if g["index"] == gpu["index"])
            assert {k: v for k, v in gpu.items() if k != "processes"} == {
                k: v for k, v in match.items() if k != "processes"
            }
