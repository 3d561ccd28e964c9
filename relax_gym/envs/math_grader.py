"""math-verify in a child process with a hard time limit.

math-verify bounds its work with ``signal.alarm``, which needs the main thread, and even there an alarm cannot stop
one long C call. A policy's answer such as ``9^9^9`` makes sympy build a 370-million-digit integer. That is a
single big-int power: it holds the GIL and no signal interrupts it. In an env-step thread it froze a whole training
run (found by ``benchmarks/modes.py``). So the comparison runs in a small worker process (``python -c``, importing
only math-verify). The worker's main thread keeps math-verify's own alarms. The caller waits at most ``timeout_s``,
and on expiry kills the worker and scores the answer wrong. The next call starts a fresh worker.

One worker per process, shared by its threads (calls are serialised; a comparison takes milliseconds).
"""

from __future__ import annotations

import atexit
import json
import select
import subprocess
import sys
import threading

from relax_gym.watchdog import guard

__all__ = ["MathGrader", "equivalent"]

GRADE_TIMEOUT_S = 10.0

_WORKER = r"""
import json, logging, sys
from math_verify import parse, verify
logging.getLogger("math_verify").setLevel(logging.ERROR)
sys.stdout.write("ready\n"); sys.stdout.flush()
for line in sys.stdin:
    gold, answer = json.loads(line)
    try:
        ok = bool(verify(parse(gold), parse(answer)))
    except Exception:
        ok = False
    sys.stdout.write("1\n" if ok else "0\n")
    sys.stdout.flush()
"""


class MathGrader:
    """``equivalent(gold, answer)``: math-verify's verdict, or False when it takes longer than ``timeout_s`` (the
    worker is then killed) or the worker dies. ``start_timeout_s`` bounds the worker's start-up (imports)."""

    def __init__(self, timeout_s: float = GRADE_TIMEOUT_S, start_timeout_s: float = 60.0) -> None:
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self.killed = 0  # workers killed for running past the limit

    def equivalent(self, gold: str, answer: str) -> bool:
        with self._lock:
            proc = self._worker()
            try:
                assert proc.stdin is not None
                proc.stdin.write((json.dumps([gold, answer]) + "\n").encode())
                proc.stdin.flush()
            except (BrokenPipeError, OSError):
                self._stop()
                return False
            reply = self._read_line(proc, self.timeout_s)
            if reply is None:  # ran past the limit (a huge power, a runaway simplification): a wrong answer
                self.killed += 1
                self._stop()
                return False
            return reply == b"1"

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _worker(self) -> subprocess.Popen:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL)
        guard(self._proc)  # a grader stuck in sympy would otherwise outlive a killed trainer
        if self._read_line(self._proc, self.start_timeout_s) != b"ready":
            self._stop()
            raise RuntimeError(f"the math-verify worker ({sys.executable} -c ...) did not start within "
                               f"{self.start_timeout_s:.0f} s; is math-verify installed?")
        return self._proc

    @staticmethod
    def _read_line(proc: subprocess.Popen, timeout: float) -> bytes | None:
        """One reply line, or None if none came within ``timeout`` or the worker exited."""
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = proc.stdout.readline()
        return line.strip() if line else None

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()


_GRADER = MathGrader()
atexit.register(_GRADER.close)


def equivalent(gold: str, answer: str) -> bool:
    """math-verify equivalence of two answer strings, in this process's grader worker."""
    return _GRADER.equivalent(gold, answer)
