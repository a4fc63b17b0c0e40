#!/usr/bin/env bash
# Build a minimal Debian root holding a newer Slurm than the host's, for the tests to run with chroot:
#   scripts/slurm-root.sh [24.11|26.05]   (default 24.11)
#   24.11 from Debian trixie (13); 26.05 from Debian sid, the suite that feeds forky (14).
#
# Debian 12 ships only Slurm 22.05 (end-of-life); Slurm-on-Kubernetes deployments run 23.11 to 26.x. A
# debootstrap'd root run with chroot gives us a release's real slurmctld, slurmd, slurmrestd and client
# commands without touching the host's 22.05. scripts/slurm-up.sh starts a cluster from it when
# SLURM_CI_ROOT is set.
#
# sid moves: whichever 26.05.x it holds on the day is what the root gets, and a root whose slurmctld is
# not of the release asked for is refused (a sid that moved past 26.05 fails loudly, not silently). Debian
# 12's debootstrap has no script for forky; sid's is the generic one every recent suite links to, so the
# sid root is bootstrapped by the suite name sid with that script named explicitly.
#
# Idempotent and cached: the root is built in DIR.partial and renamed to DIR only when complete, so an
# interrupted build is retried from scratch and a complete root is reused as is.
#
# Environment (all optional):
#   SLURM_ROOT_2411   where the 24.11 root lives (default /var/cache/node-remediation/slurm-24.11)
#   SLURM_ROOT_2605   where the 26.05 root lives (default /var/cache/node-remediation/slurm-26.05)
#   SLURM_ROOT_MIRROR Debian mirror to bootstrap from (default: the host's first deb.debian.org-style URI)
# Needs root. Prints the root's path on its last line.
set -euo pipefail

RELEASE=${1:-24.11}
PACKAGES=slurmctld,slurmd,slurmrestd,slurm-client,munge
case "$RELEASE" in
  24.11) SUITE=trixie; R=${SLURM_ROOT_2411:-/var/cache/node-remediation/slurm-24.11} ;;
  # 26.05's slurmrestd refuses to run as root, so it acts for root with a JWT: slurmctld needs auth/jwt.
  26.05) SUITE=sid; R=${SLURM_ROOT_2605:-/var/cache/node-remediation/slurm-26.05}; PACKAGES+=,slurm-wlm-jwt-plugin ;;
  *) echo "unknown Slurm release '$RELEASE' (24.11 or 26.05)" >&2; exit 2 ;;
esac
R=$(realpath -m -- "$R")
MARK="$R/.node-remediation-root"
# The packages a root was built with: a root missing one asked for now is built again.
PACKED="$R/.node-remediation-packages"

# The mark holds `slurmctld -V` ("slurm-wlm 26.05.5" or "slurm 24.11.5"): its release must be the one asked for.
release_of() { awk '{print $2}' "$1" | cut -d. -f1,2; }
if [ -f "$MARK" ] && [ -x "$R/usr/sbin/slurmctld" ] && [ "$(release_of "$MARK")" = "$RELEASE" ] \
  && { [ "$RELEASE" = 24.11 ] || [ "$(cat "$PACKED" 2>/dev/null)" = "$PACKAGES" ]; }; then
  echo "$R"
  exit 0
fi
[ "$(id -u)" = 0 ] || { echo "building the Slurm $RELEASE root needs root" >&2; exit 1; }
# An outdated root still in use (its proc, sys, a cluster's directory bind-mounted) must not be removed
# under a running cluster: say so instead.
if awk -v r="$R/" 'index($2 "/", r) == 1 {found=1} END {exit !found}' /proc/mounts; then
  echo "$R must be rebuilt but is in use: stop its clusters (scripts/slurm-down.sh), its munged, and" \
    "unmount what is mounted under it (grep $R /proc/mounts)" >&2
  exit 1
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; }
fi
mirror=${SLURM_ROOT_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(grep -rhoE '^(URIs:|deb) +[a-z]+://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
    | awk '{print $2}' | head -1 || true)
fi
script=/usr/share/debootstrap/scripts/sid
[ -f "$script" ] || { echo "debootstrap has no suite script at $script" >&2; exit 1; }
args=(--variant=minbase "--include=$PACKAGES" "$SUITE" "$R.partial")
# The suite script comes after the mirror; with no mirror known, debootstrap's default mirror and its own
# script of that name.
[ -n "$mirror" ] && args+=("$mirror" "$script")

rm -rf -- "$R.partial"
mkdir -p "$(dirname "$R")"
debootstrap "${args[@]}" >"$R.partial.log" 2>&1 || { tail -20 "$R.partial.log" >&2; exit 1; }
mv -- "$R.partial.log" "$R.partial/debootstrap.log"
chroot "$R.partial" slurmctld -V > "$R.partial/.node-remediation-root"
echo "$PACKAGES" > "$R.partial/.node-remediation-packages"
got=$(release_of "$R.partial/.node-remediation-root")
if [ "$got" != "$RELEASE" ]; then
  echo "Debian $SUITE now ships Slurm $(awk '{print $2}' "$R.partial/.node-remediation-root"), not $RELEASE.x;" \
    "the root is left in $R.partial" >&2
  exit 1
fi
rm -rf -- "$R"
mv -- "$R.partial" "$R"
echo "$R"
