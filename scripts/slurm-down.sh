#!/bin/bash
# Stop the Slurm started by slurm-up.sh in SLURM_CI_DIR (default /tmp/slurm-ci) and remove that directory.
#
# Every job is cancelled first, and whatever of the cluster still runs once its daemons are stopped is
# killed: slurmstepd outlives slurmd and slurmctld by design (a job survives a daemon restart) and
# blocks SIGTERM, so a job left running at shutdown would leave its stepd waiting forever for a
# controller that is gone.
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
ROOT=${SLURM_CI_ROOT:-}

# Running and pending jobs alike: a pending one could start while the others end.
jobs=$(squeue -h -o %A 2>/dev/null)
if [ -n "$jobs" ]; then
  # shellcheck disable=SC2086 # one argument per job id
  scancel --quiet $jobs 2>/dev/null
  for _ in $(seq 1 50); do [ -z "$(squeue -h -o %A 2>/dev/null)" ] && break; sleep 0.2; done
fi

if [ -f "$D/run/slurmrestd.pid" ]; then
  kill "$(cat "$D/run/slurmrestd.pid")" 2>/dev/null
fi
pids=$(cat "$D"/run/*.pid 2>/dev/null | sort -u)
scontrol shutdown 2>/dev/null   # stops slurmctld and every slurmd registered with it
for p in $pids; do
  for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null
done

# What is left: a stepd whose job Slurm could not end (its slurmd was killed under it), a slurmd a
# reboot started after the pid files were read. Each works in DIR (slurmd and its stepds in DIR/log;
# the host sees a chroot's DIR as ROOT/DIR); a stepd goes with its job, the rest of its session. The
# session this script runs in is spared: a shell that called it from DIR is not the cluster's.
in_dir() {
  local cwd
  cwd=$(readlink "/proc/$1/cwd" 2>/dev/null) || return 1
  cwd=${cwd% (deleted)}
  case "$cwd" in "$D" | "$D"/* | "$ROOT$D" | "$ROOT$D"/*) return 0 ;; esac
  return 1
}
running() {  # not gone, nor a zombie waiting to be reaped
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}
session_of() { ps -o sid= -p "$1" | tr -d ' '; }
own_session=$(session_of $$)
left=""
for proc in /proc/[0-9]*; do
  pid=${proc#/proc/}
  in_dir "$pid" && running "$pid" || continue
  session=$(session_of "$pid")
  [ -n "$session" ] && [ "$session" != "$own_session" ] || continue
  left="$left $pid"
  [ "$(cat "$proc/comm" 2>/dev/null)" = slurmstepd ] && left="$left $(ps -o pid= -s "$session" | tr '\n' ' ')"
done
if [ -n "${left// /}" ]; then
  echo "killing what is left of the cluster in $D:" >&2
  # shellcheck disable=SC2086 # one argument per pid
  ps -o pid=,args= -p "$(echo $left | tr ' ' ',')" >&2
  # shellcheck disable=SC2086
  kill -9 $left 2>/dev/null
  for _ in $(seq 1 50); do
    alive=0
    for p in $left; do running "$p" && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
fi

if [ "${SLURM_CI_STOP_MUNGE:-0}" = 1 ]; then
  runuser -u munge -- /usr/sbin/munged --stop 2>/dev/null
fi
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
