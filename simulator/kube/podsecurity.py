"""Pod Security admission for the fake kube-apiserver: the namespace's ``enforce`` level, checked when a Pod
is created.

A Pod that breaks the level is a 403 in the real server's words; no label means ``privileged``, an unknown
level ``restricted``. The baseline and restricted controls for Linux pods are checked. Version pins,
exemptions, ``warn`` and ``audit`` are not modelled.

Why: docs/kubernetes.md#inside-the-local-kube-apiserver
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

ENFORCE = "pod-security.kubernetes.io/enforce"
LEVELS = ("privileged", "baseline", "restricted")
DEFAULT_LEVEL = "privileged"  # the admission plugin's default for a namespace without the label

_BASELINE_CAPS = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                            "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
_SAFE_SYSCTLS = frozenset({"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                           "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                           "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                           "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                           "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"})
_SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
_RESTRICTED_VOLUMES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                                 "persistentVolumeClaim", "projected", "secret"})
_VOLUME_KEYS_NOT_SOURCES = frozenset({"name"})

Obj = dict[str, Any]


def level_of(labels: dict[str, str] | None) -> str:
    value = (labels or {}).get(ENFORCE)
    if value is None:
        return DEFAULT_LEVEL
    return value if value in LEVELS else "restricted"


def forbidden(pod_name: str, level: str, spec: Obj) -> str | None:
    """The message a refused Pod gets, or None when ``spec`` meets ``level``."""
    problems = violations(level, spec)
    if not problems:
        return None
    return f'pods "{pod_name}" is forbidden: violates PodSecurity "{level}:latest": ' + ", ".join(problems)


def violations(level: str, spec: Obj) -> list[str]:
    if level == "privileged":
        return []
    found = list(_baseline(spec))
    if level == "restricted":
        found += list(_restricted(spec))
    return found


def _containers(spec: Obj) -> list[Obj]:
    return [c for part in ("initContainers", "containers", "ephemeralContainers") for c in spec.get(part) or []]


def _names(containers: list[Obj]) -> str:
    quoted = ", ".join(f'"{c.get("name", "")}"' for c in containers)
    return f"container{'s' if len(containers) > 1 else ''} {quoted}"


def _sc(obj: Obj) -> Obj:
    return obj.get("securityContext") or {}


def _baseline(spec: Obj) -> Iterator[str]:
    pod_sc, containers = _sc(spec), _containers(spec)
    if (_sc(spec).get("windowsOptions") or {}).get("hostProcess") or any(
            (_sc(c).get("windowsOptions") or {}).get("hostProcess") for c in containers):
        yield "hostProcess (pod or containers must not set securityContext.windowsOptions.hostProcess=true)"
    host = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    if host:
        yield f"host namespaces ({', '.join(host)})"
    if bad := [c for c in containers if _sc(c).get("privileged")]:
        yield f"privileged ({_names(bad)} must not set securityContext.privileged=true)"
    added = {c.get("name", ""): [a for a in (_sc(c).get("capabilities") or {}).get("add") or []
                                 if a not in _BASELINE_CAPS] for c in containers}
    if bad := [c for c in containers if added[c.get("name", "")]]:
        caps = sorted({a for c in bad for a in added[c.get("name", "")]})
        yield f"non-default capabilities ({_names(bad)} must not include {', '.join(repr(a) for a in caps)} " \
              "in securityContext.capabilities.add)"
    if paths := [v.get("name", "") for v in spec.get("volumes") or [] if "hostPath" in v]:
        yield f"hostPath volumes ({', '.join(repr(p) for p in paths)})"
    if bad := [c for c in containers if any(p.get("hostPort") for p in c.get("ports") or [])]:
        yield f"hostPort ({_names(bad)} uses hostPort)"
    if _seccomp(pod_sc) == "Unconfined" or any(_seccomp(_sc(c)) == "Unconfined" for c in containers):
        yield 'seccompProfile (pod or containers must not set securityContext.seccompProfile.type to "Unconfined")'
    apparmor = [(_sc(o).get("appArmorProfile") or {}).get("type") for o in [spec, *containers]]
    if any(t not in (None, "RuntimeDefault", "Localhost") for t in apparmor):
        yield 'appArmorProfile (pod or containers must not set securityContext.appArmorProfile.type to "Unconfined")'
    for o in [spec, *containers]:
        opts = _sc(o).get("seLinuxOptions") or {}
        if opts.get("type", "") not in _SELINUX_TYPES or opts.get("user") or opts.get("role"):
            yield "seLinuxOptions (pod or containers must not set forbidden securityContext.seLinuxOptions)"
            break
    if bad := [c for c in containers if _sc(c).get("procMount", "Default") != "Default"]:
        yield f"procMount ({_names(bad)} must not set securityContext.procMount to non-default value)"
    if sysctls := [s.get("name", "") for s in pod_sc.get("sysctls") or [] if s.get("name") not in _SAFE_SYSCTLS]:
        yield f"forbidden sysctls ({', '.join(sysctls)})"


def _seccomp(sc: Obj) -> str | None:
    return (sc.get("seccompProfile") or {}).get("type")


def _restricted(spec: Obj) -> Iterator[str]:
    pod_sc, containers = _sc(spec), _containers(spec)
    kinds = sorted({k for v in spec.get("volumes") or [] for k in v if k not in _VOLUME_KEYS_NOT_SOURCES}
                   - _RESTRICTED_VOLUMES)
    if kinds:
        yield f"restricted volume types (volumes must not use {', '.join(kinds)})"
    if bad := [c for c in containers if _sc(c).get("allowPrivilegeEscalation") is not False]:
        yield f"allowPrivilegeEscalation != false ({_names(bad)} must set securityContext.allowPrivilegeEscalation=false)"
    explicit_no = [c for c in containers if _sc(c).get("runAsNonRoot") is False]
    unset = [c for c in containers if _sc(c).get("runAsNonRoot") is None]
    if pod_sc.get("runAsNonRoot") is False or explicit_no or (unset and pod_sc.get("runAsNonRoot") is not True):
        yield f"runAsNonRoot != true (pod or {_names(explicit_no or unset)} must set securityContext.runAsNonRoot=true)"
    if pod_sc.get("runAsUser") == 0 or any(_sc(c).get("runAsUser") == 0 for c in containers):
        yield "runAsUser=0 (pod and containers must not set runAsUser=0)"
    allowed = ("RuntimeDefault", "Localhost")
    if bad := [c for c in containers if (_seccomp(_sc(c)) or _seccomp(pod_sc)) not in allowed]:
        yield f'seccompProfile (pod or {_names(bad)} must set securityContext.seccompProfile.type to ' \
              '"RuntimeDefault" or "Localhost")'
    caps = {c.get("name", ""): _sc(c).get("capabilities") or {} for c in containers}
    if bad := [c for c in containers if "ALL" not in (caps[c.get("name", "")].get("drop") or [])
               or set(caps[c.get("name", "")].get("add") or []) - {"NET_BIND_SERVICE"}]:
        yield f'unrestricted capabilities ({_names(bad)} must set securityContext.capabilities.drop=["ALL"] ' \
              'and add at most "NET_BIND_SERVICE")'
