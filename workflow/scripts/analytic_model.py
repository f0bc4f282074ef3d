# Adapter: all logic is in trainplan.stages.analytic_model.
from trainplan import stages

stages.analytic_model(snakemake)  # noqa: F821
