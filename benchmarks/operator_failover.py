"""Operator failover: how long runs go unreconciled when the active replica dies or stops, what
the election costs the API server, and whether hostile tenants can take the leadership away.

Operators run against the local cluster's API server (tests/operator/cluster.py), with the real
elector and kopf.

- failover: two replicas (threads with their own event loops and credentials:
  tests/operator/test_leader.py's `Replica`) and one RLRun. At the moment the leader is killed (no release: a
  crashed pod, a lost node) or stopped (SIGTERM: the Lease is released), one of the run's
  Services is deleted; the figure is the time until the standby holds the Lease and until it
  has made the Service again.
- hostile tenants: `rlkube-operator --leader-elect` in a process of its own (as in its pod; the
  emulator stays in this one) and `--runs` RLRuns whose orchestrators are real HTTP servers on
  loopback (tests/operator/hostile.py); `--hostile` of them answer `GET /status` one byte a
  second, or (`--huge` of them) with 32 MiB. Over `--seconds`: the gaps between the Lease's
  renewals (the leader gives up after the renew deadline), the age of the healthy runs' status
  (their orchestrators answer the seconds since they started as the step), and how long a
  hostile answer holds the operator's connection.

    PYTHONPATH=. .venv/bin/python benchmarks/operator_failover.py [--lease-duration 15]
        [--renew-deadline 10] [--retry-period 2] [--runs 200] [--hostile 10] [--huge 2]
        [--seconds 120] [--interval 60] [--before CHECKOUT] [--tiny]

The lease defaults are the chart's (helm/rlkube/values.yaml `leaderElection`). `--tiny` (6 runs,
2 hostile, a 5 s lease for the failover, seconds of measuring) checks that the benchmark works.
`--before CHECKOUT` measures the hostile runs with an older operator too, side by side.
"""

import argparse
import asyncio
import contextlib
import os
import pathlib
import statistics
import subprocess
import tempfile
import time

from rich.console import Console
from rich.table import Table

from tests.fixtures import processes
from tests.operator.cluster import Cluster
from tests.operator.embedded import api_server, serve_status
from tests.operator.hostile import StatusPods, serve_status_pods
from tests.operator.test_leader import LEASE, Replica, holder, start_operator
from tests.operator.test_operator_kmock import rlrun

BATCH = 10


async def seconds_until(cluster: Cluster, predicate, started: float, what: str) -> float:
    await cluster.until(predicate, timeout=120, what=what)
    return time.monotonic() - started


def lease_requests(replica: Replica, server) -> int:
    return sum(1 for _, r in replica.requests(server) if r.resource and r.resource.plural == "leases")


def log(message: str) -> None:
    Console(stderr=True).log(message)


async def failover(timing: dict, crash: bool) -> dict:
    """One failover: (seconds to the new holder, seconds to the deleted child made again,
    lease requests per minute of the leader and the standby before it)."""
    async with api_server() as server, serve_status() as status, Cluster(server) as cluster:
        a = Replica("operator-a", cluster, status.url, **timing).start()
        await cluster.until(lambda: holder(cluster) == "operator-a", what="a leads")
        b = Replica("operator-b", cluster, status.url, **timing).start()
        await cluster.create(rlrun())
        await cluster.until(lambda: cluster.get("Job", "rt-trainer-0"), what="children")
        before, observed = {"leader": lease_requests(a, server), "standby": lease_requests(b, server)}, time.monotonic()
        await asyncio.sleep(5 * timing["retry_period"])
        minutes = (time.monotonic() - observed) / 60
        costs = {"leader": (lease_requests(a, server) - before["leader"]) / minutes,
                 "standby": (lease_requests(b, server) - before["standby"]) / minutes}
        started = time.monotonic()
        await (a.crash() if crash else a.stop())
        await cluster.delete("Service", "rt-inference")
        took_over = await seconds_until(cluster, lambda: holder(cluster) == "operator-b", started, "b leads")
        restored = await seconds_until(cluster, lambda: cluster.get("Service", "rt-inference"), started, "restored")
        await b.stop()
        return {"holder": took_over, "restored": restored} | costs


def run_names(runs: int, hostile: int, huge: int) -> tuple[list[str], list[str]]:
    """(healthy, hostile) run names; a hostile run's name says how it answers (hostile.py)."""
    bad = [f"trickle-{i}" for i in range(hostile - huge)] + [f"huge-{i}" for i in range(huge)]
    return [f"bench-{i}" for i in range(runs - hostile)], bad


