# Adapter: all logic is in trainplan.stages.aggregate.
from trainplan.stages import aggregate

aggregate.main(snakemake)  # noqa: F821
