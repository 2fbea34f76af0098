"""rlkube-operator: the routing table from kopf events to handlers, and the entry point.

    rlkube-operator [--namespace NS ... | --all-namespaces [--allow-system-namespace NS ...]]
                    [--interval 60] [--progress-interval 60]
                    [--metrics-port 8080] --token-key-file /etc/rlkube/token-key/key
                    [--previous-token-key-file /etc/rlkube/previous-token-key/key]
                    [--network-policy-peer '{"namespaceSelector": …, "podSelector": …}']
                    [--egress-policy '{"allowed": [{"cidr": …, "ports": […]}]}']

Every RLRun/SFTRun is reconciled by one daemon (`runloop.RunLoops`, passes of the level-triggered
`Reconciler.reconcile`), woken by watch events of the run and its children, else every
`--interval` seconds: kopf runs one daemon per object, so two passes never race on the same run. Liveness is
kopf's own endpoint (`/healthz`); the operator's Prometheus metrics are on `--metrics-port`.
"""

import argparse
import functools
import json
import logging
import os
import sys

import kopf
import pydantic

from rlkube_operator import GROUP, VERSION, leader, metrics
from rlkube_operator.egress import Egress
from rlkube_operator.guardrails import Guardrails
from rlkube_operator.kube import Kube, api_client
from rlkube_operator.names import RUN_UID_LABEL
from rlkube_operator.reconcile import Reconciler, Settings, operator_peer
from rlkube_operator.runloop import Pacing, RunLoops
from rlkube_operator.runtoken import KEY_SETTING, PREVIOUS_KEY_SETTING, read_key

PLURALS = {"RLRun": "rlruns", "SFTRun": "sftruns", "RLPool": "rlpools"}
SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")
"""Namespaces an operator watching every namespace leaves alone (with its own), unless allowed:
its ClusterRole creates workloads anywhere, and a run there would put them beside the cluster's."""
# (group, version, plural) of the children whose watch events wake their run: the workloads
# and their pods, labelled with the run's uid.
WATCHED_CHILDREN = (("", "v1", "pods"), ("batch", "v1", "jobs"), ("apps", "v1", "statefulsets"),
                    ("apps", "v1", "deployments"))


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
    # On exit (or deletion) kopf gives a daemon a few loop cycles to stop, then orphans it: a
    # reconcile pass still in its worker thread would go on writing after the operator is gone.
    # Let the pass in flight finish instead; a pass is a few API calls and a 3 s status read.
    settings.background.instant_exit_timeout = 10.0


def crds_served(kube: Kube, **_) -> None:
    """Hold the operator's start until the RLRun and SFTRun CRDs are served. With scanning
    disabled kopf reads the API's resources once, right after the startup handlers: an operator
    started before its CRDs were installed would otherwise never watch a run."""
    missing = set(PLURALS.values()) - kube.served(GROUP, VERSION)
    if missing:
        crds = ", ".join(f"{plural}.{GROUP}/{VERSION}" for plural in sorted(missing))
        raise kopf.TemporaryError(f"the CRDs of {crds} are not installed: waiting for them", delay=10)


def ignored_namespaces(args: argparse.Namespace) -> frozenset[str]:
    """With --all-namespaces: the system namespaces and the operator's own, but those allowed."""
    if not args.all_namespaces:
        return frozenset()  # the namespaces listed are the admin's choice
    own = {args.operator_namespace} if args.operator_namespace else set()
    return frozenset({*SYSTEM_NAMESPACES, *own} - set(args.allow_system_namespace))


