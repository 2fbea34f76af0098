"""Pure builders: a run's spec in, one Kubernetes manifest (a dict) out.

No API calls here; `reconcile.py` decides which to apply and `kube.py` applies them. Every
manifest carries the run's ownerReference, so deleting the run deletes its children.
"""

import base64
import hashlib
import hmac
import json

from rlkube.config import InferenceServerConfig
from rlkube.config.cli import EXIT_INVALID
from rlkube.scopes import WEIGHTS_PEERS_ENV

from rlkube_operator.components import ServersSpec
from rlkube_operator.names import (
    CHECKPOINT_KEY,
    CHECKPOINT_KEY_ENV,
    COMPLETION_INDEX_LABEL,
    CONFIG_MOUNT,
    JOB_NAME_LABEL,
    TORCHRUN_PORT,
    RunRef,
)
from rlkube_operator.pods import container, http_probes, pod_settings, pod_template
from rlkube_operator.runtoken import checkpoint_key, member_credentials, run_credentials, run_token
from rlkube_operator.spec import RLRunSpec, RunSpecBase
from rlkube_operator.wiring import INFERENCE_URLS, orchestrator_writes, trainer_metrics_port

APPLIED_SPEC_KEY = "applied-spec.json"
APPLIED_SPEC_SIGNATURE_KEY = "applied-spec.sig"
ATTEMPT_ANNOTATION = "rlkube.dev/attempt"
RESTARTS_ANNOTATION = "rlkube.dev/restarts"
POOL_TOKEN_KEY = "token"
"""The pool's token's key in `<pool>-token`."""
SUSPEND_ANNOTATION = "rlkube.dev/suspend"
"""The `spec.suspend` the operator last gave the trainer Job: see `queueing.suspend_patch`."""
def served_toml(name: str) -> str:
    """A served model's config in the ConfigMap (`teacher.toml`, `judge.toml`); there only while
    the run has its children."""
    return f"{name}.toml"


def applied_spec_signature(key: bytes, run: RunRef, text: str) -> str:
    """HMAC-SHA256 of the run's uid and its applied spec, with the operator's key: whoever may
    patch the ConfigMap but lacks the key cannot make a copy the operator trusts."""
    message = b"applied-spec\0" + run.uid.encode() + b"\0" + text.encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def build_configmap(run: RunRef, tomls: dict[str, str], applied_spec: dict, key: bytes) -> dict:
    """The resolved per-process TOMLs, plus the spec they were made from (to detect changes),
    signed (`applied_spec_signature`)."""
    text = json.dumps(applied_spec, sort_keys=True)
    data = dict(tomls) | {APPLIED_SPEC_KEY: text, APPLIED_SPEC_SIGNATURE_KEY: applied_spec_signature(key, run, text)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": run.metadata("config"), "data": data}


def build_token_secret(run: RunRef, key: bytes) -> dict:
    """`<run>-token`: the run's credentials (`rlkube.auth`), one key per scope, which the servers
    of the run require and each pod gets those of its component (`pods.credentials_env`),
    derived from the run's uid and the operator's `key` (`runtoken`): the same for every pass
    and every operator, so the operator only creates it (`Kube.create`), and reads one it finds
    only for the keys an older operator left out (`upgraded_token_secret`). Immutable: nothing
    rotates it under running pods. It also holds the run's checkpoint
    key (`CHECKPOINT_KEY`), which only the trainer's pods and the export Job's pod get."""
    return _token_secret(run, run_credentials(key, run.uid) | {CHECKPOINT_KEY: checkpoint_key(key, run.uid)})


def build_pool_token_secret(pool: RunRef, key: bytes) -> dict:
    """`<pool>-token`: a run's credentials under the pool's token, and the pool's token itself
    (`POOL_TOKEN_KEY`), which the pool's trainer and inference alone get: they derive each
    member's credentials from it (`rlkube.scopes.member_scoped`) to accept each only for that member."""
    return _token_secret(pool, run_credentials(key, pool.uid) | {CHECKPOINT_KEY: checkpoint_key(key, pool.uid),
                                                                 POOL_TOKEN_KEY: run_token(key, pool.uid)})


def build_member_token_secret(run: RunRef, key: bytes, pool_uid: str, member: str) -> dict:
    """A pool member's `<run>-token`: its own credentials (`runtoken.member_credentials`), derived
    from the pool's token and its member name only, under the same keys as a run's, so its pods
    read them as a solo run's do."""
    return _token_secret(run, member_credentials(key, pool_uid, member))


def upgraded_token_secret(existing: dict, built: dict) -> dict | None:
    """The token Secret to replace `existing` with, when an older operator made it without keys
    this operator's pods read (its one `token`, before scopes; a scope added since): `built`'s
    keys, each with the value `existing` holds when it has one (a rotated key changes nothing
    under running pods) and else `built`'s. The checkpoint key is never added: the run's
    checkpoints so far are unsigned, and with a key its trainer would refuse them. None when
    nothing is missing (the Secret stays as it is)."""
    have = existing.get("data") or {}
    wanted = [name for name in built["data"] if name in have or name != CHECKPOINT_KEY]
    if all(name in have for name in wanted):
        return None
    return built | {"data": {name: have.get(name, built["data"][name]) for name in wanted}}


def _token_secret(run: RunRef, values: dict[str, str]) -> dict:
    data = {name: base64.b64encode(value.encode()).decode() for name, value in values.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": run.metadata("token"), "type": "Opaque",
            "immutable": True, "data": data}


def build_pvc(run: RunRef, spec: RunSpecBase) -> dict | None:
    """The run's own claim; None when there is none or the user brings an existing one."""
    pvc = spec.storage.pvc
    if pvc is None or pvc.claim_name:
        return None
    claim = {"accessModes": list(pvc.access_modes), "resources": {"requests": {"storage": pvc.size}}}
    if pvc.storage_class_name:
        claim["storageClassName"] = pvc.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": run.metadata("data"),
        "spec": claim,
    }


