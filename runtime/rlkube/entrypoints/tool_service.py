"""`rlkube tool-service [--port 8790] [--p50-s 0.2] [--tail-ratio 20] ...`: the long-tail tool
service (`rlkube.envs.tool_service`) in this process, until interrupted. One flag per field of
`ToolServiceConfig`."""

import argparse
import asyncio
import contextlib
import logging


def parse(argv: list[str]):
    from rlkube.envs.tool_service.latency import ToolServiceConfig

    parser = argparse.ArgumentParser(prog="rlkube tool-service", description=__doc__)
    for name, field in ToolServiceConfig.model_fields.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(field.default), default=field.default,
                            help=f"{field.description} (default {field.default})")
    return ToolServiceConfig(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    config = parse(argv or [])
    from rlkube.envs.tool_service.server import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config))
    return 0
