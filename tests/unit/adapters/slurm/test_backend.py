"""Slurm backend selection and the parts of the backends that need no slurmctld.

The v0.0.39 write path of slurmrestd cannot run against Slurm 22.05 (which has only v0.0.38), so its
request shape is checked here at our own HTTP boundary; reads and the v0.0.38 refusal are tested
against the real slurmrestd in tests/integration/slurm.
"""

from __future__ import annotations

import json

import httpx
import pytest

from remediation.adapters.factory import slurm_backend
from remediation.adapters.slurm.args import InvalidSlurmArgument, check_node_name, check_reason
from remediation.adapters.slurm.backend import close_slurm, make_slurm
from remediation.adapters.slurm.cli import CliSlurm
from remediation.adapters.slurm.pyslurm_backend import PyslurmUnavailable, load_pyslurm
from remediation.adapters.slurm.rest import RestSlurm
from remediation.ports.errors import ConfigError, PermanentError, TransientError, UnknownNode
from remediation.settings import SlurmSettings, load_settings
from tests.scenario_table import NODE_NAME, BadInputs


def test_factory_picks_the_configured_backend(tmp_path: object) -> None:
    assert isinstance(make_slurm(load_settings(slurm={"backend": "cli"})), CliSlurm)
    rest = make_slurm(load_settings(slurm={"backend": "rest", "rest_url": "unix:/nonexistent.sock"}))
    assert isinstance(rest, RestSlurm)
    # The simulated and no-op backends come from the one adapter factory, not from make_slurm.
    assert type(slurm_backend(load_settings(dry_run=True, slurm={"backend": "noop"}))).__name__ == "NoopSlurm"
    assert type(slurm_backend(load_settings(slurm={"backend": "memory"}))).__name__ == "MemorySlurm"
    assert isinstance(slurm_backend(load_settings(slurm={"backend": "cli"})), CliSlurm)
    with pytest.raises(ValueError, match="not a real Slurm backend"):
        make_slurm(load_settings(dry_run=True, slurm={"backend": "noop"}))


def test_the_rest_backend_closes_its_connection_pool_when_done() -> None:
    rest_only = {"backend": "rest", "rest_url": "unix:/nonexistent.sock"}
    with RestSlurm(SlurmSettings(**rest_only)) as rest:
        assert not rest.client.is_closed
    assert rest.client.is_closed
    built = make_slurm(load_settings(slurm=rest_only))
    close_slurm(built)
    assert isinstance(built, RestSlurm) and built.client.is_closed
    close_slurm(make_slurm(load_settings(slurm={"backend": "cli"})))  # the commands hold nothing to close


def test_pyslurm_backend_without_pyslurm_is_a_clear_startup_error() -> None:
    try:
        import pyslurm  # noqa: F401
    except ImportError:
        pass
    else:  # pragma: no cover - only where pyslurm matches the installed Slurm
        pytest.skip("pyslurm is importable here; tests/integration/slurm/test_slurm_pyslurm.py covers it")
    with pytest.raises(PyslurmUnavailable, match="pyslurm is not installed / does not match this Slurm"):
        make_slurm(load_settings(slurm={"backend": "pyslurm"}))
    with pytest.raises(PermanentError):
        load_pyslurm()


def test_rest_backend_needs_a_url() -> None:
    with pytest.raises(ConfigError, match="rest_url"):
        RestSlurm(SlurmSettings(backend="rest"))
    with pytest.raises(ConfigError, match="rest_api_version"):
        RestSlurm(SlurmSettings(backend="rest", rest_url="http://x", rest_api_version="latest"))


