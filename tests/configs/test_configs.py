"""The ready configs in `configs/`, checked without GPUs or a network: each TOML passes `--dry-run`
with a memory estimate that fits the GPU it names, its manifest carries the same config, and
the operator renders the manifest into pods with the GPUs, processes, tensor parallelism,
weight transport and volumes the setup needs (checked against the Kubernetes schemas too)."""

import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from rlkube.config import InferenceConfig, RLConfig, SFTConfig, TrainerConfig, load_config, to_toml
from rlkube.config.gpus import GPUS
from rlkube_operator import wiring
from rlkube_operator.spec import RLRunSpec, SFTRunSpec

from tests.fixtures.hub import hub_offline
from tests.operator.test_manifests import K8S_VERSION, RUN, manifests

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


class Setup:
    """One config: its TOML(s), its manifest, and what the operator must render for it."""

    def __init__(self, toml: str, manifest: str, kind: str, *, trainer: tuple[int, int], inference: tuple[int, int] = (0, 0),
                 weights: str | None = None, lora_rank: int | None = None, router_replay: bool = False,
                 toml_for_manifest: Path | None = None):
        self.toml, self.manifest, self.kind = CONFIGS / toml, CONFIGS / manifest, kind
        self.nodes, self.gpus_per_node = trainer
        self.replicas, self.gpus_per_replica = inference
        self.weights, self.lora_rank, self.router_replay = weights, lora_rank, router_replay
        self.toml_for_manifest = toml_for_manifest or self.toml

    def doc(self) -> dict:
        (doc,) = [d for d in yaml.safe_load_all(self.manifest.read_text()) if d["kind"] == self.kind]
        return doc

    def spec(self):
        return (RLRunSpec if self.kind == "RLRun" else SFTRunSpec).model_validate(self.doc()["spec"])


SETUPS = {
    "qwen3-0.6b-1gpu": Setup("qwen3-0.6b-1gpu/rl.toml", "qwen3-0.6b-1gpu/rlrun.yaml", "RLRun",
                             trainer=(1, 1), inference=(1, 1), weights="storage"),
    "qwen3-4b-8gpu": Setup("qwen3-4b-8gpu/rl.toml", "qwen3-4b-8gpu/rlrun.yaml", "RLRun",
                           trainer=(1, 2), inference=(6, 1), weights="nccl"),
    "qwen3-8b-lora-8gpu": Setup("qwen3-8b-lora-8gpu/rl.toml", "qwen3-8b-lora-8gpu/rlrun.yaml", "RLRun",
                                trainer=(1, 2), inference=(3, 2), weights="storage", lora_rank=32),
    "qwen3-30b-a3b-2nodes": Setup("qwen3-30b-a3b-2nodes/rl.toml", "qwen3-30b-a3b-2nodes/rlrun.yaml", "RLRun",
                                  trainer=(1, 8), inference=(2, 4), weights="nccl", router_replay=True),
    "pipeline-sft": Setup("qwen3-4b-sft-then-rl/sft.toml", "qwen3-4b-sft-then-rl/pipeline.yaml", "SFTRun",
                          trainer=(1, 8)),
    "pipeline-rl": Setup("qwen3-4b-8gpu/rl.toml", "qwen3-4b-sft-then-rl/pipeline.yaml", "RLRun",
                         trainer=(1, 2), inference=(6, 1), weights="nccl"),
}
MACHINE = {"output_dir": True, "model": True, "trainer": {"gpus": True, "nproc_per_node": True},
           "inference": {"gpus": True, "host": True, "tensor_parallel_size": True}, "orchestrator": {"client": True},
           "weights": {"grpc_host": True, "grpc_bind_host": True}}
"""What a TOML sets for one machine (or its own servers) and the operator sets on a cluster (vLLM's
tensor parallel size: from `inference.gpusPerReplica`)."""


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """CI has no network: every architecture must come from `rlkube.models.architectures`."""
    hub_offline(monkeypatch)


