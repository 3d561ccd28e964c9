"""Pydantic validation errors as one line that names the fields (``field.path: message; ...``), for every request
schema of the engines' protocol."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError


def format_validation_error(exc: ValidationError, where: str | None = None) -> str:
    """A pydantic error as ``field.path: message; ...`` (the field named first, as clients want to read it); with
    ``where`` every path is prefixed by it (``where.field.path: message``)."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(x) for x in err.get("loc", ()))
        if where is not None:
            loc = f"{where}.{loc}" if loc else where
        msg = str(err.get("msg", "invalid"))
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts) or str(exc)


def parse_request(model: type[BaseModel], data: Any) -> Any:
    """Validate ``data`` (a dict from JSON) into ``model``; raises ``ValueError`` with the fields named."""
    try:
        return model.model_validate(data if data is not None else {})
    except ValidationError as exc:
        raise ValueError(format_validation_error(exc)) from None
