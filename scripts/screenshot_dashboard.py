"""Take the README's screenshot: the dashboard overview during `remediation demo`, in real Chromium.

    .venv/bin/python scripts/screenshot_dashboard.py [--at 40] [--out docs/img/dashboard.png] [--page /]
    .venv/bin/python scripts/screenshot_dashboard.py --at 52 --page "/reliability?since=2h&by=rack,sku" \
        --out docs/img/reliability.png --height 1100

It starts `remediation demo` (the console script next to this interpreter) with `--port 0`, reads the
dashboard URL and admin token the demo prints, waits until ``--at`` seconds into the scenario (by
default 20 s after the storm: the breaker is open, drained nodes wait on it for their VM restarts,
the lemon is in verify, and the first remediations have succeeded; see demo/run.py), logs in through the login form as a human would, opens the
overview (or ``--page``) and saves a ``--width`` x ``--height`` PNG. Then it stops the demo.

The browser is Debian's ``chromium`` driven by its ``chromedriver`` (``scripts/setup.sh`` installs
both), launched with the options of tests/integration/test_browser.py, so Selenium never downloads a
browser or a driver. Nothing here needs a network beyond 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

ROOT = Path(__file__).resolve().parents[1]
BANNER = re.compile(r"dashboard: (http://127\.0\.0\.1:\d+)\s+\(admin token: (\S+)\)")


def _remediation() -> str:
    script = Path(sys.executable).parent / "remediation"
    found = str(script) if script.exists() else shutil.which("remediation")
    if found is None:
        raise SystemExit("error: no `remediation` console script; run scripts/venv.sh first")
    return found


def _browser(profile: Path, width: int, height: int) -> webdriver.Chrome:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        raise SystemExit(
            "error: needs Debian's chromium and chromium-driver (scripts/setup.sh installs them)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--window-size={width},{height}",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(arg)  # fmt: skip
    browser = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    browser.set_page_load_timeout(30)
    # The window size includes the (invisible) browser chrome; pin the page's viewport itself.
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )
    return browser


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at", type=float, default=40.0, help="seconds into the demo to take it")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "dashboard.png")
    parser.add_argument("--page", default="/", help="dashboard path to take, e.g. /reliability?since=1d")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=900)
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="remediation-screenshot-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("REMEDIATION_")}
    env["COLUMNS"] = "200"
    demo = subprocess.Popen(
        [_remediation(), "demo", "--workdir", str(work), "--port", "0"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    started = time.monotonic()
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(demo.stdout.readline, "")), daemon=True).start()  # type: ignore[union-attr]
    browser = None
    try:
        found = None
        while found is None and demo.poll() is None and time.monotonic() - started < 60:
            found = BANNER.search("".join(lines))
            time.sleep(0.2)
        if found is None:
            raise SystemExit("error: the demo printed no dashboard URL:\n" + "".join(lines))
        url, token = found.groups()
        browser = _browser(work / "chromium-profile", args.width, args.height)
        wait = WebDriverWait(browser, 20)
        browser.get(f"{url}/login")
        browser.find_element(By.NAME, "token").send_keys(token)
        browser.find_element(By.NAME, "name").send_keys("on-call")
        browser.find_element(By.CSS_SELECTOR, "form.login button").click()
        wait.until(ec.url_to_be(f"{url}/"))
        time.sleep(max(0.0, args.at - (time.monotonic() - started)))
        browser.get(f"{url}{args.page}")  # fresh figures at the chosen moment
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "main")))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if not browser.save_screenshot(str(args.out)):
            raise SystemExit(f"error: Chromium could not write {args.out}")
        print(
            f"{args.out}: {args.out.stat().st_size // 1024} KB, {time.monotonic() - started:.0f}s into the demo"
        )
    finally:
        if browser is not None:
            browser.quit()
        if demo.poll() is None:
            demo.send_signal(signal.SIGINT)  # the demo's own clean-up: watchers, worker, simulator
            try:
                demo.wait(30)
            except subprocess.TimeoutExpired:
                demo.kill()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
