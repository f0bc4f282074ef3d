"""Figures, the PDF memo, snakemake --report labels and the benchmark table."""
