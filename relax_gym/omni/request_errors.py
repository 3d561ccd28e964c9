"""The first fault of a request body that pydantic refused, as one message naming the field (the gateways'
request parsers for the Responses and Messages APIs share it)."""

from __future__ import annotations

from pydantic import ValidationError


def field_error(exc: ValidationError, api: str) -> tuple[str, str | None]:
    """(``"<field>: <what is wrong>"``, the top-level field) of ``exc``'s first error; an unknown field is said to
    be no ``api`` field this endpoint supports."""
    err = exc.errors(include_url=False)[0]
    where = ".".join(str(x) for x in err.get("loc", ()))
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    if err.get("type") == "extra_forbidden":
        msg = f"unknown field (not a {api} field this endpoint supports)"
    return f"{where}: {msg}", where.split(".")[0] or None