def _service(run: RunRef, component: str, ports: list[dict], *, headless: bool, not_ready: bool = False,
             name: str | None = None, selector: dict[str, str] | None = None) -> dict:
    spec = {"selector": selector or run.service_selector(component), "ports": ports}
    if headless:
        spec |= {"clusterIP": "None", "publishNotReadyAddresses": not_ready}
    return {"apiVersion": "v1", "kind": "Service", "metadata": run.metadata(component, name), "spec": spec}


def _tcp(name: str, port: int) -> dict:
    return {"name": name, "port": port, "targetPort": port, "protocol": "TCP"}


def _servers_service(run: RunRef, component: str, port: int) -> dict:
    """Headless: each replica gets `<run>-<component>-<i>.<run>-<component>`, the URLs the
    orchestrator dials."""
    return _service(run, component, [_tcp("http", port)], headless=True)


def build_inference_service(run: RunRef, spec: RLRunSpec) -> dict:
    return _servers_service(run, "inference", spec.config.inference.port)


def build_served_service(run: RunRef, spec: RLRunSpec, name: str) -> dict:
    """The teacher's or the judge's headless Service."""
    return _servers_service(run, name, getattr(spec, name).server.port)


def weights_peers_env(run: RunRef, spec: RLRunSpec) -> list[dict]:
    """The only weight server the policy's replicas send the weights credential to: the
    trainer's rank-0 Service (`rlkube.auth.check_weights_peer`), as `wiring` points them at it."""
    return [{"name": WEIGHTS_PEERS_ENV, "value": f"{run.trainer_master}:{spec.config.weights.grpc_port}"}]


