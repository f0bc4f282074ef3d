# Adapter: all logic is in trainplan.stages.figures.
from trainplan import stages

stages.figures(snakemake)  # noqa: F821
