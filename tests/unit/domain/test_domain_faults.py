"""Domain faults: the signals of an NVLink domain (SXID, NVSwitch, fabric manager, IMEX) on real message
formats, the domain of one, and every other signal still the node's (the K-trays rule for NVLink faults
is tested with the other domain rules, in test_topology.py)."""

from __future__ import annotations

import pytest

from remediation.domain.causes import SEVERITY, CauseTable, FaultScope, classify, shipped, table
from remediation.settings import FaultSettings, load_settings
from remediation.vocabulary import FAULT_CLASSES

T = shipped()
RACK = 18  # an NVL72's compute trays: one NVLink domain

DOMAIN_SIGNALS = [
    # (source, state, reason as the source writes it, class)
    ("slurm", "DRAIN", "sxid 12028 on nvswitch3", "nvswitch"),
    ("slurm", "DRAIN", "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV "
     "error (First)", "nvswitch"),
    ("slurm", "DRAIN", "nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 20034, Fatal, Link 28 LTSSM Fault Up", "nvswitch"),
    ("slurm", "FAIL", "SXids on the rack, see ticket", "nvswitch"),
    ("slurm", "FAIL", "NVSwitch fatal error, tray 4", "nvswitch"),
    ("slurm", "FAIL", "nvidia-fabricmanager failed", "nvswitch"),
    ("slurm", "FAIL", "fabric manager stopped after driver update", "nvswitch"),
    ("slurm", "DOWN", "nv-fabricmanager: Training of NVLink trunk links failed", "nvswitch"),
    ("slurm", "FAIL", "nvidia-imex down", "imex"),
    ("slurm", "FAIL", "nvidia-imex.service failed", "imex"),
    ("slurm", "DRAIN", "IMEX channel /dev/nvidia-caps-imex-channels/channel0 missing", "imex"),
    ("manual", "report", "imex daemon not ready on gpu-004", "imex"),
    ("kubernetes", "SysLogsSXIDError=True", "Node gb-7: SXID 12028 NVSwitch non-fatal", "nvswitch"),
    ("kubernetes", "SysLogsSXIDError=True", "Node gb-7: ", "nvswitch"),  # the condition alone
    ("kubernetes", "GpuNvswitchFatalWatch=True", "Node gb-7: NVSwitch 2 fatal error", "nvswitch"),
    # NVSentinel reports IMEX's DCGM check under its NVLink watch: the message names the part.
    ("kubernetes", "GpuNvlinkWatch=True", "Node gb-7: ErrorCode:DCGM_FR_IMEX_UNHEALTHY GPU:0 PCI:0000:9d:00.0 "
     "GPU_UUID:GPU-bb3e IMEX daemon status is -3 (not READY) Recommended Action=CONTACT_SUPPORT;", "imex"),
]


@pytest.mark.parametrize(("source", "state", "reason", "cls"), DOMAIN_SIGNALS, ids=[s[2][:40] for s in DOMAIN_SIGNALS])
def test_each_domain_signal_is_the_domains_in_a_multi_node_domain(source: str, state: str, reason: str,
                                                                  cls: str) -> None:
    cause = classify(source, state, reason, tbl=T, domain_size=RACK)
    assert (cause.fault_class, cause.scope, cause.xid) == (cls, FaultScope.DOMAIN, None), cause.evidence
    assert "NVLink domain (18 nodes)" in cause.evidence


@pytest.mark.parametrize(("source", "state", "reason", "cls"), DOMAIN_SIGNALS, ids=[s[2][:40] for s in DOMAIN_SIGNALS])
def test_on_a_node_in_no_multi_node_domain_the_same_signal_is_the_nodes(source: str, state: str, reason: str,
                                                                        cls: str) -> None:
    """An HGX node's NVSwitches are on its own baseboard, and IMEX serves no domain there (NVSentinel
    reported IMEX as a fault on idle single-node NVSwitch systems): never a domain fault."""
    for size in (1, 0):
        cause = classify(source, state, reason, tbl=T, domain_size=size)
        assert (cause.fault_class, cause.scope) == (cls, FaultScope.NODE), cause.evidence
        assert "no multi-node NVLink domain" in cause.evidence
    assert classify(source, state, reason, tbl=T).scope is FaultScope.NODE  # a caller that names no domain


def test_imex_on_a_domain_of_one_is_held_never_acted_on() -> None:
    reason = "Node p5-1: ErrorCode:DCGM_FR_IMEX_UNHEALTHY GPU:0 IMEX daemon status is -3 (not READY)"
    cause = classify("kubernetes", "GpuNvlinkWatch=True", reason, tbl=T, domain_size=1)
    assert (cause.fault_class, cause.scope) == ("imex", FaultScope.NODE)
    info = T.classes["imex"]
    assert info.ladder == ("hold",) and not info.rma and info.lemon_weight == 0.0


