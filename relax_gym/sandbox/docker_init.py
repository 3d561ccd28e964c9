"""PID 1 of every docker sandbox: reaps orphans and runs the commands the host sends on its stdin (stdlib only).

Started by the container command as ``python3 -I -S -c <this file's source> PATH PATH_SET DROP_JSON`` (the
environment the container gave the shell, before the shell added to it: the original ``PATH``, whether it was set,
and the names the shell exported that commands must not see). It never runs on the host: its clean-up kills every
process its uid may signal.

The host writes requests to our stdin (docker's attach stream): ``>I`` total length, ``>I`` JSON length, the JSON
head, then the raw body (a command's stdin, a file's bytes). We answer on stdout with messages ``>cI`` kind +
length + payload: ``o`` / ``e`` a chunk of the command's stdout / stderr (at most ``caps[i]`` bytes of stream i
are sent; the rest is counted), then one ``d`` with a JSON status. Ops:

- ``exec`` {argv, cwd, timeout, caps, stdin}: fork, new session, stdin from the body (or /dev/null), ``oom_score_adj``
  1000 (the OOM killer takes the command, not us), exec. When it exits, or at the deadline, or when a ``kill``
  request arrives, everything of our uid but us dies (``kill(-1, SIGKILL)``: as the pid namespace's init we are
  spared and no signal from inside reaches us), its pipes are drained, and the status is sent: rc (128 + signal
  for a signal), killed (by us), dropped (bytes per stream over the cap), duration.
- ``write`` {path, mode}: parent directories made, the body written, the mode set. ``read`` {path, max}: up to
  ``max`` bytes as ``o`` chunks. ``reset`` {dirs}: kill everything, empty each dir, list what is left.
- ``kill``: ends the running command (ignored between commands).

We are not dumpable (``PR_SET_DUMPABLE`` 0), so a command running as the same uid can neither ptrace us nor open
our descriptors (the host's channel) under /proc/1.
"""

import errno
import json
import os
import select
import signal
import stat
import struct
import sys
import time

CHUNK = 1 << 16
KILL_GRACE_S = 2.0  # after the kill, how long the pipes may take to reach EOF
REQ = struct.Struct(">II")
MSG = struct.Struct(">cI")


def undumpable():
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:  # noqa: BLE001, S110 - an image without ctypes still works, just without this hardening
        pass


def send(kind, payload=b""):
    data = MSG.pack(kind, len(payload)) + payload
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(1, view):]
        except InterruptedError:
            pass


def done(**status):
    send(b"d", json.dumps(status).encode())


def read_exact(n):
    parts, left = [], n
    while left:
        try:
            chunk = os.read(0, min(left, 1 << 20))
        except InterruptedError:
            continue
        if not chunk:
            raise EOFError
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


