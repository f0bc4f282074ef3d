"""The production run's throughput and memory with p10/p50/p90 intervals."""
