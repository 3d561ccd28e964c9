"""The relax-gym command line, driven through typer's runner (same code path as the console script)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from typer.testing import CliRunner

from relax_gym.cli import app

runner = CliRunner()


def test_envs_list_and_show():
    result = runner.invoke(app, ["envs", "list"])
    assert result.exit_code == 0, result.output
    assert "nextqa-video" in result.output and "echo-ink" in result.output
    result = runner.invoke(app, ["envs", "show", "echo-ink"])
    assert result.exit_code == 0 and "relax_gym.envs.multiple_choice:MultipleChoiceEnv" in result.output
    assert '"format": "r1json"' in result.output


@pytest.mark.slow(reason="checks every env; openai-agent alone plays ~20 episodes, each an agent program in a sandbox")
def test_envs_check_all_exits_zero_and_names_each_env_before_its_check():
    import relax_gym

    _need_a_sandbox()  # tool-use runs code in a sandbox
    result = runner.invoke(app, ["envs", "check", "--all"])
    assert result.exit_code == 0, result.output
    ids = relax_gym.list_envs()
    assert len(ids) >= 4
    expected = [line for i, env_id in enumerate(ids, 1) for line in (f"checking {env_id} ({i}/{len(ids)})", f"ok   {env_id}")]
    assert [line.split(": ")[0] for line in result.output.splitlines() if line.startswith(("checking ", "ok "))] == expected


def test_envs_check_leaves_no_event_loop_or_docker_socket_open():
    """In its own interpreter, with ResourceWarnings as errors: the exit finds nothing of the sandboxes left open."""
    _need_a_sandbox()
    proc = subprocess.run([sys.executable, "-X", "dev", "-W", "error::ResourceWarning", "-m", "relax_gym.cli", "envs",
                           "check", "tool-use"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("checking tool-use (1/1)\nok   tool-use: ")
    for leak in ("ResourceWarning", "Exception ignored", "unclosed", "cannot schedule new futures"):
        assert leak not in proc.stderr, proc.stderr


def _need_a_sandbox() -> None:
    from relax_gym.sandbox import SandboxUnavailable, select_backend

    try:
        select_backend()
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))


def test_envs_check_needs_an_id_or_all():
    assert runner.invoke(app, ["envs", "check"]).exit_code == 2


def test_play_gold_prints_media_summaries_and_rewards():
    result = runner.invoke(app, ["envs", "play", "nextqa-video", "--episodes", "2"])
    assert result.exit_code == 0, result.output
    assert "[video 16 frames 64x64" in result.output and "native 8.0 fps" in result.output
    assert "breakdown {'accuracy': 1.0, 'format': 1.0}" in result.output
    assert "mean return over 2 episode(s): 1.000" in result.output
    result = runner.invoke(app, ["envs", "play", "echo-ink"])
    assert "[image 64x64" in result.output and "[audio 1.00s @ 16000 Hz" in result.output


def test_play_stdin_and_random():
    result = runner.invoke(app, ["envs", "play", "echo-ink", "--policy", "stdin"], input="<answer>Z</answer>\n")
    assert result.exit_code == 0 and "reward 0.000" in result.output
    result = runner.invoke(app, ["envs", "play", "echo-ink", "--policy", "random", "--episodes", "3"])
    assert result.exit_code == 0 and result.output.count("assistant: <think>guessing</think>") == 3


def test_unknown_env_is_one_clear_error():
    result = runner.invoke(app, ["envs", "play", "nextqa-vid"])
    assert result.exit_code == 1
    assert "error: no environment 'nextqa-vid'. Did you mean: nextqa-video, nextqa-video-agent, nextqa-describe?" in " ".join(result.output.split())


def test_console_script_is_installed():
    exe = sys.executable.replace("/python", "/relax-gym") if sys.executable.endswith("/python") else None
    proc = subprocess.run([exe or "relax-gym", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "envs" in proc.stdout


def test_play_gold_on_tool_envs_reaches_max_reward():
    result = runner.invoke(app, ["envs", "play", "image-zoom", "--episodes", "2"])
    assert result.exit_code == 0, result.output
    assert "tool:" in result.output and "[image " in result.output  # the zoomed image part, summarised
    assert "mean return over 2 episode(s): 1.000" in result.output


def test_sandbox_doctor_reports_each_backend(monkeypatch):
    from relax_gym.sandbox import backends

    monkeypatch.setattr(backends, "doctor", lambda: {"docker": "no Docker engine answers", "bwrap": None})
    monkeypatch.setattr(backends, "select_backend", lambda name=None: backends.get_backend("bwrap"))
    result = runner.invoke(app, ["sandbox", "doctor"])
    assert result.exit_code == 0
    assert "missing docker: no Docker engine answers" in result.output and "ok      bwrap" in result.output
    assert "selected: bwrap" in result.output


def test_sandbox_doctor_fails_when_nothing_works(monkeypatch):
    from relax_gym.sandbox import backends
    from relax_gym.sandbox.base import SandboxUnavailable

    def none_works(name=None):
        raise SandboxUnavailable("no sandbox backend works on this machine")

    monkeypatch.setattr(backends, "doctor", lambda: {"docker": "x", "bwrap": "y"})
    monkeypatch.setattr(backends, "select_backend", none_works)
    result = runner.invoke(app, ["sandbox", "doctor"])
    assert result.exit_code == 1 and "no sandbox backend works" in result.output


def test_envs_list_prints_manifest_errors_verbatim(tmp_path, monkeypatch):
    """A manifest error holding square brackets ('[dataset]') must not be eaten as rich markup."""
    from relax_gym.envs import registry

    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "env.toml").write_text('id = "bracket-test"\n')
    monkeypatch.setenv("RELAX_GYM_ENV_PATH", str(tmp_path))
    registry.discover(force=True)
    try:
        result = runner.invoke(app, ["envs", "list"])
    finally:
        monkeypatch.delenv("RELAX_GYM_ENV_PATH")
        registry.discover(force=True)
    assert result.exit_code == 1
    assert "give either entry_point or a [dataset] table" in " ".join(result.output.split())


def test_errors_sent_to_a_pipe_are_not_wrapped(tmp_path):
    """An error naming a long path stays one line when the output is not a terminal (a log, `tee`, a pipe):
    rich used to wrap it at 80 columns, splitting "no config.json" across lines."""
    deep = tmp_path / ("a-rather-long-folder-name-" * 6) / "run"
    deep.mkdir(parents=True)
    result = runner.invoke(app, ["train", "--resume", str(deep)])
    assert result.exit_code == 2
    line = f"error: --resume {deep}: no config.json there, so not a relax-gym run directory"
    assert line in result.output.splitlines(), result.output
