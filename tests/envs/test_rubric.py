"""Rubrics: weighted named reward parts (rules and judge prompts), in code and in manifests, on data and code envs."""

from __future__ import annotations

import itertools
import json
import textwrap

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

import relax_gym
from relax_gym.cli import app
from relax_gym.envs import (
    RULES,
    AgentEnv,
    JudgeRequest,
    ManifestError,
    Opening,
    Outcome,
    Rubric,
    RubricError,
    RubricPart,
    check_env,
    combine,
    discover,
    load_manifest,
    register_rule,
    with_rubric,
)
from relax_gym.envs import rubric as rubric_mod
from relax_gym.envs.multiple_choice_reward import MultipleChoiceReward
from relax_gym.envs.rewards import (
    multiple_choice,
    think_answer_format,
)
from relax_gym.omni import Message, TextPart

OPTIONS = ["left", "right", "up", "down", "it stays still"]


def parts(*specs: dict) -> Rubric:
    return Rubric(parts=[RubricPart(**s) for s in specs])


# -------------------------------------------------------------------------------------------- scoring


def test_weights_give_the_hand_computed_total():
    r = parts({"name": "exact", "weight": 3.0}, {"name": "format", "weight": 1.0},
              {"name": "accuracy", "rule": "multiple_choice", "weight": 4.0})
    context = {"gold": "Right", "gold_letter": "B", "options": OPTIONS}
    # exact: "right" == "Right" -> 1; format: no <think> -> 0; accuracy: "right" is option B -> 1
    score = r.score("<answer> right </answer>", context)
    assert score.breakdown == {"exact": 1.0, "format": 0.0, "accuracy": 1.0}
    assert score.total == pytest.approx((3 * 1 + 1 * 0 + 4 * 1) / 8)
    assert score.weights == {"exact": 3.0, "format": 1.0, "accuracy": 4.0}
    assert score.pending == [] and score.failed == []
    score = r.score("<think>t</think><answer>C</answer>", context)  # exact 0, format 1, accuracy 0
    assert score.total == pytest.approx(1 / 8)


def test_total_is_a_weighted_mean_whatever_the_scale():
    text, context = "<answer>B</answer>", {"gold_letter": "B", "options": OPTIONS}
    totals = {scale: parts({"name": "accuracy", "rule": "multiple_choice", "weight": 3 * scale},
                           {"name": "format", "weight": 1 * scale}).score(text, context).total for scale in (0.01, 1, 250)}
    assert all(t == pytest.approx(0.75) for t in totals.values())
    only = parts({"name": "accuracy", "rule": "multiple_choice", "weight": 0.0}, {"name": "format", "weight": 2.0})
    assert only.score(text, context).total == 0.0  # a zero-weight part is reported but does not count
    assert only.score(text, context).breakdown == {"accuracy": 1.0, "format": 0.0}


def test_combine_counts_missing_parts_zero_and_ignores_others():
    assert combine({"a": 1.0, "b": 3.0}, {"a": 1.0, "b": 0.5}) == pytest.approx(2.5 / 4)
    assert combine({"a": 1.0, "b": 3.0}, {"a": 1.0, "call_cost": 9.0}) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="positive sum"):
        combine({"a": 0.0}, {"a": 1.0})


def judged_rubric() -> Rubric:
    return parts({"name": "format", "weight": 1.0},
                 {"name": "match", "kind": "judge", "weight": 2.0,
                  "template": "Facts: {facts}\nAnswer: {response}\nDoes the answer state the facts? yes or no"},
                 {"name": "detail", "kind": "judge", "verdict": "score", "max_score": 5, "weight": 1.0,
                  "template": "Rate 0-5 how detailed this is about {facts[0]}: {response}"})


def test_pending_judge_parts_count_zero_and_render_their_prompts():
    text = "<think>t</think><answer>a dog runs</answer>"
    score = judged_rubric().score(text, {"facts": ["dog", "runs"]})
    assert score.breakdown == {"format": 1.0}
    assert score.total == pytest.approx(1 / 4)
    assert [r.part for r in score.pending] == ["match", "detail"]
    match, detail = score.pending
    assert match.prompt == f"Facts: ['dog', 'runs']\nAnswer: {text}\nDoes the answer state the facts? yes or no"
    assert detail.prompt.startswith("Rate 0-5 how detailed this is about dog: <think>")
    assert (match.verdict, match.labels, match.weight) == ("label", {"yes": 1.0, "no": 0.0}, 2.0)
    assert (detail.verdict, detail.max_score) == ("score", 5.0)
    info = score.judge_info()
    assert info["reward_weights"] == {"format": 1.0, "match": 2.0, "detail": 1.0}
    assert [JudgeRequest.model_validate(r) for r in json.loads(json.dumps(info["judge_requests"]))] == score.pending
    # what the trainer does once it has the verdicts
    judged = {**score.breakdown, "match": 1.0, "detail": 0.4}
    assert combine(info["reward_weights"], judged) == pytest.approx((1 + 2 + 0.4) / 4)


