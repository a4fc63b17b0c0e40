"""The dry-run validator: what it records of a check on one node and of one check across a domain."""

from __future__ import annotations

import pytest

from remediation.adapters.noop import NoopValidator
from remediation.validation.port import ValidationCheck

DOMAIN = ("gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3")


def test_a_check_across_a_domain_records_every_node_and_no_verdict() -> None:
    noop = NoopValidator()
    check = ValidationCheck("gpu-node-1", "nr-domain-r3-a1", ("srun", "all_reduce_perf"), 900,
                            purpose="run domain check", nodes=DOMAIN)
    ref = noop.start(check)
    [done] = noop.recorder.actions
    assert (done["would"], done["node"], done["nodes"]) == ("run domain check", "gpu-node-1", list(DOMAIN))
    assert ref["nodes"] == list(DOMAIN) and ref["dry_run"] is True
    result = noop.poll(ref)
    assert result.done and result.exit_code is None and not result.passed


def test_a_check_on_one_node_records_as_before() -> None:
    noop = NoopValidator()
    ref = noop.start(ValidationCheck("gpu-node-1", "nr-gate-r3-a1", ("dcgmi", "diag"), 600))
    [done] = noop.recorder.actions
    assert "nodes" not in done and "nodes" not in ref and done["would"] == "validate"


def test_a_node_named_twice_is_no_check() -> None:
    with pytest.raises(ValueError, match="named twice"):
        ValidationCheck("gpu-node-1", "n", ("x",), 1, nodes=("gpu-node-1", "gpu-node-1"))
    assert ValidationCheck("gpu-node-1", "n", ("x",), 1).targets == ("gpu-node-1",)
    assert ValidationCheck("gpu-node-1", "n", ("x",), 1, nodes=DOMAIN).targets == DOMAIN
