"""rlkube's vLLM general plugin: a shorter busy-wait on vLLM's shared-memory queues.

vLLM's engine core hands every scheduler step to its worker over a shared-memory ring buffer
(`MessageQueue`). A reader that read within the last `busy_loop_s` (vLLM: 1 s) spins on the
buffer with `sched_yield` instead of sleeping on the queue's ZeroMQ notification. On a GPU box
that spin costs a core nobody else wants. On CPU it takes the core the trainer and the
orchestrator need: in an RL run on 2 cores the worker spent 57% of its samples spinning, and
with a 5 ms spin the whole 90-step reverse-text run took 442 s instead of 550-574 s
(docs/inference.md).

A reader that sleeps relies on the notification, and vLLM re-reads the buffer only every 5 s
when one is missed (with no spin at all, batches came ~10 s late). So the recheck interval is
shortened with the spin: a missed notification then costs at most that long.

vLLM loads `vllm.general_plugins` entry points in every process it starts (API server, engine
core, workers), so this reaches the readers in all of them. It acts only when `rlkube
inference` set `SPIN_ENV` (`inference.shm_spin_ms`); any other vLLM on the machine is left as
it is.
"""

import os

SPIN_ENV = "RLKUBE_VLLM_SHM_SPIN_MS"
MIN_RECHECK_MS = 10


def register() -> None:
    """Entry point of the `vllm.general_plugins` group."""
    value = os.environ.get(SPIN_ENV)
    if value is None:
        return
    spin_ms = float(value)
    from vllm.distributed.device_communicators import shm_broadcast

    # `busy_loop_s` is an instance attribute set in `SpinCondition.__init__`, and queues may
    # exist before plugins load: a class-level data descriptor takes precedence over the
    # instance attribute, for queues created before and after. The setter drops vLLM's value.
    shm_broadcast.SpinCondition.busy_loop_s = property(lambda self: spin_ms / 1000, lambda self, _: None)
    # Read by every wait, so this takes effect at once.
    shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS = max(MIN_RECHECK_MS, int(spin_ms))
