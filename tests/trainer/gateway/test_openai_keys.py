"""Per-episode keys and the server token: a key's calls are recorded into its session and reach nothing else, a
keyed session is closed to anonymous callers and to other keys, a token server answers only its token or an
issued key, and a non-loopback bind without a token is refused."""

from __future__ import annotations

import httpx
import openai
import pytest

from relax_gym.trainer.engines.http_server import EngineServer, serve, serve_openai
from relax_gym.trainer.gateway.api import OpenAIAPI
from relax_gym.trainer.engines.bearer import bearer_of
from relax_gym.trainer.gateway.keys import EpisodeKeys

from .test_openai_tools import ScriptedEngine, openai_client

MESSAGES = [{"role": "user", "content": "hi"}]


def http(url: str, key: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=url, headers=headers, trust_env=False, timeout=60)


def chat(client: httpx.Client, headers: dict[str, str] | None = None, **body) -> httpx.Response:
    return client.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES, **body}, headers=headers or {})


@pytest.fixture
def api(policy):
    return OpenAIAPI(ScriptedEngine(policy[1]))


def test_registry_issue_revoke_replace():
    keys = EpisodeKeys()
    a = keys.issue("ep-a")
    assert a.startswith("relax-ek-") and len(a) > 40 and keys.session_of(a) == "ep-a" and keys.has_key("ep-a")
    b = keys.issue("ep-a")
    assert b != a and keys.session_of(a) is None and keys.session_of(b) == "ep-a" and len(keys) == 1
    assert keys.revoke("ep-a") is True and keys.revoke("ep-a") is False and keys.session_of(b) is None
    with pytest.raises(ValueError, match="session id"):
        keys.issue("a/b")
    assert bearer_of({"authorization": "Bearer  k1 "}) == "k1" and bearer_of({"Authorization": "Basic x"}) is None


def test_a_key_records_into_its_session_and_reaches_nothing_else(api):
    key_a, key_b = api.keys.issue("ep-a"), api.keys.issue("ep-b")
    with serve_openai(api) as server, http(server.url, key_a) as a, http(server.url, key_b) as b, http(server.url) as anon:
        client = openai_client(server.url, key_a)
        r = client.chat.completions.create(model="m", messages=MESSAGES)
        assert r.model_extra["relax"]["session_id"] == "ep-a"  # no header needed: the key names the session
        client.close()
        assert chat(b).json()["relax"]["session_id"] == "ep-b"
        assert chat(anon, user="free").status_code == 200  # no token, keys issued: anonymous still works

        refused = chat(a, headers={"X-Relax-Session": "ep-b"})
        assert refused.status_code == 403 and refused.json()["error"]["type"] == "permission_error"
        assert chat(a, user="other").json()["error"]["param"] == "user"
        assert chat(anon, user="ep-a").status_code == 401  # writing a keyed session takes its key

        assert [c["index"] for c in a.get("/v1/relax/sessions/ep-a").json()["calls"]] == [0]
        assert b.get("/v1/relax/sessions/ep-a").status_code == 403  # another key can neither read ...
        assert b.delete("/v1/relax/sessions/ep-a").status_code == 403  # ... nor drop it
        assert anon.get("/v1/relax/sessions/ep-a").status_code == 401
        assert a.get("/v1/relax/sessions/free").status_code == 403  # a key reaches only its session
        assert a.get("/v1/relax/sessions").status_code == 403
        assert {s["id"] for s in anon.get("/v1/relax/sessions").json()["data"]} == {"free"}  # keyed ones hidden
        assert a.get("/v1/models").status_code == 200

        with http(server.url, "relax-ek-made-up") as stranger:
            assert chat(stranger).status_code == 401  # keys are issued: an unknown bearer is refused
        assert a.delete("/v1/relax/sessions/ep-a").json()["deleted"] is True
        api.keys.revoke("ep-a")
        assert chat(a).status_code == 401
    assert api.recorder.sessions() == {"ep-b": 1, "free": 1}


def test_without_keys_or_token_any_bearer_is_anonymous(api):
    with serve_openai(api) as server:
        client = openai_client(server.url, "sk-anything")
        assert client.chat.completions.create(model="m", messages=MESSAGES, user="u1").choices[0].message.content
        assert client.models.list().data[0].id == api.model_name
        client.close()


def test_token_server_takes_the_token_or_an_episode_key(api):
    key = api.keys.issue("ep-k")
    with serve_openai(api, token="s3cret") as server, http(server.url) as anon, http(server.url, "s3cret") as admin, \
            http(server.url, key) as episode, http(server.url, "wrong") as wrong:
        assert chat(anon).status_code == 401 and anon.get("/v1/models").status_code == 401
        assert wrong.get("/v1/relax/sessions").status_code == 401
        assert chat(episode).json()["relax"]["session_id"] == "ep-k"
        assert episode.get("/v1/relax/sessions/ep-k").status_code == 200
        assert episode.get("/v1/relax/sessions").status_code == 403
        assert chat(admin, user="admin-run").status_code == 200
        assert {s["id"] for s in admin.get("/v1/relax/sessions").json()["data"]} == {"ep-k", "admin-run"}
        assert admin.get("/v1/relax/sessions/ep-k").status_code == 200  # the admin reads every session
        assert admin.get("/generate").status_code == 404  # serve_openai has only the /v1 routes
        client = openai_client(server.url, "EMPTY")
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model="m", messages=MESSAGES)
        client.close()


class _Alive:
    alive = True

    def close(self) -> None:
        pass


def test_engine_server_token_guards_the_native_routes(api):
    engine = _Alive()
    with EngineServer(engine, openai=OpenAIAPI(engine), token="s3cret") as server:
        key = server.openai.keys.issue("ep-x")
        with http(server.url) as anon, http(server.url, "s3cret") as admin, http(server.url, key) as episode:
            assert anon.get("/health").status_code == 401 and anon.get("/health").json()["object"] == "error"
            assert episode.get("/health").status_code == 403  # episode keys reach only /v1
            assert admin.get("/health").status_code == 200
            assert episode.get("/v1/models").status_code == 200
    with EngineServer(engine, token="s3cret") as bare, http(bare.url, "s3cret") as admin:  # inference only
        assert admin.get("/health").status_code == 200 and admin.get("/v1/models").status_code == 404


def test_non_loopback_bind_needs_a_token(api):
    for host in ("0.0.0.0", "::"):  # refused before anything binds
        with pytest.raises(ValueError, match="not a loopback address"):
            serve(_Alive(), host=host)
        with pytest.raises(ValueError, match="token="):
            serve_openai(api, host=host)
    with pytest.raises(ValueError, match="token must be"):
        serve_openai(api, token=" padded ")
    with serve_openai(api, host="localhost") as server:  # loopback by name is fine without a token
        assert server.url.startswith("http://")


def test_the_engine_token_comes_from_the_environment_and_clients_send_it(monkeypatch):
    """RELAX_GYM_ENGINE_TOKEN: what a multi-node run sets on every node (docs/scaling.md) so that engines may bind a
    non-loopback host; the servers require it, the engine clients send it."""
    from relax_gym.trainer.engines.client import EngineClient

    monkeypatch.setenv("RELAX_GYM_ENGINE_TOKEN", "node-secret")
    with serve(_Alive()) as server, http(server.url) as anon:
        assert server.token == "node-secret" and anon.get("/health").status_code == 401
        with EngineClient(server.url, timeout=30, retries=0) as client:
            assert client.health()
