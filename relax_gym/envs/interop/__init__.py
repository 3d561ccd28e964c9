"""Envs of other frameworks, each run in a virtual environment of its own behind the env-server protocol.

``relax_gym.make("gem:game:GuessTheNumber-v0-easy")``, ``relax_gym.make("skyrl-gym:gsm8k", data_file=...)`` or
``relax_gym.make("verifiers:vf-my-env", env_args={...})``
(and ``env.id`` in a recipe) give an ``AgentEnv`` that trains like ours, in both modes:

- :mod:`.frameworks`: the frameworks known, their pinned packages and adapters;
- :mod:`.venvs`: the framework's venv, made on first use and kept (or named by the user);
- :mod:`.adapter`: what the adapters share (deadlines, errors naming framework, env and call);
- :mod:`.gem_env`, :mod:`.skyrl_env`, :mod:`.verifiers_env`, :mod:`.openenv_env`: the adapters, which run inside
  their framework's venv; :mod:`.nemo_gym_env` speaks NeMo-Gym's HTTP protocol from this process;
- :mod:`.openenv_serve`, :mod:`.verifiers_serve`, :mod:`.skyrl_serve`: the other way, our envs behind OpenEnv's own
  server (``relax-gym envs serve ID --protocol openenv``), as verifiers environments (``vf.load_environment``) and
  as skyrl-gym envs (``skyrl_gym.make("relax-gym", ...)``);
- :mod:`.serve`: starting the adapter's env server in that venv and connecting to it.

See docs/interop.md. This package's own ``__init__`` imports nothing: the registry reads :mod:`.frameworks` to
tell a foreign id from ours without loading the rest.
"""
