"""Orchestrator rollouts/s against an instant fake inference server.

    python benchmarks/orchestrator.py [--steps 4] [--batch-size 64] [--group-size 8] [--max-concurrent 64]

Two figures, both with the orchestrator's real scheduler, advantages and packing:
- `verifiers path`: the real reverse-text verifiers environment and verifiers' token-in/
  token-out training client (renderer + HTTP to `/inference/v1/generate`) against a fake
  server that answers instantly: the orchestrator-side cost of a rollout.
- `orchestration only`: rollouts that complete instantly in-process: the scheduler/advantage/
  packing overhead alone.
The clock is opened wide (`async_level = steps`) so no policy update is waited for.
"""

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.orchestrator fakes

from rlkube.config import AdvantageConfig, ClientConfig, EnvConfig, SamplingConfig
from rlkube.orchestrator.advantage import make_advantage_fn
from rlkube.orchestrator.buffer import RolloutBuffer
from rlkube.orchestrator.clock import PolicyClock
from rlkube.orchestrator.packing import pack_batch
from rlkube.orchestrator.scheduler import Scheduler

from tests.orchestrator.fake_inference import FakeInference, FakeInferenceThread
from tests.orchestrator.test_orchestrator import FakeRunner


async def run_scheduler(runners, run_group, args) -> float:
    """Seconds to cut `args.steps` batches (and pack each for 2 ranks)."""
    batches = []
    scheduler = Scheduler(
        runners, [1.0] * len(runners), run_group, PolicyClock(async_level=args.steps),
        RolloutBuffer(args.batch_size, max_off_policy_steps=args.steps), make_advantage_fn(AdvantageConfig(), 64),
        args.group_size, args.steps, max_groups_in_flight=max(1, args.max_concurrent // args.group_size),
        on_batch=batches.append,
    )
    start = time.perf_counter()
    await scheduler.run()
    for batch in batches:
        pack_batch(batch.samples(True), 2048, world_size=2)
    return time.perf_counter() - start


def group_runner(pool, group_size):
    async def run_group(runner, example_id, task):
        async def one():
            async with pool.slot():
                return await runner.rollout(task, example_id, pool.context_for(runner.name, example_id), 1.0, lambda: 0)

        return list(await asyncio.gather(*(one() for _ in range(group_size))))

    return run_group


async def verifiers_path(args, model: Path, url: str) -> float:
    from rlkube.envs import load_env
    from rlkube.orchestrator.inference import InferencePool
    from rlkube.orchestrator.rollouts import EnvRunner

    env_config = EnvConfig(args={"num_examples": 1000})
    runner = EnvRunner(env_config, load_env(env_config), seed=0)
    pool = InferencePool(ClientConfig(base_urls=[url], max_concurrent=args.max_concurrent), str(model), str(model), SamplingConfig(max_tokens=64))
    async with runner.env.serving():
        return await run_scheduler([runner], group_runner(pool, args.group_size), args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-concurrent", type=int, default=64)
    args = parser.parse_args()
    rollouts = args.steps * args.batch_size

    class InstantPool:
        def slot(self):
            import contextlib

            return contextlib.nullcontext()

        def context_for(self, env, example_id):
            return None

    took = asyncio.run(run_scheduler([FakeRunner()], group_runner(InstantPool(), args.group_size), args))
    print(f"orchestration only: {rollouts} rollouts in {took:.2f} s = {rollouts / took:.0f} rollouts/s")

    from rlkube.models.tiny import init_tiny_model
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        model = init_tiny_model(Path(tmp) / "model")
        stop = AutoTokenizer.from_pretrained(model).convert_tokens_to_ids("<|im_end|>")
        with FakeInferenceThread(FakeInference(str(model), stop, completion_len=16)) as server:
            took = asyncio.run(verifiers_path(args, model, server.url))
    print(f"verifiers path (reverse_text env, training client, instant fake server): "
          f"{rollouts} rollouts in {took:.1f} s = {rollouts / took:.1f} rollouts/s")


if __name__ == "__main__":
    main()
