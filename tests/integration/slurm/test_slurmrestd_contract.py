"""The slurmrestd stand-in (simulator/slurmrestd.py) answers as the real slurmrestd does.

The same requests go to the real slurmrestd of each Slurm release under test (22.05: v0.0.38; 24.11:
v0.0.40, v0.0.41, v0.0.42; 26.05: v0.0.42 to v0.0.45) and to the stand-in over a node table of the same names; every answer is
compared as the rest backend reads it: HTTP status, ``errors[]`` (error, errno, description) and each
node's base state, flags and reason. Left out of the comparison, and why:

- NOT_RESPONDING right after a resume: the real slurmctld shows it until its next ping, a matter of
  timing the stand-in models with its own clock;
- the reason of a node in service: 24.11 keeps the last reason after a resume, 22.05 clears it; nobody
  reads a reason without DRAIN, DOWN or FAIL;
- bodies of plain-text answers (404) beyond their first words, and everything in ``meta``;
- jobs that have ended (slurmctld keeps them for MinJobAge; the backend reads only active ones).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from remediation.simulator.slurmctld import SlurmCtld
from remediation.simulator.slurmrestd import SlurmRestd
from tests.integration.slurm.conftest import SlurmCluster

pytestmark = pytest.mark.slurm

BAD = {"DRAIN", "DOWN", "FAIL"}


def requests(api: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    nodes, node = f"/slurm/{api}/nodes", f"/slurm/{api}/node"
    reads: list[tuple[str, str, dict[str, Any] | None]] = [
        ("GET", nodes, None),
        ("GET", f"{node}/gpu-node-1", None),
        ("GET", f"{node}/gpu-node-99", None),
        ("GET", "/slurm/v0.0.1/nodes", None),
        ("GET", f"/slurm/{api}/jobs", None),
    ]
    if api == "v0.0.38":
        return reads
    return [
        *reads,
        ("POST", f"{node}/gpu-node-1", {"state": ["DRAIN"], "reason": "remediation: contract"}),
        ("GET", f"{node}/gpu-node-1", None),
        ("POST", f"{node}/gpu-node-1", {"state": ["DRAIN"], "reason": "remediation: contract"}),
        ("POST", f"{node}/gpu-node-2", {"state": ["FAIL"], "reason": "xid 79"}),
        ("POST", f"{node}/gpu-node-3", {"state": ["DOWN"], "reason": "remediation: down"}),
        ("GET", nodes, None),
        ("POST", f"{node}/gpu-node-1", {"state": ["RESUME"]}),
        ("POST", f"{node}/gpu-node-2", {"state": ["RESUME"]}),
        ("POST", f"{node}/gpu-node-0", {"state": ["RESUME"]}),  # already in service: refused, 2028
        ("POST", f"{node}/gpu-node-99", {"state": ["DRAIN"], "reason": "remediation: nowhere"}),  # 2018
        ("GET", f"{node}/gpu-node-2", None),
        ("GET", f"{node}/gpu-node-1", None),
    ]


def answer(response: httpx.Response) -> dict[str, Any]:
    """What the rest backend reads from one answer."""
    out: dict[str, Any] = {"status": response.status_code}
    if "json" not in response.headers.get("content-type", ""):
        out["text"] = " ".join(response.text.split()[:3])
        return out
    body = response.json()
    out["errors"] = sorted(
        (str(e.get("error")), e.get("error_number", e.get("errno")), str(e.get("description", "")))
        for e in body.get("errors") or []
    )
    if "nodes" in body:
        out["nodes"] = {n["name"]: node_view(n) for n in body["nodes"]}
    if "jobs" in body:  # only jobs that still hold a node: ended ones linger in slurmctld for MinJobAge
        out["jobs"] = sorted(str(j.get("job_id")) for j in body["jobs"] if active(j.get("job_state")))
    return out


def active(state: Any) -> bool:
    states = set(state) if isinstance(state, list) else {state}
    return bool(states & {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED"})


def node_view(node: dict[str, Any]) -> tuple[frozenset[str], str]:
    state = node["state"]
    if isinstance(state, str):  # v0.0.38
        states = {state.upper(), *(f.upper() for f in node.get("state_flags") or [])}
    else:
        states = {s.upper() for s in state}
    states.discard("NOT_RESPONDING")
    return frozenset(states), node.get("reason", "") if states & BAD else ""


@pytest.fixture
def stand_in(slurm: SlurmCluster) -> Iterator[SlurmRestd]:
    with SlurmRestd(SlurmCtld(slurm.nodes), release=slurm.release) as server:
        yield server  # type: ignore[misc]


def test_the_stand_in_answers_as_the_real_slurmrestd(
    slurm: SlurmCluster, rest_api: str, stand_in: SlurmRestd
) -> None:
    real = httpx.Client(base_url="http://slurmrestd", headers=slurm.rest_headers,
                        transport=httpx.HTTPTransport(uds=str(slurm.rest_socket)))
    fake = httpx.Client(base_url=stand_in.url)
    with real, fake:
        for method, path, body in requests(rest_api):
            content = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if body is not None else {}
            got_real = answer(real.request(method, path, content=content, headers=headers))
            got_fake = answer(fake.request(method, path, content=content, headers=headers))
            assert got_fake == got_real, f"{method} {path} {body}: stand-in {got_fake} != real {got_real}"
