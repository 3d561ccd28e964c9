"""A small byte-level BPE tokenizer trained in code, with the Qwen2.5-Omni special tokens and a ChatML template.

Nothing is downloaded. The training text is what our built-in environments say and what their gold policies
answer (system prompts, questions, lettered options, ``<think>``/``<answer>`` actions, tool calls in JSON and tool
responses), stored with the package in ``tokenizer_corpus.json.gz`` (written by ``python -m
relax_gym.trainer.tools.tokenizer_corpus``, so that the policy never imports the environments) and rendered through the chat template so that the role headers are learnt too, plus a fixed list of
digits, letters and JSON punctuation. The pre-tokeniser is Qwen2's (digits split one by one, byte-level), so any
text round-trips exactly, words never seen fall back to bytes, and numbers are spelled digit by digit.

Token ids are fixed by construction: the special tokens come first, in :data:`SPECIAL_TOKENS` order (so
``<|endoftext|>`` is 0, ``<|im_start|>`` 1, ``<|im_end|>`` 2 ...), then the 256 byte symbols, then the merges.
Training is deterministic (the same code gives byte-identical ``tokenizer.json``; a test checks it across
processes).

The Qwen2.5-Omni names are kept exactly (``<|IMAGE|>``, ``<|VIDEO|>``, ``<|AUDIO|>``, ``<|vision_bos|>``,
``<|vision_eos|>``, ``<|audio_bos|>``, ``<|audio_eos|>``, as in the Qwen2.5-Omni tokenizer and the
``Qwen2_5OmniProcessor``'s ``tokenizer.image_token`` / ``vision_bos_token`` / ... attributes), so a template or a
processor written for the real checkpoint works with this one and vice versa. ``<think>``, ``<answer>``,
``<tool_call>``, ``<tool_response>`` and their closing tags are single tokens but not *special*: decoding with
``skip_special_tokens=True`` keeps them, as the environments parse them out of the action text.
"""

from __future__ import annotations

import functools
import gzip
import json
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

__all__ = [
    "CHAT_TEMPLATE",
    "MEDIA_TOKENS",
    "SPECIAL_TOKENS",
    "TAG_TOKENS",
    "TOKENIZER_VERSION",
    "build_tokenizer",
    "render_text",
    "stored_conversations",
    "training_corpus",
    "train_backend",
]

#: Bump when the corpus or the training recipe changes (it is saved in the tokenizer config).
TOKENIZER_VERSION = 1

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

#: Named media tokens, exactly as Qwen2.5-Omni's tokenizer and processor call them.
MEDIA_TOKENS: dict[str, str] = {
    "audio_token": "<|AUDIO|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
    "image_token": "<|IMAGE|>",
    "video_token": "<|VIDEO|>",
}

#: Control tokens (``special``: skipped by ``decode(skip_special_tokens=True)``), in id order from 0.
SPECIAL_TOKENS: tuple[str, ...] = (
    ENDOFTEXT,
    IM_START,
    IM_END,
    MEDIA_TOKENS["audio_token"],
    MEDIA_TOKENS["audio_bos_token"],
    MEDIA_TOKENS["audio_eos_token"],
    MEDIA_TOKENS["vision_bos_token"],
    MEDIA_TOKENS["vision_eos_token"],
    "<|vision_pad|>",
    MEDIA_TOKENS["image_token"],
    MEDIA_TOKENS["video_token"],
)

#: Single tokens that belong to the text the policy writes (not special), ids right after SPECIAL_TOKENS.
TAG_TOKENS: tuple[str, ...] = (
    "<think>", "</think>", "<answer>", "</answer>",
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
)

# Qwen2's pre-tokeniser split (contractions, letter runs, single digits, punctuation runs, newlines, spaces).
_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

#: Qwen-style ChatML. Every role (system / user / assistant / tool) is one ``<|im_start|>role\n ... <|im_end|>\n``
#: block; content is a string or a list of parts, and media parts become Qwen2.5-Omni's placeholders
#: (``<|vision_bos|><|IMAGE|><|vision_eos|>``, ``<|vision_bos|><|VIDEO|><|vision_eos|>``,
#: ``<|audio_bos|><|AUDIO|><|audio_eos|>``), which the processor expands to one pad token per embedding.
#: Tool messages are their own ``tool`` turn: the environments already wrap tool output in ``<tool_response>``.
#: Past turns are never rewritten, so the template is append-only (see ``relax_gym.omni.render``).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- elif part['type'] == 'image' or part['type'] == 'image_url' -%}{{- '<|vision_bos|><|IMAGE|><|vision_eos|>' -}}"
    "{%- elif part['type'] == 'video' -%}{{- '<|vision_bos|><|VIDEO|><|vision_eos|>' -}}"
    "{%- elif part['type'] == 'audio' or part['type'] == 'input_audio' -%}{{- '<|audio_bos|><|AUDIO|><|audio_eos|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

