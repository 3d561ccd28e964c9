"""Rubrics: a reward as a weighted list of named parts, each a rule (a pure function) or a judge prompt.

A :class:`Rubric` scores one response (the final action's text) against the episode's *reward context*, a JSON-able
dict the env reports on its terminal step (``gold_letter``, ``options``, ``gold``, ``question``, ...):

- a ``rule`` part calls a function of :data:`RULES` (``multiple_choice``, ``format``, ``math``, ``exact``, or one
  added with :func:`register_rule`; a ``"module.path:function"`` reference is imported on first use);
- a ``judge`` part renders its ``template`` (a ``str.format`` template over the reward context plus ``response``)
  into a :class:`JudgeRequest`. Passed a ``judge`` callable, :meth:`Rubric.score` asks it at once; otherwise the
  request is left *pending* and counts 0 in the total until someone judges it.

The total is the weighted mean ``sum(w_i * v_i) / sum(w_i)`` over all parts (:func:`combine`), so with values in
[0, 1] it lies in [0, 1] whatever the weights.

Convention for envs (:class:`~relax_gym.envs.core.AgentEnv` does this for a rubric it was given): the terminal
step's ``info`` carries ``reward_breakdown`` (the scored parts, by name) and ``reward_context``; when some judge
parts are pending also ``info["judge_requests"] = [r.model_dump() for r in pending]`` and
``info["reward_weights"] = weights``. Whoever judges them (the trainer) recomputes the total with
``combine(info["reward_weights"], {**info["reward_breakdown"], **judged})``.
"""

from __future__ import annotations

import importlib
import math
import re
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from relax_gym.envs.rewards import (
    extract_answer,
    math_answer,
    multiple_choice,
    think_answer_format,
)
from relax_gym.envs.verdict import parse_verdict

__all__ = ["RULES", "JudgeRequest", "Rubric", "RubricError", "RubricPart", "RubricScore", "combine", "register_rule"]

Rule = Callable[[str, Mapping[str, Any]], float]
Judge = Callable[[list["JudgeRequest"]], Sequence["float | None"]]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RULE_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
# Metric keys a part's name would overwrite (``reward_mean``, ``eval_failed``, ...; see trainer/run/step_row.py).
RESERVED_NAMES = frozenset({"reward", "failed", "tool_calls", "policy_version"})


class RubricError(ValueError):
    """A rubric cannot score this episode: a field it needs is not in the reward context, a rule failed, ..."""


# ---------------------------------------------------------------------------------------------------- rules

RULES: dict[str, Rule] = {}
RULE_FIELDS: dict[str, tuple[str, ...]] = {}  # the reward-context fields a registered rule reads