def _servers_statefulset(run: RunRef, spec: RLRunSpec, component: str, pods: ServersSpec,
                         server: InferenceServerConfig, replicas: int) -> dict:
    """`rlkube inference @ <component>.toml` in each pod, Ready once vLLM's `/health` answers."""
    settings = pod_settings(spec, component)
    config_file = f"{component}.toml"
    main = container(
        spec,
        settings,
        component,
        ["rlkube", "inference", "@", f"{CONFIG_MOUNT}/{config_file}"],
        ports=[{"name": "http", "containerPort": server.port}],
        res=pods.resources,
        gpus=pods.gpus_per_replica,
        env=weights_peers_env(run, spec) if component == "inference" else None,
        probes=http_probes("/health", "http", server.startup_timeout_s),
    )
    template = pod_template(run, spec, settings, component, [main], [config_file])
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": run.metadata(component),
        "spec": {
            "serviceName": run.child(component),
            "replicas": replicas,
            # Replicas are independent servers: start them together, not one by one.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": run.selector(component)},
            "template": template,
        },
    }


def build_inference_statefulset(run: RunRef, spec: RLRunSpec, replicas: int) -> dict:
    return _servers_statefulset(run, spec, "inference", spec.inference, spec.config.inference, replicas)


def build_served_statefulset(run: RunRef, spec: RLRunSpec, name: str, replicas: int) -> dict:
    """The teacher's or the judge's servers: the same vLLM server as inference, with its model."""
    served = getattr(spec, name)
    return _servers_statefulset(run, spec, name, served, served.server, replicas)


