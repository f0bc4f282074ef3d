# Adapter: all logic is in trainplan.stages.aggregate.
from trainplan import stages

stages.aggregate(snakemake)  # noqa: F821