def test_a_synchronous_judge_scores_the_parts_and_a_none_verdict_fails_one():
    seen = []

    def judge(requests):
        seen.extend(requests)
        return [None, 0.6]

    score = judged_rubric().score("<think>t</think><answer>x</answer>", {"facts": ["cat"]}, judge=judge)
    assert [r.part for r in seen] == ["match", "detail"]
    assert score.pending == [] and score.failed == ["match"]
    assert score.breakdown == {"format": 1.0, "detail": 0.6}
    assert score.total == pytest.approx((1 + 0 + 0.6) / 4)
    assert score.judge_info() == {}
    with pytest.raises(RubricError, match="1 verdict"):
        judged_rubric().score("x", {"facts": ["cat"]}, judge=lambda rs: [1.0])
    with pytest.raises(RubricError, match="outside"):
        judged_rubric().score("x", {"facts": ["cat"]}, judge=lambda rs: [1.0, 7.0])


@pytest.mark.parametrize(
    "request_kwargs, reply, value",
    [
        ({}, "Yes.", 1.0),
        ({}, "no, it misses the dog", 0.0),
        ({}, "maybe", None),
        ({"labels": {"correct": 1.0, "partially correct": 0.5, "wrong": 0.0}}, "Partially correct: ...", 0.5),
        ({"verdict": "score", "max_score": 10}, "Score: 7/10", 0.7),
        ({"verdict": "score", "max_score": 10}, "12", None),
        ({"verdict": "score", "max_score": 10}, "no number", None),
    ],
)
def test_judge_request_parses_verdicts(request_kwargs, reply, value):
    request = JudgeRequest(part="p", prompt="?", **request_kwargs)
    assert request.parse(reply) == (pytest.approx(value) if value is not None else None)


# -------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "specs, message",
    [
        ([{"name": "acc", "rule": "nope"}], "unknown rule 'nope'"),
        ([{"name": "acc"}], "give rule = one of"),
        ([{"name": "j", "kind": "judge"}], "needs a template"),
        ([{"name": "j", "kind": "judge", "template": "  "}], "needs a template"),
        ([{"name": "j", "kind": "judge", "template": "{} and {0}"}], "has no name"),
        ([{"name": "j", "kind": "judge", "template": "{unclosed"}], "Value error"),
        ([{"name": "format", "template": "x"}], "belongs to a judge part"),
        ([{"name": "format"}, {"name": "format", "weight": 2}], "repeated: format"),
        ([{"name": "format", "weight": 0}, {"name": "exact", "weight": 0}], "positive sum"),
        ([{"name": "format", "weight": -1}], "greater than or equal to 0"),
        ([], "at least one part"),
        ([{"name": "reward", "rule": "format"}], "reserved"),
        ([{"name": "has space", "rule": "format"}], "not an identifier"),
        ([{"name": "j", "kind": "judge", "template": "t", "labels": {"yes": 2.0}}], "lie in"),
        ([{"name": "j", "kind": "judge", "template": "t", "labels": {"Yes": 1.0, "yes!": 0.0}}], "distinct"),
    ],
)
def test_bad_rubrics_are_refused(specs, message):
    with pytest.raises(ValidationError, match=message):
        Rubric.model_validate({"parts": specs})


def test_a_missing_context_field_is_one_error_naming_part_and_field():
    with pytest.raises(RubricError) as err:
        judged_rubric().score("x", {"gold": "g", "options": ["a"]})
    assert str(err.value) == "part 'match': template field 'facts' is not in the env's reward context (has: gold, options)"
    with pytest.raises(RubricError) as err:
        parts({"name": "accuracy", "rule": "multiple_choice"}).score("x", {})
    assert str(err.value) == ("part 'accuracy': rule 'multiple_choice' needs fields 'gold_letter', 'options', which are "
                              "not in the env's reward context (the env gives no reward context)")


