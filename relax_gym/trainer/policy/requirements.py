"""The transformers the policy code needs, checked where a policy is built: one error that names both versions.

The Qwen2.5-Omni thinker's module layout (``model.language_model`` / ``model.visual`` / ``model.audio_tower``)
and the processor defaults our render matches arrived in transformers 5.2x; under 5.17 (what the H200 machine
ships, docs/gpu-results.md) the Megatron conversion failed with ``KeyError: no tensor
'model.language_model.embed_tokens.weight'`` — a message that does not say "upgrade transformers". The floor is
the oldest release the policy, model, actor, engine and omni tests were seen to pass on: 5.24.0 (under 5.23.0, 15
engine tests fail: ``generate()`` refuses the engine's ``cache`` argument and continuous batches drift; under
5.21.1 the official-processor parity tests fail). pyproject.toml pins the same.
"""

from __future__ import annotations

from packaging.version import Version

MIN_TRANSFORMERS = "5.24.0"


class TransformersTooOld(RuntimeError):
    """The installed transformers predates what the policy code needs."""


def require_transformers(found: str | None = None) -> None:
    """Raise :class:`TransformersTooOld` when transformers is older than :data:`MIN_TRANSFORMERS`."""
    if found is None:
        import transformers

        found = transformers.__version__
    if Version(found) < Version(MIN_TRANSFORMERS):
        raise TransformersTooOld(
            f"transformers {found} is installed; relax-gym needs transformers>={MIN_TRANSFORMERS} (the Qwen2.5-Omni "
            f"thinker's module layout and processor defaults changed in 5.2x): pip install 'transformers>={MIN_TRANSFORMERS}'")
