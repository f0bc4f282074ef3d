#!/usr/bin/env bash
# Set up (once) and run the whole study locally → results/memo/design_memo.pdf.
# Extra arguments go to snakemake, e.g.  ./scripts/study.sh --configfile config/lora.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
# a --configfile that does not exist: one line here, not Snakemake's traceback (its --configfile takes every
# argument up to the next option, so all of those are checked)
files=0
for a in "$@"; do
  case "$a" in
    --configfile=*|--configfiles=*) f=${a#*=}; [ -f "$f" ] || { echo "study: --configfile $f: no such file" >&2; exit 2; }; files=0 ;;
    --configfile|--configfiles) files=1 ;;
    -*) files=0 ;;
    *) if [ "$files" = 1 ] && [ ! -f "$a" ]; then echo "study: --configfile $a: no such file" >&2; exit 2; fi ;;
  esac
done
./scripts/setup.sh  # the same extras as test.sh, so switching between them installs nothing
exec .venv/bin/snakemake --cores "${CORES:-2}" "$@"
