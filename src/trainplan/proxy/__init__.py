"""Real PyTorch proxy runs: the layouts the planner reasons about, trained and measured.

Submodules: ``model`` (Llama-architecture nn.Module from a ModelSpec), ``lora``, ``parallelize`` (one
``apply_*`` per technique), ``measure`` (state bytes, saved activations, FLOPs, collectives), ``run``
(per-rank training entry), ``launch`` (torchrun / srun), ``cli``, ``select``, ``aggregate``, ``fakemem``,
``schema``. Importing this package does not import torch; the submodules that need it do.
"""
