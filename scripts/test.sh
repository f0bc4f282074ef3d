#!/usr/bin/env bash
# The test suite (what CI runs): unit + property tests, slow end-to-end workflow, real local Slurm (root).
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m pytest -q --timeout=900 "$@"
