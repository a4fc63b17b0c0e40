"""HTML to PDF through a headless Chromium's print-to-PDF.

The HTML is written to a private temporary directory and opened as a ``file://`` URL with a throw-away
profile; the browser runs from an argument list, never a shell.

Why: docs/running.md#the-cli
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class PdfError(RuntimeError):
    """No browser to print with, or the browser did not produce a PDF; the message says which."""


def find_browser(explicit: str | None = None) -> str:
    if explicit:
        found = shutil.which(explicit)
        if found is None:
            raise PdfError(f"--browser {explicit}: not found or not executable")
        return found
    for name in BROWSERS:
        if found := shutil.which(name):
            return found
    raise PdfError(
        f"no headless browser to print the PDF with: install chromium (looked for {', '.join(BROWSERS)} "
        "on PATH), or pass --browser"
    )


def html_to_pdf(html: str, out: Path, browser: str | None = None, *, timeout_s: float = 120.0) -> Path:
    """Print ``html`` to ``out`` (A4/Letter as the browser's default); return ``out``."""
    exe = find_browser(browser)
    with tempfile.TemporaryDirectory(prefix="remediation-pdf-") as tmp:
        page = Path(tmp) / "report.html"
        page.write_text(html, encoding="utf-8")
        target = Path(tmp) / "report.pdf"
        argv = [
            exe,
            "--headless",
            "--disable-gpu",
            "--no-first-run",
            "--no-pdf-header-footer",
            f"--user-data-dir={Path(tmp) / 'profile'}",
            f"--print-to-pdf={target}",
            page.as_uri(),
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            argv.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise PdfError(f"{exe} did not print the PDF within {timeout_s:.0f}s") from None
        if not target.exists() or target.read_bytes()[:5] != b"%PDF-":
            tail = (done.stderr or done.stdout or "").strip().splitlines()[-3:]
            raise PdfError(f"{exe} exited {done.returncode} without a PDF: {' / '.join(tail) or 'no output'}")
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(target, out)
    return out