def test_registered_and_imported_rules(monkeypatch):
    monkeypatch.setattr(rubric_mod, "RULES", dict(RULES))
    monkeypatch.setattr(rubric_mod, "RULE_FIELDS", dict(rubric_mod.RULE_FIELDS))

    def length(response, context):
        return min(1.0, len(response) / context["target"])  # reads an undeclared field

    register_rule("length", length)
    with pytest.raises(ValueError, match="'length' is already registered"):
        register_rule("length", lambda r, c: 1.0)
    with pytest.raises(ValueError, match="already registered"):
        register_rule("format", lambda r, c: 1.0)
    r = parts({"name": "length"}, {"name": "short", "rule": "tests.envs.test_rubric:always_half"})
    assert r.score("abcd", {"target": 8}).breakdown == {"length": 0.5, "short": 0.5}
    with pytest.raises(RubricError, match="part 'length': rule 'length' needs field 'target'"):
        r.score("abcd", {"gold": 1})
    bad = parts({"name": "x", "rule": "tests.envs.test_rubric:no_such_function"})
    with pytest.raises(RubricError, match="cannot be imported"):
        bad.score("abcd", {})
    broken = parts({"name": "x", "rule": "tests.envs.test_rubric:out_of_range"})
    with pytest.raises(RubricError, match="returned 2.0, outside"):
        broken.score("abcd", {})


def always_half(response, context):
    return 0.5


def out_of_range(response, context):
    return 2.0


@pytest.mark.parametrize(
    "text, gold, value",
    [("<answer>Paris</answer>", "paris", 1.0), ("<answer>  PARIS. </answer>", "Paris", 1.0),
     ("<answer>Paris, France</answer>", "Paris", 0.0), ("Paris", "Paris", 0.0)],
)
def test_exact_rule_normalises(text, gold, value):
    assert RULES["exact"](text, {"gold": gold}) == value


def test_math_rule_uses_math_verify():
    assert RULES["math"]("<think>x</think><answer>\\frac{1}{2}</answer>", {"gold": "0.5"}) == 1.0
    assert RULES["math"]("<answer>3</answer>", {"gold": 4}) == 0.0


# -------------------------------------------------------------------------------------------- MCQ equivalence

TEXTS = [
    "<think>it moves</think><answer>B</answer>", "<answer>B</answer>", "<think>x</think><answer>(b)</answer>",
    "<think>x</think><answer>right</answer>", "<think>x</think><answer>C</answer>", "<answer>C</answer> trailing",
    "B", "", "<think>a<answer>B</answer>", "<answer>A</answer><answer>B</answer>", "<think>x</think><answer></answer>",
    "  <think>\nmulti</think>\n<answer>B. right</answer>\n", "<think>x</think><answer>E</answer>", "<answer>Z</answer>",
]


def old_mcq(text, gold, options, w_acc, w_fmt):  # MultipleChoiceReward before it became a rubric
    acc, fmt = multiple_choice(text, gold, options), think_answer_format(text)
    return (w_acc * acc + w_fmt * fmt) / (w_acc + w_fmt), {"accuracy": acc, "format": fmt}


@pytest.mark.parametrize("w_acc, w_fmt", [(0.9, 0.1), (3.0, 1.0), (1.0, 0.0), (0.0, 0.5), (0.7, 0.3), (2.5, 2.5)])
def test_multiple_choice_reward_is_the_old_formula_as_a_rubric(w_acc, w_fmt):
    reward = MultipleChoiceReward(accuracy=w_acc, format=w_fmt)
    assert [(p.name, p.rule, p.weight) for p in reward.rubric.parts] == [("accuracy", "multiple_choice", w_acc),
                                                                        ("format", "format", w_fmt)]
    for text, gold in itertools.product(TEXTS, "ABCE"):
        assert reward(text, gold, OPTIONS) == old_mcq(text, gold, OPTIONS, w_acc, w_fmt), (text, gold)


# -------------------------------------------------------------------------------------------- envs


class Echo(AgentEnv):
    """One turn; the reward context is whatever the constructor was given (None: none)."""

    media_kinds = ()

    def __init__(self, context: dict | None = None, **kw) -> None:
        super().__init__(**kw)
        self.context = context

    def _reset(self, options):
        return Opening([Message("user", (TextPart("say the gold word"),))], gold="<think>t</think><answer>gold</answer>")

    def _step(self, action):
        return Outcome([], 0.0, True, {"own": 0.0}, reward_context=self.context)


