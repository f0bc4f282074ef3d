# Adapter: all logic is in trainplan.stages.cost_and_risk.
from trainplan.stages import cost_and_risk

cost_and_risk.main(snakemake)  # noqa: F821