def test_rest_v0_0_39_writes_post_the_node_update_with_jwt_headers() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/node/gpu-node-9"):
            return httpx.Response(500, json={"errors": [{"error": "Invalid node name specified"}]})
        if request.url.path.endswith("/node/gpu-node-5") and request.method == "POST":
            return httpx.Response(503, headers={"Retry-After": "7"}, text="busy")
        return httpx.Response(200, json={"errors": []})

    settings = SlurmSettings(
        backend="rest",
        rest_url="https://slurmrestd:6820",
        rest_api_version="v0.0.39",
        rest_user="remediation",
        rest_token="jwt-secret",  # type: ignore[arg-type]
    )
    rest = RestSlurm(settings, transport=httpx.MockTransport(handler))
    rest.drain("gpu-node-1", 'remediation: "xid" $(x)')
    rest.set_state("gpu-node-2", "FAIL", "remediation: fail")
    rest.resume("gpu-node-3")
    bodies = [(r.method, r.url.path, json.loads(r.content)) for r in seen]
    assert bodies == [
        ("POST", "/slurm/v0.0.39/node/gpu-node-1", {"state": ["DRAIN"], "reason": 'remediation: "xid" $(x)'}),
        ("POST", "/slurm/v0.0.39/node/gpu-node-2", {"state": ["FAIL"], "reason": "remediation: fail"}),
        ("POST", "/slurm/v0.0.39/node/gpu-node-3", {"state": ["RESUME"]}),
    ]
    assert seen[0].headers["X-SLURM-USER-NAME"] == "remediation"
    assert seen[0].headers["X-SLURM-USER-TOKEN"] == "jwt-secret"
    with pytest.raises(UnknownNode, match="Invalid node name specified"):
        rest.drain("gpu-node-9", "remediation: x")
    with pytest.raises(TransientError) as info:
        rest.resume("gpu-node-5")
    assert info.value.retry_after == 7.0 and info.value.status == 503
    with pytest.raises(InvalidSlurmArgument):
        rest.drain("../jobs", "remediation: x")
    assert len(seen) == 5  # the bad name never reached the wire


@pytest.mark.parametrize(
    "name", ["gpu-node-1", "n001", "a.b_c-d"], ids=["gpu", "padded", "punctuation"]
)
def test_plain_names_pass(name: str) -> None:
    assert check_node_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["ALL", "All", "n[1-2]", "a,b", "a b", "a\n", "", "-x", "a/b", "x" * 254, 7],
    ids=["ALL", "all-mixed", "hostlist", "comma", "space", "trailing-newline", "empty", "dash", "slash", "long", "int"],
)
def test_bad_names_are_refused(name: object, bad_inputs: BadInputs) -> None:
    with pytest.raises(InvalidSlurmArgument) as refused:
        check_node_name(name)
    bad_inputs.tried(NODE_NAME, f"Slurm command argument {name!r:.40}", f"refused before any command ran ({refused.value})"[:160], lost=None)


def test_reasons() -> None:
    assert check_reason("remediation: ünïcode $(x) `y`") == "remediation: ünïcode $(x) `y`"
    for bad in ["", " ", "a\nb", "a\x00", "a\x7f", "a" * 1025, None]:
        with pytest.raises(InvalidSlurmArgument):
            check_reason(bad)


@pytest.mark.parametrize(
    ("pyslurm_version", "slurm", "ok"),
    [("25.11.0", (25, 11, 1), True), ("25.11.0", (24, 11, 5), False), ("25.11.0", (22, 5, 8), False),
     ("24.11.2", (24, 11, 5), True), ("23.2.0", (23, 2, 7), True)],
)
def test_pyslurm_is_refused_for_a_slurm_it_is_not_built_for(
    pyslurm_version: str, slurm: tuple[int, int, int], ok: bool
) -> None:
    from remediation.adapters.slurm.pyslurm_backend import check_release

    if ok:
        check_release(pyslurm_version, slurm)
        return
    with pytest.raises(PyslurmUnavailable, match="untested: no matching Slurm could be installed"):
        check_release(pyslurm_version, slurm)


def test_slurm_versions_and_libslurm_abis() -> None:
    from remediation.adapters.slurm.cli import parse_version
    from remediation.adapters.slurm.probe import matches

    assert parse_version("slurm 22.05.8\n") == (22, 5, 8)
    assert parse_version("slurm-wlm 24.11.5\n") == (24, 11, 5)
    assert matches(38, (22, 5, 8)) and not matches(38, (24, 11, 5)) and matches(42, (24, 11, 5))
    assert matches(45, (26, 5, 5)) and not matches(38, (26, 5, 5))  # 26.05: libslurm45
    assert not matches(50, (30, 5, 0))  # a release we have no table entry for: refused, the poll runs sinfo
