"""The ``megatron`` actor backend: the policy's language decoder is megatron-core's ``GPTModel``.

``MegatronActor(model, processor, ...)`` takes the HF thinker that ``build_policy`` made and converts it in place
(:func:`~relax_gym.trainer.actors.megatron.model.to_megatron`): megatron-core runs the text decoder (local layer
spec, multimodal rope), transformers keeps the vision / audio towers and the merge of their features. Training is
the hf backend's own step logic (:class:`~relax_gym.trainer.actors.hf.HFActor`: micro-batches, the same loss
functions from ``relax_gym.trainer.algorithms``, gradient clipping, AdamW over every parameter) on that model; what
this backend adds is where the model comes from and how its weights leave it:

- ``state_dict()`` gives HF names (converted from Megatron's), so weight pushes into the inference engines and
  the DCS work unchanged; ``load_weights`` takes HF names back;
- ``save_checkpoint`` / ``load_checkpoint`` use megatron-core's ``dist_checkpointing`` (the decoder under its
  Megatron names and sharding metadata, the towers as replicated tensors under their HF names);
- megatron-core's parallel state (a world-size-1 process group; gloo over loopback on a CPU, with the CPU patch of
  :mod:`~relax_gym.trainer.actors.megatron.cpu_patch`) is set up by the first actor and torn down by ``close``.

MoE thinkers (``model.family=qwen3_omni_moe``) convert to megatron-core MoE layers
(:mod:`~relax_gym.trainer.actors.megatron.moe`, :mod:`~relax_gym.trainer.actors.megatron.qwen3_omni`); items'
recorded experts are measured and, with ``routing_replay``, replayed on megatron-core's routers
(:mod:`~relax_gym.trainer.actors.megatron.replay`).

This class trains in one process. A layout of more ranks (``actor.parallel``) is trained by its subclass
:class:`~relax_gym.trainer.actors.megatron.rank_actor.RankActor`, one per rank, which shares out the batch and
sums the gradients over the ranks; asked for more than one rank, this class refuses with an error naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from relax_gym.trainer.actors.hf import HFActor
from relax_gym.trainer.actors.megatron import replay as megatron_replay
from relax_gym.trainer.actors.megatron import runtime as megatron_runtime
from relax_gym.trainer.actors.megatron.model import gpt_of, hf_state_dict, load_hf_state_dict, to_megatron
from relax_gym.trainer.actors.megatron.runtime import ParallelSizes
from relax_gym.trainer.actors.megatron.shard import global_parameter_names

__all__ = ["CHECKPOINT_DIR", "OPTIMIZER_DIR", "MegatronActor"]

CHECKPOINT_DIR = "megatron"  # the dist_checkpointing folder inside a checkpoint directory
OPTIMIZER_DIR = "megatron_optimizer"  # the optimizer's dist_checkpointing folder beside it
THINKERS = ("qwen2_5_omni_thinker", "qwen3_omni_moe_thinker")  # model.family qwen2_5_omni, qwen3_omni_moe (MoE)


class MegatronActor(HFActor):
    SHARDED = False  # whether this class shares a step out over ranks (RankActor does)

    def __init__(self, model: nn.Module, processor: Any, *, parallel: ParallelSizes = ParallelSizes(), seed: int = 0,
                 **kwargs: Any) -> None:
        if getattr(model, "config", None) is None or getattr(model.config, "model_type", "") not in THINKERS:
            raise ValueError(f"actor.backend=megatron converts Qwen2.5-Omni thinkers (model.family=qwen2_5_omni) and "
                             f"Qwen3-Omni MoE thinkers (model.family=qwen3_omni_moe); got {type(model).__name__}")
        if parallel.world > 1 and not self.SHARDED:
            raise ValueError(f"MegatronActor trains in one process; {parallel} has {parallel.world} ranks: use "
                             "RankActor on each rank (relax_gym.trainer.actors.megatron.rank_actor), as the rank group "
                             "does")
        routing_replay = kwargs.pop("routing_replay", False)  # MoE: set below, on the Megatron routers
        self._closed = True
        self.device = megatron_runtime.acquire(parallel, seed=seed)
        self._closed = False
        try:
            with torch.device("meta"):  # names and config only, no memory
                self._template = type(model)(model.config)
            self._template.generation_config = model.generation_config
            # the renames transformers applied when it loaded ``model`` (from a full Omni checkpoint: the ``thinker.``
            # prefix): the template then names the weights as the checkpoint does (``checkpoint_names``, what DCS
            # pushes send), as the engines that loaded the same files expect; a template built from the config alone
            # would send ``audio_tower.*`` where they know ``thinker.audio_tower.*``
            if getattr(model, "_weight_conversions", None) is not None:
                self._template._weight_conversions = model._weight_conversions
            to_megatron(model, device=self.device, tensor_parallel=parallel.tensor,
                        pipeline_parallel=parallel.pipeline, context_parallel=parallel.context,
                        expert_parallel=parallel.expert)
            super().__init__(model, processor, **kwargs)
            # -- MoE: routing record / replay on megatron-core's routers (replay.py) --
            self.routing = megatron_replay.routing_shape(self.model)  # (MoE layers, top_k); None when dense
            if routing_replay and self.routing is None:
                raise ValueError("algorithm.routing_replay needs a mixture-of-experts policy; this thinker is dense "
                                 "(set model.family=qwen3_omni_moe)")
            self.routing_replay = routing_replay
        except BaseException:
            self.close()
            raise

    def _replay_routing(self, recorded: torch.Tensor | None, rows: int) -> Any:
        """As :meth:`HFActor._replay_routing`, on megatron-core's routers (:func:`~.replay.replay_routing`)."""
        return megatron_replay.replay_routing(self.model, recorded, batch=rows)

    # -- weights under HF names ----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        return hf_state_dict(self.model)

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        load_hf_state_dict(self.model, state)

    @property
    def hf_template(self) -> nn.Module:
        """A meta-device HF thinker: the names and config of the weights this actor hands out."""
        return self._template

    def hf_model(self) -> nn.Module:
        """A frozen HF thinker (CPU) holding the current weights."""
        with torch.random.fork_rng(devices=[]):
            model = type(self._template)(self._template.config)
        model.generation_config = self._template.generation_config
        model.to(next(self.model.parameters()).dtype)
        model.load_state_dict({k: v.cpu() for k, v in self.state_dict().items()})
        return model.eval()

    # -- dist_checkpointing ---------------------------------------------------------------------------------------

    def _sharded_state_dict(self) -> dict[str, Any]:
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

        gpt = gpt_of(self.model)
        towers = {k: v for k, v in self.model.state_dict(keep_vars=True).items()
                  if not k.startswith(("model.language_model.", "lm_head."))}
        return {"decoder": gpt.sharded_state_dict(),  # GPTModel's own names, as Megatron-LM saves them
                "towers": make_sharded_tensors_for_checkpoint(towers, "towers.")}

    def save_checkpoint(self, directory: str | Path) -> Path:
        """The weights with ``dist_checkpointing`` in ``directory/megatron/`` and the processor in ``directory``."""
        from megatron.core import dist_checkpointing

        out = Path(directory)
        target = out / CHECKPOINT_DIR
        target.mkdir(parents=True, exist_ok=True)
        dist_checkpointing.save(self._sharded_state_dict(), str(target))
        self.processor.save_pretrained(out)
        return out

    def load_checkpoint(self, directory: str | Path) -> None:
        """Load weights saved by :meth:`save_checkpoint` (same model shape and parallel layout)."""
        from megatron.core import dist_checkpointing

        source = Path(directory) / CHECKPOINT_DIR
        if not (source / "metadata.json").is_file():
            raise FileNotFoundError(f"{source} holds no megatron dist checkpoint (no metadata.json)")
        sharded = self._sharded_state_dict()
        loaded = dist_checkpointing.load(sharded, str(source))
        gpt_of(self.model).load_state_dict(loaded["decoder"])
        own = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in loaded["towers"].items():
                own[name.removeprefix("towers.")].copy_(tensor)

    # -- the optimizer's state, sharded like the weights it belongs to ------------------------------------------

    def _optimised(self) -> list[tuple[str, torch.nn.Parameter, Any]]:
        """(name at any layout, parameter, its sharded tensor) for every parameter the optimizer steps."""
        gpt = gpt_of(self.model)
        names = global_parameter_names(gpt)
        names.update({id(p): f"towers.{n}" for n, p in self.model.named_parameters()
                      if id(p) not in names and not n.startswith(("model.language_model.", "lm_head."))})
        sharded = {id(t.data): t for t in _sharded_values(self._sharded_state_dict())}
        out = []
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in sharded or id(p) not in names:
                    raise KeyError(f"an optimised parameter of shape {tuple(p.shape)} has no sharded tensor in the checkpoint")
                out.append((names[id(p)], p, sharded[id(p)]))
        return out

    def _sharded_optimizer_state(self, optimised: list[tuple[str, torch.nn.Parameter, Any]]
                                 ) -> tuple[dict[str, Any], dict[str, float]]:
        """AdamW's moments as sharded tensors keyed like their parameters (``optimizer.exp_avg.<key>``), so they
        load at another parallel layout as the weights do; and each parameter's step count by its layout-free name.
        A parameter without state yet gets zero moments and step 0 -- what AdamW starts from, so it steps exactly
        as a fresh one -- and every shard of every parameter is in the checkpoint."""
        from megatron.core.dist_checkpointing.optimizer import make_sharded_optimizer_tensor

        moments: dict[str, Any] = {}
        steps: dict[str, float] = {}
        for name, p, sharded in optimised:
            state = self.optimizer.state[p]
            if not state:
                state.update(step=torch.zeros((), dtype=torch.float32), exp_avg=torch.zeros_like(p),
                             exp_avg_sq=torch.zeros_like(p))
            for moment in ("exp_avg", "exp_avg_sq"):
                moments[f"{moment}.{name}"] = make_sharded_optimizer_tensor(sharded, state[moment], f"optimizer.{moment}")
            steps[name] = float(state["step"])
        return moments, steps

    def save_optimizer(self, directory: str | Path) -> None:
        """The optimizer's state with ``dist_checkpointing`` in ``directory/megatron_optimizer/`` (every rank its
        own shards; the step counts of every rank gathered into the common part)."""
        import torch.distributed as dist
        from megatron.core import dist_checkpointing

        moments, steps = self._sharded_optimizer_state(self._optimised())
        everyone: list[dict[str, float] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, steps)
        merged = {k: v for part in everyone for k, v in (part or {}).items()}
        target = Path(directory) / OPTIMIZER_DIR
        target.mkdir(parents=True, exist_ok=True)
        dist_checkpointing.save({"moments": moments, "steps": merged}, str(target))

    def load_optimizer(self, directory: str | Path) -> None:
        """Load what :meth:`save_optimizer` wrote, at this actor's parallel layout (which may differ)."""
        from megatron.core import dist_checkpointing

        source = Path(directory) / OPTIMIZER_DIR
        if not (source / "metadata.json").is_file():
            raise FileNotFoundError(f"{source} holds no megatron optimizer checkpoint (no metadata.json)")
        optimised = self._optimised()
        moments, _ = self._sharded_optimizer_state(optimised)
        loaded = dist_checkpointing.load({"moments": moments, "steps": {}}, str(source))
        steps = loaded["steps"]
        with torch.no_grad():
            for name, p, _ in optimised:
                if name not in steps:
                    raise KeyError(f"the optimizer checkpoint in {source} has no step count for {name!r}")
                state = self.optimizer.state[p]
                state["exp_avg"].copy_(loaded["moments"][f"exp_avg.{name}"])
                state["exp_avg_sq"].copy_(loaded["moments"][f"exp_avg_sq.{name}"])
                state["step"].fill_(steps[name])

    def close(self) -> None:
        """Tear down megatron-core's parallel state if this was its last user (idempotent)."""
        if not self._closed:
            self._closed = True
            megatron_runtime.release()


def _sharded_values(sharded: dict[str, Any]) -> list[Any]:
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    return [t for t in nested_values(sharded) if isinstance(t, (ShardedTensor, ShardedTensorFactory))]
