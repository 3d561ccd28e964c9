"""Inside a sandbox: forward between the sandbox's loopback and a Unix socket while a command runs (stdlib only).

    python3 -S forward_in_sandbox.py --socket /run/relax/api.sock --listen 127.0.0.1:8765 [--env K=V ...] [--env-file PATH] -- CMD ...
    python3 -S forward_in_sandbox.py --expose /run/relax-env/env.sock --to 127.0.0.1:8000 [--cwd DIR] -- CMD ...

Out (``--socket``/``--listen``): listens on the sandbox's own loopback before CMD starts (so CMD can connect at
once) and forwards every connection byte for byte to the Unix socket (a relax-gym SocketBridge on the host).
In (``--expose``/``--to``): listens on a new Unix socket (in a directory the host mounted writable) and forwards
every connection to a server CMD runs on the sandbox's loopback (a relax-gym SocketPort on the host dials it), so
the host reaches a server in a sandbox that has no network.

Either way it runs CMD as a child (in ``--cwd``) with this environment plus the ``--env`` pairs, passes SIGTERM /
SIGINT / SIGHUP on to it, and exits with CMD's status (128 + signal when a signal ended it). The forwarding threads
end with this process. Runs on the sandbox's python, so it must import nothing but the standard library (``-S``:
not even site-packages).
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

CHUNK = 64 * 1024


def shut(sock, how):
    try:
        sock.shutdown(how)
    except OSError:
        pass


def pump(src, dst):
    """Copy ``src`` to ``dst`` until EOF, then half-close ``dst`` for writing (the other direction goes on); an
    error on either side ends both directions."""
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        shut(src, socket.SHUT_RDWR)
        shut(dst, socket.SHUT_RDWR)
        return
    shut(dst, socket.SHUT_WR)


def splice(a, b):
    """Copy both ways between two connected sockets (a thread for b -> a) until both directions have ended."""
    back = threading.Thread(target=pump, args=(b, a), daemon=True)
    back.start()
    pump(a, b)
    back.join()


def _handle(client, dial, target):
    try:
        try:
            upstream = dial()
        except OSError as e:
            sys.stderr.write(f"forward_in_sandbox: cannot connect to {target}: {e}\n")
            return
        try:
            splice(client, upstream)
        finally:
            upstream.close()
    finally:
        client.close()


def _serve(listener, dial, target):
    while True:
        try:
            client, _ = listener.accept()
        except OSError:  # e.g. out of descriptors: wait for some to be freed
            time.sleep(0.01)
            continue
        threading.Thread(target=_handle, args=(client, dial, target), daemon=True).start()


def _address(spec, flag):
    host, sep, port = spec.rpartition(":")
    if not sep or not port.isdigit():
        raise SystemExit(f"forward_in_sandbox: {flag} must be HOST:PORT, not {spec!r}")
    host = host.strip("[]") or "127.0.0.1"
    return (socket.AF_INET6 if ":" in host else socket.AF_INET), (host, int(port))


def _listen(spec):
    family, address = _address(spec, "--listen")
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(address)
    listener.listen(128)
    return listener


def _listen_unix(path):
    if os.path.exists(path):  # a socket left by an earlier run in the same directory
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o666)
    listener.listen(128)
    return listener


def _dialer(family, address):
    def dial():
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.connect(address)
        except BaseException:
            sock.close()
            raise
        return sock
    return dial


def _forwarding(args):
    """(listener, dial, what the connections go to) for the direction the arguments ask for."""
    if args.expose:
        family, address = _address(args.to, "--to")
        return _listen_unix(args.expose), _dialer(family, address), args.to
    return _listen(args.listen), _dialer(socket.AF_UNIX, args.socket), args.socket


def main(argv=None):
    parser = argparse.ArgumentParser(prog="forward_in_sandbox", description=__doc__.split("\n")[0])
    parser.add_argument("--socket", help="out: the Unix socket to forward to")
    parser.add_argument("--listen", default="127.0.0.1:8765", help="out: HOST:PORT to listen on (loopback)")
    parser.add_argument("--expose", metavar="PATH", help="in: the Unix socket to listen on")
    parser.add_argument("--to", default="127.0.0.1:8000", help="in: HOST:PORT (the sandbox's loopback) to forward to")
    parser.add_argument("--cwd", default=None, metavar="DIR", help="run CMD in DIR")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="add to CMD's environment")
    parser.add_argument("--env-file", default=None, metavar="PATH",
                        help="KEY=VALUE lines added to CMD's environment; the file is deleted once read (for secrets "
                             "that must not show on a command line)")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command given (put it after --)")
    if bool(args.socket) == bool(args.expose):
        parser.error("give one of --socket (out of the sandbox) and --expose (into it)")
    env = dict(os.environ)
    for pair in args.env:
        key, sep, value = pair.partition("=")
        if not key or not sep:
            parser.error(f"--env wants KEY=VALUE, not {pair!r}")
        env[key] = value
    if args.env_file:
        try:
            with open(args.env_file, encoding="utf-8") as f:
                lines = f.read().splitlines()
            os.unlink(args.env_file)
        except OSError as e:
            sys.stderr.write(f"forward_in_sandbox: cannot read --env-file {args.env_file}: {e}\n")
            return 125
        for n, line in enumerate(lines, 1):
            key, sep, value = line.partition("=")
            if line and (not key or not sep):
                sys.stderr.write(f"forward_in_sandbox: {args.env_file} line {n}: want KEY=VALUE\n")
                return 125
            if line:
                env[key] = value
    try:
        listener, dial, target = _forwarding(args)
    except OSError as e:
        sys.stderr.write(f"forward_in_sandbox: cannot listen on {args.expose or args.listen}: {e}\n")
        return 125
    threading.Thread(target=_serve, args=(listener, dial, target), daemon=True).start()
    try:
        child = subprocess.Popen(cmd, env=env, cwd=args.cwd)
    except OSError as e:
        sys.stderr.write(f"forward_in_sandbox: cannot run {cmd[0]}: {e}\n")
        return 127 if isinstance(e, FileNotFoundError) else 126

    def forward(signum, _frame):
        try:
            child.send_signal(signum)
        except OSError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    while True:
        try:
            rc = child.wait()
            break
        except InterruptedError:
            continue
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