class RubricEcho(Echo):
    rubric = Rubric(parts=[RubricPart(name="exact", weight=3.0), RubricPart(name="format"),
                           RubricPart(name="match", kind="judge", template="Is {response!r} the word {gold}?")])


def test_an_env_with_a_rubric_in_code_reports_parts_and_pending_requests():
    env = RubricEcho({"gold": "gold"})
    _, info = env.reset(seed=0)
    _, reward, terminated, _, info = env.step(info["gold"])
    assert terminated and reward == pytest.approx(4 / 5)
    assert info["reward_breakdown"] == {"exact": 1.0, "format": 1.0}
    assert info["reward_context"] == {"gold": "gold"}
    assert info["reward_weights"] == {"exact": 3.0, "format": 1.0, "match": 1.0}
    (request,) = info["judge_requests"]
    assert request["part"] == "match" and request["prompt"] == "Is '<think>t</think><answer>gold</answer>' the word gold?"
    report = check_env(env, skip_gym=True)  # a perfect judge approves the gold answer: max reward
    assert "gold action => max reward" in report.passed
    env.use_rubric(None)  # back to the env's own reward
    env.reset(seed=0)
    _, reward, _, _, info = env.step("<answer>gold</answer>")
    assert reward == 0.0 and info["reward_breakdown"] == {"own": 0.0} and "judge_requests" not in info


def test_a_rubric_without_the_context_it_needs_names_the_field():
    env = with_rubric(Echo(None), {"parts": [{"name": "exact"}]}, source="my/env.toml")
    env.reset(seed=0)
    with pytest.raises(RubricError) as err:
        env.step("<answer>gold</answer>")
    assert str(err.value) == ("my/env.toml [reward]: part 'exact': rule 'exact' needs field 'gold', which is not in the "
                              "env's reward context (the env gives no reward context)")


def test_builtin_envs_report_a_json_reward_context():
    for env_id, keys in [("nextqa-video", {"gold_letter", "options", "question"}),
                         ("image-zoom", {"gold_letter", "options", "question", "gold"})]:
        env = relax_gym.make(env_id)
        _, info = env.reset(seed=1)
        done = False
        while not done:
            _, reward, terminated, truncated, info = env.step(info["gold"])
            done = terminated or truncated
        assert reward == 1.0 and set(info["reward_context"]) == keys
        json.dumps(info["reward_context"])
        assert Rubric(parts=[RubricPart(name="accuracy", rule="multiple_choice")]).score(
            info["gold"], info["reward_context"]).total == 1.0
        env.close()


# -------------------------------------------------------------------------------------------- manifests


def write(folder, text):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "env.toml").write_text(textwrap.dedent(text))
    return folder / "env.toml"


ZOOM_RUBRIC = """
    id = "zoom-rubric"
    entry_point = "relax_gym.envs.image_zoom:ImageZoomEnv"
    [kwargs]
    max_turns = 4
    [[reward.parts]]
    name = "accuracy"
    rule = "multiple_choice"
    weight = 2.0
    [[reward.parts]]
    name = "colour"
    rule = "exact"
    weight = 1.0
    [[reward.parts]]
    name = "named"
    kind = "judge"
    template = "Question: {question}\\nReply: {response}\\nDoes the reply name the colour {gold}? yes or no"
"""


def test_a_code_env_takes_a_manifest_rubric(tmp_path, monkeypatch, clean_registry):
    write(tmp_path / "zoom", ZOOM_RUBRIC)
    monkeypatch.setenv("RELAX_GYM_ENV_PATH", str(tmp_path))
    discover(force=True)
    spec = relax_gym.spec("zoom-rubric")
    assert spec.entry_point == "relax_gym.envs.image_zoom:ImageZoomEnv" and spec.kwargs == {"max_turns": 4}
    shown = CliRunner().invoke(app, ["envs", "show", "zoom-rubric"]).output
    assert "reward (rubric): accuracy (multiple_choice, weight 2), colour (exact, weight 1), named (judge, weight 1)" in shown
    env = relax_gym.make("zoom-rubric", max_turns=3)  # make's kwargs still reach the env
    assert env.unwrapped.max_turns == 3 and env.unwrapped.rubric is not None
    _, info = env.reset(seed=0)
    *_, info = env.step(info["gold"])  # the zoom call
    _, reward, terminated, _, info = env.step(info["gold"])  # "<answer>C</answer>": the letter, not the colour's name
    assert terminated and info["reward_breakdown"] == {"accuracy": 1.0, "colour": 0.0}
    assert reward == pytest.approx(2 / 4)
    (request,) = info["judge_requests"]
    assert request["prompt"].startswith("Question: A small coloured square") and "the colour red?" in request["prompt"]
    env.close()


