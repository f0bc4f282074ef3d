#!/usr/bin/env bash
# GPU proxy runs for calibration (DESIGN §2–3): select the proxy set, run each with `trainplan proxy`, and
# write the RECORDs + an environment JSON where calibration picks them up (calibration.gpu_records_dir).
#
#   bash scripts/device_proxies.sh --dry-run                 # list the runs, run nothing (works on CPU)
#   bash scripts/device_proxies.sh --budget-s 480            # on a CUDA machine: run until the budget is spent
#   bash scripts/device_proxies.sh --out /tmp/gpu --config my_overlay.yaml   # overlays on the two below (repeatable)
#
# What runs (config/config.yaml + config/gpu_proxies.yaml [+ --config overlays], via
# trainplan.proxy.select.select_proxies):
#   depth slice   Llama-2-13B widths, 1–4 layers, seq 4096, one GPU
#   width ladder  hidden 1280…5120 at 2 layers, one GPU
#   seq ladder    2 layers at calibration.gpu_seq_ladder (same tokens per step): separates attn_eff
#   LoRA pair     lora-L2: depth-L2 with LoRA adapters (training.lora_rank on training.lora_targets; the defaults
#                 are the LoRA study's r16 on q, k, v, o): against depth-L2 it measures what the adapters cost and
#                 what the frozen base saves (docs/timing-model.md §8.1)
#   scale-out     2 layers, FSDP full shard on 1, 2, 4, 8 GPUs (capped at the GPUs present): comm_bw_eff
# Runs are interleaved across families, so a budget cut leaves every family represented; a run that would
# start after the budget is skipped (listed in environment.json). Each run's `timeout_s` is capped at the
# time left, so the harness records an overrun as status `timeout` instead of being killed.
# Output (default data/calibration/gpu/): <id>.json (RECORD), <id>.spec.json, <id>.log, <id>.nvsmi.csv
# (nvidia-smi memory.used samples during the run), environment.json (nvidia-smi, torch/CUDA/NCCL versions,
# what ran and what was skipped). Exit 0 when every started run produced a record.
# First, unless --no-microbench, the microbenchmarks (docs/timing-model.md §7.4, §7.11–7.12, §7.14), into
# <out>/microbench/ with their logs, each capped at a third of the budget, which their time then leaves, in this
# order: benchmarks/bench_ring_attention.py (one rank of torch's ring attention on a fake CP group vs its flash
# kernels, §7.4: the one measurement the held-out CP bias still waits on, so it runs first),
# benchmarks/bench_flex_attention.py (FlexAttention, which every torchtitan launch attends with, against FA2 per
# score pair: causal, per-document, one rank of the all-gather CP; §7.17), benchmarks/bench_hbm_stream.py (HBM stream rates) and benchmarks/bench_bf16_step.py (the production precision
# regime), which the GPU check reads, and benchmarks/bench_optimizer_step.py (AdamW for-loop / foreach / fused on
# FSDP2 shards, one rank). `--microbench ring_attention` runs only the named ones (comma list), in that order.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="data/calibration/gpu"
BUDGET_S=480
DRY=0
MICRO=1
BENCHES="ring_attention,flex_attention,hbm_stream,bf16_step,optimizer_step"
CONFIGS=("config/config.yaml" "config/gpu_proxies.yaml")
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --budget-s) BUDGET_S="$2"; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --no-microbench) MICRO=0; shift ;;
    --microbench) BENCHES="$2"; shift 2 ;;
    --config) CONFIGS+=("$2"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "device_proxies.sh: unknown argument '$1' (valid: --out DIR, --budget-s N, --dry-run, --no-microbench, --microbench LIST, --config YAML)" >&2
       exit 2 ;;
  esac
done
if ! [[ "$BUDGET_S" =~ ^[0-9]+$ ]] || (( BUDGET_S < 1 )); then
  echo "device_proxies.sh: --budget-s=$BUDGET_S: must be a positive integer (seconds)" >&2
  exit 2
fi
IFS=',' read -r -a BENCH_LIST <<< "$BENCHES"
for bench in "${BENCH_LIST[@]}"; do
  case "$bench" in
    ring_attention|flex_attention|hbm_stream|bf16_step|optimizer_step) ;;
    *) echo "device_proxies.sh: --microbench=$BENCHES: unknown benchmark '$bench' (valid: comma list of ring_attention, flex_attention, hbm_stream, bf16_step, optimizer_step)" >&2
       exit 2 ;;
  esac
done

cd "$ROOT"
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"; else PY="python3"; fi
fi
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"

