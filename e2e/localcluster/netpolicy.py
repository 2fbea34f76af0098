"""NetworkPolicy ingress for the local cluster, enforced as a network plugin enforces it.

A pod that some NetworkPolicy of its namespace selects for `Ingress` (its `policyTypes`, which
default to Ingress) is isolated: only traffic that one of those policies' `ingress` rules
admits reaches it, everything else is dropped. A pod no such policy selects is open. A rule
admits a source when one of its `from` peers matches (all sources without `from`) on one of its
`ports` (every port without `ports`); policies and rules add up. Peers:

- `podSelector` alone: the policy's namespace's pods with those labels;
- `namespaceSelector` alone: every pod of the namespaces with those labels
  (`kubernetes.io/metadata.name` included, as the API server sets it);
- both: the pods with those labels in those namespaces;
- `ipBlock`: `cidr` less its `except` ranges.

Ports: `protocol` (TCP by default, UDP, SCTP), `port` as a number or a name the target pod's
containers give one of their `ports` (a name no container gives admits nothing), and `endPort`.

Enforced with nftables in each pod's own network namespace: one table, `rlkube_ingress`, whose
input chain drops what its rules do not accept, rewritten in one transaction whenever the rules
change (the kubelet recomputes them on every sync and before a pod's containers start), and gone
with the namespace. As network plugins do, it always admits the node (the kubelet's probes), the
pod itself, and replies to connections the pod opened; a connection already established stays up
when a policy changes. Egress policies are stored but not enforced. A pod that keeps
CAP_NET_ADMIN could rewrite its own table (a plugin enforces outside the pod).
"""

import asyncio
import ipaddress
import logging
import os
from dataclasses import dataclass

from e2e.localcluster.policies import NAME_LABEL, selects

log = logging.getLogger(__name__)

TABLE = "rlkube_ingress"


@dataclass(frozen=True)
class Member:
    """A running pod as policies see it: its object and its IP."""

    pod: dict
    ip: str


def _labels(obj: dict) -> dict[str, str]:
    return obj["metadata"].get("labels") or {}


def _isolates(policy: dict, pod: dict) -> bool:
    spec = policy.get("spec") or {}
    return ("Ingress" in spec.get("policyTypes", ["Ingress"])
            and policy["metadata"].get("namespace") == pod["metadata"]["namespace"]
            and selects(spec.get("podSelector"), _labels(pod)))


def _sources(peer: dict, policy_ns: str, members: list[Member], namespaces: dict[str, dict]) -> str | None:
    """The nft match of one peer's source addresses; None where it matches no address."""
    if "ipBlock" in peer:
        block = ipaddress.ip_network(peer["ipBlock"]["cidr"], strict=False)
        family = "ip" if block.version == 4 else "ip6"
        excepts = peer["ipBlock"].get("except") or []
        return f"{family} saddr {block}" + (f" {family} saddr != {{ {', '.join(excepts)} }}" if excepts else "")

    def in_namespace(ns: str) -> bool:
        if "namespaceSelector" not in peer:
            return ns == policy_ns
        labels = _labels(namespaces.get(ns) or {"metadata": {}}) | {NAME_LABEL: ns}
        return selects(peer["namespaceSelector"], labels)

    ips = sorted({m.ip for m in members if in_namespace(m.pod["metadata"]["namespace"])
                  and ("podSelector" not in peer or selects(peer["podSelector"], _labels(m.pod)))})
    return f"ip saddr {{ {', '.join(ips)} }}" if ips else None


def _container_port(pod: dict, name: str, protocol: str) -> int | None:
    for container in pod["spec"].get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == name and port.get("protocol", "TCP") == protocol:
                return port["containerPort"]
    return None


