"""Upgrade safety: the ConfigMap's TOMLs carry only what the user and the operator set, so an
operator newer than the run's image still starts it; a runtime that meets a field it does not
know says so with both versions, and the run says it too; the applied-spec check compares what
the user set; a suspended run takes new sizes on resume, a running one does not."""

import copy
import dataclasses
import json
import tomllib

import pytest
from pydantic import create_model
from rlkube.config import (
    ConfigError,
    InferenceConfig,
    OrchestratorConfig,
    RLConfig,
    SFTConfig,
    TrainerConfig,
)
from rlkube.config import cli as config_cli
from rlkube.config.cli import load_config, parse_cli, to_toml
from rlkube_operator import builders, observe, reconcile, wiring
from rlkube_operator.names import TRAINER_METRICS_PORT, RunRef
from rlkube_operator.spec import RLRunSpec, SFTRunSpec

from tests.operator.cluster import pod_waiting
from tests.operator.embedded import PERMISSIVE
from tests.operator.test_operator_kmock import condition, example, rlrun, start_everything

RL_RUN = RunRef("RLRun", "rt", "team", "uid-1")
SFT_RUN = RunRef("SFTRun", "sft", "team", "uid-2")
MODELS = {"inference.toml": InferenceConfig, "orchestrator.toml": OrchestratorConfig,
          "trainer.toml": TrainerConfig, "sft.toml": SFTConfig}


