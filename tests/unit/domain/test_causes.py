"""Cause classification on real message formats: Slurm reasons as researchers type them, kernel
``NVRM: Xid`` lines, and Kubernetes conditions as NVSentinel, node-problem-detector, GKE, AKS and EKS
set them; the per-class ladders and the site's overrides."""

from __future__ import annotations

import pytest

from remediation.domain.causes import (
    action_at,
    action_rungs,
    classify,
    first_action,
    ladder,
    needs_rma,
    planned_action,
    shipped,
    table,
    to_machine_action,
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
    cause = classify("slurm", "FAIL", reason, tbl=T)
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
    cause = classify("slurm", "DRAIN", line, tbl=T)
    assert cause.xid == xid
    assert cause.fault_class == cls
    assert xids_in(line) == [xid]  # the PCI address, the pid and the link are never taken for codes


GPU_ADDRESSES = [
    # (signal text, the GPU address the reset takes; None: every GPU of the node)
    ("NVRM: Xid (PCI:0000:3b:00): 46, pid=1234, name=python3", "0000:3b:00"),
    ("kernel: NVRM: Xid (PCI:0000:86:00.0): 48, pid='<unknown>'", "0000:86:00"),  # the function is dropped
    ("NVRM: Xid (0000:3B:00): 46, Channel 00000001", "0000:3b:00"),  # no "PCI:", upper case
    ("ErrorCode:119 PCI:0000:3b:00 GPU_UUID:GPU-1a2b Recommended Action=RESET_GPU;", "0000:3b:00"),  # NVSentinel
    ("xid 46 on gpu3", None),  # a researcher's reason names no address
    ("NvidiaXID46Error", None),  # EKS neither
    ("NVRM: Xid (PCI:0000:3b:00): 46, pid=1\nNVRM: Xid (PCI:0000:5d:00): 46, pid=2", None),  # two GPUs
    ("NVRM: Xid (PCI:0000:3b:00): 13, pid=1\nNVRM: Xid (PCI:0000:5d:00): 79, pid=2", "0000:5d:00"),  # the worse
    ("NVRM: Xid (PCI:0000:3b:00): 13, pid=1; also xid 79", None),  # 79 came with no address
]


@pytest.mark.parametrize(("text", "pci"), GPU_ADDRESSES, ids=[str(i) for i in range(len(GPU_ADDRESSES))])
def test_the_xid_names_the_gpu_a_reset_takes(text: str, pci: str | None) -> None:
    assert classify("kubernetes", "SysLogsXIDError=True", f"Node n: {text}", tbl=T).gpu_pci == pci


def test_application_level_xids_are_marked_with_the_class_a_repeat_gets() -> None:
    for code in (13, 31, 43, 45):
        cause = classify("slurm", "FAIL", f"xid {code}", tbl=T)
        assert cause.app_level, code
        assert cause.repeat_class == cause.fault_class == "software"
    contained = classify("slurm", "FAIL", "xid 94 contained ECC error", tbl=T)
    assert contained.app_level and contained.repeat_class == "gpu-memory"
    assert not classify("slurm", "FAIL", "xid 48", tbl=T).app_level


CONDITIONS = [
    # (Type=Status, message as the watcher passes it on, class): each tool's real condition names
    ("SysLogsXIDError=True", "ErrorCode:79 PCI:0000:3b:00 GPU_UUID:GPU-1a2b Recommended Action=RESTART_BM;",
     "gpu-hardware"),                                                         # NVSentinel syslog monitor
    ("SysLogsSXIDError=True", "SXID 12028 NVSwitch fatal", "nvswitch"),
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
    # The Kubernetes watcher passes the message on as "Node <name>: <message>" (watchers/kube/mapping.py).
    cause = classify("kubernetes", state, f"Node gke-a3-pool-7: {message or state}", tbl=T)
    assert cause.fault_class == cls, cause.evidence


def test_error_code_is_read_only_on_xid_conditions() -> None:
    assert classify("kubernetes", "SysLogsXIDError=True", "Node n: ErrorCode:48", tbl=T).xid == 48
    assert classify("kubernetes", "KernelDeadlock=True", "Node n: ErrorCode:48", tbl=T).xid is None


def test_a_slurm_state_without_a_reason_is_the_host() -> None:
    assert classify("slurm", "DOWN", "", tbl=T).fault_class == "host"
    assert classify("slurm", "IDLE+NOT_RESPONDING", "", tbl=T).fault_class == "host"
    assert classify("slurm", "FAIL", "", tbl=T).fault_class == "unknown"


def test_every_shipped_class_has_a_ladder_and_unknown_keeps_the_sites() -> None:
    cfg = Settings(policy={"faults": {"classify": True}}, workflow={"ladder": ["restart", "redeploy"]})
    assert set(T.classes) == set(FAULT_CLASSES)
    on = (cfg.policy.faults, cfg.workflow)
    assert ladder("unknown", *on, gpu_reset=True) == ("restart", "redeploy")
    assert ladder(None, *on, gpu_reset=True) == ("restart", "redeploy")
    assert first_action("gpu-memory", *on, gpu_reset=False) == "move-host"
    assert action_rungs("fabric", *on, gpu_reset=True) == () and first_action("fabric", *on, gpu_reset=True) == "hold"
    assert action_at("gpu-transient", *on, rung=0, gpu_reset=False) == "restart"
    assert action_at("gpu-transient", *on, rung=1, gpu_reset=False) == "move-host"
    assert action_at("gpu-transient", *on, rung=2, gpu_reset=False) == "quarantine"
    off = Settings(policy={"faults": {"classify": False}}, workflow={"ladder": ["restart", "reimage"]})
    assert ladder("gpu-memory", off.policy.faults, off.workflow, gpu_reset=True) == ("restart", "reimage")


def test_a_gpu_reset_rung_is_left_out_where_no_job_can_run_on_a_node() -> None:
    cfg = Settings(policy={"faults": {"classify": True,
                                      "ladders": {"gpu-transient": ["gpu-reset", "restart", "quarantine"],
                                                  "nvlink": ["gpu-reset"]}}})
    on = (cfg.policy.faults, cfg.workflow)
    assert action_rungs("gpu-transient", *on, gpu_reset=True) == ("gpu-reset", "restart")
    assert action_at("gpu-transient", *on, rung=1, gpu_reset=True) == "restart"
    assert action_rungs("gpu-transient", *on, gpu_reset=False) == ("restart",)  # validation.backend none
    assert action_at("gpu-transient", *on, rung=0, gpu_reset=False) == "restart"
    # A ladder that was only a reset ends where every ladder ends.
    assert ladder("nvlink", *on, gpu_reset=False) == ("quarantine",)
    cause = classify("slurm", "FAIL", "xid 46", tbl=table(cfg.policy.faults))
    assert planned_action(cause, cfg.policy.faults, gpu_reset=True) == "gpu-reset"
    assert planned_action(cause, cfg.policy.faults, gpu_reset=False) == "restart"


@pytest.mark.parametrize(("provider", "want"), [("gce", VMAction.STOP_START), ("aws", VMAction.STOP_START),
                                                 ("azure", VMAction.REDEPLOY), ("memory", VMAction.STOP_START)])
def test_move_host_is_each_clouds_way_to_new_hardware(provider: str, want: VMAction) -> None:
    assert to_machine_action("move-host", provider) is want
    assert to_machine_action("restart", provider) is VMAction.RESTART


def test_site_overrides_merge_over_the_shipped_table() -> None:
    faults = FaultSettings(ladders={"gpu-memory": ["restart", "quarantine"]}, xids={13: "gpu-transient"},
                           conditions={"MyGpuCheck": "gpu-hardware"})
    t = table(faults)
    assert t.classes["gpu-memory"].ladder == ("restart", "quarantine")
    assert classify("slurm", "FAIL", "xid 13", tbl=t).fault_class == "gpu-transient"
    assert not classify("slurm", "FAIL", "xid 13", tbl=t).app_level
    assert classify("kubernetes", "MyGpuCheck=True", "Node n: bad", tbl=t).fault_class == "gpu-hardware"
    assert shipped().classes["gpu-memory"].ladder == ("gpu-reset", "move-host", "quarantine")  # untouched


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
    ({"ladders": {"gpu-transient": ["restart", "gpu-reset"]}}, "before any reboot"),
    ({"xids": {48: "memory"}}, "unknown fault class 'memory'"),
], ids=["hold-not-alone", "old-name-not-alone", "quarantine-not-last", "class-typo", "action-typo",
        "reset-after-reboot", "xid-class-typo"])
