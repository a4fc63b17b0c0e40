"""Has slurmctld's node table changed since we last looked? One cheap RPC, answered by Slurm itself.

``slurm_load_node(update_time)`` through ``ctypes`` and the libslurm the Slurm commands link. One process
probes one controller. Any error answers "changed", so the commands run: the probe can make polls cheaper,
never blind. The delta reader (:mod:`remediation.adapters.slurm.delta`) asks it first.

Why: docs/slurm-releases.md#the-change-probe
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import logging
import os

log = logging.getLogger(__name__)

#: The slurm.conf this process's libslurm was initialised with (``""``: Slurm's default/``SLURM_CONF``).
_initialised: dict[str, str] = {}

SLURM_NO_CHANGE_IN_DATA = 1900
#: libslurm's ABI number (``slurm_api_version() >> 16``, the NN of libslurm.so.NN) per Slurm release,
#: from Debian's libslurmNN packages: a library of another release than slurmctld cannot probe it.
API_OF_RELEASE = {
    (22, 5): 38, (23, 2): 39, (23, 11): 40, (24, 5): 41, (24, 11): 42, (25, 5): 43, (25, 11): 44, (26, 5): 45,
}


def matches(api: int, release: tuple[int, ...]) -> bool:
    """Whether a libslurm of ABI ``api`` belongs to Slurm ``release``. A release missing from the table
    is refused: a 22.05 libslurm was once taken for 26.05's and read its answers as garbage (the poll
    then simply runs sinfo)."""
    return API_OF_RELEASE.get((release[0], release[1])) == api
_CANDIDATES = ("/usr/lib/*/slurm-wlm/libslurmfull.so", "/usr/lib64/slurm/libslurmfull.so",
               "/usr/lib/slurm/libslurmfull.so")


def _library(path: str | None) -> ctypes.CDLL | None:
    names = [path] if path else [ctypes.util.find_library("slurm"), *sorted(p for g in _CANDIDATES for p in glob.glob(g))]
    for name in names:
        if not name:
            continue
        try:
            # Global symbols: Slurm's plugins (auth/munge) resolve slurm_conf and friends from it.
            return ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            log.debug("cannot load %s: %s", name, exc)
    return None


class ProbeUnavailable(Exception):
    """This process's libslurm serves another controller's configuration."""


class NodeTableProbe:
    """``changed()``: True unless slurmctld says its node table is as we last saw it."""

    def __init__(self, lib: ctypes.CDLL, slurm_conf: str | None) -> None:
        self.lib = lib
        lib.slurm_init.argtypes = [ctypes.c_char_p]
        lib.slurm_init.restype = None
        lib.slurm_load_node.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint16]
        lib.slurm_load_node.restype = ctypes.c_int
        lib.slurm_get_errno.restype = ctypes.c_int
        lib.slurm_free_node_info_msg.argtypes = [ctypes.c_void_p]
        lib.slurm_free_node_info_msg.restype = None
        conf = slurm_conf or os.environ.get("SLURM_CONF", "")
        first = _initialised.setdefault("conf", conf)
        if first != conf:
            raise ProbeUnavailable(
                f"libslurm in this process already reads {first or 'the default slurm.conf'}, not {conf or 'the default'}"
            )
        if "done" not in _initialised:
            lib.slurm_init(slurm_conf.encode() if slurm_conf else None)
            _initialised["done"] = "yes"
        self.last_update = 0
        self.unchanged = self.changed_count = self.errors = 0

    @classmethod
    def open(
        cls, slurm_conf: str | None, library: str | None = None, release: tuple[int, ...] | None = None
    ) -> NodeTableProbe | None:
        """The probe, or None when it cannot serve: no libslurm, or (given the Slurm ``release`` the
        commands run) a libslurm of another release, checked before the library reads slurm.conf (an
        older libslurm may exit the process on a newer release's configuration)."""
        lib = _library(library)
        if lib is None:
            log.info("libslurm not found: every watcher poll runs sinfo (correct, only dearer)")
            return None
        try:
            lib.slurm_api_version.restype = ctypes.c_long
            lib.slurm_api_version.argtypes = []
            # SLURM_API_VERSION: the library's ABI (libslurm.so.NN) in bits 16-23, one per release.
            api = (int(lib.slurm_api_version()) >> 16) & 0xFF
        except AttributeError as exc:
            log.warning("libslurm cannot serve the change probe (%s): every poll runs sinfo", exc)
            return None
        if release is not None and not matches(api, release):
            # Another release's libslurm (the host's beside a chrooted or upgraded Slurm) speaks another
            # RPC protocol and would fail every probe; the commands alone are correct.
            log.warning("libslurm (ABI %d) is not Slurm %d.%02d's, which the commands run: change probe off, "
                        "every poll runs sinfo", api, release[0], release[1])
            return None
        try:
            return cls(lib, slurm_conf)
        except ProbeUnavailable as exc:
            log.warning("change probe off (%s): every poll runs sinfo", exc)
            return None
        except (AttributeError, OSError) as exc:  # a library without the API we need
            log.warning("libslurm cannot serve the change probe (%s): every poll runs sinfo", exc)
            return None

    def changed(self) -> bool:
        msg = ctypes.c_void_p()
        rc = self.lib.slurm_load_node(self.last_update, ctypes.byref(msg), 0)
        if rc != 0:
            if self.lib.slurm_get_errno() == SLURM_NO_CHANGE_IN_DATA:
                self.unchanged += 1
                return False
            self.errors += 1
            return True  # let the commands meet the error and say what it is
        try:
            if msg.value:
                self.last_update = ctypes.c_int64.from_address(msg.value).value
        finally:
            self.lib.slurm_free_node_info_msg(msg)
        self.changed_count += 1
        return True
