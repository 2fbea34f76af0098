"""Training progress from `GET /status` (step, reward, checkpoints): an RLRun's orchestrator
Service, or an SFTRun's trainer pod 0 (by its name under the trainer's headless Service).

The operator calls them by their cluster DNS names rather than through the
API server's service proxy: the proxy would need `services/proxy` RBAC, which reaches every
Service's HTTP endpoints in the namespace, and it puts the API server on the path of every
poll. Direct calls need only network reachability (allowed by default; a NetworkPolicy must
let the operator reach port `orchestrator.http_port`, or 8080 of SFT trainer pods). The URL template is a setting, so tests
point it at a local HTTP server.
"""

import logging

import httpx

log = logging.getLogger(__name__)

DEFAULT_URL_TEMPLATE = "http://{service}.{namespace}.svc:{port}/status"


def status_url(template: str, *, service: str, namespace: str, port: int) -> str:
    return template.format(service=service, namespace=namespace, port=port)


def read_progress(url: str, timeout_s: float = 3.0) -> dict | None:
    """The status JSON, or None when it cannot be read right now."""
    try:
        response = httpx.get(url, timeout=timeout_s)
        response.raise_for_status()
        data = response.json()
    except (httpx.HTTPError, ValueError) as e:
        log.debug("orchestrator status at %s unreadable: %s", url, e)
        return None
    return data if isinstance(data, dict) else None
