# Adapter: all logic is in trainplan.stages.proxy_run.
from trainplan import stages

stages.proxy_run(snakemake)  # noqa: F821
