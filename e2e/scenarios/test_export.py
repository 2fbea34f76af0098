"""`spec.export` on a cluster: the reverse-text SFT warm-up (`sftrun.yaml`, shortened, from the
tiny model) with `spec.export` Succeeds, the operator's export Job writes its final policy to
the claim (condition `Exported`, `status.export` naming the claim and the directory), and a pod
that mounts the claim read-only scores that directory with `rlkube eval` (its own vLLM server,
the held-out split): the export is a model directory vLLM and the environment load.

Marked `extended`: an SFT run, an export and a vLLM start, minutes beyond the per-change gate."""

import json
import time

import pytest

from e2e.scenarios.manifests import short_sft

pytestmark = [pytest.mark.slow, pytest.mark.extended]

CLAIM = "export-data"
STEPS = 6
EXPORT = {"path": "exports/reverse-text", "dtype": "bfloat16"}
EVAL_EXAMPLES = 16
RESULTS = "eval-export"
"""Where on the claim the eval pod writes (its only writable directory there)."""


def eval_pod(image: str, model: str) -> dict:
    """`rlkube eval` on `model` (a path on the claim, mounted read-only at /data)."""
    command = ["rlkube", "eval", "--model.name", model, "--num-examples", str(EVAL_EXAMPLES),
               "--output-dir", "/out", "--inference.max_model_len", "512",
               "--inference.kv_cache_space_gb", "1", "--inference.enforce_eager", "true"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "eval-export"}, "spec": {
        "restartPolicy": "Never",
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "eval", "image": image, "command": command, "workingDir": "/tmp",
                        "env": [{"name": "HOME", "value": "/tmp"}],
                        "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True},
                                         {"name": "data", "mountPath": "/out", "subPath": RESULTS},
                                         {"name": "tmp", "mountPath": "/tmp"}],
                        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": CLAIM}}, {"name": "tmp", "emptyDir": {}}]}}


@pytest.mark.timeout(1800)
def test_an_exported_run_loads_in_rlkube_eval(cluster, record_property):
    started = time.monotonic()
    pvc, sft = short_sft("/data/models/tiny", CLAIM, STEPS)
    cluster.apply(pvc)
    name = sft["metadata"]["name"]
    sft["spec"]["config"]["model"]["name"] = cluster.seed_model(CLAIM)
    sft["spec"]["export"] = EXPORT
    cluster.apply(sft)
    cluster.wait_phase("sftrun", name, {"Succeeded"}, 900)
    succeeded = time.monotonic()

    def exported():
        conditions = {c["type"]: c for c in cluster.status("sftrun", name).get("conditions", [])}
        if conditions.get("Exported", {}).get("reason") == "ExportFailed":
            raise AssertionError(f"the export failed: {conditions['Exported']['message']}")
        return conditions.get("Exported", {}).get("status") == "True" and cluster.status("sftrun", name)

    status = cluster.wait(exported, 600, f"sftrun/{name} to be Exported")
    exported_s = time.monotonic() - succeeded
    assert status["phase"] == "Succeeded"
    assert status["export"] == {"claimName": CLAIM, "path": f"{EXPORT['path']}/model"}, status.get("export")
    config = json.loads(cluster.read_file(CLAIM, f"{EXPORT['path']}/model/config.json") or "{}")
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16", config

    cluster.apply(eval_pod(sft["spec"]["image"], f"/data/{status['export']['path']}"))
    cluster.wait(lambda: cluster.status("pod", "eval-export").get("phase") in ("Succeeded", "Failed"), 900,
                 "rlkube eval of the export to finish")
    log = cluster.kubectl("logs", "eval-export")
    phase = cluster.status("pod", "eval-export")["phase"]
    assert phase == "Succeeded", f"rlkube eval of the export {phase}:\n{log[-3000:]}"
    (result,) = json.loads(cluster.read_file(CLAIM, f"{RESULTS}/eval_results.json") or "{}")["results"]
    assert result["num_examples"] == EVAL_EXAMPLES and not result["errors"], result
    print(f"\nexported {exported_s:.0f} s after Succeeded; rlkube eval on the export: avg@1 "
          f"{result['avg_at_k']:.3f} over {EVAL_EXAMPLES} held-out examples; scenario "
          f"{time.monotonic() - started:.0f} s")
    record_property("export", {"exported after Succeeded (s)": round(exported_s), "eval avg@1": result["avg_at_k"]})
    cluster.delete("pod", "eval-export")
    cluster.delete("sftrun", name)
