"""Launch artifacts for the chosen layout (torchtitan / Accelerate / torchrun / sbatch), preflight, trainer choice and log ingest."""
