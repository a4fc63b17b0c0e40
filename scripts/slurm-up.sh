#!/bin/bash
# Start a real Slurm controller and N slurmd "nodes" on this host, for tests, benchmarks and demos: the
# host's Slurm 22.05, or with SLURM_CI_ROOT the Slurm 24.11 or 26.05 of a root built by scripts/slurm-root.sh.
#
# Each node is its own slurmd process (slurmd -N NAME) listening on its own port, so killing one slurmd
# makes exactly that node go "Not responding" and then DOWN, as on a real cluster; `scontrol reboot NODE`
# restarts exactly that node's slurmd as a fresh boot (the RebootProgram DIR/reboot-node.sh, below).
# Everything lives under one directory (config, state, spool, logs, pid files); slurm-down.sh with the
# same directory removes it.
#
# Environment (all optional):
#   SLURM_CI_DIR        working directory                      (default /tmp/slurm-ci)
#   SLURM_CI_NODES      number of nodes gpu-node-0..N-1        (default 8)
#   SLURM_CI_CTLD_PORT  slurmctld port                         (default 6817)
#   SLURM_CI_PORT_BASE  first slurmd port; node i uses BASE+i  (default 17000)
#   SLURM_CI_REST       1 = also start slurmrestd on DIR/run/slurmrestd.sock (default 1); on 26.05 it
#                       runs as nobody, and DIR/run/slurmrestd.token holds a JWT for root (X-SLURM-USER-*)
#   SLURM_CI_TIMEOUT_S  seconds to wait for every node to be idle (default 60)
#   SLURM_CI_ROOT       run the Slurm of this root (scripts/slurm-root.sh) with chroot (default: the host's)
#   SLURM_CI_LEAVES     0 = no topology; L >= 1 = TopologyPlugin=topology/tree with the nodes split in
#                       order over L leaf switches leaf[0..L-1] under one spine switch (default 0)
#   SLURM_CI_BLOCKS     0 = none; B >= 1 = TopologyPlugin=topology/block with the nodes split in order
#                       over B blocks b1..bB (default 0; not with SLURM_CI_LEAVES; Slurm 24.05+ only)
#   SLURM_CI_BLOCK_SIZE the blocks' BlockSizes (default: the nodes of one block)
#   SLURM_CI_TOPOLOGY_FILE  conf = the topology in topology.conf (default); yaml = in topology.yaml,
#                       which Slurm 25.05+ reads first (the 26.05 root; 24.11 ignores it)
#   SLURM_CI_SLURMD     1 = one slurmd per node (default); 0 = the controller alone: the nodes are
#                       State=CLOUD, powered down (idle~), and nothing runs on them
# Needs root on Debian 12 (bookworm); installs slurmctld, slurmd, slurm-client, munge and slurmrestd
# with apt-get when they are missing. Prints "SLURM_CONF=<path>" on its last line.
#
# With SLURM_CI_ROOT, DIR is bind-mounted into the root at the same path (so one slurm.conf names the
# same files inside and out), the root gets its own proc, sys and munged (its own munge socket and key),
# and DIR/bin holds one wrapper per Slurm command that runs the root's command with chroot: put DIR/bin
# first on PATH, or name the wrappers in slurm.scontrol / sinfo / squeue / scancel. cgroups are off
# (CgroupPlugin=disabled) because a chroot has no cgroup tree of its own to manage.
set -euo pipefail

