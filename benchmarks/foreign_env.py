"""Foreign env overhead: what an episode of a GEM, skyrl-gym, verifiers, OpenEnv or NeMo-Gym env costs through
relax-gym, against the framework called directly, per episode.

Three ways, the same episodes (same seeds / tasks, same actions), each played in rounds in turn so load swings hit
all three:

- ``raw``: the framework's own calls in its venv (GEM: ``gem.make`` once, ``reset(seed)``, a wrong guess, the
  right one; skyrl-gym: ``skyrl_gym.make("gsm8k", extras=row)``, ``init(prompt)``, ``step(answer)`` per task;
  verifiers: its own ``run_rollout`` of a one-turn ``SingleTurnEnv`` with a client that answers at once, rubric
  scoring included; OpenEnv: its own ``GenericEnvClient`` to the docs' example env under OpenEnv's server,
  ``reset(seed)``, ``state()`` (the secret), ``step``; NeMo-Gym: its protocol spoken with httpx from this process
  to the weather resources server of tests/envs/interop/test_nemo_gym_env.py, ``/seed_session``, the tool's
  route, ``/verify``);
- ``adapter``: relax-gym's adapter (``GemEnv`` / ``SkyRLGymEnv`` / ``VerifiersEnv``) in that same venv,
  in-process: what the translation (messages, gold, the call deadline's thread, the rollout's event loop) adds;
- ``served``: ``relax_gym.make("gem:...")`` from this process: the adapter behind its env server in the
  framework's venv, what a trainer sees. NeMo-Gym has no venv: its adapter runs in this process, so ``adapter``
  and ``served`` are the same way, measured once.

Prints the medians (ms per episode), served / raw, and the overhead per episode (served - raw). The venvs are made
(or found) first (``relax-gym envs prepare``), outside the timing.

Run: `python benchmarks/foreign_env.py [--episodes N]`; ``run(quick)`` returns the figures as a dict (quick: fewer
episodes, one round)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

import relax_gym
from relax_gym.envs.interop.frameworks import FRAMEWORKS
from relax_gym.envs.interop.venvs import ensure_venv
from relax_gym.envs.remote import launcher

ROOT = str(Path(relax_gym.__file__).resolve().parent.parent)
sys.path.insert(0, ROOT)  # the example OpenEnv env and NeMo-Gym resources server are the tests' own
from tests.envs.interop.test_nemo_gym_env import GOLD, TOOL, WEATHER, resources_server, serve  # noqa: E402
from tests.envs.interop.test_openenv_env import SERVER as OPENENV_SERVER  # noqa: E402
GUESS = "game:GuessTheNumber-v0-easy"
# the verifiers env: a module with load_environment, as verifiers' docs write one (on the path through PYTHONPATH)
VF_MODULE = """
import verifiers as vf
from datasets import Dataset

def load_environment(**kwargs):
    rows = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in [(3, 4), (10, 20), (7, 8), (1, 1)]]
    parser = vf.Parser()

    def exact_answer(completion, answer, **kwargs) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), parser=parser, rubric=vf.Rubric(funcs=[exact_answer], parser=parser))
"""
TASKS = [{"prompt": [{"role": "user", "content": f"What is {a} + {b}? Answer after ####."}], "env_class": "gsm8k",
          "reward_spec": {"method": "rule", "ground_truth": str(a + b)}} for a, b in [(3, 4), (10, 20), (7, 8), (1, 1)]]

# runs in the framework's venv: argv[1] is a JSON request, stdout one JSON line of per-episode milliseconds
IN_VENV = r"""
import json, sys, time
request = json.loads(sys.argv[1])
sys.path.append(request["root"])
n, scheme, how = request["episodes"], request["scheme"], request["how"]
times = []
finish = lambda: None  # noqa: E731 - what ends the run cleanly (a WebSocket session's close)
if scheme == "gem":
    if how == "raw":
        import gem
        env = gem.make(request["id"])
        def episode(seed):
            env.reset(seed=seed)
            wrong = 1 if env.game_number != 1 else 2
            env.step("\\boxed{%d}" % wrong)
            env.step("\\boxed{%d}" % env.game_number)
    else:
        from relax_gym.envs.interop.gem_env import GemEnv
        env = GemEnv(request["id"])
        def episode(seed):
            _, info = env.reset(seed=seed)
            secret = int(info["gold"][len("\\boxed{"):-1])
            env.step("\\boxed{%d}" % (1 if secret != 1 else 2))
            env.step(info["gold"])
