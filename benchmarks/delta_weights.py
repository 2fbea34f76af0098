"""Bytes per policy update with `weights.delta` against full snapshots, under the real optimizer.

    python benchmarks/delta_weights.py [--models reverse-text Qwen3-0.6B] [--steps 4] [--tokens 32]
    python benchmarks/delta_weights.py --tiny      # a 2-layer model, 2 steps: what CI runs

Each model is a randomly initialised Qwen3 built from its config on CPU (no download) with
float32 master weights, trained by rlkube's AdamW (`rlkube.trainer.optim.build_optimizer`:
betas 0.9/0.999, weight decay 0.01, gradients clipped at norm 1.0) at the model's learning rate.
A step is the forward and backward of the next-token loss on one row of `--tokens` random
tokens, then the optimizer step; the new policy is cast to the wire dtype and published, into
a temporary directory on local disk, by the real publishers: a full `StoragePublisher`, and a
`DeltaPublisher` over one (`weights.delta`: after the initial policy's full snapshot a delta,
or the full snapshot where the delta would take half its bytes or more: `FULL_AT`). Printed
per step as it is taken: the tensor bytes of a full snapshot (a tied output head is the
embedding, and is published once) and of what the delta publisher sent and as what, the share
of elements whose bits changed, the ratio, and the seconds of the training step and of each
publish (the full one, and the delta publisher's with its compare and encoding).

- `reverse-text`: the example's model (`rlkube model init`: 4 layers, hidden 256, ~2.4M
  parameters) at examples/reverse_text/rl.toml's peak lr 2e-4, on the float32 wire its CPU
  trainer uses (`weights.dtype = auto`) and on a bfloat16 one;
- `Qwen3-0.6B`: that shape (hidden 1024, 28 layers, vocabulary 151936, tied) at lr 1e-6 on a
  bfloat16 wire: float32 weights, gradients and AdamW state are ~10 GB (peak resident 12.6 GB
  with the two publishers), and a step took 5-7 s on the 2-core VM (docs/inference.md).

What changes is decided by how far a step moves a weight against the spacing of its wire dtype
(bfloat16: 8 significant bits), so a randomly initialised model stands in for a trained one of
the same shape as far as its weights' magnitudes match (Qwen3's initialiser: std 0.02).
"""

import argparse
import sys
import time

QWEN3_06B = {"vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
             "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": True}
TINY = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "tie_word_embeddings": True}
MODELS = {  # name: (model shape, None: the example's own model; peak lr; wire dtypes)
    "reverse-text": (None, 2e-4, ("float32", "bfloat16")),
    "Qwen3-0.6B": (QWEN3_06B, 1e-6, ("bfloat16",)),
    "tiny": (TINY, 1e-6, ("bfloat16",)),
}


def build(shape: dict | None):
    """The model, float32: `shape` from a `Qwen3Config`, or the reverse-text example's."""
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    if shape is not None:
        return Qwen3ForCausalLM(Qwen3Config(**shape))
    from rlkube.models.tiny import init_tiny_model

    with tempfile.TemporaryDirectory(prefix="rlkube-bench-delta-") as tmp:
        return AutoModelForCausalLM.from_pretrained(init_tiny_model(tmp), dtype=torch.float32)


def changed(base, new) -> int:
    """Elements whose bits differ."""
    import torch

    def bits(t):
        return t.reshape(-1).view({2: torch.int16, 4: torch.int32}[t.element_size()])

    return int(torch.ne(bits(new), bits(base)).sum())


