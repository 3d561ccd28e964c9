"""Isolated execution for tool code: the Sandbox contract, Docker and bubblewrap backends, a warm pool.
Imports nothing else of relax_gym.

    from relax_gym.sandbox import SandboxPool, SandboxSpec
    async with SandboxPool() as pool:                       # backend from RELAX_GYM_SANDBOX (auto: docker, else bwrap)
        async with pool.lease(SandboxSpec(memory_mb=256), deadline) as box:
            result = await box.exec("python3 -c 'print(6 * 7)'", timeout=5)

An agent program that must call an OpenAI-compatible server on the host's loopback (the sandbox keeps no network):
see :mod:`relax_gym.sandbox.bridge` (a Unix-socket bridge + an in-sandbox forwarder) and
:mod:`relax_gym.sandbox.pyruntime` (``import openai`` with the sandbox's python).
"""

from relax_gym.sandbox.backends import doctor, get_backend, select_backend
from relax_gym.sandbox.base import ExecResult, Sandbox, SandboxError, SandboxUnavailable
from relax_gym.sandbox.bridge import (
    SocketBridge,
    bridge_mounts,
    bridged_command,
    forwarder_script_path,
    shared_bridge,
)
from relax_gym.sandbox.pool import Lease, LeaseExpired, PoolTimeout, SandboxPool
from relax_gym.sandbox.pyruntime import python_packages_dir, runtime_env, runtime_mount
from relax_gym.sandbox.spec import DEFAULT_IMAGE, Mount, SandboxSpec
from relax_gym.sandbox.sync import SyncSandbox

__all__ = [
    "DEFAULT_IMAGE", "ExecResult", "Lease", "LeaseExpired", "Mount", "PoolTimeout", "Sandbox", "SandboxError",
    "SandboxPool", "SandboxSpec", "SandboxUnavailable", "SocketBridge", "SyncSandbox", "bridge_mounts",
    "bridged_command", "doctor", "forwarder_script_path", "get_backend", "python_packages_dir", "runtime_env",
    "runtime_mount", "select_backend", "shared_bridge",
]
