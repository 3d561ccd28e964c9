"""``inference.engine: sglang``: the launcher, the request mapping, the weight pushes, the inference role.

SGLang itself cannot run here (no CUDA; it does not install beside the CPU torch), so tests that need a server use
the stand-in in ``sglang_standin/`` (put first on ``PYTHONPATH``): the launcher's unchanged command
``python -m sglang.launch_server --model-path ... --host ... --port ... --tp-size ... --mem-fraction-static ...``
starts relax-gym's embedded engine behind SGLang's flags. Those tests say ``standin`` in their names.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

from relax_gym.trainer.engines.settings import InferenceSection
from relax_gym.trainer.dcs.names import checkpoint_names
from relax_gym.trainer.engines.client import AsyncEngineClient, EngineClient, EngineHTTPError
from relax_gym.trainer.engines.factory import SGLangHost, start_engine
from relax_gym.trainer.engines.sglang import (
    MediaTokens,
    SGLangLaunchError,
    SGLangTransport,
    collapse_runs,
    launch_command,
    launch_sglang,
    to_sglang_generate,
)
from relax_gym.trainer.dcs.group import tensor_digest
from relax_gym.trainer.dcs.push import make_pusher
from relax_gym.trainer.policy import PolicyConfig, build_policy, save_policy

STANDIN = Path(__file__).parent / "sglang_standin"
TOKENS = MediaTokens(image=7, video=8, audio=9)


@pytest.fixture
def standin_path(monkeypatch):
    """``python -m sglang.launch_server`` resolves to the stand-in in child processes started from here."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(STANDIN), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny random policy saved as a checkpoint directory (what SGLang is pointed at)."""
    model, processor = build_policy(PolicyConfig(seed=3))
    return save_policy(model, processor, tmp_path_factory.mktemp("ckpt") / "policy"), model, processor


def _pgid_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


# ---------------------------------------------------------------------------------------------- command line


def test_launch_command_is_sglangs_cli():
    cmd = launch_command("/models/q", host="127.0.0.1", port=31000, tp_size=2, mem_fraction_static=0.6,
                         extra_args=["--dtype", "bfloat16"], python="/envs/sglang/bin/python")
    assert cmd == ["/envs/sglang/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/q", "--host",
                   "127.0.0.1", "--port", "31000", "--tp-size", "2", "--mem-fraction-static", "0.6", "--dtype", "bfloat16"]


@pytest.mark.parametrize("extra", [["--port", "1"], ["--tp-size=4"], ["--model-path", "x"], ["--tensor-parallel-size", "2"]])
def test_launch_command_refuses_flags_it_owns(extra):
    with pytest.raises(ValueError, match="extra_args repeats"):
        launch_command("/m", port=1, extra_args=extra)


def test_config_validates_the_sglang_section():
    with pytest.raises(ValueError, match=r"(?s)extra_args.*repeats \['--mem-fraction-static'\]"):
        InferenceSection.model_validate({"engine": "sglang", "sglang": {"extra_args": ["--mem-fraction-static", "0.9"]}})
    with pytest.raises(ValueError, match="mem_fraction_static"):
        InferenceSection.model_validate({"engine": "sglang", "sglang": {"mem_fraction_static": 1.0}})
    with pytest.raises(ValueError, match="tp_size"):
        InferenceSection.model_validate({"engine": "sglang", "sglang": {"tp_size": 0}})
    with pytest.raises(ValueError, match="extra_forbidden|Extra inputs"):
        InferenceSection.model_validate({"engine": "sglang", "sglang": {"tp": 2}})
    ok = InferenceSection.model_validate({"engine": "sglang", "sglang": {"model_path": "/m", "tp_size": 4}})
    assert ok.sglang.tp_size == 4 and ok.sglang.weight_sync == "nccl"


def test_the_run_config_needs_a_checkpoint_for_sglang():
    from relax_gym.trainer.config import RelaxConfig

    with pytest.raises(ValueError, match="inference.engine=sglang needs a checkpoint"):
        RelaxConfig.model_validate({"inference": {"engine": "sglang"}})
    cfg = RelaxConfig.model_validate({"inference": {"engine": "sglang"}, "model": {"path": "/ckpt"}})
    assert cfg.inference.engine == "sglang"