if (( MICRO )) && (( ! DRY )) && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  MICRO=0  # no CUDA: the proxy plan below says so and stops; nothing is written
fi
# the benchmarks' spec figures default to an H200 (4.8 TB/s); on an H100 they are told so (3.35 TB/s, its model figures)
GPU_ARGS_RING=() GPU_ARGS_HBM=()
if (( MICRO )) && (( ! DRY )); then
  case "$("$PY" -c 'import torch; print(torch.cuda.get_device_name())' 2>/dev/null || true)" in
    *H100*) GPU_ARGS_RING=(--gpu h100-sxm-80gb); GPU_ARGS_HBM=(--hbm-tbps 3.35) ;;
  esac
fi
if (( MICRO )); then
  for bench in "${BENCH_LIST[@]}"; do
    cmd=("$PY" "benchmarks/bench_$bench.py" --out "$OUT/microbench/$bench.json")
    case "$bench" in
      ring_attention) cmd+=("${GPU_ARGS_RING[@]}") ;;
      hbm_stream|optimizer_step) cmd+=("${GPU_ARGS_HBM[@]}") ;;
    esac
    if (( DRY )); then
      echo "microbench: ${cmd[*]} [dry run: not run]"
      continue
    fi
    mkdir -p "$OUT/microbench"
    start=$SECONDS
    if timeout "$(( BUDGET_S / 3 ))" "${cmd[@]}" > "$OUT/microbench/$bench.log" 2>&1; then
      echo "microbench: $bench.json ($(( SECONDS - start )) s)"
    else
      echo "microbench: $bench failed or ran out of time (exit $?); see $OUT/microbench/$bench.log" >&2
    fi
    BUDGET_S=$(( BUDGET_S - (SECONDS - start) ))
  done
  (( BUDGET_S >= 1 )) || BUDGET_S=1
fi

exec "$PY" - "$OUT" "$BUDGET_S" "$DRY" "${CONFIGS[@]}" <<'PYEOF'
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd

from trainplan.config import load_config
from trainplan.io import write_json
from trainplan.proxy.schema import normalize_run_spec
from trainplan.proxy.select import select_proxies
from trainplan.proxy.torchrun import alloc_conf

out, budget_s, dry, configs = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1", sys.argv[4:]
t0 = time.monotonic()


def sh(*cmd: str) -> str:
    """stdout of a command, or '' if it is missing or fails (the environment is recorded, never required)."""
    if shutil.which(cmd[0]) is None:
        return ""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def gpu_count() -> int:
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception:  # noqa: BLE001 - no torch/CUDA here: dry runs still list the plan
        return len([ln for ln in sh("nvidia-smi", "-L").splitlines() if ln.startswith("GPU ")])


cfg = load_config(configs)
n_gpus = gpu_count()
if not dry and n_gpus < 1:
    sys.exit("device_proxies.sh: no CUDA GPU found (torch.cuda.device_count() = 0); use --dry-run to list the plan")
avail = max(n_gpus, 1)
prox = dict(cfg.proxies)
# 1-GPU layouts for the depth slice and width ladder: one feasible candidate, pure data parallel on one rank.
one = pd.DataFrame([{"dp": 1, "tp": 1, "pp": 1, "cp": 1, "sp": False, "sharding": "none", "recompute": "none",
                     "offload": "none", "micro_batch": 1, "family": "DDP", "feasible": True, "rank": 1}])
