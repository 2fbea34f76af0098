"""Every port of a running run, tried by the two attackers issue 41 names, gets them nothing.

The run: the judge example (`judge-rlrun.yaml`, shortened, from the tiny untrained model),
weights over gRPC (the trainer's `weights` port open), one env-worker pod, and as its
environment `rlkube_port_probe` (e2e/scenarios/port_probe): reverse-text, whose building
starts a program (`prober.py`) as a code environment runs what the policy wrote. Once the
trainer has trained a step, every TCP port a pod of the run listens on (on the local cluster
read from each pod's network namespace, so the ports gloo and vLLM pick are in; on a real
cluster the ports the pods declare) is tried:

- by a pod in another namespace (`OUTSIDE`): every attempt dropped by the run's
  NetworkPolicies;
- by the program the environment started, in the env-worker and in the orchestrator pod, with
  every credential-looking variable of its environment (it must hold none of the run's
  credentials, and its parent's environment must be closed to it), and on every port its pod
  listens on at 127.0.0.1: the trainer's ports dropped; vLLM's (policy, judge) answering 401 on
  every route but `/health` and `/metrics`; the orchestrator's gRPC UNAUTHENTICATED; its
  read-only status server answering only reads; and the judge endpoint on loopback forwarding
  its generation routes alone (200), anything else 404/405 (`..` included).

Printed: the table of every port and what each attacker got. Marked `extended`: it starts a
run of its own (two vLLM servers, a trainer, an orchestrator and an env worker), minutes beyond
the per-change gate.
"""

import base64
import hashlib
import json
from pathlib import Path

import pytest
import yaml
from rlkube.auth import OPEN_ROUTES
from rlkube.orchestrator.judge import ROUTES as JUDGE_ROUTES

from e2e.scenarios.harness import kubectl
from e2e.scenarios.manifests import claim, short_rl
from e2e.scenarios.port_probe.prober import HTTP_REQUESTS
from e2e.scenarios.runs import Run

pytestmark = [pytest.mark.slow, pytest.mark.extended]

NAME = "probed"
CLAIM = "probed-data"
OUTSIDE = "port-probe-outside"
PROBE_DIR = Path(__file__).resolve().parent / "port_probe"
PROBE_FILES = ("prober.py", "rlkube_port_probe.py")
CONFIG_MAP = "port-probe-env"
"""Holds the environment and its program (allowed by e2e/operator-values.yaml's guardrails)."""
MOUNT = "/opt/port-probe"
PROTOCOLS = {"http": "http", "metrics": "http", "grpc": "grpc", "weights": "grpc"}
"""A declared port's protocol by its name; a port of another name or none is raw TCP."""
VLLM = ("inference", "judge")
READS = {"GET /status", "GET /metrics"}
"""What the orchestrator's read-only server answers (`rlkube.readonly_http`)."""
PROGRAM_HOSTS = ("env-worker", "orchestrator")


def probe_files(targets: str = "") -> dict[str, str]:
    """The ConfigMap's files: the environment, its program, and the targets (none yet: the key
    exists from the start, since a ConfigMap volume may not get a key added later)."""
    return {name: (PROBE_DIR / name).read_text() for name in PROBE_FILES} | {"targets.json": targets}


def config_map(name: str, data: dict[str, str]) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def with_program(pod: dict) -> dict:
    """Pod settings that install the probing environment from the ConfigMap."""
    return pod | {"env": [{"name": "PYTHONPATH", "value": MOUNT}],
                  "volumes": [{"name": "port-probe", "configMap": {"name": CONFIG_MAP}}],
                  "volumeMounts": [{"name": "port-probe", "mountPath": MOUNT, "readOnly": True}]}


def probed_run(model: str) -> dict:
    run = short_rl(NAME, model, CLAIM, 400, manifest="judge-rlrun.yaml", **{
        "weights": {"type": "grpc"}, "ckpt.interval": 100, "orchestrator.batch_size": 16,
        "orchestrator.envs": [{"id": "rlkube_port_probe", "args": {"min_len": 2, "max_len": 4}}],
    })
    spec = run["spec"]
    spec["judge"]["model"]["name"] = model
    spec["envWorkers"] = {"replicas": 1, "pod": with_program({})}
    spec["orchestrator"]["pod"] = with_program(spec["orchestrator"].get("pod", {}))
    return run


