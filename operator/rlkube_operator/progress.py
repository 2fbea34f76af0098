"""Training progress from `GET /status` (step, reward, checkpoints): an RLRun's orchestrator
Service, or an SFTRun's trainer pod 0 (by its name under the trainer's headless Service).

The operator calls them by their cluster DNS names rather than through the
API server's service proxy: the proxy would need `services/proxy` RBAC, which reaches every
Service's HTTP endpoints in the namespace, and it puts the API server on the path of every
poll. Direct calls need only network reachability (allowed by default; a NetworkPolicy must
let the operator reach port `orchestrator.http_port`, or 8080 of SFT trainer pods). The URL template is a setting, so tests
point it at a local HTTP server. Pods run the tenant's code, so every read is bounded (`podread`).
"""

from rlkube_operator import podread

DEFAULT_URL_TEMPLATE = "http://{service}.{namespace}.svc:{port}/status"


def status_url(template: str, *, service: str, namespace: str, port: int) -> str:
    return template.format(service=service, namespace=namespace, port=port)


ROUNDED = frozenset({"reward", "evalReward"})
"""The status fields kept to `SIGNIFICANT_DIGITS`: `kubectl get` prints a number as stored."""
SIGNIFICANT_DIGITS = 4


def significant(value):
    """A number to `SIGNIFICANT_DIGITS` significant digits (0.7159132524809819 -> 0.7159); anything
    else as it is."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def read_progress(url: str) -> dict:
    """The status JSON; raises `podread.Unreadable` saying why it cannot be read (bounded:
    `podread.DEADLINE_S` in all, `podread.MAX_BYTES` of body)."""
    return podread.get_json(url, "status")
