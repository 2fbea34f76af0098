"""Bytes per weight update: LoRA adapters (trainer.lora) against the full model.

    python benchmarks/lora_weights.py [--ranks 8 16]

For the reverse-text tiny model (`rlkube model init`'s defaults) it builds the real snapshots
(`Snapshot.files()`, what the gRPC transport sends and the storage transport writes, in the
trainer's float32) and sums their bytes; for a Qwen2.5-0.5B-shaped model (24 layers, hidden
896, MLP 4864, 14 query / 2 KV heads of 64, vocabulary 151936, tied embeddings; Qwen3-style
q/k norms, no qkv bias) it computes
the same from the shapes, in float32 and bfloat16 (`weights.dtype`).
"""

import argparse
import tempfile
from pathlib import Path

QWEN_05B = {"layers": 24, "hidden": 896, "intermediate": 4864, "heads": 14, "kv_heads": 2, "head_dim": 64, "vocab": 151936}


def projection_shapes(c: dict) -> dict[str, tuple[int, int]]:
    """(in, out) of each projection LoRA targets by default, in one decoder layer."""
    q, kv = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    h, m = c["hidden"], c["intermediate"]
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, m), "up_proj": (h, m), "down_proj": (m, h)}


def qwen_parameters(c: dict, rank: int | None) -> int:
    """Parameters a full update (rank None) or a rank-`rank` adapter update carries."""
    shapes = projection_shapes(c).values()
    if rank is not None:
        return c["layers"] * sum(rank * (i + o) for i, o in shapes)
    norms = 2 * c["hidden"] + 2 * c["head_dim"]  # two RMSNorms, q_norm and k_norm (Qwen3)
    return c["vocab"] * c["hidden"] + c["hidden"] + c["layers"] * (sum(i * o for i, o in shapes) + norms)


def tiny_snapshot_bytes(ranks: list[int]) -> dict[str, int]:
    """Bytes of the real snapshots of the tiny model: full, and adapters of each rank."""
    import torch
    from rlkube.config import LoraConfig
    from rlkube.models.lora_math import PEFT_PREFIX
    from rlkube.models.tiny import init_tiny_model
    from rlkube.trainer.lora import adapter_config
    from rlkube.transport.weights_snapshot import Snapshot
    from safetensors.torch import load_file

    model_dir = init_tiny_model(Path(tempfile.mkdtemp()) / "model")
    state = load_file(model_dir / "model.safetensors")
    sizes = {"full": sum(map(len, Snapshot(state, 1, model_dir).files().values()))}
    for rank in ranks:
        lora = LoraConfig(rank=rank)
        adapter = {}
        for name, weight in state.items():
            module = name.removesuffix(".weight")
            if module.rpartition(".")[2] in lora.target_modules:
                adapter[f"{PEFT_PREFIX}{module}.lora_A.weight"] = torch.zeros(rank, weight.shape[1])
                adapter[f"{PEFT_PREFIX}{module}.lora_B.weight"] = torch.zeros(weight.shape[0], rank)
        files = Snapshot(adapter, 1, model_dir, adapter_config=adapter_config(lora, str(model_dir))).files()
        sizes[f"lora r={rank}"] = sum(map(len, files.values()))
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 16])
    args = parser.parse_args()
    tiny = tiny_snapshot_bytes(args.ranks)
    print("reverse-text tiny model (4 layers, hidden 256), snapshot bytes per update (float32):")
    for name, size in tiny.items():
        print(f"  {name:<10} {size:>12,} B  ({size / tiny['full']:.1%} of full)")
    print("Qwen2.5-0.5B-shaped model, tensor bytes per update (from shapes):")
    full = qwen_parameters(QWEN_05B, None)
    for name, rank in [("full", None), *((f"lora r={r}", r) for r in args.ranks)]:
        params = qwen_parameters(QWEN_05B, rank)
        print(f"  {name:<10} {params:>12,} params  {4 * params / 1e6:>9.1f} MB fp32  "
              f"{2 * params / 1e6:>8.1f} MB bf16  ({params / full:.2%} of full)")


if __name__ == "__main__":
    main()
