"""One trainer, many runs: a frozen base model shared by member runs, each with its own LoRA
adapter, optimizer, lr schedule, loss, step counter, checkpoints and publisher.

    pool = MultiRunTrainer.build(pool_config)          # the base model, FSDP2 over every rank
    pool.add_run("a", a_config, client, publisher, checkpointer, metrics)
    pool.train_step(["a", "b"])                         # a's next step, then b's
    pool.remove_run("a")                                # its adapter and optimizer state freed

How adapters switch: the model has ONE set of LoRA modules (`AdapterSlot`), sharded by FSDP2
with their layers as in a solo LoRA run, and each run keeps this rank's shards of its adapter
as plain tensors. Before a run's step its values are copied into the slot (and its `alpha /
rank` set on the layers), after it they are copied back. Each run's step is then the solo
trainer's own step (rlkube.trainer.rl.trainer.RLTrainer: the same loss, optimizer step,
publish and checkpoint code) on a model that is, value for value, the solo run's model: the
same parameters in the same FSDP2 groups, gathered and reduced in the same order, and an AdamW
of its own over them (its state keyed by the slot's parameters). So a pooled run is
bit-exact to its solo run (tests/trainer/test_multi_run.py), and a run joins or leaves without
touching FSDP2: its tensors are made or dropped, the sharded module tree never changes.
A module holding a dict of adapters would have FSDP2 gather every run's adapter in every
forward, and would need re-sharding the model to add one.

The copies cost two adapter-sized memcpys per run step (a rank-16 adapter of a 0.6B model is
~40 MB in float32), against a forward and backward through the base model.

Every run must fit the slot: the pool's `model`, `parallel`, `device` and the shape of its
`lora` (rank, target modules, dropout); `alpha` may differ. Dropout draws from the process's
random generator, so a pooled run with dropout > 0 sees other masks than its solo run.

Every rank calls `add_run`, `train_step` and `remove_run` with the same arguments in the same
order (they are collective: FSDP2's gathers and the runs' checkpoints and publishes); which
runs a step trains is the caller's choice (a scheduler deciding on rank 0 and broadcasting).
"""

import logging
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from rlkube.config import TrainerConfig
from rlkube.config.pool import slot_misfit
from rlkube.models.lora_math import is_adapter_key
from rlkube.trainer.dist import DistInfo, close_distributed
from rlkube.trainer.lora import LoraLinear, adapter_state_dict, init_adapters
from rlkube.trainer.optim import build_optimizer, build_scheduler
from rlkube.trainer.rl.setup import TrainingEnv, build_sharded_model
from rlkube.trainer.rl.trainer import RLTrainer

logger = logging.getLogger(__name__)


