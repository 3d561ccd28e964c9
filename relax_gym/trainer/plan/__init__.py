"""The planner (``relax-gym plan``): the async engine's real scheduling code on a virtual clock, with simulated
roles whose calls take time from cost models, to answer "how many rollout replicas and which staleness give a
data wait of at most 2% for my model on N GPUs?" without the cluster.

- :mod:`.clock`: the virtual-time asyncio loop (``run_virtual``);
- :mod:`.costs`: the cost models (pydantic, seeded draws per episode);
- :mod:`.sim_roles`: simulated engines, env workers, reference, actor and weight push; the event log;
- :mod:`.schedule`: one simulated run (``simulate``): the real staleness gate, carry feeder / slots, data bus,
  advantages role and sample ledger, driven as the controller drives them (what is real and what is simulated is
  listed in its docstring);
- :mod:`.sweep`: replicas × max_staleness × stragglers against colocate; table, JSON, chart;
- :mod:`.calibrate`: cost models fitted from a finished run;
- :mod:`.cli`: the ``plan`` typer app (``run``, ``sweep``, ``calibrate``).

Nothing is imported here: ``relax_gym.cli`` loads the typer app without the planner.
"""
