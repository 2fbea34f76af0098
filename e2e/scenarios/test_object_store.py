"""An RLRun whose weight snapshots AND checkpoints live in an object store (S3 API served by a
local `moto` server the pods reach on the cluster network): nothing crosses pods through the
claim. The trainer is killed after a checkpoint; the gang resumes from the checkpoint in the
bucket; the run succeeds."""

import pytest

from e2e.scenarios.harness import ClusterError
from e2e.scenarios.manifests import claim, short_rl
from e2e.scenarios.runs import Run
from tests.fixtures import prerequisites

pytestmark = pytest.mark.slow

NAME = "s3run"
CLAIM = "s3run-data"
BUCKET = "rlkube-e2e"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
MAX_STEPS = 8


@pytest.fixture
def s3(cluster):
    moto_server = prerequisites.import_module("moto.server", "moto[server], from the dev extra")
    boto3 = prerequisites.import_module("boto3")
    from tests.fixtures.inference import free_port

    try:
        host, port = cluster.host_address, free_port()
    except ClusterError as e:  # only a real cluster's: kind's runs are the kind test's, one of the skips CI keeps
        pytest.skip(str(e))
    server = moto_server.ThreadedMotoServer(ip_address=host, port=port, verbose=False)
    server.start()
    endpoint = f"http://{host}:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    yield endpoint, client
    server.stop()


@pytest.mark.timeout(1800)
def test_weights_and_checkpoints_through_an_object_store(cluster, s3, record_property):
    endpoint, client = s3
    cluster.apply(claim(CLAIM), {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-credentials"}, "stringData": CREDENTIALS,
    })
    manifest = short_rl(NAME, cluster.seed_model(CLAIM), CLAIM, MAX_STEPS, **{"weights.type": "storage"})
    manifest["spec"]["storage"]["objectStore"] = {
        "url": f"s3://{BUCKET}/runs", "endpointUrl": endpoint, "secretName": "s3-credentials",
    }
    cluster.apply(manifest)
    run = Run(cluster, NAME, CLAIM)

    run.wait_step(3, 900)
    prefix = f"runs/{cluster.namespace}/{NAME}"

    def keys() -> list[str]:
        return [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]

    cluster.wait(lambda: any("/checkpoints/trainer/step_" in k and k.endswith("/COMPLETE") for k in keys()), 300, "a checkpoint in the bucket")
    assert any("/weights/" in k for k in keys()), "weight snapshots go to the bucket"
    assert cluster.read_file(CLAIM, f"{NAME}/checkpoints/trainer/step_2/COMPLETE") is None, \
        "checkpoints go to the object store, not the claim"

    killed_at = run.recover("trainer killed (checkpoints in S3)", lambda: cluster.kill(run.pod("trainer")))
    # Checkpoints are only in the bucket (above): a restarted trainer that does not begin again at
    # step 1 resumed from one. (Which one depends on whether the kill landed before or after the
    # checkpoint of the step it was read at, so the redone step is not asserted.)
    steps = run.trainer_steps()
    assert steps.count(1) == 1 and max(steps) > killed_at, f"resumed from the bucket's checkpoint: {steps}"
    status = cluster.wait_phase("rlrun", NAME, {"Succeeded"}, 900)
    assert max(run.trainer_steps()) == MAX_STEPS and status["restarts"] >= 1
    assert any(k.endswith(f"checkpoints/trainer/step_{MAX_STEPS}/COMPLETE") for k in keys())
    record_property("recovery wall times (s)", {k: round(v, 1) for k, v in run.timings.items()})
    cluster.delete("rlrun", NAME)
