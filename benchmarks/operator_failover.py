"""Operator failover: how long runs go unreconciled when the active replica dies or stops, and
what the election costs the API server.

Two operator replicas (threads with their own event loops and credentials, the real elector and
kopf: tests/operator/test_leader.py's `Replica`) run against the kmock API emulator with one
RLRun. At the moment the leader is killed (no release: a crashed pod, a lost node) or stopped
(SIGTERM: the Lease is released), one of the run's Services is deleted; the figure is the time
until the standby holds the Lease and until it has made the Service again.

    PYTHONPATH=. .venv/bin/python benchmarks/operator_failover.py [--lease-duration 15]
        [--renew-deadline 10] [--retry-period 2]

The defaults are the chart's (helm/rlkube/values.yaml `leaderElection`).
"""

import argparse
import asyncio
import time

from rich.console import Console
from rich.table import Table

from tests.operator.cluster import Cluster, declare_resources
from tests.operator.embedded import api_server, serve_status
from tests.operator.test_leader import LEASE, Replica, holder
from tests.operator.test_operator_kmock import rlrun


async def seconds_until(cluster: Cluster, predicate, started: float, what: str) -> float:
    await cluster.until(predicate, timeout=120, what=what)
    return time.monotonic() - started


def lease_requests(replica: Replica, server) -> int:
    return sum(1 for _, r in replica.requests(server) if r.resource and r.resource.plural == "leases")


async def failover(timing: dict, crash: bool) -> dict:
    """One failover: (seconds to the new holder, seconds to the deleted child made again,
    lease requests per minute of the leader and the standby before it)."""
    async with api_server() as server, serve_status() as status:
        declare_resources(server)
        cluster = Cluster(server)
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


async def main(args: argparse.Namespace) -> None:
    timing = {"lease_duration": args.lease_duration, "renew_deadline": args.renew_deadline,
              "retry_period": args.retry_period}
    table = Table(title=f"failover of lease {LEASE} (lease {args.lease_duration} s, renew deadline "
                        f"{args.renew_deadline} s, retry {args.retry_period} s)")
    for column in ("leader", "to new holder (s)", "to a deleted child made again (s)",
                   "lease requests/min: leader", "standby"):
        table.add_column(column, justify="right")
    for crash, what in ((True, "killed (no release)"), (False, "stopped (SIGTERM, released)")):
        figures = await failover(timing, crash)
        table.add_row(what, f"{figures['holder']:.1f}", f"{figures['restored']:.1f}",
                      f"{figures['leader']:.0f}", f"{figures['standby']:.0f}")
    Console().print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lease-duration", type=float, default=15.0)
    parser.add_argument("--renew-deadline", type=float, default=10.0)
    parser.add_argument("--retry-period", type=float, default=2.0)
    asyncio.run(main(parser.parse_args()))