def _ports(ports: list[dict], pod: dict) -> list[str]:
    """The nft matches of a rule's `ports` on `pod`, one per protocol."""
    by_protocol: dict[str, list[str] | None] = {}
    for entry in ports:
        protocol = entry.get("protocol", "TCP")
        port = entry.get("port")
        if port is None:  # every port of the protocol
            by_protocol[protocol] = None
            continue
        if isinstance(port, str) and not port.isdigit():
            port = _container_port(pod, port, protocol)
            if port is None:
                continue
        numbers = f"{port}-{entry['endPort']}" if entry.get("endPort") else str(port)
        if protocol not in by_protocol or by_protocol[protocol] is not None:
            by_protocol.setdefault(protocol, []).append(numbers)
    return [f"meta l4proto {protocol.lower()}" + (f" th dport {{ {', '.join(numbers)} }}" if numbers else "")
            for protocol, numbers in by_protocol.items()]


def ingress_rules(pod: dict, members: list[Member], namespaces: dict[str, dict], policies: list[dict]) -> list[str] | None:
    """The nft rules admitting what may reach `pod`; None where no policy isolates it (open).
    `members`: the running pods (sources), `namespaces`: by name."""
    isolating = [p for p in policies if _isolates(p, pod)]
    if not isolating:
        return None
    rules = []
    for policy in isolating:
        for rule in policy["spec"].get("ingress") or []:
            if rule.get("from"):
                sources = [_sources(peer, policy["metadata"]["namespace"], members, namespaces) for peer in rule["from"]]
                sources = [s for s in sources if s]
            else:
                sources = [""]
            ports = _ports(rule["ports"], pod) if rule.get("ports") else [""]
            rules += [" ".join(filter(None, (s, p, "accept"))) for s in sources for p in ports]
    return list(dict.fromkeys(rules))


def script(rules: list[str] | None, node_ip: str) -> str:
    """The nft script that leaves a pod's namespace with exactly these rules: the table replaced
    in one transaction, or removed where the pod is open (None)."""
    out = [f"table inet {TABLE}", f"delete table inet {TABLE}"]
    if rules is not None:
        out += [f"table inet {TABLE} {{", "  chain input {",
                "    type filter hook input priority filter; policy drop;",
                "    ct state established,related accept", '    iif "lo" accept',
                f"    ip saddr {node_ip} accept", *(f"    {r}" for r in rules), "  }", "}"]
    return "\n".join(out) + "\n"


OPEN = script(None, "")
"""What a new pod's namespace holds: no table."""


class NftError(RuntimeError):
    """nft refused a script."""


class Fences:
    """Keeps every running pod's table as the current policies say; nft runs only where a pod's
    rules changed. A pod whose rules cannot be made (a malformed policy) admits only the node
    until they can: it fails closed, and the error is logged once."""

    def __init__(self):
        self.policies: list[dict] = []
        self.namespaces: dict[str, dict] = {}
        self._applied: dict[str, str] = {}  # netns -> the script it holds
        self._lock = asyncio.Lock()

    async def update(self, members: list[tuple[Member, str]], node_ip: str) -> None:
        """`members`: each running pod with its network namespace."""
        async with self._lock:
            running = [m for m, _ in members]
            self._applied = {ns: s for ns, s in self._applied.items() if ns in {ns for _, ns in members}}
            for member, netns in members:
                try:
                    rules = ingress_rules(member.pod, running, self.namespaces, self.policies)
                    await self._apply(netns, script(rules, node_ip))
                except (ValueError, KeyError, TypeError, NftError) as e:
                    if not os.path.exists(f"/run/netns/{netns}"):
                        continue  # the pod ended meanwhile
                    closed = script([], node_ip)
                    if self._applied.get(netns) != closed:
                        meta = member.pod["metadata"]
                        log.error("pod %s/%s: its NetworkPolicy rules cannot be applied, it admits only the "
                                  "node until they can: %s", meta["namespace"], meta["name"], e)
                        await self._apply(netns, closed)

    async def _apply(self, netns: str, text: str) -> None:
        if self._applied.get(netns, OPEN) == text:
            return
        proc = await asyncio.create_subprocess_exec(
            "nsenter", f"--net=/run/netns/{netns}", "nft", "-f", "-", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await proc.communicate(text.encode())
        if proc.returncode != 0:
            raise NftError(f"nft in {netns}: {out.decode().strip()}")
        self._applied[netns] = text
