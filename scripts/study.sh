#!/usr/bin/env bash
# Set up (once) and run the whole study locally → results/memo/design_memo.pdf.
# Extra arguments go to snakemake, e.g.  ./scripts/study.sh --configfile config/lora.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh  # the same extras as test.sh, so switching between them installs nothing
exec .venv/bin/snakemake --cores "${CORES:-2}" "$@"
