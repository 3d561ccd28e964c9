"""Two env-author rough edges, checked: ``bench --list`` keeps whole lines in aligned columns in a pipe or a log (no
cut at 80 columns), and training an env that is not a bundled-sample env says nothing about the bundled samples."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from relax_gym.cli import app

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_bench_list_lines_are_whole_and_aligned():
    result = runner.invoke(app, ["bench", "--list", "--bench-dir", str(REPO / "benchmarks")])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    names = [line.split()[0] for line in lines]
    assert {"agent_learning", "ppo_vs_grpo", "soak", "env_reset"} <= set(names)
    starts = {len(line) - len(line[len(name):].lstrip()) for line, name in zip(lines, names)}
    assert len(starts) == 1  # every description starts in the same column, the longest name included
    assert any(len(line) > 80 for line in lines)  # a pipe is not a terminal: nothing cut at its default width


def test_training_an_unrelated_env_does_not_mention_the_bundled_samples(tmp_path, caplog):
    args = ["train", str(REPO / "recipes" / "cpu-tool-use.yaml"), "env.id=image-zoom", "model.base=null",
            "trainer.steps=1", "trainer.sft_warmup_steps=1", "trainer.sft_batch_size=2", "trainer.prompts_per_step=2",
            "trainer.group_size=2", "trainer.eval_episodes=2", "trainer.eval_every=1", "inference.max_new_tokens=4",
            "metrics.tensorboard=false", "--run-dir", str(tmp_path / "run")]
    with caplog.at_level("WARNING"):
        result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    said = result.output + "\n".join(r.getMessage() for r in caplog.records)  # the CLI's lines and the log's
    assert "bundled" not in said and "nextqa" not in said and "avqa" not in said
