#!/usr/bin/env bash
# Set up (once) and run the test suite (what CI runs via .ci/run): unit + property tests, real 2-rank
# torchrun proxies, the end-to-end workflow, and a real one-node Slurm (needs root, slurm-wlm, munge).
# Extra arguments go to pytest, e.g.  ./scripts/test.sh -m "not slow". It prints the 25 slowest tests (where CI time goes).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m pytest -q --timeout=900 --durations=25 "$@"