def register_rule(name: str, fn: Rule, *, requires: Sequence[str] = ()) -> Rule:
    """Add ``fn(response, context) -> float in [0, 1]`` to :data:`RULES` as ``name``. ``requires``: the context
    fields it reads (checked before it runs, for a clear error). A name is registered once."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"rule name {name!r} is not an identifier (letters, digits, '_')")
    if name in RULES:
        known = RULES[name]
        raise ValueError(f"rule {name!r} is already registered ({known.__module__}.{getattr(known, '__qualname__', known)}); "
                         "choose another name")
    if not callable(fn):
        raise TypeError(f"rule {name!r}: {fn!r} is not callable")
    RULES[name] = fn
    RULE_FIELDS[name] = tuple(requires)
    return fn


def normalise(text: str) -> str:
    """Casefolded, whitespace collapsed, surrounding spaces and one trailing period dropped."""
    text = " ".join(text.casefold().split())
    return text[:-1].rstrip() if text.endswith(".") else text


def _multiple_choice(response: str, context: Mapping[str, Any]) -> float:
    return multiple_choice(response, str(context["gold_letter"]), list(context["options"]))


def _format(response: str, context: Mapping[str, Any]) -> float:
    return think_answer_format(response)


def _math(response: str, context: Mapping[str, Any]) -> float:
    return math_answer(response, str(context["gold"]))


def _exact(response: str, context: Mapping[str, Any]) -> float:
    answer = extract_answer(response)
    return 1.0 if answer is not None and normalise(answer) == normalise(str(context["gold"])) else 0.0


register_rule("multiple_choice", _multiple_choice, requires=("gold_letter", "options"))
register_rule("format", _format)
register_rule("math", _math, requires=("gold",))
register_rule("exact", _exact, requires=("gold",))

_imported: dict[str, Rule] = {}


def resolve_rule(rule: str) -> Rule:
    """A rule by registered name, or a ``"module.path:function"`` reference (imported once)."""
    if rule in RULES:
        return RULES[rule]
    if not _RULE_REF.fullmatch(rule):
        raise RubricError(f"unknown rule {rule!r}; known: {', '.join(sorted(RULES))} (or 'module.path:function')")
    if rule not in _imported:
        module, _, attr = rule.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise RubricError(f"rule {rule!r} cannot be imported: {exc}") from None
        if not callable(fn):
            raise RubricError(f"rule {rule!r} is not a function")
        _imported[rule] = fn
    return _imported[rule]


def template_fields(template: str) -> list[str]:
    """The names a ``str.format`` template reads (``{gold}``, ``{options[0]}`` -> ``gold``, ``options``)."""
    names: list[str] = []
    for _, field, _, _ in string.Formatter().parse(template):
        if field is None:
            continue
        name = re.split(r"[.\[]", field, maxsplit=1)[0]
        if not name or name.isdigit():
            raise ValueError(f"template field {{{field}}} has no name: use {{name}} fields from the reward context")
        if name not in names:
            names.append(name)
    return names


def _has(context: Mapping[str, Any]) -> str:
    return f"(has: {', '.join(sorted(context))})" if context else "(the env gives no reward context)"


# ---------------------------------------------------------------------------------------------------- parts


def _label_key(label: str) -> str:
    return " ".join(re.findall(r"\w+", label.casefold()))


class JudgeRequest(BaseModel):
    """One judge part of one episode, ready to ask: ``prompt`` is the rendered template. :meth:`parse` turns the
    judge's reply into the part's value (or None: no verdict)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    part: str
    prompt: str
    verdict: Literal["label", "score"] = "label"
    labels: dict[str, float] = Field(default_factory=lambda: {"yes": 1.0, "no": 0.0})
    max_score: float = Field(default=10.0, gt=0)
    weight: float = Field(default=1.0, ge=0)

    @field_validator("labels")
    @classmethod
    def _label_values(cls, v: dict[str, float]) -> dict[str, float]:
        if not v or any(not 0.0 <= x <= 1.0 for x in v.values()):
            raise ValueError(f"labels must map at least one label to a value in [0, 1], got {v}")
        return v

    def parse(self, text: str) -> float | None:
        """The part's value from the judge's reply (:func:`~relax_gym.envs.verdict.parse_verdict`), or None when
        the reply states no clear verdict."""
        return parse_verdict(text, self.verdict, labels=self.labels, max_score=self.max_score)