# ---------------------------------------------------------------------------------------------- request mapping


def test_pad_runs_collapse_to_one_placeholder_per_item():
    assert collapse_runs([1, 7, 7, 7, 2, 7, 3, 9, 9, 4, 4], TOKENS.ids) == [1, 7, 2, 7, 3, 9, 4, 4]
    assert collapse_runs([], TOKENS.ids) == []


def test_generate_body_is_mapped_for_sglang():
    body = {
        "input_ids": [5, 100, 7, 7, 7, 101, 100, 8, 8, 101, 6],
        "image_data": [{"url": "file:///tmp/a.png", "sampling": {"max_pixels": 4096}}],
        "video_data": [{"url": "/data/v.mp4", "sampling": {"fps": 1.0, "max_frames": 8, "min_frames": 2,
                                                            "max_pixels": 1024, "start_s": 0.0, "end_s": None,
                                                            "audio": {"sample_rate": 16000}}}],
        "audio_data": "data:audio/wav;base64,AAAA",
        "sampling_params": {"max_new_tokens": 4}, "return_logprob": True,
    }
    out = to_sglang_generate(body, TOKENS)
    assert out["input_ids"] == [5, 100, 7, 101, 100, 8, 101, 6]
    assert out["image_data"] == [{"url": "file:///tmp/a.png", "max_pixels": 4096}]
    assert out["video_data"] == [{"url": "/data/v.mp4", "fps": 1.0, "max_frames": 8, "min_frames": 2, "max_pixels": 1024,
                                  "use_audio": True}]
    assert out["audio_data"] == "data:audio/wav;base64,AAAA"
    assert out["sampling_params"] == {"max_new_tokens": 4} and out["return_logprob"] is True
    assert body["input_ids"][3] == 7  # the caller's body is not modified


def test_batch_bodies_are_mapped_per_request():
    body = {"input_ids": [[1, 7, 7], [2, 3]], "image_data": [[{"url": "/a.png", "sampling": None}], None]}
    out = to_sglang_generate(body, TOKENS)
    assert out["input_ids"] == [[1, 7], [2, 3]]
    assert out["image_data"] == [[{"url": "/a.png"}], None]


@pytest.mark.parametrize("item, message", [
    ({"url": "/v.mp4", "sampling": {"start_s": 2.0}}, r"video_data\[0\]: sampling.start_s=2.0 cannot be expressed"),
    ({"url": "/v.mp4", "sampling": {"end_s": 4.0}}, r"video_data\[0\]: sampling.end_s=4.0"),
    ("data:application/x-npy;base64,AAAA", r"video_data\[0\]: a raw array"),
    ("https://example.com/v.mp4", r"video_data\[0\]: http\(s\) URLs"),
    ({"url": "/v.mp4", "colour": 1}, r"unknown media item field\(s\) \['colour'\]"),
])
def test_media_sglang_cannot_take_faithfully_is_refused(item, message):
    with pytest.raises(ValueError, match=message):
        to_sglang_generate({"input_ids": [1, 8], "video_data": [item]}, TOKENS)


def test_media_tokens_come_from_the_checkpoint(checkpoint, tmp_path):
    path, _, processor = checkpoint
    tokens = MediaTokens.from_checkpoint(path)
    assert tokens == MediaTokens(image=processor.image_token_id, video=processor.video_token_id, audio=processor.audio_token_id)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": 10}))
    assert MediaTokens.from_checkpoint(tmp_path).ids == frozenset()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        MediaTokens.from_checkpoint(tmp_path / "missing")