def test_every_config_directory_is_covered():
    tomls = {p.relative_to(CONFIGS) for p in CONFIGS.rglob("*.toml")}
    manifests_ = {p.relative_to(CONFIGS) for p in CONFIGS.rglob("*.yaml")}
    assert tomls == {s.toml.relative_to(CONFIGS) for s in SETUPS.values()}
    assert manifests_ == {s.manifest.relative_to(CONFIGS) for s in SETUPS.values()}


@pytest.mark.parametrize("name", sorted(SETUPS))
def test_the_toml_passes_dry_run_and_its_memory_fits_its_gpu(name, tmp_path, capsys, monkeypatch):
    setup = SETUPS[name]
    argv = ["@", str(setup.toml), "--output-dir", str(tmp_path), "--dry-run"]
    if setup.kind == "RLRun":
        from rlkube.entrypoints.rl import main
    else:
        from rlkube.entrypoints.sft import main

        monkeypatch.setenv("WORLD_SIZE", str(setup.nodes * setup.gpus_per_node))  # as under torchrun
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    gpu = load_config(RLConfig if setup.kind == "RLRun" else SFTConfig, ["@", str(setup.toml)]).gpu
    assert gpu is not None
    assert f"fits {gpu}'s {GPUS[gpu].memory_gib:.1f} GiB" in out, out
    assert "does NOT fit" not in out and "skipped" not in out
    if setup.kind == "RLRun":
        assert "tokens of KV cache" in out
    else:  # the resolved config, then the estimate as TOML comments: still one TOML document
        assert "\n# trainer memory per GPU, estimated" in out
        resolved = load_config(SFTConfig, argv[:-1])
        assert tomllib.loads(out) == tomllib.loads(to_toml(resolved))


@pytest.mark.parametrize("name", sorted(SETUPS))
def test_the_manifest_carries_the_tomls_config(name):
    """Only what one machine places by hand (GPUs, its own servers' addresses) and the paths
    differ on a cluster; the pipeline's RLRun is the 4B config from the SFT run's export."""
    setup = SETUPS[name]
    spec = setup.spec()
    model = RLConfig if setup.kind == "RLRun" else SFTConfig
    local = load_config(model, ["@", str(setup.toml_for_manifest)])
    assert spec.config.model_dump(exclude=MACHINE) == local.model_dump(exclude=MACHINE)
    if setup.kind == "RLRun":
        assert local.inference.tensor_parallel_size == setup.gpus_per_replica == spec.inference.gpus_per_replica
    if name == "pipeline-rl":
        sft, sft_name = SETUPS["pipeline-sft"].spec(), SETUPS["pipeline-sft"].doc()["metadata"]["name"]
        assert spec.suspend and spec.config.model.name == f"{sft.storage.pvc.mount_path}/{sft_name}/weights/final"
        assert spec.storage.pvc.claim_name == sft.storage.pvc.claim_name
    else:
        assert spec.config.model.name == local.model.name


