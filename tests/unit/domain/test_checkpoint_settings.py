"""The checkpoint request's settings: off by default, checked at start-up, and which classes it asks.

A signal a job cannot catch, an unknown class or a Slurm backend that cannot signal stops the start
with a message naming the field; the default classes are every class not marked urgent.
"""

from __future__ import annotations

import pytest

from remediation.domain.causes import shipped
from remediation.domain.checkpoint import asks_checkpoint
from remediation.settings import SettingsError, WorkflowSettings, load_settings
from remediation.vocabulary import FAULT_CLASSES


def test_off_by_default() -> None:
    workflow = load_settings().workflow
    assert workflow.checkpoint_signal == "" and workflow.checkpoint_classes is None
    assert (workflow.checkpoint_scope, workflow.checkpoint_wait_s) == ("batch", 300)
    assert not any(asks_checkpoint(c, workflow) for c in FAULT_CLASSES)


@pytest.mark.parametrize(
    ("given", "kept"),
    [("USR1", "USR1"), ("SIGUSR2", "USR2"), (" term ", "TERM"), ("", "")],
    ids=["name", "sig-prefix", "case-and-space", "off"],
)
def test_signal_names_are_normalised(given: str, kept: str) -> None:
    assert load_settings(workflow={"checkpoint_signal": given}).workflow.checkpoint_signal == kept


@pytest.mark.parametrize(
    "bad",
    ["KILL", "SIGSTOP", "10", "USR1; reboot", "BOGUS"],
    ids=["kill", "stop", "number", "injection", "unknown"],
)
def test_a_signal_a_job_cannot_catch_stops_the_start(bad: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(workflow={"checkpoint_signal": bad})
    assert "workflow.checkpoint_signal" in str(err.value) and "USR1" in str(err.value)


def test_unknown_classes_and_scopes_stop_the_start() -> None:
    with pytest.raises(SettingsError, match="checkpoint_classes"):
        load_settings(workflow={"checkpoint_classes": ["gpu-memroy"]})
    with pytest.raises(SettingsError, match="checkpoint_scope"):
        load_settings(workflow={"checkpoint_scope": "steps"})


@pytest.mark.parametrize("backend", ["rest", "pyslurm"])
def test_a_slurm_backend_that_cannot_signal_stops_the_start(backend: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(slurm={"backend": backend}, workflow={"checkpoint_signal": "USR1"})
    assert f"slurm.backend {backend} cannot signal a job" in str(err.value)
    load_settings(slurm={"backend": backend})  # without a request, the backend is fine


def test_default_classes_are_every_class_not_marked_urgent() -> None:
    workflow = WorkflowSettings(checkpoint_signal="USR1")
    urgent = {name for name, info in shipped().classes.items() if info.urgent}
    assert urgent == {"gpu-memory", "gpu-hardware", "gpu-rma"}
    assert {c for c in FAULT_CLASSES if asks_checkpoint(c, workflow)} == set(FAULT_CLASSES) - urgent
    assert asks_checkpoint(None, workflow)  # no class yet: unknown, not urgent


def test_listed_classes_replace_the_default() -> None:
    workflow = WorkflowSettings(checkpoint_signal="USR1", checkpoint_classes=["gpu-memory"])
    assert [c for c in FAULT_CLASSES if asks_checkpoint(c, workflow)] == ["gpu-memory"]


def test_asking_pods_without_a_signal_stops_the_start() -> None:
    with pytest.raises(SettingsError, match="checkpoint_pods"):
        load_settings(workflow={"checkpoint_pods": True})
    assert load_settings(workflow={"checkpoint_pods": True, "checkpoint_signal": "USR1"}).workflow.checkpoint_pods


def test_the_pods_wait_must_leave_room_for_the_eviction() -> None:
    with pytest.raises(SettingsError, match="evict_timeout_s"):
        load_settings(workflow={"checkpoint_pods": True, "checkpoint_signal": "USR1", "checkpoint_wait_s": 900})
