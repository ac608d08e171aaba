"""No CSV the portal writes holds a cell a spreadsheet would run as a formula (OWASP's CSV injection).

Names anyone can type — a job, a user name, a team, an adjustment's reason, a currency, a
template, a simulated trace's tenant — are made hostile, then every export is read back with
Python's ``csv`` reader: a cell may start with ``=``, ``+``, ``-``, ``@``, tab or carriage return
only when it is a number (a credit of -12.50 stays a number finance can add up).
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from decimal import Decimal, InvalidOperation
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client

from npuportal.csv_export import FORMULA_STARTS, csv_text, safe_cell
from quotas.accounting.statements import adjust, close_month
from quotas.models import Statement
from scheduling.models import Job
from tests.test_chargeback_harness import at, build_world

ROOT = Path(__file__).resolve().parents[1]
HYPERLINK = '=HYPERLINK("http://127.0.0.1:1/x","click")'
CALC = "+cmd|' /C calc'!A0"
SUM = "@SUM(1+1)"
ARITHMETIC = "-2+3"
HOSTILE = (HYPERLINK, CALC, SUM, ARITHMETIC, "\tTAB", "\rCR")


def _number(cell: str) -> bool:
    try:
        return Decimal(cell).is_finite()
    except InvalidOperation:
        return False


def _cells(text: str) -> list[str]:
    return [cell for row in csv.reader(io.StringIO(text)) for cell in row]


def assert_no_formulas(text: str, where: str) -> list[str]:
    """Every cell of ``text`` read back: none starts like a formula unless it is a number."""
    cells = _cells(text)
    assert cells, f"{where}: empty"
    bad = [cell for cell in cells if cell.startswith(FORMULA_STARTS) and not _number(cell)]
    assert not bad, f"{where}: cells a spreadsheet would run: {bad}"
    return cells


@pytest.mark.parametrize("value", HOSTILE)
def test_text_that_starts_like_a_formula_gets_a_quote(value: str) -> None:
    assert safe_cell(value) == "'" + value
    assert _cells(csv_text([[value]])) == ["'" + value]


def test_a_line_break_inside_a_name_cannot_start_a_row() -> None:
    # Spreadsheets end a row at a bare carriage return: unquoted, "=1+1" would be the next row's first cell.
    assert csv_text([["x\r=1+1", "y\n@z"], ["ok"]]) == '"x\r=1+1","y\n@z"\nok\n'


def test_numbers_stay_numbers_and_plain_text_stays_as_it_is() -> None:
    row = [Decimal("-12.50"), -3, -0.5, 0, "alpha", "12-03", None, "-12.50"]
    assert _cells(csv_text([row])) == ["-12.50", "-3", "-0.5", "0", "alpha", "12-03", "", "'-12.50"]
    # Not a finite number: text, so marked like any other.
    assert _cells(csv_text([[float("-inf"), Decimal("-Infinity")]])) == ["'-inf", "'-Infinity"]


@pytest.mark.django_db
@pytest.mark.clock
def test_every_export_neutralises_hostile_names() -> None:
    world = build_world()
    vir = world.vir02
    vir.name = SUM
    vir.save(update_fields=["name"])
    world.alpha.name = "-cmd"  # team names are slugs: a leading '-' is all they can carry
    world.alpha.save(update_fields=["name"])
    world.lead_alpha.username = HYPERLINK
    world.lead_alpha.save(update_fields=["username"])
    world.card.currency = "=1+"
    world.card.save(update_fields=["currency"])
    names = iter([CALC, ARITHMETIC, "\tTAB"])
    for devices, template in ((world.b4[:2], None), (world.p3[:1], vir), (world.b4[2:3], None)):
        job = world.job("alpha", "normal", devices, at("2025-03-02 00:00"), at("2025-03-02 10:00"), template=template)
        Job.objects.filter(pk=job.pk).update(name=next(names))
    close_month("2025-03")
    adjust("-cmd", "2025-03", "-12.50", SUM)
    adjust("-cmd", "2025-03", "3", "=1+1")

    finance = Client()
    finance.force_login(world.lead_alpha.__class__.objects.create_user("fin", is_staff=True))
    exports: dict[str, str] = {}
    for path in (
        "/reports/2025-03/all-teams.csv",
        "/reports/2025-03/jobs.csv",
        "/reports/2025-03/team/-cmd.csv",
        "/reports/statement/-cmd/2025-03.csv",
        "/api/v1/reports/statements/?month=2025-03&format=csv",
        "/api/v1/reports/statements/-cmd/2025-03/?format=csv",
    ):
        response = finance.get(path)
        assert response.status_code == 200, (path, response.content[:300])
        assert response["Content-Type"].startswith("text/csv"), path
        exports[path] = response.content.decode()
    out = io.StringIO()
    call_command("chargeback", "export", "--month", "2025-03", "--format", "csv", stdout=out)
    exports["manage.py chargeback export"] = out.getvalue()
    # An error answered as CSV echoes what was asked for.
    bad = finance.get("/api/v1/reports/statements/", {"month": HYPERLINK, "format": "csv"})
    assert bad.status_code == 400 and bad["Content-Type"].startswith("text/csv")
    exports["an error as CSV"] = bad.content.decode()

    everything: list[str] = []
    for where, text in exports.items():
        everything += assert_no_formulas(text, where)
    # The hostile names are there, marked as text, and the credit is still a number.
    for value in (HYPERLINK, CALC, SUM, ARITHMETIC, "\tTAB", "=1+1", "-cmd", "=1+"):
        assert "'" + value in everything, value
    assert "-12.50" in everything
    statement = Statement.objects.get(team=world.alpha, month="2025-03")
    assert str(statement.total) in everything


def test_the_simulators_job_records_neutralise_hostile_trace_names(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "job_id,submit_time_s,duration_s,num_devices,tenant,user,status\n"
        f'"{HYPERLINK.replace(chr(34), chr(34) * 2)}",0,60,1,@team,-user,Pass\n'
        f'"{CALC}",10,60,1,+team,user,Pass\n'
    )
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "nodeGroups:\n"
        "  - {name: b3, count: 1, chipModel: 910B3, devicesPerNode: 8, hbmMb: 65536, aiCores: 20, aiCpus: 7}\n"
    )
    policy = ROOT / "examples" / "policies" / "ms_itp_elasticflow.yaml"
    jobs = tmp_path / "jobs.csv"
    argv = ["--trace", trace, "--cluster", cluster, "--policy", policy, "--out", tmp_path / "m.json", "--quiet"]
    done = subprocess.run(
        [sys.executable, "-m", "scheduling.simulate", *argv, "--jobs-out", jobs],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "m.json").read_text())["input"]["jobs_total"] == 2
    cells = assert_no_formulas(jobs.read_text(), "simulate --jobs-out")
    assert "'" + HYPERLINK in cells and "'@team" in cells and "'+team" in cells
