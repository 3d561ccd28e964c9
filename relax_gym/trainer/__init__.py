"""The RL trainer, one folder per subsystem (docs/architecture.md, "The trainer's folders"):

- ``train.py`` (the mode switch), ``config.py`` / ``config_loader.py`` (the typed config tree), ``colocate.py``
  (the synchronous loop);
- ``run/``: what both modes share — the RL step's seeds, schedule and metrics row, warm-up, checkpoints, lr
  schedule, metrics files, plots;
- ``rollout/``: the episode runner and samples; ``actors/``: training backends (hf, megatron);
  ``policy/``: model, processor, tokenizer, MoE routing; ``algorithms/``: advantages, losses, KL;
- ``engines/``: inference only; ``dcs/``: every weight push; ``databus/``: the data bus (async only);
- ``async_engine/``: the async controller, its scheduling pieces and its Ray Serve ``roles/``;
- ``faults/``: fault schedule and hooks; ``tools/``: ``python -m`` checks and benches (nothing imports them);
- ``plan/``: the async scheduling code on a virtual clock with simulated roles (``relax-gym plan``).
"""
