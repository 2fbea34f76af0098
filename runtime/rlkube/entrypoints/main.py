"""`rlkube <command> ...`: dispatch to one entry point, importing nothing heavy first.

Each entry point parses its config before importing torch or vLLM, so `--help` and config
errors answer in well under a second.
"""

import importlib
import sys

COMMANDS = {
    "rl": ("rlkube.entrypoints.rl", "inference, orchestrator and trainer together, from one config"),
    "sft": ("rlkube.entrypoints.sft", "supervised fine-tuning"),
    "inference": ("rlkube.entrypoints.inference", "one vLLM server with rlkube's weight updates"),
    "orchestrator": ("rlkube.entrypoints.orchestrator", "rollouts, rewards and batches for the trainer"),
    "env-worker": ("rlkube.entrypoints.env_worker", "run the orchestrator's rollouts in another process"),
    "trainer": ("rlkube.entrypoints.trainer", "the RL trainer (run under torchrun)"),
    "pool": ("rlkube.entrypoints.pool", "a pool's trainer and inference, and member runs on it (`--run @ a.toml ...`)"),
    "pool-trainer": ("rlkube.entrypoints.pool_trainer", "one trainer for many runs' LoRA adapters (members attach)"),
    "torchrun": ("rlkube.entrypoints.torchrun", "torchrun that checks the ranks' config and keeps their exit code 2"),
    "eval": ("rlkube.entrypoints.eval", "score a model on an environment through vLLM"),
    "model": ("rlkube.entrypoints.model", "make a tiny Hugging Face model (`rlkube model init`)"),
    "export": ("rlkube.entrypoints.export", "a run's policy at one step as a Hugging Face model directory"),
    "tool-service": ("rlkube.entrypoints.tool_service", "tools with a seeded long-tailed latency, over HTTP"),
    "plot": ("rlkube.entrypoints.plot", "PNG curves of a run's reward, eval, KL, entropy and throughput"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {doc}" for name, (_, doc) in COMMANDS.items())
    return f"usage: rlkube <command> [@ config.toml ...] [--field value ...]\n\ncommands:\n{rows}\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"rlkube: unknown command '{command}'\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command][0])
    return module.main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