def build_registry(reconciler: Reconciler, *, interval: float, progress_interval: float = Pacing.progress_interval,
                   login=kopf.login_via_client, ignored: frozenset[str] = frozenset()) -> kopf.OperatorRegistry:
    """The routing table. `login` is kopf's default client login; tests pass one for kmock. Runs
    and children in an `ignored` namespace match no handler: kopf neither finalizes nor reconciles
    them, so the operator creates nothing there."""
    def outside_ignored(namespace: str | None, **_) -> bool:
        return namespace not in ignored

    when = {"when": outside_ignored} if ignored else {}
    registry = kopf.OperatorRegistry()
    kopf.on.startup(registry=registry)(configure)
    kopf.on.startup(id="crds-served", registry=registry)(functools.partial(crds_served, reconciler.kube))
    kopf.on.login(registry=registry)(login)
    loops = RunLoops(reconciler, Pacing(interval=interval, progress_interval=progress_interval))
    for group, version, plural in WATCHED_CHILDREN:
        kopf.on.event(group, version, plural, labels={RUN_UID_LABEL: kopf.PRESENT}, id="wake-run",
                      registry=registry, **when)(loops.wake_for_child)
    for kind, plural in PLURALS.items():
        kopf.daemon(GROUP, VERSION, plural, id="reconcile", registry=registry, **when)(
            functools.partial(loops.run, kind))
        kopf.on.event(GROUP, VERSION, plural, id="wake", registry=registry, **when)(loops.wake_for_run)
        kopf.on.delete(GROUP, VERSION, plural, id="forget", optional=True, registry=registry, **when)(
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


def _scraper_peer(text: str) -> dict:
    """A peer any tenant could join (a pod label, from any namespace) is refused: the scraper
    reaches ports that take no token."""
    peer = _json_object(text)
    if "ipBlock" not in peer and not any((peer.get("namespaceSelector") or {}).values()):
        raise argparse.ArgumentTypeError(
            f"{text}: a metrics scraper is admitted by its namespace (a non-empty namespaceSelector, such as "
            '{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}) or an '
            "ipBlock, never by pod labels from any namespace: any tenant can label a pod")
    return peer


def _egress(text: str) -> Egress:
    try:
        return Egress.model_validate_json(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"invalid egress policy {text!r}: {e}") from None


def _guardrails(text: str) -> Guardrails:
    try:
        return Guardrails.model_validate_json(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"invalid guardrails {text!r}: {e}") from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rlkube-operator", description=__doc__.splitlines()[0])
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[], help="watch only these namespaces")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch the whole cluster")
    parser.add_argument("--operator-namespace", default=os.environ.get("POD_NAMESPACE"),
                        help="the operator's own namespace, left alone with --all-namespaces (default: $POD_NAMESPACE)")
    parser.add_argument("--allow-system-namespace", action="append", default=[], metavar="NS",
                        help="with --all-namespaces, reconcile runs in this one of " + ", ".join(SYSTEM_NAMESPACES)
                        + " or the operator's namespace all the same (repeatable; default: none)")
    parser.add_argument("--interval", type=float, default=Pacing.interval,
                        help="seconds between resyncs of a run (events of the run and its children "
                        "reconcile it at once)")
    parser.add_argument("--progress-interval", type=float, default=Pacing.progress_interval,
                        help="seconds between status writes of progress alone (step, reward); "
                        "phase and condition changes are written at once")
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
        help="a NetworkPolicyPeer (JSON) matching the operator's pods: each run's NetworkPolicy admits "
        "only the run's own pods, this peer on the run's status port and the metrics scraper "
        "(default: pods labelled app.kubernetes.io/name=rlkube-operator in --operator-namespace only)",
    )
    parser.add_argument(
        "--metrics-scraper-peer",
        type=_scraper_peer,
        default=Settings().metrics_scraper_peer,
        help="a NetworkPolicyPeer (JSON) the runs' NetworkPolicies admit to the ports serving /metrics: "
        "a namespaceSelector naming the monitoring namespace (and a podSelector in it, if you like), or "
        "an ipBlock; never pod labels from any namespace (default: no scraper)",
    )
    parser.add_argument(
        "--no-network-policy", action="store_true",
        help="give runs no NetworkPolicy (only where the cluster fences them some other way: the "
        "runs' APIs then rest on their token alone)",
    )
    parser.add_argument(
        "--egress-policy",
        type=_egress,
        help='give each run an egress NetworkPolicy: its pods reach only DNS, the run\'s own pods and the '
        'CIDRs listed, never the cloud metadata addresses (JSON: {"dns": NetworkPolicyPeer, "allowed": '
        '[{"cidr": "10.0.0.0/8", "ports": [443]}]}; default: no egress policy)',
    )
    parser.add_argument(
        "--guardrails",
        type=_guardrails,
        default=Guardrails(),
        help="what runs may ask of their pods, as the chart's `guardrails` values (JSON; "
        "default: the chart's defaults); a spec that breaks one is refused, naming the field",
    )
    parser.add_argument(
        KEY_SETTING,
        help="a file holding the key (at least 32 bytes) each run's token is derived from, so the operator "
        "creates runs' token Secrets without ever reading one (the chart mounts it from a Secret); required",
    )
    parser.add_argument(
        PREVIOUS_KEY_SETTING,
        help="during a rotation, a file holding the key before it: the applied specs it signed are still "
        "trusted, and signed again with the new key (docs/security.md, rotating the key)",
    )
    parser.add_argument("--log-level", default="INFO")
    election = parser.add_argument_group("leader election (several replicas, one reconciling)")
    election.add_argument("--leader-elect", action="store_true",
                          help="reconcile only while holding a coordination.k8s.io Lease; identity: $POD_NAME")
    election.add_argument("--lease-name", default="rlkube-operator")
    election.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE"),
                          help="the Lease's namespace (default: $POD_NAMESPACE)")
    timing = leader.Election.model_fields
    election.add_argument("--lease-duration", type=float, default=timing["lease_duration"].default,
                          help="seconds a candidate waits on an unrenewed Lease before taking it")
    election.add_argument("--renew-deadline", type=float, default=timing["renew_deadline"].default,
                          help="seconds the leader keeps trying to renew before it stops")
    election.add_argument("--retry-period", type=float, default=timing["retry_period"].default,
                          help="seconds between tries")
    args = parser.parse_args(argv)
    args.election = _election(parser, args) if args.leader_elect else None
    return args