def test_the_client_transport_rewrites_generate_and_answers_refusals_itself():
    seen: list[httpx.Request] = []

    def reply(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"text": "", "output_ids": [4], "meta_info": {
            "id": "r", "finish_reason": {"type": "length"}, "prompt_tokens": 3, "completion_tokens": 1,
            "output_token_logprobs": [[-0.5, 4, None]], "weight_version": "2"}})

    async def go() -> None:
        client = AsyncEngineClient("http://sglang.test", transport=SGLangTransport(TOKENS, httpx.MockTransport(reply)))
        out = await client.generate([1, 7, 7, 7, 2], image_data=[{"url": "/a.png", "sampling": {"max_pixels": 64}}],
                                    sampling_params={"max_new_tokens": 1})
        assert out.output_ids == [4] and out.output_logprobs == [-0.5] and out.weight_version == "2"
        sent = json.loads(seen[-1].content)
        assert sent["input_ids"] == [1, 7, 2] and sent["image_data"] == [{"url": "/a.png", "max_pixels": 64}]
        assert int(seen[-1].headers["content-length"]) == len(seen[-1].content)
        with pytest.raises(EngineHTTPError, match="sampling.start_s") as err:
            await client.generate([1, 8], video_data=[{"url": "/v.mp4", "sampling": {"start_s": 1.0}}])
        assert err.value.status_code == 400 and len(seen) == 1  # refused before reaching the server
        await client.aclose()

    asyncio.run(go())


# ---------------------------------------------------------------------------------------------- launcher


