"""Orchestrator CPU per rollout: verifiers' full path against rlkube's lean path, in one run.

    python benchmarks/orchestrator.py [--steps 4] [--batch-size 64] [--group-size 8] [--max-concurrent 64] [--rounds 3]

The real reverse-text environment runs through the orchestrator's scheduler, advantages and
packing against `benchmarks/fake_engine.py`, an instant stand-in for vLLM's token-in/token-out
route in its own process, so this process's CPU clock (`time.process_time`: every thread of
the orchestrator, the renderer's included) counts only the orchestrator. Rows:
- `verifiers path (before)`: the chat harness posts to verifiers' interception server over local
  HTTP, whose training client calls the engine, with pydantic asking `inspect.signature` about
  every default factory (rlkube before the lean path);
- `verifiers path + pydantic memo`: the same with `rlkube.envs.pydantic_defaults` installed;
- `lean path (after)`: the harness calls the interception handler in-process and the engine over
  one aiohttp pool per replica (`rlkube.envs.in_process`), with the memo;
- `orchestration only`: rollouts that complete instantly in-process (scheduler, advantages and
  packing alone).
The paths alternate for `--rounds` rounds after a warm-up; each row is its path's best round
(other processes on a loaded machine only ever add CPU time). The clock is opened wide
(`async_level = steps`), so no policy update is waited for.
"""

import argparse
import asyncio
import contextlib
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rlkube.config import AdvantageConfig, ClientConfig, EnvConfig, SamplingConfig
from rlkube.orchestrator.advantage import make_advantage_fn
from rlkube.orchestrator.buffer import RolloutBuffer
from rlkube.orchestrator.clock import PolicyClock
from rlkube.orchestrator.packing import pack_batch
from rlkube.orchestrator.rollouts import TaskSampler
from rlkube.orchestrator.scheduler import Scheduler
from rlkube.orchestrator.types import Rollout, Sample

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")


class InstantRunner:
    """Rollouts that complete at once: task i's j-th rollout scores (i + j) % 2 (mixed groups)."""

    name = "instant"

    def __init__(self):
        self.config, self.sampler, self.count = EnvConfig(id=self.name), TaskSampler(100, seed=0), 0

    def next_task(self):
        i = self.sampler.next()
        return str(i), i

    async def rollout(self, task, example_id, ctx, temperature, policy_version):
        await asyncio.sleep(0)
        self.count += 1
        sample = Sample([1, 2, 3, 4 + task], [False, False, True, True], [0.0, 0.0, -0.1, -0.2], temperature)
        return Rollout(self.name, example_id, float((task + self.count) % 2), [sample], 0, 0)


class NoPool:
    def slot(self):
        return contextlib.nullcontext()

    def context_for(self, env, example_id):
        return None


async def run_scheduler(runner, pool, args) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, errored rollouts) to cut `args.steps` batches and pack each for 2 ranks."""
    batches = []

    async def run_group(runner, example_id, task):
        async def one():
            async with pool.slot():
                return await runner.rollout(task, example_id, pool.context_for(runner.name, example_id), 1.0, lambda: 0)

        return list(await asyncio.gather(*(one() for _ in range(args.group_size))))

    scheduler = Scheduler(
        [runner], [1.0], run_group, PolicyClock(async_level=args.steps),
        RolloutBuffer(args.batch_size, max_off_policy_steps=args.steps), make_advantage_fn(AdvantageConfig(), 64),
        args.group_size, args.steps, max_groups_in_flight=max(1, args.max_concurrent // args.group_size),
        on_batch=batches.append,
    )
    cpu, wall = time.process_time(), time.perf_counter()
    await scheduler.run()
    for batch in batches:
        pack_batch(batch.samples(True), 2048, world_size=2)
    errors = sum(r.error is not None for b in batches for r in b.rollouts)
    return time.process_time() - cpu, time.perf_counter() - wall, errors


async def env_path(row: str, args, model: Path, url: str) -> tuple[float, float, int]:
    from pydantic._internal import _fields
    from rlkube.envs import load_env, pydantic_defaults
    from rlkube.orchestrator.inference import InferencePool
    from rlkube.orchestrator.rollouts import EnvRunner

    env_config = EnvConfig(args={"num_examples": 1000}, rollout_path="lean" if row == "lean" else "verifiers")
    runner = EnvRunner(env_config, load_env(env_config), seed=0)  # load_env installs the memo
    if row == "before":  # pydantic's own check again, as before the memo
        _fields.takes_validated_data_argument = pydantic_defaults._takes_validated_data
    pool = InferencePool(ClientConfig(base_urls=[url], max_concurrent=args.max_concurrent), str(model), str(model), SamplingConfig(max_tokens=64))
    async with runner.serving():
        warm = argparse.Namespace(**{**vars(args), "steps": 1})
        await run_scheduler(runner, pool, warm)  # tokenizer, connections, caches
        return await run_scheduler(runner, pool, args)


@contextlib.contextmanager
def fake_engine(model: Path, stop_token_id: int):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, str(FAKE_ENGINE), "--port", str(port), "--stop-token-id", str(stop_token_id), "--model", str(model)]
    server = subprocess.Popen(argv)
    try:
        for _ in range(300):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-concurrent", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rollouts = args.steps * args.batch_size

    from rlkube.models.tiny import init_tiny_model
    from transformers import AutoTokenizer

    runs: dict[str, list[tuple[float, float, int]]] = {"before": [], "memo": [], "lean": []}
    with tempfile.TemporaryDirectory() as tmp:
        model = init_tiny_model(Path(tmp) / "model")
        stop = AutoTokenizer.from_pretrained(model).convert_tokens_to_ids("<|im_end|>")
        with fake_engine(model, stop) as url:
            for _ in range(args.rounds):
                for row, results in runs.items():
                    results.append(asyncio.run(env_path(row, args, model, url)))
    instant = asyncio.run(run_scheduler(InstantRunner(), NoPool(), args))

    def row(name: str, cpu: float, wall: float, errors: int) -> list[str]:
        return [name, f"{1000 * cpu / rollouts:.2f}", f"{rollouts / cpu:.0f}", f"{rollouts / wall:.0f}", str(errors)]

    table = Table(title=f"orchestrator CPU per rollout ({rollouts} rollouts, group {args.group_size}, "
                        f"{args.max_concurrent} in flight, best of {args.rounds} rounds)")
    for column in ("path", "CPU ms / rollout", "rollouts / CPU-s", "rollouts / s (wall)", "errored"):
        table.add_column(column, justify="left" if column == "path" else "right")
    best = {}
    labels = {"before": "verifiers path (before)", "memo": "verifiers path + pydantic memo", "lean": "lean path (after)"}
    for path, label in labels.items():
        cpu, wall, _ = min(runs[path])
        errors = sum(r[2] for r in runs[path])
        best[path] = cpu
        table.add_row(*row(label, cpu, wall, int(errors)))
    table.add_row(*row("orchestration only", *instant))
    Console().print(table)
    Console().print(f"CPU per rollout, before / after: [bold]{best['before'] / best['lean']:.1f}x[/bold] lower "
                    f"(verifiers path + memo / lean: {best['memo'] / best['lean']:.1f}x)")


if __name__ == "__main__":
    main()
