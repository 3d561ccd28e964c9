"""Input checks shared by both data-bus implementations: one clear :class:`DataBusInputError` naming the partition,
the row and the field, before anything is stored."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch

from relax_gym.trainer.databus.protocol import SAMPLE_ID, DataBusInputError


def check_partition(partition: Any) -> int:
    if isinstance(partition, bool) or not isinstance(partition, int):
        raise DataBusInputError(f"partition must be an int (the rollout step), got {partition!r}")
    return partition


def check_task(task: Any) -> str:
    if not isinstance(task, str) or not task:
        raise DataBusInputError(f"task must be a non-empty string, got {task!r}")
    return task


def _check_field_name(partition: int, name: Any, where: str) -> str:
    if not isinstance(name, str) or not name:
        raise DataBusInputError(f"partition {partition}: {where} has a field named {name!r}; names are non-empty str")
    return name


def _check_sample_id(partition: int, sid: Any, where: str) -> str:
    if not isinstance(sid, str) or not sid:
        raise DataBusInputError(f"partition {partition}: {where} has sample_id {sid!r}; ids are non-empty strings")
    return sid


def check_rows(partition: int, rows: Any) -> tuple[list[str], list[dict[str, Any]]]:
    """Validate new rows; return their sample ids and their fields (without ``sample_id``)."""
    check_partition(partition)
    if not isinstance(rows, list):
        raise DataBusInputError(f"partition {partition}: put takes a list of row dicts, got {type(rows).__name__}")
    ids: list[str] = []
    bodies: list[dict[str, Any]] = []
    first_row: dict[str, int] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataBusInputError(f"partition {partition}: row {i} is a {type(row).__name__}, not a dict")
        if SAMPLE_ID not in row:
            raise DataBusInputError(f"partition {partition}: row {i} has no {SAMPLE_ID!r}")
        sid = _check_sample_id(partition, row[SAMPLE_ID], f"row {i}")
        if sid in first_row:
            raise DataBusInputError(
                f"partition {partition}: duplicate sample_id {sid!r} in one put (rows {first_row[sid]} and {i})")
        first_row[sid] = i
        body = {_check_field_name(partition, k, f"row {sid!r}"): v for k, v in row.items() if k != SAMPLE_ID}
        if not body:
            raise DataBusInputError(f"partition {partition}: row {sid!r} has no fields besides {SAMPLE_ID!r}")
        ids.append(sid)
        bodies.append(body)
    return ids, bodies


def check_columns(partition: int, sample_ids: Any, fields: Any) -> tuple[list[str], dict[str, list[Any]]]:
    """Validate new columns for existing rows (``put_fields``)."""
    check_partition(partition)
    if not isinstance(sample_ids, list):
        raise DataBusInputError(f"partition {partition}: put_fields takes a list of sample_ids")
    seen: set[str] = set()
    for i, sid in enumerate(sample_ids):
        _check_sample_id(partition, sid, f"put_fields entry {i}")
        if sid in seen:
            raise DataBusInputError(f"partition {partition}: put_fields names sample_id {sid!r} twice")
        seen.add(sid)
    if not isinstance(fields, dict) or not fields:
        raise DataBusInputError(f"partition {partition}: put_fields needs a non-empty dict of field -> values")
    for name, values in fields.items():
        _check_field_name(partition, name, "put_fields")
        if name == SAMPLE_ID:
            raise DataBusInputError(f"partition {partition}: put_fields cannot rewrite {SAMPLE_ID!r}")
        if not isinstance(values, (list, tuple)):
            raise DataBusInputError(f"partition {partition}: field {name!r} must be a list (one value per sample_id)")
        if len(values) != len(sample_ids):
            raise DataBusInputError(
                f"partition {partition}: field {name!r} has {len(values)} values for {len(sample_ids)} sample_ids")
    return list(sample_ids), {k: list(v) for k, v in fields.items()}


def check_fetch(partition: Any, task: Any, fields: Any, batch_size: Any, timeout: Any) -> list[str]:
    """Validate fetch arguments; return the data fields a row must have (``sample_id`` is always there)."""
    check_partition(partition)
    check_task(task)
    if not isinstance(fields, (list, tuple)) or not fields:
        raise DataBusInputError(f"partition {partition}: task {task!r} must fetch a non-empty list of fields")
    for name in fields:
        _check_field_name(partition, name, f"fetch by task {task!r}")
    data_fields = list(dict.fromkeys(f for f in fields if f != SAMPLE_ID))
    if not data_fields:
        raise DataBusInputError(f"partition {partition}: task {task!r} must fetch at least one field besides sample_id")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise DataBusInputError(f"partition {partition}: batch_size must be a positive int, got {batch_size!r}")
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
        raise DataBusInputError(f"partition {partition}: timeout must be None or >= 0 seconds, got {timeout!r}")
    return data_fields


def column_dtypes(partition: int, columns: dict[str, list[Any]]) -> dict[str, str]:
    """The one tensor dtype of each column that holds tensors; a column mixing dtypes is refused.

    TransferQueue packs a fetched column of tensors into one nested or stacked tensor, which casts rows of other
    dtypes to the first one (silently) and refuses a field whose dtype changes between puts (also silently: the rows
    never become ready). One dtype per field and partition keeps every row bit-identical on both buses."""
    out: dict[str, str] = {}
    for name, values in columns.items():
        seen = {str(v.dtype) for v in values if isinstance(v, torch.Tensor)}
        if len(seen) > 1:
            raise DataBusInputError(f"partition {partition}: field {name!r} mixes tensor dtypes {sorted(seen)}; "
                                    f"one field holds one dtype")
        if seen:
            out[name] = seen.pop()
    return out


def group_key(partition: int, sid: str, value: Any) -> Hashable:
    """A row's group value as a hashable Python key (0-d tensors and numpy scalars are unwrapped)."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    try:
        hash(value)
    except TypeError:
        raise DataBusInputError(
            f"partition {partition}: row {sid!r} has an unhashable group value ({type(value).__name__})") from None
    return value
