"""Cause classification on real message formats: Slurm reasons as researchers type them, kernel
``NVRM: Xid`` lines, and Kubernetes conditions as NVSentinel, node-problem-detector, GKE, AKS and EKS
set them; the per-class ladders and the site's overrides."""

from __future__ import annotations

import pytest

from remediation.domain.causes import (
    action_at,
    classify,
    first_action,
    ladder,
    shipped,
    table,
    to_vm_action,
    vm_rungs,
    xids_in,
)
from remediation.ports.cluster import VMAction
from remediation.settings import FaultSettings, Settings, SettingsError, load_settings
from remediation.vocabulary import FAULT_CLASSES

T = shipped()

SLURM_REASONS = [
    # (reason as typed with `scontrol update nodename=X state=fail reason=...`, class, xid)
    ("xid 79", "gpu-hardware", 79),
    ("Xid 48", "gpu-memory", 48),
    ("XID79 on GPU 3, job 881234 died", "gpu-hardware", 79),
    ("xid=48 gpu2 -- bob", "gpu-memory", 48),
    ("xid: 74 nvlink errors", "nvlink", 74),
    ("GPU3 xid#119 GSP timeout", "gpu-transient", 119),
    ("xids 13 and 79 seen", "gpu-hardware", 79),  # the worse of two codes wins
    ("double-bit ECC on gpu5", "gpu-memory", None),
    ("uncorrectable ECC errors, row remap pending", "gpu-memory", None),
    ("GPU fell off the bus", "gpu-hardware", None),
    ("nvlink down between gpu0 and gpu1", "nvlink", None),
    ("IB port down mlx5_3", "ib-link", None),
    ("leaf switch sw-a3 replaced, cables reseated", "fabric", None),
    ("kernel panic after upgrade", "host", None),
    ("Not responding", "host", None),
    ("nvidia driver hang, nvidia-smi stuck", "software", None),
    ("gpu slow", "gpu-transient", None),
    ("weird, please look", "unknown", None),
]


@pytest.mark.parametrize(("reason", "cls", "xid"), SLURM_REASONS, ids=[r[0] for r in SLURM_REASONS])
def test_slurm_reasons_as_researchers_type_them(reason: str, cls: str, xid: int | None) -> None:
    cause = classify("slurm", "FAIL", reason, T)
    assert (cause.fault_class, cause.xid) == (cls, xid), cause.evidence


KERNEL_LINES = [
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.", 79, "gpu-hardware"),
    ("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to "
     "activate.", 63, "gpu-memory"),
    ("kernel: NVRM: Xid (PCI:0000:86:00.0): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit "
     "error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.", 48, "gpu-memory"),
    ("NVRM: Xid (PCI:0000:07:00): 74, pid=4521, name=pt_main_thread, NVLink: fatal error detected on link 3",
     74, "nvlink"),
    ("NVRM: Xid (PCI:0000:01:00): 13, pid=2207, name=train.py, Graphics SM Warp Exception on (GPC 0, TPC 1)",
     13, "software"),
]


@pytest.mark.parametrize(("line", "xid", "cls"), KERNEL_LINES, ids=[str(k[1]) for k in KERNEL_LINES])
def test_kernel_nvrm_xid_lines(line: str, xid: int, cls: str) -> None:
    cause = classify("slurm", "DRAIN", line, T)
    assert cause.xid == xid
    assert cause.fault_class == cls
    assert xids_in(line) == [xid]  # the PCI address, the pid and the link are never taken for codes


def test_application_level_xids_are_marked_with_the_class_a_repeat_gets() -> None:
    for code in (13, 31, 43, 45):
        cause = classify("slurm", "FAIL", f"xid {code}", T)
        assert cause.app_level, code
        assert cause.repeat_class == cause.fault_class == "software"
    contained = classify("slurm", "FAIL", "xid 94 contained ECC error", T)
    assert contained.app_level and contained.repeat_class == "gpu-memory"
    assert not classify("slurm", "FAIL", "xid 48", T).app_level