elif scheme == "verifiers":
    import asyncio
    if how == "raw":
        import verifiers.legacy as vf
        env = vf.load_environment("vf-bench-sums")
        rows = [dict(r) for r in env.get_dataset()]
        loop = asyncio.new_event_loop()
        class Answer(vf.Client):  # answers each model call with the row's answer at once
            def setup_client(self, config): return None
            async def to_native_tool(self, tool): return tool
            async def to_native_prompt(self, messages): return messages, {}
            async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs): return self.answer
            async def raise_from_native_response(self, response): return None
            async def from_native_response(self, response):
                return vf.Response(id="x", created=0, model=model_name, message=vf.ResponseMessage(
                    content=response, finish_reason="stop", is_truncated=False))
            async def close(self): return None
        model_name, client = "m", Answer(object())
        def episode(seed):
            row = rows[seed % len(rows)]
            client.answer = row["answer"]
            loop.run_until_complete(env.run_rollout({"prompt": row["prompt"], "example_id": seed, "answer": row["answer"],
                                                     "info": {}}, client, model_name, {}))
    else:
        from relax_gym.envs.interop.verifiers_env import VerifiersEnv
        env = VerifiersEnv("vf-bench-sums", pick="cycle")
        def episode(seed):
            _, info = env.reset(seed=seed)
            env.step(info["gold"])
elif scheme == "openenv":
    if how == "raw":
        from openenv.core.generic_client import GenericEnvClient
        client = GenericEnvClient(base_url=request["url"]).sync().connect()
        finish = client.close
        def episode(seed):
            client.reset(seed=seed)
            client.step({"message": client.state()["secret"]})
    else:
        from relax_gym.envs.interop.openenv_env import OpenEnvEnv
        env = OpenEnvEnv(request["url"], observation_field="prompt", gold="{secret}")
        finish = env.close
        def episode(seed):
            _, info = env.reset(seed=seed)
            env.step(info["gold"])
else:
    tasks = [json.loads(line) for line in open(request["data_file"])]
    if how == "raw":
        import skyrl_gym
        from omegaconf import OmegaConf
        config = OmegaConf.create({})
        def episode(seed):
            row = tasks[seed % len(tasks)]
            env = skyrl_gym.make("gsm8k", env_config=config, extras={"reward_spec": row["reward_spec"]})
            env.init(row["prompt"])
            env.step("#### " + row["reward_spec"]["ground_truth"])
            env.close()
    else:
        from relax_gym.envs.interop.skyrl_env import SkyRLGymEnv
        env = SkyRLGymEnv("gsm8k", data_file=request["data_file"], pick="cycle")
        def episode(seed):
            _, info = env.reset(seed=seed)
            env.step(info["gold"])
for seed in range(n):
    t0 = time.perf_counter()
    episode(seed)
    times.append((time.perf_counter() - t0) * 1e3)
finish()
print(json.dumps(times))
"""


def in_venv(python: Path, scheme: str, how: str, episodes: int, data_file: str, url: str = "") -> list[float]:
    request = {"root": ROOT, "scheme": scheme, "how": how, "episodes": episodes, "id": GUESS, "data_file": data_file,
               "url": url}
    out = subprocess.run([str(python), "-c", IN_VENV, json.dumps(request)], check=True, capture_output=True, text=True,
                         timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def served_episodes(env, scheme: str, episodes: int) -> list[float]:
    times = []
    for seed in range(episodes):
        t0 = time.perf_counter()
        _, info = env.reset(seed=seed)
        if scheme == "gem":
            secret = int(info["gold"][len("\\boxed{"):-1])
            env.step("\\boxed{%d}" % (1 if secret != 1 else 2))
        elif scheme == "nemo-gym":  # the tool call, then the answer
            info = env.step(info["gold"])[4]
        env.step(info["gold"])
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def nemo_gym_raw(url: str, rows: list[dict], episodes: int) -> list[float]:
    """NeMo-Gym's protocol by hand (httpx, as its agent posts): seed the session, call the tool, verify."""
    times = []
    with httpx.Client(base_url=url) as http:
        for seed in range(episodes):
            row = rows[seed % len(rows)]
            t0 = time.perf_counter()
            http.cookies.clear()  # a new session
            http.post("/seed_session", json=row).raise_for_status()
            result = http.post("/get_weather", json={"city": row["city"]})
            output = [{"type": "function_call", "call_id": "c", "name": "get_weather",
                       "arguments": json.dumps({"city": row["city"]})},
                      {"type": "function_call_output", "call_id": "c", "output": result.text},
                      {"type": "message", "role": "assistant", "content": [{"type": "output_text",
                                                                           "text": row["expected_weather"]}]}]
            assert http.post("/verify", json={**row, "response": {"output": output}}).json()["reward"] == 1.0
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def http_case(scheme: str, tmp: str, episodes: int, rounds: int) -> dict:
    """OpenEnv (the example env under OpenEnv's server, in its venv) or NeMo-Gym (a resources server here)."""
    if scheme == "openenv":
        python = ensure_venv(FRAMEWORKS["openenv"])
        ready = Path(tmp) / "openenv-ready.json"
        process = subprocess.Popen([str(python), "-c", OPENENV_SERVER, str(ready)], stdin=subprocess.DEVNULL)
        if launcher.wait_ready(process, ready, 300) is not None:
            raise RuntimeError("the OpenEnv example server did not start")
        url, stop = json.loads(ready.read_text())["url"], process.terminate
        env = relax_gym.make(f"openenv:{url}", observation_field="prompt", gold="{secret}")
    else:
        server, url = serve(resources_server())
        rows = [{"responses_create_params": {"input": [{"role": "user", "content": f"Weather in {city}?"}],
                                             "tools": [TOOL]}, "city": city, "expected_weather": weather}
                for city, weather in WEATHER.items()]
        data_file = Path(tmp) / "weather.jsonl"
        data_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
        stop = lambda: setattr(server, "should_exit", True)  # noqa: E731
        env = relax_gym.make(f"nemo-gym:{url}", data_file=str(data_file), gold=GOLD, pick="cycle")
    try:
        served_episodes(env, scheme, 5)
        timings: dict[str, list[float]] = {"raw": [], "adapter": [], "served": []}
        for _ in range(rounds):
            if scheme == "openenv":
                timings["raw"] += in_venv(python, scheme, "raw", episodes, "", url)
                timings["adapter"] += in_venv(python, scheme, "adapter", episodes, "", url)
            else:
                timings["raw"] += nemo_gym_raw(url, rows, episodes)
            timings["served"] += served_episodes(env, scheme, episodes)
        env.close()
    finally:
        stop()
    if not timings["adapter"]:
        timings["adapter"] = timings["served"]
    raw, adapter, served = (statistics.median(timings[k]) for k in ("raw", "adapter", "served"))
    return {"framework": scheme, "raw_ms": raw, "adapter_ms": adapter, "served_ms": served,
            "served_over_raw": served / raw, "overhead_ms": served - raw}


