"""docs/security.md's threat model is the one the builders and the servers make
(`rlkube_operator.threatmodel`): a scope a server accepts, a NetworkPolicy peer or a port changed
without the docs fails here (and `python -m rlkube_operator.crd --check` in `make lint`)."""

import asyncio

import grpc
import httpx
import pytest
from rlkube import auth
from rlkube.scopes import ADMIN, ROLLOUTS, SCOPES, WEIGHTS, scope_env, scoped
from rlkube.transport import rlkube_pb2 as pb
from rlkube.transport import rlkube_pb2_grpc as pb_grpc
from rlkube_operator import builders, export, threatmodel

from tests.fixtures.inference import free_port
from tests.security.test_scopes import TOKEN, as_component, bearer, trainer_weight_server
from tests.transport.test_rollouts_grpc import FakeSource, ServerThread


def rows_by_port() -> dict[tuple[str, str], tuple[str, str]]:
    return {(where, serves): (reach, credential) for where, serves, reach, credential in threatmodel.rows()}


def test_the_docs_table_is_the_derived_one():
    text = threatmodel.PAGE.read_text()
    assert threatmodel.BEGIN in text and threatmodel.END in text
    assert threatmodel.page(text) == text, "docs/security.md's threat model is stale: run `python -m rlkube_operator.crd`"


def test_a_changed_server_scope_changes_the_table(monkeypatch):
    """The weight server taking the rollouts credential (which env workers hold) would be a
    hole: the table shows it on the trainer's weights row and on both credentials' grants."""
    before = rows_by_port()
    monkeypatch.setitem(auth.SERVICE_SCOPES, "Weights", ROLLOUTS)
    after = rows_by_port()
    (weights,) = [k for k in before if k[0] == "trainer `weights` [50052]"]
    assert (before[weights][1], after[weights][1]) == ("`weights`", "`rollouts`")
    assert threatmodel.page(threatmodel.PAGE.read_text()) != threatmodel.PAGE.read_text()


def test_a_widened_network_policy_peer_changes_the_table(monkeypatch):
    """A trainer policy that let every pod of the run in (the rule issue 41 removed) shows the
    orchestrator, env workers, teacher and judge reaching torchrun's store and the data ports."""
    build = builders.build_network_policies

    def widened(*args, **kwargs):
        policies = build(*args, **kwargs)
        for policy in policies:
            if policy["metadata"]["name"].endswith("-trainer-network-policy"):
                policy["spec"]["ingress"].append({"from": [{"podSelector": {"matchLabels": policy["spec"][
                    "podSelector"]["matchLabels"]}}]})
        return policies

    monkeypatch.setattr(builders, "build_network_policies", widened)
    after = rows_by_port()
    torchrun = next(v for k, v in after.items() if k[0] == "trainer `torchrun` [29500]")
    assert "orchestrator" in torchrun[0] and "env-worker" in torchrun[0] and "judge" in torchrun[0]
    assert threatmodel.page(threatmodel.PAGE.read_text()) != threatmodel.PAGE.read_text()


def test_the_tool_service_row_is_its_network_policy(monkeypatch):
    """The tool service (`spec.toolService`) takes no credential, so its policy is its fence:
    the orchestrator and env workers alone reach its port. Without its policy the table says
    otherwise, and the page is stale."""
    assert row("tool-service `http` [8790]") == ("orchestrator, env-worker", "none")
    build = builders.build_network_policies
    monkeypatch.setattr(builders, "build_network_policies", lambda *args, **kwargs: [
        p for p in build(*args, **kwargs) if not p["metadata"]["name"].endswith("-tool-service-network-policy")])
    assert row("tool-service `http` [8790]") != ("orchestrator, env-worker", "none")
    assert threatmodel.page(threatmodel.PAGE.read_text()) != threatmodel.PAGE.read_text()


def test_the_export_pods_credentials_are_the_ones_its_builder_gives():
    """The export Job's pod (`spec.export`) holds the checkpoint key and the store's Secret,
    no scope; a scope added to its pod shows on that credential's row."""
    assert row("credential `RLKUBE_CHECKPOINT_KEY`")[0] == "trainer, export"
    assert "export" in row("credential `storage.objectStore.secretName`")[0].split(", ")
    assert not any("export" in held.split(", ") for (where, _), (held, _) in rows_by_port().items()
                   if where.startswith("credential `RLKUBE_TOKEN"))


def test_a_credential_added_to_the_export_pod_changes_the_table(monkeypatch):
    build = export.build_export_job

    def with_admin(*args):
        job = build(*args)
        job["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": scope_env(ADMIN), "value": "x"})
        return job

    monkeypatch.setattr(export, "build_export_job", with_admin)
    assert row(f"credential `{scope_env(ADMIN)}`")[0] == "inference, orchestrator, export"
    assert threatmodel.page(threatmodel.PAGE.read_text()) != threatmodel.PAGE.read_text()


