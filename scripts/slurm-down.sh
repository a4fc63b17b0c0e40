#!/bin/bash
# Stop the Slurm started by slurm-up.sh in SLURM_CI_DIR (default /tmp/slurm-ci) and remove that directory.
#
# munged is a host-wide daemon that other clusters on this host may share, so it keeps running unless
# SLURM_CI_STOP_MUNGE=1. The directory is removed only if it holds our slurm.conf, so a mistyped
# SLURM_CI_DIR cannot delete anything else. A cluster started from a root (SLURM_CI_ROOT) is stopped
# with that root's commands (DIR/bin) and DIR's bind mount into the root is undone; the root's own
# munged, proc and sys stay for the next cluster.
set -uo pipefail

D=$(realpath -m -- "${SLURM_CI_DIR:-/tmp/slurm-ci}")
export SLURM_CONF="$D/slurm.conf"
[ -f "$SLURM_CONF" ] || { echo "no Slurm set up in $D" >&2; exit 0; }
[ -d "$D/bin" ] && export PATH="$D/bin:$PATH"

if [ -f "$D/run/slurmrestd.pid" ]; then
  kill "$(cat "$D/run/slurmrestd.pid")" 2>/dev/null
fi
pids=$(cat "$D"/run/*.pid 2>/dev/null | sort -u)
scontrol shutdown 2>/dev/null   # stops slurmctld and every slurmd registered with it
for p in $pids; do
  for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null
done
if [ "${SLURM_CI_STOP_MUNGE:-0}" = 1 ]; then
  runuser -u munge -- /usr/sbin/munged --stop 2>/dev/null
fi
ROOT=${SLURM_CI_ROOT:-}
if [ -n "$ROOT" ] && mountpoint -q "$ROOT$D"; then
  umount "$ROOT$D" || umount -l "$ROOT$D"
  rmdir "$ROOT$D" 2>/dev/null
fi
if grep -q "^StateSaveLocation=$D/state\$" "$SLURM_CONF" 2>/dev/null; then
  if [ -n "$ROOT" ] && mountpoint -q "$ROOT$D"; then
    echo "$D is still mounted in $ROOT; not removing it" >&2
    exit 1
  fi
  rm -rf -- "$D"
fi
exit 0