def by_kind(objects: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for obj in objects:
        out.setdefault(obj["kind"], []).append(obj)
    return out


@pytest.mark.parametrize("name", sorted(SETUPS))
def test_the_operator_renders_the_setup(name):
    from rlkube.inference.server import vllm_command

    setup = SETUPS[name]
    spec = setup.spec()
    objects = manifests(setup.kind, spec)
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    kinds = by_kind(objects)
    (job,) = kinds["Job"]
    trainer_pod = job["spec"]["template"]["spec"]
    (trainer,) = trainer_pod["containers"]
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (setup.nodes, setup.nodes)
    assert f"--nproc-per-node={setup.gpus_per_node}" in trainer["command"]
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == str(setup.gpus_per_node)
    pods = [trainer_pod]
    data = kinds["ConfigMap"][0]["data"]
    gpu = spec.config.gpu
    if setup.kind == "RLRun":
        (inference_set,) = [s for s in kinds["StatefulSet"] if s["metadata"]["name"].endswith("-inference")]
        assert inference_set["spec"]["replicas"] == setup.replicas
        inference_pod = inference_set["spec"]["template"]["spec"]
        assert inference_pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == str(setup.gpus_per_replica)
        pods.append(inference_pod)
        inference = InferenceConfig.model_validate(tomllib.loads(data["inference.toml"]))
        args = vllm_command(inference, on_cpu=False).args
        assert inference.tensor_parallel_size == setup.gpus_per_replica
        if setup.gpus_per_replica > 1:
            assert args[args.index("--tensor-parallel-size") + 1] == str(setup.gpus_per_replica)
        assert ("--enable-return-routed-experts" in args) == setup.router_replay
        assert inference.max_lora_rank == setup.lora_rank
        weights = TrainerConfig.model_validate(tomllib.loads(data["trainer.toml"])).weights
        assert weights.type == setup.weights
        if setup.weights == "nccl":  # the trainer's rank 0 drives every replica from its stable Service
            assert weights.inference_urls == [f"http://{RUN.pod_host('inference', i)}:{inference.port}"
                                              for i in range(setup.replicas)]
            assert weights.grpc_host == RUN.trainer_master
        trainer_cfg = TrainerConfig.model_validate(tomllib.loads(data["trainer.toml"]))
        assert trainer_cfg.loss.router_replay == setup.router_replay
        assert (trainer_cfg.lora.rank if trainer_cfg.lora else None) == setup.lora_rank
    for pod in pods:  # the run's claim and shared memory for NCCL in every GPU pod, on the GPU it names
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["data"]["persistentVolumeClaim"]["claimName"] == (
            spec.storage.pvc.claim_name or f"{RUN.name}-data")
        assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"}
        mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert mounts["data"] == spec.storage.pvc.mount_path and mounts["dshm"] == "/dev/shm"
        assert pod["nodeSelector"]["nvidia.com/gpu.product"] == GPUS[gpu].product


@pytest.mark.parametrize("name", sorted(SETUPS))
def test_the_memory_estimate_fits_at_the_clusters_world_size(name):
    """The trainer's ranks are the rendered Job's pods x GPUs; inference's tensor parallel size
    is the one the operator sets from `gpusPerReplica`."""
    from rlkube.trainer.memory import rl_memory, sft_memory

    setup = SETUPS[name]
    spec = setup.spec()
    world = spec.trainer.nodes * spec.trainer.nproc_per_node()
    if setup.kind == "RLRun":
        config = wiring.rl_config(RUN, spec)
        if name == "pipeline-rl":  # the SFT run's export (on the volume) has its base model's architecture
            config.model.name = SETUPS["pipeline-sft"].spec().config.model.name
        report = rl_memory(config, world)
    else:
        report = sft_memory(spec.config, world)
    assert report.problems == []
    assert any(line.startswith(f"  fits {spec.config.gpu}") for line in report.lines)


def test_a_config_that_cannot_fit_its_gpu_is_refused_with_the_numbers(tmp_path, capsys):
    """Qwen3-30B-A3B's full fine-tuning over 8 ranks needs ~89 GiB per GPU: an H200's, not an H100's."""
    from rlkube.entrypoints.rl import main

    toml = SETUPS["qwen3-30b-a3b-2nodes"].toml
    argv = ["@", str(toml), "--output-dir", str(tmp_path), "--gpu", "H100-80GB", "--dry-run"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "invalid config: gpu 'H100-80GB' has too little memory for it" in err
    assert "trainer: needs 88.9 GiB per GPU" in err and "optimizer state 28.4 GiB" in err
    assert "but has H100-80GB's 79.6 GiB: add trainer GPUs" in err
    assert not (tmp_path / "configs").exists(), "refused before any process config is written"
    # Twice the trainer GPUs halve the states: then it fits.
    assert main([*argv, "--trainer.nproc-per-node", "16"]) == 0