class Server:
    def __init__(self, env):
        self.env = env
        self.statuses = {}  # pid -> wait status of children we care about
        self.watch = set()
        self.inbox = bytearray()  # bytes of the next request read while a command ran
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        self.wake = wake_r
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.waiting = select.poll()  # between requests: the host's bytes or a child's exit
        self.waiting.register(0, select.POLLIN)
        self.waiting.register(wake_r, select.POLLIN)
        self.reap()  # orphans that exited before the handler was in place (docker exec may start before us)

    # -- processes -------------------------------------------------------------------------------------

    def reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            except InterruptedError:
                continue
            if pid == 0:
                return
            if pid in self.watch:
                self.statuses[pid] = status

    def kill_all(self):
        """SIGKILL every process we may signal (all of the sandbox uid but us) until none is left."""
        end = time.monotonic() + KILL_GRACE_S
        while True:
            try:
                os.kill(-1, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.reap()
                return
            self.reap()
            if time.monotonic() > end:
                return
            time.sleep(0.001)

    def spawn(self, argv, cwd, stdin_fd, out_w, err_w):
        for attempt in range(50):
            try:
                pid = os.fork()
                break
            except BlockingIOError:  # the pids limit: leftovers of a fork bomb still dying
                self.kill_all()
                time.sleep(0.01 * (attempt + 1))
        else:
            raise OSError(errno.EAGAIN, "cannot fork")
        if pid:
            self.watch.add(pid)
            return pid
        try:  # the child: exec or _exit, nothing else
            os.setsid()
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, ())
            try:
                with open("/proc/self/oom_score_adj", "w") as f:
                    f.write("1000")
            except OSError:
                pass
            os.dup2(stdin_fd, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.chdir(cwd)
            try:
                os.execvpe(argv[0], argv, self.env)
            except OSError as e:
                os.write(2, f"can't execute '{argv[0]}': {e.strerror}\n".encode())
                os._exit(126 if e.errno in (errno.EACCES, errno.ENOEXEC) else 127)
        finally:
            os._exit(127)

    # -- requests --------------------------------------------------------------------------------------

    def next_request(self):
        while len(self.inbox) < REQ.size:
            self.inbox += self._read_in()
        total, head_len = REQ.unpack(self.inbox[:REQ.size])
        while len(self.inbox) < REQ.size + total:
            self.inbox += self._read_in()
        msg = bytes(self.inbox[REQ.size:REQ.size + total])
        del self.inbox[:REQ.size + total]
        return json.loads(msg[:head_len]), msg[head_len:]

    def _read_in(self):
        """The next bytes from the host; orphans are reaped while we wait (also when nobody ever attaches)."""
        while True:
            ready = dict(self.waiting.poll(60_000))
            if self.wake in ready:
                self.drain_wake()
            if 0 in ready:
                break
        try:
            chunk = os.read(0, 1 << 20)
        except InterruptedError:
            return b""
        if not chunk:
            raise EOFError
        return chunk

    def drain_wake(self):
        try:
            os.read(self.wake, 4096)
        except BlockingIOError:
            pass
        self.reap()

    def serve(self):
        while True:
            try:
                head, body = self.next_request()
            except EOFError:  # no host attached any more; stay the reaper until the container is removed
                self.idle()
            op = head.get("op")
            try:
                if op == "exec":
                    self.run(head, body)
                elif op == "write":
                    self.write(head, body)
                elif op == "read":
                    self.read(head)
                elif op == "reset":
                    self.reset(head)
                elif op == "ping":
                    done(ok=True, pid=os.getpid())
                elif op != "kill":  # a kill that came after its command ended: nothing to do
                    done(ok=False, error=f"unknown op {op!r}")
            except Exception as e:  # noqa: BLE001 - never die: we are the container's init
                done(ok=False, error=f"{type(e).__name__}: {e}", rc=126, killed=False, dropped=[0, 0], duration=0.0)

    def idle(self):
        poller = select.poll()
        poller.register(self.wake, select.POLLIN)
        while True:
            poller.poll(60_000)
            self.drain_wake()

    def run(self, head, body):
        argv, caps, t0 = head["argv"], head["caps"], time.monotonic()
        deadline = t0 + float(head["timeout"])
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if head.get("stdin") else (os.open(os.devnull, os.O_RDONLY), -1)
        try:
            pid = self.spawn(argv, head["cwd"], in_r, out_w, err_w)
        except OSError as e:
            for fd in (out_r, out_w, err_r, err_w, in_r, in_w):
                if fd >= 0:
                    os.close(fd)
            send(b"e", f"relax-gym: cannot start the command: {e}\n".encode())
            return done(rc=126, killed=False, dropped=[0, 0], duration=time.monotonic() - t0)
        for fd in (out_w, err_w, in_r):
            os.close(fd)
        pending = memoryview(body) if in_w >= 0 else None
        if pending is not None:
            os.set_blocking(in_w, False)
            if not pending:
                os.close(in_w)
                pending = None
        sent, dropped = [0, 0], [0, 0]
        kinds = {out_r: (0, b"o"), err_r: (1, b"e")}
        poller = select.poll()
        for fd in (out_r, err_r, self.wake, 0):
            poller.register(fd, select.POLLIN)
        if pending is not None:
            poller.register(in_w, select.POLLOUT)
        killed, ended, give_up = False, False, None
        while True:
            now = time.monotonic()
            if not ended and pid in self.statuses:
                ended = True
                self.kill_all()  # nothing the command started outlives it
                give_up = time.monotonic() + KILL_GRACE_S
            if ended and not kinds:  # a command that closed its stdout still runs until it exits
                break
            if not ended and not killed and now >= deadline:
                killed = True
                self.kill_all()
            if give_up is None and killed:
                give_up = now + KILL_GRACE_S
            if give_up is not None and now >= give_up:
                break
            wait = (give_up or deadline) - now
            for fd, ev in poller.poll(max(0.0, min(wait, 1.0)) * 1000):
                if fd == self.wake:
                    self.drain_wake()
                elif fd == 0:
                    try:
                        chunk = self._read_in() if ev & select.POLLIN else b""
                    except EOFError:
                        chunk = b""
                    if not chunk:  # the host went away: finish the command, then idle
                        poller.unregister(0)
                        continue
                    self.inbox += chunk
                    if self._kill_requested() and not killed and not ended:
                        killed = True
                        self.kill_all()
                elif fd == in_w:
                    try:
                        n = os.write(in_w, pending[:CHUNK])
                        pending = pending[n:]
                    except BlockingIOError:
                        continue
                    except OSError:  # the command closed its stdin
                        pending = pending[:0]
                    if not pending:
                        poller.unregister(in_w)
                        os.close(in_w)
                        in_w, pending = -1, None
                elif fd in kinds:
                    try:
                        chunk = os.read(fd, CHUNK)
                    except BlockingIOError:
                        continue
                    i, kind = kinds[fd]
                    if not chunk:
                        poller.unregister(fd)
                        os.close(fd)
                        del kinds[fd]
                        continue
                    room = max(0, caps[i] - sent[i])
                    if room:
                        send(kind, chunk[:room])
                        sent[i] += min(room, len(chunk))
                    dropped[i] += max(0, len(chunk) - room)
            self.reap()
        for fd in list(kinds) + ([in_w] if in_w >= 0 else []):
            os.close(fd)
        if not ended:
            self.kill_all()
        self.reap()
        status = self.statuses.pop(pid, None)
        self.watch.discard(pid)
        if status is None:
            rc = 137
        elif os.WIFSIGNALED(status):
            rc = 128 + os.WTERMSIG(status)
        else:
            rc = os.WEXITSTATUS(status)
        done(rc=rc, killed=killed, dropped=dropped, duration=time.monotonic() - t0)

    def _kill_requested(self):
        """Drop ``kill`` requests from the inbox; True when there was one."""
        found = False
        while len(self.inbox) >= REQ.size:
            total, head_len = REQ.unpack(self.inbox[:REQ.size])
            if len(self.inbox) < REQ.size + total:
                break
            head = json.loads(bytes(self.inbox[REQ.size:REQ.size + head_len]))
            if head.get("op") != "kill":
                break
            del self.inbox[:REQ.size + total]
            found = True
        return found

    def write(self, head, body):
        path = head["path"]
        try:
            parent = os.path.dirname(path)
            if parent:
                os.makedirs(parent, exist_ok=True)
            with open(path, "wb") as f:
                f.write(body)
            os.chmod(path, int(head["mode"]))
        except OSError as e:
            return done(ok=False, error=f"{e.strerror or e}: {e.filename or path}")
        done(ok=True)

    def read(self, head):
        path, left = head["path"], int(head["max"])
        if not os.path.lexists(path) or not os.path.exists(path):
            return done(ok=False, error=f"no such file: {path}")
        if os.path.isdir(path):
            return done(ok=False, error=f"is a directory: {path}")
        try:
            with open(path, "rb") as f:
                while left > 0:
                    chunk = f.read(min(left, CHUNK))
                    if not chunk:
                        break
                    send(b"o", chunk)
                    left -= len(chunk)
        except OSError as e:
            return done(ok=False, error=f"{e.strerror or e}: {path}")
        done(ok=True)

    def reset(self, head):
        self.kill_all()
        left = []
        for top in head["dirs"]:
            if not os.path.isdir(top):
                continue
            try:
                os.chmod(top, 0o755)
            except OSError:
                pass
            for name in os.listdir(top):
                remove_tree(os.path.join(top, name))
            left += os.listdir(top)
        done(ok=not left, left=left[:20])


def remove_tree(path):
    """``rm -rf`` that first makes each directory writable (a command may have chmod-ed it shut)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        try:
            os.chmod(path, 0o700)
            names = os.listdir(path)
        except OSError:
            names = []
        for name in names:
            remove_tree(os.path.join(path, name))
        try:
            os.rmdir(path)
        except OSError:
            pass
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


def command_env(argv):
    """The container's environment as docker exec would give it: our shell's additions taken back out."""
    env = dict(os.environ)
    if len(argv) >= 3:
        if argv[1] == "1":
            env["PATH"] = argv[0]
        else:
            env.pop("PATH", None)
        for name in json.loads(argv[2]):
            env.pop(name, None)
    return env


def main():
    undumpable()
    env = command_env(sys.argv[1:])
    os.set_blocking(0, True)
    Server(env).serve()


if __name__ == "__main__":
    main()
