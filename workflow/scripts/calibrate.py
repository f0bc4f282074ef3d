# Adapter: all logic is in trainplan.stages.calibrate.
from trainplan.stages import calibrate

calibrate.main(snakemake)  # noqa: F821
