"""Served environments: the HTTP env server and its client env, in one process (the server on a thread).

Round trips with media by reference and inline (arrays included), check_env through the server, an env's exception
coming back with the server's message, tokens, unknown sessions, closing, the manifest's [server] table, and a
server that fails to start (its log named). Hardening: client constructor kwargs refused unless allowed (some never),
an unencodable reply answered with one error (the step not run twice), bad Content-Length headers, concurrent creates
against max_sessions, and closing a session while a request uses it. The child-process launcher against a second venv is in
test_env_server_venv.py."""

from __future__ import annotations

import http.client
import json
import secrets
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import gymnasium
import numpy as np
import pytest

import relax_gym
from relax_gym.envs import ManifestError, check_env, discover, load_manifest
from relax_gym.envs.core import AgentEnv, Opening, Outcome
from relax_gym.envs.remote import (
    EnvServer,
    RemoteEnv,
    RemoteEnvError,
    ServeError,
    ServerStartError,
    launcher,
)
from relax_gym.envs.remote.client import _Connection, _dropped, parse_remote_id
from relax_gym.envs.remote.wire import (
    Spool,
    decode_messages,
    decode_value,
    encode_messages,
    encode_value,
)
from relax_gym.omni import ImagePart, Message, TextPart, VideoPart

from ..waiting import wait_until
from .test_registry import write_manifest


class Fragile(AgentEnv):
    """Two turns; step raises when the action says so (bypassing AgentEnv's own catch), and every close is counted."""

    media_kinds = ("image",)
    closed = 0
    steps = 0  # env.step calls, all instances
    made_delay_s = 0.0  # a slow constructor (concurrent creates)
    gate: threading.Event | None = None  # the action "wait" blocks on it
    entered: threading.Event | None = None  # set when a "wait" step has begun (it holds its session)

    def __init__(self, ok_reward: float = 0.5, **kwargs: Any) -> None:
        super().__init__(max_turns=2, **kwargs)
        self.ok_reward = ok_reward
        time.sleep(type(self).made_delay_s)

    def _reset(self, options: dict[str, Any]) -> Opening:
        picture = np.full((4, 6, 3), int(self.np_random.integers(256)), np.uint8)
        return Opening([Message("user", (ImagePart.of(picture), TextPart("say ok twice")))], "ok", {"shape": (4, 6), "n": np.int64(3)})

    def _step(self, action: str) -> Outcome:
        info = {"x": np.array([object()], dtype=object)} if action == "weird" else {}  # no JSON form: np.save refuses it
        return Outcome([Message("user", (TextPart("again"),))] if self._turn < 2 else [], self.ok_reward if action == "ok" else 0.0,
                       self._turn >= 2, {"ok": float(action == "ok")}, info=info)

    def step(self, action):
        type(self).steps += 1
        if action == "explode":
            raise RuntimeError("boom: the env broke on purpose")
        if action == "wait":
            if type(self).entered is not None:
                type(self).entered.set()
            assert type(self).gate is not None and type(self).gate.wait(30)
        return super().step(action)

    def close(self) -> None:
        type(self).closed += 1


@pytest.fixture
def serve():
    servers: list[EnvServer] = []

    def start(env_id: str, **kwargs: Any) -> EnvServer:
        server = EnvServer(env_id, **kwargs)
        server.start()
        servers.append(server)
        return server

    yield start
    for s in servers:
        s.close()


@pytest.fixture
def fragile(clean_registry):
    relax_gym.register(id="fragile", entry_point=Fragile, modalities=["image", "text"])
    Fragile.closed = Fragile.steps = 0
    Fragile.made_delay_s, Fragile.gate, Fragile.entered = 0.0, None, None
    return "fragile"


def request(url: str, method: str, path: str, body: dict | None = None, token: str | None = None) -> tuple[int, dict]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    response = conn.getresponse()
    out = response.status, json.loads(response.read())
    conn.close()
    return out


