# Adapter: all logic is in trainplan.stages.predict_production.
from trainplan import stages

stages.predict_production(snakemake)  # noqa: F821
