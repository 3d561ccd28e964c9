"""A tokenizer in the layout of Qwen's published ones, built in code: the vocabulary size, the special tokens at
their real ids, byte-level BPE with Qwen2's pre-tokeniser, and the files a Qwen checkpoint ships.

Qwen's own merges cannot be had here (no model hub), so the regular vocabulary is ours: the byte-level BPE that
``relax_gym.trainer.policy.tokenizer`` trains on the built-in environments' text (bytes and merges first, so every
text round-trips and our environments' words are short), then filler tokens up to Qwen's count of regular tokens
(151,643: ids 0..151,642). Fillers are plain vocabulary entries that no merge produces, so text never encodes to
them; decoding one gives its spelling (`` ⟨fill 12345⟩``-like letters). The special tokens then take the ids they
have in the published tokenizer (``<|endoftext|>`` 151643, ``<|im_start|>`` 151644, ... ``<|IMAGE|>`` 151655),
so a config's token ids (``image_token_index``, ``audio_start_token_id``, ...) and a chat template written for the
real checkpoint work unchanged. The model's embedding is larger than the tokenizer (151,936 or 152,064 rows), as
in the published checkpoints.

Files written (as ``Qwen2TokenizerFast.save_pretrained`` writes them, plus Qwen's ``vocab.json`` / ``merges.txt``):
``tokenizer.json``, ``tokenizer_config.json`` (``added_tokens_decoder``, eos / pad, ``model_max_length``, and the
media-token attributes the Omni processors read: ``image_token``, ``audio_bos_token`` ...), ``vocab.json``,
``merges.txt`` and ``chat_template.json``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

from relax_gym.trainer.policy.tokenizer import _SPLIT, training_corpus

__all__ = ["REGULAR_TOKENS", "build_qwen_tokenizer", "write_tokenizer_files"]

#: Regular (non-added) tokens of Qwen2 / Qwen2.5 / Qwen3 tokenizers: ids 0..151642.
REGULAR_TOKENS = 151_643
#: How many merges of our own BPE go first (the rest of the regular ids are fillers).
OWN_VOCAB = 4096

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _own_bpe() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocabulary and merges of our byte-level BPE trained on the environments' text, without special tokens."""
    from tokenizers import trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = _pre_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=OWN_VOCAB, min_frequency=2, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(training_corpus()), trainer)
    spec = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in spec["merges"]]
    return dict(spec["vocab"]), merges  # type: ignore[return-value]


def _pre_tokenizer() -> Any:
    from tokenizers import Regex

    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def _filler(i: int) -> str:
    """A unique byte-level spelling no merge of ours produces: ``Ġ⟨fill⟩`` + base-26 letters of ``i``."""
    digits = []
    while True:
        i, r = divmod(i, 26)
        digits.append(_LETTERS[r])
        if i == 0:
            break
    return "ĠFILL" + "".join(reversed(digits))


def _full_vocab(regular: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    vocab, merges = _own_bpe()
    order = sorted(vocab, key=vocab.__getitem__)
    full = {tok: i for i, tok in enumerate(order)}
    n = 0
    while len(full) < regular:
        name = _filler(n)
        n += 1
        if name not in full:
            full[name] = len(full)
    return full, merges


def build_qwen_tokenizer(special_tokens: Sequence[tuple[str, int, bool]], *, regular: int = REGULAR_TOKENS) -> Tokenizer:
    """The ``tokenizers`` backend: ``regular`` byte-level BPE entries then ``special_tokens`` — ``(text, id,
    special)`` triples whose ids must be ``regular``, ``regular + 1``, ... in order (as in Qwen's files)."""
    ids = [i for _, i, _ in special_tokens]
    if ids != list(range(regular, regular + len(ids))):
        raise ValueError(f"special token ids must run from {regular} without gaps, got {ids[:3]}...{ids[-3:]}")
    vocab, merges = _full_vocab(regular)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    from tokenizers import processors

    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_tokens([AddedToken(text, special=special, normalized=False) for text, _, special in special_tokens])
    for text, token_id, _ in special_tokens:
        got = tok.token_to_id(text)
        if got != token_id:
            raise AssertionError(f"{text!r} got id {got}, expected {token_id}")
    return tok


def write_tokenizer_files(out: str | Path, special_tokens: Sequence[tuple[str, int, bool]], tokenizer_config: dict[str, Any],
                          chat_template: str, *, regular: int = REGULAR_TOKENS) -> Path:
    """Write the tokenizer files of a Qwen checkpoint into ``out``. ``tokenizer_config`` holds the published
    ``tokenizer_config.json`` keys other than ``added_tokens_decoder`` (which is generated from ``special_tokens``)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    backend = build_qwen_tokenizer(special_tokens, regular=regular)
    backend.save(str(out / "tokenizer.json"))
    spec = json.loads(backend.to_str())["model"]
    (out / "vocab.json").write_text(json.dumps(spec["vocab"], ensure_ascii=False))
    merges = [" ".join(m) if not isinstance(m, str) else m for m in spec["merges"]]
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    decoder = {str(i): {"content": text, "lstrip": False, "normalized": False, "rstrip": False,
                        "single_word": False, "special": special} for text, i, special in special_tokens}
    config = {"added_tokens_decoder": decoder, **tokenizer_config}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (out / "chat_template.json").write_text(json.dumps({"chat_template": chat_template}, indent=2, ensure_ascii=False) + "\n")
    return out