D=${SLURM_CI_DIR:-/tmp/slurm-ci}
N=${SLURM_CI_NODES:-8}
CTLD_PORT=${SLURM_CI_CTLD_PORT:-6817}
PORT_BASE=${SLURM_CI_PORT_BASE:-17000}
REST=${SLURM_CI_REST:-1}
TIMEOUT_S=${SLURM_CI_TIMEOUT_S:-60}
LEAVES=${SLURM_CI_LEAVES:-0}
BLOCKS=${SLURM_CI_BLOCKS:-0}
TOPO_FILE=${SLURM_CI_TOPOLOGY_FILE:-conf}
SLURMD=${SLURM_CI_SLURMD:-1}
case "$LEAVES" in ''|*[!0-9]*) echo "SLURM_CI_LEAVES must be a non-negative integer" >&2; exit 2;; esac
case "$BLOCKS" in ''|*[!0-9]*) echo "SLURM_CI_BLOCKS must be a non-negative integer" >&2; exit 2;; esac
[ "$LEAVES" = 0 ] || [ "$BLOCKS" = 0 ] || { echo "SLURM_CI_LEAVES and SLURM_CI_BLOCKS exclude each other" >&2; exit 2; }
case "$TOPO_FILE" in conf|yaml) ;; *) echo "SLURM_CI_TOPOLOGY_FILE must be conf or yaml" >&2; exit 2;; esac
case "$SLURMD" in 0|1) ;; *) echo "SLURM_CI_SLURMD must be 0 or 1" >&2; exit 2;; esac
case "$N" in ''|*[!0-9]*) echo "SLURM_CI_NODES must be a positive integer" >&2; exit 2;; esac
[ "$N" -ge 1 ] || { echo "SLURM_CI_NODES must be at least 1" >&2; exit 2; }
LAST=$((N - 1))
if [ "$BLOCKS" -gt 0 ]; then
  PER_BLOCK=$(( (N + BLOCKS - 1) / BLOCKS ))
  BLOCK_SIZE=${SLURM_CI_BLOCK_SIZE:-$PER_BLOCK}
  case "$BLOCK_SIZE" in ''|*[!0-9]*) echo "SLURM_CI_BLOCK_SIZE must be a positive integer" >&2; exit 2;; esac
fi
D=$(realpath -m -- "$D")
export SLURM_CONF="$D/slurm.conf" DEBIAN_FRONTEND=noninteractive
ROOT=${SLURM_CI_ROOT:-}

if [ -n "$ROOT" ]; then
  ROOT=$(realpath -e -- "$ROOT") || { echo "SLURM_CI_ROOT does not exist; build it with scripts/slurm-root.sh" >&2; exit 2; }
  [ -f "$ROOT/.node-remediation-root" ] || { echo "$ROOT is not a root built by scripts/slurm-root.sh" >&2; exit 2; }
  [ "$(id -u)" = 0 ] || { echo "running Slurm in a chroot needs root" >&2; exit 1; }
  # Two clusters may start from one root at once: replace the root's hosts file in one rename.
  cp /etc/hosts "$ROOT/etc/hosts.$$" && mv -f "$ROOT/etc/hosts.$$" "$ROOT/etc/hosts"
  mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
  mountpoint -q "$ROOT/sys" || mount -t sysfs sysfs "$ROOT/sys" 2>/dev/null || mount --rbind /sys "$ROOT/sys"
  mkdir -p "$D" "$ROOT$D"
  mountpoint -q "$ROOT$D" || mount --bind "$D" "$ROOT$D"
  mkdir -p "$D/bin"
  for cmd in scontrol sinfo squeue scancel sbatch srun sdiag strigger slurmctld slurmd slurmrestd munge; do
    path=""
    for dir in /usr/bin /usr/sbin; do [ -x "$ROOT$dir/$cmd" ] && path="$dir/$cmd" && break; done
    [ -n "$path" ] || continue
    # Runs in the caller's directory when the root has it (sbatch writes output there), else in /.
    cat > "$D/bin/$cmd" <<WRAP
#!/bin/sh
exec /usr/sbin/chroot '$ROOT' /bin/sh -c 'cd "\$1" 2>/dev/null || cd /; shift; exec "\$@"' sh "\$PWD" '$path' "\$@"
WRAP
    chmod 0755 "$D/bin/$cmd"
  done
  # Absolute paths inside the root: DIR/bin is visible there too and must not be found on PATH.
  # Clusters of one release come up at once (one per xdist worker): one of them starts munged.
  exec 9>/run/lock/node-remediation-munge.lock
  flock 9
  if ! chroot "$ROOT" /usr/bin/munge -n >/dev/null 2>&1; then
    chroot "$ROOT" /usr/bin/install -d -o munge -g munge -m 0755 /run/munge
    chroot "$ROOT" /usr/sbin/runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 1 50); do chroot "$ROOT" /usr/bin/munge -n >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  flock -u 9
  export PATH="$D/bin:$PATH"
