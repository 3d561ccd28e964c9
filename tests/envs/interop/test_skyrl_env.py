"""skyrl-gym's own GSM8K env (``pip install skyrl-gym``, in the venv relax-gym made for it) as a relax-gym env, on
tasks in SkyRL's dataset layout (a parquet file written in that venv with pandas, as SkyRL's dataset scripts write
theirs): check_env, the env's own scoring, three colocate steps, and task files that are not in that layout
refused when the env is made, naming the file, the row or line, and the field."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

import relax_gym
from relax_gym.envs import check_env
from relax_gym.envs.remote import RemoteEnv, ServerStartError

from .training import train_three_steps, write_recipe

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
QUESTIONS = [(f"Tom has {a} apples and buys {b} more. How many apples does he have?", str(a + b))
             for a, b in [(3, 4), (12, 30), (7, 7), (21, 5), (40, 2), (9, 16), (11, 11), (6, 60)]]

# SkyRL's GSM8K preprocessing (examples/gsm8k/gsm8k_dataset.py) writes these columns; pandas writes the parquet
WRITE_PARQUET = """
import json, sys
import pandas
rows = json.loads(sys.argv[2])
pandas.DataFrame(rows).to_parquet(sys.argv[1])
"""


def skyrl_rows(split: str = "train") -> list[dict]:
    return [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"{q} {INSTRUCTION}"}],
             "env_class": "gsm8k", "reward_spec": {"method": "rule", "ground_truth": answer},
             "extra_info": {"split": split, "index": i, "answer": answer, "question": q}}
            for i, (q, answer) in enumerate(QUESTIONS)]


@pytest.fixture(scope="module")
def tasks(skyrl_python, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("skyrl-data") / "train.parquet"
    subprocess.run([str(skyrl_python), "-c", WRITE_PARQUET, str(path), json.dumps(skyrl_rows())], check=True, timeout=300)
    return path


def test_gsm8k_passes_check_env_and_scores_by_skyrls_rule(tasks, servers):
    assert importlib.util.find_spec("skyrl_gym") is None, "the trainer's venv must not have skyrl-gym"
    env = relax_gym.make("skyrl-gym:gsm8k", data_file=str(tasks))
    assert isinstance(env.unwrapped, RemoteEnv)
    report = check_env(env)
    assert "gold action => max reward" in report.passed and "garbage action => min reward, no exception" in report.passed

    obs, info = env.reset(seed=3)
    question, answer = QUESTIONS[info["task_index"]]
    assert [m.role for m in obs] == ["user"] and obs[0].text == f"{question} {INSTRUCTION}"
    assert info["gold"] == f"#### {answer}"
    _, reward, terminated, _, info = env.step(f"so it is {int(answer) + 1}\n#### {int(answer) + 1}")
    assert (reward, terminated, info["status"]) == (0.0, True, "ok")  # a wrong number: skyrl-gym's rule pays 0
    env.reset(seed=3)
    _, reward, terminated, _, info = env.step(f"adding up\n#### {answer}")
    assert (reward, terminated) == (1.0, True) and info["reward_breakdown"] == {"skyrl": 1.0}
    env.close()


def test_three_colocate_steps_on_gsm8k(tasks, servers, tmp_path):
    steps = train_three_steps(tmp_path, write_recipe(tmp_path, {"id": "skyrl-gym:gsm8k", "kwargs": {"data_file": str(tasks)}}))
    assert all(r["status_ok"] == 4 for r in steps), steps


@pytest.mark.parametrize("name, text, says", [
    ("tasks.jsonl", '{"prompt": [{"role": "user", "content": "1+1?"}]}\n{not json\n', "tasks.jsonl, line 2: not JSON"),
    ("tasks.json", '[{"prompt": "1+1?"}]', "tasks.json, row 1: field 'prompt' must be a non-empty list of messages"),
    ("tasks.json", '[{"prompt": [{"role": "user", "content": "x"}], "env_class": "aime"}]',
     "tasks.json, row 1: field 'env_class' is 'aime', this env is 'gsm8k'"),
    ("tasks.csv", "prompt\n1+1?\n", "tasks.csv: a task file is .jsonl, .json or .parquet, not .csv"),
])
def test_a_task_file_outside_skyrls_layout_is_refused_naming_file_and_field(skyrl_python, servers, tmp_path, name, text, says):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ServerStartError) as err:  # the server makes one env before it serves: the make fails
        relax_gym.make("skyrl-gym:gsm8k", data_file=str(path))
    assert says in str(err.value) and "TaskFileError" in str(err.value), str(err.value)
