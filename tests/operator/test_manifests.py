"""Every manifest the operator can produce, checked against the official Kubernetes OpenAPI
schemas (kubernetes-validate, strict: unknown fields are errors), and the pure builders'
choices (GPUs, scheduling, storage, wiring) checked directly."""

import re
import tomllib

import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError
from rlkube.config import RLConfig, SFTConfig, load_config
from rlkube.config.cli import format_validation_error
from rlkube.scopes import SCOPES
from rlkube_operator import builders, crd, threatmodel
from rlkube_operator.names import (
    CHECKPOINT_KEY,
    OPERATOR_ENV,
    OPERATOR_VOLUMES,
    TRAINER_METRICS_PORT,
    RunRef,
    operator_label,
)
from rlkube_operator.podsecurity import IMAGE_UID, PodSecurityContext
from rlkube_operator.reconcile import WORKLOADS, _metrics_ports, _serving_ports, _status_port
from rlkube_operator.spec import RLRunSpec, SFTRunSpec
from rlkube_operator.wiring import trainer_metrics_port

from e2e.localcluster import admission
from tests.operator.test_operator_kmock import EXAMPLES, example

K8S_VERSION = "1.37.0"
GPU_RLRUN = {
    "image": "registry.example/rlkube-runtime-gpu:0.1.0",
    "imagePullSecrets": ["regcred"],
    "serviceAccountName": "trainer-sa",
    "inference": {"replicas": 4, "gpusPerReplica": 1, "resources": {"requests": {"cpu": 8, "memory": "64Gi"}}},
    "trainer": {"nodes": 2, "gpusPerNode": 8, "resources": {"limits": {"memory": "900Gi"}}},
    "storage": {
        "pvc": {"size": "2Ti", "storageClassName": "fast", "accessModes": ["ReadWriteMany"]},
        "objectStore": {"url": "s3://bucket/rl", "secretName": "s3-creds", "endpointUrl": "http://minio:9000"},
    },
    "scheduling": {
        "nodeSelector": {"nvidia.com/gpu.product": "H100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "priorityClassName": "training",
        "schedulerName": "volcano",
    },
    "config": {"max_steps": 1000, "ckpt": {"interval": 50}, "weights": {"type": "grpc"}},
}
TUNED_PODS = {
    "inference": {"pod": {"runtimeClassName": "nvidia", "labels": {"team": "rl"},
                          "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]}},
    "orchestrator": {"pod": {"nodeSelector": {"pool": "cpu"}, "annotations": {"prometheus.io/scrape": "false"}}},
    "trainer": {"nodes": 2, "gpusPerNode": 8, "pod": {
        "nodeSelector": {"nvidia.com/gpu.product": "B200", "zone": "a"},
        "tolerations": [{"key": "spot", "operator": "Exists"}],
        "priorityClassName": "urgent",
        "serviceAccountName": "trainer-only",
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"team": "rl"}}}]}},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}],
        "env": [{"name": "NCCL_DEBUG", "value": "INFO"},
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
        "envFrom": [{"configMapRef": {"name": "nccl-tuning"}}],
        "volumes": [{"name": "cache", "emptyDir": {"sizeLimit": "10Gi"}}],
        "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
        "labels": {"team": "rl"},
        "annotations": {"example.com/owner": "rl-team"},
    }},
}
TUNED_RLRUN = GPU_RLRUN | TUNED_PODS
TEACHER = {
    "model": {"name": "Qwen/Qwen3-32B", "dtype": "bfloat16"},
    "replicas": 2,
    "gpusPerReplica": 4,
    "resources": {"requests": {"cpu": 16, "memory": "256Gi"}},
    "pod": {"nodeSelector": {"pool": "teacher"}, "tolerations": [{"key": "teacher", "operator": "Exists"}],
            "labels": {"role": "teacher"}, "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}]},
    "server": {"max_model_len": 4096, "gpu_memory_utilization": 0.85, "startup_timeout_s": 1800,
               "extra_args": {"max_logprobs": 1}},
}
OPD_RLRUN = GPU_RLRUN | {"teacher": TEACHER, "config": GPU_RLRUN["config"] | {
    "trainer": {"loss": {"type": "opd", "teacher_kl_coef": 1.0}}}}
JUDGE = {"model": {"name": "Qwen/Qwen3-8B"}, "replicas": 2, "gpusPerReplica": 1,
         "server": {"port": 8300, "max_model_len": 8192},
         "sampling": {"temperature": 0.0, "max_tokens": 8, "structured_outputs": {"choice": ["yes", "no"]}}}
JUDGE_RLRUN = GPU_RLRUN | {"judge": JUDGE, "config": GPU_RLRUN["config"] | {
    "orchestrator": {"envs": [{"id": "judged_reverse_text"}]}}}
ENV_WORKERS = {"replicas": 3, "resources": {"requests": {"cpu": 2, "memory": "4Gi"}},
               "pod": {"nodeSelector": {"pool": "cpu"}, "labels": {"team": "rl"},
                       "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}]}}
TUNED_SFTRUN = example("sftrun.yaml")["spec"] | {"trainer": TUNED_PODS["trainer"] | {"nodes": 1}}
RUN = RunRef("RLRun", "big", "ml", "1234-uid")
OPERATOR_PEER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "rlkube"}},
                 "podSelector": {"matchLabels": {"app.kubernetes.io/name": "rlkube-operator"}}}
TOOLS_RLRUN = GPU_RLRUN | {
    "envWorkers": {"replicas": 2},
    "toolService": {"replicas": 3, "args": ["--p50-s", "0.2", "--tail-ratio", "20"], "resources": {"requests": {"cpu": "250m"}}},
    "config": GPU_RLRUN["config"] | {"orchestrator": {"envs": [{"id": "tool_chain"}, {"id": "reverse_text"}]}},
}
SCRAPER_PEER = {"namespaceSelector": {"matchExpressions": [
    {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["monitoring"]}]}}


def manifests(kind: str, spec, attempt: int = 0, suspend: bool = False) -> list[dict]:
    """Everything `Reconciler.apply` would create for this spec."""
    workload = WORKLOADS[kind]
    run = RunRef(kind, RUN.name, RUN.namespace, RUN.uid)
    out = [builders.build_configmap(run, workload.tomls(run, spec), spec.model_dump(mode="json"), b"k" * 32),
           builders.build_token_secret(run, b"k" * 32)]
    if (pvc := builders.build_pvc(run, spec)) is not None:
        out.append(pvc)
    if kind == "RLRun":
        out += [
            builders.build_inference_service(run, spec),
            builders.build_inference_statefulset(run, spec, spec.inference.replicas),
            builders.build_servers_pdb(run, "inference"),
            builders.build_orchestrator_service(run, spec),
            builders.build_orchestrator_deployment(run, spec, 1, attempt),
        ]
        for name, served in spec.served_models().items():
            out += [
                builders.build_served_service(run, spec, name),
                builders.build_served_statefulset(run, spec, name, served.replicas),
                builders.build_servers_pdb(run, name),
            ]
        if spec.env_workers.replicas:
            out.append(builders.build_env_worker_deployment(run, spec, spec.env_workers.replicas))
        if spec.tool_service is not None:
            out += [builders.build_tool_service_service(run, spec), builders.build_tool_service_deployment(run, spec, None)]
    out += [
        builders.build_trainer_master_service(run, spec, workload.trainer_status_port, attempt=attempt),
        *builders.build_network_policies(run, OPERATOR_PEER, _status_port(workload, spec), SCRAPER_PEER,
                                         _metrics_ports(workload, spec), _serving_ports(workload, spec),
                                         tool_port=spec.tool_service.port if getattr(spec, "tool_service", None) else None),
        builders.build_trainer_job(run, spec, module=workload.module, config_file=workload.config_file,
                                   attempt=attempt, restarts=attempt, suspend=suspend,
                                   status_port=workload.trainer_status_port),
    ]
    return out


