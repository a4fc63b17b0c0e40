#!/usr/bin/env bash
# Make sure the kubectl on PATH is 1.21 or newer, for `kubectl kustomize` in tests/unit/repo/test_deploy.py.
#
# Debian 12's only package, kubernetes-client, is kubectl 1.20, whose embedded kustomize (v2.0.3) cannot
# read the `patches:` field the overlays use. A machine's own kubectl is used when it is recent enough.
# Otherwise Debian's trixie `kubectl` package is fetched with the apt of the trixie root that
# scripts/slurm-root.sh builds (so nothing but Debian's own archive is needed, and the host's apt sources
# stay as they are), and its binary is installed as KUBECTL_DEST/kubectl. The binary needs only glibc
# 2.34, which Debian 12 has; the script runs it before it reports success.
#
# Environment (all optional):
#   KUBECTL_DEST   where the trixie kubectl goes (default /usr/local/bin, ahead of /usr/bin on PATH)
#   SLURM_ROOT_2411 the trixie root (see scripts/slurm-root.sh)
# Idempotent. Needs root only when it installs. Prints the kubectl it settled on, on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${KUBECTL_DEST:-/usr/local/bin}

recent() {  # true when kubectl $1 runs and its client is 1.21 or newer ("minor": "32+" counts as 32)
  local json major minor
  json=$("$1" version --client -o json 2>/dev/null) || return 1
  major=$(sed -n 's/.*"major": *"\([0-9]*\).*/\1/p' <<<"$json" | head -1)
  minor=$(sed -n 's/.*"minor": *"\([0-9]*\).*/\1/p' <<<"$json" | head -1)
  [ -n "$major" ] && [ -n "$minor" ] && { [ "$major" -gt 1 ] || { [ "$major" -eq 1 ] && [ "$minor" -ge 21 ]; }; }
}

on_path() { command -v kubectl 2>/dev/null || true; }

have=$(on_path)
if [ -n "$have" ] && recent "$have"; then
  echo "$have"
  exit 0
fi
if ! { [ -x "$DEST/kubectl" ] && recent "$DEST/kubectl"; }; then
  [ "$(id -u)" = 0 ] || { echo "installing kubectl needs root" >&2; exit 1; }
  root=$(bash scripts/slurm-root.sh | tail -1)
  work=$(mktemp -d -p "$root/tmp" kubectl.XXXXXX)
  trap 'rm -rf -- "$work"' EXIT
  inside() { chroot "$root" /usr/bin/env PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }  # not the host's PATH
  fetch() { inside sh -c "cd /tmp/${work##*/} && apt-get -qq -o APT::Sandbox::User=root download kubectl"; }
  # The root's package lists date from when it was built: refresh them once if the version they name
  # has left the archive.
  fetch >/dev/null 2>&1 || { inside apt-get -qq update >/dev/null && fetch >/dev/null; }
  dpkg-deb -x "$work"/kubectl_*.deb "$work/pkg"
  mkdir -p "$DEST"
  install -m 0755 "$work/pkg/usr/bin/kubectl" "$DEST/kubectl.new"
  mv -f -- "$DEST/kubectl.new" "$DEST/kubectl"
  recent "$DEST/kubectl" || { echo "$DEST/kubectl from Debian's trixie does not run here" >&2; exit 1; }
fi
have=$(on_path)
if [ "$have" != "$DEST/kubectl" ] && ! { [ -n "$have" ] && recent "$have"; }; then
  echo "kubectl on PATH is ${have:-missing}, too old for the overlays; put $DEST ahead of it on PATH" >&2
  exit 1
fi
echo "$DEST/kubectl"