def _local(param: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a parameter (the tensor itself when unsharded), aliasing it."""
    return param.to_local() if isinstance(param, DTensor) else param


class AdapterSlot:
    """The model's LoRA parameters, holding one run's adapter at a time."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.params = {name: p for name, p in model.named_parameters() if is_adapter_key(name)}
        self.layers = [m for m in model.modules() if isinstance(m, LoraLinear)]
        self.fsdp_modules = [m for m in model.modules() if isinstance(m, FSDPModule)]

    def reshard(self) -> None:
        """Free gathered parameters (left by a forward without backward under
        `reshard_after_forward=False`): the next forward would reuse them, with the adapter
        that was in the slot when they were gathered."""
        for module in self.fsdp_modules:
            module.reshard()

    @torch.no_grad()
    def values(self) -> dict[str, torch.Tensor]:
        """A copy of this rank's shards of the adapter in the slot."""
        return {name: _local(p).clone() for name, p in self.params.items()}

    @torch.no_grad()
    def load(self, values: dict[str, torch.Tensor], scaling: float) -> None:
        """Put an adapter in the slot."""
        self.reshard()
        for name, param in self.params.items():
            _local(param).copy_(values[name])
        for layer in self.layers:
            layer.scaling = scaling

    @torch.no_grad()
    def store(self, values: dict[str, torch.Tensor]) -> None:
        """Copy the slot's adapter back into `values`, its run's own tensors."""
        for name, param in self.params.items():
            values[name].copy_(_local(param))

    def clear_grads(self) -> None:
        """No gradient crosses from one run's step to the next one's (a step that failed
        half-way leaves some)."""
        for param in self.params.values():
            param.grad = None


@dataclass
class Member:
    """A run of the pool: its adapter (while out of the slot) and its own solo trainer."""

    name: str
    config: TrainerConfig
    adapter: dict[str, torch.Tensor]
    trainer: RLTrainer

    @property
    def step(self) -> int:
        return self.trainer.step

    @property
    def finished(self) -> bool:
        return self.trainer.step >= self.config.max_steps


class MultiRunTrainer:
    def __init__(self, config: TrainerConfig, info: DistInfo, model: nn.Module, compile_cache=None):
        if config.lora is None:
            raise ValueError("trainer.lora: a pool trains one LoRA adapter per run; set the adapters' shape")
        self.config, self.info, self.model, self.compile_cache = config, info, model, compile_cache
        self.slot = AdapterSlot(model)
        self.members: dict[str, Member] = {}

    @classmethod
    def build(cls, config: TrainerConfig) -> "MultiRunTrainer":
        """The pool's base model from `config` (its `model`, `parallel`, `device`, `cpu_threads`,
        `lora` shape and `compile_cache_url`; the rest is each run's)."""
        info, model, compile_cache = build_sharded_model(config)
        return cls(config, info, model, compile_cache)

    def misfit(self, config: TrainerConfig) -> str | None:
        """Why a run's config does not fit this pool (naming the field), or None."""
        return slot_misfit(self.config, config)

    def add_run(self, name: str, config: TrainerConfig, client, publisher, checkpointer=None, metrics=None) -> Member:
        """Collective: a new run with its adapter (from `config.seed`, as its solo run's), its
        own optimizer and schedule, resumed from its checkpoint when `config.ckpt` says so
        (and that step republished), as `RLTrainer.resume` does for a solo run."""
        if name in self.members:
            raise ValueError(f"run {name!r} is already in the pool")
        if reason := self.misfit(config):
            raise ValueError(f"run {name!r}: {reason}")
        self.slot.reshard()
        init_adapters(self.model, config.seed)
        adapter = self.slot.values()
        optimizer = build_optimizer(self.model, config.optim)
        scheduler = build_scheduler(optimizer, config.scheduler, config.max_steps)
        env = TrainingEnv(self.info.rank, self.info.world_size, self.info.device, self.model, optimizer, scheduler,
                          lora=True, compile_cache=self.compile_cache)
        member = Member(name, config, adapter, RLTrainer(config, env, client, publisher, checkpointer, metrics))
        with self.active(member):
            member.trainer.resume()
        self.members[name] = member
        logger.info("run %s joined the pool at step %d", name, member.step)
        return member

    def remove_run(self, name: str) -> None:
        """Collective: finish the run's publish in flight and drop its adapter, optimizer state
        and schedule."""
        member = self.members.pop(name)
        member.trainer.close()
        logger.info("run %s left the pool at step %d", name, member.step)

    def train_step(self, names: Iterable[str]) -> None:
        """Collective: the next step of each run in `names`, in that order, each with its own
        adapter (the others untouched), batch, loss, optimizer, publish and checkpoint."""
        for name in names:
            member = self.members[name]
            if member.finished:
                raise ValueError(f"run {name!r} has trained all its {member.config.max_steps} steps (max_steps)")
            with self.active(member):
                member.trainer.train_step(member.step + 1)

    def adapter_state_dict(self, name: str) -> dict[str, torch.Tensor]:
        """Collective: run `name`'s adapter, unsharded on CPU under PEFT's names, on rank 0."""
        with self.active(self.members[name]):
            return adapter_state_dict(self.model)

    @contextmanager
    def active(self, member: Member):
        """`member`'s adapter in the slot for the block, and its values back in its own
        tensors after it (also after a failure: they go with its optimizer and step counter)."""
        self.slot.load(member.adapter, member.config.lora.scaling)
        try:
            yield
        finally:
            self.slot.store(member.adapter)
            self.slot.clear_grads()

    def close(self) -> None:
        """Remove every run (finishing their publishes), then leave the process group."""
        try:
            for name in list(self.members):
                self.remove_run(name)
        finally:
            close_distributed()