def status_ages(cluster: Cluster, pods: StatusPods, ready_at: dict[str, int]) -> list[int]:
    """Seconds since each healthy run's orchestrator said the step its status shows (since it
    was started, while its status shows none)."""
    now = pods.step()
    return [now - (cluster.status("RLRun", name).get("step") or since) for name, since in ready_at.items()]


async def observe(cluster: Cluster, pods: StatusPods, operator: subprocess.Popen, ready_at: dict,
                  seconds: float) -> dict:
    """Sample the Lease (every 0.25 s) and the healthy runs' status (every second) for `seconds`."""
    loop = asyncio.get_running_loop()
    started = last_sample = loop.time()
    seen, renewed_at, gaps, worst_age, lost_after = None, started, [], 0, None
    while loop.time() < started + seconds:
        renewal = ((cluster.get("Lease", LEASE) or {}).get("spec") or {}).get("renewTime")
        if renewal != seen:
            if seen is not None:
                gaps.append(loop.time() - renewed_at)
            seen, renewed_at = renewal, loop.time()
        if operator.poll() is not None and lost_after is None:
            lost_after = loop.time() - started
            log(f"the operator exited ({operator.returncode}) after {lost_after:.1f} s")
        if loop.time() - last_sample >= 1.0:
            worst_age, last_sample = max(worst_age, *status_ages(cluster, pods, ready_at)), loop.time()
        await asyncio.sleep(0.25)
    gaps.append(loop.time() - renewed_at)  # the one still open
    ages = status_ages(cluster, pods, ready_at)
    return {"renewals": len(gaps) - 1, "max gap": max(gaps), "lost after": lost_after,
            "age p50": statistics.median(ages), "age max": max(ages), "age worst": max(worst_age, *ages)}


@contextlib.contextmanager
def operator_process(cluster: Cluster, status_url: str, args: argparse.Namespace, timing: dict,
                     checkout: str | None):
    """`rlkube-operator --leader-elect` in its own process (as its pod would run it: its own
    interpreter, so the emulator in this one does not share its GIL), against the emulator;
    from `checkout`'s operator and runtime packages when given, else this one's."""
    env = {"PYTHONPATH": f"{checkout}/operator:{checkout}/runtime"} if checkout else {}
    with tempfile.TemporaryDirectory() as tmp:
        flags = [f"--{name.replace('_', '-')}={value}" for name, value in timing.items()]
        process = start_operator(cluster, "operator-a", pathlib.Path(tmp), f"--status-url={status_url}",
                                 f"--interval={args.interval}", "--progress-interval=0", "--log-level=WARNING",
                                 *flags, env=env)
        try:
            yield process
        finally:  # killed: a graceful stop would wait on the emulator, in this (blocked) thread
            processes.stop(process, grace_s=0)


async def start_runs(cluster: Cluster, pods: StatusPods, operator: subprocess.Popen, healthy: list[str],
                     hostile: list[str]) -> dict[str, int]:
    """Create the runs and their orchestrator pods, ten at a time (the emulator shares a core
    with the operator: a backlog of hundreds of creations would delay the Lease's renewals in
    it past the renew deadline), the hostile ones last. Returns when each healthy run's
    orchestrator pod started (`pods.step()`); stops early if the operator exits."""
    ready_at, runs = {}, healthy + hostile
    for i in range(0, len(runs), BATCH):
        batch = runs[i:i + BATCH]
        log(f"runs {i + 1}-{i + len(batch)} of {len(runs)}")
        for name in batch:
            await cluster.create(rlrun(name))
        await cluster.until(lambda b=batch: operator.poll() is not None or {
            f"{n}-orchestrator" for n in b} <= cluster.names("Deployment"), timeout=600, every=0.5, what="orchestrators")
        if operator.poll() is not None:
            break
        for name in batch:
            await cluster.run_pods(cluster.get("Deployment", f"{name}-orchestrator"), 1)
            if name in healthy:
                ready_at[name] = pods.step()
        await cluster.until(lambda b=batch: operator.poll() is not None or all(
            cluster.status("RLRun", n).get("step") is not None for n in b if n in ready_at),
            timeout=600, every=0.5, what="the healthy runs' first status")
    return ready_at


