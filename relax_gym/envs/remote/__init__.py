"""Environments as services: one env spec runs in-process or in an isolated server, with the trainer unchanged.

- :mod:`.server`: ``relax-gym envs serve ID`` / ``python -m relax_gym.envs.remote.server ID``, an HTTP server of one
  registered env (sessions: reset, step, close).
- :mod:`.client`: :class:`RemoteEnv`, the ``AgentEnv`` that stands in for a served env;
  ``relax_gym.make("remote:http://HOST:PORT/ID")``.
- :mod:`.launcher`: a manifest's ``[server]`` table with ``python``/``venv`` starts the server as a child process.
- :mod:`.wire`: the JSON form of conversations (media by reference or inline), infos and errors.

See docs/env-servers.md.
"""

from relax_gym.envs.remote.client import RemoteEnv, RemoteEnvError, make_remote
from relax_gym.envs.remote.launcher import ServerStartError, ensure_server, served_env
from relax_gym.envs.remote.server import EnvServer, ServeError

__all__ = ["EnvServer", "RemoteEnv", "RemoteEnvError", "ServeError", "ServerStartError", "ensure_server", "make_remote",
           "served_env"]
