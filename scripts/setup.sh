#!/usr/bin/env bash
# Idempotent setup for the study and the tests; both scripts/study.sh and scripts/test.sh call it.
#   1. System packages (Debian, as root): WeasyPrint's Pango/HarfBuzz, poppler-utils (pdftotext/pdftoppm for
#      the memo tests), slurm-wlm + munge (the real-Slurm test). Skipped when already installed; without
#      root it only says what is missing.
#   2. The venv .venv: torch 2.13.0 CPU wheel FIRST (a plain `pip install torch` pulls a multi-GB CUDA build),
#      then the package with the extras named in $TRAINPLAN_EXTRAS. Redone when pyproject.toml changes.
#      TRAINPLAN_TORCH=cuda installs PyPI's CUDA build of torch 2.13.0 instead: for GPU proxies
#      (`proxies.device: cuda`, run by the jobs of `snakemake --profile slurm` with this venv's interpreter, so
#      create it on a path the compute nodes share, with a Python they have too). Unset, it keeps the flavour
#      the venv has (TRAINPLAN_TORCH=cpu switches a CUDA venv back).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=${TRAINPLAN_EXTRAS:-dev,workflow,launch}
stamp=.venv/.trainplan-setup
# unset: the flavour this venv was set up with (a CUDA venv stays CUDA through study.sh / test.sh), else cpu
TORCH=${TRAINPLAN_TORCH:-$( { [ -f "$stamp" ] && sed -n 's/.* torch-\([a-z]*\)$/\1/p' "$stamp"; } || true)}
TORCH=${TORCH:-cpu}
case "$TORCH" in
  cpu|cuda) ;;
  *) echo "setup: TRAINPLAN_TORCH=$TORCH: valid: cpu (default), cuda" >&2; exit 2 ;;
esac

# g++ and python3-dev: torch.compile's CPU backend (Inductor), which tests/unit/model/test_memory.py runs
pkgs=(libpango-1.0-0 libpangoft2-1.0-0 libharfbuzz0b libharfbuzz-subset0 fonts-dejavu-core shared-mime-info
      poppler-utils slurm-wlm munge python3-venv g++ python3-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  else
    echo "setup: missing system packages (install them as root): ${missing[*]}" >&2
  fi
fi

want="$(cat pyproject.toml envs/*.yaml | sha256sum | cut -c1-16) $EXTRAS torch-$TORCH"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  cuda() { .venv/bin/python -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)' 2>/dev/null; }
  if [ "$TORCH" = cuda ]; then
    # PyPI's Linux torch==2.13.0 is the CUDA build; a CPU build left by an earlier setup is replaced
    if ! cuda; then .venv/bin/pip uninstall -q -y torch 2>/dev/null || true; fi
    .venv/bin/pip install -q --index-url https://pypi.org/simple torch==2.13.0
    if ! cuda; then echo "setup: TRAINPLAN_TORCH=cuda but pip installed a torch without CUDA" >&2; exit 1; fi
  else
    # the CPU wheel: from the local wheel folder where there is one, else PyTorch's CPU index (PyPI's Linux
    # torch==2.13.0 is the CUDA build); a CUDA build left by an earlier attempt is replaced, not kept
    if [ -d /opt/wheels ]; then src=(--find-links /opt/wheels)
    else src=(--index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple); fi
    if cuda; then .venv/bin/pip uninstall -q -y torch; fi
    .venv/bin/pip install -q "${src[@]}" torch==2.13.0
    if cuda; then
      echo "setup: pip installed a CUDA build of torch; install torch==2.13.0+cpu into .venv by hand" >&2; exit 1
    fi
  fi
  # the versions envs/*.yaml pin (tests/unit/package/test_envs.py holds them to what is installed): a fresh setup
  # installs those, not whatever the index holds that day (a fresh CI setup on 2026-12-07 got pandas 3.1.2 against the 3.1.1 pin)
  grep -hoE '^\s+- [A-Za-z0-9_.-]+==[^ #]+' envs/*.yaml | sed -E 's/^\s+- //' | grep -v '^torch==' | sort -u \
    > .venv/pins.txt
  .venv/bin/pip install -q -c .venv/pins.txt -e ".[$EXTRAS]"
  echo "$want" > "$stamp"
fi
