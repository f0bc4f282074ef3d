# Adapter: all logic is in trainplan.stages.figures.
from trainplan.stages import figures

figures.main(snakemake)  # noqa: F821
