"""Container probes, run from the host side against the pod IP as the kubelet does.

Emulated: `httpGet` (path, port by number or by the container port's name, host, scheme,
httpHeaders; 200-399 is success), `tcpSocket`, `exec` (run inside the container's network,
mount and UTS namespaces), `initialDelaySeconds`, `periodSeconds`, `timeoutSeconds`,
`successThreshold`, `failureThreshold`. Not emulated: `grpc` probes, `terminationGracePeriodSeconds`
on a probe.
"""

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp

Check = Callable[[], Awaitable[bool]]
# exec_in(argv, timeout) -> exit code, inside the container's namespaces
ExecIn = Callable[[list[str], float], Awaitable[int]]


def _port(port: int | str, container: dict) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return p["containerPort"]
    raise ValueError(f"container {container['name']}: probe port {port!r} names no container port")


def make_check(probe: dict, container: dict, pod_ip: str, exec_in: ExecIn) -> Check:
    timeout = probe.get("timeoutSeconds", 1)

    if "httpGet" in probe:
        get = probe["httpGet"]
        scheme = get.get("scheme", "HTTP").lower()
        url = f"{scheme}://{get.get('host') or pod_ip}:{_port(get['port'], container)}{get.get('path', '/')}"
        headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}

        async def check() -> bool:
            try:
                async with (
                    aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
                    session.get(url, headers=headers, ssl=False, allow_redirects=False) as r,
                ):
                    return 200 <= r.status < 400
            except (TimeoutError, aiohttp.ClientError, OSError):
                return False

    elif "tcpSocket" in probe:
        tcp = probe["tcpSocket"]
        host, port = tcp.get("host") or pod_ip, _port(tcp["port"], container)

        async def check() -> bool:
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
            except (TimeoutError, OSError):
                return False
            writer.close()
            return True

    elif "exec" in probe:
        argv = probe["exec"]["command"]

        async def check() -> bool:
            return await exec_in(argv, timeout) == 0

    else:
        raise ValueError(f"container {container['name']}: probe {sorted(probe)} is not supported")
    return check


async def watch(probe: dict, check: Check, on_change: Callable[[bool], Awaitable[None]],
                state: bool | None = None, until_success: bool = False) -> None:
    """Probe every `periodSeconds`; call `on_change(ok)` when the thresholds flip the state.
    Returns after the first success when `until_success` (a startup probe), else runs until
    cancelled."""
    await asyncio.sleep(probe.get("initialDelaySeconds", 0))
    successes = failures = 0
    while True:
        ok = await check()
        successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
        if ok and successes >= probe.get("successThreshold", 1) and state is not True:
            state = True
            await on_change(True)
            if until_success:
                return
        elif not ok and failures >= probe.get("failureThreshold", 3) and state is not False:
            state = False
            await on_change(False)
        await asyncio.sleep(probe.get("periodSeconds", 10))