fams = [f for f in prox.get("families", []) if f in ("depth", "width")]
specs = select_proxies(one, cfg.model, cfg.training, {**prox, "families": fams, "nproc_per_node": 1, "max_proxies": None})
# Sequence ladder: 2 layers at several sequence lengths, tokens per step held at global_batch × seq_len.
base_tokens = int(prox.get("global_batch", 8)) * int(prox.get("seq_len", 4096))
seq_specs, lora_specs = [], []
if specs:
    tmpl = next((s for s in specs if s["family"] == "width" and s["model"]["hidden"] == cfg.model.hidden), specs[0])
    for S in (cfg.calibration or {}).get("gpu_seq_ladder", []):
        S = int(S)
        if S == int(prox.get("seq_len", 4096)):
            continue  # the depth slice already has the production length
        model = replace(cfg.model, layers=2, max_seq_len=max(S, cfg.model.max_seq_len), name=f"{cfg.model.name}-L2-s{S}")
        seq_specs.append({**tmpl, "id": f"seq-s{S}", "family": "layout", "model": model.to_dict(), "seq_len": S,
                          "global_batch": max(1, base_tokens // S)})
    # LoRA pair: the same 2-layer production-width slice with adapters on the frozen base (timing-model.md §8.1).
    tr = cfg.training
    lora_specs.append({**tmpl, "id": f"lora-L2-r{tr.lora_rank}", "family": "layout", "finetune": "lora",
                       "lora_rank": int(tr.lora_rank), "lora_targets": list(tr.lora_targets)})
scale = []
if "scaleout" in prox.get("families", []):
    sizes = [int(n) for n in prox.get("scaleout_world_sizes", [1]) if int(n) <= avail]
    scale = select_proxies(one, cfg.model, cfg.training, {**prox, "families": ["scaleout"], "nproc_per_node": 1,
                                                            "scaleout_world_sizes": sizes, "max_proxies": None})
# Interleave the families so a budget cut leaves each represented.
queues = [q for q in ([s for s in specs if s["family"] == "depth"], [s for s in specs if s["family"] == "width"],
                      seq_specs, lora_specs, scale) if q]
plan = []
while any(queues):
    for q in queues:
        if q:
            plan.append(q.pop(0))
plan = [normalize_run_spec(s) for s in plan]  # a bad spec fails here, before anything runs
seen, unique = set(), []
for s in plan:  # e.g. width-h5120 at 2 layers is depth-L2: run it once
    shape = {**s["model"], "name": None}
    key = json.dumps([shape] + [s[k] for k in ("layout", "seq_len", "global_batch", "nproc_per_node", "finetune",
                                                "lora_rank", "lora_targets")], sort_keys=True)
    if key not in seen:
        seen.add(key)
        unique.append(s)
plan = unique

print(f"device_proxies: {len(plan)} runs, budget {budget_s:.0f} s, {n_gpus} GPU(s) found, out {out}"
      + (" [dry run]" if dry else ""))
for s in plan:
    m, lay = s["model"], s["layout"]
    print(f"  {s['id']:<14} {s['family']:<8} layers={m['layers']:<2} hidden={m['hidden']:<5} heads={m['heads']:<3} "
          f"ffn={m['ffn_hidden']:<6} seq={s['seq_len']:<6} gb={s['global_batch']:<3} ranks={s['nproc_per_node']} "
          f"dp={lay['dp']} sharding={lay['sharding']} {s['device']}/{s['dtype']} steps={s['steps']}"
          + (f" lora r{s['lora_rank']} {','.join(s['lora_targets'])}" if s["finetune"] == "lora" else ""))
if dry:
    sys.exit(0)

out.mkdir(parents=True, exist_ok=True)
ran, skipped, failed = [], [], []
for s in plan:
    left = budget_s - (time.monotonic() - t0)
    if left < 30:  # not enough for start-up and a few steps
        skipped.append({"id": s["id"], "why": f"budget: {left:.0f} s left of {budget_s:.0f}"})
        continue
    s = {**s, "timeout_s": int(max(20, min(int(s["timeout_s"]), left - 10)))}
    spec_path, rec_path = out / f"{s['id']}.spec.json", out / f"{s['id']}.json"
    write_json(spec_path, s)
    smi = None
    if shutil.which("nvidia-smi"):
        smi_out = open(out / f"{s['id']}.nvsmi.csv", "w")
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                "-i", "0", "-lms", "200"], stdout=smi_out, stderr=subprocess.DEVNULL,
                               stdin=subprocess.DEVNULL)
    t = time.monotonic()
    with open(out / f"{s['id']}.log", "w") as log:
        rc = subprocess.run([sys.executable, "-m", "trainplan.proxy.command", str(spec_path), "--out", str(rec_path)],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    if smi is not None:
        smi.terminate()
        smi.wait()
        smi_out.close()
    status = json.loads(rec_path.read_text()).get("status") if rec_path.exists() else "no record"
    entry = {"id": s["id"], "rc": rc, "status": status, "wall_s": round(time.monotonic() - t, 1)}
    (ran if rec_path.exists() else failed).append(entry)
    print(f"  {s['id']}: {status} (rc {rc}, {entry['wall_s']} s; {time.monotonic() - t0:.0f}/{budget_s:.0f} s)", flush=True)

try:
    import torch

    tv = {"torch_version": torch.__version__, "cuda_version": torch.version.cuda,
          "cudnn_version": torch.backends.cudnn.version(),
          "nccl_version": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
          "device_names": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
except Exception as e:  # noqa: BLE001
    tv = {"torch_error": f"{type(e).__name__}: {e}"}
env = {"configs": configs, "budget_s": budget_s, "elapsed_s": round(time.monotonic() - t0, 1), "gpus_found": n_gpus,
       "nvidia_smi": sh("nvidia-smi", "--query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm",
                        "--format=csv"),
       "nvidia_smi_topo": sh("nvidia-smi", "topo", "-m"), **tv,
       "git_commit": sh("git", "rev-parse", "HEAD"), "hostname": os.uname().nodename,
       "alloc_conf": alloc_conf(os.environ),  # the caching allocator's settings (None: torch's defaults)
       "ran": ran, "skipped": skipped, "failed": failed}
write_json(out / "environment.json", env)
print(f"device_proxies: {len(ran)} records, {len(skipped)} skipped (budget), {len(failed)} without a record -> {out}")
sys.exit(1 if failed else 0)
PYEOF
