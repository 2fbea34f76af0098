"""How much of a tool tail the orchestrator's scheduling hides: sync vs async bounds, no model.

The real scheduler, policy clock and buffer (`rlkube.orchestrator`), with rollouts that are
`--calls` tool waits drawn from the tool service's latency model (`LatencyModel`: lognormal,
median `--p50-s`, p99/p50 from the sweep) and a trainer that takes `--train-s` per step and
then advances the clock. No engine and no tokens to sample: what is measured is the
scheduling alone, the upper bound of what the overlap can win on that tail. Each row: the
mean step time after the first step, its ratio to sync's, and the policy lag of the trained
tokens (one token per turn, stamped with the clock at the turn), the rollouts the staleness
bound dropped, and the stragglers in flight when a batch was cut (mean). `--over-provision`
runs each async row at each factor (`orchestrator.over_provision`; sync ignores it).

    python benchmarks/tail_scheduling.py [--tails 1 5 20 50] [--bounds 0 1 2 4] [--steps 12]
        [--over-provision 1 2]
"""

import argparse
import asyncio
import itertools
import time

from rlkube.config import AdvantageConfig
from rlkube.envs.tool_service.latency import LatencyModel, ToolServiceConfig
from rlkube.histogram import Histogram
from rlkube.orchestrator.advantage import make_advantage_fn
from rlkube.orchestrator.buffer import RolloutBuffer
from rlkube.orchestrator.clock import PolicyClock
from rlkube.orchestrator.scheduler import Scheduler
from rlkube.rollout_types import Rollout, Sample


class TailRunner:
    name = "tail"

    def __init__(self):
        self.ids = itertools.count()

    def next_task(self):
        return str(next(self.ids)), None

    def record(self, example_id, rewards):
        pass


async def measure(tail: float, bound: int, over_provision: float, args) -> dict:
    latency = LatencyModel(ToolServiceConfig(p50_s=args.p50_s, tail_ratio=tail, seed=args.seed))
    clock = PolicyClock(bound)
    buffer = RolloutBuffer(args.batch_size, max(bound, 1))
    batches: asyncio.Queue = asyncio.Queue()

    async def rollout(i: int) -> Rollout:
        start, versions = clock.policy_step, []
        for _ in range(args.calls):
            versions.append(clock.policy_step)  # the turn's token, sampled now; then its tool call
            await asyncio.sleep(latency.draw()[0])
        sample = Sample([0, *range(1, args.calls + 1)], [False] + [True] * args.calls, [0.0] * (args.calls + 1), 1.0,
                        policy_versions=[-1, *versions])
        return Rollout("tail", "x", float(i % 2), [sample], start, clock.policy_step)

    async def run_group(runner, example_id, task, size):
        return list(await asyncio.gather(*(rollout(i) for i in range(size))))

    scheduler = Scheduler([TailRunner()], [1.0], run_group, clock, buffer, make_advantage_fn(AdvantageConfig(), 8),
                          args.group_size, args.steps, args.max_groups_in_flight, batches.put_nowait,
                          over_provision=over_provision)
    lags = Histogram("off_policy/token_lag")
    dropped = stragglers = 0.0
    generating = asyncio.ensure_future(scheduler.run())
    step_times, last = [], time.perf_counter()
    for step in range(1, args.steps + 1):
        batch = await batches.get()
        lags.add_counts(batch.metrics)
        dropped += batch.metrics["off_policy/dropped_rollouts"]
        stragglers += scheduler.straggler_rollouts()
        await asyncio.sleep(args.train_s)  # the trainer's step, then the new policy is loaded
        clock.advance(step)
        now = time.perf_counter()
        step_times.append(now - last)
        last = now
    await generating
    steady = step_times[1:]
    return {"s_per_step": sum(steady) / len(steady), "lag_p50": lags.quantile(0.5), "lag_max": lags.max,
            "dropped": dropped, "stragglers": stragglers / args.steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tails", type=float, nargs="+", default=[1, 5, 20, 50])
    parser.add_argument("--bounds", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--over-provision", type=float, nargs="+", default=[1.0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-groups-in-flight", type=int, default=32)
    parser.add_argument("--calls", type=int, default=3, help="tool calls per rollout")
    parser.add_argument("--p50-s", type=float, default=0.05)
    parser.add_argument("--train-s", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print("| p99/p50 | mode | over-provision | s/step | speedup vs sync | trained-token lag p50 / max "
          "| dropped rollouts | stragglers at a cut |")
    print("|---|---|---|---|---|---|---|---|")
    for tail in args.tails:
        sync = None
        for bound in args.bounds:
            for factor in [1.0] if bound == 0 else args.over_provision:
                row = asyncio.run(measure(tail, bound, factor, args))
                sync = sync or row["s_per_step"]
                mode = "sync" if bound == 0 else f"async {bound}"
                print(f"| {tail:g} | {mode} | {factor:g} | {row['s_per_step']:.3f} | {sync / row['s_per_step']:.2f}x | "
                      f"{row['lag_p50']:g} / {row['lag_max']:g} | {row['dropped']:g} | {row['stragglers']:.1f} |",
                      flush=True)


if __name__ == "__main__":
    main()
