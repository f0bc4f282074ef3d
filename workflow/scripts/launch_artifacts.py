# Adapter: all logic is in trainplan.stages.launch_artifacts.
from trainplan.stages import launch_artifacts

launch_artifacts.main(snakemake)  # noqa: F821
