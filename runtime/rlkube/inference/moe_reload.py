"""Expert weights reloaded in place on vLLM's CPU backend: prepacked again, as at startup.

vLLM 0.32's CPU fused-MoE kernel (`CPUUnquantizedExperts`) reads each layer's experts in its own
grouped-gemm layout: at the first load, `process_weights_after_loading` of the layer's
`UnquantizedFusedMoEMethod` ends with `moe_kernel.fused_experts.process_weights_after_loading`,
which repacks `w13_weight` and `w2_weight` (`cpu_prepack_moe_weight`, same shape, other
order). On a weight update (`reload_weights`, `moe_kernel` already built) that call is skipped
(`_setup_kernel`: "Setup moe kernel only on the first call"), so the new weights land in the
kernel's tensors in checkpoint order and every MoE layer computes with scrambled experts: the
served log-probs move, but not to the new policy's (tests/inference/test_moe_weights.py).

`prepacked_on_reload(model)` adds the missing repack for the duration of one reload. vLLM runs
`process_weights_after_loading` only for the layers the reload loaded, on the fresh tensors
it loaded them into, before copying those into the kernel's storage: so exactly the reloaded
experts are packed, once, and the kernel keeps its tensors (no recompilation).
"""

import contextlib
from collections.abc import Iterator

import torch


def _cpu_moe_methods(model: torch.nn.Module) -> list:
    """The fused-MoE methods of `model` whose kernel is vLLM's unquantized CPU one, each once."""
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    methods = {}
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        experts = getattr(getattr(method, "moe_kernel", None), "fused_experts", None)
        if isinstance(experts, CPUUnquantizedExperts):
            methods[id(method)] = method
    return list(methods.values())


@contextlib.contextmanager
def prepacked_on_reload(model: torch.nn.Module) -> Iterator[None]:
    """Within: each MoE layer vLLM processes after loading it is also prepacked for the CPU kernel."""
    methods = _cpu_moe_methods(model)
    for method in methods:
        process, experts = method.process_weights_after_loading, method.moe_kernel.fused_experts

        def process_and_prepack(layer, process=process, experts=experts):
            process(layer)
            experts.process_weights_after_loading(layer)

        method.process_weights_after_loading = process_and_prepack
    try:
        yield
    finally:
        for method in methods:
            del method.process_weights_after_loading  # the class's again
