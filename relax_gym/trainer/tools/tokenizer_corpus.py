"""Write (or check) the tokenizer's stored corpus from the built-in environments:

    python -m relax_gym.trainer.tools.tokenizer_corpus            # rewrite relax_gym/trainer/policy/tokenizer_corpus.json.gz
    python -m relax_gym.trainer.tools.tokenizer_corpus --check    # exit 1 if the environments now say something else

The policy's tokenizer is trained on what the built-in environments say and what their gold policies answer. The
policy package never imports the environments (docs/architecture.md), so those conversations are rendered here,
once, and stored with the package. Changing the file changes the tokenizer: bump ``TOKENIZER_VERSION`` with it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import relax_gym
from relax_gym.omni import Message, TextPart
from relax_gym.trainer.policy.tokenizer import CORPUS_FILE, render_text, stored_conversations

#: Environments whose conversations are stored, with the kwargs that skip media decoding.
BUILTIN_ENVS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("nextqa-video", {"decode_on_reset": False}),
    ("echo-ink", {"decode_on_reset": False}),
    ("image-zoom", {}),
    ("tool-use", {}),
)
CORPUS_SEEDS = 32


def env_conversations(seeds: int = CORPUS_SEEDS) -> Iterator[str]:
    """Whole conversations of the built-in environments (opening, gold actions and, where it needs no sandbox, the
    tool turns), rendered with the tokenizer's chat template."""
    for env_id, kwargs in BUILTIN_ENVS:
        env = relax_gym.make(env_id, **kwargs).unwrapped
        try:
            for seed in range(seeds):
                obs, info = env.reset(seed=seed)
                conversation = list(obs)
                gold = info["gold"]
                conversation.append(Message(role="assistant", content=(TextPart(gold),)))
                if env_id == "image-zoom":  # stepping runs the zoom tool in-process: cheap and deterministic
                    for _ in range(env.max_turns):
                        new, _, terminated, truncated, info = env.step(gold)
                        conversation.extend(new)
                        if terminated or truncated:
                            break
                        gold = info["gold"]
                        conversation.append(Message(role="assistant", content=(TextPart(gold),)))
                elif env_id == "tool-use":  # the python tool needs a sandbox: write the response it would give
                    found = re.search(r"<answer>(.*?)</answer>", env.task.gold_answer)
                    digits = found.group(1) if found else "0"
                    conversation.append(Message(role="tool", content=(TextPart(f"<tool_response>\n{digits}\n</tool_response>"),)))
                    conversation.append(Message(role="assistant", content=(TextPart(env.task.gold_answer),)))
                yield render_text(conversation)
        finally:
            env.close()


def write_corpus(path: Path = CORPUS_FILE) -> int:
    texts = list(env_conversations())
    # mtime=0: the same texts give the same bytes
    with gzip.GzipFile(path, "wb", compresslevel=9, mtime=0) as f:
        f.write(json.dumps(texts, ensure_ascii=False, indent=0).encode("utf-8"))
    return len(texts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m relax_gym.trainer.tools.tokenizer_corpus", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = parser.parse_args(argv)
    if args.check:
        same = stored_conversations() == list(env_conversations())
        print(f"{CORPUS_FILE}: {'matches the environments' if same else 'differs from what the environments say now'}")
        return 0 if same else 1
    print(f"wrote {write_corpus()} conversations to {CORPUS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
