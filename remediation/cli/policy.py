"""``remediation policy show [PROFILE]`` and ``remediation policy explain NODE``: which policy governs which
nodes, and why, with each field's value and the layer that set it
(:mod:`remediation.services.policy_views`; the API with ``--server``).

Why: docs/policy.md#profiles-policy-per-node-group
"""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.table import Table

from remediation.cli import render as r
from remediation.cli.backend import backend
from remediation.cli.context import CLUSTER, cli_errors, state

app = typer.Typer(
    help="Policy per node group: the profiles, and which governs a node and why.", no_args_is_help=True
)
OUTPUT = typer.Option("table", "-o", "--output", help="Output format: table, wide or json.")


@app.command("show")
@cli_errors
def policy_show(
    ctx: typer.Context,
    profile: str = typer.Argument(None, help="One profile, field by field."),
    output: str = OUTPUT, *, cluster: str | None = CLUSTER,
) -> None:
    """The profiles in order, what each selects and overrides, and the nodes each governs."""
    fmt = r.check_format(output)
    found = backend(state(ctx, cluster)).policy_show(profile)
    if fmt == "json":
        return r.print_json(found)
    rows = [
        [
            p["name"],
            p["mode"],
            _select(p["select"]),
            str(p["nodes"]) + (" (governs no known node)" if p["wins_no_node"] else ""),
            _overrides(p["overrides"])
            if fmt == "wide"
            else ", ".join(f"{s}.{k}" for s, o in p["overrides"].items() for k in o) or "-",
        ]
        for p in found["profiles"]
    ]
    rows.append(["(base)", "act", "every other node", str(found["base_nodes"]), "-"])
    r.show(r.table(["profile", "mode", "selects", "nodes", "overrides"], rows))
    for p in found["profiles"]:
        if p["wins_no_node"]:
            r.show(
                f"warning: profile {p['name']} governs none of the {found['known_nodes']} known nodes: an "
                "empty pool, a selector that matches nothing, or a profile above it that wins them"
            )
    if "fields" in found:
        r.show("")
        r.show(_fields(found["fields"]))


@app.command("explain")
@cli_errors
def policy_explain(
    ctx: typer.Context, node: str = typer.Argument(..., help="Slurm node name."), output: str = OUTPUT, *, cluster: str | None = CLUSTER) -> None:
    """Which profile governs NODE and why, and every field of its policy with the layer that set it."""
    fmt = r.check_format(output)
    found = backend(state(ctx, cluster)).policy_explain(node)
    if fmt == "json":
        return r.print_json(found)
    facts = found["facts"]
    labels = ", ".join(f"{k}={v}" for k, v in sorted(facts["labels"].items())) or "-"
    r.show(
        f"node {found['node']}: partitions {', '.join(facts['partitions']) or '-'}; features "
        f"{', '.join(facts['features']) or '-'}; labels {labels}"
    )
    r.show(f"profile: {found['profile'] or '(base)'}, mode {found['mode']}: {found['why']}")
    if (rem := found["open_remediation"]) is not None:
        r.show(
            f"open remediation #{rem['id']} runs under the policy it recorded when it opened: profile "
            f"{rem['profile'] or '(base)'}{', shadow (dry-run)' if rem['dry_run'] else ''}"
        )
    r.show("")
    r.show(_fields(found["fields"]))


def _fields(fields: list[dict[str, Any]]) -> Table:
    return r.table(
        ["field", "value", "set by"], [[f["field"], _value(f["value"]), f["layer"]] for f in fields]
    )


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _select(select: dict[str, Any]) -> str:
    return "; ".join(f"{k} {', '.join(v) if isinstance(v, list) else v}" for k, v in select.items())


def _overrides(overrides: dict[str, dict[str, Any]]) -> str:
    return ", ".join(f"{s}.{k}={_value(v)}" for s, o in overrides.items() for k, v in o.items()) or "-"
