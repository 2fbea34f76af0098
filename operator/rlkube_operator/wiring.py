"""The per-process TOML files of a run, wired for the cluster (pure functions).

The user's `spec.config` is the same config as on one machine; here the operator fills in
what only the cluster knows: the inference pods' DNS names, the orchestrator Service, the
output directory on the PVC, the object-store URL for weights, and `ckpt.resume_step =
"latest"` once the trainer has started before (a gang restart or a resume after suspend).
Addresses a process binds are `0.0.0.0`; addresses it connects to are Service DNS names.
"""

from pathlib import PurePosixPath

from rlkube.config import RLConfig, SFTConfig, to_toml

from rlkube_operator.names import SFT_STATUS_PORT, RunRef
from rlkube_operator.spec import RLRunSpec, RunSpecBase, SFTRunSpec

EMPTYDIR_OUTPUT = "/var/lib/rlkube"


def output_dir(run: RunRef, spec: RunSpecBase) -> str:
    """`<pvc mountPath>/<run>`, or an emptyDir path (lost with the pod) without a PVC."""
    base = spec.storage.pvc.mount_path if spec.storage.pvc else EMPTYDIR_OUTPUT
    return str(PurePosixPath(base) / run.name)


def _resume(config: dict, attempt: int) -> None:
    if attempt > 0 and config.get("ckpt") is not None and config["ckpt"].get("resume_step") is None:
        config["ckpt"]["resume_step"] = "latest"


def rl_config(run: RunRef, spec: RLRunSpec, attempt: int) -> RLConfig:
    """The RLRun's config with the cluster's addresses, before splitting per process."""
    data = spec.config.model_dump(exclude_unset=False)
    data["output_dir"] = output_dir(run, spec)
    port = spec.config.inference.port
    data["inference"] |= {"replicas": spec.inference.replicas, "host": "0.0.0.0"}
    data["orchestrator"]["client"]["base_urls"] = [
        f"http://{run.pod_host('inference', i)}:{port}" for i in range(spec.inference.replicas)
    ]
    data["rollouts"]["host"] = run.service_host("orchestrator")
    weights = data["weights"]
    if weights["type"] == "storage" and weights.get("url") is None and spec.storage.object_store:
        weights["url"] = f"{spec.storage.object_store.url.rstrip('/')}/{run.namespace}/{run.name}/weights"
    if weights["type"] == "grpc":
        weights["grpc_host"] = run.trainer_master(attempt)
    _resume(data, attempt)
    return RLConfig.model_validate(data)


def rl_tomls(run: RunRef, spec: RLRunSpec, attempt: int) -> dict[str, str]:
    """`{inference,orchestrator,trainer}.toml` → text. Each process binds on all interfaces."""
    configs = rl_config(run, spec, attempt).process_configs()
    configs["orchestrator"].rollouts.host = "0.0.0.0"
    configs["trainer"].weights.grpc_host = "0.0.0.0"
    return {f"{name}.toml": to_toml(config) for name, config in configs.items()}


def sft_tomls(run: RunRef, spec: SFTRunSpec, attempt: int) -> dict[str, str]:
    data = spec.config.model_dump()
    data["output_dir"] = output_dir(run, spec)
    data |= {"status_port": SFT_STATUS_PORT, "status_host": "0.0.0.0"}
    _resume(data, attempt)
    return {"sft.toml": to_toml(SFTConfig.model_validate(data))}
