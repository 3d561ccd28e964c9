"""Isolated execution for tool code: the Sandbox contract, Docker and bubblewrap backends, a warm pool.
Imports nothing else of relax_gym.

    from relax_gym.sandbox import SandboxPool, SandboxSpec
    async with SandboxPool() as pool:                       # backend from RELAX_GYM_SANDBOX (auto: docker, else bwrap)
        async with pool.lease(SandboxSpec(memory_mb=256), deadline) as box:
            result = await box.exec("python3 -c 'print(6 * 7)'", timeout=5)
"""

from relax_gym.sandbox.backends import doctor, get_backend, select_backend
from relax_gym.sandbox.base import ExecResult, Sandbox, SandboxError, SandboxUnavailable
from relax_gym.sandbox.pool import Lease, LeaseExpired, PoolTimeout, SandboxPool
from relax_gym.sandbox.spec import DEFAULT_IMAGE, SandboxSpec
from relax_gym.sandbox.sync import SyncSandbox

__all__ = [
    "DEFAULT_IMAGE", "ExecResult", "Lease", "LeaseExpired", "PoolTimeout", "Sandbox", "SandboxError", "SandboxPool",
    "SandboxSpec", "SandboxUnavailable", "SyncSandbox", "doctor", "get_backend", "select_backend",
]
