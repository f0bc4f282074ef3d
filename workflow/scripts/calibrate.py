# Adapter: all logic is in trainplan.stages.calibrate.
from trainplan import stages

stages.calibrate(snakemake)  # noqa: F821