def test_nothing_outside_the_run_reaches_a_port_but_the_operator_and_the_scraper():
    for (where, _), (reach, _) in rows_by_port().items():
        if where.startswith(("credential", "the judge endpoint")):
            continue
        assert "another namespace" not in reach and "another run's pods" not in reach, where


def test_the_operators_own_default_peer_admits_operator_labelled_pods_from_its_namespace_alone(capsys, monkeypatch,
                                                                                              tmp_path):
    """`rlkube-operator` without `--network-policy-peer` (the chart passes one; a hand-made
    Deployment may not): the runs' policies admit the operator's labels in the operator's
    namespace, and a tenant's pod labelled the same in another namespace reaches nothing.
    Without a namespace to restrict it to, the operator refuses to start, naming the flags."""
    from rlkube_operator.main import main, network_policy_peer, parse_args

    peer = network_policy_peer(parse_args(["--namespace", threatmodel.NAMESPACE, "--operator-namespace",
                                           threatmodel.OPERATOR_NAMESPACE]))
    objects = threatmodel.build_run(*threatmodel.VARIANTS[""], operator_peer=peer)
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    pods = threatmodel.pod_templates(objects)
    status = (threatmodel.NAMESPACE, pods["orchestrator"]["metadata"]["labels"])
    (port,) = [p["containerPort"] for c in pods["orchestrator"]["spec"]["containers"] for p in c["ports"]
               if p["name"] == "http"]
    labelled = threatmodel.OPERATOR_LABELS
    assert threatmodel.admitted(policies, (threatmodel.OPERATOR_NAMESPACE, labelled), status, port)
    for namespace in (threatmodel.NAMESPACE, "team-b"):
        assert not threatmodel.admitted(policies, (namespace, labelled), status, port), namespace
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    key = tmp_path / "key"
    key.write_bytes(b"k" * 32)
    assert main(["--namespace", threatmodel.NAMESPACE, f"--token-key-file={key}"]) == 2
    assert "--operator-namespace (or $POD_NAMESPACE), or --network-policy-peer" in capsys.readouterr().err


class Recorder:
    """An ASGI app standing for vLLM's routes: 200 on every path."""

    async def __call__(self, scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


@pytest.mark.parametrize("component", ["inference", "teacher", "judge"])
def test_the_vllm_rows_are_what_the_servers_middleware_answers(component, monkeypatch):
    """Each vLLM row's credential, against rlkube's real middleware with the credentials the
    operator gives `component`: every scope the row names is let through, every other is 401."""
    as_component(monkeypatch, component)
    app = auth.RequireToken(Recorder())
    rows = {serves: credential for (where, serves), (_, credential) in rows_by_port().items()
            if where.startswith(f"{component} `http`")}
    assert len(rows) == 1 + len(threatmodel.VLLM_ROUTES)

    async def status(path: str, scope: str) -> int:
        headers = {"Authorization": f"Bearer {scoped(TOKEN, scope)}"}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://vllm") as client:
            return (await client.post(path, headers=headers)).status_code

    for serves, path in threatmodel.VLLM_ROUTES.items():
        answered = {scope: asyncio.run(status(path, scope)) for scope in SCOPES}
        assert {s for s, code in answered.items() if code == 200} == {
            s for s in SCOPES if f"`{s}`" in rows[serves]}, (serves, answered)
        assert set(answered.values()) <= {200, 401}


def row(where: str, serves: str = "") -> tuple[str, str]:
    """The row of port `where` (of the service `serves` starts with, where it serves several)."""
    (value,) = [v for (w, s), v in rows_by_port().items() if w == where and s.startswith(serves)]
    return value


def test_the_grpc_rows_are_what_the_real_servers_accept(monkeypatch):
    """The orchestrator's and the trainer's gRPC rows, against the real servers started with
    the credentials the operator gives their components: a scope the row names is served,
    every other is UNAUTHENTICATED."""
    as_component(monkeypatch, "orchestrator")
    port = free_port()
    with ServerThread(FakeSource(), port), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        report = pb_grpc.RolloutsStub(channel).ReportPolicy
        served = set()
        for scope in SCOPES:
            try:
                report(pb.PolicyReport(step=1, location="/ok"), timeout=10, metadata=bearer(scope))
                served.add(scope)
            except grpc.RpcError as refused:
                assert refused.code() == grpc.StatusCode.UNAUTHENTICATED
    assert served == {s for s in SCOPES if f"`{s}`" in row("orchestrator `grpc` [50051]", "`Rollouts`")[1]} == {ROLLOUTS}

    served = set()
    with trainer_weight_server(monkeypatch) as fetch:
        for scope in SCOPES:
            try:
                list(fetch(pb.WeightsRequest(step=3), timeout=10, metadata=bearer(scope)))
                served.add(scope)
            except grpc.RpcError as refused:
                assert refused.code() == grpc.StatusCode.UNAUTHENTICATED
    assert served == {s for s in SCOPES if f"`{s}`" in row("trainer `weights` [50052]")[1]} == {WEIGHTS}
