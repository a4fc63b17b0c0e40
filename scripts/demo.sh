#!/usr/bin/env bash
# Set up a Python 3.11 virtualenv (no servers needed) and run the embedded demo: SQLite, an in-process
# broker and a simulated cluster. Extra arguments go to `remediation demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[test]'
  rm -f .venv/.installed-*; touch "$stamp"
fi
exec .venv/bin/remediation demo "$@"
