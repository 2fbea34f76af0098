"""`python -m e2e.localcluster up --state-dir DIR`: run the local cluster until SIGTERM/SIGINT.

Starts the API server (apiserver.py) on 127.0.0.1, the controllers (controllers.py) and the
kubelet (kubelet.py). Once the kubelet's bridge is up, the API server also listens on the
bridge's host address, so pods (the operator among them) reach it at
`http://<host_ip>:<port>`. Writes `DIR/kubeconfig` (no authentication) and `DIR/cluster.json`
(`api_url`, `host_ip`, `port`), and creates the namespace `default` and every `--namespace`.
The CRDs of `crds/*.yaml` are served from the start. On SIGTERM/SIGINT the kubelet stops
every pod and removes its network namespaces and bridge.

`--no-kubelet` runs only the API server and the controllers (no root needed; pods stay
Pending unless something else plays the kubelet). `--images podman` (or
`RLKUBE_LOCALCLUSTER_IMAGES=podman`) runs every container from its image in this machine's podman
store (`make images`); the default, `venv`, lets the project's virtualenv stand in for every image.
"""

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
from pathlib import Path

import kmock
import yaml

from e2e.localcluster.apiserver import ApiServer
from e2e.localcluster.controllers import Controllers

log = logging.getLogger("e2e.localcluster")


def kubeconfig(url: str, namespace: str) -> dict:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "localcluster", "preferences": {},
        "clusters": [{"name": "localcluster", "cluster": {"server": url}}],
        "contexts": [{"name": "localcluster", "context": {"cluster": "localcluster", "namespace": namespace,
                                                          "user": "localcluster"}}],
        "users": [{"name": "localcluster", "user": {}}],
    }


async def up(state_dir: Path, port: int, namespaces: list[str], with_kubelet: bool, images: str = "venv") -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with contextlib.AsyncExitStack() as stack:
        server = await stack.enter_async_context(ApiServer())
        local = await stack.enter_async_context(kmock.Server(server, host="127.0.0.1", port=port or None))
        port = local.port
        url = f"http://127.0.0.1:{port}"
        for ns in dict.fromkeys(["default", *namespaces]):
            await server.create_object(server.kinds["", "v1", "namespaces"], None, {"metadata": {"name": ns}})
        tasks = [asyncio.create_task(Controllers(url).run(), name="controllers")]
        host_ip = "127.0.0.1"
        kubelet = None
        if with_kubelet:
            from e2e.localcluster.images import PodmanImages
            from e2e.localcluster.kubelet import Kubelet, log_path

            kubelet = Kubelet(api_url=url, state_dir=state_dir,
                              images=PodmanImages() if images == "podman" else None)
            server.logs = functools.partial(log_path, state_dir)
            tasks.append(asyncio.create_task(kubelet.run(), name="kubelet"))
            ready = asyncio.create_task(kubelet.ready.wait())
            await asyncio.wait([ready, tasks[-1]], return_when=asyncio.FIRST_COMPLETED)
            if not ready.done():  # the kubelet failed (no network namespaces here): say why
                ready.cancel()
                await tasks[-1]
            host_ip = kubelet.network.host_ip
            await stack.enter_async_context(kmock.Server(server, host=host_ip, port=port))
        (state_dir / "kubeconfig").write_text(yaml.safe_dump(kubeconfig(url, namespaces[0] if namespaces else "default")))
        (state_dir / "cluster.json").write_text(json.dumps({"api_url": url, "host_ip": host_ip, "port": port}))
        log.info("local cluster up: %s (pods reach it at http://%s:%d); KUBECONFIG=%s",
                 url, host_ip, port, state_dir / "kubeconfig")
        failed = asyncio.create_task(asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION))
        await asyncio.wait([failed, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
        log.info("local cluster stopping")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if kubelet is not None:
            await kubelet.shutdown()
        for task in tasks:
            if not task.cancelled() and task.exception():
                raise task.exception()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m e2e.localcluster", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("up", help="run the cluster until SIGTERM/SIGINT")
    start.add_argument("--state-dir", type=Path, required=True, help="kubeconfig, pod files, volumes, logs")
    start.add_argument("--port", type=int, default=0, help="API server port (default: a free one)")
    start.add_argument("--namespace", action="append", default=[], help="a namespace to create (repeatable)")
    start.add_argument("--no-kubelet", action="store_true", help="API server and controllers only")
    start.add_argument("--images", choices=["venv", "podman"], default=os.environ.get("RLKUBE_LOCALCLUSTER_IMAGES", "venv"),
                       help="containers run from their images in podman's store, or from the venv (default)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    asyncio.run(up(args.state_dir.absolute(), args.port, args.namespace, not args.no_kubelet, args.images))


if __name__ == "__main__":
    main()
