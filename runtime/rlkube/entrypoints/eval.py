"""`rlkube eval @ eval.toml`: score a model on an environment's held-out split through vLLM.

    rlkube eval --model.name outputs/reverse_text/sft/weights/step_150 --num-examples 100

Starts one `rlkube inference` for the model (or uses `--base-url`), runs the split through the
real verifiers environment (`rlkube.orchestrator.eval`, shared with the orchestrator's periodic
eval), prints mean reward and pass rate (avg@k / pass@k), writes
`<output_dir>/eval_results.json`, and stops the server it started.

With `--save-samples` it also writes the rollouts as SFT rows, which makes it the first half
of SFT distillation from a teacher:

    rlkube eval --base-url http://teacher:8000 --model.name <teacher> --env.args '{split = "train"}' \
        --num-examples 2000 --rollouts-per-example 4 --sampling.temperature 0.7 \
        --save-samples --samples-min-reward 0.9 --output-dir outputs/distill
    rlkube sft @ sft.toml --data.name outputs/distill/samples.jsonl
"""

import asyncio
import contextlib
import json
import sys
from pathlib import Path

from rlkube.config import EvalRunConfig, InferenceConfig, parse_cli, write_toml
from rlkube.entrypoints.checks import check_references


async def run_eval(config: EvalRunConfig) -> int:
    from rlkube.inference.process import InferenceProcess
    from rlkube.orchestrator.eval import evaluate, on_context
    from rlkube.orchestrator.inference import model_contexts

    async with contextlib.AsyncExitStack() as stack:
        base_url = config.base_url
        if base_url is None:
            # Nobody else drives this server: it generates with the model's own weights at once.
            server_config = InferenceConfig(
                **config.inference.model_dump(), model=config.model, seed=config.seed, log=config.log,
                start_paused=False,
            )
            server = stack.enter_context(InferenceProcess(server_config, config.output_dir))
            await server.wait_until_healthy()
            base_url = server.base_url
        (context,) = model_contexts([base_url], config.model.name, config.model.name, config.sampling, timeout_s=600)
        results = await evaluate(
            [config.env], on_context(context), num_examples=config.num_examples, rollouts_per_example=config.rollouts_per_example,
            pass_threshold=config.pass_threshold, keep_samples=config.save_samples,
        )
    print_results(results, config.model.name)
    out = config.output_dir / "eval_results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"model": config.model.name, "results": [r.to_json() for r in results]}
    out.write_text(json.dumps(payload, indent=2))
    print(f"results: {out}")
    if config.save_samples:
        write_samples(results, config.output_dir / "samples.jsonl", config.samples_min_reward)
    return 0


def write_samples(results, path: Path, min_reward: float | None) -> None:
    """The kept rollouts as JSON lines, written whole (a temporary file renamed into place)."""
    rows = [row for r in results for row in r.samples if min_reward is None or row["reward"] >= min_reward]
    total = sum(len(r.samples) for r in results)
    partial = path.with_name(path.name + ".partial")
    with partial.open("w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    partial.replace(path)
    kept = f" ({len(rows)} of {total} reach reward {min_reward})" if min_reward is not None else ""
    print(f"samples: {path}: {len(rows)} rows{kept}")


def print_results(results, model: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"rlkube eval: {model}", caption="avg@k is the mean reward over all rollouts")
    table.add_column("env", no_wrap=True)
    for column in ("examples", "k", "avg@k", "pass@k", "pass rate", "errors", "time"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            r.env, str(r.num_examples), str(r.k), f"{r.avg_at_k:.4f}", f"{r.pass_at_k:.4f}",
            f"{r.pass_rate:.4f}", str(len(r.errors)), f"{r.seconds:.1f}s",
        )
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    config, dry_run = parse_cli(EvalRunConfig, "eval", argv, check=check_references)
    if dry_run:
        write_toml(config, config.output_dir / "configs" / "eval.toml")
        print(f"wrote {config.output_dir / 'configs' / 'eval.toml'}")
        return 0
    from rlkube.logs import setup_logging

    setup_logging(config.log.level, config.output_dir / "logs" / "eval.log")
    return asyncio.run(run_eval(config))


if __name__ == "__main__":
    sys.exit(main())
