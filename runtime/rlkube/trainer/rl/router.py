"""Mixture-of-experts routing in the RL trainer: what each step routed, and router replay.

An MoE layer's router picks each token's top-k experts. Inference and trainer compute the
router's logits with different kernels, so near-ties can go to different experts, and the
trainer then scores a token with other weights than the ones that sampled it: a source of
mismatch KL that grows with the number of MoE layers. Router replay makes the trainer use the
experts inference chose (`loss.router_replay`): each router's top-k indices are replaced by
inference's for every token that has them, and the gate weights are recomputed from the
trainer's own router probabilities of those experts, so the router still gets a gradient.

The routers are the modules the model itself declares as producing router logits
(transformers' `_can_record_outputs["router_logits"]`: Qwen3-MoE's `Qwen3MoeTopKRouter`,
returning `(logits, top-k weights, top-k indices)` of a softmax top-k), hooked in model order.

Inference's choices arrive per micro-batch as `routed_experts`, int16 [rows, seq_len,
decoder layers, top_k] aligned with `input_ids` (the experts vLLM used at each position, returned
with `inference.return_routed_experts` and carried by the orchestrator's samples), -1 where it
has none (padding, a sample whose answer carried none).

Each step logs, over the positions of the tokens trained on, all MoE layers together:
`router/load/expert_<e>` (the fraction of routed token slots that went to expert e),
`router/load_max`, `router/load_min` (1 / experts when balanced), `router/load_entropy`
(normalized: 1 when balanced), `router/aux_loss` (the Switch-Transformer balance loss that
transformers' `load_balancing_loss_func` computes, on the experts actually used; logged, not
trained on) and, when the batch carries inference's choices, `router/mismatch/fraction` (the
fraction of token-layer pairs whose top-k experts differ between the trainer's own routing and
inference's).
"""

import math
import re
from contextlib import contextmanager

import torch
from torch import Tensor, nn

_PROB = "router/prob/expert_"
"""Per-expert mean router probability: an intermediate share, summed over micro-batches and
ranks, then folded into `router/aux_loss`."""


def find_routers(model: nn.Module) -> dict[int, nn.Module]:
    """The model's MoE routers by the index of their decoder layer, in layer order; empty for a
    dense model. Inference's routing has a row per decoder layer, dense ones included (zeros
    there): a model with dense layers between its MoE layers (`mlp_only_layers`) is read by
    layer index, not by router count."""
    recorder = getattr(model, "_can_record_outputs", None) or {}
    router_class = getattr(recorder.get("router_logits"), "target_class", None)
    if router_class is None:
        return {}
    routers = [(name, module) for name, module in model.named_modules() if isinstance(module, router_class)]
    layers = [_LAYER.search(name) for name, _ in routers]
    if not all(layers):  # no `layers.N` in the names: one router per layer, in order
        return dict(enumerate(module for _, module in routers))
    return {int(layer.group(1)): module for layer, (_, module) in zip(layers, routers, strict=True)}


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class RouterProbe:
    """Forward hooks on every router: replay inference's experts (optional) and record each
    micro-batch's routing statistics. Outside `micro_batch` the hooks change nothing."""

    def __init__(self, routers: dict[int, nn.Module], replay: bool):
        self.routers, self.replay = list(routers.values()), replay
        self.num_experts, self.top_k = routers[0].num_experts, routers[0].top_k
        self.batch: dict | None = None
        self.records: dict[int, dict[str, Tensor]] = {}
        self.hooks = [router.register_forward_hook(self._hook(layer)) for layer, router in routers.items()]

    @classmethod
    def attach(cls, model: nn.Module, replay: bool) -> "RouterProbe | None":
        """A probe on `model`'s routers; None for a dense model (replay then refused)."""
        routers = find_routers(model)
        if not routers:
            if replay:
                raise ValueError(f"loss.router_replay: {type(model).__name__} has no mixture-of-experts router")
            return None
        return cls(routers, replay)

    def detach(self) -> None:
        """Remove the hooks: a pool's run that leaves (rlkube.trainer.rl.multi_run) takes its
        probe off the routers the other runs' probes stay on."""
        for hook in self.hooks:
            hook.remove()

    @contextmanager
    def micro_batch(self, batch: dict):
        """Route `batch`'s forward and backward (an activation-checkpointed layer recomputes
        its forward in backward, and must route the same way)."""
        if self.replay and batch.get("routed_experts") is None:
            raise ValueError("loss.router_replay: this batch carries no routed_experts from inference")
        self.batch, self.records = batch, {}
        try:
            yield
        finally:
            self.batch = None

    def _hook(self, layer: int):
        def hook(module: nn.Module, args, output):
            if self.batch is None:
                return output
            logits, weights, chosen = output
            given = self.batch.get("routed_experts")
            given = None if given is None else given[..., layer, :].reshape(-1, self.top_k).to(chosen.device, chosen.dtype)
            own = chosen
            if self.replay:
                keep = (given >= 0).all(-1, keepdim=True)
                chosen = torch.where(keep, given, chosen)
                weights = torch.softmax(logits, dim=-1, dtype=torch.float).gather(-1, chosen)
                if getattr(module, "norm_topk_prob", False):
                    weights = weights / weights.sum(-1, keepdim=True)
                weights = weights.to(logits.dtype)
            self.records[layer] = self._record(logits.detach(), chosen, own, given)
            return logits, weights, chosen

        return hook

    def _record(self, logits: Tensor, chosen: Tensor, own: Tensor, given: Tensor | None) -> dict[str, Tensor]:
        """One layer's sums over the loss tokens' positions."""
        mask = self.batch["loss_mask"].reshape(-1).to(logits.device)
        slots = torch.bincount(chosen[mask].reshape(-1), minlength=self.num_experts).float()
        record = {"slots": slots, "probs": torch.softmax(logits[mask].float(), dim=-1).sum(0)}
        if given is not None:
            known = mask & (given >= 0).all(-1)
            differ = own.sort(-1).values != given.sort(-1).values
            record["mismatch"] = (differ.any(-1) & known).sum().float()
        return record

    def stats(self, global_loss_tokens: int) -> dict[str, Tensor]:
        """The micro-batch's shares of the step's routing statistics (divided by the step's
        loss-token count and the number of MoE layers, so they sum over micro-batches and
        ranks)."""
        denom = max(int(global_loss_tokens), 1) * len(self.routers)
        records = list(self.records.values())
        slots = sum(r["slots"] for r in records) / (denom * self.top_k)
        probs = sum(r["probs"] for r in records) / denom
        stats = {f"router/load/expert_{e}": slots[e] for e in range(self.num_experts)}
        stats |= {f"{_PROB}{e}": probs[e] for e in range(self.num_experts)}
        if all("mismatch" in r for r in records):
            stats["router/mismatch/fraction"] = sum(r["mismatch"] for r in records) / denom
        return stats

    def summarize(self, stats: dict[str, float]) -> dict[str, float]:
        """The step's summaries of its reduced statistics; the intermediates dropped."""
        load = [stats[f"router/load/expert_{e}"] for e in range(self.num_experts)]
        probs = [stats.pop(f"{_PROB}{e}") for e in range(self.num_experts)]
        total = sum(load) or 1.0
        shares = [x / total for x in load]
        entropy = -sum(p * math.log(p) for p in shares if p > 0)
        return stats | {
            "router/load_max": max(shares),
            "router/load_min": min(shares),
            "router/load_entropy": entropy / math.log(self.num_experts),
            "router/aux_loss": self.num_experts * sum(self.top_k * s * p for s, p in zip(shares, probs, strict=True)),
        }
