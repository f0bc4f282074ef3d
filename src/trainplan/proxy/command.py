"""``trainplan proxy``: run one proxy, or size a full-depth model on a fake world.

Examples::

    trainplan proxy results/proxies/specs/depth-L2.json --out results/proxies/runs/depth-L2.json
    trainplan proxy fakemem --model llama2-13b --world 32 --seq-len 4096 --mb 1 --out fakemem.json

Exit codes: 0 for ok, oom and timeout (results, recorded); 1 for error (so Snakemake retries); 2 for bad
input (ConfigError, nothing run).
"""

from __future__ import annotations

import argparse
import sys

from trainplan.io import read_json_checked, write_json
from trainplan.model.base import ConfigError
from trainplan.proxy.fakemem import fakemem, format_fakemem
from trainplan.proxy.schema import normalize_run_spec
from trainplan.proxy.torchrun import launch


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainplan proxy", description="Run one proxy training job and record it.",
                                epilog="example: trainplan proxy spec.json --out record.json\n"
                                       "         trainplan proxy fakemem --model llama2-13b --world 32",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help="RUN_SPEC JSON file (docs/ARCHITECTURE.md)")
    p.add_argument("--out", required=True, help="RECORD JSON to write (docs/proxy-record.md)")
    return p


def _fakemem_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainplan proxy fakemem",
                                description="FSDPMemTracker on a fake N-rank world (FakeTensorMode; no GPU).",
                                epilog="example: trainplan proxy fakemem --model llama2-13b --world 32 --seq-len 4096 --mb 1")
    p.add_argument("--model", default="llama2-13b", help="preset name or config.json")
    p.add_argument("--world", type=int, default=32, help="simulated ranks (FSDP full shard)")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--mb", type=int, default=1, help="micro-batch (sequences per rank)")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--recompute", choices=("none", "full"), default="none")
    p.add_argument("--out", help="write the result JSON here")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv and argv[0] == "fakemem":
            a = _fakemem_parser().parse_args(argv[1:])

            res = fakemem(a.model, world=a.world, seq_len=a.seq_len, micro_batch=a.mb, dtype=a.dtype,
                          recompute=a.recompute)
            if a.out:
                write_json(a.out, res)

            print(format_fakemem(res))
            return 0
        a = _run_parser().parse_args(argv)

        try:
            raw = read_json_checked(a.spec)
        except (OSError, ValueError) as e:
            raise ConfigError("spec", a.spec, f"a readable RUN_SPEC JSON file ({e})") from None
        spec = normalize_run_spec(raw)
        rec, code = launch(spec, a.out)
        print(f"proxy {spec['id']}: {rec['status']}" + (f" ({rec['message']})" if rec["message"] else ""),
              file=sys.stderr)
        return code
    except ConfigError as e:
        print(f"trainplan proxy: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
