"""The one logging set-up every process shares: watchers, worker, beat, the API and the CLI.

Each process calls :func:`configure` once with ``log_level`` and ``log_format`` (``text``, or ``json``:
one object per line with the call's ``extra=`` fields). It owns the root logger: one handler on stderr,
and every library logger (Celery's, uvicorn's, SQLAlchemy's) propagates to it, so one process never prints
two formats.

Why: docs/architecture.md#the-house-layers-imports-pointing-down
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

from pythonjsonlogger.json import JsonFormatter

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Loggers that carry their own handlers or levels by default; they are reset to propagate to the root.
_LIBRARY_LOGGERS = (
    "uvicorn",
    "uvicorn.error",
    "uvicorn.access",
    "uvicorn.asgi",
    "celery",
    "celery.task",
    "celery.redirected",
)
# billiard's pool logger (a worker child's death, say). billiard turns its propagation off whenever
# Celery resets it, so it gets the root's handler itself; otherwise Python's last-resort handler
# prints its records as bare text.
_OWN_PROPAGATION_LOGGERS = ("multiprocessing",)


def formatter(log_format: str) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter(
            "%(levelname)s %(name)s %(message)s",
            rename_fields={"levelname": "level", "name": "logger"},
            timestamp="time",  # ISO 8601, UTC
        )
    return logging.Formatter(TEXT_FORMAT)


def configure(level: str, log_format: str, stream: TextIO | None = None) -> None:
    """Route every logger in this process to one stderr handler in ``log_format`` at ``level``."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter(log_format))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)  # a library's warnings.warn() is a log record too, not a raw stderr line
    for name in _LIBRARY_LOGGERS:
        lib = logging.getLogger(name)
        lib.handlers = []
        lib.propagate = True
        lib.setLevel(logging.NOTSET)
    for name in _OWN_PROPAGATION_LOGGERS:
        lib = logging.getLogger(name)
        lib.handlers = [handler]
        lib.propagate = False
        lib.setLevel(logging.NOTSET)


def configure_from(settings: Any) -> None:
    """:func:`configure` with a :class:`remediation.settings.Settings`'s ``log_level`` and ``log_format``."""
    configure(settings.log_level, settings.log_format)