def test_a_trays_own_xid_stays_the_nodes_in_any_domain() -> None:
    for reason in ("xid 79", "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
                   "NVRM: Xid (PCI:0000:07:00): 74, pid=4521, NVLink: fatal error detected on link 3"):
        cause = classify("slurm", "FAIL", reason, tbl=T, domain_size=RACK)
        assert cause.scope is FaultScope.NODE and cause.xid in (79, 74), cause.evidence
    # An XID beside an SXID in one kernel log: the tray's own XID names the fault.
    both = ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
            "nvidia-nvswitch1: SXid (PCI:0000:c3:00.0): 20034, Fatal, Link 25 LTSSM Fault Up")
    cause = classify("slurm", "DRAIN", both, tbl=T, domain_size=RACK)
    assert (cause.fault_class, cause.scope) == ("gpu-hardware", FaultScope.NODE)


def test_an_sxid_code_is_never_read_as_an_xid() -> None:
    cause = classify("kubernetes", "SysLogsXIDError=True", "Node n: nvidia-nvswitch2: SXid (PCI:0000:c4:00.0): 10002, "
                     "Severity 5 Engine instance 00", tbl=T, domain_size=RACK)
    assert (cause.xid, cause.fault_class, cause.scope) == (None, "nvswitch", FaultScope.DOMAIN)


def test_a_condition_without_domain_signals_keeps_its_class() -> None:
    """Only conditions marked ``domain_signals`` read the domain's words: a kernel deadlock naming the
    fabric manager's hung task is the host's."""
    cause = classify("kubernetes", "KernelDeadlock=True", "Node n: task nv-fabricmanager:77 blocked for more "
                     "than 120 seconds", tbl=T, domain_size=RACK)
    assert (cause.fault_class, cause.scope) == ("host", FaultScope.NODE)


EVERY_NODE_SIGNAL = [
    ("slurm", "FAIL", "xid 48"), ("slurm", "FAIL", "nvlink down between gpu0 and gpu1"),
    ("slurm", "FAIL", "leaf switch sw-a3 replaced, cables reseated"), ("slurm", "DOWN", ""),
    ("slurm", "FAIL", "IB port down mlx5_3"), ("slurm", "FAIL", "weird, please look"),
    ("kubernetes", "GpuNvlinkWatch=True", "Node n: NVLink link 3 down"),
    ("kubernetes", "NVLinkStatusInactive=True", "Node n: "), ("kubernetes", "Ready=Unknown", "Node n: Kubelet stopped"),
]


@pytest.mark.parametrize(("source", "state", "reason"), EVERY_NODE_SIGNAL, ids=[s[2] or s[1] for s in EVERY_NODE_SIGNAL])
def test_node_signals_keep_their_class_and_are_the_nodes_in_any_domain(source: str, state: str, reason: str) -> None:
    alone = classify(source, state, reason, tbl=T)
    in_rack = classify(source, state, reason, tbl=T, domain_size=RACK)
    assert alone == in_rack and alone.scope is FaultScope.NODE
    assert alone.fault_class not in ("nvswitch", "imex")


def test_the_table_holds_domain_classes_to_their_rules() -> None:
    assert {c for c, i in T.classes.items() if i.scope is FaultScope.DOMAIN} == {"nvswitch", "imex"}
    assert {"nvswitch", "imex"} <= set(FAULT_CLASSES) and set(FAULT_CLASSES) <= set(SEVERITY)
    # The switch under the links outranks them; a dead host explains its IMEX daemon.
    assert SEVERITY.index("nvswitch") < SEVERITY.index("nvlink")
    assert SEVERITY.index("host") < SEVERITY.index("imex") < SEVERITY.index("software")
    assert all(T.classes[x.fault_class].scope is FaultScope.NODE for x in T.xids.values() if x.fault_class != "app")


def test_the_tables_check_refuses_a_domain_signal_of_a_node_class() -> None:
    from remediation.domain import causes

    bad = CauseTable(T.classes, T.xids, T.conditions, T.messages, ((T.domain_signals[0][0], "nvlink"),),
                     T.signal_conditions)
    with pytest.raises(AssertionError, match="not of domain scope"):
        causes._check(bad)


def test_site_overrides_keep_the_domain_signals_and_the_scope() -> None:
    t = table(FaultSettings(ladders={"nvswitch": ["hold"]}, conditions={"MySwitchCheck": "nvswitch"}))
    assert t.domain_signals == T.domain_signals and t.classes["nvswitch"].ladder == ("hold",)
    assert classify("slurm", "FAIL", "sxid 12028", tbl=t, domain_size=4).scope is FaultScope.DOMAIN
    assert classify("kubernetes", "MySwitchCheck=True", "Node n: bad", tbl=t, domain_size=4).scope is FaultScope.DOMAIN
    # A site's XID mapped to a domain class is still the tray's own XID.
    t = table(FaultSettings(xids={74: "nvswitch"}))
    cause = classify("slurm", "FAIL", "xid 74", tbl=t, domain_size=RACK)
    assert (cause.fault_class, cause.scope) == ("nvswitch", FaultScope.NODE)


def test_an_sxid_on_a_node_alone_keeps_the_ladder_and_check_it_had_as_nvlink() -> None:
    assert T.classes["nvswitch"].ladder == T.classes["nvlink"].ladder
    assert T.classes["nvswitch"].rma and not T.classes["nvswitch"].urgent
    checks = load_settings().validation.checks
    assert checks["nvswitch"] == checks["nvlink"] and "all_reduce_perf" in " ".join(checks["nvswitch"])