def _load(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return load_config(MODELS[name], ["@", str(path)])


def _full_render(run: RunRef, spec) -> dict[str, str]:
    """What the operator rendered before: every field of every process config, defaults too."""
    if isinstance(spec, SFTRunSpec):
        sparse = SFTConfig.model_validate(tomllib.loads(wiring.sft_tomls(run, spec)["sft.toml"]))
        return {"sft.toml": to_toml(sparse)}
    configs = wiring.in_pods(wiring.rl_config(run, spec).process_configs(), spec)
    return {f"{name}.toml": to_toml(config) for name, config in configs.items()}


def _variants():
    rl, sft = example("rlrun.yaml")["spec"], example("sftrun.yaml")["spec"]
    nccl = copy.deepcopy(rl)
    nccl["config"]["weights"] = {"type": "nccl"}
    nccl["config"].setdefault("trainer", {})["device"] = "cuda"  # NCCL broadcasts from GPU memory
    nccl["inference"] |= {"replicas": 2, "gpusPerReplica": 2}
    nccl["storage"] = {"objectStore": {"url": "s3://bucket/runs"}}
    grpc = copy.deepcopy(rl)
    grpc["config"]["weights"] = {"type": "grpc"}
    grpc["envWorkers"] = {"replicas": 2}
    store = {"image": "x", "storage": {"objectStore": {"url": "s3://bucket/runs"}}, "config": {"ckpt": {}}}
    return [
        pytest.param(RLRunSpec, rl, id="rlrun.yaml"),
        pytest.param(RLRunSpec, nccl, id="nccl-object-store"),
        pytest.param(RLRunSpec, grpc, id="grpc-env-workers"),
        pytest.param(RLRunSpec, {"image": "x", "config": {"weights": {"type": "grpc"}}}, id="rl-minimal"),
        pytest.param(SFTRunSpec, sft, id="sftrun.yaml"),
        pytest.param(SFTRunSpec, store, id="sft-object-store"),
    ]


@pytest.mark.parametrize(("model", "raw"), _variants())
def test_the_sparse_configmap_loads_to_the_same_config_as_the_full_render(model, raw, tmp_path):
    spec = model.model_validate(raw)
    run = RL_RUN if model is RLRunSpec else SFT_RUN
    tomls = (wiring.rl_tomls if model is RLRunSpec else wiring.sft_tomls)(run, spec)
    full = _full_render(run, spec)
    assert set(tomls) == set(full)
    for name, text in tomls.items():
        assert len(text) < len(full[name])
        assert _load(tmp_path, name, text).model_dump() == _load(tmp_path, name, full[name]).model_dump(), name


def test_the_configmap_carries_only_what_the_user_and_the_operator_set():
    spec = RLRunSpec.model_validate({"image": "x", "config": {"weights": {"type": "grpc"}, "max_steps": 7}})
    tomls = wiring.rl_tomls(RL_RUN, spec)
    assert tomls["inference.toml"].startswith(f"# written by rlkube {config_cli.RLKUBE_VERSION}\n")
    inference = tomllib.loads(tomls["inference.toml"])
    assert inference == {"host": "0.0.0.0"}  # the rest are vLLM's defaults in the image
    trainer = tomllib.loads(tomls["trainer.toml"])
    assert trainer == {
        "output_dir": "/var/lib/rlkube/rt", "max_steps": 7,
        "rollouts": {"host": "rt-orchestrator.team.svc"},
        "weights": {"type": "grpc", "grpc_host": RL_RUN.trainer_master, "grpc_bind_host": "0.0.0.0"},
        "metrics": {"prometheus_port": TRAINER_METRICS_PORT, "prometheus_host": "0.0.0.0"},
    }


class _NewSFTConfig(SFTConfig):
    """The config of a newer rlkube: one field more."""

    new_knob: int = 7
    """A field today's runtime does not know."""


NewSFTRunSpec = create_model("SFTRunSpec", __base__=SFTRunSpec, config=(_NewSFTConfig, _NewSFTConfig()))


def test_an_operator_with_a_new_config_field_renders_a_configmap_that_the_previous_runtime_accepts(
        tmp_path, monkeypatch):
    raw = example("sftrun.yaml")["spec"]
    monkeypatch.setattr(config_cli, "RLKUBE_VERSION", "9.9.0")  # the newer operator's rlkube
    left_unset = wiring.sft_tomls(SFT_RUN, NewSFTRunSpec.model_validate(raw))["sft.toml"]
    raw["config"]["new_knob"] = 3
    set_by_user = wiring.sft_tomls(SFT_RUN, NewSFTRunSpec.model_validate(raw))["sft.toml"]
    monkeypatch.setattr(config_cli, "RLKUBE_VERSION", "9.8.0")  # the run's image: today's runtime

    assert _load(tmp_path, "sft.toml", left_unset).max_steps == raw["config"]["max_steps"]
    with pytest.raises(ConfigError) as refused:
        _load(tmp_path, "sft.toml", set_by_user)
    assert str(refused.value) == (
        "invalid config:\n  new_knob: unknown field: the config was written by rlkube 9.9.0 and this runtime is"
        " rlkube 9.8.0 (run an image of rlkube 9.9.0, or leave the field unset)")


def _crash_looping(message: str) -> dict:
    """A pod whose container exited with `message` as its termination message, and waits to restart."""
    status = pod_waiting("CrashLoopBackOff", "back-off 10s restarting failed container", restarts=2)
    status["containerStatuses"][0]["lastState"] = {
        "terminated": {"exitCode": 2, "reason": "Error", "message": message}}
    return status


def _termination_message(tmp_path, monkeypatch, toml: str) -> str:
    """What `rlkube sft @ sft.toml` leaves in the container's termination message."""
    log = tmp_path / "termination-log"
    log.write_text("")  # the kubelet creates it
    monkeypatch.setattr(config_cli, "TERMINATION_LOG", log)
    config = tmp_path / "sft.toml"
    config.write_text(toml)
    with pytest.raises(SystemExit) as exit_info:
        parse_cli(SFTConfig, "sft", ["@", str(config)])
    assert exit_info.value.code == 2
    return log.read_text()


def test_the_runtimes_versioned_error_reaches_the_termination_message_and_the_components_health(
        tmp_path, monkeypatch):
    raw = example("sftrun.yaml")["spec"]
    raw["config"]["new_knob"] = 3
    monkeypatch.setattr(config_cli, "RLKUBE_VERSION", "9.9.0")
    toml = wiring.sft_tomls(SFT_RUN, NewSFTRunSpec.model_validate(raw))["sft.toml"]
    monkeypatch.setattr(config_cli, "RLKUBE_VERSION", "9.8.0")
    message = _termination_message(tmp_path, monkeypatch, toml)
    assert message.startswith("rlkube sft: error: invalid config:\n  new_knob: unknown field")

    pod = {"metadata": {"name": "sft-trainer-0-0"}, "status": _crash_looping(message)}
    health = observe.component_health([pod], 1)
    assert (health.ready, health.reason, health.bad) == (False, "ConfigIncompatible", True)
    assert health.message.startswith("pod sft-trainer-0-0: rlkube sft: error: invalid config:; new_knob: unknown"
                                     " field: the config was written by rlkube 9.9.0 and this runtime is rlkube 9.8.0")
    pod["status"] = {"phase": "Failed", "containerStatuses": [{"name": "main", "state": pod["status"][
        "containerStatuses"][0]["lastState"]}]}
    assert "new_knob: unknown field" in observe.pod_failure(pod)  # a trainer's restart event says why

    other = {"metadata": {"name": "p"}, "status": _crash_looping("Traceback: KeyError")}
    assert observe.component_health([other], 1).reason == "CrashLoopBackOff"  # other crashes as before


class _StoredSpec:
    """A kube whose run has a ConfigMap holding `stored` as its applied spec."""

    api_client = None

    def __init__(self, run: RunRef, stored: dict):
        self.cm = {"metadata": {"name": run.child("config"), "ownerReferences": [
            {"kind": run.kind, "name": run.name, "uid": run.uid, "controller": True}]},
            "data": {builders.APPLIED_SPEC_KEY: json.dumps(stored)}}

    def get(self, kind, namespace, name):
        return self.cm


def applied(stored: dict, request: dict, workload=reconcile.WORKLOADS["RLRun"]):
    """(applied spec, refusal) of the operator for a run whose ConfigMap holds `stored`."""
    run = RL_RUN if workload.spec_model is not SFTRunSpec else SFT_RUN
    # Stored by an older operator, unsigned: it runs only within the guardrails (here, any).
    reconciler = reconcile.Reconciler(_StoredSpec(run, stored), reconcile.Settings(guardrails=PERMISSIVE))
    return reconciler.applied_spec(run, workload, workload.spec_model.model_validate(request))


def user_set(raw: dict, model=RLRunSpec) -> dict:
    """What the operator stores for a run created with `raw`."""
    return json.loads(json.dumps(model.model_validate(raw).model_dump(mode="json", by_alias=True, exclude_unset=True)))


def with_config(raw: dict, **fields) -> dict:
    out = copy.deepcopy(raw)
    out["config"] |= fields
    return out


def test_a_spec_stored_by_the_previous_operator_with_every_default_is_still_compared_on_what_changed():
    raw = example("rlrun.yaml")["spec"]
    legacy = json.loads(json.dumps(RLRunSpec.model_validate(raw).model_dump(mode="json", by_alias=True)))
    del legacy["envWorkers"]  # a field added since
    spec, refusal = applied(legacy, raw)
    assert refusal is None and spec == RLRunSpec.model_validate(raw)
    spec, refusal = applied(legacy, with_config(raw, max_steps=7))
    assert refusal.startswith("changes to spec.config.max_steps cannot apply")
    assert spec.config.max_steps == raw["config"]["max_steps"]


def test_a_refused_change_keeps_the_stored_spec_and_its_sparse_tomls():
    """Refused changes keep the stored spec: its TOMLs still carry only the fields it had."""
    raw = example("rlrun.yaml")["spec"]
    spec, refusal = applied(user_set(raw), with_config(raw, max_steps=7))
    assert refusal is not None
    trainer = tomllib.loads(wiring.rl_tomls(RL_RUN, spec)["trainer.toml"])
    assert "parallel" not in trainer and trainer["max_steps"] == raw["config"]["max_steps"]


# --- kmock: the operator end to end -------------------------------------------------------

RESIZED = {"trainer": {"resources": {"requests": {"cpu": "3", "memory": "7Gi"}}},
           "inference": {"replicas": 2, "resources": {"requests": {"cpu": "4", "memory": "8Gi"}}}}


async def test_a_suspended_run_takes_new_resources_on_resume_and_a_running_one_refuses_them(cluster):
    await cluster.create(rlrun())
    await start_everything(cluster)
    stored = json.loads(cluster.get("ConfigMap", "rt-config")["data"][builders.APPLIED_SPEC_KEY])
    assert stored["config"] == example("rlrun.yaml")["spec"]["config"]  # as given: no defaults

    # Running: refused (by the CRD's transition rules, the whole patch), the run keeps its resources.
    with pytest.raises(AssertionError, match="spec.trainer cannot change once the run is created"):
        await cluster.patch("RLRun", "rt", {"spec": RESIZED})
    assert cluster.get("StatefulSet", "rt-inference")["spec"]["replicas"] == 1

    # Suspended: accepted, applied when it resumes.
    await cluster.patch("RLRun", "rt", {"spec": {"suspend": True}})
    await cluster.until(lambda: cluster.status("RLRun", "rt")["phase"] == "Suspended", what="Suspended")
    await cluster.patch("RLRun", "rt", {"spec": RESIZED})
    await cluster.until(lambda: condition(cluster.status("RLRun", "rt"), "SpecAccepted")["status"] == "True",
                        what="the new sizes accepted while suspended")
    await cluster.patch("RLRun", "rt", {"spec": {"suspend": False}})
    job = await cluster.until(lambda: cluster.get("Job", "rt-trainer-1"), what="resumed trainer")
    (trainer,) = job["spec"]["template"]["spec"]["containers"]
    assert trainer["resources"]["requests"] == {"cpu": "3", "memory": "7Gi"}
    inference = await cluster.until(
        lambda: cluster.get("StatefulSet", "rt-inference")["spec"]["replicas"] == 2
        and cluster.get("StatefulSet", "rt-inference"), what="two inference replicas")
    assert inference["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "4"
    orchestrator = tomllib.loads(cluster.get("ConfigMap", "rt-config")["data"]["orchestrator.toml"])
    assert len(orchestrator["client"]["base_urls"]) == 2
    stored = json.loads(cluster.get("ConfigMap", "rt-config")["data"][builders.APPLIED_SPEC_KEY])
    assert stored["trainer"]["resources"] == RESIZED["trainer"]["resources"] and stored["suspend"] is False

    # Running again: refused again.
    with pytest.raises(AssertionError, match="spec.trainer cannot change once the run is created"):
        await cluster.patch("RLRun", "rt", {"spec": {"trainer": {"resources": {"requests": {"cpu": "1"}}}}})


# An operator whose RLConfig has another default for one field.
ChangedDefaultConfig = create_model("RLConfig", __base__=RLConfig, clean_output_dir=(bool, True))
ChangedDefaultSpec = create_model("RLRunSpec", __base__=RLRunSpec, config=(ChangedDefaultConfig, ChangedDefaultConfig()))


async def test_a_default_the_operator_changes_is_no_change_to_a_started_run(cluster, monkeypatch):
    await cluster.create(rlrun())
    await cluster.until(lambda: cluster.get("ConfigMap", "rt-config"), what="the applied spec stored")
    newer = dataclasses.replace(reconcile.WORKLOADS["RLRun"], spec_model=ChangedDefaultSpec)
    monkeypatch.setitem(reconcile.WORKLOADS, "RLRun", newer)  # the upgraded operator
    await cluster.patch("RLRun", "rt", {"spec": {"ttlSecondsAfterFinished": 600}})  # a pass on a new generation
    status = await cluster.until(lambda: cluster.status("RLRun", "rt").get("observedGeneration") == 2
                                 and cluster.status("RLRun", "rt"), what="generation 2 reconciled")
    assert condition(status, "SpecAccepted")["status"] == "True", condition(status, "SpecAccepted")
    assert "clean_output_dir" not in cluster.get("ConfigMap", "rt-config")["data"]["trainer.toml"]


async def test_a_config_the_image_cannot_read_fails_the_run_saying_so(cluster, tmp_path, monkeypatch):
    """Its exit code 2 fails the run at once (no restart fixes it), as `ConfigIncompatible`."""
    await cluster.create(rlrun())
    await start_everything(cluster)
    message = _termination_message(tmp_path, monkeypatch, "# written by rlkube 9.9.0\nnew_knob = 1\n")
    await cluster.patch("Pod", "rt-inference-0", {"status": _crash_looping(message)})
    status = await cluster.until(lambda: cluster.status("RLRun", "rt")["phase"] == "Failed"
                                 and cluster.status("RLRun", "rt"), what="Failed")
    failed = condition(status, "Failed")
    assert failed["reason"] == "ConfigIncompatible"
    assert "new_knob: unknown field: the config was written by rlkube 9.9.0" in failed["message"]