fi

need_install=0
for cmd in slurmctld slurmd sinfo scontrol squeue sbatch munged slurmrestd; do
  command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || need_install=1
done
if [ "$need_install" = 1 ]; then
  [ "$(id -u)" = 0 ] || { echo "slurm is not installed and installing it needs root" >&2; exit 1; }
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge slurmrestd >/dev/null
fi

# munge authenticates every Slurm RPC. The Debian postinst normally creates the key; create one if not.
# Clusters come up at once (one per xdist worker): one of them creates the key and starts munged.
if [ -z "$ROOT" ]; then
  exec 9>/run/lock/node-remediation-munge.lock
  flock 9
  [ -s /etc/munge/munge.key ] || runuser -u munge -- mungekey -c
  install -d -o munge -g munge -m 0755 /run/munge
  if ! munge -n >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 1 50); do munge -n >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  flock -u 9
fi

mkdir -p "$D"/{state,spool,log,run,dev}
# Fake GPU character devices, so Gres=gpu:8 validates without GPUs.
for g in 0 1 2 3 4 5 6 7; do ln -sf /dev/null "$D/dev/nvidia$g"; done

cat > "$SLURM_CONF" <<CONF
ClusterName=ci
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SlurmdParameters=config_overrides
# Short timeouts so a killed slurmd shows as "Not responding" (and then DOWN) within ~30 s.
SlurmdTimeout=10
# A node that was DOWN for not responding returns to service once its slurmd registers again.
ReturnToService=1
MailProg=/bin/true
MpiDefault=none
# Heterogeneous jobs start only from the backfill scheduler: a pass each second, not each 30 s.
SchedulerParameters=bf_interval=1
GresTypes=gpu
NodeName=gpu-node-[0-$LAST] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[$PORT_BASE-$((PORT_BASE + LAST))] CPUs=64 RealMemory=512000 Gres=gpu:8 State=$([ "$SLURMD" = 1 ] && echo UNKNOWN || echo CLOUD)
PartitionName=gpu Nodes=gpu-node-[0-$LAST] Default=YES MaxTime=INFINITE State=UP
CONF
if [ "$SLURMD" = 0 ]; then
  # Cloud nodes stay powered down (idle~) with no slurmd until a job would resume them: none is run.
  printf 'SuspendProgram=/bin/true\nResumeProgram=/bin/true\nSuspendTime=600\n' >> "$SLURM_CONF"
fi
echo "NodeName=gpu-node-[0-$LAST] Name=gpu File=$D/dev/nvidia[0-7]" > "$D/gres.conf"
if [ "$LEAVES" -gt 0 ]; then
  # topology.conf (Slurm's topology/tree): leaf switches over consecutive nodes, one spine above them,
  # so a job may still span every node. The service reads it back with `scontrol show topology`.
  echo "TopologyPlugin=topology/tree" >> "$SLURM_CONF"
  : > "$D/topology.conf"
  per=$(( (N + LEAVES - 1) / LEAVES ))
  for l in $(seq 0 $((LEAVES - 1))); do
    first=$((l * per)); last=$(( (l + 1) * per - 1 )); [ "$last" -le "$LAST" ] || last=$LAST
    [ "$first" -le "$LAST" ] || break
    echo "SwitchName=leaf$l Nodes=gpu-node-[$first-$last]" >> "$D/topology.conf"
  done
  made=$(grep -c "^SwitchName=leaf" "$D/topology.conf")
  echo "SwitchName=spine Switches=leaf[0-$((made - 1))]" >> "$D/topology.conf"
