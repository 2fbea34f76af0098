"""The operator's own Prometheus metrics (training metrics come from the orchestrator's /metrics)."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry()

RECONCILES = Counter(
    "rlkube_operator_reconciles_total", "Reconcile passes by kind and result.", ["kind", "result"], registry=REGISTRY
)
RECONCILE_SECONDS = Histogram(
    "rlkube_operator_reconcile_seconds", "Duration of one reconcile pass.", ["kind"], registry=REGISTRY
)
RUN_PHASE = Gauge(
    "rlkube_run_phase", "1 for the run's current phase.", ["kind", "namespace", "name", "phase"], registry=REGISTRY
)
RUN_RESTARTS = Gauge(
    "rlkube_run_restarts", "Gang restarts of the run's trainer.", ["kind", "namespace", "name"], registry=REGISTRY
)
RUN_STEP = Gauge("rlkube_run_step", "The run's latest training step.", ["kind", "namespace", "name"], registry=REGISTRY)

def serve(host: str, port: int):
    """Serve `REGISTRY` on `/metrics` from a daemon thread (`rlkube-operator --metrics-port`);
    returns the server (`.shutdown()` stops it, `.server_port` is the bound port). The port takes
    no token and whatever reaches it may connect, so it is `rlkube.readonly_http`'s: bounded
    connections and handler threads, a deadline on each request (prometheus_client's
    `start_http_server` keeps a thread per open connection, without a timeout)."""
    from prometheus_client.exposition import MetricsHandler
    from rlkube import readonly_http

    return readonly_http.serve(host, port, MetricsHandler.factory(REGISTRY), "operator-metrics")


PHASES = ("Pending", "Initializing", "Running", "Succeeded", "Failed", "Suspended")


def record_run(kind: str, namespace: str, name: str, status: dict) -> None:
    for phase in PHASES:
        RUN_PHASE.labels(kind, namespace, name, phase).set(1 if status.get("phase") == phase else 0)
    RUN_RESTARTS.labels(kind, namespace, name).set(status.get("restarts", 0))
    if status.get("step") is not None:
        RUN_STEP.labels(kind, namespace, name).set(status["step"])


def forget_run(kind: str, namespace: str, name: str) -> None:
    series = [(RUN_PHASE, (kind, namespace, name, p)) for p in PHASES]
    series += [(RUN_RESTARTS, (kind, namespace, name)), (RUN_STEP, (kind, namespace, name))]
    for gauge, labels in series:
        try:
            gauge.remove(*labels)
        except KeyError:
            pass  # never recorded
