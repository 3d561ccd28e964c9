"""The async engine's roles, one module and one Ray Serve deployment each.

- :mod:`.env_worker`: runs episodes (env ↔ inference) and writes finished trajectories to the data bus;
- :mod:`.inference`: hosts an embedded engine behind SGLang's protocol (handle calls, plus a loopback HTTP server);
- :mod:`.reference`: log-probs of the frozen reference policy (``ref_logprobs``) for the KL term;
- :mod:`.advantages`: stateless group-relative advantages, written once a group is whole (DAPO's filter too);
- :mod:`.actor`: trains on micro-batches as they become ready, one optimiser step per rollout step, pushes weights;
- :mod:`.critic`: PPO's value model (``algorithm.name: ppo``): writes ``values``, trains on the returns beside the actor;
- :mod:`.genrm`: the LLM judge's engine (``judge:``), frozen; env workers score pending rubric parts through it.

Each module holds a plain class (usable without Ray, which is how the unit tests drive them); the controller turns
it into a deployment. Roles never import one another: they meet on the data bus and through deployment handles.
"""
