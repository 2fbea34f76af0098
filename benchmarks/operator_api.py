"""What the operator costs the API server: requests per run per minute, by verb, for steady and
for finished RLRuns, and the time from applying many runs to all their children existing.

The operator runs embedded against the local cluster's API server (tests/operator/embedded.py),
which records every request; the benchmark plays the controllers and kubelets (pods Running/Ready)
and a fixed orchestrator GET /status, as the operator tests do.

    PYTHONPATH=. .venv/bin/python benchmarks/operator_api.py [--runs 50] [--seconds 60] [--burst 200]
        [--interval S] [--progress-interval S]

Without --interval / --progress-interval the operator's own command-line defaults apply, so the
same script measures an older checkout (run it there with PYTHONPATH=<checkout>/operator:<checkout>).
"""

import argparse
import asyncio
import time
from collections import Counter

from rich.console import Console
from rich.table import Table
from rlkube_operator.main import parse_args

from tests.operator.embedded import (
    READS,
    WRITES,
    api_server,
    operator_requests,
    quiet,
    running_operator,
    serve_status,
)
from tests.operator.test_operator_kmock import rlrun

CHILDREN = {"ConfigMap": ("config",), "Service": ("inference", "orchestrator", "trainer-master"),
            "StatefulSet": ("inference",), "PodDisruptionBudget": ("inference",),
            "Deployment": ("orchestrator",), "Job": ("trainer-0",)}
STEP = 7


def operator_defaults(args: argparse.Namespace) -> dict:
    """`build_registry` options as the operator's command line defaults them, overridden by ours;
    an older operator knows fewer of them."""
    defaults = vars(parse_args([]))
    chosen = {"interval": args.interval, "progress_interval": args.progress_interval}
    return {k: chosen[k] if chosen[k] is not None else defaults[k] for k in chosen if k in defaults}


def all_children_exist(cluster, names: list[str]) -> bool:
    return all({f"{name}-{child}" for name in names for child in children} <= cluster.names(kind)
               for kind, children in CHILDREN.items())


async def until(cluster, predicate, what: str) -> None:
    """Wait, polling once a second: a predicate over hundreds of objects runs in the operator's
    event loop, and polling it as often as the tests do would slow the operator measured."""
    log(f"waiting for {what}")
    await cluster.until(predicate, timeout=1200, what=what, every=1.0)


def log(message: str) -> None:
    Console(stderr=True).log(message)


async def apply_runs(cluster, count: int) -> list[str]:
    names = [f"bench-{i}" for i in range(count)]
    for name in names:
        await cluster.create(rlrun(name))
    return names


async def start_pods(cluster, names: list[str]) -> None:
    """Every workload's pods Running and Ready, as their controllers and kubelets would."""
    for name in names:
        for kind, child in (("StatefulSet", "inference"), ("Deployment", "orchestrator"), ("Job", "trainer-0")):
            owner = cluster.get(kind, f"{name}-{child}")
            await cluster.run_pods(owner, owner["spec"].get("completions") or owner["spec"]["replicas"])


async def finish(cluster, names: list[str]) -> None:
    for name in names:
        await cluster.patch("Job", f"{name}-trainer-0",
                            {"status": {"conditions": [{"type": "Complete", "status": "True"}]}})


def phases(cluster, names: list[str]) -> set:
    return {cluster.status("RLRun", name).get("phase") for name in names}


async def measure(server, seconds: float) -> Counter:
    """The operator's requests over `seconds`, by verb."""
    since = len(list(server))
    await asyncio.sleep(seconds)
    counts = Counter()
    for (verb, resource), n in operator_requests(server, since).items():
        counts[verb] += n
        if verb == "patch" and resource.endswith("/status"):
            counts["status patch"] += n
        if verb == "create" and resource == "events":
            counts["event"] += n
    return counts


async def steady_or_finished(args, options: dict, finished: bool) -> Counter:
    async with api_server() as server, serve_status() as status:
        status.body = status.body | {"phase": "training", "step": STEP, "max_steps": 1000, "reward": 0.5}
        async with running_operator(server, status.url, **options) as cluster:
            names = await apply_runs(cluster, args.runs)
            await until(cluster, lambda: all_children_exist(cluster, names), "children")
            if finished:
                await finish(cluster, names)
                await until(cluster, lambda: phases(cluster, names) == {"Succeeded"} and not cluster.names("Deployment"),
                            "Succeeded")
                await quiet(cluster)  # the passes woken by the teardown's own deletions
            else:
                await start_pods(cluster, names)
                await until(cluster, lambda: phases(cluster, names) == {"Running"} and all(
                    cluster.status("RLRun", n).get("step") == STEP for n in names), "Running")
            await asyncio.sleep(args.settle)
            log(f"measuring {args.seconds:.0f} s")
            counts = await measure(server, args.seconds)
            log(f"{'finished' if finished else 'steady'}: {dict(counts)}")  # kept if the stop fails
            return counts


async def time_to_children(args, options: dict) -> tuple[float, float]:
    """(seconds to apply `--burst` runs, seconds from the first apply to all their children)."""
    async with api_server() as server, serve_status() as status, running_operator(server, status.url, **options) as cluster:
        started = time.perf_counter()
        names = await apply_runs(cluster, args.burst)
        applied = time.perf_counter() - started
        await until(cluster, lambda: all_children_exist(cluster, names), "children")
        return applied, time.perf_counter() - started


def table(args, options: dict, results: dict[str, Counter], burst: tuple[float, float]) -> Table:
    per_run_minute = 60.0 / (args.runs * args.seconds)
    out = Table(title=f"operator API requests per run per minute ({args.runs} runs, {args.seconds:.0f} s measured, "
                      + ", ".join(f"{k}={v}" for k, v in options.items()) + ")")
    columns = (*READS, *WRITES, "status patch", "event")
    for name in ("scenario", *columns, "reads", "writes"):
        out.add_column(name, justify="left" if name == "scenario" else "right")
    for scenario, counts in results.items():
        reads, writes = sum(counts[v] for v in READS), sum(counts[v] for v in WRITES)
        cells = [counts[c] * per_run_minute for c in columns] + [reads * per_run_minute, writes * per_run_minute]
        out.add_row(scenario, *(f"{c:.2f}" for c in cells))
    applied, children = burst
    out.caption = (f"{args.burst} runs applied in {applied:.1f} s; all their children existed "
                   f"{children:.1f} s after the first apply")
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0, help="measuring time of each scenario")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds waited before measuring")
    parser.add_argument("--burst", type=int, default=200, help="runs applied at once for the time to children")
    parser.add_argument("--interval", type=float, default=None)
    parser.add_argument("--progress-interval", type=float, default=None)
    args = parser.parse_args()
    options = operator_defaults(args)
    results = {"steady (Running)": await steady_or_finished(args, options, finished=False),
               "finished (Succeeded)": await steady_or_finished(args, options, finished=True)}
    burst = await time_to_children(args, options)
    Console(width=200).print(table(args, options, results, burst))


if __name__ == "__main__":
    asyncio.run(main())
