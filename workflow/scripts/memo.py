# Adapter: all logic is in trainplan.stages.memo.
from trainplan import stages

stages.memo(snakemake)  # noqa: F821
