# Adapter: all logic is in trainplan.stages.proxy_run.
from trainplan.stages import proxy_run

proxy_run.main(snakemake)  # noqa: F821