def test_check_env_holds_a_manifest_rubric_to_the_max_reward(tmp_path, monkeypatch, clean_registry):
    write(tmp_path / "zoom", ZOOM_RUBRIC)
    monkeypatch.setenv("RELAX_GYM_ENV_PATH", str(tmp_path))
    discover(force=True)
    env = relax_gym.make("zoom-rubric")
    with pytest.raises(AssertionError, match="gold actions earned 0.75, the maximum is 1.0"):
        check_env(env, skip_gym=True)  # the gold answer is a letter: `exact` against the colour's name fails
    env.close()
    write(tmp_path / "zoom", ZOOM_RUBRIC.replace('rule = "exact"', 'rule = "format"'))
    discover(force=True)
    env = relax_gym.make("zoom-rubric")
    assert "gold action => max reward" in check_env(env).passed
    env.close()


def test_a_data_env_takes_either_form(tmp_path, monkeypatch, clean_registry):
    write(tmp_path / "quiz", """
        id = "quiz-rubric"
        [dataset]
        format = "nextqa"
        split = "val"
        sample = "nextqa"
        [[reward.parts]]
        name = "accuracy"
        rule = "multiple_choice"
        [[reward.parts]]
        name = "answered"
        kind = "judge"
        template = "{question} -> {response}: sensible? yes or no"
    """)
    monkeypatch.setenv("RELAX_GYM_ENV_PATH", str(tmp_path))
    discover(force=True)
    env = relax_gym.make("quiz-rubric")
    _, info = env.reset(seed=0)
    _, reward, _, _, info = env.step(info["gold"])
    assert reward == 0.5 and info["reward_breakdown"] == {"accuracy": 1.0}
    assert [r["part"] for r in info["judge_requests"]] == ["answered"]
    assert "gold action => max reward" in check_env(env).passed
    env.close()
    old = load_manifest(relax_gym.spec("nextqa-video").source)  # the weights form, as before
    assert old.reward.accuracy == 0.9 and old.rubric() is None
    assert old.constructor_kwargs()["reward"] == {"accuracy": 0.9, "format": 0.1}


def test_a_rubric_needing_a_field_the_env_lacks_names_manifest_and_field(tmp_path, monkeypatch, clean_registry):
    path = write(tmp_path / "count", """
        id = "countdown-rubric"
        entry_point = "tests.envs.test_core:Countdown"
        [[reward.parts]]
        name = "exact"
    """)
    monkeypatch.setenv("RELAX_GYM_ENV_PATH", str(tmp_path))
    discover(force=True)
    env = relax_gym.make("countdown-rubric")
    _, info = env.reset(seed=0, options={"start": 1})
    with pytest.raises(RubricError, match=rf"^{path} \[reward\]: part 'exact': rule 'exact' needs field 'gold'"):
        env.step(info["gold"])
    result = CliRunner().invoke(app, ["envs", "play", "countdown-rubric"])
    assert result.exit_code == 1 and "[reward]: part 'exact'" in " ".join(result.output.split())
    result = CliRunner().invoke(app, ["envs", "check", "countdown-rubric"])
    assert result.exit_code == 1 and "FAIL" in result.output and "[reward]" in result.output


def test_reward_weights_of_a_code_env_go_to_its_constructor(tmp_path, monkeypatch, clean_registry):
    write(tmp_path / "weighted", '''
        id = "tool-use-weighted"
        entry_point = "relax_gym.envs.tool_use:ToolUseEnv"
        [reward]
        accuracy = 0.5
        format = 0.5
    ''')
    assert load_manifest(tmp_path / "weighted").constructor_kwargs() == {"accuracy_weight": 0.5, "format_weight": 0.5}
    monkeypatch.setenv("RELAX_GYM_ENV_PATH", str(tmp_path))
    discover(force=True)
    env = relax_gym.make("tool-use-weighted")
    try:
        assert env.unwrapped.weights == (0.5, 0.5)
    finally:
        env.close()


