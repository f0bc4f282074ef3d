"""Enumerate and evaluate every layout of the study's cluster; rank, Pareto front, family and technique verdicts."""
