"""Which GPUs the processes of `rlkube rl` get on one machine (`CUDA_VISIBLE_DEVICES` each).

By default the inference replicas take the first `replicas x tensor_parallel_size` visible
GPUs, in order, the trainer's ranks the next `nproc_per_node`, a `[teacher]`'s replicas
the next `replicas x tensor_parallel_size`, and a `[judge]`'s the next; a machine with fewer GPUs
than that shares them (a single-GPU box runs vLLM beside the trainer, vLLM taking
`gpu_memory_utilization` of it). `inference.gpus` / `trainer.gpus` place them by hand. NCCL
weight updates need the trainer's rank 0 and every vLLM worker on different GPUs (NCCL cannot
form a group of two ranks on one device): an overlap with `weights.type = "nccl"` is refused.
"""

import itertools
import os
from dataclasses import dataclass

from rlkube.config import RLConfig


@dataclass
class GpuPlacement:
    inference: list[list[str]]
    """Each replica's devices, as `CUDA_VISIBLE_DEVICES` names them."""
    trainer: list[str]
    served: dict[str, list[list[str]]]
    """Each `[teacher]` and `[judge]` replica's devices, by name (`RLConfig.served_models`)."""

    def env(self, devices: list[str]) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": ",".join(devices)}


def visible_gpus() -> list[str]:
    """The GPUs this process may use: `CUDA_VISIBLE_DEVICES` when set (read as CUDA does: up to
    the first invalid entry, so "-1" or "" hides every GPU), else all CUDA devices."""
    if (visible := os.environ.get("CUDA_VISIBLE_DEVICES")) is not None:
        devices = (device.strip() for device in visible.split(","))
        return list(itertools.takewhile(lambda d: d and not d.startswith("-"), devices))
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def place_gpus(config: RLConfig, visible: list[str]) -> GpuPlacement | None:
    """The placement of `config`'s processes on `visible` GPUs; None on a machine without GPUs.
    Raises ValueError naming the field when the placement cannot work."""
    if not visible:
        return None
    per_replica = config.inference.tensor_parallel_size
    replicas = 0 if config.uses_external_inference else config.inference.replicas
    ranks = config.trainer.nproc_per_node
    inference = _indices("inference.gpus", config.inference.gpus, replicas * per_replica, visible, first=0)
    trainer = _indices("trainer.gpus", config.trainer.gpus, ranks, visible, first=len(inference))
    served, first = {}, len(inference) + len(trainer)
    for name, section in config.served_models().items():
        served[name] = _indices(f"{name}.gpus", section.gpus, section.replicas * section.tensor_parallel_size, visible,
                                first=first)
        first += len(served[name])
    if config.weights.type == "nccl" and (shared := sorted(set(inference) & set(trainer))):
        raise ValueError(
            f"inference.gpus / trainer.gpus: GPU {', '.join(visible[i] for i in shared)} would hold both an inference "
            f"worker and a trainer rank, and weights.type 'nccl' cannot form a group of two ranks on one GPU; "
            f"{len(visible)} GPUs are visible, {replicas * per_replica + ranks} are needed apart "
            "(inference.replicas x inference.tensor_parallel_size + trainer.nproc_per_node)"
        )
    for name, indices in served.items():
        section = config.served_models()[name]
        if (shared := sorted(set(inference) & set(indices))) and (
                claimed := config.inference.gpu_memory_utilization + section.gpu_memory_utilization) > 1:
            raise ValueError(
                f"{name}.gpus: GPU {', '.join(visible[i] for i in shared)} would serve both inference and the "
                f"{name}, whose vLLM engines claim {claimed:g} of its memory together "
                f"(inference.gpu_memory_utilization + {name}.gpu_memory_utilization); lower them or place "
                f"the {name} on GPUs of its own"
            )
    return GpuPlacement(
        inference=_per_replica(inference, per_replica, visible),
        trainer=[visible[i] for i in trainer],
        served={name: _per_replica(indices, config.served_models()[name].tensor_parallel_size, visible)
                for name, indices in served.items()},
    )


def _per_replica(indices: list[int], per_replica: int, visible: list[str]) -> list[list[str]]:
    """`indices` cut into each replica's devices, by name."""
    return [[visible[i] for i in indices[r : r + per_replica]] for r in range(0, len(indices), per_replica)]


def _indices(field: str, given: list[int] | None, count: int, visible: list[str], first: int) -> list[int]:
    """`given` checked against `count` and the visible GPUs; when None, `count` GPUs from the
    `first`-th on, wrapping around (shared) when there are too few."""
    if given is None:
        return [(first + i) % len(visible) for i in range(count)]
    if len(given) != count:
        raise ValueError(f"{field}: {len(given)} GPUs given, {count} needed")
    if bad := [i for i in given if not 0 <= i < len(visible)]:
        raise ValueError(f"{field}: {bad} are not among the {len(visible)} visible GPUs (0-{len(visible) - 1})")
    return list(given)


def trainer_share(config: RLConfig) -> float:
    """The fraction of its GPU the trainer's first rank gets on a machine with the GPUs the
    config asks for: 1, unless inference, teacher or judge replicas share that GPU (`trainer.gpus` and
    `inference.gpus` naming the same one: one GPU for everything), then what their
    `gpu_memory_utilization` leaves."""
    sections = [config.inference, *config.served_models().values()]
    explicit = [i for given in (*(s.gpus for s in sections), config.trainer.gpus) for i in given or []]
    count = sum(s.replicas * s.tensor_parallel_size for s in sections) + config.trainer.nproc_per_node
    placement = place_gpus(config, [str(i) for i in range(max([count, *(i + 1 for i in explicit)]))])
    servers = [(config.inference, placement.inference),
               *((section, placement.served[name]) for name, section in config.served_models().items())]
    claimed = sum(section.gpu_memory_utilization for section, replicas in servers for devices in replicas
                  if placement.trainer[0] in devices)
    return max(0.0, 1.0 - claimed)
