"""Helpers for tests that load other weights into the shared inference server."""

from pathlib import Path

import torch


def original_state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(Path(model_dir) / "model.safetensors")


def perturbed_state_dict(model_dir: Path, seed: int, scale: float = 0.5) -> dict[str, torch.Tensor]:
    """The model's weights plus seeded noise: different enough to change greedy outputs."""
    generator = torch.Generator().manual_seed(seed)
    return {
        name: tensor + scale * torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype)
        for name, tensor in original_state_dict(model_dir).items()
    }