def run(quick: bool = False, *, episodes: int | None = None) -> dict:
    """``{"episodes", "rounds", "cpus", "load_before", "load_after", "cases": [{"framework", "raw_ms", "adapter_ms",
    "served_ms", "served_over_raw", "overhead_ms"}]}``; medians over ``episodes`` per way and round (default 100,
    quick 20) and ``rounds`` rounds (3, quick 1)."""
    episodes, rounds = episodes or (20 if quick else 100), 1 if quick else 3
    load_before = os.getloadavg()
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        data_file = str(Path(tmp) / "tasks.jsonl")
        Path(data_file).write_text("".join(json.dumps(t) + "\n" for t in TASKS))
        (Path(tmp) / "vf_bench_sums.py").write_text(VF_MODULE)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [tmp, os.environ.get("PYTHONPATH")]))
        for scheme in ("gem", "skyrl-gym", "verifiers"):
            python = ensure_venv(FRAMEWORKS[scheme])
            env_id, kwargs = {"gem": (GUESS, {}), "skyrl-gym": ("gsm8k", {"data_file": data_file, "pick": "cycle"}),
                              "verifiers": ("vf-bench-sums", {"pick": "cycle"})}[scheme]
            env = relax_gym.make(f"{scheme}:{env_id}", **kwargs)
            served_episodes(env, scheme, 5)  # warm-up: the server's first session, connections
            timings: dict[str, list[float]] = {"raw": [], "adapter": [], "served": []}
            for _ in range(rounds):
                timings["raw"] += in_venv(python, scheme, "raw", episodes, data_file)
                timings["adapter"] += in_venv(python, scheme, "adapter", episodes, data_file)
                timings["served"] += served_episodes(env, scheme, episodes)
            env.close()
            raw, adapter, served = (statistics.median(timings[k]) for k in ("raw", "adapter", "served"))
            cases.append({"framework": scheme, "raw_ms": raw, "adapter_ms": adapter, "served_ms": served,
                          "served_over_raw": served / raw, "overhead_ms": served - raw})
        cases += [http_case(scheme, tmp, episodes, rounds) for scheme in ("openenv", "nemo-gym")]
        launcher.stop_all()
    return {"episodes": episodes, "rounds": rounds, "cpus": os.cpu_count(), "load_before": load_before[0],
            "load_after": os.getloadavg()[0], "cases": cases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=100, help="episodes per way and round")
    args = parser.parse_args()
    result = run(episodes=args.episodes)
    table = Table("framework", "raw (ms/episode)", "adapter in-process", "served (what the trainer sees)", "served / raw",
                  "overhead (ms/episode)",
                  title=f"foreign envs, {result['episodes']} episodes x {result['rounds']} rounds per way (medians)")
    for c in result["cases"]:
        table.add_row(c["framework"], f"{c['raw_ms']:.3f}", f"{c['adapter_ms']:.3f}", f"{c['served_ms']:.3f}",
                      f"{c['served_over_raw']:.1f}x", f"{c['overhead_ms']:.2f}")
    console = Console()
    console.print(table)
    console.print(f"{result['cpus']} CPUs, 1-min load {result['load_before']:.2f} before, {result['load_after']:.2f} after")


if __name__ == "__main__":
    main()