class RubricPart(BaseModel):
    """One named part of a rubric. ``rule`` defaults to the part's name when that names a rule."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    weight: float = Field(default=1.0, ge=0.0, allow_inf_nan=False)
    kind: Literal["rule", "judge"] = "rule"
    rule: str | None = None
    template: str | None = None
    verdict: Literal["label", "score"] = "label"
    labels: dict[str, float] = Field(default_factory=lambda: {"yes": 1.0, "no": 0.0})
    max_score: float = Field(default=10.0, gt=0.0, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _default_rule(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("kind", "rule") == "rule" and data.get("rule") is None and data.get("name") in RULES:
            data = {**data, "rule": data["name"]}
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError(f"part name {v!r} is not an identifier (letters, digits, '_'): it becomes a metric key")
        if v in RESERVED_NAMES:
            raise ValueError(f"part name {v!r} is reserved (it would overwrite a metric); choose another")
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("labels must map at least one verdict text to a value")
        keys = [_label_key(k) for k in v]
        if "" in keys or len(set(keys)) != len(keys):
            raise ValueError(f"labels {sorted(v)} must be distinct words (case and punctuation are ignored)")
        bad = {k: x for k, x in v.items() if not 0.0 <= x <= 1.0}
        if bad:
            raise ValueError(f"label values must lie in [0, 1], got {bad}")
        return v

    @model_validator(mode="after")
    def _kind(self) -> RubricPart:
        if self.kind == "rule":
            if self.rule is None:
                raise ValueError(f"part {self.name!r}: give rule = one of {', '.join(sorted(RULES))} "
                                 "(or 'module.path:function'); the name is not a rule")
            if self.rule not in RULES and not _RULE_REF.fullmatch(self.rule):
                raise ValueError(f"part {self.name!r}: unknown rule {self.rule!r}; known: {', '.join(sorted(RULES))} "
                                 "(or 'module.path:function')")
            if self.template is not None:
                raise ValueError(f"part {self.name!r}: a template belongs to a judge part (kind = \"judge\")")
        else:
            if not (self.template or "").strip():
                raise ValueError(f"part {self.name!r}: a judge part needs a template (the judge's prompt)")
            if self.rule is not None:
                raise ValueError(f"part {self.name!r}: a judge part has no rule")
            template_fields(self.template)  # a malformed template fails here, not mid-run
        return self

    def needs(self) -> list[str]:
        """The reward-context fields this part reads (``response`` is always given)."""
        if self.kind == "judge":
            return [f for f in template_fields(self.template or "") if f != "response"]
        return list(RULE_FIELDS.get(self.rule or "", ()))

    def missing(self, context: Mapping[str, Any]) -> str | None:
        """The error text when ``context`` lacks a field this part needs, else None."""
        absent = [f for f in self.needs() if f not in context]
        if not absent:
            return None
        names = ", ".join(repr(f) for f in absent)
        plural, verb = ("s", "are") if len(absent) > 1 else ("", "is")
        if self.kind == "judge":
            what = f"template field{plural} {names} {verb}"
        else:
            what = f"rule {self.rule!r} needs field{plural} {names}, which {verb}"
        return f"part {self.name!r}: {what} not in the env's reward context {_has(context)}"

    def apply(self, response: str, context: Mapping[str, Any]) -> float:
        """A rule part's value for ``response``."""
        problem = self.missing(context)
        if problem:
            raise RubricError(problem)
        fn = resolve_rule(self.rule or "")
        try:
            value = float(fn(response, context))
        except KeyError as exc:  # an undeclared field the rule reads
            field = exc.args[0] if exc.args else "?"
            if field in context:
                raise
            raise RubricError(f"part {self.name!r}: rule {self.rule!r} needs field {field!r}, which is not in the env's "
                              f"reward context {_has(context)}") from None
        if not 0.0 <= value <= 1.0:  # NaN fails too
            raise RubricError(f"part {self.name!r}: rule {self.rule!r} returned {value}, outside [0, 1]")
        return value

    def request(self, response: str, context: Mapping[str, Any]) -> JudgeRequest:
        """A judge part's request for ``response``: its template rendered with the context and ``response``."""
        problem = self.missing(context)
        if problem:
            raise RubricError(problem)
        try:
            prompt = (self.template or "").format_map({**context, "response": response})
        except (KeyError, IndexError, AttributeError, ValueError, TypeError) as exc:
            raise RubricError(f"part {self.name!r}: the template cannot be rendered: {type(exc).__name__}: {exc}") from None
        return JudgeRequest(part=self.name, prompt=prompt, verdict=self.verdict, labels=dict(self.labels),
                            max_score=self.max_score, weight=self.weight)