def test_wire_round_trip_keeps_arrays_paths_and_bytes(tmp_path):
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(b"not really a video")
    frames = np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)
    messages = [Message("user", (ImagePart.of(np.eye(3, dtype=np.float32)), VideoPart.of(frames, fps_of_array=2.0),
                                 VideoPart.of(clip, fps=2.0), ImagePart.of(b"\x89PNG...", mime="image/png"), TextPart("hi")))]
    spool = Spool(tmp_path / "spool")
    ref = encode_messages(messages, "ref", spool)
    urls = [p[k]["url"] for p in ref[0]["content"] for k in ("image_url", "video_url") if k in p]
    assert all(u.startswith("file://") for u in urls) and urls[2] == clip.as_uri()
    assert decode_messages(json.loads(json.dumps(ref))) == messages  # arrays, their rate, bytes and paths all survive
    inline = encode_messages(messages, "inline")
    urls = [p[k]["url"] for p in inline[0]["content"] for k in ("image_url", "video_url") if k in p]
    assert all(u.startswith("data:") for u in urls) and urls[2].startswith("data:video/mp4;base64,")
    back = decode_messages(json.loads(json.dumps(inline)))
    assert back[0].content[:2] == messages[0].content[:2] and back[0].content[2].source.data == clip.read_bytes()
    spool.clear()
    assert list((tmp_path / "spool").iterdir()) == []
    info = {"xy": (1, 2), "n": np.int64(3), "a": np.ones((2, 2), np.float32), "p": tmp_path, "o": object}
    out = decode_value(json.loads(json.dumps(encode_value(info))))
    assert out["xy"] == [1, 2] and out["n"] == 3 and out["a"].dtype == np.float32 and out["p"] == str(tmp_path)
    assert out["o"] == repr(object)


@pytest.mark.parametrize("media", ["ref", "inline"])
def test_image_zoom_through_the_server_passes_check_env_and_matches_in_process(serve, media):
    server = serve("image-zoom")
    env = relax_gym.make(f"remote:{server.url}/image-zoom?media={media}")
    assert isinstance(env.unwrapped, RemoteEnv) and env.unwrapped.remote_media == media
    assert env.spec.id == "relax/image-zoom" and env.action_space == relax_gym.make("image-zoom").action_space
    report = check_env(env)
    assert "gold action => max reward" in report.passed
    local = relax_gym.make("image-zoom")
    (obs, info), (obs0, info0) = env.reset(seed=5), local.reset(seed=5)
    assert obs == obs0 and info["gold"] == info0["gold"] and info["square_xy"] == list(info0["square_xy"])
    step, step0 = env.step(info["gold"]), local.step(info0["gold"])  # the zoom tool answers with a new image array
    assert step[0] == step0[0] and step[1:4] == step0[1:4]
    assert np.array_equal(step[0][0].media()[0].decode(), step0[0][0].media()[0].decode())
    env.close()
    assert server.sessions == 0


def test_video_files_go_by_path_or_inline(serve):
    server = serve("nextqa-video")
    by_ref = relax_gym.make(f"remote:{server.url}/nextqa-video")  # loopback server: by reference
    inline = relax_gym.make(f"remote:{server.url}/nextqa-video", remote_media="inline")
    (obs_ref, _), (obs_inline, _) = by_ref.reset(seed=1), inline.reset(seed=1)
    ref_video, inline_video = obs_ref[-1].media()[0], obs_inline[-1].media()[0]
    assert ref_video == relax_gym.make("nextqa-video").reset(seed=1)[0][-1].media()[0]  # the very same file
    assert inline_video.source.path is None and inline_video.source.data == ref_video.source.path.read_bytes()
    assert np.array_equal(ref_video.decode().frames, inline_video.decode().frames)


def test_env_kwargs_reach_the_server_and_errors_name_the_culprit(serve, fragile):
    server = serve(fragile)
    env = relax_gym.make(f"remote:{server.url}/{fragile}")
    obs, info = env.reset(seed=0)
    assert info["shape"] == [4, 6] and info["n"] == 3 and obs[0].media()[0].source.array.shape == (4, 6, 3)
    with pytest.raises(RemoteEnvError, match="fragile at http://127.*: step failed: RuntimeError: boom: the env broke on purpose") as err:
        env.step("explode")
    assert err.value.kind == "RuntimeError" and err.value.status == 500 and "boom" in err.value.remote_traceback
    assert isinstance(err.value, Exception)  # what the trainer's episode runner catches: the episode is masked env_error
    env.reset(seed=0)  # the session survives its env's exception
    assert env.step("ok")[1] == 0.5
    lenient = serve(fragile, allow_kwargs=["colour"])
    with pytest.raises(RemoteEnvError, match="make failed: TypeError: .*colour") as err:
        relax_gym.make(f"remote:{lenient.url}/{fragile}", colour="red")
    assert err.value.status == 500 and "make" in err.value.culprit and lenient.sessions == 0


