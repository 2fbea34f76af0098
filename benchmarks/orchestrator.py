"""Orchestrator CPU per rollout: verifiers' full path against rlkube's lean path, and rollout
throughput with env workers, in one run.

    python benchmarks/orchestrator.py [--steps 4] [--batch-size 64] [--group-size 8] [--max-concurrent 64] [--rounds 3]

The real reverse-text environment runs through the orchestrator's scheduler, advantages and
packing against `benchmarks/fake_engine.py`, an instant stand-in for vLLM's token-in/token-out
route in its own process, so this process's CPU clock (`time.process_time`: every thread of
the orchestrator, the renderer's included) counts only the orchestrator. Rows:
- `verifiers path (before)`: the chat harness posts to verifiers' interception server over local
  HTTP, whose training client calls the engine, with rlkube's memos taken out (`as_before`:
  pydantic asking `inspect.signature` about every default factory, renderers tokenizing the
  assistant header on every response, ...; rlkube before the lean path);
- `verifiers path + memos`: the same with `rlkube.envs.pydantic_defaults` and
  `rlkube.envs.reasoning_headers` installed;
- `lean path (after)`: the harness calls the interception handler in-process and the engine over
  one aiohttp pool per replica (`rlkube.envs.in_process`), with the memos;
- `orchestration only`: rollouts that complete instantly in-process (scheduler, advantages and
  packing alone).
The paths alternate for `--rounds` rounds after a warm-up; each row is its path's best round
(other processes on a loaded machine only ever add CPU time). The clock is opened wide
(`async_level = steps`), so no policy update is waited for.

The second table runs the lean path in-process (0 env workers) and in 1 and 2 `rlkube
env-worker` processes behind this process's scheduler over gRPC (rlkube.orchestrator.workers),
alternating for `--rounds` rounds after each setup's warm-up: rollouts/s (wall, best round) and
CPU per rollout of the orchestrator and its workers together (/proc), and the scaling ratios.
"""

import argparse
import asyncio
import contextlib
import os
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
from rlkube.orchestrator.inference import InferencePool
from rlkube.orchestrator.packing import pack_batch
from rlkube.orchestrator.rollouts import EnvRunner, TaskSampler, run_group
from rlkube.orchestrator.scheduler import Scheduler
from rlkube.orchestrator.workers import WorkerHub
from rlkube.ports import free_port
from rlkube.rollout_types import Rollout, Sample

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")


class InstantRunner:
    """Rollouts that complete at once: task i's j-th rollout scores (i + j) % 2 (mixed groups)."""

    name = "instant"

    def __init__(self):
        self.config, self.sampler, self.count = EnvConfig(id=self.name), TaskSampler(100, seed=0), 0

    def next_task(self):
        i = self.sampler.next()
        return str(i), i

    def record(self, example_id, rewards):
        pass

    async def rollout(self, task, example_id, ctx, temperature, policy_version):
        await asyncio.sleep(0)
        self.count += 1
        sample = Sample([1, 2, 3, 4 + task], [False, False, True, True], [0.0, 0.0, -0.1, -0.2], temperature)
        return Rollout(self.name, example_id, float((task + self.count) % 2), [sample], 0, 0)


async def run_scheduler(runner, run_group, args, clock: PolicyClock | None = None) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, errored rollouts) to cut `args.steps` batches and pack each for 2 ranks."""
    batches = []
    scheduler = Scheduler(
        [runner], [1.0], run_group, clock or PolicyClock(async_level=args.steps),
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


def in_process(pool, args):
    """The orchestrator's own `run_group` (no env workers)."""
    async def run(runner, example_id, task, size):
        return await run_group(runner, pool, example_id, task, size, 1.0, lambda: 0)

    return run


def engine_pool(args, model: Path, url: str) -> InferencePool:
    return InferencePool(ClientConfig(base_urls=[url], max_concurrent=args.max_concurrent), str(model), str(model),
                         SamplingConfig(max_tokens=64))


def env_config(path: str) -> EnvConfig:
    return EnvConfig(args={"num_examples": 1000}, rollout_path=path)


@contextlib.contextmanager
def as_before():
    """verifiers', pydantic's and renderers' own code again, as before rlkube's memos: the
    default-factory and header-ids memos out, the reverse-text task hashing its data on every
    read, and the chat harness's plugin lookup searching verifiers' package first."""
    from pydantic._internal import _fields
    from renderers import reasoning
    from rlkube.envs import chat_harness, pydantic_defaults, reasoning_headers
    from rlkube.envs.reverse_text import ReverseTextTask

    _fields.takes_validated_data_argument = pydantic_defaults._takes_validated_data
    reasoning._after_header = reasoning_headers._original_after_header
    remembered_hash = ReverseTextTask.__dict__["hash"]
    del ReverseTextTask.hash
    namespaced = f"verifiers.v1.harnesses.{chat_harness.HARNESS_ID}"
    harness_module = sys.modules.pop(namespaced)
    try:
        yield
    finally:
        ReverseTextTask.hash = remembered_hash
        sys.modules[namespaced] = harness_module  # the next load_env installs the memos again


async def env_path(row: str, args, model: Path, url: str) -> tuple[float, float, int]:
    from rlkube.envs import load_env

    config = env_config("lean" if row == "lean" else "verifiers")
    runner = EnvRunner(config, load_env(config), seed=0)  # load_env installs the memos
    pool = engine_pool(args, model, url)
    with as_before() if row == "before" else contextlib.nullcontext():
        async with runner.serving():
            warm = argparse.Namespace(**{**vars(args), "steps": 1})
            await run_scheduler(runner, in_process(pool, warm), warm)  # tokenizer, connections, caches
            return await run_scheduler(runner, in_process(pool, args), args)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process (its threads included), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.asynccontextmanager
