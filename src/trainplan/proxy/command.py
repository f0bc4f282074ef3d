"""``trainplan proxy``: run one proxy, or size a full-depth model on a fake world.

Examples::

    trainplan proxy results/proxies/specs/depth-L2.json --out results/proxies/runs/depth-L2.json
    trainplan proxy fakemem --model llama2-13b --world 32 --seq-len 4096 --mb 1 --out fakemem.json

Exit codes: 0 for ok, oom and timeout (results, recorded); 1 for error (so Snakemake retries); 2 for bad
input (ConfigError, nothing run).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from trainplan.io import read_json_checked
from trainplan.model.base import ConfigError
from trainplan.proxy.schema import normalize_run_spec
from trainplan.proxy.torchrun import launch

# ``trainplan proxy NAME …`` → the module whose main(argv) runs it, imported when it runs (as ``trainplan.cli`` does
# with its subcommands): fakemem builds the model under FakeTensorMode and needs torch; the launcher of a proxy run
# (this module, ``proxy.torchrun``) does not: torchrun and the ranks (``proxy.worker``) import it, the job itself not
SUBCOMMANDS = {"fakemem": "trainplan.proxy.fakemem"}


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainplan proxy", description="Run one proxy training job and record it.",
                                epilog="example: trainplan proxy spec.json --out record.json\n"
                                       "         trainplan proxy fakemem --model llama2-13b --world 32",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help="RUN_SPEC JSON file (docs/ARCHITECTURE.md)")
    p.add_argument("--out", required=True, help="RECORD JSON to write (docs/proxy-record.md)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv and argv[0] in SUBCOMMANDS:
            return int(importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:]) or 0)
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
