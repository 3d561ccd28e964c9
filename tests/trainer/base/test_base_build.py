"""The base stage: a cached build keyed by what decides its weights, deterministic, loadable, and wired into runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from relax_gym.cli import app
from relax_gym.envs.samples import ensure_sample
from relax_gym.envs.synth_captions import (
    CAPTION_SAMPLES,
    write_audio_image_captions,
    write_video_captions,
)
from relax_gym.trainer.base import spec as spec_module
from relax_gym.trainer.base.build import base_key, bases_root, ensure_base
from relax_gym.trainer.base.spec import BaseSpec, describe_prompt
from relax_gym.trainer.config import ConfigError, load_recipe
from relax_gym.trainer.policy import PolicyConfig, build_policy

RECIPE = str(Path(__file__).resolve().parents[3] / "recipes" / "cpu-nextqa.yaml")
TINY_POLICY = {"hidden_size": 64, "intermediate_size": 64, "num_layers": 1, "vision_depth": 1, "vision_embed": 32,
               "vision_intermediate": 32, "audio_layers": 1, "audio_d_model": 32, "audio_ffn": 32}
SPEC = BaseSpec(corpora={"video-captions": 0.5, "audio-image-captions": 0.5}, steps=3, batch_size=4, about="test")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache holding small caption corpora (the real ones are 2000 clips), and a small named base; the
    recipe's nextqa sample is the suite's own (a link: generating its 2,200 clips again costs ~30 s)."""
    nextqa = ensure_sample("nextqa")  # in the suite's cache, before the private one replaces it
    monkeypatch.setenv("RELAX_GYM_CACHE", str(tmp_path / "cache"))
    samples = tmp_path / "cache" / "samples"
    samples.mkdir(parents=True)
    (samples / nextqa.name).symlink_to(nextqa, target_is_directory=True)
    write_video_captions(samples / f"video-captions-v{CAPTION_SAMPLES['video-captions']}", n_train=8, n_held=4)
    write_audio_image_captions(samples / f"audio-image-captions-v{CAPTION_SAMPLES['audio-image-captions']}", n_train=6, n_held=3)
    monkeypatch.setitem(spec_module.BASES, "test-tiny", SPEC)
    return tmp_path / "cache"


def test_the_key_follows_what_decides_the_weights():
    policy = PolicyConfig(**TINY_POLICY)
    key = base_key(SPEC, policy)
    assert key == base_key(SPEC, policy.model_copy(update={"seed": 7, "dtype": "bfloat16"}))  # the spec's seed draws it
    assert key != base_key(SPEC.model_copy(update={"steps": 4}), policy)
    assert key != base_key(SPEC.model_copy(update={"lr": 2e-3}), policy)
    assert key != base_key(SPEC, policy.model_copy(update={"hidden_size": 128}))


@pytest.mark.timeout(300)
def test_build_once_then_from_the_cache_and_deterministic(cache, tmp_path):
    policy = PolicyConfig(**TINY_POLICY, base="test-tiny")
    steps = []
    first = ensure_base("test-tiny", policy, progress=lambda e, d: steps.append(d["step"]) if e == "base_step" else None)
    assert first.built and steps == [1, 2, 3]
    assert first.path.parent == bases_root() and first.path.name == f"test-tiny-{base_key(SPEC, policy)}"
    report = json.loads((first.path / "base.json").read_text())
    assert set(report["held_caption_accuracy"]) == {"video-captions", "audio-image-captions"}
    assert report["key"] == base_key(SPEC, policy) and report["name"] == "test-tiny"
    assert report["saw"]["video-captions"]["train_records"] == 8 and "answer letters" in report["never_saw"]
    assert report["seconds"]["total"] > 0
    again = ensure_base("test-tiny", policy)
    assert not again.built and again.path == first.path and again.report == report
    # the same spec built elsewhere gives the same weights
    other = ensure_base("test-tiny", policy, root=tmp_path / "elsewhere")
    assert other.built
    a, _ = build_policy(PolicyConfig(path=str(first.path)))
    b, _ = build_policy(PolicyConfig(path=str(other.path)))
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    fresh, _ = build_policy(PolicyConfig(**TINY_POLICY, seed=SPEC.seed))
    assert any(not torch.equal(sa[k], v) for k, v in fresh.state_dict().items()), "the build trained nothing"


def test_unknown_base_and_both_base_and_path_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="model.base='nope' is no known base; known: .*tiny-omni"):
        load_recipe(None, ["model.base=nope"])
    with pytest.raises(ConfigError, match="either model.path .* or model.base .* model.base=null"):
        load_recipe(RECIPE, [f"model.path={tmp_path}"])  # the default recipe names a base
    assert load_recipe(RECIPE, [f"model.path={tmp_path}", "model.base=null"]).model.path == str(tmp_path)
    with pytest.raises(ValueError, match="not built yet"):
        build_policy(PolicyConfig(base="tiny-omni"))
    with pytest.raises(ValueError, match="known: .*tiny-omni"):
        ensure_base("nope", PolicyConfig(), root=tmp_path)


def test_describe_prompt_by_media_kinds():
    assert describe_prompt(["video"]) == "describe the video ."
    assert describe_prompt(["image", "audio"]) == "describe the picture and the sound ."
    assert describe_prompt(["audio"]) == "describe the sound ."
    with pytest.raises(ValueError, match="no media"):
        describe_prompt([])


@pytest.mark.timeout(600)
def test_a_run_starts_from_its_base_and_records_it(cache, tmp_path):
    run_dir = tmp_path / "run"
    args = ["train", RECIPE, "model.base=test-tiny", *(f"model.{k}={v}" for k, v in TINY_POLICY.items()),
            "trainer.steps=1", "trainer.sft_warmup_steps=2", "trainer.sft_batch_size=2", "trainer.prompts_per_step=2",
            "trainer.group_size=2", "trainer.eval_episodes=2", "trainer.eval_every=1", "metrics.tensorboard=false",
            "--run-dir", str(run_dir)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "base test-tiny: built in" in text
    config = json.loads((run_dir / "config.json").read_text())
    assert config["model"]["base"] is None and config["model"]["path"].startswith(str(cache / "bases" / "test-tiny-"))
    assert json.loads((run_dir / "base.json").read_text())["name"] == "test-tiny"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["step"] < 0] == [-2, -1] and any(r["step"] == 1 for r in rows)
    # the CLI builds explicitly too; now it is in the cache
    built = CliRunner().invoke(app, ["base", "build", RECIPE, "model.base=test-tiny",
                                     *(f"model.{k}={v}" for k, v in TINY_POLICY.items())])
    assert built.exit_code == 0 and "from the cache" in " ".join(built.output.split())


def test_base_cli_lists_and_refuses_a_recipe_without_a_base():
    listed = CliRunner().invoke(app, ["base", "list"])
    assert listed.exit_code == 0 and "tiny-omni" in listed.output
    refused = CliRunner().invoke(app, ["base", "build", RECIPE, "model.base=null"])
    assert refused.exit_code == 2 and "names no model.base" in " ".join(refused.output.split())
