# Adapter: all logic is in trainplan.stages.fit_scaling.
from trainplan.stages import fit_scaling

fit_scaling.main(snakemake)  # noqa: F821