async def hostile_tenants(args: argparse.Namespace, timing: dict, checkout: str | None) -> dict:
    async with api_server() as server, serve_status_pods() as pods, Cluster(server) as cluster:
        with operator_process(cluster, pods.url, args, timing, checkout) as operator:
            await cluster.until(lambda: holder(cluster) == "operator-a", timeout=60, what="the operator leads")
            healthy, hostile = run_names(args.runs, args.hostile, args.huge)
            ready_at = await start_runs(cluster, pods, operator, healthy, hostile)
            log(f"measuring {args.seconds:.0f} s")
            figures = await observe(cluster, pods, operator, ready_at, args.seconds)
            held = pods.held_longest()
            figures |= {"trickle": max(pods.hostile_seconds["trickle"], default=None),
                        "huge": max(pods.hostile_seconds["huge"], default=None), "still held": held}
            pods.close_all()  # an operator that never gives up on a trickle would not stop otherwise
            return figures


def seconds(value: float | None, none: str = "-") -> str:
    return none if value is None else f"{value:.1f}"


HOSTILE_ROWS = (
    ("leader lost (the operator exited) after (s)", lambda f: seconds(f["lost after"], "never")),
    ("Lease renewals / longest gap between two (s)", lambda f: f"{f['renewals']} / {f['max gap']:.1f}"),
    ("healthy runs' status age at the end: median / max (s)", lambda f: f"{f['age p50']:.0f} / {f['age max']:.0f}"),
    ("healthy runs' status age, worst seen (s)", lambda f: f"{f['age worst']:.0f}"),
    ("longest trickled answer the operator waited for (s)", lambda f: seconds(f["trickle"])),
    ("longest 32 MiB answer (s)", lambda f: seconds(f["huge"])),
    ("hostile answer still held at the end, the oldest (s)", lambda f: seconds(f["still held"] or None, "none")),
)


def hostile_table(args: argparse.Namespace, timing: dict, results: dict[str, dict]) -> Table:
    workers = min(32, (os.cpu_count() or 1) + 4)
    table = Table(title=f"{args.runs} runs, {args.hostile} hostile ({args.hostile - args.huge} trickle GET /status a "
                        f"byte a second, {args.huge} answer 32 MiB), {args.seconds:.0f} s measured; resync "
                        f"{args.interval:g} s, {workers} reconcile workers, renew deadline "
                        f"{timing['renew_deadline']:g} s")
    table.add_column("figure")
    for name in results:
        table.add_column(name, justify="right")
    for label, cell in HOSTILE_ROWS:
        table.add_row(label, *(cell(f) for f in results.values()))
    return table


async def main(args: argparse.Namespace) -> None:
    timing = {"lease_duration": args.lease_duration, "renew_deadline": args.renew_deadline,
              "retry_period": args.retry_period}
    quick = {"lease_duration": 5.0, "renew_deadline": 4.0, "retry_period": 0.5} if args.tiny else timing
    table = Table(title=f"failover of lease {LEASE} (lease {quick['lease_duration']} s, renew deadline "
                        f"{quick['renew_deadline']} s, retry {quick['retry_period']} s)")
    for column in ("leader", "to new holder (s)", "to a deleted child made again (s)",
                   "lease requests/min: leader", "standby"):
        table.add_column(column, justify="right")
    for crash, what in ((True, "killed (no release)"), (False, "stopped (SIGTERM, released)")):
        figures = await failover(quick, crash)
        table.add_row(what, f"{figures['holder']:.1f}", f"{figures['restored']:.1f}",
                      f"{figures['leader']:.0f}", f"{figures['standby']:.0f}")
    console = Console(width=160)
    console.print(table)
    results = {}
    if args.before:
        results[f"before ({args.before})"] = await hostile_tenants(args, timing, args.before)
    results["this checkout"] = await hostile_tenants(args, timing, None)
    console.print(hostile_table(args, timing, results))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lease-duration", type=float, default=15.0)
    parser.add_argument("--renew-deadline", type=float, default=10.0)
    parser.add_argument("--retry-period", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--hostile", type=int, default=10, help="runs whose orchestrator trickles or floods /status")
    parser.add_argument("--huge", type=int, default=2, help="of the hostile runs, those answering 32 MiB")
    parser.add_argument("--seconds", type=float, default=120.0, help="measuring time with the hostile runs")
    parser.add_argument("--interval", type=float, default=60.0, help="the operator's resync (--interval)")
    parser.add_argument("--before", metavar="CHECKOUT",
                        help="also measure the hostile runs with the operator of this older checkout (its "
                        "operator/ and runtime/, e.g. from `git archive <commit> operator runtime`), side by side")
    parser.add_argument("--tiny", action="store_true",
                        help="6 runs, 2 hostile, a 5 s lease for the failover: seconds in all")
    args = parser.parse_args()
    if args.tiny:
        args.runs, args.hostile, args.huge, args.seconds = 6, 2, 1, 3.0
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
