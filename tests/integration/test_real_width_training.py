"""Training at real width on CPU (issue 34, item 4): RL steps in colocate and in async mode, checkpoint save and
``--resume``, from the Qwen2.5-Omni-3B stand-in (the session's ``standin_3b``: published layout, real widths --
hidden 2048, a 151,936-token untied vocabulary, 1280-wide vision and audio towers --, one layer per stack, bf16).

One run covers both modes: ``recipes/cpu-nextqa.yaml`` with ``model.path`` set to the stand-in trains its first
step in colocate mode (:func:`~relax_gym.trainer.train.build_trainer` in this process, so the engine's weights can
be read) and is killed when its second starts; ``relax-gym train --resume`` then trains that second step in async
mode (the CLI itself: roles as Ray Serve deployments around the real TransferQueue bus, S = 0). Each real-width run
costs minutes of the suite's CPU, so the async step starts from the colocate checkpoint instead of a run of its
own. The recipe is shrunk to the least that still trains on video + text: 2 prompts x 2 samples of a NExT-QA clip
(2 frames: one temporal patch, 144 video tokens) with its question, 4 new tokens, 2 eval episodes at the start and
the end, no SFT warm-up (so what changes the weights is the RL step).

The reward is a probe: a random-weight policy never writes ``<answer>X</answer>`` in 4 tokens, so the env's own
reward is 0 for every sample, every group's advantages are 0 and the RL step has nothing to learn from (no forward,
no optimiser step: the weights would not move). The probe env is the real ``nextqa-video`` env (same clips,
question, media sampling) scored by a rubric whose one rule maps any answer text to a number in [0, 1] that differs
between different texts, so each group has a better and a worse sample. Async env workers live in Ray processes,
so the probe is served to them from this process by an env server on loopback (``env.id=remote:URL/ID``).

Checked: rc / result, the metrics rows (eval at 0 and at the end, each step with its samples forwarded), finite
losses and gradient norm, the policy version advanced by each step, the weights the engine serves after the step
are the checkpoint's and differ from the stand-in's where the step had gradients (and are equal to them where it
had none: the audio tower, since no sample holds audio), everything kept in bf16, the checkpoints in the published
formats; the run killed after its step-1 checkpoint resumes from that checkpoint's weights and optimizer state bit
for bit, with its step counter and policy version, keeps the metrics rows written before it, and trains on (in
async mode) to the next step, nothing lost.

Memory (one pytest process runs it; the issue allows 12 GB per test process): the colocate part peaks at ~10 GB
(actor weights, gradients and AdamW's bf16 moments, the engine's copy: 0.8 B parameters each), the async actor
replica at ~8 GB, its inference replica at ~3 GB; the run directory (4.7 GB per checkpoint) is removed at teardown.
"""

from __future__ import annotations

import gc
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

import relax_gym
from relax_gym.cli import app
from relax_gym.envs.remote.server import EnvServer
from relax_gym.envs.rubric_env import with_rubric

from ..registry_state import restored_registry

pytestmark = [pytest.mark.integration,
              pytest.mark.slow(reason="trains Qwen2.5-Omni-3B-wide stand-ins (151,936-token head) on the CPU"),
              pytest.mark.timeout(900)]

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cpu-nextqa.yaml"
PROBE_ID = "test-real-width-probe"
P, G = 2, 2  # prompts per step, samples per prompt
# the recipe's env kwargs (split, 8 frames, system prompt; eval: val split, cycled), passed through the env server
ENV_KWARGS = ("split", "video", "system_prompt", "pick")


def small(env_id: str, *, steps: int = 1) -> list[str]:
    """The overrides of every run here: the recipe at its smallest that still trains on video + text."""
    return ["model.base=null", f"env.id={env_id}", f"trainer.steps={steps}", "trainer.sft_warmup_steps=0",
            f"trainer.prompts_per_step={P}", f"trainer.group_size={G}", "trainer.eval_episodes=2",
            "trainer.eval_every=1000", "trainer.checkpoint_every=1", "trainer.time_budget_s=null",
            # one temporal patch of 2 frames: 144 video tokens (the checkpoint's video processor sizes a temporal
            # patch to at least 128 merged patches), instead of the recipe's 8 frames (576)
            "env.kwargs.video.max_frames=2", "env.kwargs.video.min_frames=2",
            "inference.max_new_tokens=4", "metrics.tensorboard=false", "metrics.rollouts_per_step=0"]