def outside_pod(image: str) -> list[dict]:
    """A namespace of its own, and in it a pod that runs the prober on the targets."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "prober", "namespace": OUTSIDE}, "spec": {
        "restartPolicy": "Never",
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "prober", "image": image, "command": ["python", f"{MOUNT}/prober.py",
                                                                       f"{MOUNT}/targets.json"],
                        "volumeMounts": [{"name": "probe", "mountPath": MOUNT, "readOnly": True}],
                        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}],
        "volumes": [{"name": "probe", "configMap": {"name": "probe"}}]}}
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OUTSIDE}}, pod]


def targets(cluster) -> tuple[list[dict], dict[tuple[str, int], dict]]:
    """Every TCP port a pod of the run listens on, as prober targets, and what each is
    (component, declared name, the Services that front it), by (IP, port)."""
    pods = [p for p in cluster.reads.objects("pods", f"rlkube.dev/run={NAME}") if p["status"].get("podIP")]
    services = cluster.reads.objects("services", f"rlkube.dev/run={NAME}")
    out, what = [], {}
    for pod in pods:
        labels, ip = pod["metadata"]["labels"], pod["status"]["podIP"]
        declared = {p["containerPort"]: p.get("name", "") for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        for port in cluster.listening_ports(pod["metadata"]["name"]):
            name = declared.get(port, "")
            fronted = [s["metadata"]["name"] for s in services
                       if all(labels.get(k) == v for k, v in (s["spec"].get("selector") or {}).items())
                       and any(p["port"] == port for p in s["spec"]["ports"])]
            out.append({"host": ip, "port": port, "protocol": PROTOCOLS.get(name, "tcp")})
            what[ip, port] = {"component": labels["app.kubernetes.io/component"], "pod": pod["metadata"]["name"],
                              "name": name, "services": fronted}
    return out, what


def expected(source: str, target: dict, what: dict | None) -> object:
    """What `source` (OUTSIDE or a program's pod) must get from `target`: a callable on the
    outcome for the read-only server, else the exact outcome."""
    if target["host"] == "127.0.0.1":  # the prober's own pod's loopback: the judge endpoint
        return {f"{m} {p}": (200 if JUDGE_ROUTES.get(p) == m else 405 if p in JUDGE_ROUTES else 404)
                for m, p in HTTP_REQUESTS}
    if source == OUTSIDE or what["component"] == "trainer":
        return "dropped"
    if what["component"] in VLLM and what["name"] == "http":
        return {f"{m} {p}": (200 if p in OPEN_ROUTES else 401) for m, p in HTTP_REQUESTS}
    if what["component"] == "orchestrator" and what["name"] == "grpc":
        return {"Rollouts/GetStatus": "UNAUTHENTICATED", "EnvWorkers/Work": "UNAUTHENTICATED",
                "Weights/Fetch": "UNIMPLEMENTED"}
    if what["component"] == "orchestrator" and what["name"] == "http":
        return lambda got: isinstance(got, dict) and all((got[r] == 200) == (r in READS) for r in got)
    return "dropped"  # anything else the run listens on must not admit an environment's program


def matches(want, got) -> bool:
    return want(got) if callable(want) else want == got


def summary(outcome) -> str:
    """An outcome in a table cell: the answer most routes got, then the exceptions."""
    if not isinstance(outcome, dict):
        return outcome
    common = max(set(outcome.values()), key=list(outcome.values()).count)
    rest = ", ".join(f"{r} {v}" for r, v in outcome.items() if v != common)
    return f"{common}" + (f" (but {rest})" if rest else "")


def reports(log: str) -> list[dict]:
    return [json.loads(line.split("PORT-PROBE ", 1)[1]) for line in log.splitlines() if "PORT-PROBE " in line]


@pytest.mark.timeout(1800)
def test_no_port_of_a_run_gives_an_outsider_or_an_environments_program_anything(cluster, record_property):
    cluster.apply(claim(CLAIM), config_map(CONFIG_MAP, probe_files()))
    run_manifest = probed_run(cluster.seed_model(CLAIM))
    cluster.apply(run_manifest)
    run = Run(cluster, NAME, CLAIM)
    try:
        run.wait_trained(1, 900)
        probe_targets, what = targets(cluster)
        listed = json.dumps(probe_targets)
        # the outsider: its own namespace, the targets in its own ConfigMap
        namespace, pod = outside_pod(run_manifest["spec"]["image"])
        kubectl(cluster.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(namespace))
        probe = config_map("probe", {k: v for k, v in probe_files(listed).items() if k != "rlkube_port_probe.py"})
        kubectl(cluster.kubeconfig, "-n", OUTSIDE, "apply", "-f", "-", input=yaml.safe_dump_all([probe, pod]))
        # the environments' programs: the targets appear beside them
        cluster.apply(config_map(CONFIG_MAP, probe_files(listed)))

        def outside_done():
            phase = (kubectl(cluster.kubeconfig, "-n", OUTSIDE, "get", "pod", "prober", "-o", "json", check=False)
                     .stdout or "{}")
            return json.loads(phase).get("status", {}).get("phase") in ("Succeeded", "Failed")

        cluster.wait(outside_done, 600, "the prober in another namespace to finish")
        got = {OUTSIDE: reports(kubectl(cluster.kubeconfig, "-n", OUTSIDE, "logs", "prober").stdout)}
        for component in PROGRAM_HOSTS:
            pod_name = run.pod(component)
            got[component] = cluster.wait(lambda pod_name=pod_name: reports(cluster.kubectl("logs", pod_name)), 600,
                                          f"the environment's program in {pod_name} to report")
        assert all(len(r) == 1 for r in got.values()), f"one report from each prober: {got}"
        got = {source: r[0] for source, r in got.items()}
        secret = cluster.get("secret", f"{NAME}-token") or {}
        run_credentials = {hashlib.sha256(base64.b64decode(v)).hexdigest()[:16] for v in secret["data"].values()}

        rows, wrong = {}, []
        for source, report in got.items():
            for result in report["results"]:
                key = (result["host"], result["port"])
                where = what.get(key, {"component": f"{source} loopback", "pod": report["host"], "name": "",
                                       "services": []})
                if result["host"] == "127.0.0.1":
                    key = (f"{source} loopback", result["port"])
                rows.setdefault(key, {"where": where})[source] = summary(result["outcome"])
                want = expected(source, result, what.get((result["host"], result["port"])))
                if not matches(want, result["outcome"]):
                    wrong.append(f"{source} -> {where['component']} {where['name'] or '-'} [{result['port']}]: got "
                                 f"{result['outcome']}, want {want if not callable(want) else 'reads only'}")
        header = f"| target | port | Services | {' | '.join(got)} |"
        lines = [header, "|" + "---|" * (3 + len(got))]
        for (host, port), row in sorted(rows.items(), key=lambda kv: (kv[1]["where"]["component"], kv[0][1])):
            w = row["where"]
            lines.append(f"| {w['component']} ({w['pod']}) | {w['name'] or '-'} [{port}] | "
                         f"{', '.join(w['services']) or '-'} | " + " | ".join(row.get(s, "not tried") for s in got) + " |")
        table = "\n".join(lines)
        print("\n" + table)
        record_property("ports", table)
        found = {s: r["credentials"] for s, r in got.items()}
        print(f"credentials found: {found}; parent environment: "
              f"{ {s: r['parent_environment'] for s, r in got.items()} }")
        for source in PROGRAM_HOSTS:
            held = set(got[source]["credentials"].values()) & run_credentials
            assert not held, f"the environment's program in the {source} pod holds a credential of the run: {found}"
            assert got[source]["parent_environment"].startswith("PermissionError"), got[source]["parent_environment"]
        assert not wrong, "\n".join(wrong) + "\n" + table
        assert any(r["host"] == "127.0.0.1" for r in got["env-worker"]["results"]), "no judge endpoint found"
    finally:
        kubectl(cluster.kubeconfig, "delete", "namespace", OUTSIDE, "--ignore-not-found", check=False, timeout=180)
        cluster.delete("rlrun", NAME)
