"""Fits of the analytic model's free parameters: to published tables, GPU proxy records, and CPU scaling curves."""