def test_launcher_starts_the_standin_server_generates_and_tears_down_its_process_group(standin_path, checkpoint, tmp_path):
    path, _, processor = checkpoint
    log = tmp_path / "server.log"
    server = launch_sglang(str(path), port=0, mem_fraction_static=0.5, python=sys.executable, startup_timeout_s=240,
                           log_path=log)
    pgid = os.getpgid(server.pid)
    try:
        assert pgid == server.pid and pgid != os.getpgid(0)  # its own process group
        assert server.url.startswith("http://127.0.0.1:")
        with EngineClient(server.url, timeout=60) as client:
            out = client.generate([processor.eos_token_id], sampling_params={"max_new_tokens": 3, "temperature": 0.0})
            assert len(out.output_ids) >= 1 and out.output_logprobs is not None
            assert client.get_weight_version() is not None  # /model_info, as SGLang 0.5.23 answers it
        assert "stand-in SGLang server" in log.read_text()
    finally:
        server.close()
    assert not server.alive and not _pgid_alive(pgid)
    with socket.socket() as sock:  # the port is free again
        sock.bind(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
    server.close()  # idempotent


def test_launcher_reports_a_standin_server_that_exits_during_startup(standin_path, checkpoint):
    path, _, _ = checkpoint
    with pytest.raises(SGLangLaunchError, match=r"exited with code 2 during start-up(.|\n)*unrecognized arguments: --no-such-flag"):
        launch_sglang(str(path), python=sys.executable, extra_args=["--no-such-flag"], startup_timeout_s=120)


def test_launcher_times_out_a_server_that_never_serves_and_kills_its_group(tmp_path):
    pids = tmp_path / "pids"
    never = tmp_path / "never-serves"  # stands for the interpreter: starts a worker in its group, never listens
    never.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pids}\necho $$ >> {pids}\nexec sleep 300\n")
    never.chmod(0o755)
    with pytest.raises(SGLangLaunchError, match=r"was not healthy within 2 s"):
        launch_sglang("/m", python=str(never), startup_timeout_s=2)
    started = [int(x) for x in pids.read_text().split()]
    assert len(started) == 2
    deadline = time.monotonic() + 10
    while any(_running(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in started if _running(pid)]  # the leader and its worker


def test_a_server_whose_leader_exits_during_startup_leaves_no_worker_behind(tmp_path):
    """The leader exits (and is reaped by the start-up poll) while a worker of its group still runs: close() must
    still kill the group, found by the leader's pid (os.getpgid of a reaped pid fails)."""
    pids = tmp_path / "pids"
    crash = tmp_path / "crashes"
    crash.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pids}\nexit 3\n")
    crash.chmod(0o755)
    with pytest.raises(SGLangLaunchError, match="exited with code 3 during start-up"):
        launch_sglang("/m", python=str(crash), startup_timeout_s=30)
    (worker,) = [int(x) for x in pids.read_text().split()]
    deadline = time.monotonic() + 10
    while _running(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(worker)


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


# ---------------------------------------------------------------------------------------------- weights and roles


def test_sglang_host_pushes_weights_to_the_standin_and_falls_back_to_disk_without_cuda(standin_path, checkpoint, tmp_path):
    path, model, _ = checkpoint
    inference = InferenceSection.model_validate({"engine": "sglang", "sglang": {
        "model_path": str(path), "python": sys.executable, "startup_timeout_s": 240, "disk_dir": str(tmp_path / "dcs")}})
    names = checkpoint_names(model)
    host = start_engine(inference, PolicyConfig(path=str(path)), log_dir=tmp_path)
    assert isinstance(host, SGLangHost)
    pusher = make_pusher(inference, names=names, engine=getattr(host, "engine", None), urls=[host.url])  # as colocate builds it
    try:
        new_state = {k: v.detach().clone() + 0.25 for k, v in model.state_dict().items()}
        report = pusher.push(new_state, 5)
        assert report.transport == "disk"  # no CUDA here: NCCL cannot be built, the disk fallback carries the push
        assert pusher.client.transport.reason and "CUDA" in pusher.client.transport.reason
        assert host.weight_version() == "5"
        with EngineClient(host.url) as client:
            sums = client.weights_checksum([names[k] for k in new_state])
        assert sums == {names[k]: tensor_digest(v) for k, v in new_state.items()}  # bit for bit
    finally:
        pusher.close()
        host.close()
    assert not host.server.alive


@pytest.mark.parametrize("family, expected", [("qwen2_5_omni", []), ("qwen3_omni_moe", ["--enable-return-routed-experts"])])
def test_an_moe_policy_launches_sglang_recording_routed_experts(checkpoint, monkeypatch, family, expected):
    """MoE rollouts ask every request for its routed experts: SGLang answers them only with the server flag."""
    from relax_gym.trainer.engines import sglang as sglang_module

    path, _, _ = checkpoint
    seen = {}

    class Server:
        url = "http://127.0.0.1:1"

    def fake_launch(model_path, **kwargs):
        seen.update(kwargs)
        return Server()

    monkeypatch.setattr(sglang_module, "launch_sglang", fake_launch)
    inference = InferenceSection.model_validate({"engine": "sglang", "sglang": {"model_path": str(path),
                                                                               "extra_args": ["--log-level", "info"]}})
    host = SGLangHost.launch(inference, PolicyConfig(family=family))
    host.proxy.close()
    assert seen["extra_args"] == ["--log-level", "info", *expected]


def test_inference_role_serves_generate_through_the_standin_sglang_server(standin_path, checkpoint):
    from relax_gym.trainer.async_engine.roles.inference import InferenceRole

    path, _, processor = checkpoint
    role = InferenceRole(PolicyConfig(path=str(path)).model_dump(mode="json"),
                         {"engine": "sglang", "sglang": {"python": sys.executable, "startup_timeout_s": 240}})
    try:
        body = {"input_ids": [processor.eos_token_id], "sampling_params": {"max_new_tokens": 2}, "return_logprob": True}
        status, data = asyncio.run(role.generate(body))  # the dict itself: no JSON between the worker and the replica
        assert status == 200 and len(data["output_ids"]) >= 1
        bad = {"input_ids": [1], "image_data": ["data:application/x-npy;base64,AA"]}
        status, message = asyncio.run(role.generate(bad))
        assert status == 400 and "raw array" in message
        assert asyncio.run(role.weight_version()) is not None
        role.check_health()
        os.killpg(os.getpgid(role.host.server.pid), signal.SIGKILL)  # the server dies: Serve's health check sees it
        role.host.server.process.wait(10)
        with pytest.raises(RuntimeError, match="the sglang engine is not running"):
            role.check_health()
    finally:
        role.host.close()


def test_no_relax_gym_module_imports_sglang():
    import ast

    package = Path(__file__).resolve().parents[3] / "relax_gym"
    offenders = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.relative_to(package)}: {n}" for n in names if n.split(".")[0] == "sglang"]
    assert not offenders


def test_a_fixed_port_is_refused_for_several_sglang_replicas():
    from relax_gym.trainer.config import RelaxConfig

    base = {"model": {"path": "/ckpt"}, "trainer": {"mode": "async"}, "roles": {"inference": {"replicas": 2}}}
    with pytest.raises(ValueError, match="inference.sglang.port=30000 with roles.inference.replicas=2"):
        RelaxConfig.model_validate({**base, "inference": {"engine": "sglang", "sglang": {"port": 30000}}})
    assert RelaxConfig.model_validate({**base, "inference": {"engine": "sglang"}}).inference.sglang.port == 0
