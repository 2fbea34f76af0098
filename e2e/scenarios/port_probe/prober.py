"""Tries every port of a run as an attacker would, and prints what each attempt got.

    python prober.py TARGETS.json

TARGETS.json (written by e2e/scenarios/test_port_probe.py; waited for up to `WAIT_S` while it
is missing or empty: a ConfigMap volume gets a changed key's value, not always a new key): a list
of `{"host", "port", "protocol"}` with `protocol` `http`, `grpc` or `tcp`. Besides those, the
prober tries every TCP port listening on 127.0.0.1 of its own network namespace (from
`/proc/net/tcp`: where a pod's loopback servers, the judge endpoint among them, listen), as
HTTP. Each attempt is made with no credential and with every value of its environment whose
name looks like a credential (`CREDENTIAL_WORDS`), and also tries to read its parent's
environment, as a program an environment starts would. One line on stdout:
`PORT-PROBE <json>` with the host it ran on, the credentials it found (names and SHA-256
prefixes, never values), and an outcome per target:

- `dropped`: the connection was not answered within `CONNECT_S` (a NetworkPolicy drops it);
- `refused`: nothing listens;
- `open`: a raw TCP port accepted the connection (what a `tcp` target must never do);
- for `http`: the status of each request of `HTTP_REQUESTS` (the best any credential got);
- for `grpc`: the status code of each method of `GRPC_METHODS`.

Standard library only, but for grpcio (in the runtime image): it runs in a pod of another
namespace and inside an environment's process alike.
"""

import hashlib
import http.client
import json
import os
import socket
import sys
import time

WAIT_S = 900
CONNECT_S = 3.0
CREDENTIAL_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "AUTH", "CREDENTIAL")
HTTP_REQUESTS = (
    ("GET", "/health"), ("GET", "/metrics"), ("GET", "/status"), ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"), ("POST", "/pause"), ("POST", "/update_weights"),
    ("POST", "/collective_rpc"), ("POST", "/v1/../collective_rpc"), ("POST", "/v1/%2e%2e/collective_rpc"),
    ("POST", "/v1/tokenize"), ("GET", "/v1/chat/completions"),
)
"""vLLM's generation, weight-update and admin routes, the judge endpoint's forwarded routes and
paths that climb out of them, and the read-only routes."""
CHAT = {"messages": [{"role": "user", "content": "abc"}], "max_tokens": 2}
"""A chat request, for the model the server lists (`GET /v1/models`), if it lists one to the prober."""
GRPC_METHODS = ("/rlkube.v1.Rollouts/GetStatus", "/rlkube.v1.EnvWorkers/Work", "/rlkube.v1.Weights/Fetch")


def credentials() -> dict[str, str]:
    """Name -> value of every variable of the environment that looks like a credential."""
    return {name: value for name, value in os.environ.items() if any(w in name.upper() for w in CREDENTIAL_WORDS)}


def parent_environment() -> str:
    """What reading the parent's /proc/<pid>/environ gives: its variable names, or the error."""
    try:
        with open(f"/proc/{os.getppid()}/environ", "rb") as f:
            return "read: " + ",".join(sorted(e.split(b"=", 1)[0].decode() for e in f.read().split(b"\0") if e))
    except OSError as e:
        return f"{type(e).__name__}: {e.strerror}"


def loopback_ports() -> list[int]:
    """TCP ports listening on 127.0.0.1 in this network namespace."""
    ports = []
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port = local.split(":")
            if state == "0A" and address == "0100007F":  # LISTEN on 127.0.0.1
                ports.append(int(port, 16))
    return sorted(set(ports))


def connect(host: str, port: int) -> str | None:
    """None when a TCP connection opens, else `dropped` or `refused`."""
    try:
        socket.create_connection((host, port), timeout=CONNECT_S).close()
        return None
    except TimeoutError:
        return "dropped"
    except ConnectionRefusedError:
        return "refused"
    except OSError as e:
        return f"error {e.strerror}"


def http_call(host: str, port: int, method: str, path: str, token: str | None, model: str = "") -> tuple:
    """(status or the error, body)."""
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    body = json.dumps(CHAT | {"model": model}) if method == "POST" else None
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    except OSError as e:
        return f"error {type(e).__name__}", b""
    finally:
        conn.close()


def served_model(host: str, port: int, tokens: list) -> str:
    """The first model `GET /v1/models` lists to any of `tokens`; "" when none answers."""
    for token in tokens:
        status, body = http_call(host, port, "GET", "/v1/models", token)
        if status == 200:
            try:
                return json.loads(body)["data"][0]["id"]
            except (ValueError, KeyError, IndexError):
                pass
    return ""


def best(statuses: list) -> int | str:
    """What the attacker got at best: a 2xx over any other answer."""
    return next((s for s in statuses if isinstance(s, int) and s < 300), statuses[0])


def probe_http(host: str, port: int, tokens: list) -> dict:
    model = served_model(host, port, tokens)
    return {f"{m} {p}": best([http_call(host, port, m, p, t, model)[0] for t in tokens]) for m, p in HTTP_REQUESTS}


def probe_grpc(host: str, port: int, tokens: list) -> dict:
    import grpc

    out = {}
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        for method in GRPC_METHODS:
            codes = []
            for token in tokens:
                call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
                try:
                    call(b"", timeout=10, metadata=[("authorization", f"Bearer {token}")] if token else None)
                    codes.append("OK")
                except grpc.RpcError as e:
                    codes.append(e.code().name)
            out[method.rsplit(".", 1)[-1]] = next((c for c in codes if c == "OK"), codes[0])
    return out


def probe(target: dict, tokens: list) -> str | dict:
    if (failed := connect(target["host"], target["port"])) is not None:
        return failed
    if target["protocol"] == "http":
        return probe_http(target["host"], target["port"], tokens)
    if target["protocol"] == "grpc":
        return probe_grpc(target["host"], target["port"], tokens)
    return "open"


def read_targets(path: str) -> list[dict]:
    """The targets, once the file holds some (a ConfigMap's key is replaced whole)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                if targets := json.loads(f.read() or "[]"):
                    return targets
        except FileNotFoundError:
            pass
        time.sleep(2)
    raise SystemExit(f"prober: no targets in {path} after {WAIT_S} s")


def main() -> None:
    targets = read_targets(sys.argv[1])
    targets += [{"host": "127.0.0.1", "port": p, "protocol": "http"} for p in loopback_ports()]
    found = credentials()
    tokens = [None, *found.values()]
    results = [dict(t, outcome=probe(t, tokens)) for t in targets]
    report = {"host": socket.gethostname(), "parent_environment": parent_environment(),
              "credentials": {n: hashlib.sha256(v.encode()).hexdigest()[:16] for n, v in found.items()},
              "results": results}
    print("PORT-PROBE " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
