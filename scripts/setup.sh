#!/usr/bin/env bash
# Install everything the tests need on a Debian 12 machine, idempotently:
#   - PostgreSQL and Redis from Debian's packages, started if they are not answering, and redis-sentinel;
#   - Slurm 22.05 (slurmctld, slurmd, slurm-client, munge, slurmrestd) for the real-Slurm tests;
#   - Slurm 24.11 and 26.05 in cached Debian trixie and sid roots (scripts/slurm-root.sh), the second
#     and third real Slurm;
#   - promtool (Debian's prometheus package) for the alert-rule tests;
#   - kubectl 1.21+ (the machine's, or Debian's trixie package's binary) for the deploy tests;
#   - a Python 3.11 virtualenv in .venv with the project and its test extras.
# Safe to run again: every step checks before it acts. Needs root for the apt and service steps.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

apt_updated=0
apt_install() {
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$apt_updated" = 0 ]; then apt-get update -qq; apt_updated=1; fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# --- PostgreSQL: 127.0.0.1:5432, trust auth for local TCP, a database named "test".
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  apt_install postgresql postgresql-client
  ver=$(ls /etc/postgresql | sort -V | tail -1)
  hba=/etc/postgresql/$ver/main/pg_hba.conf
  grep -q "^host all all 127.0.0.1/32 trust" "$hba" || sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
  pg_ctlcluster --skip-systemctl-redirect "$ver" main start 2>/dev/null || pg_ctlcluster "$ver" main restart
  for _ in $(seq 1 60); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.5; done
fi
if ! psql -h 127.0.0.1 -U postgres -d postgres -tAc 'select 1' >/dev/null 2>&1; then
  ver=$(ls /etc/postgresql | sort -V | tail -1)
  hba=/etc/postgresql/$ver/main/pg_hba.conf
  sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
  runuser -u postgres -- psql -tAc 'select pg_reload_conf()' >/dev/null
fi
psql -h 127.0.0.1 -U postgres -d postgres -tAc "select 1 from pg_database where datname='test'" | grep -q 1 \
  || psql -h 127.0.0.1 -U postgres -d postgres -qc 'create database test'

# --- Redis: 127.0.0.1:6379, nothing kept on disk.
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  apt_install redis-server
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 1 50); do redis-cli ping >/dev/null 2>&1 && break; sleep 0.1; done
fi
# Debian's Sentinel, for the failover tests (they start their own primary, replica and sentinels; the
# package's own service is not used).
apt_install redis-sentinel

# --- Slurm 22.05 and munge (the real-Slurm tests start a controller from a fixture).
apt_install slurmctld slurmd slurm-client munge slurmrestd

# --- Slurm 24.11 and 26.05 in debootstrap'd trixie and sid roots, built once and reused (the tests run
# them with chroot). Each takes up to a minute or so the first time, mostly downloading: both at once.
apt_install debootstrap
bash scripts/slurm-root.sh 24.11 & root_2411=$!
bash scripts/slurm-root.sh 26.05 & root_2605=$!
wait "$root_2411" || { echo "building the Slurm 24.11 root failed" >&2; exit 1; }
wait "$root_2605" || { echo "building the Slurm 26.05 root failed" >&2; exit 1; }

# --- Debian's Chromium and its matching chromedriver, for the headless browser tests (Selenium) and
#     `remediation reliability -o pdf`, which prints the report with headless Chromium.
apt_install chromium chromium-driver

# --- promtool, for tests/unit/repo/test_alerts.py (`promtool check rules` and `promtool test rules` on
# deploy/base/prometheus-rules.yaml). Debian packages it with the Prometheus server, whose service the
# package starts on :9090 where services may start (not under a policy-rc.d that forbids it, as in
# containers); the tests use only promtool.
apt_install prometheus

# --- kubectl 1.21+, for `kubectl kustomize deploy/overlays/*` in tests/unit/repo/test_deploy.py: the machine's
# own when recent enough, else the binary of Debian's trixie package (Debian 12's kubernetes-client is 1.20,
# too old for the overlays' `patches:`), fetched with the trixie root's apt. See scripts/kubectl.sh.
bash scripts/kubectl.sh >/dev/null

# --- Python 3.11 virtualenv with the project.
bash scripts/venv.sh
echo "setup complete"
