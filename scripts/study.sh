#!/usr/bin/env bash
# Set up the venv (once) and run the study locally: results/memo/design_memo.pdf.
# Extra arguments go to snakemake, e.g.  ./scripts/study.sh --configfile config/lora.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/snakemake ]; then
  python3 -m venv .venv
  .venv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu || .venv/bin/pip install torch==2.13.0
  .venv/bin/pip install -e '.[workflow,launch]'
fi
exec .venv/bin/snakemake --cores "${CORES:-2}" "$@"
