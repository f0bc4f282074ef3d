"""The analytic model: specs (architecture, hardware, training, layout), FLOPs, memory, communication, step time, efficiency, one-layout estimate. Imports neither torch nor snakemake."""