# ---------------------------------------------------------------------------------------------------- rubric


def combine(weights: Mapping[str, float], breakdown: Mapping[str, float]) -> float:
    """The weighted mean ``sum(w * breakdown[name]) / sum(w)`` over the parts of ``weights``; a part missing from
    ``breakdown`` (pending, failed) counts 0; other breakdown keys are ignored."""
    total_weight = 0.0
    for w in weights.values():
        total_weight += float(w)
    if not total_weight > 0.0:
        raise ValueError(f"the weights {dict(weights)} do not have a positive sum")
    total = 0.0
    for name, w in weights.items():
        total += float(w) * float(breakdown.get(name, 0.0))
    return total / total_weight


def check_parts(parts: Sequence[RubricPart]) -> None:
    """Raise ValueError unless ``parts`` is a usable rubric: some parts, distinct names, a positive weight sum."""
    if not parts:
        raise ValueError("a rubric needs at least one part")
    names = [p.name for p in parts]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"part names must be distinct; repeated: {', '.join(dupes)}")
    if not sum(p.weight for p in parts) > 0:
        raise ValueError("the parts' weights must have a positive sum")


class RubricScore(BaseModel):
    """:meth:`Rubric.score`'s answer. ``total`` counts pending and failed judge parts as 0."""

    model_config = ConfigDict(frozen=True)

    total: float
    breakdown: dict[str, float]
    weights: dict[str, float]
    pending: list[JudgeRequest] = Field(default_factory=list)
    failed: list[str] = Field(default_factory=list)

    def judge_info(self) -> dict[str, Any]:
        """What a terminal step's ``info`` adds for pending parts: ``judge_requests`` and ``reward_weights`` (empty
        when nothing is pending)."""
        if not self.pending:
            return {}
        return {"judge_requests": [r.model_dump() for r in self.pending], "reward_weights": dict(self.weights)}


class Rubric(BaseModel):
    """A weighted list of named parts (see the module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    parts: list[RubricPart]

    @model_validator(mode="after")
    def _check(self) -> Rubric:
        check_parts(self.parts)
        return self

    @property
    def weights(self) -> dict[str, float]:
        return {p.name: p.weight for p in self.parts}

    def check_context(self, context: Mapping[str, Any]) -> None:
        """Raise :class:`RubricError` naming the first part (and its fields) that ``context`` cannot serve."""
        for part in self.parts:
            problem = part.missing(context)
            if problem:
                raise RubricError(problem)

    def score(self, response: str, context: Mapping[str, Any] | None = None, judge: Judge | None = None) -> RubricScore:
        """Score ``response``: rule parts now; judge parts through ``judge`` (``list[JudgeRequest] ->
        list[float | None]``, None = no verdict) when given, else left pending."""
        context = dict(context or {})
        self.check_context(context)
        breakdown: dict[str, float] = {}
        pending: list[JudgeRequest] = []
        for part in self.parts:
            if part.kind == "rule":
                breakdown[part.name] = part.apply(response, context)
            else:
                pending.append(part.request(response, context))
        failed: list[str] = []
        if judge is not None and pending:
            verdicts = list(judge(pending))
            if len(verdicts) != len(pending):
                raise RubricError(f"the judge answered {len(verdicts)} verdict(s) for {len(pending)} request(s)")
            for request, value in zip(pending, verdicts):
                if value is None:
                    failed.append(request.part)
                    continue
                value = float(value)
                if not 0.0 <= value <= 1.0 or math.isnan(value):
                    raise RubricError(f"part {request.part!r}: the judge returned {value}, outside [0, 1]")
                breakdown[request.part] = value
            pending = []
        # keep the parts' order in the breakdown
        breakdown = {p.name: breakdown[p.name] for p in self.parts if p.name in breakdown}
        return RubricScore(total=combine(self.weights, breakdown), breakdown=breakdown, weights=self.weights,
                           pending=pending, failed=failed)
