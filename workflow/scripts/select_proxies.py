# Adapter: all logic is in trainplan.stages.select_proxies.
from trainplan.stages import select_proxies

select_proxies.main(snakemake)  # noqa: F821
