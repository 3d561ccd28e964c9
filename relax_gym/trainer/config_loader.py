"""YAML + dotted overrides → a validated pydantic tree, with one clear error naming the key and where it came from.

    cfg = load_config("recipes/cpu-nextqa.yaml", ["trainer.steps=50", "algorithm.name=dapo"], RelaxConfig)

Override values are parsed as YAML scalars/flow values (``50`` → int, ``true`` → bool, ``[1, 2]`` → list,
``null`` → None). Unknown keys are errors (models use ``extra="forbid"``) and the message suggests close matches.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A recipe or override is wrong; the message names the file or override and the dotted key."""


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...], schema: type[M]) -> M:
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        path = Path(path)
        source = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"{path}: recipe file not found") from None
        except OSError as exc:  # a folder, no permission, ...
            raise ConfigError(f"{path}: cannot read the recipe: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
            raise ConfigError(f"{path}{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
        except (ValueError, RecursionError) as exc:  # a date that does not exist (2001-13-45), nesting too deep
            raise ConfigError(f"{path}: invalid YAML: {_yaml_problem(exc)}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: a recipe must be a mapping of sections, got {type(loaded).__name__}")
        data = loaded or {}
    origins: dict[str, str] = {}
    for item in overrides:
        key, value = parse_override(item)
        set_dotted(data, key, value, item)
        origins[key] = f"override {item!r}"
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_explain(exc, schema, source, origins)) from None


def parse_override(item: str) -> tuple[str, Any]:
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part.isidentifier() for part in key.split(".")):
        raise ConfigError(f"override {item!r} must look like section.key=value (e.g. trainer.steps=50)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except (yaml.YAMLError, ValueError, RecursionError):
        value = raw  # not YAML (or a value YAML cannot build, such as 2001-13-45): keep the text, the schema decides
    if isinstance(value, dict) and not raw.strip().startswith("{"):
        value = raw  # "a: b" inside a value is text, not a mapping
    return key, value


def _yaml_problem(exc: ValueError | RecursionError) -> str:
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)


def set_dotted(data: dict[str, Any], key: str, value: Any, item: str = "") -> None:
    node = data
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {item or key!r}: {'.'.join(parts[: i + 1])} is a value, not a section")
        node = child
    node[parts[-1]] = value


def _explain(exc: ValidationError, schema: type[BaseModel], source: str, origins: dict[str, str]) -> str:
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
    dotted = ".".join(loc) or "(top level)"
    origin = next((o for k, o in origins.items() if dotted == k or dotted.startswith(k + ".") or k.startswith(dotted + ".")), source)
    if err["type"] == "extra_forbidden":
        siblings = _field_names(schema, loc[:-1])
        close = difflib.get_close_matches(loc[-1], siblings, n=1)
        hint = f" (did you mean {'.'.join(loc[:-1] + close)!r}?)" if close else (f" (known: {', '.join(sorted(siblings))})" if siblings else "")
        msg = f"unknown key {dotted!r}{hint}"
    else:
        got = err.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        msg = f"{dotted}: {err['msg']}{shown}"
    more = f"; and {exc.error_count() - 1} more problem(s)" if exc.error_count() > 1 else ""
    return f"{origin}: {msg}{more}"


def _field_names(schema: type[BaseModel], loc: list[str]) -> list[str]:
    model: Any = schema
    for part in loc:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        model = field.annotation
    return list(getattr(model, "model_fields", {}))
