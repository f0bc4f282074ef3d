# Adapter: all logic is in trainplan.stages.analytic_model.
from trainplan.stages import analytic_model

analytic_model.main(snakemake)  # noqa: F821
