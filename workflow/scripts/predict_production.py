# Adapter: all logic is in trainplan.stages.predict_production.
from trainplan.stages import predict_production

predict_production.main(snakemake)  # noqa: F821