@pytest.mark.parametrize(
    "text, field, reason",
    [
        ('[server]\nurl = "http://127.0.0.1:9"\n[reward]\naccuracy = 1.0\n', None, "apply to data environments"),
        ('entry_point = "a.b:C"\n[reward]\naccuracy = 1.0\n[[reward.parts]]\nname = "format"\n', "reward", "not both"),
        ('entry_point = "a.b:C"\n[reward]\n', "reward", "give the accuracy/format weights"),
        ('entry_point = "a.b:C"\n[[reward.parts]]\nname = "acc"\nrule = "nope"\n', "reward.parts.0", "unknown rule"),
        ('entry_point = "a.b:C"\n[[reward.parts]]\nname = "j"\nkind = "judge"\n', "reward.parts.0", "needs a template"),
        ('entry_point = "a.b:C"\n[[reward.parts]]\nname = "format"\n[[reward.parts]]\nname = "format"\n', "reward",
         "repeated: format"),
        ('[server]\nurl = "http://127.0.0.1:9"\n[[reward.parts]]\nname = "format"\n', None, "served at a url"),
        ('[dataset]\nformat = "jsonl"\n[reward]\naccuracy = 0\nformat = 0\n', "reward", "positive"),
    ],
)
def test_bad_reward_tables_name_file_and_field(tmp_path, text, field, reason):
    path = tmp_path / "env.toml"
    path.write_text('id = "x"\n' + text)
    with pytest.raises(ManifestError) as err:
        load_manifest(path)
    assert str(path) in str(err.value) and reason in str(err.value)
    assert err.value.field == field


def test_cli_errors_keep_their_brackets(tmp_path, monkeypatch):
    path = write(tmp_path / "bad", 'id = "bad"\n[server]\nurl = "http://127.0.0.1:9"\n[reward]\naccuracy = 1.0\n')
    monkeypatch.setenv("RELAX_GYM_ENV_PATH", str(tmp_path))
    from relax_gym.cli import _fail, err_console

    with err_console.capture() as captured:
        _fail(str(load_manifest_error(path)))
    assert "[reward] accuracy/format weights" in captured.get() and "[dataset]" in captured.get()


def load_manifest_error(path) -> ManifestError:
    try:
        load_manifest(path)
    except ManifestError as exc:
        return exc
    raise AssertionError("the manifest loaded")


def test_every_part_becomes_a_metric():
    from relax_gym.trainer.run.step_row import rollout_row

    env = RubricEcho({"gold": "gold"})
    episodes = []
    for action in ("<think>t</think><answer>gold</answer>", "<answer>silver</answer>"):
        env.reset(seed=0)
        _, reward, _, _, info = env.step(action)
        episodes.append({"reward": reward, "status": info["status"], "trainable": True, "completion_tokens": 1,
                         "reward_breakdown": info["reward_breakdown"]})
    row = rollout_row(episodes, 1.0, known=[p.name for p in env.rubric.parts])
    assert row["exact_mean"] == 0.5 and row["format_mean"] == 0.5 and row["match_mean"] == 0.0


def test_a_served_env_is_scored_by_its_rubric_in_the_server(tmp_path, monkeypatch, clean_registry):
    import sys

    from relax_gym.envs.remote import launcher

    write(tmp_path / "envs" / "zoom", ZOOM_RUBRIC.replace('id = "zoom-rubric"', 'id = "zoom-rubric-served"')
          + f'\n    [server]\n    python = "{sys.executable}"\n')
    monkeypatch.setenv("RELAX_GYM_ENV_PATH", str(tmp_path / "envs"))
    monkeypatch.setattr(launcher, "log_dir", lambda: tmp_path / "server-logs")
    monkeypatch.setattr(launcher, "_servers", {})
    discover(force=True)
    try:
        env = relax_gym.make("zoom-rubric-served")
        _, info = env.reset(seed=0)
        *_, info = env.step(info["gold"])
        _, reward, terminated, _, info = env.step(info["gold"])
        assert terminated and reward == pytest.approx(2 / 4)
        assert info["reward_breakdown"] == {"accuracy": 1.0, "colour": 0.0}
        assert [r["part"] for r in info["judge_requests"]] == ["named"] and info["reward_context"]["gold"] == "red"
        env.close()
    finally:
        launcher.stop_all()