fi
if [ "$BLOCKS" -gt 0 ]; then
  # topology/block: blocks of consecutive nodes, the unit jobs fill together (an NVLink domain).
  # topology.yaml names its plugin itself; TopologyPlugin stays for a release that reads topology.conf.
  echo "TopologyPlugin=topology/block" >> "$SLURM_CONF"
  if [ "$TOPO_FILE" = yaml ]; then
    printf -- '---\n- topology: blocks\n  cluster_default: true\n  block:\n    block_sizes: [%s]\n    blocks:\n' \
      "$BLOCK_SIZE" > "$D/topology.yaml"
  else
    : > "$D/topology.conf"
  fi
  for b in $(seq 1 "$BLOCKS"); do
    first=$(( (b - 1) * PER_BLOCK )); last=$(( b * PER_BLOCK - 1 )); [ "$last" -le "$LAST" ] || last=$LAST
    [ "$first" -le "$LAST" ] || break
    if [ "$TOPO_FILE" = yaml ]; then
      printf '      - block: b%s\n        nodes: "gpu-node-[%s-%s]"\n' "$b" "$first" "$last" >> "$D/topology.yaml"
    else
      echo "BlockName=b$b Nodes=gpu-node-[$first-$last]" >> "$D/topology.conf"
    fi
  done
  [ "$TOPO_FILE" = yaml ] || echo "BlockSizes=$BLOCK_SIZE" >> "$D/topology.conf"
