#!/usr/bin/env bash
# Build a minimal Debian trixie root holding Slurm 24.11, the second real Slurm the tests run against.
#
# Debian 12 ships only Slurm 22.05 (end-of-life); Slurm-on-Kubernetes deployments run 23.11 to 25.x. The
# next Debian release packages 24.11, and a debootstrap'd root run with chroot gives us its real slurmctld,
# slurmd, slurmrestd and client commands without touching the host's 22.05. scripts/slurm-up.sh starts a
# cluster from it when SLURM_CI_ROOT is set.
#
# Idempotent and cached: the root is built in DIR.partial and renamed to DIR only when complete, so an
# interrupted build is retried from scratch and a complete root is reused as is.
#
# Environment (all optional):
#   SLURM_ROOT_2411   where the root lives (default /var/cache/node-remediation/slurm-24.11)
#   SLURM_ROOT_MIRROR Debian mirror to bootstrap from (default: the host's first deb.debian.org-style URI)
# Needs root. Prints the root's path on its last line.
set -euo pipefail

R=${SLURM_ROOT_2411:-/var/cache/node-remediation/slurm-24.11}
R=$(realpath -m -- "$R")
MARK="$R/.node-remediation-root"

if [ -f "$MARK" ] && [ -x "$R/usr/sbin/slurmctld" ]; then
  echo "$R"
  exit 0
fi
[ "$(id -u)" = 0 ] || { echo "building the Slurm 24.11 root needs root" >&2; exit 1; }
if ! command -v debootstrap >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; }
fi
mirror=${SLURM_ROOT_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(grep -rhoE '^(URIs:|deb) +[a-z]+://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
    | awk '{print $2}' | head -1 || true)
fi
args=(--variant=minbase --include=slurmctld,slurmd,slurmrestd,slurm-client,munge trixie "$R.partial")
[ -n "$mirror" ] && args+=("$mirror")

rm -rf -- "$R.partial"
mkdir -p "$(dirname "$R")"
debootstrap "${args[@]}" >"$R.partial.log" 2>&1 || { tail -20 "$R.partial.log" >&2; exit 1; }
mv -- "$R.partial.log" "$R.partial/debootstrap.log"
chroot "$R.partial" slurmctld -V > "$R.partial/.node-remediation-root"
rm -rf -- "$R"
mv -- "$R.partial" "$R"
echo "$R"