def test_close_frees_the_env_and_reset_reopens(serve, fragile):
    server = serve(fragile)
    env = relax_gym.make(f"remote:{server.url}/{fragile}")
    env.reset(seed=0)
    sid = env.unwrapped.session_id
    assert server.sessions == 1 and len(sid) == 32
    env.close()
    assert server.sessions == 0 and Fragile.closed == 2  # the server's probe env, then this one
    env.close()  # idempotent
    status, body = request(server.url, "POST", f"/v1/envs/{fragile}/sessions/{sid}/reset", {"seed": 0})
    assert status == 404 and body["error"]["culprit"] == "session"
    env.reset(seed=0)  # gymnasium allows reset after close: a new session
    assert server.sessions == 1 and env.unwrapped.session_id != sid


def test_unknown_session_route_and_bad_requests_are_json_errors(serve, fragile):
    server = serve(fragile)
    guess = secrets.token_hex(16)
    assert request(server.url, "POST", f"/v1/envs/{fragile}/sessions/{guess}/step", {"action": "ok"})[0] == 404
    assert request(server.url, "DELETE", f"/v1/envs/{fragile}/sessions/{guess}")[1]["error"]["type"] == "UnknownSession"
    status, body = request(server.url, "GET", "/v1/envs/other-env")
    assert status == 404 and "serves 'fragile', not 'other-env'" in body["error"]["message"]
    assert request(server.url, "GET", "/nowhere")[1]["error"]["culprit"] == "path"
    status, body = request(server.url, "POST", f"/v1/envs/{fragile}/sessions", {"media": "carrier-pigeon"})
    assert status == 400 and body["error"]["culprit"] == "media"
    sid = request(server.url, "POST", f"/v1/envs/{fragile}/sessions", {})[1]["session"]
    status, body = request(server.url, "POST", f"/v1/envs/{fragile}/sessions/{sid}/reset", {"seed": "zero"})
    assert status == 400 and body["error"]["culprit"] == "seed"
    status, body = request(server.url, "POST", f"/v1/envs/{fragile}/sessions/{sid}/step", {})
    assert status == 400 and body["error"]["culprit"] == "action"
    status, info = request(server.url, "GET", f"/v1/envs/{fragile}")
    assert status == 200 and info["observation_space"]["media_kinds"] == ["image"] and info["max_turns"] == 2


def test_token_is_required_and_public_addresses_need_one(serve, fragile):
    with pytest.raises(ServeError, match="0.0.0.0, which is not a loopback address, without a token"):
        EnvServer(fragile, host="0.0.0.0")
    server = serve(fragile, token="s3cret")
    assert request(server.url, "GET", "/v1/health")[0] == 401
    assert request(server.url, "GET", "/v1/health", token="wrong")[0] == 403
    with pytest.raises(RemoteEnvError, match="Unauthorized") as err:
        relax_gym.make(f"remote:{server.url}/{fragile}")
    assert err.value.status == 401 and err.value.culprit == "Authorization header"
    env = relax_gym.make(f"remote:{server.url}/{fragile}", remote_token="s3cret")
    env.reset(seed=0)
    sid = env.unwrapped.session_id
    assert request(server.url, "POST", f"/v1/envs/{fragile}/sessions/{sid}/step", {"action": "ok"}, token="wrong")[0] == 403
    assert request(server.url, "POST", f"/v1/envs/{fragile}/sessions/{sid}/step", {"action": "ok"})[0] == 401
    assert env.step("ok")[1] == 0.5  # the session is untouched by the refused requests


def test_a_dead_server_is_an_error_not_a_hang(serve, fragile):
    server = serve(fragile)
    env = relax_gym.make(f"remote:{server.url}/{fragile}")
    server.close()
    with pytest.raises(RemoteEnvError, match="env server at http://127.0.0.1"):
        env.reset(seed=0)


def test_remote_ids_parse():
    assert parse_remote_id("remote:http://127.0.0.1:8765/nextqa-video") == ("http://127.0.0.1:8765", "nextqa-video", {})
    assert parse_remote_id("remote:http://h:1/proxy/x?media=inline&timeout_s=5") == (
        "http://h:1/proxy", "x", {"remote_media": "inline", "remote_timeout_s": 5.0})
    for bad in ("remote:http://127.0.0.1:8765", "remote:ftp://h/x", "remote:http://h:1/x?colour=red"):
        with pytest.raises(ValueError):
            parse_remote_id(bad)