def probe_reward(response: str, context: dict) -> float:
    """A number in [0, 1] that differs between (almost) any two different answers: the sum of its code points mod
    1000. Random-weight samples differ, so a group's advantages are not all zero."""
    return (sum(map(ord, response)) % 1000) / 999


def probe_env(**kwargs):
    """``nextqa-video`` as it is (clips, questions, media sampling), scored by :func:`probe_reward`."""
    return with_rubric(relax_gym.make("nextqa-video", **kwargs),
                       {"parts": [{"name": "probe", "rule": f"{__name__}:probe_reward"}]})


@pytest.fixture(scope="module")
def probe():
    """(the probe's id in this process, its ``remote:`` id for Ray processes)."""
    with restored_registry():
        relax_gym.register(PROBE_ID, probe_env, override=True)
        server = EnvServer(PROBE_ID, allow_kwargs=ENV_KWARGS)
        server.start()
        try:
            yield PROBE_ID, f"remote:{server.url}/{PROBE_ID}"
        finally:
            server.close()


@pytest.fixture
def run_dir(tmp_path):
    """The run's directory, removed at teardown whatever the outcome: its checkpoints are 4.7 GB each (the bf16
    weights, 1.6 GB, and AdamW's two bf16 moments), too much to leave in pytest's kept temporary folders."""
    path = tmp_path / "run"
    yield path
    shutil.rmtree(path, ignore_errors=True)


# -- reading weights ----------------------------------------------------------------------------------------------


def weight_files(folder: Path) -> dict[str, tuple[Path, str]]:
    """The thinker tensors of a checkpoint folder (published layout or the thinker's own): state-dict name -> (file,
    name in the file), by transformers' own load-time renames (what ``relax-gym model check`` reads)."""
    from relax_gym.trainer.policy.checkpoint_files import check_weights, read_checkpoint_dir, thinker_config

    d = read_checkpoint_dir(folder)
    loaded = check_weights(d, thinker_config(d)).loaded
    assert all(len(keys) == 1 for keys in loaded.values()), "a dense thinker: one tensor per parameter"
    return {name: (folder / d.thinker[keys[0]].shard, keys[0]) for name, keys in loaded.items()}