def test_bad_overrides_fail_at_start_up_naming_the_field(faults: dict[str, object], fragment: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(policy={"faults": faults})
    assert "policy.faults" in str(err.value) and fragment in str(err.value)


#: NVIDIA's resolution bucket (immediate action) of every code the shipped table lists, as its Xid
#: catalogue for Ampere and newer GPUs spells them now (docs.nvidia.com/deploy/xid-errors).
CATALOGUE = {
    8: "RESTART_APP", 13: "RESTART_APP", 14: "IGNORE", 25: "RESTART_APP", 31: "RESTART_APP", 32: "RESTART_APP",
    38: "IGNORE", 43: "IGNORE", 44: "IGNORE", 45: "WORKFLOW_XID_45", 46: "RESET_GPU", 48: "WORKFLOW_XID_48",
    54: "CHECK_MECHANICALS", 57: "CONTACT_SUPPORT", 58: "CONTACT_SUPPORT", 61: "CONTACT_SUPPORT", 62: "RESET_GPU",
    63: "IGNORE", 64: "RESET_GPU", 68: "RESTART_APP", 69: "RESTART_APP", 74: "WORKFLOW_NVLINK_ERR",
    78: "UPDATE_SWFW", 79: "RESTART_BM", 90: "CONTACT_SUPPORT", 92: "IGNORE", 94: "RESTART_APP", 95: "RESET_GPU",
    109: "RESET_GPU", 110: "RESET_GPU", 119: "RESET_GPU", 120: "RESET_GPU", 121: "IGNORE", 122: "CONTACT_SUPPORT",
    123: "CONTACT_SUPPORT", 124: "CONTACT_SUPPORT", 125: "CONTACT_SUPPORT", 136: "RESET_GPU", 137: "IGNORE",
    140: "RESET_GPU", 143: "RESET_GPU", **dict.fromkeys(range(144, 151), "WORKFLOW_NVLINK5_ERR"),
    151: "RESTART_VM", 154: "XID_154", 155: "RESET_GPU", 156: "RESET_GPU", 158: "RESET_GPU", 159: "CHECK_UVM",
    160: "IGNORE",
}
#: The buckets that say the application, not the node, must act.
NOT_THE_NODE = {"RESTART_APP", "IGNORE", "WORKFLOW_XID_45", "XID_154"}


def test_every_code_carries_nvidias_bucket() -> None:
    assert {code: x.nvidia for code, x in T.xids.items()} == CATALOGUE


@pytest.mark.parametrize("code", sorted(CATALOGUE))
def test_the_class_follows_the_bucket(code: int) -> None:
    bucket, cls = CATALOGUE[code], T.xids[code].fault_class
    assert (cls == "app") == (bucket in NOT_THE_NODE), (code, bucket, cls)


#: What each node-fault bucket asks first, and the first action of its code's class where a job can run
#: on a node and where none can (validation.backend none). RESTART_BM and CHECK_MECHANICALS depart
#: from NVIDIA on purpose (docs/policy.md, "Where the table departs from NVIDIA").
FIRST = {
    "RESET_GPU": ("gpu-reset", {"restart", "move-host"}),
    "WORKFLOW_XID_48": ("gpu-reset", {"move-host"}),
    "WORKFLOW_NVLINK_ERR": ("gpu-reset", {"restart"}),
    "WORKFLOW_NVLINK5_ERR": ("gpu-reset", {"restart"}),
    "RESTART_VM": ("restart", {"restart"}),
    "UPDATE_SWFW": ("restart", {"restart"}),
    "CHECK_UVM": ("restart", {"restart"}),
    "CONTACT_SUPPORT": ("quarantine", {"quarantine"}),
    "RESTART_BM": ("move-host", {"move-host"}),
    "CHECK_MECHANICALS": ("move-host", {"move-host"}),
}


@pytest.mark.parametrize("code", [c for c, b in sorted(CATALOGUE.items()) if b not in NOT_THE_NODE])
def test_each_bucket_gets_its_first_action(code: int) -> None:
    faults, wf = FaultSettings(classify=True), Settings().workflow
    cause = classify("slurm", "FAIL", f"xid {code}", tbl=T)
    first, without_jobs = FIRST[CATALOGUE[code]]
    assert first_action(cause.fault_class, faults, wf, gpu_reset=True) == first
    assert first_action(cause.fault_class, faults, wf, gpu_reset=False) in without_jobs
    assert "gpu-reset" not in ladder(cause.fault_class, faults, wf, gpu_reset=True)[1:]  # never after a reboot


@pytest.mark.parametrize("code", [c for c, b in sorted(CATALOGUE.items()) if b == "CONTACT_SUPPORT"])
def test_contact_support_takes_no_machine_action_and_asks_for_an_rma(code: int) -> None:
    faults = FaultSettings(classify=True)
    wf = Settings().workflow
    cause = classify("slurm", "FAIL", f"xid {code}", tbl=T)
    for jobs in (True, False):
        assert ladder(cause.fault_class, faults, wf, gpu_reset=jobs) == ("quarantine",)
        assert action_rungs(cause.fault_class, faults, wf, gpu_reset=jobs) == ()
    assert needs_rma(cause.fault_class, faults)


def test_a_contact_support_node_is_quarantined_before_any_eviction_or_machine_action() -> None:
    from datetime import UTC, datetime

    from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
    from remediation.domain.context import RemediationContext
    from remediation.domain.outcomes import Adapters, Quarantine, StepInput, StepSettings
    from remediation.domain.step_bodies import k8s_evict

    world = MemoryWorld(nodes=["gpu-node-1"])
    cause = classify("slurm", "FAIL", "NVRM: Xid (PCI:0000:3b:00): 122, pid=1", tbl=T)
    inp = StepInput(remediation_id=1, node="gpu-node-1", cause=cause.evidence, ladder=0,
                    context=RemediationContext(fault_class=cause.fault_class, k8s_node="gpu-node-1"),
                    key="r1:k8s_evict:1", attempt=1, started_at=datetime.now(UTC), checks=0, provider_op=None,
                    detail={}, source="slurm")
    cfg = StepSettings.of(load_settings(policy={"faults": {"classify": True}}, validation={"backend": "slurm"}))
    out = k8s_evict(inp, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world)), cfg,
                    now=datetime.now(UTC))
    assert isinstance(out, Quarantine) and "gpu-rma" in out.reason
    assert world.calls("k8s.evict") == [] and [c for c in world.calls() if c["op"].startswith("vm.")] == []


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

    path = Path(__file__).resolve().parents[3] / "deploy/policies/naive-ladder.yaml"
    monkeypatch.setenv("REMEDIATION_CONFIG", str(path))
    cfg = load_settings()
    assert not cfg.policy.faults.classify and not cfg.policy.lemon.enabled
    assert ladder("gpu-memory", cfg.policy.faults, cfg.workflow, gpu_reset=True) == ("restart", "reimage")
    monkeypatch.delenv("REMEDIATION_CONFIG")
    shipped_cfg = load_settings()
    assert shipped_cfg.policy.faults.classify and shipped_cfg.policy.lemon.enabled  # the shipped defaults