def test_server_table_in_the_manifest(tmp_path, monkeypatch, clean_registry):
    def server_table(body: str, extra: str = 'entry_point = "a.b:C"\n') -> str:
        return f'id = "s"\n{extra}[server]\n{body}\n'

    for body, reason in (("", "exactly one of url, python or venv"), ('url = "http://h:1"\npython = "p"', "(got url, python)"),
                         ('url = "https://h:1"', "is not http://HOST:PORT"), ('venv = "v"\nmedia = "fax"', "'auto', 'ref' or 'inline'")):
        (tmp_path / "env.toml").write_text(server_table(body))
        with pytest.raises(ManifestError, match=reason.replace("(", r"\(").replace(")", r"\)")):
            load_manifest(tmp_path)
    (tmp_path / "env.toml").write_text(server_table('url = "http://127.0.0.1:9"', extra=""))  # url: no entry point needed
    assert load_manifest(tmp_path).server.url == "http://127.0.0.1:9"
    m = load_manifest(write_manifest(tmp_path / "v", server_table('venv = "../venv"')))
    assert m.server.interpreter(tmp_path / "v") == tmp_path / "venv" / "bin" / "python"
    write_manifest(tmp_path / "path" / "served", server_table('python = "/nowhere/python"').replace('"s"', '"served-x"'))
    monkeypatch.setenv("RELAX_GYM_ENV_PATH", str(tmp_path / "path"))
    discover(force=True)
    spec = relax_gym.spec("served-x")
    assert spec.server == "started with /nowhere/python" and spec.entry_point == "a.b:C"
    with pytest.raises(ManifestError, match="field 'server.python': no Python interpreter at /nowhere/python"):
        relax_gym.make("served-x")


def test_a_server_that_cannot_start_names_its_log(tmp_path, monkeypatch, clean_registry):
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'ModuleNotFoundError: no module named relaxgym_missing' >&2\nexit 3\n")
    fake.chmod(0o755)
    write_manifest(tmp_path / "envs" / "broken", 'id = "broken-served"\nentry_point = "relaxgym_missing:Env"\n'
                                                 '[server]\npython = "../../bin/python"\n')
    monkeypatch.setenv("RELAX_GYM_ENV_PATH", str(tmp_path / "envs"))
    monkeypatch.setenv("RELAX_GYM_CACHE", str(tmp_path / "cache"))
    discover(force=True)
    with pytest.raises(ServerStartError) as err:
        relax_gym.make("broken-served")
    log = tmp_path / "cache" / "env-servers"
    assert "exited with status 3" in str(err.value) and str(log) in str(err.value)
    assert "no module named relaxgym_missing" in str(err.value)  # the log's tail


def test_url_manifest_makes_a_client_both_ways(serve, fragile, tmp_path, monkeypatch):
    server = serve(fragile)
    write_manifest(tmp_path / "far", f'id = "fragile-far"\n[server]\nurl = "{server.url}"\nenv_id = "fragile"\nmedia = "inline"\n')
    write_manifest(tmp_path / "wrong", f'id = "fragile-wrong"\n[server]\nurl = "{server.url}"\n')
    monkeypatch.setenv("RELAX_GYM_ENV_PATH", str(tmp_path))
    discover(force=True)
    assert relax_gym.spec("fragile-far").server == server.url
    for env in (relax_gym.make("fragile-far"), gymnasium.make("relax/fragile-far")):
        assert env.unwrapped.remote_media == "inline" and env.reset(seed=0)[0][0].media()[0].source.array.shape == (4, 6, 3)
        env.close()
    with pytest.raises(RemoteEnvError, match="serves 'fragile', not 'fragile-wrong'"):
        relax_gym.make("fragile-wrong")


# ---------------------------------------------------------------------------------------------- hardening