fi
# RebootProgram, for `scontrol reboot` (the service's vm.backend=slurm): "reboots" a node by restarting
# its slurmd with -b, which registers as a fresh boot (BootTime now), as a rebooted host would.
# slurmd runs it with no argument and nothing in its environment naming the node (seen on 22.05 and
# 24.11), and every slurmd here shares one slurm.conf, so it finds its node by walking up its own
# process tree to the slurmd whose pid file holds an ancestor's pid. It returns at once; a detached
# child stops that slurmd and starts the new one. DIR/run/NODE.no-boot makes it restart slurmd without
# -b: slurmd registers again with the old BootTime, a reboot that never happens. Each run is logged to
# DIR/log/reboot.log.
cat > "$D/reboot-node.sh" <<'REBOOT'
#!/bin/sh
D=$(dirname "$0")
PATH=/usr/sbin:/usr/bin:/sbin:/bin  # the root's own slurmd, never DIR/bin's chroot wrappers
pid=$$ node="" slurmd=""
while [ -z "$node" ] && [ "${pid:-1}" -gt 1 ]; do
  for f in "$D"/run/slurmd-*.pid; do
    if [ "$(cat "$f" 2>/dev/null)" = "$pid" ]; then node=${f##*/slurmd-}; node=${node%.pid}; slurmd=$pid; fi
  done
  pid=$(sed -n 's/^PPid:[[:space:]]*//p' "/proc/$pid/status" 2>/dev/null)
done
[ -n "$node" ] || { echo "$(date +%T) no slurmd among my ancestors" >> "$D/log/reboot.log"; exit 1; }
boot=-b
[ -e "$D/run/$node.no-boot" ] && boot=""
echo "$(date +%T) reboot $node (slurmd $slurmd${boot:+, as a new boot})" >> "$D/log/reboot.log"
unset SLURMD_RECONF SLURMD_RECONF_LISTEN_FD SLURMD_RECONF_PARENT_FD  # a reconfigured 24.11 slurmd's
# The child leaves this process group at once (setsid), and the script returns only once it has:
# 26.05's slurmd kills the RebootProgram's process group when the program exits.
detached="$D/run/$node.detached"
rm -f "$detached"
setsid sh -c ': > "$5"; kill "$1"; while kill -0 "$1" 2>/dev/null; do sleep 0.1; done; exec slurmd $4 -N "$2" -f "$3"' \
  reboot "$slurmd" "$node" "$D/slurm.conf" "$boot" "$detached" </dev/null >/dev/null 2>&1 &
for _ in $(seq 1 100); do [ -e "$detached" ] && break; sleep 0.05; done
rm -f "$detached"
exit 0
REBOOT
chmod 0755 "$D/reboot-node.sh"
echo "RebootProgram=$D/reboot-node.sh" >> "$SLURM_CONF"
# 26.05's slurmrestd runs unprivileged and acts as root only with a JWT (below): slurmctld gets the key.
JWT=0
if [ "$REST" = 1 ] && [ -n "$ROOT" ]; then
  major=$(awk '{print $2}' "$ROOT/.node-remediation-root" | cut -d. -f1)
  [ "${major:-0}" -ge 26 ] && JWT=1
fi
if [ "$JWT" = 1 ]; then
  [ -s "$D/jwt.key" ] || { head -c 32 /dev/urandom > "$D/jwt.key.new" && mv "$D/jwt.key.new" "$D/jwt.key"; }
  chmod 0600 "$D/jwt.key"
  printf 'AuthAltTypes=auth/jwt\nAuthAltParameters=jwt_key=%s\n' "$D/jwt.key" >> "$SLURM_CONF"
fi
# A chroot has no cgroup tree of its own (24.11's slurmd reads cgroup.conf even with task/none).
[ -n "$ROOT" ] && echo "CgroupPlugin=disabled" > "$D/cgroup.conf"

# -c: drop any job and node state an earlier run left in this directory; start from the config alone.
slurmctld -c -f "$SLURM_CONF"
for _ in $(seq 1 100); do scontrol ping >/dev/null 2>&1 && break; sleep 0.2; done
scontrol ping >/dev/null 2>&1 || { echo "slurmctld did not answer; see $D/log/slurmctld.log" >&2; exit 1; }

if [ "$SLURMD" = 1 ]; then
  for i in $(seq 0 "$LAST"); do
    mkdir -p "$D/spool/gpu-node-$i"
    slurmd -N "gpu-node-$i" -f "$SLURM_CONF"
  done
fi

if [ "$REST" = 1 ]; then
  # 22.05 serves v0.0.38 from its own plugin; 23.02+ serve their data_parser versions from
  # openapi/slurmctld (24.11: v0.0.40-42; 26.05: v0.0.42-45).
  plugin=openapi/v0.0.38
  [ -n "$ROOT" ] && plugin=openapi/slurmctld
  if [ "$JWT" = 1 ]; then
    # 26.05 refuses to run as root or SlurmUser at all (SLURMRESTD_SECURITY=disable_user_check is
    # fatal): it runs as nobody, and a request that is to act as root carries a JWT slurmctld issued
    # (`scontrol token`), as on a production cluster. rest_auth/jwt alone: with rest_auth/local loaded
    # too, a root peer on the socket is refused ("rejecting thread config for user root") before its
    # token is looked at.
    scontrol token username=root lifespan=604800 | sed -n 's/^SLURM_JWT=//p' > "$D/run/slurmrestd.token"
    [ -s "$D/run/slurmrestd.token" ] || { echo "scontrol token issued no token; see $D/log/slurmctld.log" >&2; exit 1; }
    chmod 0600 "$D/run/slurmrestd.token"
    # It binds its socket after dropping to nobody: in a directory of nobody's, reached by the usual path.
    # DIR may be private (a test's temp dir is 0700): nobody may pass through it, read nothing in it.
    chmod o+x "$D" "$D/run"
    install -d -o 65534 -g 65534 -m 0755 "$D/run/rest"
    ln -sfn rest/slurmrestd.sock "$D/run/slurmrestd.sock"
    SLURM_JWT=daemon setsid slurmrestd -u 65534 -g 65534 -a rest_auth/jwt -s "$plugin" \
      "unix:$D/run/rest/slurmrestd.sock" >"$D/log/slurmrestd.log" 2>&1 </dev/null &
  else
    # rest_auth/local authenticates by the peer's uid on the unix socket; root needs the override.
    SLURMRESTD_SECURITY=disable_user_check setsid slurmrestd -a rest_auth/local -s "$plugin" \
      "unix:$D/run/slurmrestd.sock" >"$D/log/slurmrestd.log" 2>&1 </dev/null &
  fi
  echo $! > "$D/run/slurmrestd.pid"
fi

deadline=$((SECONDS + TIMEOUT_S))
until [ "$(sinfo -h -t idle -o %D | awk '{s+=$1} END {print s+0}')" = "$N" ]; do
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "not every node became idle within ${TIMEOUT_S}s:" >&2
    sinfo -N -o "%N %T %E" >&2 || true
    exit 1
  fi
  sleep 0.2
done
if [ "$REST" = 1 ]; then
  for _ in $(seq 1 50); do [ -S "$D/run/slurmrestd.sock" ] && break; sleep 0.1; done
fi
sinfo -N -o "%N %T %G"
echo "SLURM_CONF=$SLURM_CONF"
