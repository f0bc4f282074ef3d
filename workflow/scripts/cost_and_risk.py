# Adapter: all logic is in trainplan.stages.cost_and_risk.
from trainplan import stages

stages.cost_and_risk(snakemake)  # noqa: F821
