"""Charts as inline SVG, drawn on the server: the same markup in the dashboard, the HTML report and its PDF.

:func:`stacked_days` (faults per day, stacked by cause class) and :func:`hbars` (one bar per group). Every
text is escaped; every bar has a ``<title>`` with its exact figure.

Why: docs/running.md#the-api-and-the-dashboard
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import date
from html import escape

from markupsafe import Markup

#: Colour-blind-safe palette (Okabe and Ito), one colour per cause class in order of appearance.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
_FONT = 'font-family="system-ui, sans-serif" font-size="11"'


def colour(classes: Sequence[str], cls: str) -> str:
    return PALETTE[classes.index(cls) % len(PALETTE)] if cls in classes else "#999999"


def stacked_days(
    daily: Sequence[tuple[date, dict[str, int]]],
    classes: Sequence[str],
    *,
    width: int = 720,
    height: int = 200,
    label: str = "faults per day",
) -> Markup:
    """A bar per day, stacked by class; the y axis is labelled at its maximum."""
    top = max((sum(c.values()) for _, c in daily), default=0) or 1
    left, bottom, legend_h = 34, 18, 16 * ((len(classes) + 3) // 4)
    plot_h = height - bottom - 8
    step = (width - left) / max(len(daily), 1)
    bar = max(step * 0.8, 1.0)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height + legend_h}" '
        f'viewBox="0 0 {width} {height + legend_h}" class="chart" {_FONT}><title>{escape(label)}</title>',
        f'<line x1="{left}" y1="8" x2="{left}" y2="{8 + plot_h}" stroke="#888"/>',
        f'<line x1="{left}" y1="{8 + plot_h}" x2="{width}" y2="{8 + plot_h}" stroke="#888"/>',
        f'<text x="{left - 4}" y="14" text-anchor="end">{top}</text>',
        f'<text x="{left - 4}" y="{8 + plot_h}" text-anchor="end">0</text>',
    ]
    for i, (day, counts) in enumerate(daily):
        x, y = left + i * step + (step - bar) / 2, float(8 + plot_h)
        for cls in classes:
            n = counts.get(cls, 0)
            if not n:
                continue
            h = plot_h * n / top
            y -= h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{colour(classes, cls)}"><title>{day.isoformat()}: {n} {escape(cls)}</title></rect>'
            )
        if len(daily) <= 16 or i % max(len(daily) // 8, 1) == 0:
            parts.append(
                f'<text x="{x + bar / 2:.1f}" y="{height - 4}" text-anchor="middle">{day:%m-%d}</text>'
            )
    for j, cls in enumerate(classes):
        lx, ly = left + (j % 4) * 170, height + 4 + 16 * (j // 4)
        parts.append(
            f'<rect x="{lx}" y="{ly}" width="10" height="10" fill="{colour(classes, cls)}"/>'
            f'<text x="{lx + 14}" y="{ly + 9}">{escape(cls)}</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def hbars(
    rows: Sequence[tuple[str, float | None]],
    *,
    unit: str = "",
    label: str = "",
    width: int = 360,
    digits: int = 0,
    fmt: Callable[[float], str] | None = None,
) -> Markup:
    """One horizontal bar per (name, value); a None value is drawn as "-" with no bar."""
    line, name_w, value_w = 18, 120, 64
    top = max((v for _, v in rows if v is not None), default=0.0) or 1.0
    height = line * max(len(rows), 1) + 4
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" class="chart" {_FONT}><title>{escape(label)}</title>'
    ]
    span = width - name_w - value_w
    for i, (name, value) in enumerate(rows):
        y = 2 + i * line
        text = "-" if value is None else fmt(value) if fmt else f"{value:,.{digits}f}{unit}"
        parts.append(f'<text x="{name_w - 6}" y="{y + 12}" text-anchor="end">{escape(name[:22])}</text>')
        if value is not None:
            w = span * value / top
            parts.append(
                f'<rect x="{name_w}" y="{y + 2}" width="{w:.1f}" height="{line - 6}" fill="{PALETTE[0]}">'
                f"<title>{escape(name)}: {text}</title></rect>"
            )
        parts.append(f'<text x="{name_w + span + 4}" y="{y + 12}">{escape(text)}</text>')
    if not rows:
        parts.append(f'<text x="{name_w}" y="14">no data</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
