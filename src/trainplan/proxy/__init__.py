"""Real PyTorch proxy runs: the layouts the planner reasons about, trained and measured.

Submodules: ``model`` (Llama-architecture nn.Module from a ModelSpec), ``lora``, ``parallelize`` (one
``apply_*`` per technique), ``measure`` (state bytes, saved activations, FLOPs, collectives), ``run``
(what each rank trains), ``worker`` (the ranks' entry under torchrun), ``torchrun`` (the launcher: torchrun /
srun), ``procs`` (its processes from /proc, the Snakefile's signal hook), ``command`` (``trainplan proxy``),
``select``, ``aggregate``, ``fakemem``, ``schema``, ``record``. Importing this package does not import torch; the
submodules that need it do, and only the ranks and ``fakemem`` need it: the launcher and the Snakefile do not.
"""
