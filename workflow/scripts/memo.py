# Adapter: all logic is in trainplan.stages.memo.
from trainplan.stages import memo

memo.main(snakemake)  # noqa: F821
