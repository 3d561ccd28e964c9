"""``relax-gym envs play``: its first line says who answers (``make play``: the gold policy), piped answers all
arrive, the header names only what it knows, the random policy plays by
the env's options and tools, and a tool that raises is shown with its traceback."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

import relax_gym
from relax_gym.cli import app
from relax_gym.envs.random_policy import RandomPolicy, listed_options
from relax_gym.envs.tools import parse_tool_calls
from relax_gym.omni import Message, TextPart

from .envs.test_agent_program import OnCompletions
from .envs.test_check_errors import BrokenCalculator

runner = CliRunner()


def test_piped_answers_reach_every_turn():
    result = runner.invoke(app, ["envs", "play", "nextqa-video", "--policy", "stdin", "--episodes", "3"],
                           input="<answer>A</answer>\n<answer>B</answer>\n<answer>C</answer>\n")
    assert result.exit_code == 0, result.output
    answers = [line.split("assistant: ", 1)[1] for line in result.output.splitlines() if "assistant: " in line]
    assert answers == ["<answer>A</answer>", "<answer>B</answer>", "<answer>C</answer>"]


def test_stdin_that_ends_early_is_an_error_not_a_loop():
    result = runner.invoke(app, ["envs", "play", "nextqa-video", "--policy", "stdin", "--episodes", "2"],
                           input="<answer>A</answer>\n")
    assert result.exit_code == 1 and "stdin ended before the episode did" in result.output


def test_the_header_leaves_out_an_origin_the_env_does_not_give():
    result = runner.invoke(app, ["envs", "play", "image-zoom", "--seed", "2"])
    assert result.exit_code == 0, result.output
    assert "image-zoom episode 0 (seed 2)" in result.output and "(seed 2, )" not in result.output


def test_options_are_read_from_the_prompt():
    listing = Message("user", (TextPart("Which?\nOptions:\nA. left\nB. right\n(C) up"),))
    assert listed_options([listing, Message("assistant", (TextPart("A. not a user line"),))]) == ["A", "B", "C"]
    assert listed_options([Message("user", (TextPart("no options here"),))]) == []


def test_the_random_policy_answers_among_the_options_and_calls_the_envs_tools():
    env = relax_gym.make("image-zoom")
    try:
        obs, _ = env.reset(seed=0)
        policy = RandomPolicy(np.random.default_rng(0))
        actions = [policy.act(env, obs) for _ in range(40)]
    finally:
        env.close()
    calls = [c for a in actions for c in parse_tool_calls(a)]
    answers = {a.split("<answer>")[1][0] for a in actions if "<answer>" in a}
    assert 10 <= len(calls) <= 30 and answers <= {"A", "B", "C", "D"} and len(answers) >= 3
    toolbox = env.unwrapped.toolbox
    for call in calls:  # every call names a real tool with arguments its schema accepts
        assert call.name == "zoom"
        toolbox.tools["zoom"].validate(call.arguments)


def test_play_shows_a_raising_tools_traceback(clean_registry):
    relax_gym.register("broken-calculator", BrokenCalculator)
    result = runner.invoke(app, ["envs", "play", "broken-calculator"])
    assert result.exit_code == 0, result.output
    assert "a tool raised:" in result.output and "ZeroDivisionError: division by zero" in result.output


def test_play_and_check_show_what_an_agent_program_said(clean_registry):
    """Its exit status, the request it sent that was refused, and its stderr's end, where the user looks."""
    relax_gym.register("completions-agent", OnCompletions)
    played = runner.invoke(app, ["envs", "play", "completions-agent", "--policy", "gold"])
    assert played.exit_code == 0, played.output
    assert "the agent program exited with status 1 after 0 model call(s); its first refused request: 404 for POST " \
           "/v1/completions" in " ".join(played.output.split())
    assert "the model call failed: NotFoundError" in played.output
    checked = runner.invoke(app, ["envs", "check", "completions-agent"])
    assert checked.exit_code == 1 and "FAIL completions-agent" in checked.output
    assert "the agent program exited with status 1" in checked.output and "NotFoundError" in checked.output


def test_envs_list_in_a_pipe_keeps_whole_lines_in_aligned_columns(clean_registry):
    long_id = "an-env-with-a-rather-long-name-for-the-id-column"
    relax_gym.register(long_id, BrokenCalculator, source="/a/very/long/path/" + "deep/" * 20 + "env.toml")
    result = runner.invoke(app, ["envs", "list"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    mine = next(line for line in lines if line.startswith(long_id))
    assert mine.endswith("deep/env.toml") and "…" not in result.output  # nothing cut at 80 columns
    column = lines[0].index("modalities")
    assert all(line[column - 2 : column] == "  " for line in lines[1:])  # every row lines up under the header
    assert mine[column:].split()[0] == "text"  # registered in code without modalities: its class's media kinds + text


def test_the_same_env_found_twice_is_one_env_and_a_clash_says_why(clean_registry):
    first = relax_gym.register("twice", BrokenCalculator, source="entry point pkg")
    assert relax_gym.register("twice", BrokenCalculator, source="/src/pkg/env.toml") is first  # the same package twice
    with pytest.raises(ValueError, match=r"already registered from entry point pkg .* registers it again as "
                                         r".*If both are one package found twice"):
        relax_gym.register("twice", "tests.envs.test_check_errors:OldGymStep", source="/other/env.toml")


def test_play_saves_the_media_it_shows_when_asked(tmp_path):
    from PIL import Image

    result = runner.invoke(app, ["envs", "play", "image-zoom", "--media-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    saved = [line.rsplit(" -> ", 1)[1] for line in result.output.splitlines() if "[image" in line and " -> " in line]
    assert saved and all(path.endswith(".png") for path in saved)
    with Image.open(saved[0]) as first:
        assert first.size == (48, 48)  # the overview as the policy sees it


@pytest.mark.parametrize("policy", ["gold", "random", "stdin"])
def test_the_first_line_says_who_answers(policy):
    result = runner.invoke(app, ["envs", "play", "nextqa-video", "--policy", policy], input="<answer>A</answer>\n")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == {
        "gold": "answered by the gold policy: each action is the env's correct answer (info['gold']), so the reward is "
                "the best the env gives; --policy stdin to answer yourself, --policy random for random answers",
        "random": "answered by the random policy: a random option or tool call each turn",
        "stdin": "answered by you: type the assistant's text, one line per turn"}[policy]


def test_make_play_says_the_gold_policy_answers():
    from pathlib import Path

    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    target = makefile[makefile.index("\nplay:"):].split("\n\n")[0]
    assert "gold policy answers" in target and "envs play nextqa-video" in target and "--policy gold" in target
