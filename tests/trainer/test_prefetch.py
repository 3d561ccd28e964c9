"""The colocate loop decodes the next step's clips while the current step trains: it calls the env's ``prefetch``
with the next step's prompt seeds (one per group), and not after the last step."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from relax_gym.cli import app
from relax_gym.envs import multiple_choice
from relax_gym.trainer.run.seeds import train_seeds

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cpu-nextqa.yaml"


def test_the_next_steps_seeds_are_prefetched(tmp_path, monkeypatch):
    asked: list[list[int]] = []
    real = multiple_choice.MultipleChoiceEnv.prefetch

    def spy(self, seeds, **kwargs):
        asked.append(list(seeds))
        return real(self, seeds, **kwargs)

    monkeypatch.setattr(multiple_choice.MultipleChoiceEnv, "prefetch", spy)
    args = ["train", str(RECIPE), "model.base=null", "trainer.steps=2", "trainer.sft_warmup_steps=0",
            "trainer.prompts_per_step=2", "trainer.group_size=2", "trainer.eval_episodes=2", "trainer.eval_every=2",
            "trainer.checkpoint_every=100", "trainer.time_budget_s=null", "inference.max_new_tokens=4",
            "metrics.tensorboard=false", "--run-dir", str(tmp_path / "run")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    step2 = sorted({seed for seed, _ in train_seeds(0, 2, 2, 2)})
    assert asked == [step2]  # during step 1 only: after step 2 there is no next step
