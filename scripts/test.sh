#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite against real Postgres, Redis, Celery workers
# and a real slurmctld. Extra arguments go to pytest (then the selection runs as one pytest process).
#
# Without arguments the suite runs as two pytest processes side by side: most of its time is spent
# waiting on real servers (slurmctld's SlurmdTimeout, VM reboots, Celery workers), so one core sits
# idle in a single process. The tests that drive a real slurmctld form one half; everything else the
# other. Each half has its own session fixtures (its own Slurm clusters, databases, key prefixes), and
# the run fails if either half fails. The timing-sensitive tests are checked under load by
# scripts/flake-check.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
SLURM_HALF=(tests/integration/slurm tests/reliability/test_never_worse.py tests/reliability/test_systemic.py)
log=$(mktemp -t remediation-tests-slurm.XXXXXX)
trap 'rm -f "$log"' EXIT
.venv/bin/python -m pytest -p no:cacheprovider "${SLURM_HALF[@]}" >"$log" 2>&1 &
slurm_pid=$!
rest=0
ignores=()
for path in "${SLURM_HALF[@]}"; do ignores+=(--ignore="$path"); done
.venv/bin/python -m pytest -p no:cacheprovider "${ignores[@]}" tests || rest=$?
slurm=0
wait "$slurm_pid" || slurm=$?
echo
echo "=== the real-Slurm half (${SLURM_HALF[*]}) ==="
cat "$log"
echo "suite: the rest exited $rest, the real-Slurm half exited $slurm"
[ "$rest" -eq 0 ] && [ "$slurm" -eq 0 ]