def test_client_kwargs_are_refused_unless_allowed_and_some_never(serve, fragile):
    strict = serve(fragile)
    with pytest.raises(RemoteEnvError, match="does not take the constructor kwargs 'ok_reward' from clients") as err:
        relax_gym.make(f"remote:{strict.url}/{fragile}", ok_reward=0.75)
    assert err.value.status == 403 and err.value.kind == "KwargsRefused" and err.value.culprit == "kwargs"
    assert strict.sessions == 0 and Fragile.closed == 1  # only the server's probe env was ever made

    fixed = serve(fragile, kwargs={"ok_reward": 0.25})  # the operator's kwargs: every session, no client involved
    env = relax_gym.make(f"remote:{fixed.url}/{fragile}")
    env.reset(seed=0)
    assert env.step("ok")[1] == 0.25

    lenient = serve(fragile, allow_kwargs=["ok_reward"])
    env = relax_gym.make(f"remote:{lenient.url}/{fragile}", ok_reward=0.75)  # allowed by name
    env.reset(seed=0)
    assert env.step("ok")[1] == 0.75
    for bad, named in (({"runner": "local"}, "'runner'"), ({"sandbox": {"network": True}}, "'sandbox'"),
                       ({"backend": "none"}, "'backend'"), ({"data_dir": "/"}, "'data_dir'"), ({"cache_path": "/"}, "'cache_path'"),
                       ({"ok_reward": {"root": "/"}}, "'ok_reward.root'")):  # even nested in an allowed one
        status, body = request(lenient.url, "POST", f"/v1/envs/{fragile}/sessions", {"kwargs": bad})
        assert status == 403 and named in body["error"]["message"] and "never takes" in body["error"]["message"], bad
    with pytest.raises(ServeError, match="--allow-kwarg runner, sandbox_root: never accepted from a client"):
        EnvServer(fragile, allow_kwargs=["ok_reward", "runner", "sandbox_root"])
    assert lenient.sessions == 1


def test_an_unencodable_info_is_one_clear_error_and_the_step_runs_once(serve, fragile):
    server = serve(fragile)
    env = relax_gym.make(f"remote:{server.url}/{fragile}")
    env.reset(seed=0)
    assert env.step("ok")[1] == 0.5  # the keep-alive connection is reused from here on
    Fragile.steps = 0
    with pytest.raises(RemoteEnvError, match=r"step failed: NotSerialisable: step: info\['x'\] is not JSON-serialisable") as err:
        env.step("weird")
    assert err.value.status == 500 and err.value.culprit == "info['x']"
    assert Fragile.steps == 1  # answered, so never sent again
    assert server.sessions == 1 and env.reset(seed=0) and env.step("ok")[1] == 0.5  # the session and connection live on


