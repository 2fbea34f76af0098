"""`spec.export` against kmock's API emulator, the operator embedded: the export Job made once
the run Succeeded (never before), with no credential but the checkpoint key (to check the
checkpoint's signature), the run's claim read-only and only the export path writable, or the
object store's Secret for an `s3://` target; its outcome in condition `Exported` and
`status.export`."""

import asyncio

import pytest
from pydantic import ValidationError
from rlkube_operator.spec import RLRunSpec

from tests.operator.cluster import pod_failed
from tests.operator.test_crds import cel_errors
from tests.operator.test_operator_kmock import condition, example, rlrun, start_everything

EXPORT = {"path": "exports/rt", "dtype": "bfloat16"}


async def succeed(cluster, name: str = "rt") -> None:
    await start_everything(cluster, name)
    await cluster.patch("Job", f"{name}-trainer-0", {"status": {"conditions": [{"type": "Complete", "status": "True"}]}})


async def test_a_run_that_succeeds_is_exported_by_a_job_that_can_write_only_the_export(cluster):
    await cluster.create(rlrun(export=EXPORT))
    await start_everything(cluster)
    await asyncio.sleep(1)  # several reconciles of the running run
    assert cluster.get("Job", "rt-export") is None, "exported before the run ended"

    await cluster.patch("Job", "rt-trainer-0", {"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    job = await cluster.until(lambda: cluster.get("Job", "rt-export"), what="the export Job")
    pod = job["spec"]["template"]["spec"]
    (main,) = pod["containers"]
    assert main["command"] == ["rlkube", "export", "--run", "/data/rt", "--config", "/etc/rlkube/trainer.toml",
                               "--out", "/export/model", "--dtype", "bfloat16"]
    assert not [e for e in main["env"] if e["name"].startswith("RLKUBE_TOKEN")], main["env"]
    key = {"name": "rt-token", "key": "checkpoint", "optional": True}
    assert {"name": "RLKUBE_CHECKPOINT_KEY", "valueFrom": {"secretKeyRef": key}} in main["env"], "checks the signature"
    assert "envFrom" not in main, "no object store: no store credentials"
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert mounts["/data"] == {"name": "data", "mountPath": "/data", "readOnly": True}
    assert mounts["/export"] == {"name": "data", "mountPath": "/export", "subPath": "exports/rt"}
    assert [m for m in main["volumeMounts"] if not m.get("readOnly") and m["name"] == "data"] == [mounts["/export"]]
    assert job["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"] == [2]
    status = await cluster.until(lambda: condition(cluster.status("RLRun", "rt"), "Exported")["reason"] == "Exporting"
                                 and cluster.status("RLRun", "rt"), what="Exporting")
    assert status["phase"] == "Succeeded" and "export" not in status

    await cluster.patch("Job", "rt-export", {"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    status = await cluster.until(lambda: condition(cluster.status("RLRun", "rt"), "Exported")["status"] == "True"
                                 and cluster.status("RLRun", "rt"), what="Exported")
    assert status["export"] == {"claimName": "reverse-text-shared", "path": "exports/rt/model"}
    assert "exports/rt/model on claim reverse-text-shared" in condition(status, "Exported")["message"]
    # Exported stays so: the Job going (by hand, a TTL) makes no second export.
    await cluster.delete("Job", "rt-export")
    await asyncio.sleep(1)
    assert cluster.get("Job", "rt-export") is None
    assert condition(cluster.status("RLRun", "rt"), "Exported")["status"] == "True"


async def test_a_failed_export_says_why_and_the_run_stays_succeeded(cluster):
    await cluster.create(rlrun(export=EXPORT | {"claimName": "exports", "lora": "adapter"}))
    await succeed(cluster)
    job = await cluster.until(lambda: cluster.get("Job", "rt-export"), what="the export Job")
    pod = job["spec"]["template"]["spec"]
    assert {"name": "export", "persistentVolumeClaim": {"claimName": "exports"}} in pod["volumes"]
    assert {"name": "export", "mountPath": "/export", "subPath": "exports/rt"} in pod["containers"][0]["volumeMounts"]
    assert pod["containers"][0]["command"][-2:] == ["--lora", "adapter"]
    failed = pod_failed(exit_code=2)
    failed["containerStatuses"][0]["state"]["terminated"]["message"] = "rlkube export: error: lora: the run trained every weight"
    await cluster.run_pods(job, 1, **failed)
    await cluster.patch("Job", "rt-export", {"status": {"conditions": [{"type": "Failed", "status": "True",
                                                                         "reason": "PodFailurePolicy"}]}})
    status = await cluster.until(lambda: condition(cluster.status("RLRun", "rt"), "Exported")["reason"] == "ExportFailed"
                                 and cluster.status("RLRun", "rt"), what="ExportFailed")
    assert condition(status, "Exported")["status"] == "False"
    assert "the run trained every weight" in condition(status, "Exported")["message"]
    assert status["phase"] == "Succeeded" and "export" not in status
    event = await cluster.until(lambda: next((e for e in cluster.events() if e["reason"] == "ExportFailed"), None))
    assert event["type"] == "Warning"


async def test_an_sftrun_is_exported_from_its_own_config(cluster):
    run = example("sftrun.yaml")
    run["metadata"]["name"] = "sft"
    run["spec"]["export"] = EXPORT
    await cluster.create(run)
    job = await cluster.until(lambda: cluster.get("Job", "sft-sft-trainer-0"), what="SFT trainer Job")
    await cluster.run_pods(job, 1)
    await cluster.patch("Job", "sft-sft-trainer-0", {"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    export = await cluster.until(lambda: cluster.get("Job", "sft-sft-export"), what="the SFT export Job")
    assert export["spec"]["template"]["spec"]["containers"][0]["command"][2:6] == [
        "--run", "/data/sft", "--config", "/etc/rlkube/sft.toml"]


async def test_an_object_store_target_gets_the_stores_secret_and_no_claim_mount(cluster):
    store = {"url": "s3://bucket/rl", "secretName": "s3-creds", "endpointUrl": "http://minio:9000"}
    run = rlrun(export={"url": "s3://bucket/exports/rt/", "lora": "merge"})
    run["spec"]["storage"]["objectStore"] = store
    await cluster.create(run)
    await succeed(cluster)
    job = await cluster.until(lambda: cluster.get("Job", "rt-export"), what="the export Job")
    pod = job["spec"]["template"]["spec"]
    (main,) = pod["containers"]
    assert main["command"][6:8] == ["--out", "s3://bucket/exports/rt/model"]
    assert main["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
    assert {"name": "AWS_ENDPOINT_URL", "value": "http://minio:9000"} in main["env"]
    assert "/export" not in {m["mountPath"] for m in main["volumeMounts"]}
    assert all(m.get("readOnly") for m in main["volumeMounts"] if m["name"] == "data")
    await cluster.patch("Job", "rt-export", {"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    status = await cluster.until(lambda: condition(cluster.status("RLRun", "rt"), "Exported")["status"] == "True"
                                 and cluster.status("RLRun", "rt"), what="Exported")
    assert status["export"] == {"url": "s3://bucket/exports/rt/model"}
    assert condition(status, "Exported")["message"] == "exported to s3://bucket/exports/rt/model"


@pytest.mark.parametrize(("export", "storage", "message"), [
    (EXPORT, {}, "spec.export reads the run's checkpoints from its claim: it needs spec.storage.pvc"),
    ({"url": "s3://bucket/exports/rt"}, None, ("spec.export.url writes to the run's object store: it needs "
                                              "spec.storage.objectStore")),
    ({"url": "s3://KEY:SECRET@bucket/rt"}, None, "spec.export.url holds a credential"),
    ({"url": "s3://bucket/rt", "path": "exports/rt"}, None, "exactly one of path"),
    ({"dtype": "bfloat16"}, None, "exactly one of path"),
    ({"url": "s3://bucket/rt", "claimName": "exports"}, None, "claimName names a claim for path, not for url"),
    ({"path": "../other-team"}, None, "String should match pattern"),
    ({"path": "/abs"}, None, "String should match pattern"),
    ({"path": "a/../../b"}, None, "String should match pattern"),
])
def test_an_export_without_a_claim_or_outside_its_path_is_refused_naming_the_field(export, storage, message):
    spec = rlrun(export=export)["spec"]
    if storage is not None:
        spec["storage"] = storage
    with pytest.raises(ValidationError, match="export") as e:
        RLRunSpec.model_validate(spec)
    assert message in str(e.value)


@pytest.mark.parametrize(("export", "message"), [
    ({"url": "s3://bucket/rt", "path": "exports/rt"}, "exactly one of path"),
    ({"dtype": "bfloat16"}, "exactly one of path"),
    ({"url": "s3://bucket/rt", "claimName": "exports"}, "claimName names a claim for path, not for url"),
    ({"url": "s3://bucket/rt?X-Amz-Signature=abc"}, "spec.export.url must not hold credentials"),
])
def test_the_api_server_refuses_the_same_targets(export, message):
    assert any(message in error for error in cel_errors("RLRun", rlrun(export=export))), cel_errors("RLRun", rlrun(export=export))
    assert cel_errors("RLRun", rlrun(export={"url": "s3://bucket/rt"})) == []