def network_policy_peer(args: argparse.Namespace) -> dict | None:
    """The peer the runs' NetworkPolicies admit as the operator: `--network-policy-peer`, else its
    pods' labels in its own namespace (the labels alone would admit a tenant's pod so labelled,
    from any namespace); None with `--no-network-policy`. ValueError without a namespace."""
    if args.no_network_policy:
        return None
    if args.network_policy_peer is not None:
        return args.network_policy_peer
    if not args.operator_namespace:
        raise ValueError("the runs' NetworkPolicies admit the operator's pods in its own namespace only: give "
                         "--operator-namespace (or $POD_NAMESPACE), or --network-policy-peer")
    return operator_peer(args.operator_namespace)


def _election(parser: argparse.ArgumentParser, args: argparse.Namespace) -> leader.Election:
    if not args.lease_namespace:
        parser.error("--leader-elect needs --lease-namespace (or $POD_NAMESPACE)")
    try:
        return leader.Election(
            lease_name=args.lease_name, namespace=args.lease_namespace, identity=leader.own_identity(),
            lease_duration=args.lease_duration, renew_deadline=args.renew_deadline, retry_period=args.retry_period)
    except pydantic.ValidationError as e:
        problems = [(f"--{err['loc'][0].replace('_', '-')}: " if err["loc"] else "") + err["msg"] for err in e.errors()]
        parser.error("; ".join(problems))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.all_namespaces and not args.namespace:
        print("rlkube-operator: give --namespace NS (repeatable) or --all-namespaces", file=sys.stderr)
        return 2
    try:
        token_key = read_key(args.token_key_file)
        previous = read_key(args.previous_token_key_file, PREVIOUS_KEY_SETTING) if args.previous_token_key_file else None
        peer = network_policy_peer(args)
    except ValueError as e:
        print(f"rlkube-operator: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.metrics_port:
        metrics.serve("0.0.0.0", args.metrics_port)
    settings = Settings(status_url_template=args.status_url,
                        network_policy_peer=peer,
                        metrics_scraper_peer=args.metrics_scraper_peer, egress=args.egress_policy,
                        guardrails=args.guardrails,
                        namespaces=None if args.all_namespaces else tuple(args.namespace),
                        token_key=token_key, previous_token_key=previous)
    reconciler = Reconciler(Kube(api_client()), settings)
    operator = functools.partial(
        kopf.operator,
        registry=build_registry(reconciler, interval=args.interval, progress_interval=args.progress_interval,
                                ignored=ignored_namespaces(args)),
        clusterwide=args.all_namespaces,
        namespaces=args.namespace,
        standalone=True,
        liveness_endpoint=args.liveness,
        # kopf's default (`user@host`) asks the password database, which has no entry for the
        # chart's uid 65532: the pod's name instead.
        identity=leader.own_identity(),
    )
    if args.election:
        # Its own client: a renewal never waits for a connection behind reconcile passes.
        return leader.run(leader.LeaseLock(api_client(), args.election), operator, liveness=args.liveness)
    kopf.run(**operator.keywords)
    return 0


if __name__ == "__main__":
    sys.exit(main())
