"""``relax-gym model``: bring a published checkpoint — write a stand-in of one, check a directory, size a run.

    relax-gym model list                                     # the published models we know, with their widths
    relax-gym model fake qwen2.5-omni-3b OUT [--layers 1]    # a stand-in directory in the published layout
    relax-gym model check DIR [--load]                       # what a directory holds and whether it loads
    relax-gym model sizes qwen2.5-omni-7b --tp 2             # parameters and bytes per rank at full depth

Only typer is imported here; the model code loads per command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["model_app"]

model_app = typer.Typer(help="Bring your own model: stand-ins of published Qwen-Omni checkpoints, a directory check, "
                             "sizes per rank (docs/models.md).", no_args_is_help=True)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


@model_app.command("list")
def model_list() -> None:
    """The published models a stand-in can be written of, with their widths."""
    from relax_gym.trainer.models.published import PUBLISHED

    for name, m in PUBLISHED.items():
        text = m.config["thinker_config"]["text_config"]
        experts = f", {text['num_experts']} experts top-{text['num_experts_per_tok']}" if text.get("num_experts") else ""
        typer.echo(f"{name:20s} {m.repo:36s} hidden {text['hidden_size']}, {text['num_hidden_layers']} layers, "
                   f"heads {text['num_attention_heads']}/{text['num_key_value_heads']}, vocab {text['vocab_size']}"
                   f"{experts}; {m.shards} shards")


@model_app.command("fake")
def model_fake(
    name: Annotated[str, typer.Argument(help="a published model (relax-gym model list)")],
    out: Annotated[Path, typer.Argument(help="directory to write (created)")],
    layers: Annotated[int, typer.Option("--layers", min=1, help="layers per stack (real widths, cut depth)")] = 1,
    seed: Annotated[int, typer.Option("--seed", help="weight seed")] = 0,
    dtype: Annotated[str, typer.Option("--dtype", help="bfloat16 (as published) or float32")] = "bfloat16",
    thinker_only: Annotated[bool, typer.Option("--thinker-only", help="the layout of a thinker saved on its own")] = False,
) -> None:
    """Write a stand-in checkpoint: the published file layout, real widths, `--layers` deep, random weights."""
    from relax_gym.trainer.models.published import PUBLISHED
    from relax_gym.trainer.models.standin import write_standin

    if name not in PUBLISHED:
        raise _fail(f"unknown model {name!r}; known: {', '.join(sorted(PUBLISHED))}")
    if dtype not in ("bfloat16", "float32", "float16"):
        raise _fail(f"--dtype must be bfloat16, float32 or float16, got {dtype!r}")
    path = write_standin(name, out, layers=layers, seed=seed, dtype=dtype, thinker_only=thinker_only)
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    typer.echo(f"wrote {path}: {PUBLISHED[name].repo} stand-in, {layers} layer(s) per stack, {dtype}, "
               f"{size / 2**30:.2f} GiB; load it with model.path={path} model.base=null")


@model_app.command("sizes")
def model_sizes(
    source: Annotated[str, typer.Argument(help="a published model (relax-gym model list), a checkpoint directory or a config.json")],
    tp: Annotated[int, typer.Option("--tp", min=1, help="tensor parallel size")] = 1,
    pp: Annotated[int, typer.Option("--pp", min=1, help="pipeline parallel size")] = 1,
    ep: Annotated[int, typer.Option("--ep", min=1, help="expert parallel size (MoE)")] = 1,
    dp: Annotated[int, typer.Option("--dp", min=1, help="data parallel size")] = 1,
    dtype: Annotated[str, typer.Option("--dtype", help="train dtype: bfloat16, float16 or float32")] = "bfloat16",
    distributed_optimizer: Annotated[bool, typer.Option("--distributed-optimizer", help="shard optimizer states over dp (ZeRO-1)")] = False,
    optimizer: Annotated[str, typer.Option("--optimizer", help="mixed: Megatron's fp32 master + moments; plain: torch AdamW in the weight dtype (the hf actor)")] = "mixed",
) -> None:
    """Parameters per part at full depth, bytes per rank of a TP/PP/EP/DP layout with Adam, KV cache per token."""
    from relax_gym.trainer.models.sizes import format_report, size_report

    try:
        report = size_report(source, tp=tp, pp=pp, ep=ep, dp=dp, dtype=dtype,
                             distributed_optimizer=distributed_optimizer, optimizer=optimizer)  # type: ignore[arg-type]
    except (ValueError, FileNotFoundError, KeyError) as exc:
        raise _fail(str(exc).strip("'\"")) from None
    typer.echo(format_report(report))


@model_app.command("check")
def model_check(
    directory: Annotated[Path, typer.Argument(help="a checkpoint directory")],
    load: Annotated[bool, typer.Option("--load", help="also load the weights (CPU), not only their headers")] = False,
) -> None:
    """What a checkpoint directory holds (architecture, widths, dtype, tokenizer, template, media limits) and whether
    it loads; exit 1 with one line naming the file and field when it does not."""
    from relax_gym.trainer.models.check import check_directory, format_check

    report = check_directory(directory, load=load)
    typer.echo(format_check(report))
    if not report.ok:
        raise typer.Exit(1)
