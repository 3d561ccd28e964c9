"""Facts, descriptions and the rule verdict of the ``nextqa-describe`` env, and the clips it shows.

A clip of the synthetic generator (:mod:`relax_gym.envs.synth`) is one of two kinds, as in the caption corpus:

* a *motion* clip: a red square moves left / right / up / down or stays still. Facts ``{"motion": "left"}``;
* a *count* clip: a still red square and one to five blue squares. Facts ``{"blue_squares": 3}``.

A description is free text. Its *claims* are read by a small fact matcher (:func:`claims`): a motion verb followed by
a direction ("moves left", "does move to the left"), a staying phrase ("stays still", "is still"), a number of blue
squares ("three blue squares", "there is a blue square"). The **rule verdict** (:func:`rule_verdict`) says yes when
the claims are exactly the facts: every fact stated with its value, and no other value or other fact claimed (a
claim the facts do not hold is a contradiction or an invention). The env's judge model is trained to reproduce this
verdict from the text the judge sees (:func:`facts_text` and the description), and is measured against it.

The description grammar (:func:`canonical_description`, :func:`variants`) uses only words that the policy's
tokenizer has as whole tokens, with one exception kept from the caption corpus the base models learned on:
"moves" is " move" + "s" (two vocabulary pieces, no byte fallback). :func:`make_pairs` draws (facts, description,
rule verdict) pairs with a fixed mix of kinds (:data:`PAIR_KINDS`) for training and measuring the judge.

The clip set (sample ``describe``, generated into the cache on first use by :func:`write_describe_sample`)::

    <root>/describe-v1/clips.jsonl     {"id", "split", "video": "media/….mp4", "facts"}

``train``: 2000 clips, half motion (directions drawn at random) and half counts; ``val``: 200 clips, balanced (20
per direction, 20 per number). Its seed stream (:data:`DESCRIBE_SEED`) is apart from the QA samples' and the
caption corpora's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from relax_gym.envs import synth

__all__ = [
    "DESCRIBE_SAMPLE_VERSION",
    "DESCRIBE_SEED",
    "DIRECTIONS",
    "NUMBER_WORDS",
    "PAIRS_VERSION",
    "PAIR_KINDS",
    "Pair",
    "canonical_description",
    "claims",
    "describe_format",
    "facts_text",
    "grammar_words",
    "load_clips",
    "make_pairs",
    "random_description",
    "random_facts",
    "rule_verdict",
    "variants",
    "write_describe_sample",
]

#: Bump when the clip set's content changes (the cache folder name carries it).
DESCRIBE_SAMPLE_VERSION = 1
#: Bump when the grammar, the claims or the pair mix change (a judge model's cache key carries it).
PAIRS_VERSION = 3  # 2: misspelt words and repeated sentences among the perturbed pairs; 3: stutters at the verb or value
#: Seed of the clip set's random stream (the QA samples use 0, 1, 5, 6; the caption corpora 20_261_201 and +1).
DESCRIBE_SEED = 20_261_220

DIRECTIONS: tuple[str, ...] = synth.DIRECTIONS  # left right up down still
NUMBER_WORDS: tuple[str, ...] = ("one", "two", "three", "four", "five")
MAX_BLUE = len(NUMBER_WORDS)

Facts = dict[str, Any]


# --------------------------------------------------------------------------------------------------- facts


def facts_text(facts: Mapping[str, Any]) -> str:
    """What the judge is told: one ``key : value`` line per fact (``motion : left``, ``blue squares : three``)."""
    lines = []
    for key in sorted(facts):
        value = facts[key]
        if key == "motion":
            lines.append(f"motion : {value}")
        elif key == "blue_squares":
            lines.append(f"blue squares : {NUMBER_WORDS[int(value) - 1]}")
        else:
            raise ValueError(f"unknown fact {key!r}")
    return " ; ".join(lines)


def canonical_description(facts: Mapping[str, Any]) -> str:
    """The caption-corpus sentence for ``facts`` ("the red square moves left .", "three blue squares .")."""
    parts = []
    if "motion" in facts:
        d = facts["motion"]
        parts.append("the red square stays still ." if d == "still" else f"the red square moves {d} .")
    if "blue_squares" in facts:
        parts.append(_count_phrase(int(facts["blue_squares"])) + " .")
    return " ".join(parts)


def _count_phrase(n: int) -> str:
    return f"{NUMBER_WORDS[n - 1]} blue square{'s' if n > 1 else ''}"


_MOTION_VARIANTS = (
    "the red square moves {d}",
    "a red square moves {d} .",
    "the square moves {d} .",
    "it moves {d} .",
    "the red square does move {d} .",
    "there is a red square . it moves {d} .",
    "the red square moves {d} . that is all .",
)
_SIDE_VARIANTS = ("the red square moves to the {d} .", "a red square moves to the {d} .")
_STILL_VARIANTS = (
    "the red square stays still",
    "a red square stays still .",
    "the square stays still .",
    "it stays still .",
    "the red square is still .",
    "there is a red square . it stays still .",
)
_COUNT_VARIANTS = (
    "{np}",
    "there {be} {np} .",
    "it shows {np} .",
    "{np} and a red square .",
    "a red square and {np} .",
    "here {be} {np} .",
)


def variants(facts: Mapping[str, Any]) -> list[str]:
    """Other correct descriptions of single-fact ``facts`` (the canonical one not included)."""
    if "motion" in facts:
        d = facts["motion"]
        if d == "still":
            return list(_STILL_VARIANTS)
        forms = list(_MOTION_VARIANTS) + (list(_SIDE_VARIANTS) if d in ("left", "right") else [])
        return [f.format(d=d) for f in forms]
    n = int(facts["blue_squares"])
    np_ = _count_phrase(n)
    return [f.format(np=np_, be="are" if n > 1 else "is") for f in _COUNT_VARIANTS] + (
        ["there is a blue square ."] if n == 1 else [])


def grammar_words() -> set[str]:
    """Every word the description grammar writes (canonical and variants, all facts)."""
    words: set[str] = set()
    for facts in all_facts():
        for text in (canonical_description(facts), *variants(facts)):
            words.update(text.split())
    return words


def all_facts() -> list[Facts]:
    return [{"motion": d} for d in DIRECTIONS] + [{"blue_squares": n} for n in range(1, MAX_BLUE + 1)]


def random_facts(rng: np.random.Generator) -> Facts:
    """Facts of a random clip: motion or count (even odds), then a value (uniform)."""
    if rng.random() < 0.5:
        return {"motion": DIRECTIONS[int(rng.integers(len(DIRECTIONS)))]}
    return {"blue_squares": int(rng.integers(1, MAX_BLUE + 1))}


def random_description(rng: np.random.Generator) -> str:
    """The canonical description of random facts: the answer *format* with no answer in it (the format warm-up's
    demonstration, as the multiple-choice envs' random letters)."""
    return canonical_description(random_facts(rng))


# --------------------------------------------------------------------------------------------------- verdict

_WORD = re.compile(r"[a-z]+|\d+|[^\sa-z\d]")
_MOTION_VERBS = frozenset({"move", "moves", "moving", "moved", "goes", "go", "going", "went", "travels", "heads",
                           "slides", "runs", "drifts"})
_STAY_VERBS = frozenset({"stays", "stay", "is", "remains", "keeps", "stands", "sits", "staying"})
_NEGATIONS = frozenset({"not", "never", "no", "doesn", "didn", "cannot"})
_JOINERS = frozenset({"and", "then", "or", ","})
_SIDE_FILLERS = frozenset({"to", "the", "towards", "toward", "over", "its", "and"})
_NUMBERS = {w: i + 1 for i, w in enumerate(NUMBER_WORDS)} | {"a": 1, "an": 1, "single": 1, "no": 0, "zero": 0}
_DIRECTION_WORDS = frozenset(d for d in DIRECTIONS if d != "still")


def claims(description: str) -> dict[str, set[Any]]:
    """What ``description`` claims, per fact: ``{"motion": {"left"}, "blue_squares": {3}}``. A negated motion ("does
    not move") claims ``still``; a negated move with a direction ("does not move left") claims ``not left``."""
    words = _WORD.findall(description.lower())
    found: dict[str, set[Any]] = {}
    for i, w in enumerate(words):
        if w in _MOTION_VERBS:
            negated = any(p in _NEGATIONS for p in words[max(0, i - 2):i])
            j = i + 1
            while j < len(words) and j <= i + 3 and words[j] in _SIDE_FILLERS:
                j += 1
            direction = words[j] if j < len(words) and words[j] in _DIRECTION_WORDS else None
            if direction is not None:
                said = [direction]
                while True:  # "moves left and then up": more directions
                    k = j + 1
                    while k < len(words) and words[k] in _JOINERS:
                        k += 1
                    if k == j + 1 or k >= len(words) or words[k] not in _DIRECTION_WORDS:
                        break
                    j = k
                    said.append(words[j])
                found.setdefault("motion", set()).update(f"not {d}" if negated else d for d in said)
            elif negated:
                found.setdefault("motion", set()).add("still")
        elif w == "still" and i > 0 and words[i - 1] in _STAY_VERBS:
            found.setdefault("motion", set()).add("still")
        elif w in _NUMBERS and words[i + 1:i + 2] == ["blue"] and words[i + 2:i + 3] in (["square"], ["squares"]):
            found.setdefault("blue_squares", set()).add(_NUMBERS[w])
    return found


def rule_verdict(description: str, facts: Mapping[str, Any]) -> bool:
    """True when ``description`` claims exactly ``facts``: each fact once with its value, nothing else."""
    said = claims(description)
    return set(said) == set(facts) and all(said[k] == {_value(facts[k])} for k in facts)


def _value(v: Any) -> Any:
    return int(v) if isinstance(v, (int, np.integer)) else v


_SENTENCES = re.compile(r"\s*(?:[a-z]+(?: [a-z]+)* \.\s*){1,3}")
MAX_DESCRIPTION_WORDS = 24


def describe_format(response: str, context: Mapping[str, Any] | None = None) -> float:
    """The format rule: 1.0 for one to three short sentences of lower-case words, each closed by " ." (at most
    :data:`MAX_DESCRIPTION_WORDS` words), else 0.0. Says nothing about the facts."""
    if len(response) > 400 or not _SENTENCES.fullmatch(response):
        return 0.0
    return 1.0 if len(response.split()) <= MAX_DESCRIPTION_WORDS else 0.0


# --------------------------------------------------------------------------------------------------- pairs

#: Kinds of (facts, description) pairs and their shares in :func:`make_pairs`. The label is always the rule
#: verdict; ``canonical`` / ``variant`` / ``cut_after`` are correct by construction, ``wrong_value`` /
#: ``wrong_kind`` / ``mixed`` / ``truncated`` wrong by construction, ``perturbed`` / ``garbage`` whatever the rule says.
PAIR_KINDS: dict[str, float] = {
    "canonical": 0.16,
    "variant": 0.16,
    "cut_after": 0.05,   # the canonical sentence cut after the value word (correct, unfinished)
    "wrong_value": 0.17,  # the right kind of sentence, another value
    "wrong_kind": 0.06,   # a sentence about the other fact
    "mixed": 0.10,        # the right sentence and a contradicting or extra claim, in either order
    "truncated": 0.06,    # cut before the value word
    "perturbed": 0.10,    # a right sentence said twice, or with a word dropped, doubled, replaced or misspelt
    "stutter": 0.08,      # a sampling policy's slips at the verb or the value: "the red square move move ."
    "garbage": 0.06,      # empty, word salad, tags
}

_SALAD_WORDS = ("the", "a", "red", "blue", "square", "squares", "moves", "move", "stays", "still", "is", "there",
                "are", "it", "and", ".", "left", "right", "up", "down", "one", "two", "three", "four", "five", "to",
                "in", "of", "no", "shows", "<answer>", "</answer>", "B", "<think>", "</think>", "yes")


@dataclass(frozen=True)
class Pair:
    facts: Facts
    description: str
    verdict: bool  # the rule verdict
    kind: str


def _other_value(facts: Facts, rng: np.random.Generator) -> Facts:
    if "motion" in facts:
        return {"motion": str(rng.choice([d for d in DIRECTIONS if d != facts["motion"]]))}
    return {"blue_squares": int(rng.choice([n for n in range(1, MAX_BLUE + 1) if n != facts["blue_squares"]]))}


def _other_kind(facts: Facts, rng: np.random.Generator) -> Facts:
    if "motion" in facts:
        return {"blue_squares": int(rng.integers(1, MAX_BLUE + 1))}
    return {"motion": DIRECTIONS[int(rng.integers(len(DIRECTIONS)))]}


def _any_description(facts: Facts, rng: np.random.Generator, canonical_share: float = 0.5) -> str:
    if rng.random() < canonical_share:
        return canonical_description(facts)
    forms = variants(facts)
    return forms[int(rng.integers(len(forms)))]


def _value_position(words: list[str]) -> int:
    """Index of the first word that carries a value (direction, still, number)."""
    for i, w in enumerate(words):
        if w in _DIRECTION_WORDS or w == "still" or w in NUMBER_WORDS or (w == "a" and words[i + 1:i + 2] == ["blue"]):
            return i
    return len(words)


def _garble(word: str, rng: np.random.Generator) -> str:
    """A misspelt word, as a sampling policy writes them ("moveve", "dwn", "squaress")."""
    if len(word) < 2:
        return word + word
    k = int(rng.integers(1, len(word)))
    how = rng.random()
    if how < 0.3:
        return word[:k + 1] + word[max(0, k - 1):]  # a stutter
    if how < 0.55:
        return word[:-1] + word[-3:-1] if len(word) > 2 else word + word  # the ending stutters: "moves" -> "moveve"
    if how < 0.8:
        return word[:k] + word[k + 1:]  # a letter dropped
    return word + word[-1]


def _pair(kind: str, facts: Facts, rng: np.random.Generator) -> str:
    if kind == "canonical":
        return canonical_description(facts)
    if kind == "variant":
        forms = variants(facts)
        return forms[int(rng.integers(len(forms)))]
    if kind == "cut_after":
        words = canonical_description(facts).split()
        return " ".join(words[:len(words) - 1])  # drop the closing "."
    if kind == "wrong_value":
        return _any_description(_other_value(facts, rng), rng)
    if kind == "wrong_kind":
        return _any_description(_other_kind(facts, rng), rng)
    if kind == "mixed":
        right = _any_description(facts, rng, 0.7)
        roll = rng.random()
        if roll < 0.2 and "motion" in facts and facts["motion"] != "still":
            other = str(rng.choice([d for d in DIRECTIONS if d not in ("still", facts["motion"])]))
            return f"the red square moves {facts['motion']} and {other} ." if rng.random() < 0.5 else \
                f"the red square moves {other} and {facts['motion']} ."
        extra = _any_description(_other_value(facts, rng) if roll < 0.6 else _other_kind(facts, rng), rng, 0.7)
        first, second = (right, extra) if rng.random() < 0.5 else (extra, right)
        return f"{first.rstrip(' .')} . {second}"
    if kind == "truncated":
        words = _any_description(facts, rng).split()
        cut = _value_position(words)
        return " ".join(words[:int(rng.integers(1, cut + 1)) if cut > 0 else 0])
    if kind == "perturbed":
        text = _any_description(facts, rng, 0.6)
        words = text.split()
        i = int(rng.integers(len(words)))
        how = rng.random()
        if how < 0.15:
            return f"{text.rstrip(' .')} . {text}"  # said twice
        if how < 0.35:
            words.pop(i)
        elif how < 0.55:
            words.insert(i, words[i])
        elif how < 0.75:
            words[i] = str(rng.choice(_SALAD_WORDS[:31]))
        else:
            words[i] = _garble(words[i], rng)
        return " ".join(words)
    if kind == "stutter":
        words = canonical_description(facts).split()
        value = min(_value_position(words), len(words) - 1)
        i = value if rng.random() < 0.5 or value == 0 else value - 1  # the value, or the word before it (the verb)
        how = rng.random()
        if how < 0.35:  # the word repeated, and the sentence given up: "the red square move move move ."
            return " ".join([*words[:i], *[words[i]] * int(rng.integers(2, 6)), "."])
        if how < 0.6:  # the word repeated in place
            return " ".join([*words[:i], *[words[i]] * int(rng.integers(2, 4)), *words[i + 1:]])
        words[i] = _garble(words[i], rng)  # the word misspelt: "moveve", "dwn"
        return " ".join(words)
    if kind == "garbage":
        roll = rng.random()
        if roll < 0.15:
            return ""
        if roll < 0.3:
            return "<think></think><answer>" + "ABCDE"[int(rng.integers(5))] + "</answer>"
        n = int(rng.integers(1, 16 if roll < 0.9 else 40))
        return " ".join(str(w) for w in rng.choice(_SALAD_WORDS, size=n))
    raise ValueError(f"unknown pair kind {kind!r}")


def make_pairs(n: int, seed: int, *, kinds: Mapping[str, float] | None = None) -> list[Pair]:
    """``n`` (facts, description, rule verdict) pairs drawn from ``seed``, kinds in the shares of
    :data:`PAIR_KINDS` (exact counts, rounded; shuffled)."""
    shares = dict(kinds or PAIR_KINDS)
    names = list(shares)
    weights = np.array([shares[k] for k in names], dtype=float)
    counts = np.floor(weights / weights.sum() * n).astype(int)
    for i in np.argsort(-weights)[: n - int(counts.sum())]:
        counts[i] += 1
    rng = np.random.default_rng(seed)
    order = rng.permutation(np.repeat(np.arange(len(names)), counts))
    out = []
    for k in order:
        facts = random_facts(rng)
        text = _pair(names[k], facts, rng)
        out.append(Pair(facts, text, rule_verdict(text, facts), names[k]))
    return out


# --------------------------------------------------------------------------------------------------- clips


def write_describe_sample(dest: Path, n_train: int = 2000, n_val: int = 200, seed: int = DESCRIBE_SEED) -> None:
    """The clip set: ``n_train`` clips (motion or count, even odds, values at random) and ``n_val`` balanced ones
    (alternating motion / count, cycling through every direction and number), 64x64, 8 fps, 16 frames."""
    dest = Path(dest)
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n_train + n_val):
        val = i >= n_train
        k = i - n_train
        clip_seed = int(rng.integers(0, 2**31 - 1))
        motion = (k % 2 == 0) if val else bool(rng.random() < 0.5)
        rel = f"media/{i // 100:03d}/clip{i:05d}.mp4"
        if motion:
            direction = DIRECTIONS[(k // 2) % len(DIRECTIONS) if val else int(rng.integers(len(DIRECTIONS)))]
            synth.write_moving_square_video(dest / rel, direction, seed=clip_seed)
            facts: Facts = {"motion": direction}
        else:
            n = ((k // 2) % MAX_BLUE if val else int(rng.integers(MAX_BLUE))) + 1
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            synth._write_count_video(dest / rel, n, clip_seed)
            facts = {"blue_squares": n}
        records.append({"id": i, "split": "val" if val else "train", "video": rel, "facts": facts})
    (dest / "clips.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


@dataclass(frozen=True)
class Clip:
    uid: str
    video: Path
    facts: Facts


def load_clips(folder: Path, split: str) -> list[Clip]:
    """The clips of ``split`` in a clip-set folder (``clips.jsonl`` + media)."""
    folder = Path(folder)
    index = folder / "clips.jsonl"
    if not index.is_file():
        raise FileNotFoundError(f"{index} not found: not a describe clip set (see relax_gym.envs.describe_facts)")
    out = []
    for line_no, line in enumerate(index.read_text(encoding="utf-8").splitlines(), 1):
        try:
            rec = json.loads(line)
            if rec["split"] == split:
                facts = dict(rec["facts"])
                if set(facts) - {"motion", "blue_squares"} or not facts:
                    raise ValueError(f"unknown facts {facts}")
                out.append(Clip(str(rec["id"]), folder / rec["video"], facts))
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"{index}, line {line_no}: {exc}") from None
    if not out:
        raise ValueError(f"{index}: no clips in split {split!r}")
    return out