CONDITIONS = [
    # (Type=Status, message as the watcher passes it on, class): each tool's real condition names
    ("SysLogsXIDError=True", "ErrorCode:79 PCI:0000:3b:00 GPU_UUID:GPU-1a2b Recommended Action=RESTART_BM;",
     "gpu-hardware"),                                                         # NVSentinel syslog monitor
    ("SysLogsSXIDError=True", "SXID 12028 NVSwitch fatal", "nvlink"),
    ("GpuMemWatch=True", "GPU 3 DBE", "gpu-memory"),                          # NVSentinel, DCGM watches
    ("GpuNvlinkWatch=True", "", "nvlink"),
    ("GpuPcieWatch=True", "", "gpu-hardware"),
    ("KernelDeadlock=True", "task docker:7 blocked for more than 120 seconds", "host"),  # node-problem-detector
    ("ReadonlyFilesystem=True", "Remounting filesystem read-only", "software"),
    ("FrequentContainerdRestart=True", "", "software"),
    ("XIDErrors=True", "XID 48 found in kernel log", "gpu-memory"),           # AKS
    ("GPUMissing=True", "observed 7 GPUs, expected 8", "gpu-hardware"),
    ("NVLinkStatusInactive=True", "", "nvlink"),
    ("IBLinkFlapping=True", "", "ib-link"),
    ("AcceleratedHardwareReady=False", "NvidiaXID79Error", "gpu-hardware"),   # EKS node monitoring agent
    ("AcceleratedHardwareReady=False", "NvidiaXID48Error", "gpu-memory"),
    ("KernelReady=False", "", "host"),
    ("NetworkingReady=False", "", "host"),
    ("StorageReady=False", "", "software"),
    ("Ready=Unknown", "Kubelet stopped posting node status.", "host"),        # not "software" for "kubelet"
    ("GpuXidError=True", "NVRM: Xid (PCI:0000:3b:00): 48, pid=99", "gpu-memory"),
]


@pytest.mark.parametrize(("state", "message", "cls"), CONDITIONS, ids=[f"{c[0]}:{c[2]}" for c in CONDITIONS])
def test_kubernetes_conditions_from_each_source(state: str, message: str, cls: str) -> None:
    # The Kubernetes watcher passes the message on as "Node <name>: <message>" (watchers/kube_mapping.py).
    cause = classify("kubernetes", state, f"Node gke-a3-pool-7: {message or state}", T)
    assert cause.fault_class == cls, cause.evidence


def test_error_code_is_read_only_on_xid_conditions() -> None:
    assert classify("kubernetes", "SysLogsXIDError=True", "Node n: ErrorCode:48", T).xid == 48
    assert classify("kubernetes", "KernelDeadlock=True", "Node n: ErrorCode:48", T).xid is None


def test_a_slurm_state_without_a_reason_is_the_host() -> None:
    assert classify("slurm", "DOWN", "", T).fault_class == "host"
    assert classify("slurm", "IDLE+NOT_RESPONDING", "", T).fault_class == "host"
    assert classify("slurm", "FAIL", "", T).fault_class == "unknown"


def test_every_shipped_class_has_a_ladder_and_unknown_keeps_the_sites() -> None:
    cfg = Settings(policy={"faults": {"classify": True}}, workflow={"ladder": ["restart", "redeploy"]})
    assert set(T.classes) == set(FAULT_CLASSES)
    on = (cfg.policy.faults, cfg.workflow)
    assert ladder("unknown", *on) == ("restart", "redeploy")
    assert ladder(None, *on) == ("restart", "redeploy")
    assert first_action("gpu-memory", *on) == "move-host"
    assert vm_rungs("fabric", *on) == () and first_action("fabric", *on) == "hold"
    assert action_at("gpu-transient", *on, 0) == "restart"
    assert action_at("gpu-transient", *on, 1) == "move-host"
    assert action_at("gpu-transient", *on, 2) == "quarantine"
    off = Settings(policy={"faults": {"classify": False}}, workflow={"ladder": ["restart", "reimage"]})
    assert ladder("gpu-memory", off.policy.faults, off.workflow) == ("restart", "reimage")