def read(where: tuple[Path, str]) -> torch.Tensor:
    with safe_open(str(where[0]), "pt") as f:
        return f.get_tensor(where[1])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical (``torch.equal`` would call -0.0 and 0.0 equal, and NaN unequal to itself)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def assert_published_checkpoint(ckpt: Path) -> dict[str, tuple[Path, str]]:
    """A trainer checkpoint at real width: the thinker in bf16 (every tensor, the config's dtype, the optimizer's
    states), the files transformers reads back (tokenizer, processor configs naming the official class)."""
    from transformers import AutoTokenizer

    tensors = weight_files(ckpt)  # `relax-gym model check`'s reading: a checkpoint dir model.path= loads
    dtypes = set()
    for file in {f for f, _ in tensors.values()}:
        with safe_open(str(file), "pt") as f:
            dtypes |= {f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes == {"BF16"}, f"{ckpt}: weights saved as {dtypes}, the stand-in is bf16"
    config = json.loads((ckpt / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16", config
    assert config["model_type"] == "qwen2_5_omni_thinker" and config["text_config"]["vocab_size"] == 151936
    assert json.loads((ckpt / "preprocessor_config.json").read_text())["processor_class"] == "Qwen2_5OmniProcessor"
    assert len(AutoTokenizer.from_pretrained(ckpt)) == 151665  # Qwen's 151,643 regular + 22 special tokens
    optimizer = torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=True, mmap=True)
    states = {v.dtype for s in optimizer["state"].values() for k, v in s.items() if k != "step"}
    assert states == {torch.bfloat16}, f"{ckpt}/optimizer.pt holds {states}"
    return tensors


def assert_trained_where_it_had_gradients(standin: Path, ckpt: Path) -> None:
    """The step changed the weights: the decoder, the head and the vision tower moved; the audio tower (no sample
    holds audio: no gradient) is bit-identical to the stand-in's."""
    before, after = weight_files(standin), weight_files(ckpt)
    assert set(after) == set(before), set(after) ^ set(before)
    changed = {name for name in after if not same_bits(read(after[name]), read(before[name]))}
    for prefix in ("model.language_model.layers.0.", "lm_head.", "model.visual.blocks.0.", "model.visual.merger."):
        assert any(n.startswith(prefix) for n in changed), f"no tensor under {prefix} changed"
    audio = [n for n in after if n.startswith("model.audio_tower.")]
    assert audio and not set(audio) & changed, sorted(set(audio) & changed)


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_step_trained(row: dict) -> None:
    assert row["samples_forwarded"] > 0 and row["episodes_trained"] == P * G, row
    assert 0 < row["grad_norm"] < float("inf"), row
    losses = {k: row[k] for k in ("pg_loss", "ratio_mean", "approx_kl", "mismatch_kl")}
    assert all(torch.isfinite(torch.tensor(float(v))) for v in losses.values()), losses
    assert row["reward_mean"] > 0 and row["episodes_masked"] == 0, row


def free_memory() -> None:
    """Collect the trainer just closed (its model, engine copy and optimizer sit in reference cycles), so the next
    run in this process does not start beside them."""
    gc.collect()


# -- the tests ----------------------------------------------------------------------------------------------------


def test_colocate_step_checkpoint_then_an_async_resume_at_real_width(ray_session, standin_3b, probe, run_dir):
    """One RL step in colocate mode and its checkpoint; the resumed trainer holds that checkpoint's weights and
    optimizer state bit for bit; then `relax-gym train --resume` continues the run in async mode (Ray Serve roles
    around the TransferQueue bus, S = 0) for its second step (see the module docstring). One run for both modes:
    each real-width run costs minutes of the suite, and a checkpoint written by one mode is what the other resumes."""
    from relax_gym.trainer.config import load_recipe
    from relax_gym.trainer.faults.schedule import InjectedCrash
    from relax_gym.trainer.train import build_trainer

    # a two-step run killed when step 2 starts (a kill fault: in colocate mode the trainer process is every role):
    # it leaves step 1's checkpoint, as a crash would, for `relax-gym train --resume RUN_DIR`
    cfg = load_recipe(RECIPE, [f"model.path={standin_3b}", *small(probe[0], steps=2),
                               "faults.inject=[{kind: kill, role: actor, at_step: 2}]"])
    trainer = build_trainer(cfg, run_dir)
    engine = trainer.engine_host.engine.model
    watched = ("model.language_model.layers.0.self_attn.q_proj.weight", "model.visual.blocks.0.attn.q.weight")
    before = {k: v.detach().clone() for k, v in engine.state_dict().items() if k in watched}
    assert set(before) == set(watched), set(watched) - set(before)
    try:
        with pytest.raises(InjectedCrash):
            trainer.run()
        after = {k: v.detach().clone() for k, v in engine.state_dict().items() if k in watched}
        dtypes = {p.dtype for p in trainer.actor.model.parameters()}, {p.dtype for p in engine.parameters()}
        assert dtypes == ({torch.bfloat16}, {torch.bfloat16}), dtypes
        assert trainer.version == 1
    finally:
        trainer.close()
    del trainer, engine
    free_memory()

    got = rows(run_dir)
    assert [r["step"] for r in got] == [0, 1]
    assert "eval_reward" in got[0] and got[1]["policy_version"] == 1
    assert_step_trained(got[1])
    ckpt = run_dir / "checkpoints" / "step_000001"
    saved = assert_published_checkpoint(ckpt)
    for name in watched:  # the engine served the stand-in's weights before the step and the checkpoint's after it
        assert not same_bits(before[name], after[name]), name
        assert same_bits(after[name], read(saved[name])), name
    assert_trained_where_it_had_gradients(standin_3b, ckpt)

    # what `relax-gym train --resume RUN_DIR` builds from the run's own config.json: the checkpoint's state exactly
    trainer = build_trainer(load_recipe(run_dir / "config.json"), run_dir, resume=True)
    try:
        assert trainer.resumed.step == 1 and trainer.version == 1
        actor_state = trainer.actor.model.state_dict()
        assert set(actor_state) == set(saved)
        assert all(same_bits(actor_state[k], read(saved[k])) for k in actor_state), "resumed weights != checkpoint's"
        engine_state = trainer.engine_host.engine.model.state_dict()
        assert all(same_bits(engine_state[k], actor_state[k]) for k in actor_state), "the engine serves other weights"
        del actor_state, engine_state
        opt = trainer.actor.optimizer.state_dict()["state"]
        saved_opt = torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=True, mmap=True)["state"]
        assert opt.keys() == saved_opt.keys()
        assert all(same_bits(opt[i][k], saved_opt[i][k]) for i in opt for k in opt[i]), "optimizer != checkpoint's"
        del opt, saved_opt
    finally:
        trainer.close()
    del trainer
    free_memory()

    # the run goes on in async mode, through the CLI: the env workers (Ray processes) reach the probe over loopback
    result = CliRunner().invoke(app, ["train", "--resume", str(run_dir), "trainer.mode=async", "trainer.max_staleness=0",
                                      "roles.bus=transferqueue", f"env.id={probe[1]}"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    free_memory()

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["mode"] == "async" and summary["policy_version"] == 2
    assert summary["samples_lost"] == 0 and summary["samples_duplicated"] == 0
    resumed = rows(run_dir)
    assert [r["step"] for r in resumed] == [0, 1, 2]
    assert resumed[:2] == got  # the rows up to the checkpoint stay as they were, each step once
    step = resumed[2]
    assert step["policy_version"] == 2 and step["trained_version"] == 1 and step["samples_consumed"] == P * G
    assert step["bus_bytes_put"] > 0 and "eval_reward" in step
    assert_step_trained(step)
    step2 = run_dir / "checkpoints" / "step_000002"
    assert_published_checkpoint(step2)
    assert_trained_where_it_had_gradients(standin_3b, step2)
    assert not same_bits(read(weight_files(step2)[watched[0]]), read(saved[watched[0]]))


def test_an_engine_wave_is_prefilled_in_rounds_of_max_prefill_tokens():
    """What keeps a real-width rollout's prefill within memory: a wave of requests is prefilled in rounds of at most
    ``max_prefill_tokens`` tokens of distinct prompts (a GRPO group's copies count once, being prefilled once), and
    the answers are those of one round. On the tiny policy: 6 requests, 4 distinct prompts of equal length, a budget
    of two prompts -> two rounds."""
    from relax_gym.trainer.engines.embedded import EmbeddedEngine
    from relax_gym.trainer.policy import PolicyConfig, build_policy

    model, processor = build_policy(PolicyConfig())
    prompts = [processor.encode_text(f"prompt number {i}, once more") for i in range(4)]
    n = len(prompts[0])
    assert all(len(p) == n for p in prompts)
    greedy = {"max_new_tokens": 3, "temperature": 0}
    body = {"input_ids": [prompts[0]] * 3 + prompts[1:], "sampling_params": [greedy] * 6}
    answers = {}
    for budget, rounds in ((2 * n, 2), (1 << 20, 1)):
        with EmbeddedEngine(model, processor, max_batch=8, max_prefill_tokens=budget) as engine:
            answers[budget] = [out.output_ids for out in engine.generate(body)]
            assert engine.stats()["batches"] == rounds, budget
    assert answers[2 * n] == answers[1 << 20]
