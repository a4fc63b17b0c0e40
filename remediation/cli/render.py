"""Output for the CLI: kubectl-like tables (plain columns, upper-case headers, greppable), ``-o wide``
for the extra columns, and ``-o json`` that prints :func:`remediation.services.readmodels.jsonable` verbatim, so a
script sees exactly what the API returns.

Colour is rich's: on for a terminal, off when piped. When piped, lines are not wrapped at 80 columns
(``COLUMNS`` still wins) so ``| grep`` sees one row per line.

Why: docs/running.md#the-cli
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from remediation.cli.context import CliError
from remediation.services.readmodels import ago, human_duration, jsonable

FORMATS = ("table", "wide", "json")

STATUS_STYLE = {
    "healthy": "green", "succeeded": "green", "done": "green", "open": "yellow", "recovered": "green",
    "remediating": "yellow", "running": "yellow", "waiting": "yellow", "started": "yellow",
    "unhealthy": "red", "failed": "bold red", "record": "dim",
    "quarantined": "bold magenta", "quarantine": "bold magenta", "cancelled": "dim",
    "with-repair": "magenta", "rechecking": "yellow", "returned": "green", "failed-check": "bold red",
}


def check_format(output: str) -> str:
    if output not in FORMATS:
        raise CliError(f"unknown output format {output!r} (choose from {', '.join(FORMATS)})")
    return output


def console() -> Console:
    if sys.stdout.isatty():
        return Console()
    return Console(width=int(os.environ.get("COLUMNS", "250")), soft_wrap=False)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(jsonable(obj), indent=2, sort_keys=False) + "\n")


def status(value: str | None) -> Text:
    return Text(value or "-", style=STATUS_STYLE.get(value or "", ""))


def when(at: datetime | None, now: datetime) -> str:
    return ago(at, now)


def stamp(at: datetime | None) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S") if at else "-"


def dur(seconds: float | None) -> str:
    return human_duration(seconds)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> Table:
    t = Table(box=None, header_style="bold", pad_edge=False, padding=(0, 2, 0, 0), title=title,
              title_justify="left", title_style="bold underline")
    for h in headers:
        t.add_column(h.upper(), overflow="fold")
    for row in rows:
        t.add_row(*(c if isinstance(c, Text) else Text(str(c)) for c in row))
    return t


def clustered(headers: Sequence[str], rows: Sequence[Sequence[Any]],
              clusters: Sequence[str]) -> tuple[list[str], list[list[Any]]]:
    """``headers`` and ``rows`` with a first CLUSTER column when the rows (``clusters``, one a row)
    span more than one cluster; unchanged otherwise, so a one-cluster site reads as it always did."""
    if len(set(clusters)) <= 1:
        return list(headers), [list(row) for row in rows]
    return ["cluster", *headers], [[cluster, *row] for cluster, row in zip(clusters, rows, strict=True)]


def show(*renderables: Any) -> None:
    out = console()
    for r in renderables:
        out.print(r)


def fields(pairs: Sequence[tuple[str, Any]]) -> Table:
    """A ``Key: value`` block, like ``scontrol show node``."""
    t = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 0))
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    for k, v in pairs:
        t.add_row(f"{k}:", v if isinstance(v, Text) else Text(str(v if v not in (None, "") else "-")))
    return t


def empty(what: str) -> None:
    sys.stderr.write(f"No {what} found.\n")
