"""LoRA adapters in PEFT's names, as plain tensors: which keys are adapters, and the merge
`W + s * B @ A`.

Shared by the trainer (rlkube.trainer.lora: its adapters and the merged export) and inference
(rlkube.inference.worker: merging a published adapter into the served base weights), so both
compute the same merge. PEFT's layout: keys `base_model.model.<module>.lora_A.weight` (r x in)
and `.lora_B.weight` (out x r), and `s = lora_alpha / r` from `adapter_config.json`.
"""

import torch

PEFT_PREFIX = "base_model.model."
LORA_A, LORA_B = ".lora_A.weight", ".lora_B.weight"


def is_adapter_key(name: str) -> bool:
    return name.endswith((LORA_A, LORA_B))


def merged_weights(base: dict[str, torch.Tensor], adapter: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """`W + scaling * B @ A` for each adapted module's base weight `W` (in `base` under its
    model name, `adapter` in PEFT's names), in `W`'s dtype, computed in float32."""
    merged = {}
    for module in adapted_modules(adapter):
        a, b = adapter[PEFT_PREFIX + module + LORA_A], adapter[PEFT_PREFIX + module + LORA_B]
        weight = base[f"{module}.weight"]
        merged[f"{module}.weight"] = (weight.float() + scaling * (b.float() @ a.float())).to(weight.dtype)
    return merged


def adapted_modules(adapter: dict[str, torch.Tensor]) -> list[str]:
    """The model names of the modules an adapter in PEFT's names adapts (`model.layers.0.self_attn.q_proj`)."""
    return sorted(key.removeprefix(PEFT_PREFIX).removesuffix(LORA_A) for key in adapter if key.endswith(LORA_A))


def merge_adapters(state_dict: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """A LoRA model's full state dict (base weights and adapters under model names) as the
    plain model's: each adapted weight merged, the adapters dropped."""
    base = {name: tensor for name, tensor in state_dict.items() if not is_adapter_key(name)}
    adapter = {PEFT_PREFIX + name: tensor for name, tensor in state_dict.items() if is_adapter_key(name)}
    return base | merged_weights(base, adapter, scaling)


def scaling_of(config: dict) -> float:
    """`alpha / rank` of a PEFT adapter config."""
    return config["lora_alpha"] / config["r"]
