"""Inside a sandbox: forward a loopback TCP port to a Unix socket while a command runs (stdlib only).

    python3 -S forward_in_sandbox.py --socket /run/relax/api.sock --listen 127.0.0.1:8765 [--env K=V ...] [--env-file PATH] -- CMD ...

Listens on the sandbox's own loopback before CMD starts (so CMD can connect at once), forwards every connection
byte for byte to the Unix socket (a relax-gym SocketBridge on the host), runs CMD as a child with this environment
plus the ``--env`` pairs, passes SIGTERM / SIGINT / SIGHUP on to it, and exits with CMD's status (128 + signal
when a signal ended it). The forwarding threads end with this process. Runs on the sandbox's python, so it must
import nothing but the standard library (``-S``: not even site-packages).
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


def _handle(client, socket_path):
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            upstream.connect(socket_path)
        except OSError as e:
            sys.stderr.write(f"forward_in_sandbox: cannot connect to {socket_path}: {e}\n")
            return
        splice(client, upstream)
    finally:
        client.close()
        upstream.close()


def _serve(listener, socket_path):
    while True:
        try:
            client, _ = listener.accept()
        except OSError:  # e.g. out of descriptors: wait for some to be freed
            time.sleep(0.01)
            continue
        threading.Thread(target=_handle, args=(client, socket_path), daemon=True).start()


def _listen(spec):
    host, sep, port = spec.rpartition(":")
    if not sep or not port.isdigit():
        raise SystemExit(f"forward_in_sandbox: --listen must be HOST:PORT, not {spec!r}")
    host = host.strip("[]") or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, int(port)))
    listener.listen(128)
    return listener


def main(argv=None):
    parser = argparse.ArgumentParser(prog="forward_in_sandbox", description=__doc__.split("\n")[0])
    parser.add_argument("--socket", required=True, help="the Unix socket to forward to")
    parser.add_argument("--listen", default="127.0.0.1:8765", help="HOST:PORT to listen on (loopback)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="add to CMD's environment")
    parser.add_argument("--env-file", default=None, metavar="PATH",
                        help="KEY=VALUE lines added to CMD's environment; the file is deleted once read (for secrets "
                             "that must not show on a command line)")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command given (put it after --)")
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
        listener = _listen(args.listen)
    except OSError as e:
        sys.stderr.write(f"forward_in_sandbox: cannot listen on {args.listen}: {e}\n")
        return 125
    threading.Thread(target=_serve, args=(listener, args.socket), daemon=True).start()
    try:
        child = subprocess.Popen(cmd, env=env)
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
