"""The Reliability page and the report, opened in a real headless Chromium, and the report's CSV and
PDF written by the real ``remediation report`` console script: every figure they show is the one the
known history of tests/integration/test_reliability.py gives."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait
from sqlalchemy.orm import Session, sessionmaker

from remediation.api import create_app
from remediation.clock import FakeClock
from remediation.reports.reliability import hours
from remediation.services.reliability import Reliability
from remediation.settings import Settings
from tests.integration.history import sessions  # noqa: F401  (fixture)
from tests.integration.test_browser import ADMIN, _screenshot, browser, login, served  # noqa: F401  (fixtures)
from tests.integration.test_reliability import SHARED, build_known

CLI = Path(sys.executable).parent / "remediation"


@pytest.fixture
def known(sessions: sessionmaker[Session]) -> tuple[Reliability, dict[str, Any]]:  # noqa: F811
    return build_known(sessions)


@pytest.fixture
def base_url(
    pg_url: str, sessions: sessionmaker[Session], known: tuple[Reliability, dict[str, Any]]
) -> Iterator[str]:  # noqa: F811
    settings = Settings(database={"url": pg_url}, api={"admin_tokens": [ADMIN], "read_tokens": []})
    with served(create_app(settings, sessions, clock=FakeClock(known[1]["until"]))) as url:
        yield url


def shown(browser: WebDriver, rep: Reliability) -> None:  # noqa: F811
    """The figures a rendered page (dashboard or report) shows are the service's, cell by cell."""
    for dim, t in rep.trends.items():
        table = browser.find_element(By.CSS_SELECTOR, f"table.figures[data-by='{dim}']")
        cells = [
            [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            for tr in table.find_elements(By.CSS_SELECTOR, "tbody tr")
        ]
        assert cells == [
            [
                g.name,
                str(g.nodes),
                str(g.faults),
                ", ".join(f"{c} {n}" for c, n in g.by_class.items()) or "-",
                str(g.repairs),
                f"{hours(g.repair_median_h, 2)} / {hours(g.repair_mean_h, 2)}",
                hours(g.out_h),
                hours(g.mtbf_h, 0),
            ]
            for g in t.groups
        ], dim
    # Four bar charts per grouping and the faults-per-day chart, drawn on the server.
    assert len(browser.find_elements(By.CSS_SELECTOR, "svg.chart")) == 1 + 4 * len(rep.trends)
    bars = browser.find_elements(By.CSS_SELECTOR, "svg.chart:first-of-type rect title")
    assert {b.get_attribute("textContent") for b in bars} >= {
        "2026-11-01: 1 gpu-hardware",
        "2026-11-03: 1 host",
    }
    moves = browser.find_element(By.CSS_SELECTOR, "table.moves").text
    assert "gpu-node-1" in moves and "host:gpu-node-1-host0" in moves and "new hardware" in moves
    gpus = browser.find_element(By.CSS_SELECTOR, "table.shared-gpus").text
    assert SHARED in gpus and "gpu-node-1" in gpus and "gpu-node-3" in gpus
    hw = browser.find_element(By.CSS_SELECTOR, "table.hardware").text
    assert all(h.name in hw for h in rep.hardware)


def test_the_reliability_page_in_chromium(
    browser: WebDriver,
    base_url: str,  # noqa: F811
    known: tuple[Reliability, dict[str, Any]],
    tmp_path: Path,
) -> None:
    login(browser, base_url, "/reliability?since=3d")
    assert browser.find_element(By.TAG_NAME, "h1").text == "Reliability"
    shown(browser, known[0])
    _screenshot(browser, tmp_path, "reliability.png")

    # A moved name links to its node page, whose Hardware table shows each era, the new ones as such.
    browser.find_element(By.CSS_SELECTOR, "table.moves a[href='/nodes/gpu-node-1']").click()
    WebDriverWait(browser, 15).until(ec.url_to_be(f"{base_url}/nodes/gpu-node-1"))
    rows = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            for tr in browser.find_elements(By.CSS_SELECTOR, "table.eras tbody tr")]
    assert [(r[0], r[3], r[5], r[7]) for r in rows] == [
        ("1", "host:gpu-node-1-host0", "gpu-node-1-host0", "memory-8gpu"),
        ("2", "host:gpu-node-1-host1 new hardware", "gpu-node-1-host1", "memory-8gpu"),
        ("3", "host:gpu-node-1-host2 new hardware", "gpu-node-1-host2", "memory-8gpu"),
    ]
    assert SHARED in rows[1][8] and rows[1][9] == "host changed" and rows[2][2] == "now"


def report(pg_url: str, until: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REMEDIATION_DATABASE__URL": pg_url, "REMEDIATION_CONFIG": "", "USER": "oncall"}
    return subprocess.run(
        [str(CLI), "reliability", "--since", "3d", "--until", until, *args],  # noqa: S603 - our CLI
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )


def test_the_report_as_html_pdf_and_csv(
    browser: WebDriver,
    pg_url: str,  # noqa: F811
    known: tuple[Reliability, dict[str, Any]],
    tmp_path: Path,
) -> None:
    rep, facts = known
    until = facts["until"].isoformat()
    html, pdf = tmp_path / "r.html", tmp_path / "r.pdf"
    for fmt, path in (("html", html), ("pdf", pdf)):
        done = report(pg_url, until, "-o", fmt, "--file", str(path))
        assert done.returncode == 0, done.stderr
        assert f"wrote {path} ({fmt}, 2026-11-01 00:00 to 2026-11-04 00:00 UTC)" in done.stderr
    browser.get(html.as_uri())  # the file on-call attaches: no server behind it
    assert browser.find_element(By.TAG_NAME, "h1").text == "Reliability report"
    shown(browser, rep)
    assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 10_000

    done = report(pg_url, until, "-o", "csv", "--file", "-")
    assert done.returncode == 0, done.stderr
    got = {
        (r["section"], r["group_by"], r["key"], r["metric"]): r["value"]
        for r in csv.DictReader(io.StringIO(done.stdout))
    }
    for dim, t in rep.trends.items():
        for g in t.groups:
            assert got[("group", dim, g.name, "faults")] == str(g.faults)
            assert got[("group", dim, g.name, "out_of_service_h")] == f"{g.out_h:.4f}"
            assert got[("group", dim, g.name, "mtbf_h")] == ("" if g.mtbf_h is None else f"{g.mtbf_h:.4f}")
    assert got[("faults_per_day", "class", "gpu-memory", "2026-11-02")] == "1"
    assert got[("gpu_under_two_names", "", SHARED, "nodes")] == "gpu-node-1 gpu-node-3"

    bad = report(pg_url, until, "-o", "docx")
    assert bad.returncode == 2 and "choose one of html, pdf, csv" in bad.stderr
