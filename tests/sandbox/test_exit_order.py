"""A process that exits with sandboxes still in use (an env never closed, an agent program's episode in flight)
closes them before Python stops its thread pools (relax_gym/sandbox/exit_order.py), and leaves nothing on stderr:
no "cannot schedule new futures after shutdown" from a reset or destroy scheduled too late, no unclosed event loop,
no unclosed Docker socket, no HTTP response failing to flush after its socket closed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

from relax_gym.sandbox import exit_order

LEFT_OPEN = textwrap.dedent("""
    import relax_gym
    tools = relax_gym.make("tool-use")
    obs, info = tools.reset(seed=0)
    tools.step('<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>')
    agent = relax_gym.make("openai-agent")
    agent.reset(seed=0)  # its program now waits for the model, in a sandbox, on a thread of its own
    print("exiting with both envs open")
""")


def test_exiting_with_sandboxes_in_use_leaves_stderr_clean(backend):
    done = subprocess.run([sys.executable, "-X", "dev", "-c", LEFT_OPEN], capture_output=True, text=True, timeout=300,
                          env={**_env(), "RELAX_GYM_SANDBOX": backend.name})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "exiting with both envs open"
    assert done.stderr == ""


def test_a_hook_runs_before_the_thread_pools_stop_and_marks_the_exit():
    # threading's exit hooks run last-registered first; concurrent.futures registered its own on import, earlier
    probe = textwrap.dedent("""
        import concurrent.futures, threading
        from relax_gym.sandbox import exit_order
        pool = concurrent.futures.ThreadPoolExecutor(1)
        pool.submit(int).result()
        def hook():
            assert exit_order.exiting()
            print("pool takes work at exit:", pool.submit(lambda: 42).result())
        exit_order.before_thread_pools_stop(hook)
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout == "pool takes work at exit: 42\n"
    assert not exit_order.exiting() and threading.main_thread().is_alive()  # this process is not exiting


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