def build_servers_pdb(run: RunRef, component: str) -> dict:
    """Voluntary disruptions (a node drain, an autoscaler's scale-down) take this run's inference
    (or teacher, judge) pods one at a time: the orchestrator carries on with the other replicas and
    brings a rescheduled inference one back to the current policy, but losing all at once would
    stall the run. A pod that is not Ready may always be evicted, so a crash-looping replica
    never blocks a drain. One budget per run and component (its uid's pods), owned by it: a
    namespace-wide one would count every run's pods against a single `maxUnavailable`."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": run.metadata(component),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": run.service_selector(component)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def _tcp_ports_except(*closed: int) -> list[dict]:
    """Every TCP port but `closed`, as NetworkPolicy port ranges (`endPort`, Kubernetes >= 1.25)."""
    out, start = [], 1
    for port in sorted(set(closed)):
        if port > start:
            out.append({"protocol": "TCP", "port": start, "endPort": port - 1})
        start = port + 1
    return out + [{"protocol": "TCP", "port": start, "endPort": 65535}]


def build_network_policies(run: RunRef, operator_peer: dict, status_port: int, scraper_peer: dict | None,
                           metrics_ports: list[int], serving_ports: list[int] | None,
                           admitted: dict[str, list[dict]] | None = None, tool_port: int | None = None) -> list[dict]:
    """Only the run's own pods reach its pods; the operator reaches `status_port` (`GET
    /status`), and a metrics scraper (`scraper_peer`, a namespace) the ports that serve
    `/metrics` (`metrics_ports`). Nothing else, unless another NetworkPolicy allows it
    (policies add up). Within the run, each pod admits only the pods that need it:
    - the trainer's pods, whose ports take no token (torchrun's store, gloo, NCCL's bootstrap and
      UCX; the weights' gRPC and NCCL store): the trainer's on every port, the inference servers'
      (weights) on all but torchrun's store (`TORCHRUN_PORT`);
    - the other pods of an RLRun: the run's pods on the ports its servers serve, each behind a
      scoped credential (`serving_ports`: vLLM's HTTP, the orchestrator's gRPC and status);
    - the servers' pods (inference, teacher, judge) besides: the trainer and the servers on
      every port (NCCL's and NIXL's data, and the sockets vLLM opens between its own processes,
      none authenticated). The orchestrator and the env workers, which run environments'
      programs, reach none of them.
    - the tool service's pods (`tool_port`, a run with `spec.toolService`): the orchestrator and
      the env workers, whose environments call it, on its port (a fourth policy).
    So three policies for an RLRun, one for an SFTRun (`serving_ports` None: no other pods). A
    NetworkPolicy cannot say "the same run as the target", so each run gets its own, selecting
    its uid's pods. `admitted`: further ingress rules by policy (`network-policy`,
    `trainer-network-policy`): a pool's members and its trainer (`pools`)."""
    uid = run.pod_labels()
    servers = ["inference", "teacher", "judge"]

    def pods(operator: str, components: list[str]) -> dict:
        expression = {"key": "app.kubernetes.io/component", "operator": operator, "values": components}
        return {"matchLabels": uid, "matchExpressions": [expression]}

    def peer(operator: str, components: list[str]) -> dict:
        return {"podSelector": pods(operator, components)}

    outside = [{"from": [operator_peer], "ports": [{"protocol": "TCP", "port": status_port}]}]
    if scraper_peer is not None:
        outside.append({"from": [scraper_peer], "ports": [{"protocol": "TCP", "port": p} for p in metrics_ports]})
    trainer = [
        {"from": [peer("In", ["trainer"])]},
        {"from": [peer("In", ["inference"])], "ports": _tcp_ports_except(TORCHRUN_PORT)},
    ]
    policies = [("trainer-network-policy", pods("In", ["trainer"]), trainer + outside)]
    if serving_ports is not None:  # an RLRun
        served = [{"from": [{"podSelector": {"matchLabels": uid}}],
                   "ports": [{"protocol": "TCP", "port": p} for p in sorted(set(serving_ports))]}]
        policies.insert(0, ("network-policy", pods("NotIn", ["trainer"]), served + outside))
        policies.insert(1, ("servers-network-policy", pods("In", servers),
                            [{"from": [peer("In", ["trainer", *servers])]}]))
    if tool_port is not None:
        policies.append(("tool-service-network-policy", pods("In", ["tool-service"]),
                         [{"from": [peer("In", ["orchestrator", "env-worker"])],
                           "ports": [{"protocol": "TCP", "port": tool_port}]}]))
    return [{
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": run.metadata(name),
        "spec": {"podSelector": selector, "policyTypes": ["Ingress"],
                 "ingress": ingress + (admitted or {}).get(name, [])},
    } for name, selector, ingress in policies]


def build_orchestrator_service(run: RunRef, spec: RLRunSpec) -> dict:
    ports = [
        _tcp("grpc", spec.config.rollouts.port),
        _tcp("http", spec.config.orchestrator.http_port),
    ]
    return _service(run, "orchestrator", ports, headless=False)


def build_orchestrator_deployment(run: RunRef, spec: RLRunSpec, replicas: int, attempt: int) -> dict:
    """One replica, `Recreate`: two orchestrators would serve two different batch streams.
    The attempt annotation restarts it with the trainer (a gang restart resets batch state)."""
    http_port = spec.config.orchestrator.http_port
    settings = pod_settings(spec, "orchestrator")
    main = container(
        spec,
        settings,
        "orchestrator",
        ["rlkube", "orchestrator", "@", f"{CONFIG_MOUNT}/orchestrator.toml"],
        ports=[
            {"name": "grpc", "containerPort": spec.config.rollouts.port},
            {"name": "http", "containerPort": http_port},
        ],
        res=spec.orchestrator.resources,
        probes=http_probes("/healthz", "http", spec.config.inference.startup_timeout_s),
        writable=orchestrator_writes(run, spec),
    )
    annotations = {
        ATTEMPT_ANNOTATION: str(attempt),
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(http_port),
    }
    template = pod_template(run, spec, settings, "orchestrator", [main], ["orchestrator.toml", INFERENCE_URLS],
                            annotations)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": run.metadata("orchestrator"),
        "spec": {
            "replicas": replicas,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": run.selector("orchestrator")},
            "template": template,
        },
    }


def build_env_worker_deployment(run: RunRef, spec: RLRunSpec, replicas: int) -> dict:
    """`<run>-env-worker`: `rlkube env-worker` pods that run the orchestrator's rollouts. Each
    reads the orchestrator's own config (its environments, model, sampling and inference URLs)
    and dials the orchestrator Service's gRPC port; nothing dials a worker, so it has no port
    and no probe. A lost worker's groups are re-issued by the orchestrator, and a worker whose
    orchestrator restarted redials: the pods need no restart with the trainer. CPU only; they
    mount the run's volume read-only, for a model kept on it (the tokenizer)."""
    settings = pod_settings(spec, "env-worker")
    command = ["rlkube", "env-worker", "@", f"{CONFIG_MOUNT}/orchestrator.toml",
               "--rollouts.host", run.service_host("orchestrator")]
    main = container(spec, settings, "env-worker", command, ports=[], res=spec.env_workers.resources)
    template = pod_template(run, spec, settings, "env-worker", [main], ["orchestrator.toml", INFERENCE_URLS])
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": run.metadata("env-worker"),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": run.selector("env-worker")},
            "template": template,
        },
    }


TOOL_REPLICAS_ANNOTATION = "rlkube.dev/tool-service-replicas"
"""The `spec.toolService.replicas` last applied to the tool service Deployment."""


def build_tool_service_service(run: RunRef, spec: RLRunSpec) -> dict:
    """A ClusterIP Service: each call is a new connection, spread over the ready pods."""
    return _service(run, "tool-service", [_tcp("http", spec.tool_service.port)], headless=False)


def build_tool_service_deployment(run: RunRef, spec: RLRunSpec, existing: dict | None) -> dict:
    """`<run>-tool-service`: `rlkube tool-service` pods on the run's image. Its replicas are the
    spec's when `existing` is absent or was last given other ones (`TOOL_REPLICAS_ANNOTATION`),
    else `existing`'s: a `kubectl scale` holds until `spec.toolService.replicas` changes."""
    tools = spec.tool_service
    settings = pod_settings(spec, "tool-service")
    command = ["rlkube", "tool-service", "--host", "0.0.0.0", "--port", str(tools.port), *tools.args]
    probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 2, "failureThreshold": 2}
    main = container(spec, settings, "tool-service", command, ports=[{"name": "http", "containerPort": tools.port}],
                     res=tools.resources, probes={"readinessProbe": probe})
    replicas = tools.replicas
    if existing is not None and existing["metadata"].get("annotations", {}).get(TOOL_REPLICAS_ANNOTATION) == str(replicas):
        replicas = existing["spec"].get("replicas", replicas)
    metadata = run.metadata("tool-service")
    metadata["annotations"] = {TOOL_REPLICAS_ANNOTATION: str(tools.replicas)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": run.selector("tool-service")},
            "template": pod_template(run, spec, settings, "tool-service", [main], []),
        },
    }


def build_trainer_master_service(run: RunRef, spec: RunSpecBase, status_port: int | None = None, *,
                                 attempt: int, attach_port: int | None = None) -> dict:
    """`<run>-trainer-master`: pod 0 of the current trainer Job (`attempt`'s). Headless and
    publishing pods before they are ready: torchrun's rendezvous, the gRPC weight server and the
    NCCL rendezvous all need rank 0 while every pod is still starting, and rank 0 alone serves
    the RL trainer's `/metrics` (a stable scrape target). Such a Service publishes
    terminating pods too, so it selects the current Job's pods only: a new gang never dials an
    old master still in its grace period. `attach_port`: a pool trainer's Attach service."""
    ports = [_tcp("torchrun", TORCHRUN_PORT)]
    weights = getattr(spec.config, "weights", None)
    if weights is not None and weights.type in ("grpc", "nixl"):
        ports.append(_tcp("weights", weights.grpc_port))
    if weights is not None and weights.type == "nccl":
        ports.append(_tcp("nccl", weights.nccl_port))
    if status_port:
        ports.append(_tcp("http", status_port))
    if metrics := trainer_metrics_port(spec):
        ports.append(_tcp("metrics", metrics))
    if attach_port:
        ports.append(_tcp("pool", attach_port))
    selector = run.service_selector("trainer") | {COMPLETION_INDEX_LABEL: "0", JOB_NAME_LABEL: run.trainer_job(attempt)}
    return _service(run, "trainer", ports, headless=True, not_ready=True,
                    name=run.trainer_master_service, selector=selector)


def checkpoint_key_env(run: RunRef) -> dict:
    """The run's checkpoint key (`rlkube.manifest`), in the trainer's pods and the export Job's
    only: what signs and checks its checkpoints and compile cache, so no other pod can forge
    them. Optional: the Secret of a run created before the key existed has none (its trainer
    writes unsigned)."""
    ref = {"name": run.child("token"), "key": CHECKPOINT_KEY, "optional": True}
    return {"name": CHECKPOINT_KEY_ENV, "valueFrom": {"secretKeyRef": ref}}


def trainer_command(run: RunRef, spec: RunSpecBase, module: str, config_file: str) -> list[str]:
    """`rlkube torchrun`: torchrun that checks the config first and exits 2 when a rank does
    (plain torchrun exits 1), which the Job's `podFailurePolicy` reads as no restart fixing it."""
    return [
        "rlkube",
        "torchrun",
        f"--nnodes={spec.trainer.nodes}",
        f"--nproc-per-node={spec.trainer.nproc_per_node()}",
        "--node-rank=$(NODE_RANK)",
        f"--master-addr={run.trainer_master}",
        f"--master-port={TORCHRUN_PORT}",
        "-m",
        module,
        "@",
        f"{CONFIG_MOUNT}/{config_file}",
    ]


def build_trainer_job(
    run: RunRef, spec: RunSpecBase, *, module: str, config_file: str, attempt: int, restarts: int, suspend: bool,
    status_port: int | None = None, active_deadline_seconds: int | None = None, attach_port: int | None = None,
) -> dict:
    """A PyTorchJob-style indexed Job: pod i is torchrun node i, pod 0 is the master.
    The Job carries its attempt and the restart count so far: the reconciler reads them back.
    `backoffLimit: 0`: one failed pod fails the Job, and the operator restarts the whole gang
    from the latest checkpoint (a lone replacement pod could not rejoin the rendezvous), unless
    it exited 2 (`EXIT_INVALID`: the Job fails by its `podFailurePolicy`, and so does the run). A pod
    failing by a disruption (`DisruptionTarget`: preemption, eviction, node drain) does not
    fail the Job (`podFailurePolicy`); the operator restarts the gang without counting it.
    `active_deadline_seconds`: what is left of the run's deadline, so that Kubernetes stops the
    trainer at the deadline even while the operator is down."""
    index_env = {
        "name": "NODE_RANK",
        "valueFrom": {
            "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
        },
    }
    settings = pod_settings(spec, "trainer")
    main = container(
        spec,
        settings,
        "trainer",
        trainer_command(run, spec, module, config_file),
        ports=[{"name": "torchrun", "containerPort": TORCHRUN_PORT}]
        + ([{"name": "http", "containerPort": status_port}] if status_port else [])
        + ([{"name": "metrics", "containerPort": metrics}] if (metrics := trainer_metrics_port(spec)) else [])
        + ([{"name": "pool", "containerPort": attach_port}] if attach_port else []),
        res=spec.trainer.resources,
        gpus=spec.trainer.gpus_per_node,
        env=[index_env, {"name": "MASTER_ADDR", "value": run.trainer_master}, checkpoint_key_env(run)],
    )
    annotations = {ATTEMPT_ANNOTATION: str(attempt)}
    if metrics and spec.trainer.nodes == 1:  # rank 0 serves: pods 1.. of a gang would be targets always down
        annotations |= {"prometheus.io/scrape": "true", "prometheus.io/port": str(metrics)}
    template = pod_template(run, spec, settings, "trainer", [main], [config_file], annotations, restartPolicy="Never")
    nodes = spec.trainer.nodes
    metadata = run.metadata("trainer", name=run.trainer_job(attempt))
    metadata["annotations"] = {ATTEMPT_ANNOTATION: str(attempt), RESTARTS_ANNOTATION: str(restarts),
                               SUSPEND_ANNOTATION: str(suspend).lower()}
    job_spec = {
        "completionMode": "Indexed",
        "completions": nodes,
        "parallelism": nodes,
        "backoffLimit": 0,
        "podFailurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [EXIT_INVALID]}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
        ]},
        "suspend": suspend,
        "template": template,
    }
    if active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = active_deadline_seconds
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": job_spec}
