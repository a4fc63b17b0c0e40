"""Run the reliability and operator-trust suite and print its table.

    .venv/bin/python -m bench.reliability [--full] [pytest args...]

Runs ``tests/reliability`` and the API's schemathesis run (``tests/integration/test_api_schemathesis.py``)
against the real servers, the same tests CI runs (at CI scale unless ``--full``), and prints the table
the suite's plugin (tests/scenario_table.py) built from what happened: runs and passed are the tests'
own outcomes, lost events are published events that Postgres does not hold, duplicate actions come from
the endpoints' request logs, and the fuzzing row counts the examples actually executed. A scenario whose
tests did not run has an empty row, and that fails the run, as does any failed test.

Under the table, the security section: the tests in :data:`SECURITY` try bad inputs (oversize bodies,
malformed, huge and forged events, long and odd node names, jobs and BMCs that pose as ours, secrets in
bad config) against the real API, stream, ingest, Slurm, BMC and start-up, and each says what its input
got and what was lost beside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SUITE = ["tests/reliability", "tests/integration/test_api_schemathesis.py"]
#: The tests that try bad inputs, for the security section: every kind of bad input is tried by one.
SECURITY = [
    "tests/integration/test_api_bodies.py",
    "tests/integration/test_bad_inputs.py",
    "tests/integration/test_settings_secrets.py",
    "tests/unit/domain/test_policy.py::test_node_names_are_matched_whole",
    "tests/unit/adapters/slurm/test_backend.py::test_bad_names_are_refused",
    "tests/unit/validation/test_rules.py::test_names_are_unique_whatever_the_input",
    "tests/integration/test_redis_acl.py::test_the_watchers_credential_reports_its_own_source_and_nothing_more",
    "tests/integration/slurm/test_slurm_validation.py::test_jobs_another_user_named_like_the_check_return_nothing",
    "tests/integration/redfish/test_redfish_bmc.py::test_an_annotation_never_sends_the_login_to_a_host_it_names",
]


def dash(value: object, fmt: str = "{}") -> str:
    return "-" if value is None else fmt.format(value)


def run(suite: list[str], args: list[str], full: bool, title: str) -> tuple[int, list[dict[str, Any]]]:
    """Run ``suite`` under pytest with the scenario plugin recording, print its table under ``title``,
    and return pytest's exit status and the rows."""
    with tempfile.TemporaryDirectory() as tmp:
        out, security_out = Path(tmp) / "figures.jsonl", Path(tmp) / "security.json"
        env = {
            **os.environ,
            "REMEDIATION_RELIABILITY_OUT": str(out),
            "REMEDIATION_SECURITY_OUT": str(security_out),
            "REMEDIATION_RELIABILITY_SCALE": "full" if full else "ci",
        }
        code = subprocess.call(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *suite, *args],
            cwd=ROOT,
            env=env,
            stdout=sys.stderr,
        )
        rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
        security = json.loads(security_out.read_text()) if security_out.exists() else None
    head = (
        f"{'scenario':<46} {'runs':>5} {'passed':>6} {'lost events':>11} {'dup. actions':>12} "
        f"{'recovery':>9} {'examples':>8}  policy"
    )
    print(f"{title} ({'full' if full else 'CI'} scale)\n\n" + head + "\n" + "-" * len(head))
    for r in rows:
        print(
            f"{r['scenario']:<46} {r['runs']:>5} {r['passed']:>6} {dash(r['lost_events']):>11} "
            f"{dash(r['duplicate_actions']):>12} {dash(r['recovery_s'], '{:.2f}s'):>9} "
            f"{r['examples'] or '-':>8}  {'+'.join(r.get('policies') or ['-'])}"
        )
        for note in r["notes"]:
            print(f"    {note}")
        for problem in r["problems"]:
            print(f"    FAILED: {problem}")
    if security is not None:
        print("\nsecurity: bad inputs tried, what each got, and what was lost beside it\n")
        print("\n".join(security["lines"]))
        print("FAILED: " + "; ".join(security["problems"]) if security["problems"] else "nothing lost")
    if not rows:
        print("no rows: the suite did not run")
        return code or 1, rows
    print(
        f"\nruns and passed are pytest's outcomes; '-' = not measured by that scenario; pytest exit status {code}"
    )
    return code, rows


def main() -> int:
    args = sys.argv[1:]
    full = "--full" in args
    return run(SUITE + SECURITY, [a for a in args if a != "--full"], full, "Reliability suite")[0]


if __name__ == "__main__":
    sys.exit(main())
