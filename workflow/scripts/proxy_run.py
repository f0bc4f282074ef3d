# Adapter: all logic is in trainplan.stages.proxy_run. Rank 0 appends one line per training step to the
# rule's `steps` log (trainplan.proxy.run.PROGRESS_ENV), so a long GPU proxy can be followed with `tail -f`.
import os
from pathlib import Path

from trainplan import stages
from trainplan.slurm_resources import restore_allocation_env

steps = Path(snakemake.log.steps)  # noqa: F821
steps.parent.mkdir(parents=True, exist_ok=True)
attempt = int(getattr(snakemake, "attempt", 1) or 1)  # noqa: F821  (a retry appends, as the main log does)
with steps.open("a" if attempt > 1 else "w") as f:
    f.write(f"# proxy {snakemake.wildcards.id}: attempt {attempt}\n")  # noqa: F821
os.environ["TRAINPLAN_PROXY_PROGRESS"] = str(steps.resolve())
restore_allocation_env()  # in a Slurm job: the node count/list the jobstep plugin removed (multi-node path)
stages.proxy_run(snakemake)  # noqa: F821
