"""The ``trainplan`` command: parse the command line, run one subcommand module.

Each subcommand is a module, imported by name when it runs (``COMMANDS``): ``trainplan estimate`` loads only the
analytic core (numpy) and answers in well under a second; ``proxy`` (torch), ``launch``, ``preflight`` and
``ingest`` parse their own arguments. Bad input becomes ONE line on stderr, ``trainplan: error: <key>=<value>:
<what is valid>``, exit code 2, no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from trainplan.commands.common import clean, fmt
from trainplan.model.base import ConfigError

__all__ = ["main"]

# subcommand → module whose run(args) it calls (args parsed here)
COMMANDS = {"plan": "trainplan.commands.plan", "estimate": "trainplan.commands.estimate",
            "validate": "trainplan.commands.validate"}
DELEGATED = {"proxy": ("trainplan.proxy.command", "run one proxy training job (see `trainplan proxy --help`)"),
             "launch": ("trainplan.launch.artifacts", "write Accelerate/torchrun/sbatch launch artifacts"),
             "preflight": ("trainplan.launch.preflight", "one-node preflight check before the real run"),
             "ingest": ("trainplan.launch.ingest", "a trainer's step log -> a calibration record (and day-1 checks)")}
ARCH_HELP = ("architecture k=v,...: layers, hidden, heads, vocab (all four needed without --model); kv_heads, ffn, "
             "head_dim (when not hidden/heads), max_seq (context window; omitted without --model = no cap), "
             "norms (norms per block, default 2), mlp (swiglu|gelu), norm (rmsnorm|layernorm), "
             "pos (rope|learned|alibi), bias (none|qkv|mlp|o_mlp|all), tied (true|false), qk_norm (true|false), "
             "qk_norm_scope (head|full|each_head: per head, Qwen3; whole q and k, OLMo 2; per head with its own weights, "
             "Command R+), "
             "norm_bias (true|false: LayerNorm bias, default true; MPT: false), pos_offset (extra learned position rows; "
             "OPT: 2), head_bias (true|false: a biased LM head, GPT-J, Phi-2), embed_norm (true|false: a norm after the "
             "token embedding, BLOOM). "
             "GPT-2 small: layers=12,hidden=768,heads=12,vocab=50257,mlp=gelu,norm=layernorm,pos=learned,"
             "bias=all,tied=true,max_seq=1024")
class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"trainplan: error: {clean(message, 400)}\n")
        raise SystemExit(2)


# ---------------------------------------------------------------------------------------------- main
def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="trainplan", description="Plan, prove and cost a distributed LLM fine-tune.",
                formatter_class=argparse.RawDescriptionHelpFormatter,
                epilog="example:\n  trainplan estimate --model llama2-13b --gpus 32 --tp 2 --sp --json")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    raw = argparse.RawDescriptionHelpFormatter
    pl = sub.add_parser("plan", help="rank every layout for a study config", formatter_class=raw,
                        epilog="example:\n  trainplan plan config/config.yaml --top 10 --csv candidates.csv\n"
                               "  trainplan plan config/config.yaml config/lora.yaml   # a variant: the overlay last")
    pl.add_argument("config", nargs="*", default=None,
                    help="study config YAML (default: the embedded default study, config/config.yaml of the "
                         "repository); several files are deep-merged in order, later over earlier, as Snakemake "
                         "layers --configfile over config/config.yaml")
    pl.add_argument("--top", type=int, default=10, help="how many layouts to show (default 10)")
    pl.add_argument("--csv", help="also write every candidate to this CSV")
    es = sub.add_parser("estimate", help="memory and throughput of one layout", formatter_class=raw,
                        epilog="example:\n  trainplan estimate --model llama2-13b --gpu h100-sxm-80gb --gpus 32 "
                               "--seq-len 4096 --global-batch 256 --tp 2 --sp --recompute selective --json")
    es.add_argument("--model", help="preset name (llama2-13b, ...), a Hugging Face config.json path, or a Hugging Face "
                                    "repo id (org/name) whose config.json is in the local Hugging Face cache (read "
                                    "there, never downloaded)")
    es.add_argument("--arch", help=ARCH_HELP + " (with --model: overrides of that model)")
    es.add_argument("--gpu", default="h100-sxm-80gb", help="GPU name (default h100-sxm-80gb)")
    es.add_argument("--gpus", type=int, default=32, help="total GPUs (default 32)")
    es.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8, at most 128)")
    es.add_argument("--intra-busbw", type=float, default=None, metavar="GBPS",
                    help="NCCL busbw inside a node, GB/s per GPU (= cluster.intra_busbw_GBps; default 360: 8×H100 "
                         "NVLink4, nccl-tests; set your cluster's for other GPUs)")
    es.add_argument("--inter-busbw", type=float, default=None, metavar="GBPS",
                    help="NCCL busbw across nodes, GB/s per GPU rail (= cluster.inter_busbw_GBps; default 46: 400G "
                         "InfiniBand)")
    es.add_argument("--host-bw", type=float, default=None, metavar="GBPS",
                    help="host↔GPU bandwidth each way, GB/s (= cluster.host_to_device_GBps; default 50: PCIe Gen5 "
                         "x16; CPU offload)")
    es.add_argument("--seq-len", type=int, default=4096,
                    help="tokens per sequence (above the model's max_seq_len: a warning, as with RoPE scaling)")
    es.add_argument("--micro-batch", default="auto",
                    help="sequences per rank per forward, or auto (default): the fastest that fits, of the powers of "
                         "two dividing the local batch (global batch / dp) and the local batch itself")
    es.add_argument("--global-batch", type=int, default=256, help="sequences per optimizer step")
    es.add_argument("--tp", type=int, default=1)
    es.add_argument("--pp", type=int, default=1)
    es.add_argument("--cp", type=int, default=1)
    es.add_argument("--sp", action="store_true", help="sequence parallelism (needs --tp > 1)")
    es.add_argument("--tp-overlap", action="store_true",
                    help="overlap TP communication with GEMMs: torchtitan async TP (--kernels compiled) or Megatron "
                         "--tp-comm-overlap (--kernels fused); needs --tp > 1")
    es.add_argument("--pp-schedule", default="1f1b", help="1f1b | interleaved")
    es.add_argument("--vpp", type=int, default=1, help="virtual stages per rank (interleaved)")
    es.add_argument("--cp-kind", default="ring", help="ring | ulysses")
    es.add_argument("--sharding", default="zero3", help="none | zero1 | zero2 | zero3 | hsdp")
    es.add_argument("--shard-group", type=int, default=None, help="hsdp shard group size (default GPUs per node, at most dp·cp)")
    es.add_argument("--recompute", default="none", help="none | selective | full")
    es.add_argument("--offload", default="none", help="none | cpu")
    es.add_argument("--finetune", default="full", help="full | lora | qlora")
    es.add_argument("--lora-rank", type=int, default=None,
                    help="LoRA rank, as training.lora_rank (default 16; lora/qlora only)")
    es.add_argument("--lora-targets", default=None, metavar="LIST",
                    help="comma-separated projections with adapters, as training.lora_targets (default q,k,v,o; of "
                         "q, k, v, o, gate, up, down; lora/qlora only)")
    es.add_argument("--precision", default="bf16", choices=("bf16", "fp8-tensorwise", "fp8-rowwise", "fp32"),
                    help="as training.precision: bf16 mixed precision (default), the block linears' GEMMs in FP8 "
                         "(torchao tensorwise / rowwise recipes; H100/H200 only), or fp32")
    es.add_argument("--kernels", default="eager", choices=("eager", "compiled", "fused"),
                    help="elementwise kernels, as training.kernels in the study config: eager (PyTorch eager, "
                         "default), compiled (torch.compile), fused (Megatron / Transformer Engine)")
    es.add_argument("--attn-impl", default="flash", choices=("flash", "math"),
                    help="attention core, as training.attn_impl: flash (default) or math (materialised scores)")
    es.add_argument("--attn-kernel", default="fa2", choices=("fa2", "cudnn"),
                    help="flash kernel, as training.attn_kernel: fa2 (FlashAttention-2, default) or cudnn (cuDNN "
                         "attention, measured 1.70x FA2 on an H200; H100/H200 only)")
    es.add_argument("--optimizer-impl", default="fused", choices=("fused", "foreach"),
                    help="AdamW kernels, as training.optimizer_impl: fused (torch AdamW fused=True, default; "
                         "torchtitan, Megatron, DeepSpeed) or foreach (PyTorch's multi-tensor default)")
    es.add_argument("--json", action="store_true", help="print the estimate as JSON")
    va = sub.add_parser("validate", help="predicted vs published tables, MAPE per table", formatter_class=raw,
                        epilog="example:\n  trainplan validate --csv validation.csv\n  trainplan validate --heldout\n"
                               "  trainplan validate --h100-peak-tflops 835\n"
                               "  trainplan validate --gpu-records data/calibration/h200-2026-12-04")
    va.add_argument("--csv", help="also write the comparison rows to this CSV")
    va.add_argument("--heldout", action="store_true",
                    help="leave one published table out: refit the Efficiency on the others, predict it")
    va.add_argument("--jobs", type=int, default=None, metavar="N",
                    help="with --heldout: refits run at once in worker processes (default: the CPUs this process "
                         "may use, at most one per refit; 1 runs them in this process); the rows are the same")
    va.add_argument("--gpu-records", metavar="DIR", default=None,
                    help="predict the GPU proxy RECORDs in DIR (scripts/device_proxies.sh output, e.g. "
                         "data/calibration/h200-2026-12-04) with the shipped fit, nothing fitted on them")
    va.add_argument("--h100-peak-tflops", type=float, default=None,
                    help="peak BF16 TFLOP/s for torchtitan's 96 GB / 500 W H100s (default: the fitted fraction of "
                         "989 in trainplan/data/efficiency_fits.json, h100_500w_peak_frac; torchtitan puts it between "
                         "NVL 835 and SXM 989)")
    for name, (_, help_) in DELEGATED.items():
        sub.add_parser(name, help=help_, add_help=False)
    return p


def _quiet_broken_pipe() -> int:
    """``trainplan estimate | head -1``: the reader left; stop quietly (no BrokenPipeError at exit)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (captured in tests)
        pass
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in DELEGATED:
            mod = importlib.import_module(DELEGATED[argv[0]][0])
            rc = int(mod.main(argv[1:]) or 0)
        else:
            try:
                args = _parser().parse_args(argv)
            except SystemExit as e:  # a usage error (one line already written) or --help: a code, not an exit
                return e.code if isinstance(e.code, int) else 2
            rc = int(importlib.import_module(COMMANDS[args.cmd]).run(args) or 0)
        sys.stdout.flush()  # inside the try: a closed pipe surfaces here, not at interpreter exit
        return rc
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except ConfigError as e:
        sys.stderr.write(fmt(e) + "\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("trainplan: interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
