"""The Snakemake glue: one module per rule (workflow/scripts/<rule>.py calls its run function); nothing in the package imports it."""