@pytest.mark.parametrize(("provider", "want"), [("gce", VMAction.STOP_START), ("aws", VMAction.STOP_START),
                                                 ("azure", VMAction.REDEPLOY), ("memory", VMAction.STOP_START)])
def test_move_host_is_each_clouds_way_to_new_hardware(provider: str, want: VMAction) -> None:
    assert to_vm_action("move-host", provider) is want
    assert to_vm_action("restart", provider) is VMAction.RESTART


def test_site_overrides_merge_over_the_shipped_table() -> None:
    faults = FaultSettings(ladders={"gpu-memory": ["restart", "quarantine"]}, xids={13: "gpu-transient"},
                           conditions={"MyGpuCheck": "gpu-hardware"})
    t = table(faults)
    assert t.classes["gpu-memory"].ladder == ("restart", "quarantine")
    assert classify("slurm", "FAIL", "xid 13", t).fault_class == "gpu-transient"
    assert not classify("slurm", "FAIL", "xid 13", t).app_level
    assert classify("kubernetes", "MyGpuCheck=True", "Node n: bad", t).fault_class == "gpu-hardware"
    assert shipped().classes["gpu-memory"].ladder == ("move-host", "quarantine")  # the shipped one is untouched


def test_the_hold_rung_is_still_read_under_its_old_name() -> None:
    """``none`` was the hold rung's name; a site's ladder that still says it loads as ``hold``."""
    faults = load_settings(policy={"faults": {"ladders": {"fabric": ["none"], "host": ["hold"]}}}).policy.faults
    assert faults.ladders == {"fabric": ["hold"], "host": ["hold"]}
    assert table(faults).classes["fabric"].ladder == ("hold",)


@pytest.mark.parametrize(("faults", "fragment"), [
    ({"ladders": {"gpu-memory": ["restart", "hold"]}}, "must be the only action"),
    ({"ladders": {"gpu-memory": ["restart", "none"]}}, "'hold' holds for a human"),
    ({"ladders": {"gpu-memory": ["quarantine", "restart"]}}, "can only be last"),
    ({"ladders": {"gpu-memroy": ["restart"]}}, "unknown fault class 'gpu-memroy'"),
    ({"ladders": {"host": ["reboot"]}}, "unknown action"),
    ({"xids": {48: "memory"}}, "unknown fault class 'memory'"),
], ids=["hold-not-alone", "old-name-not-alone", "quarantine-not-last", "class-typo", "action-typo", "xid-class-typo"])
def test_bad_overrides_fail_at_start_up_naming_the_field(faults: dict[str, object], fragment: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(policy={"faults": faults})
    assert "policy.faults" in str(err.value) and fragment in str(err.value)


def test_the_shipped_table_cites_its_sources() -> None:
    from importlib import resources

    import yaml

    raw = yaml.safe_load(resources.files("remediation").joinpath("data/causes.yaml").read_text())
    assert raw["sources"]["nvidia_xid_catalog"].startswith("https://docs.nvidia.com/")
    assert all(c["source"] in raw["sources"] or c["source"] in ("kubernetes", "this project")
               for c in raw["conditions"].values())
    assert T.xids[48].nvidia == "WORKFLOW_XID_48" and T.xids[79].nvidia == "RESTART_BM"


def test_naive_ladder_policy_turns_fault_intelligence_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "deploy/policies/naive-ladder.yaml"
    for key in ("REMEDIATION_POLICY__FAULTS__CLASSIFY", "REMEDIATION_POLICY__LEMON__ENABLED"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("REMEDIATION_CONFIG", str(path))
    cfg = load_settings()
    assert not cfg.policy.faults.classify and not cfg.policy.lemon.enabled
    assert ladder("gpu-memory", cfg.policy.faults, cfg.workflow) == ("restart", "reimage")
    monkeypatch.delenv("REMEDIATION_CONFIG")
    shipped_cfg = load_settings()
    assert shipped_cfg.policy.faults.classify and shipped_cfg.policy.lemon.enabled  # the shipped defaults
