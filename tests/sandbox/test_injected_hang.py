"""The sandbox_hang fault on a real backend: an armed command hangs until its own timeout ends it (the sandbox's
kill-timeout is what saves the episode), and only as many commands as were armed."""

from __future__ import annotations

import asyncio
import time

from relax_gym.trainer.faults.hooks import SandboxHangs

from .conftest import run


def test_an_armed_command_hangs_until_its_timeout_and_the_next_runs(backend, spec):
    async def body():
        box = await backend.create(spec)
        try:
            SandboxHangs.arm(1)
            before = SandboxHangs.hung
            t0 = time.monotonic()
            hung = await asyncio.wait_for(box.exec("echo hi", timeout=1.5), 60)  # the hang never ends by itself
            assert hung.timed_out and not hung.ok and hung.stdout == "" and time.monotonic() - t0 > 1.4
            assert SandboxHangs.hung == before + 1
            again = await box.exec("echo hi", timeout=5)
            assert (again.rc, again.stdout, again.timed_out) == (0, "hi\n", False)
        finally:
            SandboxHangs.disarm()
            await box.close()

    run(body())