class Wire:
    """The policy as the trainer publishes it in one wire dtype, written each step by a full
    `StoragePublisher` and by a `DeltaPublisher` over one (`weights.delta`, under `root`), whose
    first publish, the initial policy, is its full snapshot."""

    def __init__(self, model, dtype, root: str):
        from rlkube.transport.weights import StoragePublisher
        from rlkube.transport.weights_delta import DeltaPublisher

        self.model, self.dtype = model, dtype
        model_dir = f"{root}/model"
        model.config.save_pretrained(model_dir)
        self.full = StoragePublisher(f"{root}/full", model_dir, keep_last=1)
        self.delta = DeltaPublisher(StoragePublisher(f"{root}/delta", model_dir, keep_last=1), model_dir,
                                    full_every=2**31)
        self.delta.publish(self._policy(), 0)

    def _policy(self) -> dict:
        """name: tensor in the wire dtype, as the trainer publishes them: a tied head not again."""
        seen, policy = set(), {}
        for name, tensor in self.model.state_dict().items():
            if tensor.data_ptr() not in seen:
                seen.add(tensor.data_ptr())
                policy[name] = tensor.detach().to(self.dtype, copy=True)
        return policy

    def publish(self, step: int) -> dict:
        from rlkube.transport.weights_delta import bytes_of

        policy = self._policy()
        moved = sum(changed(self.delta.base[name], tensor) for name, tensor in policy.items())
        start = time.perf_counter()
        self.full.publish(policy, step)
        full_s, start = time.perf_counter() - start, time.perf_counter()
        self.delta.publish(policy, step)
        delta_s, full = time.perf_counter() - start, bytes_of(policy)
        sent, as_full = self.delta.published_bytes(policy), self.delta.deltas_since_full == 0
        return {"full": full, "sent": sent, "as": "full" if as_full else "delta",
                "changed": moved / sum(t.numel() for t in policy.values()), "full_s": full_s, "delta_s": delta_s}


def measure(name: str, steps: int, tokens: int) -> None:
    """Train `steps` steps and print each step's publish in each wire dtype as it happens."""
    import shutil
    import tempfile

    import torch
    from rlkube.config.trainer import OptimizerConfig
    from rlkube.trainer.optim import build_optimizer

    shape, lr, wires = MODELS[name]
    model = build(shape)
    optimizer = build_optimizer(model, OptimizerConfig(lr=lr))
    params = sum(p.numel() for p in model.parameters())
    print(f"{name}: {params / 1e6:.1f}M parameters, lr {lr:g}, wire {'/'.join(wires)}", file=sys.stderr, flush=True)
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    root = tempfile.mkdtemp(prefix="rlkube-bench-delta-")
    published = {wire: Wire(model, getattr(torch, wire), f"{root}/{wire}") for wire in wires}
    for step in range(1, steps + 1):
        start = time.perf_counter()
        ids = torch.randint(vocab, (1, tokens), generator=generator)
        model(input_ids=ids, labels=ids).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        trained = time.perf_counter() - start
        for wire, policy in published.items():
            r = policy.publish(step)
            print(f"{name:<12} {wire:<9} {step:>4} {r['full'] / 1e6:>9.2f} {r['sent'] / 1e6:>9.3f} {r['as']:>5} "
                  f"{100 * r['changed']:>7.2f}% {r['full'] / max(r['sent'], 1):>10.1f}x "
                  f"{trained:>7.1f} {r['full_s']:>7.3f} {r['delta_s']:>8.3f}", flush=True)
    shutil.rmtree(root)


HEADER = (f"{'model':<12} {'wire':<9} {'step':>4} {'full MB':>9} {'delta MB':>9} {'as':>5} {'changed':>8} "
          f"{'fewer bytes':>11} {'train s':>7} {'full s':>7} {'delta s':>8}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=["reverse-text", "Qwen3-0.6B"])
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per model, each published as a delta")
    parser.add_argument("--tokens", type=int, default=32, help="tokens of the one row each step trains on")
    parser.add_argument("--tiny", action="store_true", help="the tiny model for 2 steps (CI)")
    args = parser.parse_args()
    models, steps = (["tiny"], 2) if args.tiny else (args.models, args.steps)
    print(HEADER, flush=True)
    for name in models:
        measure(name, steps, args.tokens)


if __name__ == "__main__":
    main()
