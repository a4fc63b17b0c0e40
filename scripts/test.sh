#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite against real Postgres, Redis, Celery workers
# and a real slurmctld. Extra arguments go to pytest.
#
# The suite runs on REMEDIATION_TEST_WORKERS pytest-xdist workers (default 6; 0 = one process), a test
# module per worker at a time (--dist loadscope: a module's fixtures and processes are started once).
# Most tests wait on real processes and timeouts rather than compute: the whole run keeps about 1.1 of
# two cores busy at four workers, so six fit two cores.
#
# CI=true: setup.sh has installed every binary a test needs (redis-server, initdb, kubectl...), so a
# test that cannot find one fails here, as in CI, instead of being skipped (tests/infra.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export CI=true
exec .venv/bin/python -m pytest -n "${REMEDIATION_TEST_WORKERS:-6}" --dist loadscope "$@"