async def env_workers(n: int, args, model: Path, url: str, tmp: Path):
    """`n` `rlkube env-worker` processes serving a hub on a fresh port: (hub, their pids)."""
    from rlkube.config import OrchestratorConfig, write_toml
    from rlkube.transport.server import start_server, stop_server

    config = OrchestratorConfig(
        model={"name": str(model)}, envs=[env_config("lean")], sampling=SamplingConfig(max_tokens=64),
        group_size=args.group_size, batch_size=args.batch_size, env_workers=n,
        client=ClientConfig(base_urls=[url], max_concurrent=args.max_concurrent), rollouts={"port": free_port()},
    )
    path = tmp / f"env-worker-{n}.toml"
    write_toml(config, path)
    hub = WorkerHub(PolicyClock(async_level=args.steps), args.group_size, ["reverse_text"], timeout_s=3600)
    server = await start_server(None, "127.0.0.1", config.rollouts.port, workers=hub)
    argv = [sys.executable, "-m", "rlkube.entrypoints.env_worker", "@", str(path), "--log.level", "warning"]
    workers = [subprocess.Popen(argv) for _ in range(n)]  # noqa: ASYNC220 - started once, before timing
    try:
        while len(hub.sessions) < n:
            await asyncio.sleep(0.1)
        yield hub, [w.pid for w in workers]
    finally:
        for worker in workers:
            worker.terminate()
            worker.wait(10)
        await stop_server(server, 1)


async def worker_rows(args, model: Path, url: str, tmp: Path) -> dict[int, list[tuple[float, float, int, float]]]:
    """Rounds of the lean path with 0, 1 and 2 env workers: (CPU s of every process, wall s,
    errors, CPU s of this process alone)."""
    from rlkube.envs import load_env

    runner = EnvRunner(env_config("lean"), load_env(env_config("lean")), seed=0)
    pool = engine_pool(args, model, url)
    warm = argparse.Namespace(**{**vars(args), "steps": 1})
    runs: dict[int, list] = {0: [], 1: [], 2: []}
    async with runner.serving(), env_workers(1, args, model, url, tmp) as one, env_workers(2, args, model, url, tmp) as two:
        setups = {0: (None, []), 1: one, 2: two}
        for hub, _ in (one, two):
            await run_scheduler(runner, hub.run_group, warm, hub.clock)
        await run_scheduler(runner, in_process(pool, warm), warm)
        for _ in range(args.rounds):
            for n, (hub, pids) in setups.items():
                before = sum(map(cpu_seconds, pids))
                run = hub.run_group if hub else in_process(pool, args)
                cpu, wall, errors = await run_scheduler(runner, run, args, hub.clock if hub else None)
                runs[n].append((cpu + sum(map(cpu_seconds, pids)) - before, wall, errors, cpu))
    return runs



@contextlib.contextmanager
def fake_engine(model: Path, stop_token_id: int):
    port = free_port()
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
            workers = asyncio.run(worker_rows(args, model, url, Path(tmp)))
            # the real pool (slots, sticky replicas); the instant runner never calls the engine
            instant = asyncio.run(run_scheduler(InstantRunner(), in_process(engine_pool(args, model, url), args), args))

    def row(name: str, cpu: float, wall: float, errors: int) -> list[str]:
        return [name, f"{1000 * cpu / rollouts:.2f}", f"{rollouts / cpu:.0f}", f"{rollouts / wall:.0f}", str(errors)]

    table = Table(title=f"orchestrator CPU per rollout ({rollouts} rollouts, group {args.group_size}, "
                        f"{args.max_concurrent} in flight, best of {args.rounds} rounds)")
    for column in ("path", "CPU ms / rollout", "rollouts / CPU-s", "rollouts / s (wall)", "errored"):
        table.add_column(column, justify="left" if column == "path" else "right")
    best = {}
    labels = {"before": "verifiers path (before)", "memo": "verifiers path + memos", "lean": "lean path (after)"}
    for path, label in labels.items():
        cpu, wall, _ = min(runs[path])
        errors = sum(r[2] for r in runs[path])
        best[path] = cpu
        table.add_row(*row(label, cpu, wall, int(errors)))
    table.add_row(*row("orchestration only", *instant))
    Console().print(table)
    Console().print(f"CPU per rollout, before / after: [bold]{best['before'] / best['lean']:.1f}x[/bold] lower "
                    f"(verifiers path + memos / lean: {best['memo'] / best['lean']:.1f}x)")

    table = Table(title=f"env workers, lean path ({rollouts} rollouts, {args.max_concurrent} in flight, "
                        f"best of {args.rounds} rounds, {os.cpu_count()} CPUs)")
    for column in ("env workers", "rollouts / s (wall)", "CPU ms / rollout (all processes)",
                   "CPU ms / rollout (orchestrator)", "errored"):
        table.add_column(column, justify="right")
    rate = {}
    for n, results in workers.items():
        rate[n] = rollouts / min(r[1] for r in results)
        cpu, orchestrator = min(r[0] for r in results), min(r[3] for r in results)
        label = "0 (in-process)" if n == 0 else str(n)
        table.add_row(label, f"{rate[n]:.0f}", f"{1000 * cpu / rollouts:.2f}", f"{1000 * orchestrator / rollouts:.2f}",
                      str(sum(r[2] for r in results)))
    Console().print(table)
    Console().print(f"rollouts/s, 2 workers / 1 worker: [bold]{rate[2] / rate[1]:.2f}x[/bold]; "
                    f"1 worker / in-process: {rate[1] / rate[0]:.2f}x; 2 workers / in-process: {rate[2] / rate[0]:.2f}x")


if __name__ == "__main__":
    main()
