#!/usr/bin/env bash
# Set up a Python 3.11 virtualenv (no servers needed) and run the embedded demo: SQLite, an in-process
# broker and a simulated cluster. Extra arguments go to `remediation demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh
exec .venv/bin/remediation demo "$@"