class _Flaky(BaseHTTPRequestHandler):
    """Answers /ok; reads a /drop request and closes the connection without answering; /ok-close answers and then
    closes the connection (as a server does with an idle keep-alive connection)."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[str]] = []

    def _any(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).seen.append(f"{self.command} {self.path}")
        if self.path == "/drop":
            self.close_connection = True
            return
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")
        if self.path == "/ok-close":
            self.close_connection = True

    do_GET = do_POST = do_DELETE = _any

    def log_message(self, *args: Any) -> None:
        pass


def test_the_client_never_sends_a_post_twice_but_reconnects_when_it_can():
    _Flaky.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    conn = _Connection(f"http://127.0.0.1:{httpd.server_address[1]}", None, 10.0)
    try:
        assert conn.request("POST", "/ok", {}) == (200, {})
        with pytest.raises(RemoteEnvError, match="not sent again: the server may have acted on it"):
            conn.request("POST", "/drop", {"action": "x"})
        assert _Flaky.seen.count("POST /drop") == 1
        assert conn.request("GET", "/ok") == (200, {})
        with pytest.raises(RemoteEnvError, match="closed the connection during GET /drop"):
            conn.request("GET", "/drop")
        assert _Flaky.seen.count("GET /drop") == 2  # idempotent: once more on a fresh connection
        assert conn.request("POST", "/ok-close", {}) == (200, {})
        assert wait_until(lambda: _dropped(conn._conn))  # the server's close reached us while idle ...
        # ... and is noticed before sending, so a POST goes out fine
        assert conn.request("POST", "/ok", {}) == (200, {})
    finally:
        conn.close()
        httpd.shutdown()
        httpd.server_close()


def _raw(url: str, head: str, body: bytes = b"", shut: bool = False) -> tuple[int, dict]:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        if shut:
            sock.shutdown(socket.SHUT_WR)
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < int(
                data.split(b"Content-Length: ", 1)[1].split(b"\r\n", 1)[0] if b"Content-Length: " in data else 1 << 30):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    status_line, rest = data.split(b"\r\n", 1)
    return int(status_line.split()[1]), json.loads(rest.split(b"\r\n\r\n", 1)[1])


def test_bad_content_length_headers_are_answered(serve, fragile):
    server = serve(fragile)
    path = f"/v1/envs/{fragile}/sessions"
    for header, status in (("Content-Length: -5", 400), ("Content-Length: abc", 400), ("Content-Length: 1_0", 400),
                           ("Content-Length: 2\r\nContent-Length: 3", 400), ("Transfer-Encoding: chunked", 411),
                           (f"Content-Length: {(64 << 20) + 1}", 413)):
        got, body = _raw(server.url, f"POST {path} HTTP/1.1\r\nHost: x\r\n{header}\r\n", b"{}")
        assert got == status and "error" in body, header
    got, body = _raw(server.url, f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n", b"{}", shut=True)
    assert got == 400 and "ended after 2 of 10 bytes" in body["error"]["message"]
    assert server.sessions == 0 and request(server.url, "GET", "/v1/health")[1]["ok"]


def test_concurrent_creates_respect_max_sessions(serve, fragile):
    server = serve(fragile, max_sessions=2)
    Fragile.made_delay_s = 0.3  # every create is in flight at once
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(request(server.url, "POST", f"/v1/envs/{fragile}/sessions", {})[0]))
               for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) == [201, 201, 503, 503, 503] and server.sessions == 2


def test_closing_or_reaping_a_session_waits_for_the_request_using_it(serve, fragile):
    server = serve(fragile, idle_timeout_s=0.0)  # every session counts as idle at once: only the lock protects it
    Fragile.gate, Fragile.entered = threading.Event(), threading.Event()
    env = relax_gym.make(f"remote:{server.url}/{fragile}")
    env.reset(seed=0)
    sid = env.unwrapped.session_id
    stepped: list[Any] = []
    deleted: list[Any] = []
    stepping = threading.Thread(target=lambda: stepped.append(env.step("wait")))
    stepping.start()
    assert Fragile.entered.wait(30)  # the step holds the session now
    assert request(server.url, "POST", f"/v1/envs/{fragile}/sessions", {})[0] == 201  # a create reaps idle sessions
    assert server.sessions == 2 and Fragile.closed == 1  # ... but not the one in use (only the probe is closed)
    deleting = threading.Thread(target=lambda: deleted.append(request(server.url, "DELETE", f"/v1/envs/{fragile}/sessions/{sid}")))
    deleting.start()
    assert wait_until(lambda: server.sessions == 1)  # the DELETE took the session off the table, then waits for its lock
    assert deleting.is_alive() and Fragile.closed == 1 and not deleted  # the close waits for the step
    Fragile.gate.set()
    stepping.join(30)
    deleting.join(30)
    assert Fragile.closed == 2 and stepped[0][1] == 0.0 and deleted == [(200, {"closed": True})]
    status, body = request(server.url, "POST", f"/v1/envs/{fragile}/sessions/{sid}/step", {"action": "ok"})
    assert status == 404 and body["error"]["type"] == "UnknownSession"


def test_launcher_gives_the_trainers_kwargs_to_its_server_at_startup(tmp_path, monkeypatch, clean_registry):
    write_manifest(tmp_path / "envs" / "zoom", f'''id = "zoom-served"
entry_point = "relax_gym.envs.image_zoom:ImageZoomEnv"
modalities = ["image", "text"]
[server]
python = "{sys.executable}"
''')
    monkeypatch.setenv("RELAX_GYM_ENV_PATH", str(tmp_path / "envs"))
    monkeypatch.setattr(launcher, "log_dir", lambda: tmp_path / "server-logs")
    monkeypatch.setattr(launcher, "_servers", {})
    discover(force=True)
    try:
        two = relax_gym.make("zoom-served", max_turns=2)  # e.g. a recipe's env.kwargs: the server's, fixed at startup
        plain = relax_gym.make("zoom-served")
        assert two.unwrapped.max_turns == 2 and plain.unwrapped.max_turns == 4
        assert two.unwrapped.env_kwargs == {} and two.reset(seed=0)[0]  # nothing sent as a client's kwargs
        assert sorted(s.kwargs.get("max_turns", 0) for s in launcher._servers.values()) == [0, 2]  # a server each
    finally:
        launcher.stop_all()
