"""skyrl-gym envs (``pip install skyrl-gym``) as relax-gym envs: ``relax_gym.make("skyrl-gym:gsm8k", data_file=...)``.

Runs inside the skyrl-gym venv (:mod:`relax_gym.envs.interop.venvs`). A skyrl-gym env is made per task: its
tasks are rows of a dataset in SkyRL's layout (a ``.jsonl``, ``.json`` or ``.parquet`` file, the way SkyRL's
dataset scripts write them):

    {"data_source": ..., "prompt": [{"role": "user", "content": ...}], "env_class": "gsm8k",
     "reward_spec": {"method": "rule", "ground_truth": "72"}, "extra_info": {...}}

What maps to what:

- each reset picks a row with this env's seeded generator (``pick="random"``) or in turn (``pick="cycle"``) and
  calls ``skyrl_gym.make(env_class, env_config=..., extras=row)`` (the row without ``prompt`` and ``env_class``, as
  SkyRL's generator passes it), then ``init(prompt)``: its conversation is the opening (OpenAI-style messages;
  image parts go through as media);
- ``step(action)``'s ``observations`` are the step's new messages, its ``reward`` the step's reward, ``done`` ends
  the episode, ``metadata`` goes through as ``skyrl_metadata``; the env's ``max_turns`` bounds the turns;
- the gold action comes from ``gold``, a ``str.format`` template over the row's ``reward_spec`` and ``extra_info``
  fields (``"#### {ground_truth}"``, the default for ``gsm8k``);
- reward bounds: ``reward_bounds`` (default [0, 1], what the shipped envs pay).

Lost: SkyRL's tool groups run inside the env as it runs them (their calls are text in the action); its
``postprocessed_action`` (the trainer keeps the action the policy wrote).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from relax_gym.envs.core import Opening, Outcome
from relax_gym.envs.interop.adapter import ForeignAgentEnv, TaskFileError, TaskPicker, fill_gold
from relax_gym.envs.remote.wire import encode_value
from relax_gym.omni import Message, from_openai

GOLD = {"gsm8k": "#### {ground_truth}"}


def read_tasks(path: Path, env_class: str) -> list[dict[str, Any]]:
    """The rows of a SkyRL dataset file, checked: each has a ``prompt`` conversation and, when it names an
    ``env_class``, this env's."""
    if not path.is_file():
        raise TaskFileError(f"{path}: no such task file")
    if path.suffix == ".parquet":
        import pandas

        rows = json.loads(pandas.read_parquet(path).to_json(orient="records"))  # numpy values as plain JSON
    elif path.suffix == ".json":
        rows = json.loads(path.read_text())
        if not isinstance(rows, list):
            raise TaskFileError(f"{path}: a .json task file holds a list of rows, got {type(rows).__name__}")
    elif path.suffix == ".jsonl":
        rows = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise TaskFileError(f"{path}, line {n}: not JSON ({exc.msg})") from None
    else:
        raise TaskFileError(f"{path}: a task file is .jsonl, .json or .parquet, not {path.suffix or 'without a suffix'}")
    if not rows:
        raise TaskFileError(f"{path}: no rows")
    for n, row in enumerate(rows, 1):
        where = f"{path}, row {n}"
        if not isinstance(row, dict):
            raise TaskFileError(f"{where}: a row is an object, got {type(row).__name__}")
        prompt = row.get("prompt")
        if not isinstance(prompt, list) or not prompt:
            raise TaskFileError(f"{where}: field 'prompt' must be a non-empty list of messages")
        if row.get("env_class", env_class) != env_class:
            raise TaskFileError(f"{where}: field 'env_class' is {row['env_class']!r}, this env is {env_class!r}")
    return rows


class SkyRLGymEnv(ForeignAgentEnv):
    framework_title = "skyrl-gym"

    def __init__(self, env_id: str, *, data_file: str, env_config: dict[str, Any] | None = None, gold: str | None = None,
                 pick: str = "random", reward_bounds: tuple[float, float] = (0.0, 1.0), max_turns: int = 16,
                 call_timeout_s: float = 300.0, **kwargs: Any) -> None:
        import skyrl_gym
        from omegaconf import OmegaConf

        super().__init__(env_id, call_timeout_s=call_timeout_s, max_turns=max_turns, **kwargs)
        self._skyrl, self._config = skyrl_gym, OmegaConf.create(dict(env_config or {}))
        self.data_file = Path(data_file)
        self.tasks = read_tasks(self.data_file, env_id)
        self.picker = TaskPicker(pick)
        self.turn_limit = max_turns  # what a task's env may not exceed
        self.gold_template = gold if gold is not None else GOLD.get(env_id)
        self.reward_range_ = tuple(reward_bounds)
        self._env: Any = None

    def _reset(self, options: dict[str, Any]) -> Opening:
        self._close_env()
        index = self.picker.next(len(self.tasks), self.np_random)
        row = self.tasks[index]
        extras = {k: v for k, v in row.items() if k not in ("prompt", "env_class")}
        self._env = self._call("make", lambda: self._skyrl.make(self.env_id, env_config=self._config, extras=extras))
        self._stuck = False
        answer = self._call("init", lambda: self._env.init(row["prompt"]))
        if not (isinstance(answer, tuple) and len(answer) == 2):
            raise self._malformed("init", f"{type(answer).__name__}, not (prompt, metadata)")
        prompt, metadata = answer
        messages = self._messages("init", prompt)
        if not messages:
            raise self._malformed("init", "an empty prompt")
        self.max_turns = max(1, min(int(getattr(self._env, "max_turns", 1) or 1), self.turn_limit))
        fields = {**(row.get("extra_info") or {}), **(row.get("reward_spec") or {})}
        gold = fill_gold(self.gold_template, fields, where=self._where(f"gold ({self.data_file}, row {index + 1})"))
        return Opening(messages, gold, {"task_index": index, "skyrl_metadata": encode_value(metadata)})

    def _step(self, action: str) -> Outcome:
        out = self._call("step", lambda: self._env.step(action))
        if not isinstance(out, dict) or not {"observations", "reward", "done"} <= set(out):
            raise self._malformed("step", f"{type(out).__name__}, not a step output with observations, reward and done")
        reward = self._reward("step", out["reward"])
        messages = self._messages("step", out["observations"] or [])
        return Outcome(messages, reward, bool(out["done"]), {"skyrl": reward},
                       info={"skyrl_metadata": encode_value(out.get("metadata") or {})})

    def _messages(self, call: str, conversation: Any) -> list[Message]:
        if not isinstance(conversation, list):
            raise self._malformed(call, f"messages of type {type(conversation).__name__}, not a list")
        try:
            return from_openai(conversation)
        except (ValueError, TypeError) as exc:
            raise self._malformed(call, f"messages that are not OpenAI chat messages ({exc})") from None

    def _close_env(self) -> None:
        env, self._env = self._env, None
        if env is not None and not self._stuck:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - a failing close costs the next episode nothing
                pass

    def close(self) -> None:
        self._close_env()
        super().close()

