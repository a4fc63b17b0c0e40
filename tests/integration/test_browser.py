"""The dashboard in a real headless Chromium: log in, open a quarantined node, release it.

Debian's ``chromium`` and ``chromium-driver`` (installed by ``scripts/setup.sh``) are driven through
Selenium with the driver's path given explicitly, so Selenium never downloads a browser or a driver.
The app is served by uvicorn on a socket bound to a free port of 127.0.0.1, against a fresh Postgres
database holding the shared history (gpu-node-8 is quarantined, see history.py). Screenshots land in
pytest's tmp dir and in ``tests/output/`` (gitignored) for a human to look at.
"""

from __future__ import annotations

import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.api import create_app
from remediation.db.models import AuditLog, Node
from remediation.ports.dispatch import Dispatcher
from remediation.settings import Settings
from tests.integration.history import History, RecordingDispatcher, dispatch, dispatcher, history, sessions  # noqa: F401  (fixtures)
from tests.pace import within

ADMIN = "admin-token-browser-0123456789"
OUTPUT = Path(__file__).resolve().parents[1] / "output"
NODE = "gpu-node-8"
REASON = "GPU swapped under RMA 4711; burn-in passed"


@contextmanager
def served(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free port of 127.0.0.1; yield its base URL."""
    # Bind first and hand uvicorn the socket: no window in which another process can take the port.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    deadline = within(15)
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            pytest.fail("uvicorn did not start serving the dashboard")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture
def base_url(pg_url: str, sessions: sessionmaker[Session], history: History,
             dispatcher: Dispatcher) -> Iterator[str]:
    settings = Settings(database={"url": pg_url}, api={"admin_tokens": [ADMIN], "read_tokens": []})
    with served(create_app(settings, sessions, dispatcher=dispatcher)) as url:
        yield url


def login(browser: WebDriver, base_url: str, path: str, token: str = ADMIN) -> None:
    """Open ``path``, which sends a browser without a session to the login form, and log in there; the
    form brings the browser back to the page (its path: a query is not carried through the login)."""
    page, _, query = path.partition("?")
    browser.get(f"{base_url}{path}")
    WebDriverWait(browser, 15).until(ec.url_contains("/login"))
    browser.find_element(By.NAME, "token").send_keys(token)
    browser.find_element(By.NAME, "name").send_keys("dana")
    browser.find_element(By.CSS_SELECTOR, "form.login button").click()
    WebDriverWait(browser, 15).until(ec.url_to_be(f"{base_url}{page}"))
    if query:
        browser.get(f"{base_url}{path}")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        pytest.fail("the browser test needs Debian's chromium and chromium-driver packages "
                    f"(found chromium={chromium}, chromedriver={driver_path}); run scripts/setup.sh")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--window-size=1280,1000", f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def _screenshot(driver: WebDriver, tmp_path: Path, name: str) -> None:
    OUTPUT.mkdir(parents=True, exist_ok=True)
    for where in (tmp_path / name, OUTPUT / name):
        assert driver.save_screenshot(str(where)), where
        assert where.stat().st_size > 1000, f"{where} is not a real screenshot"


def test_admin_releases_a_quarantined_node_from_the_dashboard(
        browser: WebDriver, base_url: str, sessions: sessionmaker[Session], dispatch: RecordingDispatcher,
        tmp_path: Path) -> None:
    wait = WebDriverWait(browser, 15)

    # Not logged in: the node page sends the browser to the login form, which brings it back.
    login(browser, base_url, f"/nodes/{NODE}")
    assert browser.find_element(By.CSS_SELECTOR, "h1 .st").text == "quarantined"
    assert "ladder exhausted" in browser.find_element(By.CSS_SELECTOR, "dl.facts").text
    assert "admin" in browser.find_element(By.CSS_SELECTOR, ".me .badge").text
    _screenshot(browser, tmp_path, "node-quarantined.png")

    form = browser.find_element(By.CSS_SELECTOR, f"form.lever[action='/nodes/{NODE}/release']")
    form.find_element(By.NAME, "reason").send_keys(REASON)
    form.find_element(By.CSS_SELECTOR, "button.release").click()

    wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, "p.flash.ok"), f"{NODE} released"))
    # Back on the node's page, in its cluster (a link names the node's cluster).
    assert browser.current_url.startswith(f"{base_url}/nodes/{NODE}?cluster=default&msg=")
    assert browser.find_element(By.CSS_SELECTOR, "h1 .st").text == "healthy"
    assert browser.find_elements(By.CSS_SELECTOR, "button.release") == []  # nothing left to release
    history_table = browser.find_elements(By.CSS_SELECTOR, "main table")[-1].text
    assert "release" in history_table and REASON in history_table and "dana (token " in history_table
    _screenshot(browser, tmp_path, "node-released.png")

    with sessions() as s:
        node = s.get(Node, ("default", NODE))
        assert node is not None and node.status == "healthy" and node.quarantined_at is None
        (row,) = s.scalars(select(AuditLog).where(AuditLog.action == "release", AuditLog.target == NODE)).all()
        assert row.reason == REASON and row.actor.startswith("dana (token ")
        assert ADMIN not in row.actor
    assert dispatch.released(sessions) == [NODE]
