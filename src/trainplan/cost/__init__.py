"""Wall-clock, GPU-hours, dollars, checkpoint/failure overheads, targets; sensitivity of the recommendation."""
