"""A served env whose code lives in a second virtual environment: the manifest's ``[server] venv`` makes
``relax_gym.make(id)`` start the env server with that venv's interpreter, and check_env, ``relax-gym envs play``
and three colocate training steps all run against it from this process, which cannot import the env's package.

The second venv is made offline: ``python -m venv --without-pip``, this venv's site-packages made visible through a
``.pth`` line (relax_gym itself is *not*: this venv has it as an editable install, whose own ``.pth`` a plain line
does not process, so the launcher's fallback of appending this checkout to the child's path is what finds it), and
the probe package pip-installed into it from a local folder with no index and no build isolation."""

from __future__ import annotations

import importlib.util
import json
import os
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

import relax_gym
from relax_gym.cli import app
from relax_gym.envs import check_env, discover
from relax_gym.envs.remote import RemoteEnv, launcher

from .test_registry import write_manifest

PROBE_ENV = '''
"""A colour quiz on a tiny picture: which colour fills the square? (The package the main venv lacks.)"""
from __future__ import annotations

import numpy as np

from relax_gym.envs.core import AgentEnv, Opening, Outcome
from relax_gym.envs.multiple_choice_reward import MultipleChoiceReward
from relax_gym.envs.rewards import LETTERS
from relax_gym.omni import ImagePart, Message, TextPart

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 30)}


class ProbeEnv(AgentEnv):
    media_kinds = ("image",)

    def __init__(self, size: int = 16, **kwargs):
        super().__init__(**kwargs)
        self.size, self.reward = size, MultipleChoiceReward()
        self.options, self.gold_letter = list(COLOURS), "A"

    def _reset(self, options):
        names = list(COLOURS)
        colour = names[int(self.np_random.integers(len(names)))]
        self.gold_letter = LETTERS[names.index(colour)]
        picture = np.zeros((self.size, self.size, 3), np.uint8)
        picture[:] = COLOURS[colour]
        question = "Which colour fills the picture? " + " ".join(f"{LETTERS[i]}. {n}" for i, n in enumerate(names))
        return Opening([Message("user", (ImagePart.of(picture), TextPart(question)))],
                       f"<think>it is {colour}</think><answer>{self.gold_letter}</answer>", {"probe_python": __import__("sys").executable})

    def _step(self, action):
        total, parts = self.reward(action, self.gold_letter, self.options)
        return Outcome([], total, True, parts)
'''

RECIPE = """
model: {base: null, hidden_size: 64, intermediate_size: 128, num_layers: 1}
env: {id: probe-served, kwargs: {}, eval_kwargs: {}}
inference: {max_new_tokens: 8}
trainer: {steps: 3, sft_warmup_steps: 1, sft_batch_size: 2, prompts_per_step: 2, group_size: 2, eval_episodes: 2,
          eval_every: 3, checkpoint_every: 3, concurrency: 4}
metrics: {tensorboard: false}
"""


def make_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "probe-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  check=True, capture_output=True, text=True).stdout.strip())
    (purelib / "main_venv.pth").write_text("\n".join(site.getsitepackages()) + "\n")  # plain lines: no nested .pth
    pkg = tmp_path / "probe-pkg"
    (pkg / "relaxgym_probe_pkg").mkdir(parents=True)
    (pkg / "relaxgym_probe_pkg" / "__init__.py").write_text("")
    (pkg / "relaxgym_probe_pkg" / "env.py").write_text(PROBE_ENV)
    (pkg / "pyproject.toml").write_text(textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "relaxgym-probe-pkg"
        version = "0.1"
        [tool.setuptools]
        packages = ["relaxgym_probe_pkg"]
    """))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", "--no-index",
                    "--no-build-isolation", str(pkg)], check=True, cwd=tmp_path)
    return venv


@pytest.mark.slow(reason="makes a second venv with pip and trains against the env served from it")
@pytest.mark.timeout(600)
def test_env_from_a_second_venv_checks_plays_and_trains(tmp_path, monkeypatch, clean_registry):
    venv = make_venv(tmp_path)
    assert importlib.util.find_spec("relaxgym_probe_pkg") is None, "the main venv must not have the probe package"
    alone = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the venv by itself, as a user's would be
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import relax_gym.envs"], check=False, capture_output=True,
                           text=True, cwd=tmp_path, env=alone)
    assert probe.returncode != 0, "the second venv finds relax_gym only through the launcher's fallback"
    envs = tmp_path / "envs"
    write_manifest(envs / "probe-served", """
        id = "probe-served"
        description = "a colour quiz whose code only the probe venv has"
        entry_point = "relaxgym_probe_pkg.env:ProbeEnv"
        modalities = ["image", "text"]
        [kwargs]
        size = 12
        [server]
        venv = "../../probe-venv"
    """)
    monkeypatch.setenv("RELAX_GYM_ENV_PATH", str(envs))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launcher, "log_dir", lambda: tmp_path / "server-logs")
    discover(force=True)

    env = relax_gym.make("probe-served")
    assert isinstance(env.unwrapped, RemoteEnv)
    obs, info = env.reset(seed=0)
    assert info["probe_python"] == str(venv / "bin" / "python")  # the episode ran in the second venv
    assert obs[0].media()[0].decode().shape == (12, 12, 3)  # manifest kwargs applied there; the array came back
    report = check_env(env)
    assert "gold action => max reward" in report.passed
    env.close()

    played = CliRunner().invoke(app, ["envs", "play", "probe-served", "--episodes", "1"])
    assert played.exit_code == 0, played.output
    assert "mean return over 1 episode(s): 1.000" in played.output
    assert len({s.process.pid for s in launcher._servers.values()}) == 1  # one server per manifest per process

    (tmp_path / "recipe.yaml").write_text(RECIPE)
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", str(tmp_path / "recipe.yaml"), "--run-dir", str(run_dir)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r.get("episodes_masked", 0) == 0 and r["status_ok"] == 4 for r in steps), steps

    server = next(iter(launcher._servers.values()))
    launcher.stop_all()
    assert server.process.poll() is not None and not server.workdir.exists()
    assert server.log_path.parent == tmp_path / "server-logs"
    assert "serving probe-served at http://127.0.0.1:" in server.log_path.read_text()
