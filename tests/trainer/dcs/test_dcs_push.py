"""DCS pushes between two processes: this test process is the actor, embedded engines run in spawned children
behind their HTTP servers on loopback. Checked: the engine's weights are bit-identical to the actor's after a
push (SHA-256 per tensor), its next generation reports the pushed version and differs from before; the
pause → load → flush → continue sequence; a push to a dead engine fails with one error naming it and leaves the
coordinator's version as it was; a lost engine can be dropped and pushing goes on."""

from __future__ import annotations

import socket

import pytest
import torch

from relax_gym.trainer.dcs import DCSClient, DCSCoordinator, DCSError, DCSPushError, WeightMetadata, checkpoint_names
from relax_gym.trainer.engines.client import EngineClient
from relax_gym.trainer.engines.process import spawn_engine
from relax_gym.trainer.dcs.group import GroupReceiver, tensor_digest
from relax_gym.trainer.policy.model import PolicyConfig, build_policy

PROMPT = "Describe the weather in three words:"
BUCKET_MB = 0.25  # the tiny policy is ~2.8 MiB: about a dozen buckets


@pytest.fixture(scope="module")
def engine():
    """An engine process on the seed-0 tiny policy."""
    proc = spawn_engine(PolicyConfig(seed=0), weight_receiver=GroupReceiver())
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(engine):
    with EngineClient(engine.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def actors():
    """Actor-side policies with other weights than the engine's."""
    return {seed: build_policy(PolicyConfig(seed=seed))[0] for seed in (1, 2, 3, 4)}


def greedy(client: EngineClient) -> tuple[list[int], str | None]:
    out = client.generate(text=PROMPT, sampling_params={"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True})
    return out.output_ids, out.weight_version


def assert_bit_identical(client: EngineClient, model, coordinator: DCSCoordinator) -> None:
    names = checkpoint_names(model)
    local = {names[k]: tensor_digest(v) for k, v in model.state_dict().items()}
    remote = client.weights_checksum(list(local))  # aliases included: the tied lm_head must match too
    assert remote == local
    assert set(coordinator.weights.names) | set(coordinator.weights.aliases) == set(local)


def dead_url() -> str:
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("flatten", [None, False], ids=["flattened-bucket", "per-tensor"])
def test_tcp_push_makes_the_engine_bit_identical(engine, client, actors, flatten):
    model = actors[1] if flatten is None else actors[2]
    before, _ = greedy(client)
    coordinator = DCSCoordinator([engine.url], bucket_mb=BUCKET_MB, transport="tcp", version=0)
    version = 11 if flatten is None else 12
    with DCSClient(coordinator, names=checkpoint_names(model), flatten=flatten) as dcs:
        report = dcs.push(model.state_dict(), version=version)
    assert report.transport == "tcp" and report.version == version and report.engines == 1
    assert report.buckets == len(coordinator.buckets()) > 5 and report.bytes == coordinator.weights.nbytes
    assert report.seconds > 0 and set(report.phases) == {"stage", "pause", "load", "resume"}
    assert coordinator.version == version and coordinator.engine_versions == {engine.url: version}
    assert_bit_identical(client, model, coordinator)
    after, reported = greedy(client)
    assert reported == str(version) and after != before
    assert client.get_server_info()["stats"]["paused"] is False


def test_disk_push_makes_the_engine_bit_identical(engine, client, actors, tmp_path):
    model = actors[3]
    before, _ = greedy(client)
    coordinator = DCSCoordinator([engine.url], bucket_mb=BUCKET_MB, transport="disk")
    with DCSClient(coordinator, names=checkpoint_names(model), disk_dir=str(tmp_path / "dcs")) as dcs:
        report = dcs.push(model.state_dict(), version="disk-1")
        assert report.transport == "disk" and report.buckets == len(coordinator.buckets())
        assert_bit_identical(client, model, coordinator)
        after, reported = greedy(client)
        assert reported == "disk-1" and after != before
        shifted = {k: v + 0.5 for k, v in model.state_dict().items()}
        dcs.push(shifted, version="disk-2")
    (kept,) = (tmp_path / "dcs").iterdir()  # only the newest pushed version stays on disk
    assert kept.name.startswith("vdisk-2-") and len(list(kept.glob("*.safetensors"))) == report.buckets
    assert client.get_weight_version() == "disk-2" and coordinator.version == "disk-2"
    assert greedy(client)[0] != after


def test_every_engine_goes_pause_load_flush_continue(engine, client, actors, monkeypatch):
    """The calls each engine receives, in order, and the engine's own state while it loads, on the path of
    engines that do not stage (SGLang's): every bucket while paused (test_dcs_pipeline.py has the staged one)."""
    calls: list[str] = []
    model = actors[4]
    coordinator = DCSCoordinator([engine.url], bucket_mb=BUCKET_MB)
    with DCSClient(coordinator, names=checkpoint_names(model), staged=False) as dcs:
        dcs.push(model.state_dict(), version=1)  # forms the group (not recorded)
        (link,) = dcs._links.values()
        for name in ("pause_generation", "update_weights_from_distributed", "flush_cache", "continue_generation",
                     "get_weight_version"):
            original = getattr(link.client, name)

            def spy(*args, _name=name, _original=original, **kwargs):
                if _name == "update_weights_from_distributed":
                    paused = client.get_server_info()["stats"]["paused"]
                    calls.append(f"load(paused={paused}, version={kwargs.get('weight_version')})")
                else:
                    calls.append(_name)
                return _original(*args, **kwargs)

            monkeypatch.setattr(link.client, name, spy)
        report = dcs.push({k: v * 2 for k, v in model.state_dict().items()}, version=2)
    loads = [f"load(paused=True, version={None})"] * (report.buckets - 1) + ["load(paused=True, version=2)"]
    assert calls == ["pause_generation", *loads, "flush_cache", "continue_generation", "get_weight_version"]
    assert greedy(client)[1] == "2"


def test_push_to_a_dead_engine_names_it_and_keeps_the_version(engine, client, actors):
    dead = dead_url()
    coordinator = DCSCoordinator([engine.url, dead], bucket_mb=BUCKET_MB, version=7)
    version_before = client.get_weight_version()
    with DCSClient(coordinator, names=checkpoint_names(actors[1]), timeout_s=10) as dcs:
        with pytest.raises(DCSPushError) as info:
            dcs.push(actors[1].state_dict(), version=8)
    err = info.value
    # found at its first call (asking what it supports before the weight-update group forms), before any engine
    # is paused
    assert str(err).count(dead) == 1 and err.url == dead and err.step == "get_server_info" and err.untouched
    assert "no weights were sent" in str(err) and engine.url not in str(err)
    assert coordinator.version == 7 and coordinator.engine_versions == {engine.url: None, dead: None}
    assert client.get_weight_version() == version_before  # the live engine was not touched ...
    assert client.get_server_info()["stats"]["paused"] is False  # ... and generates again
    assert greedy(client)[1] == version_before


def test_a_state_dict_that_does_not_match_is_refused(engine, client, actors):
    model = actors[1]
    coordinator = DCSCoordinator([engine.url], bucket_mb=BUCKET_MB, version=3)
    names = checkpoint_names(model)
    coordinator.set_weights(WeightMetadata.from_state_dict(model.state_dict(), names))  # registered by the roles
    with DCSClient(coordinator, names=names) as dcs:
        state = dict(model.state_dict())
        state["model.language_model.norm.weight"] = torch.zeros(5)
        with pytest.raises(DCSError, match=r"'model.norm.weight' is float32\[5\].*float32\[128\]"):
            dcs.push(state, version=4)
        del state["model.language_model.norm.weight"]
        with pytest.raises(DCSError, match="lacks 1 registered tensor.*model.norm.weight"):
            dcs.push(state, version=4)
    assert coordinator.version == 3


def test_two_engines_then_one_dies(engine, client, actors):
    """One broadcast feeds two engines (world size 3); when one dies the push names it; once the roles drop it
    from the topology the group is rebuilt with the survivor and pushing goes on."""
    second = spawn_engine(PolicyConfig(seed=0), weight_receiver=GroupReceiver())
    try:
        model = actors[2]
        coordinator = DCSCoordinator([engine.url, second.url], bucket_mb=BUCKET_MB, version=0)
        with DCSClient(coordinator, names=checkpoint_names(model), timeout_s=20) as dcs, EngineClient(second.url) as other:
            dcs.push(model.state_dict(), version=21)
            assert_bit_identical(client, model, coordinator)
            assert_bit_identical(other, model, coordinator)
            second.kill()
            with pytest.raises(DCSPushError) as info:
                dcs.push({k: v + 1 for k, v in model.state_dict().items()}, version=22)
            assert info.value.url == second.url and second.url in str(info.value)
            assert coordinator.version == 21 and client.get_weight_version() == "21"
            coordinator.remove_engine(second.url)
            report = dcs.push({k: v + 1 for k, v in model.state_dict().items()}, version=23)
            assert report.engines == 1 and coordinator.version == 23 and greedy(client)[1] == "23"
    finally:
        second.stop()


def test_a_refused_load_leaves_the_engine_paused_until_resumed(engine, client, actors):
    """An engine that refuses a bucket while paused (here: names it does not know; SGLang's path, no staging)
    may hold part of the update: the push fails naming it and the step, the version stays, and the engine stays
    paused until told to continue."""
    model = actors[1]
    version_before = client.get_weight_version()
    coordinator = DCSCoordinator([engine.url], bucket_mb=BUCKET_MB, version=5)
    with DCSClient(coordinator, names=lambda key: f"no_such.{key}", staged=False) as dcs:
        with pytest.raises(DCSPushError) as info:
            dcs.push(model.state_dict(), version=6)
        err = info.value
        assert err.url == engine.url and err.step == "update_weights_from_distributed" and err.paused == (engine.url,)
        assert "unknown tensor name" in str(err) and "stay paused" in str(err)
        assert coordinator.version == 5 and client.get_weight_version() == version_before
        assert client.get_server_info()["stats"]["paused"] is True
        dcs.resume()
    assert client.get_server_info()["stats"]["paused"] is False and greedy(client)[1] == version_before