#: The built-in environments' conversations the tokenizer is trained on, stored with the package (gzip'd JSON list of
#: texts) so that the policy never imports the environments. ``python -m relax_gym.trainer.tools.tokenizer_corpus``
#: writes it from the environments; a test checks that it still matches what they say.
CORPUS_FILE = Path(__file__).with_name("tokenizer_corpus.json.gz")
DEFAULT_VOCAB_SIZE = 1024

_EXTRA_TEXT: tuple[str, ...] = (
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 0.5 -1 3.14 2^10 1e-3",
    "A B C D E F G H I J K L M N O P Q R S T U V W X Y Z",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z",
    'A. B. C. D. E. {"name": "python", "arguments": {"code": "print(1 + 2)"}} [1, 2, 3] {} [] : , " \' ( ) * + - / = < > _ % # ! ? ; .',
    "The answer is B. I will look closer. I will compute it. Let me think. yes no true false null",
    "Error: the tool call is not valid JSON. Only the first tool calls of a turn are run.",
)


def training_corpus() -> Iterator[str]:
    """The texts the tokenizer is trained on: a fixed list of digits, letters and punctuation, then whole
    conversations of the built-in environments (opening, gold actions and, where it needs no sandbox, the tool
    turns) rendered with :data:`CHAT_TEMPLATE`, as stored in :data:`CORPUS_FILE`."""
    yield from _EXTRA_TEXT
    yield from stored_conversations()


def stored_conversations(path: Path = CORPUS_FILE) -> list[str]:
    """The environments' rendered conversations as :data:`CORPUS_FILE` holds them."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        texts = json.load(f)
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"{path}: expected a JSON list of strings (rewrite it with python -m relax_gym.trainer.tools.tokenizer_corpus)")
    return texts


def render_text(messages) -> str:
    """A conversation (messages of ``relax_gym.omni``) through :data:`CHAT_TEMPLATE` without a tokenizer (the same
    output as ``apply_chat_template``); media parts become their placeholder tokens."""
    return _render_text(messages)


def _render_text(messages) -> str:
    """The conversation through CHAT_TEMPLATE without a tokenizer (same output as apply_chat_template)."""
    from jinja2 import Environment

    template = Environment().from_string(CHAT_TEMPLATE)
    dicts = [
        {"role": m.role, "content": [{"type": "text", "text": p.text} if p.kind == "text" else {"type": p.kind} for p in m.content]}
        for m in messages
    ]
    return template.render(messages=dicts, add_generation_prompt=False)


def train_backend(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    """Train the byte-level BPE on ``texts``; special tokens first (ids 0..), then the tags, bytes, merges."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    atomic = [AddedToken(t, special=True, normalized=False) for t in (*SPECIAL_TOKENS, *TAG_TOKENS)]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=atomic,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer)
    # The trainer marks every atomic token special; the tags are text the policy writes, so unmark them.
    spec = json.loads(tok.to_str())
    for added in spec["added_tokens"]:
        added["special"] = added["content"] in SPECIAL_TOKENS
    return Tokenizer.from_str(json.dumps(spec))


def wrap(backend: Tokenizer, *, chat_template: str = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    """The HF tokenizer around a trained backend: eos ``<|im_end|>``, pad ``<|endoftext|>``, no bos, and the
    Qwen2.5-Omni media-token attributes (``tokenizer.image_token``, ``tokenizer.image_token_id`` ...)."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        bos_token=None,
        unk_token=None,
        extra_special_tokens=dict(MEDIA_TOKENS),
        chat_template=chat_template,
        model_max_length=32768,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.init_kwargs["relax_gym_tokenizer_version"] = TOKENIZER_VERSION
    return tokenizer


_lock = threading.Lock()


@functools.lru_cache(maxsize=4)
def _trained_json(vocab_size: int) -> str:
    return train_backend(training_corpus(), vocab_size).to_str()


def build_tokenizer(vocab_size: int = DEFAULT_VOCAB_SIZE, *, save_to: str | Path | None = None) -> PreTrainedTokenizerFast:
    """Train (once per process; cached) and wrap the tokenizer. ``save_to`` writes it with ``save_pretrained``;
    load it back with ``transformers.AutoTokenizer.from_pretrained`` (or ``PreTrainedTokenizerFast``)."""
    with _lock:
        text = _trained_json(vocab_size)
    tokenizer = wrap(Tokenizer.from_str(text))
    if save_to is not None:
        tokenizer.save_pretrained(str(save_to))
    return tokenizer
