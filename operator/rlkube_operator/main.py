"""rlkube-operator: the routing table from kopf events to handlers, and the entry point.

    rlkube-operator [--namespace NS ... | --all-namespaces] [--interval 5] [--metrics-port 8080]
                    [--network-policy-peer '{"namespaceSelector": …, "podSelector": …}']

Every RLRun/SFTRun is reconciled by one timer (`Reconciler.reconcile`, level-triggered): kopf
runs one timer per object at a time, so two passes never race on the same run. Liveness is
kopf's own endpoint (`/healthz`); the operator's Prometheus metrics are on `--metrics-port`.
"""

import argparse
import functools
import json
import logging
import sys
import time
from datetime import UTC, datetime

import kopf

from rlkube_operator import GROUP, VERSION, metrics
from rlkube_operator.kube import Kube, api_client
from rlkube_operator.reconcile import Reconciler, Settings

PLURALS = {"RLRun": "rlruns", "SFTRun": "sftruns"}


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def reconcile_run(kind: str, reconciler: Reconciler, body: kopf.Body, patch: kopf.Patch, **_) -> None:
    """Sync on purpose: kopf runs it in a worker thread, the blocking client stays off its loop."""
    started = time.monotonic()
    plain = json.loads(json.dumps(body, default=dict))
    try:
        result = reconciler.reconcile(kind, plain, now_iso())  # its errors are in result.status
    finally:
        metrics.RECONCILE_SECONDS.labels(kind).observe(time.monotonic() - started)
    metrics.RECONCILES.labels(kind, "error" if result.error else "ok").inc()
    for type_, reason, message in result.events:
        kopf.event(body, type=type_, reason=reason, message=message[:1024])
    patch.status.update(result.status)
    meta = plain["metadata"]
    metrics.record_run(kind, meta["namespace"], meta["name"], result.status)


def forget_run(kind: str, name: str, namespace: str, **_) -> None:
    metrics.forget_run(kind, namespace, name)


def configure(settings: kopf.OperatorSettings, **_) -> None:
    settings.persistence.finalizer = f"{GROUP}/operator"
    # Watch exactly the namespaces given (or the cluster): no namespace or CRD listing, so the
    # single-namespace RBAC needs no cluster-wide read access.
    settings.scanning.disabled = True
    # Our own events (phases, restarts) are posted explicitly; kopf's log lines become events
    # only from warnings up, or every timer pass would post "succeeded".
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    # On exit (or deletion) kopf gives a timer a few loop cycles to stop, then orphans it: a sync
    # reconcile pass still in its worker thread would go on writing after the operator is gone.
    # Let the pass in flight finish instead; a pass is a few API calls and a 3 s status read.
    settings.background.instant_exit_timeout = 10.0


def build_registry(reconciler: Reconciler, *, interval: float, login=kopf.login_via_client) -> kopf.OperatorRegistry:
    """The routing table. `login` is kopf's default client login; tests pass one for kmock."""
    registry = kopf.OperatorRegistry()
    kopf.on.startup(registry=registry)(configure)
    kopf.on.login(registry=registry)(login)
    for kind, plural in PLURALS.items():
        kopf.timer(GROUP, VERSION, plural, interval=interval, id="reconcile", registry=registry)(
            functools.partial(reconcile_run, kind, reconciler)
        )
        kopf.on.delete(GROUP, VERSION, plural, id="forget", optional=True, registry=registry)(
            functools.partial(forget_run, kind)
        )
    return registry


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"a JSON object is needed, not {text!r}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rlkube-operator", description=__doc__.splitlines()[0])
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[], help="watch only these namespaces")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch the whole cluster")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between reconciles of a run")
    parser.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics port (0: off)")
    parser.add_argument("--liveness", default="http://0.0.0.0:8081/healthz", help="kopf liveness endpoint")
    parser.add_argument(
        "--status-url",
        default=Settings.status_url_template,
        help="template of the progress URL: the orchestrator's (RLRun) or trainer pod 0's (SFTRun) "
        "GET /status ({service}, {namespace}, {port})",
    )
    parser.add_argument(
        "--network-policy-peer",
        type=_json_object,
        default=None,
        help="a NetworkPolicyPeer (JSON) matching the operator's pods: give each run a NetworkPolicy "
        "that admits only the run's own pods, and this peer on the run's status port",
    )
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.all_namespaces and not args.namespace:
        print("rlkube-operator: give --namespace NS (repeatable) or --all-namespaces", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, registry=metrics.REGISTRY)
    settings = Settings(status_url_template=args.status_url, network_policy_peer=args.network_policy_peer)
    reconciler = Reconciler(Kube(api_client()), settings)
    kopf.run(
        registry=build_registry(reconciler, interval=args.interval),
        clusterwide=args.all_namespaces,
        namespaces=args.namespace,
        standalone=True,
        liveness_endpoint=args.liveness,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
