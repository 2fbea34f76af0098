"""`spec.export`: the Job that exports a run's final policy once it Succeeded, and what its
outcome makes of the run's status (condition `Exported`, `status.export`).

The Job runs `rlkube export` from the run's image on the newest checkpoint, with the run's own
config (its ConfigMap). Its pod mounts the run's claim read-only (the checkpoints, the base
model) and holds, of the run's credentials, only the checkpoint key, with which the export
checks the checkpoint's signed manifest before it unpickles anything (rlkube.manifest: a part
another pod planted or altered is refused, exit 2, naming the file), and the object store's
Secret where the run has a store (its checkpoints may be there). The model directory `model`
goes either to `spec.export.path` of the target claim, the pod's only writable mount
(`subPath`), through a `.tmp` sibling renamed into place, or to `spec.export.url` in the store,
its config written last (rlkube.trainer.export)."""

from rlkube.config.cli import EXIT_INVALID

from rlkube_operator import observe
from rlkube_operator.builders import checkpoint_key_env
from rlkube_operator.names import CONFIG_MOUNT, RunRef
from rlkube_operator.pods import container, pod_settings, pod_template
from rlkube_operator.spec import RunSpecBase
from rlkube_operator.wiring import output_dir

COMPONENT = "export"
MOUNT = "/export"
MODEL_DIR = "model"
"""The model directory's name under `spec.export.path`."""


def target_claim(run: RunRef, spec: RunSpecBase) -> str:
    return spec.export.claim_name or spec.storage.pvc.claim_name or run.child("data")


def location(run: RunRef, spec: RunSpecBase) -> dict:
    """`status.export`: the model directory's URL, or the claim and its path in it."""
    if spec.export.url is not None:
        return {"url": f"{spec.export.url.rstrip('/')}/{MODEL_DIR}"}
    return {"claimName": target_claim(run, spec), "path": f"{spec.export.path}/{MODEL_DIR}"}


def described(where: dict) -> str:
    """`status.export` in words, for the condition's message."""
    return where["url"] if "url" in where else f"{where['path']} on claim {where['claimName']}"


def build_export_job(run: RunRef, spec: RunSpecBase, config_file: str) -> dict:
    """The export Job: one pod, no retry of an invalid export (exit 2: a field is wrong), one
    retry of anything else."""
    export = spec.export
    out = location(run, spec).get("url", f"{MOUNT}/{MODEL_DIR}")
    command = ["rlkube", "export", "--run", output_dir(run, spec), "--config", f"{CONFIG_MOUNT}/{config_file}",
               "--out", out, "--dtype", export.dtype, *(["--lora", export.lora] if export.lora else [])]
    settings = pod_settings(spec, "trainer")
    main = container(spec, settings, COMPONENT, command, ports=[], res=spec.trainer.resources,
                     env=[checkpoint_key_env(run)])
    template = pod_template(run, spec, settings, COMPONENT, [main], [config_file], restartPolicy="Never")
    if export.path is not None:
        own_claim = target_claim(run, spec) == (spec.storage.pvc.claim_name or run.child("data"))
        volume = "data" if own_claim else "export"
        main["volumeMounts"].append({"name": volume, "mountPath": MOUNT, "subPath": export.path})
        if not own_claim:
            template["spec"]["volumes"].append({"name": volume, "persistentVolumeClaim": {"claimName": target_claim(run, spec)}})
    job_spec = {
        "backoffLimit": 1,
        "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {
            "containerName": COMPONENT, "operator": "In", "values": [EXIT_INVALID]}}]},
        "template": template,
    }
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": run.metadata(COMPONENT), "spec": job_spec}


def outcome(job: dict, pods: list[dict]) -> tuple[bool | None, str]:
    """(True: exported, False: failed, None: still running; the condition's message)."""
    if observe.job_condition(job, "Complete") is not None:
        return True, "exported"
    if (cond := observe.job_condition(job, "Failed")) is not None:
        failed = [p for p in pods if p.get("status", {}).get("phase") == "Failed"]
        if invalid := observe.invalid_exit(failed):  # exit 2: the runtime's error names the field
            return False, invalid[1]
        return False, observe.pod_failure(failed[-1]) if failed else f"{cond.get('reason', '')} {cond.get('message', '')}"
    return None, "export Job running"
