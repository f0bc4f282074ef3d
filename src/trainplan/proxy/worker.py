"""Entry of every proxy rank: ``python -m trainplan.proxy.worker SPEC RANK_DIR``, started by torchrun
(:func:`trainplan.proxy.torchrun.torchrun_command`). It dies with torchrun, then runs :func:`trainplan.proxy.run.main`.

The launcher (:mod:`trainplan.proxy.torchrun`) imports neither this module nor torch: only the ranks pay for torch.
"""

from __future__ import annotations

import os
import signal
import sys

from trainplan.proxy.run import main
from trainplan.proxy.torchrun import set_pdeathsig


def worker_main(argv: list[str]) -> int:
    """One rank: SIGKILL when torchrun (its parent) exits, then train and write ``RANK_DIR/rank{RANK}.json``."""
    set_pdeathsig(signal.SIGKILL)
    if os.getppid() == 1:  # torchrun already gone between fork and prctl
        return 1
    return main(argv)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: python -m {__spec__.name if __spec__ else 'trainplan.proxy.worker'} SPEC RANK_DIR")
    sys.exit(worker_main(sys.argv[1:]))
