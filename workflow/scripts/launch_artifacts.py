# Adapter: all logic is in trainplan.stages.launch_artifacts.
from trainplan import stages

stages.launch_artifacts(snakemake)  # noqa: F821