SPECS = {
    "example-rlrun": ("RLRun", RLRunSpec.model_validate(example("rlrun.yaml")["spec"])),
    "gpu-rlrun": ("RLRun", RLRunSpec.model_validate(GPU_RLRUN)),
    "example-sftrun": ("SFTRun", SFTRunSpec.model_validate(example("sftrun.yaml")["spec"])),
    "tuned-rlrun": ("RLRun", RLRunSpec.model_validate(TUNED_RLRUN)),
    "tuned-sftrun": ("SFTRun", SFTRunSpec.model_validate(TUNED_SFTRUN)),
    "workers-rlrun": ("RLRun", RLRunSpec.model_validate(GPU_RLRUN | {"envWorkers": ENV_WORKERS})),
    "teacher-rlrun": ("RLRun", RLRunSpec.model_validate(OPD_RLRUN)),
    "judge-rlrun": ("RLRun", RLRunSpec.model_validate(JUDGE_RLRUN | {"envWorkers": ENV_WORKERS})),
    "tools-rlrun": ("RLRun", RLRunSpec.model_validate(TOOLS_RLRUN)),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_manifest_validates_against_the_kubernetes_schemas(name):
    kind, spec = SPECS[name]
    for attempt, suspend in ((0, False), (2, True)):
        for obj in manifests(kind, spec, attempt, suspend):
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            assert obj["metadata"]["ownerReferences"][0]["uid"] == RUN.uid


def test_the_example_pvc_validates_too():
    pvc = next(yaml.safe_load_all((EXAMPLES / "sftrun.yaml").read_text()))
    kubernetes_validate.validate(pvc, K8S_VERSION, strict=True)


def test_gpus_scheduling_and_storage_pass_through():
    objs = {o["kind"]: o for o in manifests("RLRun", SPECS["gpu-rlrun"][1])}
    sts_pod = objs["StatefulSet"]["spec"]["template"]["spec"]
    job = objs["Job"]["spec"]
    job_pod = job["template"]["spec"]
    assert sts_pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert sts_pod["containers"][0]["resources"]["requests"] == {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"}
    assert job_pod["containers"][0]["resources"]["limits"] == {"memory": "900Gi", "nvidia.com/gpu": "8"}
    assert (job["completions"], job["parallelism"]) == (2, 2)
    assert "--nproc-per-node=8" in job_pod["containers"][0]["command"]
    orchestrator_pod = objs["Deployment"]["spec"]["template"]["spec"]
    for pod in (sts_pod, job_pod):
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
        assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    # The run-level nodeSelector and tolerations are the GPU nodes': not for the CPU orchestrator.
    assert "nodeSelector" not in orchestrator_pod and "tolerations" not in orchestrator_pod
    for pod in (sts_pod, job_pod, orchestrator_pod):
        assert (pod["priorityClassName"], pod["schedulerName"]) == ("training", "volcano")
        assert pod["serviceAccountName"] == "trainer-sa" and pod["imagePullSecrets"] == [{"name": "regcred"}]
        assert pod["volumes"][1]["persistentVolumeClaim"]["claimName"] == "big-data"
    assert objs["PersistentVolumeClaim"]["spec"]["storageClassName"] == "fast"
    ports = {p["name"] for p in objs["Service"]["spec"]["ports"]}  # the trainer Service (last)
    assert ports == {"torchrun", "weights", "metrics"}


def pods_by_component(kind: str, spec) -> dict[str, dict]:
    """component → its pod template (metadata and spec)."""
    return {o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]: o["spec"]["template"]
            for o in manifests(kind, spec) if "template" in o.get("spec", {})}


def test_component_pod_settings_merge_over_the_run_level_defaults():
    pods = pods_by_component("RLRun", SPECS["tuned-rlrun"][1])
    trainer, inference, orchestrator = (pods[c]["spec"] for c in ("trainer", "inference", "orchestrator"))
    # Maps merge with the component winning; lists come after the run-level ones; scalars override.
    assert trainer["nodeSelector"] == {"nvidia.com/gpu.product": "B200", "zone": "a"}
    assert trainer["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                                      {"key": "spot", "operator": "Exists"}]
    assert (trainer["priorityClassName"], trainer["schedulerName"]) == ("urgent", "volcano")
    assert trainer["serviceAccountName"] == "trainer-only"
    assert trainer["affinity"] == TUNED_PODS["trainer"]["pod"]["affinity"]
    assert trainer["topologySpreadConstraints"][0]["topologyKey"] == "zone"
    (main,) = trainer["containers"]
    assert [e["name"] for e in main["env"]] == ["RLKUBE_TOKEN_ROLLOUTS", "RLKUBE_TOKEN_WEIGHTS", "NODE_RANK", "MASTER_ADDR",
                                                "RLKUBE_CHECKPOINT_KEY", "PYTHONUNBUFFERED", "HOME", "AWS_ENDPOINT_URL",
                                                "NCCL_DEBUG", "HF_TOKEN"]
    assert main["envFrom"] == [{"secretRef": {"name": "s3-creds"}}, {"configMapRef": {"name": "nccl-tuning"}}]
    assert [v["name"] for v in trainer["volumes"]] == ["config", "data", "dshm", "tmp", "cache"]
    assert main["volumeMounts"][-1] == {"name": "cache", "mountPath": "/cache"}
    labels, annotations = pods["trainer"]["metadata"]["labels"], pods["trainer"]["metadata"]["annotations"]
    assert labels["team"] == "rl" and labels["app.kubernetes.io/component"] == "trainer"
    assert annotations == {"rlkube.dev/attempt": "0", "example.com/owner": "rl-team",
                           "scheduling.k8s.io/group-name": "big-pod-group"}  # Volcano's gang
    # Another component gets the run-level settings and its own, never the trainer's.
    assert inference["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
    assert (inference["priorityClassName"], inference["serviceAccountName"]) == ("training", "trainer-sa")
    assert inference["runtimeClassName"] == "nvidia" and "affinity" not in inference
    assert inference["containers"][0]["env"][-1] == {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}
    assert [v["name"] for v in inference["volumes"]] == ["config", "data", "dshm", "tmp"]
    # The orchestrator: its own nodeSelector only, no GPU tolerations.
    assert orchestrator["nodeSelector"] == {"pool": "cpu"} and "tolerations" not in orchestrator
    assert pods["orchestrator"]["metadata"]["annotations"]["prometheus.io/scrape"] == "false"


def test_an_sftruns_trainer_takes_the_same_pod_settings():
    trainer = pods_by_component("SFTRun", SPECS["tuned-sftrun"][1])["trainer"]
    assert trainer["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "B200", "zone": "a"}
    assert trainer["spec"]["serviceAccountName"] == "trainer-only"
    assert trainer["spec"]["volumes"][-1]["name"] == "cache" and trainer["metadata"]["labels"]["team"] == "rl"


def test_the_reserved_names_are_exactly_what_the_operator_sets():
    """What `PodSettings` refuses is what the builders put in every pod by themselves, and the
    run's token, which no pod gets and none may be given: a process derives every scope from it."""
    env, volumes, labels, annotations = set(), set(), set(), set()
    for kind, spec in (SPECS["gpu-rlrun"], SPECS["example-sftrun"]):
        for pod in pods_by_component(kind, spec).values():
            env |= {e["name"] for e in pod["spec"]["containers"][0]["env"]}
            volumes |= {v["name"] for v in pod["spec"]["volumes"]}
            labels |= set(pod["metadata"]["labels"])
            annotations |= set(pod["metadata"].get("annotations", {}))
    assert env | {"RLKUBE_TOKEN"} == set(OPERATOR_ENV)
    assert volumes == set(OPERATOR_VOLUMES)
    assert all(operator_label(key) for key in labels)
    assert {key for key in annotations if key.startswith("rlkube.dev/")} == {"rlkube.dev/attempt"}


@pytest.mark.parametrize(("component", "pod", "refusal"), [
    ("trainer", {"env": [{"name": "MASTER_ADDR", "value": "elsewhere"}]},
     "trainer.pod: env[0].name 'MASTER_ADDR' is set by the operator"),
    ("inference", {"env": [{"name": "A", "value": "1"}, {"name": "PYTHONUNBUFFERED", "value": "0"}]},
     "inference.pod: env[1].name 'PYTHONUNBUFFERED' is set by the operator"),
    ("orchestrator", {"labels": {"rlkube.dev/run": "other"}}, "orchestrator.pod: labels 'rlkube.dev/run'"),
    ("trainer", {"labels": {"app.kubernetes.io/component": "x"}}, "trainer.pod: labels 'app.kubernetes.io/component'"),
    ("trainer", {"annotations": {"rlkube.dev/attempt": "9"}}, "trainer.pod: annotations 'rlkube.dev/attempt'"),
    ("orchestrator", {"volumes": [{"name": "data", "emptyDir": {}}]},
     "orchestrator.pod: volumes[0].name 'data' is the operator's volume"),
    ("inference", {"volumes": [{"emptyDir": {}}]}, "inference.pod: volumes[0] needs a name"),
])
def test_pod_settings_that_override_the_operators_own_are_refused_naming_the_field(component, pod, refusal):
    spec = GPU_RLRUN | {component: {"pod": pod}}
    with pytest.raises(ValidationError) as error:
        RLRunSpec.model_validate(spec)
    assert refusal in format_validation_error(error.value)


def restricted_violations(pod: dict) -> list[str]:
    """What breaks the `restricted` Pod Security Standard (kubernetes.io/docs/concepts/security/
    pod-security-standards), as the API server's admission checks it."""
    volume_types = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                    "projected", "secret"}
    pod_ctx = pod.get("securityContext", {})
    out = [f"{key}" for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]
    out += [f"volume {v['name']}" for v in pod.get("volumes", []) if not set(v) - {"name"} <= volume_types]
    for c in pod["containers"] + pod.get("initContainers", []):
        ctx = c.get("securityContext", {})
        effective = pod_ctx | ctx  # a container's own setting wins
        caps = ctx.get("capabilities", {})
        checks = {
            "privileged": not ctx.get("privileged"),
            "allowPrivilegeEscalation": ctx.get("allowPrivilegeEscalation") is False,
            "capabilities.drop": "ALL" in caps.get("drop", []),
            "capabilities.add": set(caps.get("add", [])) <= {"NET_BIND_SERVICE"},
            "runAsNonRoot": effective.get("runAsNonRoot") is True,
            "runAsUser": effective.get("runAsUser") != 0,
            "seccompProfile": effective.get("seccompProfile", {}).get("type") in ("RuntimeDefault", "Localhost"),
            "hostPort": not any(port.get("hostPort") for port in c.get("ports", [])),
        }
        out += [f"{c['name']}: {check}" for check, ok in checks.items() if not ok]
    return out


def pod_templates(kind: str, spec) -> list[dict]:
    return [o["spec"]["template"]["spec"] for o in manifests(kind, spec) if "template" in o.get("spec", {})]


@pytest.mark.parametrize("name", ["example-rlrun", "example-sftrun", "gpu-rlrun", "tuned-rlrun", "workers-rlrun",
                                  "teacher-rlrun", "tools-rlrun"])
def test_every_pod_meets_the_restricted_standard_by_default(name):
    kind, spec = SPECS[name]
    unset = spec.model_copy(update={"security_context": type(spec).model_fields["security_context"].default})
    pods = pod_templates(kind, unset)
    assert len(pods) == (3 + bool(spec.env_workers.replicas) + bool(spec.teacher) + bool(spec.tool_service)
                         if kind == "RLRun" else 1)
    for pod in pods:
        assert restricted_violations(pod) == []
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsUser"] == pod["securityContext"]["fsGroup"] == IMAGE_UID
        for c in pod["containers"]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/tmp", "/dev/shm"}
    for obj in manifests(kind, unset):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_a_spec_stored_without_a_security_context_gets_the_restricted_one():
    spec = SPECS["example-rlrun"][1].model_dump(by_alias=True) | {"securityContext": None}
    assert RLRunSpec.model_validate(spec).security_context == PodSecurityContext()


def test_a_security_context_no_container_could_start_with_is_refused():
    """By the operator, and at admission by the CRD's rule (runAsNonRoot defaults to true)."""
    spec = example("rlrun.yaml")["spec"] | {"securityContext": {"runAsUser": 0}}
    with pytest.raises(ValidationError) as error:
        RLRunSpec.model_validate(spec)
    assert "securityContext: runAsUser 0 is root, and runAsNonRoot is true" in format_validation_error(error.value)
    schema = crd.build_crd("RLRun")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    run = {"apiVersion": "rlkube.dev/v1alpha1", "kind": "RLRun", "metadata": {"name": "r"}, "spec": spec}
    assert [v for v in admission.check(schema, run) if "runAsUser 0 is root" in v]


STORE = {"url": "s3://bucket/rl", "secretName": "s3-rw", "endpointUrl": "http://minio:9000"}


@pytest.mark.parametrize("weights, read_only, inference_gets", [
    ({"type": "storage"}, None, "s3-rw"),  # weights through the store: inference reads them
    ({"type": "storage"}, "s3-ro", "s3-ro"),
    ({"type": "grpc"}, "s3-ro", None),  # weights by gRPC: inference never touches the store
    ({"type": "storage", "url": "/data/weights"}, "s3-ro", None),  # weights on the shared volume
])
def test_object_store_credentials_reach_only_the_components_that_use_the_store(weights, read_only, inference_gets):
    spec = example("rlrun.yaml")["spec"] | {
        "storage": {"pvc": {"claimName": "c"}, "objectStore": STORE | {"readOnlySecretName": read_only}},
        "envWorkers": {"replicas": 2}, "teacher": TEACHER | {"gpusPerReplica": 0},
    }
    spec["config"] = spec["config"] | {"weights": weights}
    pods = pods_by_component("RLRun", RLRunSpec.model_validate(spec))
    secrets = {component: [ref["secretRef"]["name"] for ref in pod["spec"]["containers"][0].get("envFrom", [])]
               for component, pod in pods.items()}
    assert secrets == {"trainer": ["s3-rw"], "orchestrator": ["s3-rw"], "inference": [inference_gets] if inference_gets
                       else [], "env-worker": [], "teacher": []}
    (sft,) = pod_templates("SFTRun", SFTRunSpec.model_validate(example("sftrun.yaml")["spec"] | {
        "storage": {"objectStore": STORE}}))
    assert sft["containers"][0]["envFrom"] == [{"secretRef": {"name": "s3-rw"}}]


@pytest.mark.parametrize("store, field, what", [
    ({"url": "s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/rl"}, "url", "user info"),
    ({"url": "s3://bucket/rl?access_key=AKIAEXAMPLE"}, "url", "'access_key'"),
    ({"url": "gs://bucket/rl?token=ya29.secret"}, "url", "'token'"),
    ({"url": "s3://bucket/rl", "endpointUrl": "http://minio:minio123@minio:9000"}, "endpointUrl", "user info"),
    ({"url": "s3://bucket/rl?X-Amz-Signature=abc"}, "url", "'X-Amz-Signature'"),
])
def test_credentials_in_object_store_urls_are_refused_naming_the_field(store, field, what):
    """Refused by the operator's model and by the CRD's CEL rule at admission, without echoing
    the secret; a URL never reaches the ConfigMap with one."""
    spec = example("rlrun.yaml")["spec"] | {"storage": {"pvc": {"claimName": "c"}, "objectStore": store}}
    with pytest.raises(ValidationError) as error:
        RLRunSpec.model_validate(spec)
    message = format_validation_error(error.value)
    assert f"storage.objectStore: {field} holds a credential (" in message and what in message
    assert not any(part in message for part in ("wJalrXUtnFEMI", "AKIAEXAMPLE", "ya29", "minio123", "abc)"))
    schema = crd.build_crd("RLRun")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    run = {"apiVersion": "rlkube.dev/v1alpha1", "kind": "RLRun", "metadata": {"name": "r"}, "spec": spec}
    assert [v for v in admission.check(schema, run) if f"storage.objectStore.{field} must not hold" in v]
    clean = spec | {"storage": {"pvc": {"claimName": "c"}, "objectStore": STORE}}
    assert admission.check(schema, run | {"spec": clean}) == []
    RLRunSpec.model_validate(clean)


def test_gpus_per_replica_become_vllms_tensor_parallel_size():
    from rlkube.config import InferenceConfig
    from rlkube.inference.server import vllm_command

    two = RLRunSpec.model_validate(GPU_RLRUN | {"inference": GPU_RLRUN["inference"] | {"gpusPerReplica": 2}})
    objects = manifests("RLRun", two)
    (inference,) = [o for o in objects if o["kind"] == "StatefulSet"]
    assert inference["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    config = InferenceConfig.model_validate(tomllib.loads(objects[0]["data"]["inference.toml"]))
    args = vllm_command(config, on_cpu=False).args
    assert args[args.index("--tensor-parallel-size") + 1] == "2"


@pytest.mark.parametrize("serving", ["adapter", "merge"])
def test_a_lora_runs_inference_pods_serve_its_adapter_and_the_orchestrator_requests_it(serving):
    """`trainer.lora.serving = "adapter"` reaches the pods: each inference pod's vLLM starts
    with LoRA support at the adapter's rank and rlkube's load route, and the orchestrator's
    config names the adapter; `merge` leaves both as for full weights."""
    from rlkube.config import InferenceConfig, OrchestratorConfig
    from rlkube.config.inference import POLICY_ADAPTER
    from rlkube.inference.server import LORA_MIDDLEWARE, vllm_command

    lora = {"trainer": {"lora": {"rank": 32, "serving": serving}, "optim": {"lr": 1e-4}}}
    spec = RLRunSpec.model_validate(GPU_RLRUN | {"config": GPU_RLRUN["config"] | lora})
    data = manifests("RLRun", spec)[0]["data"]
    args = vllm_command(InferenceConfig.model_validate(tomllib.loads(data["inference.toml"])), on_cpu=False).args
    client = OrchestratorConfig.model_validate(tomllib.loads(data["orchestrator.toml"])).client
    if serving == "merge":
        assert "--enable-lora" not in args and client.lora_adapter is None
        return
    assert args[args.index("--max-lora-rank") + 1] == "32" and LORA_MIDDLEWARE in args
    assert client.lora_adapter == POLICY_ADAPTER


def test_env_workers_are_a_cpu_deployment_running_the_orchestrators_config(tmp_path):
    """`envWorkers.replicas` pods of `rlkube env-worker @ orchestrator.toml`, dialing the
    orchestrator's Service; the run's pod labels (so its NetworkPolicy admits them), none of
    the GPU nodes' scheduling; and the orchestrator told to wait for them."""
    from rlkube.config import OrchestratorConfig, load_config

    objs = manifests("RLRun", SPECS["workers-rlrun"][1])
    deployments = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Deployment"}
    workers = deployments["big-env-worker"]
    assert set(deployments) == {"big-orchestrator", "big-env-worker"}
    assert workers["metadata"]["ownerReferences"] == [RUN.owner_reference()]
    assert workers["spec"]["replicas"] == 3
    assert workers["spec"]["selector"]["matchLabels"] == {"rlkube.dev/run": "big",
                                                         "app.kubernetes.io/component": "env-worker"}
    template = workers["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert RUN.pod_labels().items() <= labels.items() and labels["team"] == "rl"
    policy = next(o for o in objs if o["kind"] == "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert labels["app.kubernetes.io/component"] not in policy["spec"]["podSelector"]["matchExpressions"][0]["values"]
    pod = template["spec"]
    (main,) = pod["containers"]
    assert main["command"] == ["rlkube", "env-worker", "@", "/etc/rlkube/orchestrator.toml",
                               "--rollouts.host", "big-orchestrator.ml.svc"]
    assert main["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}}  # no GPU
    assert main["ports"] == [] and not {"readinessProbe", "livenessProbe", "startupProbe"} & set(main)
    assert main["env"][-1] == {"name": "HF_HUB_OFFLINE", "value": "1"}
    # The GPU nodes' selector and tolerations are not theirs; what goes to every pod is.
    assert pod["nodeSelector"] == {"pool": "cpu"} and "tolerations" not in pod
    assert (pod["priorityClassName"], pod["schedulerName"]) == ("training", "volcano")
    assert pod["volumes"][0]["configMap"]["items"] == [{"key": "orchestrator.toml", "path": "orchestrator.toml"},
                                                       {"key": "inference_urls", "path": "inference_urls"}]

    # The worker's own command line, loaded as `rlkube env-worker` loads it.
    path = tmp_path / "orchestrator.toml"
    path.write_text(objs[0]["data"]["orchestrator.toml"])
    config = load_config(OrchestratorConfig, [str(path) if a.endswith(".toml") else a for a in main["command"][2:]])
    assert config.env_workers == 3 and config.rollouts.host == "big-orchestrator.ml.svc"
    assert config.rollouts.port == SPECS["workers-rlrun"][1].config.rollouts.port
    assert len(config.client.base_urls) == 4

    # None by default: rollouts run in the orchestrator, and nothing waits for workers.
    plain = manifests("RLRun", SPECS["gpu-rlrun"][1])
    assert [o["metadata"]["name"] for o in plain if o["kind"] == "Deployment"] == ["big-orchestrator"]
    assert tomllib.loads(plain[0]["data"]["orchestrator.toml"]).get("env_workers", 0) == 0


def test_the_teacher_is_a_vllm_statefulset_of_its_model_on_the_gpu_nodes(tmp_path):
    """`teacher`: `<run>-teacher`, a StatefulSet of `rlkube inference @ teacher.toml` pods with
    the teacher's GPUs, resources and pod settings over the run-level GPU scheduling, a headless
    Service and a disruption budget; its config, loaded as `rlkube inference` loads it, serves
    the teacher's model unpaused and sharded over the pod's GPUs."""
    from rlkube.config import InferenceConfig
    from rlkube.inference.server import START_PAUSED_MIDDLEWARE, vllm_command

    objs = {(o["kind"], o["metadata"]["name"]): o for o in manifests("RLRun", SPECS["teacher-rlrun"][1])}
    sts = objs["StatefulSet", "big-teacher"]
    assert sts["metadata"]["ownerReferences"] == [RUN.owner_reference()]
    assert (sts["spec"]["replicas"], sts["spec"]["serviceName"], sts["spec"]["podManagementPolicy"]) == (
        2, "big-teacher", "Parallel")
    assert sts["spec"]["selector"]["matchLabels"] == {"rlkube.dev/run": "big", "app.kubernetes.io/component": "teacher"}
    template = sts["spec"]["template"]
    pod = template["spec"]
    (main,) = pod["containers"]
    assert main["image"] == GPU_RLRUN["image"]
    assert main["command"] == ["rlkube", "inference", "@", "/etc/rlkube/teacher.toml"]
    assert main["resources"] == {"requests": {"cpu": "16", "memory": "256Gi", "nvidia.com/gpu": "4"},
                                 "limits": {"nvidia.com/gpu": "4"}}
    assert main["ports"] == [{"name": "http", "containerPort": 8000}]
    assert main["startupProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert main["startupProbe"]["failureThreshold"] == 180  # the teacher's own startup timeout, 1800 s
    assert main["readinessProbe"]["httpGet"]["path"] == "/health"
    assert main["env"][-1] == {"name": "HF_HUB_OFFLINE", "value": "1"}
    # The run-level GPU scheduling, then the teacher's own; what goes to every pod.
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "H100", "pool": "teacher"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                                  {"key": "teacher", "operator": "Exists"}]
    assert (pod["priorityClassName"], pod["schedulerName"], pod["serviceAccountName"]) == (
        "training", "volcano", "trainer-sa")
    assert pod["volumes"][0]["configMap"]["items"] == [{"key": "teacher.toml", "path": "teacher.toml"}]
    labels = template["metadata"]["labels"]
    assert labels["role"] == "teacher" and RUN.pod_labels().items() <= labels.items()
    assert template["metadata"]["annotations"] == {"scheduling.k8s.io/group-name": "big-pod-group"}

    service = objs["Service", "big-teacher"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["ports"][0]["port"] == 8000
    assert service["spec"]["selector"].items() <= labels.items()
    pdb = objs["PodDisruptionBudget", "big-teacher"]
    assert pdb["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    assert not pdb["spec"]["selector"]["matchLabels"].items() <= (
        objs["StatefulSet", "big-inference"]["spec"]["template"]["metadata"]["labels"].items())

    (tmp_path / "teacher.toml").write_text(objs["ConfigMap", "big-config"]["data"]["teacher.toml"])
    config = load_config(InferenceConfig, ["@", str(tmp_path / "teacher.toml")])
    assert (config.model.name, config.model.dtype) == ("Qwen/Qwen3-32B", "bfloat16")
    assert (config.host, config.port, config.start_paused) == ("0.0.0.0", 8000, False)
    assert (config.tensor_parallel_size, config.max_model_len, config.gpu_memory_utilization) == (4, 4096, 0.85)
    args = vllm_command(config, on_cpu=False).args
    assert args[args.index("--model") + 1] == "Qwen/Qwen3-32B" and START_PAUSED_MIDDLEWARE not in args
    assert args[args.index("--max-logprobs") + 1] == "1"


def test_the_orchestrator_asks_the_teachers_pods_for_the_teachers_model(tmp_path):
    """The orchestrator's config names the teacher's model and each teacher pod's stable name;
    the spec stores only what the user wrote (the operator's teacher fields are not theirs)."""
    from rlkube.config import OrchestratorConfig

    spec = SPECS["teacher-rlrun"][1]
    data = manifests("RLRun", spec)[0]["data"]
    (tmp_path / "orchestrator.toml").write_text(data["orchestrator.toml"])
    teacher = load_config(OrchestratorConfig, ["@", str(tmp_path / "orchestrator.toml")]).teacher
    assert teacher.model == "Qwen/Qwen3-32B"
    assert teacher.base_urls == [f"http://big-teacher-{i}.big-teacher.ml.svc:8000" for i in range(2)]
    assert "orchestrator" not in spec.model_dump(exclude_unset=True)["config"]  # the user wrote none
    assert "teacher" not in tomllib.loads(data["inference.toml"]) | tomllib.loads(data["trainer.toml"])

    # The user may tune the connection (with the same model, or none); the operator's fields are its own.
    tuned = OPD_RLRUN | {"config": OPD_RLRUN["config"] | {"orchestrator": {"teacher": {"max_concurrent": 8}}}}
    orchestrator = tomllib.loads(manifests("RLRun", RLRunSpec.model_validate(tuned))[0]["data"]["orchestrator.toml"])
    assert orchestrator["teacher"]["max_concurrent"] == 8 and len(orchestrator["teacher"]["base_urls"]) == 2
    refusals = [
        ({"model": "other"}, "config.orchestrator.teacher.model ('other') must equal teacher.model.name"),
        ({"base_urls": ["http://elsewhere:8000"]}, "config.orchestrator.teacher.base_urls: the operator points them"),
    ]
    for given, refusal in refusals:
        bad = OPD_RLRUN | {"config": OPD_RLRUN["config"] | {"orchestrator": {"teacher": given}}}
        with pytest.raises(ValidationError, match=re.escape(refusal)):
            RLRunSpec.model_validate(bad)
    # Without the block: no teacher anywhere, and a distilling loss is refused naming the teacher.
    plain = manifests("RLRun", SPECS["gpu-rlrun"][1])
    assert "teacher.toml" not in plain[0]["data"] and "teacher" not in tomllib.loads(plain[0]["data"]["orchestrator.toml"])
    assert not [o for o in plain if o["metadata"]["name"] == "big-teacher"]
    with pytest.raises(ValidationError, match="distills from a teacher, but neither .* nor orchestrator.teacher"):
        RLRunSpec.model_validate(OPD_RLRUN | {"teacher": None})


def test_the_judge_is_served_behind_the_runs_token_and_network_policy(tmp_path):
    """`judge`: vLLM servers `big-judge-<i>` of the judge's model on the GPU nodes, that the
    orchestrator and the env workers (their loopback endpoints) call with the judge's sampling.
    Every judge pod gets the run's generate credential alone (its vLLM accepts no other scope)
    and no store credentials; the orchestrator is told the judge is the run's own; the
    run's NetworkPolicy admits only the run's pods (and the scraper, on its metrics port)."""
    from rlkube.config import InferenceConfig, OrchestratorConfig

    spec = SPECS["judge-rlrun"][1]
    objs = {(o["kind"], o["metadata"]["name"]): o for o in manifests("RLRun", spec)}
    data = objs["ConfigMap", "big-config"]["data"]
    (tmp_path / "orchestrator.toml").write_text(data["orchestrator.toml"])
    (tmp_path / "judge.toml").write_text(data["judge.toml"])
    judge = load_config(OrchestratorConfig, ["@", str(tmp_path / "orchestrator.toml")]).judge
    assert judge.model == "Qwen/Qwen3-8B" and judge.sampling == JUDGE["sampling"]
    assert judge.base_urls == [f"http://big-judge-{i}.big-judge.ml.svc:8300" for i in range(2)]
    served = load_config(InferenceConfig, ["@", str(tmp_path / "judge.toml")])
    assert (served.model.name, served.port, served.start_paused, served.max_model_len) == ("Qwen/Qwen3-8B", 8300, False, 8192)
    assert served.host == "0.0.0.0"

    sts = objs["StatefulSet", "big-judge"]
    assert sts["spec"]["replicas"] == 2 and sts["spec"]["serviceName"] == "big-judge"
    pod = sts["spec"]["template"]["spec"]
    (main,) = pod["containers"]
    assert main["command"] == ["rlkube", "inference", "@", "/etc/rlkube/judge.toml"]
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "1" and pod["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
    assert [e for e in main["env"] if e["name"].startswith("RLKUBE_TOKEN")] == [
        {"name": "RLKUBE_TOKEN_GENERATE", "valueFrom": {"secretKeyRef": {"name": "big-token", "key": "generate"}}}]
    assert judge.served_by_run
    assert "envFrom" not in main, "no object-store credentials for the judge"
    assert objs["Service", "big-judge"]["spec"]["clusterIP"] == "None"
    assert objs["PodDisruptionBudget", "big-judge"]["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "judge"
    labels = sts["spec"]["template"]["metadata"]["labels"]
    policy = objs["NetworkPolicy", "big-network-policy"]["spec"]
    (expression,) = policy["podSelector"]["matchExpressions"]
    assert labels["app.kubernetes.io/component"] not in expression["values"] and expression["operator"] == "NotIn"
    assert all(labels[k] == v for k, v in policy["podSelector"]["matchLabels"].items()), "the policy selects the judge"
    assert policy["ingress"][0]["from"] == [{"podSelector": {"matchLabels": policy["podSelector"]["matchLabels"]}}]
    assert {"protocol": "TCP", "port": 8300} in policy["ingress"][0]["ports"]  # the run's pods: the judge's vLLM
    assert {"protocol": "TCP", "port": 8300} in policy["ingress"][-1]["ports"]  # the scraper: vLLM's /metrics
    servers = objs["NetworkPolicy", "big-servers-network-policy"]["spec"]
    assert servers["podSelector"]["matchExpressions"][0]["values"] == ["inference", "teacher", "judge"]
    assert servers["ingress"][0]["from"][0]["podSelector"]["matchExpressions"][0]["values"] == [
        "trainer", "inference", "teacher", "judge"]


@pytest.mark.parametrize(("change", "refusal"), [
    ({"config": {"judge": {"model": {"name": "j"}}}}, "config.judge is the judge server `rlkube rl` starts"),
    ({"config": {"orchestrator": {"judge": {"model": "other"}}}},
     "config.orchestrator.judge.model ('other') must equal judge.model.name ('Qwen/Qwen3-8B')"),
    ({"config": {"orchestrator": {"judge": {"base_urls": ["http://judge:8000"]}}}},
     "config.orchestrator.judge.base_urls: the operator points them at the judge's servers"),
])
def test_the_judges_own_fields_are_the_operators(change, refusal):
    with pytest.raises(ValidationError, match=re.escape(refusal)):
        RLRunSpec.model_validate(JUDGE_RLRUN | change)
    tuned = RLRunSpec.model_validate(JUDGE_RLRUN | {"config": {"orchestrator": {"judge": {"wait_s": 5}}}})
    assert "model" not in tuned.model_dump(exclude_unset=True)["config"]["orchestrator"]["judge"]


def test_the_teacher_model_is_required_naming_the_field():
    with pytest.raises(ValidationError) as error:
        RLRunSpec.model_validate(OPD_RLRUN | {"teacher": TEACHER | {"model": {"dtype": "bfloat16"}}})
    assert "teacher.model.name: Field required" in format_validation_error(error.value)


def test_config_env_workers_must_match_the_env_worker_replicas():
    with pytest.raises(ValidationError) as error:
        RLRunSpec.model_validate(GPU_RLRUN | {"config": {"orchestrator": {"env_workers": 2}}})
    assert "config.orchestrator.env_workers (2) must equal envWorkers.replicas (0)" in str(error.value)
    both = GPU_RLRUN | {"envWorkers": {"replicas": 2}, "config": {"orchestrator": {"env_workers": 2}}}
    assert RLRunSpec.model_validate(both).env_workers.replicas == 2


def test_a_spec_applied_by_an_older_operator_is_no_change_for_fields_added_since():
    """A running run whose applied spec predates `envWorkers` is not refused as changed."""
    import json

    from rlkube_operator.guardrails import Guardrails
    from rlkube_operator.reconcile import WORKLOADS, Reconciler, Settings

    spec = SPECS["example-rlrun"][1]
    stored = json.loads(json.dumps(spec.model_dump(mode="json", by_alias=True)))
    del stored["envWorkers"]

    class OldConfigMap:
        def get(self, kind, namespace, name):
            return {"metadata": {"ownerReferences": [RUN.owner_reference()]},
                    "data": {builders.APPLIED_SPEC_KEY: json.dumps(stored)}}

    # Unsigned (an older operator's): it runs only within the guardrails, which allow its claim.
    allowing = Settings(guardrails=Guardrails(allowed_claims=["reverse-text-shared"]))
    applied, refusal = Reconciler(OldConfigMap(), allowing).applied_spec(RUN, WORKLOADS["RLRun"], spec)
    assert refusal is None and applied.env_workers.replicas == 0


def test_cluster_wiring_of_the_process_configs():
    cm = manifests("RLRun", SPECS["gpu-rlrun"][1], attempt=3)[0]["data"]
    orchestrator = tomllib.loads(cm["orchestrator.toml"])
    trainer = tomllib.loads(cm["trainer.toml"])
    assert len(orchestrator["client"]["base_urls"]) == 4
    assert orchestrator["weights"]["grpc_host"] == "big-trainer-master.ml.svc"  # where replicas pull
    assert trainer["weights"]["grpc_host"] == "big-trainer-master.ml.svc"  # what rank 0 advertises
    assert trainer["weights"]["grpc_bind_host"] == "0.0.0.0"  # where rank 0 serves
    assert trainer["output_dir"] == "/data/big" and trainer["ckpt"]["resume_step"] == "latest"
    assert trainer["ckpt"]["url"] == "s3://bucket/rl/ml/big/checkpoints"
    storage = RLRunSpec.model_validate(GPU_RLRUN | {"config": {"weights": {"type": "storage"}}})
    cm = manifests("RLRun", storage)[0]["data"]
    assert tomllib.loads(cm["orchestrator.toml"])["weights"]["url"] == "s3://bucket/rl/ml/big/weights"
    # rank 0 of an RL trainer serves /metrics on every interface of its pod
    assert trainer["metrics"] == {"prometheus_port": TRAINER_METRICS_PORT, "prometheus_host": "0.0.0.0"}
    # An SFT trainer serves its progress on 8080 (the operator reads it); an RL trainer its metrics.
    (sft_job,) = [o for o in manifests("SFTRun", SPECS["example-sftrun"][1]) if o["kind"] == "Job"]
    (rl_job,) = [o for o in manifests("RLRun", storage) if o["kind"] == "Job"]
    ports = {kind: [p["name"] for p in job["spec"]["template"]["spec"]["containers"][0]["ports"]]
             for kind, job in (("SFTRun", sft_job), ("RLRun", rl_job))}
    assert ports == {"SFTRun": ["torchrun", "http"], "RLRun": ["torchrun", "metrics"]}


def _interface_address() -> str:
    """This machine's address on its network (not loopback): what a scraper on another pod dials."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.255", 1))  # picks the route's interface; sends nothing
        return probe.getsockname()[0]


def test_a_scraper_reaches_the_rl_trainers_metrics_on_the_port_its_pod_service_and_policy_open(tmp_path):
    """The rendered trainer.toml makes rank 0 serve /metrics on every interface (like the
    orchestrator's), on the port the trainer pod declares, its master Service names and the
    run's NetworkPolicy opens to the scraper: a real endpoint built from that config answers on
    the machine's non-loopback address."""
    import urllib.request

    from rlkube.config import TrainerConfig
    from rlkube.metrics import MetricsSink

    from tests.fixtures.inference import free_port

    port = free_port()  # the user's port is kept; the default (TRAINER_METRICS_PORT) may be taken here
    config = GPU_RLRUN["config"] | {"trainer": {"metrics": {"prometheus_port": port}}}
    spec = RLRunSpec.model_validate(GPU_RLRUN | {"trainer": {"nodes": 1, "gpusPerNode": 8}, "config": config})
    objs = {(o["kind"], o["metadata"]["name"]): o for o in manifests("RLRun", spec)}
    (tmp_path / "trainer.toml").write_text(objs["ConfigMap", "big-config"]["data"]["trainer.toml"])
    trainer = load_config(TrainerConfig, ["@", str(tmp_path / "trainer.toml")])
    pod = objs["Job", "big-trainer-0"]["spec"]["template"]
    assert {"name": "metrics", "containerPort": port} in pod["spec"]["containers"][0]["ports"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    assert {"name": "metrics", "port": port, "protocol": "TCP"}.items() <= next(
        p for p in objs["Service", "big-trainer-master"]["spec"]["ports"] if p["name"] == "metrics").items()

    for name in ("big-network-policy", "big-trainer-network-policy"):
        policy = objs["NetworkPolicy", name]["spec"]["ingress"]
        assert {"from": [SCRAPER_PEER], "ports": [{"protocol": "TCP", "port": p} for p in sorted((8000, 8080, port))]} in policy

    with MetricsSink(tmp_path, "trainer", console=False,
                     prometheus=(trainer.metrics.prometheus_host, trainer.metrics.prometheus_port)) as sink:
        sink.log(1, {"perf/tokens_per_s": 100.0})
        url = f"http://{_interface_address()}:{port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert "rlkube_trainer_perf_tokens_per_s 100.0" in response.read().decode()


@pytest.mark.parametrize("transfer", ["grpc", "nccl"])
def test_rank_0_is_reached_through_the_stable_master_service(transfer, tmp_path):
    """gRPC weights, the NCCL rendezvous, torchrun and a metrics scraper all reach the trainer's
    rank 0 at `<run>-trainer-master`, whose ports match what the loaded process configs use."""
    from rlkube.config import TrainerConfig

    spec = RLRunSpec.model_validate(GPU_RLRUN | {"config": {"weights": {"type": transfer}}})
    objs = {(o["kind"], o["metadata"]["name"]): o for o in manifests("RLRun", spec)}
    (tmp_path / "trainer.toml").write_text(objs["ConfigMap", "big-config"]["data"]["trainer.toml"])
    trainer = load_config(TrainerConfig, ["@", str(tmp_path / "trainer.toml")])
    master = objs["Service", "big-trainer-master"]
    assert trainer.weights.grpc_host == "big-trainer-master.ml.svc"
    ports = {p["name"]: p["port"] for p in master["spec"]["ports"]}
    wanted = {"grpc": ("weights", trainer.weights.grpc_port), "nccl": ("nccl", trainer.weights.nccl_port)}[transfer]
    assert ports == {"torchrun": 29500, wanted[0]: wanted[1], "metrics": trainer.metrics.prometheus_port}
    if transfer == "nccl":  # the trainer drives each replica by its stable pod name
        assert trainer.weights.inference_urls == [f"http://big-inference-{i}.big-inference.ml.svc:8000"
                                                  for i in range(4)]
    pod = objs["Job", "big-trainer-0"]["spec"]["template"]
    assert f"--master-addr={trainer.weights.grpc_host}" in pod["spec"]["containers"][0]["command"]
    pod0_labels = pod["metadata"]["labels"] | {"batch.kubernetes.io/job-completion-index": "0",
                                                "batch.kubernetes.io/job-name": "big-trainer-0"}
    assert master["spec"]["selector"].items() <= pod0_labels.items()
    assert not master["spec"]["selector"].items() <= (pod0_labels | {"rlkube.dev/run-uid": "other"}).items()
    assert not master["spec"]["selector"].items() <= (pod0_labels | {"batch.kubernetes.io/job-name": "big-trainer-1"}).items()


@pytest.mark.parametrize("config, field", [
    ({"ckpt": {"url": "s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/ckpt"}}, "config.ckpt.url"),
    ({"weights": {"type": "storage", "url": "gs://bucket/w?access_token=ya29.secret"}}, "config.weights.url"),
])
def test_credentials_in_the_configs_urls_are_refused_naming_the_field(config, field):
    """The config becomes the run's ConfigMap: no credentials in its URLs either."""
    spec = example("rlrun.yaml")["spec"]
    with pytest.raises(ValidationError) as error:
        RLRunSpec.model_validate(spec | {"config": spec["config"] | config})
    message = format_validation_error(error.value)
    assert f"{field} holds a credential" in message
    assert not any(part in message for part in ("wJalrXUtnFEMI", "AKIAEXAMPLE", "ya29"))


def test_no_manifest_carries_a_secret_value():
    """Credentials are referenced (envFrom a Secret), never copied; the one Secret produced is
    the run's own credentials, one per scope, and its checkpoint key."""
    for name, (kind, spec) in SPECS.items():
        for obj in manifests(kind, spec):
            if obj["kind"] == "Secret":
                assert obj["metadata"]["name"] == f"{RUN.name}-{'sft-' if kind == 'SFTRun' else ''}token"
                assert set(obj["data"]) == {*SCOPES, CHECKPOINT_KEY}
                continue
            text = yaml.safe_dump(obj).lower()
            for word in (r"aws_secret_access_key", r"password", r"(?<![a-z])token:"):
                assert not re.search(word, text), (name, obj["kind"], word)


def test_operator_refuses_configs_the_schema_cannot_catch():
    bad = dict(GPU_RLRUN, inference={"replicas": 2}, config={"inference": {"replicas": 3}})
    with pytest.raises(ValueError, match="config.inference.replicas"):
        RLRunSpec.model_validate(bad)
    with pytest.raises(ValueError, match="needs storage.pvc or storage.objectStore"):
        RLRunSpec.model_validate({"image": "x"})
    # Every trainer pod mounts the claim from its own node (the CEL rule says so too).
    single_node_claim = dict(GPU_RLRUN, storage={"pvc": {"size": "1Ti"}})
    with pytest.raises(ValueError, match=r"storage.pvc.accessModes \['ReadWriteOnce'\]: trainer.nodes is 2"):
        RLRunSpec.model_validate(single_node_claim)
    with pytest.raises(ValueError, match="lets one pod use the claim, and all 7 pods"):
        RLRunSpec.model_validate(dict(GPU_RLRUN, trainer={"nodes": 1}, inference={"replicas": 5},
                                      storage={"pvc": {"accessModes": ["ReadWriteOncePod"]}}))
    # Every start resumes from the newest complete checkpoint: a fixed step would be reloaded by
    # every restart.
    with pytest.raises(ValueError, match="config.ckpt.resume_step"):
        SFTRunSpec.model_validate(example("sftrun.yaml")["spec"] | {"config": {"ckpt": {"resume_step": 50}}})


@pytest.mark.parametrize(("manifest", "tomls", "model"), [("rlrun.yaml", ["rl.toml"], RLConfig),
                                                          ("opd-rlrun.yaml", ["rl.toml", "opd.toml"], RLConfig),
                                                          ("judge-rlrun.yaml", ["rl.toml", "judge.toml"], RLConfig),
                                                          ("sftrun.yaml", ["sft.toml"], SFTConfig)])
def test_example_runs_carry_the_same_config_as_the_local_examples(manifest, tomls, model):
    """`spec.config` mirrors the TOML: only the paths (output dir, model, the teacher's) and the
    machine's settings differ on the cluster (the trainer has its pod's cores to itself there,
    the operator serves the teacher and the judge)."""
    machine = {"output_dir": True, "model": True, "device": True, "cpu_threads": True,
               "trainer": {"cpu_threads": True}, "orchestrator": {"teacher": True, "judge": True}, "teacher": True,
               "judge": True}
    spec_model = RLRunSpec if model is RLConfig else SFTRunSpec
    on_cluster = spec_model.model_validate(example(manifest)["spec"]).config.model_dump(exclude=machine)
    local = load_config(model, [arg for toml in tomls for arg in ("@", str(EXAMPLES / toml))])
    assert on_cluster == local.model_dump(exclude=machine)


@pytest.mark.parametrize("storage, cache_url", [
    ({"objectStore": STORE}, "s3://bucket/rl/ml/big/compile_cache"),  # emptyDir output: the store keeps it
    ({"pvc": {"claimName": "c"}, "objectStore": STORE}, None),  # <output_dir>/compile_cache on the PVC
])
def test_compiled_kernels_outlive_the_trainer_pod(storage, cache_url, tmp_path):
    from rlkube.config import TrainerConfig

    spec = RLRunSpec.model_validate(GPU_RLRUN | {"storage": storage})
    (cm,) = [o for o in manifests("RLRun", spec) if o["kind"] == "ConfigMap" and "trainer.toml" in o["data"]]
    (tmp_path / "trainer.toml").write_text(cm["data"]["trainer.toml"])
    trainer = load_config(TrainerConfig, ["@", str(tmp_path / "trainer.toml")])
    assert trainer.compile_cache_url == cache_url


def admitted(policies: list[dict], source: tuple[str, dict], target: dict, port: int) -> bool:
    """Whether a pod (namespace, labels) may connect to a pod of the run's namespace with
    `target` labels on `port`, as an enforcing network plugin reads the policies
    (`threatmodel.admitted`, which writes the docs' threat model); every pod of the run is
    isolated by one."""
    assert any(threatmodel.selects(p["spec"]["podSelector"], target) for p in policies), \
        "every pod of the run is isolated by a policy"
    return threatmodel.admitted(policies, source, (RUN.namespace, target), port)


def test_the_stores_and_the_runs_ports_admit_only_whom_they_serve():
    """Issue 35: torchrun's store (29500) and the NCCL weight transfer's (`nccl_port`, whose
    values every inference worker unpickles) take no token, so only the pods that need them
    reach them; a pod labelled as a scraper, or as the run's own pods, in another namespace
    reaches nothing; the scraper's namespace reaches the /metrics ports only."""
    spec = RLRunSpec.model_validate(GPU_RLRUN | {"envWorkers": {"replicas": 1}, "teacher": TEACHER, "judge": TEACHER})
    objs = manifests("RLRun", spec)
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    templates = {o["metadata"]["name"].removeprefix("big-"): o["spec"]["template"]["metadata"]["labels"]
                 for o in objs if o["kind"] in ("StatefulSet", "Deployment", "Job")}
    trainer, inference, orchestrator = templates["trainer-0"], templates["inference"], templates["orchestrator"]
    nccl, grpc = spec.config.weights.nccl_port, spec.config.rollouts.port
    here = {name: (RUN.namespace, labels) for name, labels in templates.items()}
    assert admitted(policies, here["trainer-0"], trainer, 29500)
    assert admitted(policies, here["trainer-0"], trainer, nccl)
    assert admitted(policies, here["inference"], trainer, nccl)
    assert admitted(policies, here["inference"], trainer, 50052)  # gRPC weights, NCCL's data ports
    assert not admitted(policies, here["inference"], trainer, 29500)
    # Issue 41: the trainer's data ports (gloo, NCCL's bootstrap, UCX: any port; the weights'
    # gRPC) take no token either, so the pods that never dial the trainer reach none of them.
    weights_grpc, metrics = spec.config.weights.grpc_port, trainer_metrics_port(spec)
    for other in ("orchestrator", "env-worker", "teacher", "judge"):
        for port in (1, 29400, 29500, nccl, weights_grpc, metrics, 40000, 65535):
            assert not admitted(policies, here[other], trainer, port), (other, port)
        assert admitted(policies, here[other], orchestrator, grpc), other
    for port in (29400, weights_grpc, 40000, 65535):
        assert admitted(policies, here["trainer-0"], trainer, port) and admitted(policies, here["inference"], trainer, port)
    assert admitted(policies, here["trainer-0"], orchestrator, grpc)
    assert admitted(policies, here["orchestrator"], inference, 8000)

    scraper_label = {"rlkube.dev/metrics-scraper": "true"}
    for intruder in (("tenant-b", scraper_label), ("tenant-b", trainer), (RUN.namespace, scraper_label)):
        for target, port in ((inference, 8000), (orchestrator, 8080), (trainer, 29500), (trainer, nccl)):
            assert not admitted(policies, intruder, target, port), (intruder, port)
    assert admitted(policies, ("monitoring", {}), inference, 8000)
    assert not admitted(policies, ("monitoring", {}), trainer, 29500)
    assert not admitted(policies, ("monitoring", {}), orchestrator, grpc)



def test_the_tool_service_is_a_deployment_its_envs_dial_and_only_they_reach(tmp_path):
    """`toolService`: `rlkube tool-service` pods on the run's image behind a ClusterIP Service,
    the `tool_url` of the run's `tool_chain` envs (the orchestrator's and the workers' config),
    reachable only from the orchestrator and env-worker pods, on its port."""
    kind, spec = SPECS["tools-rlrun"]
    objects = {(o["kind"], o["metadata"]["name"]): o for o in manifests(kind, spec)}
    deployment = objects[("Deployment", "big-tool-service")]
    main = deployment["spec"]["template"]["spec"]["containers"][0]
    assert main["image"] == spec.image and deployment["spec"]["replicas"] == 3
    assert main["command"][:6] == ["rlkube", "tool-service", "--host", "0.0.0.0", "--port", "8790"]
    assert main["command"][6:] == ["--p50-s", "0.2", "--tail-ratio", "20"]
    assert "nodeSelector" not in deployment["spec"]["template"]["spec"], "CPU pods: not the GPU nodes' selector"
    service = objects[("Service", "big-tool-service")]
    assert service["spec"]["ports"][0]["port"] == 8790 and "clusterIP" not in service["spec"]
    config = tomllib.loads(objects[("ConfigMap", "big-config")]["data"]["orchestrator.toml"])
    tool_chain, reverse = config["envs"]
    assert tool_chain["args"]["tool_url"] == "http://big-tool-service.ml.svc:8790"
    assert "tool_url" not in reverse.get("args", {}), "only the envs that call it"
    policy = objects[("NetworkPolicy", "big-tool-service-network-policy")]["spec"]
    assert policy["podSelector"]["matchExpressions"][0]["values"] == ["tool-service"]
    (rule,) = policy["ingress"]
    assert rule["from"][0]["podSelector"]["matchExpressions"][0]["values"] == ["orchestrator", "env-worker"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8790}]
    own = RLRunSpec.model_validate(TOOLS_RLRUN | {"config": TOOLS_RLRUN["config"] | {"orchestrator": {
        "envs": [{"id": "tool_chain", "args": {"tool_url": "http://tools.elsewhere:80"}}]}}})
    own_config = tomllib.loads(manifests(kind, own)[0]["data"]["orchestrator.toml"])
    assert own_config["envs"][0]["args"]["tool_url"] == "http://tools.elsewhere:80", "a user's URL stays"


def test_a_scaled_tool_service_keeps_its_replicas_until_the_spec_changes_them():
    """The operator does not fight `kubectl scale`: the spec's replicas are applied on creation
    and when they change in the spec, else the Deployment's own count stays."""
    run = RunRef("RLRun", RUN.name, RUN.namespace, RUN.uid)
    _, spec = SPECS["tools-rlrun"]
    created = builders.build_tool_service_deployment(run, spec, None)
    assert created["spec"]["replicas"] == 3
    scaled = created | {"spec": created["spec"] | {"replicas": 5}}
    assert builders.build_tool_service_deployment(run, spec, scaled)["spec"]["replicas"] == 5
    changed = spec.model_copy(update={"tool_service": spec.tool_service.model_copy(update={"replicas": 2})})
    again = builders.build_tool_service_deployment(run, changed, scaled)
    assert again["spec"]["replicas"] == 2
    assert again["metadata"]["annotations"][builders.TOOL_REPLICAS_ANNOTATION] == "2"
