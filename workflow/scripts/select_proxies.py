# Adapter: all logic is in trainplan.stages.select_proxies.
from trainplan import stages

stages.select_proxies(snakemake)  # noqa: F821
