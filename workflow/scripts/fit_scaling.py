# Adapter: all logic is in trainplan.stages.fit_scaling.
from trainplan import stages

stages.fit_scaling(snakemake)  # noqa: F821
