"""``remediation reliability --since 30d -o html|pdf|csv``: the reliability report as a file.

HTML is one self-contained page, PDF that page printed by headless Chromium
(:mod:`remediation.adapters.pdf`), CSV the long form. Read from the database
(:mod:`remediation.services.reliability`), never through ``--server``.

Why: docs/running.md#the-cli
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from pathlib import Path

import typer

from remediation.adapters.pdf import PdfError, html_to_pdf
from remediation.cli.context import EXIT_CONFIG, EXIT_REQUEST, CliError, cli_errors, state
from remediation.reports import reliability as report


@cli_errors
def reliability_cmd(
    ctx: typer.Context,
    since: str = typer.Option("30d", "--since", help="Window back from its end: 7d, 30d, 12h, 2w."),
    until: str | None = typer.Option(
        None,
        "--until",
        help="End of the window, an ISO time (UTC unless it "
        "says otherwise), e.g. the day after an incident; default now.",
    ),
    output: str = typer.Option("html", "--output", "-o", help="html, pdf or csv."),
    file: Path | None = typer.Option(
        None,
        "--file",
        "-f",
        help="Where to write it (default: reliability-YYYYMMDD.EXT here; '-' prints HTML or CSV to stdout).",
    ),
    by: str | None = typer.Option(
        None,
        "--by",
        help="Groupings, comma-separated: pool, rack, zone, sku "
        "(default: all), node, or any failure-domain kind.",
    ),
    browser: str | None = typer.Option(
        None, "--browser", help="The Chromium to print the PDF with (default: chromium on PATH)."
    ),
    cluster: str | None = typer.Option(
        None, "--cluster", help="One cluster's figures only (default: all; over several clusters the report "
        "gives each cluster's figures and the fleet's, and names a node cluster/name)."
    ),
) -> None:
    """The reliability report: faults per day by cause class, time to repair, node-hours out of service,
    MTBF per pool, rack, zone, SKU, node and hardware, hardware moves, GPUs failing under two names,
    hardware that failed in another cluster, the top lemons; per cluster and for the fleet."""
    st = state(ctx)
    if output not in report.FORMATS:
        raise CliError(f"-o {output}: choose one of {', '.join(report.FORMATS)}", EXIT_CONFIG)
    if st.server is not None:
        raise CliError(
            "report reads the database directly: run it where the database is reachable, "
            "without --server (the dashboard's Reliability page serves HTML and CSV)",
            EXIT_CONFIG,
        )
    now = st.now()
    try:
        start, end = report.window(since, now, until)
        dims = report.dimensions(by)
        only = report.cluster_filter(cluster)
    except report.ReportError as exc:
        raise CliError(str(exc), EXIT_CONFIG) from None
    if output == "pdf" and str(file) == "-":
        raise CliError("a PDF is written to a file: pass --file PATH", EXIT_CONFIG)
    with _collector_paused():
        with st.sessions()() as s:
            rep = report.build(s, start, end, lemon=st.settings().policy.lemon, by=dims, cluster=only)
        text = report.to_csv(rep) if output == "csv" else report.standalone_html(rep, now)
    target = file or Path(f"reliability-{now:%Y%m%d}.{output}")
    if _write(text, target, fmt=output, browser=browser):
        typer.echo(f"wrote {target} ({output}, {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC)", err=True)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cycle collector while the report is built: at fleet scale its full passes over the
    report's objects, which reference counting frees, were a third of the command's time
    (docs/benchmarks.md). The command exits right after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _write(text: str, target: Path, *, fmt: str, browser: str | None) -> bool:
    """Write the report to ``target``, a PDF as ``browser`` prints it; '-' prints it to stdout instead.
    True when a file was written."""
    if fmt == "pdf":
        try:
            html_to_pdf(text, target, browser)
        except PdfError as exc:
            raise CliError(str(exc), EXIT_REQUEST) from None
    elif str(target) == "-":
        typer.echo(text, nl=False)
        return False
    else:
        target.write_text(text, encoding="utf-8")
    return True
