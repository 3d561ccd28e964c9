"""Test stand-in package shadowing ``sglang`` (see ../README.md). Not SGLang."""
