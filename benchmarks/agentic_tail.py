"""Sync against async on the tool chain, on the real engine and trainer: what a tool tail costs.

examples/agentic_tail's RL config from its SFT warm-up (`--sft`; made with its sft.toml,
`--sft-steps` of it, when missing), with the tool service running at each p99/p50: sync
(`async_level = 0`) and async at each off-policy bound k (`async_level = max_off_policy_steps
= k`), one after another, each a whole `rlkube rl` (benchmarks/async_vs_sync.py's runner), each
for `--seeds` seeds. Per mode and tail, the mean over seeds of:

- wall time until the held-out greedy reward (the orchestrator's eval) first reaches the target,
  the lowest best eval reward of all the runs of that tail unless `--target-reward` (so every
  mode reaches it); "-" where a run never did;
- the trainer's tokens/s (`perf/tokens_per_s`) and s/step after step 1;
- the policy lag of the trained tokens (`off_policy/token_lag`, p50 / p99 / max over the run);
- the share of rollout time waiting on tools (`tool/latency_s` over `rollout/latency_s`).

    python benchmarks/agentic_tail.py [--steps 60] [--seeds 1] [--bounds 1 2 4] [--tail 20]
    python benchmarks/agentic_tail.py --sweep          # p99/p50 1, 5, 20, 50

Arguments after `--` go to every run (dotted flags of `rlkube rl`).
"""

import argparse
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from async_vs_sync import run_rl, step_times
from rlkube.histogram import Histogram
from rlkube.ports import free_port

EXAMPLE = Path("examples/agentic_tail")
OUT = Path("outputs/bench/agentic_tail")
TOOL_PORT = 8790
"""The tool_chain env's default `tool_url` port."""


def rlkube(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "rlkube.entrypoints.main", *args], check=True)


def warm_up(sft: Path | None, steps: int) -> Path:
    """examples/agentic_tail's SFT warm-up: `sft` when given, else made under OUT."""
    if sft is not None:
        return sft
    base = OUT / "warm_up"
    final = base / "sft" / "weights" / "final"
    if not (final / "config.json").is_file():
        rlkube("model", "init", "--out", str(base / "model"))
        subprocess.run([sys.executable, "-m", "rlkube.envs.tool_chain", "--out", str(base / "sft.jsonl"),
                        "--num-examples", "20000"], check=True)
        rlkube("sft", "@", str(EXAMPLE / "sft.toml"), "--model.name", str(base / "model"), "--data.name",
               str(base / "sft.jsonl"), "--output-dir", str(base / "sft"), "--clean-output-dir",
               "--max-steps", str(steps))
    return final


class ToolService:
    """`rlkube tool-service` at a p99/p50, for the runs of one tail."""

    def __init__(self, tail: float, p50_s: float):
        self.cmd = [sys.executable, "-m", "rlkube.entrypoints.main", "tool-service", "--port", str(TOOL_PORT),
                    "--p50-s", str(p50_s), "--tail-ratio", str(tail)]

    def __enter__(self):
        self.process = subprocess.Popen(self.cmd)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", TOOL_PORT), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.5)
        self.process.kill()
        sys.exit(f"the tool service did not listen on {TOOL_PORT} within 60 s")

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(timeout=30)


def records(run_dir: Path, process: str) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics" / f"{process}.jsonl").read_text().splitlines()]


def summarize(run_dir: Path, started: float) -> dict:
    """One run's figures from its metrics files."""
    orchestrator, trainer = records(run_dir, "orchestrator"), records(run_dir, "trainer")
    lags = Histogram("off_policy/token_lag")
    tool_s = rollout_s = 0.0
    for record in orchestrator:
        lags.add_counts(record)
        tool_s += record.get("tool/latency_s/sum", 0.0)
        rollout_s += record.get("rollout/latency_s/sum", 0.0)
    evals = [(r["time"] - started, r["eval/reward"]) for r in orchestrator if "eval/reward" in r]
    steady = [t for step, t in sorted(step_times(run_dir / "metrics" / "trainer.jsonl").items()) if step > 1]
    tokens = [r["perf/tokens_per_s"] for r in trainer if "perf/tokens_per_s" in r and r["step"] > 1]
    return {"evals": evals, "s_per_step": sum(steady) / max(len(steady), 1),
            "tokens_per_s": sum(tokens) / max(len(tokens), 1), "lag": (lags.quantile(0.5), lags.quantile(0.99), lags.max),
            "tool_share": tool_s / rollout_s if rollout_s else 0.0}


def time_to(evals: list[tuple[float, float]], target: float) -> float | None:
    return next((t for t, reward in evals if reward >= target), None)


def served_on_free_ports() -> list[str]:
    """The run's own servers on ports no one holds (another run may hold the defaults)."""
    return [arg for flag in ("--inference.port", "--orchestrator.http-port", "--rollouts.port")
            for arg in (flag, str(free_port()))]


def run_tail(tail: float, model: Path, args, extra: list[str]) -> dict[str, list[dict]]:
    """Every mode at one p99/p50, each for every seed: mode -> the runs' figures."""
    runs: dict[str, list[dict]] = {}
    with ToolService(tail, args.p50_s):
        for bound in [0, *args.bounds]:
            mode = "sync" if bound == 0 else f"async {bound}"
            for seed in range(args.seed, args.seed + args.seeds):
                out = OUT / f"tail_{tail:g}" / mode.replace(" ", "_") / f"seed_{seed}"
                started, wall = run_rl(out, [
                    "@", str(EXAMPLE / "rl.toml"), "--model.name", str(model), "--max-steps", str(args.steps),
                    "--seed", str(seed), "--orchestrator.async-level", str(bound),
                    "--orchestrator.max-off-policy-steps", str(max(bound, 1)), *served_on_free_ports(), *extra])
                runs.setdefault(mode, []).append(summarize(out, started) | {"wall_s": wall})
    return runs


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def report(tail: float, runs: dict[str, list[dict]], target: float | None) -> None:
    if target is None:  # the reward every run reached: the lowest best
        target = min(max((r for _, r in run["evals"]), default=0.0) for mode in runs.values() for run in mode)
    print(f"\np99/p50 {tail:g}: time to held-out greedy reward {target:.3f}")
    print("| mode | wall s to target | wall s | s/step | speedup vs sync | tokens/s | token lag p50 / p99 / max "
          "| tool share of rollout time |")
    print("|---|---|---|---|---|---|---|---|")
    sync = mean([r["s_per_step"] for r in runs["sync"]])
    for mode, mode_runs in runs.items():
        reached = [time_to(r["evals"], target) for r in mode_runs]
        to_target = f"{mean(reached):.0f}" if None not in reached else "-"
        s_per_step = mean([r["s_per_step"] for r in mode_runs])
        lag = "/".join(f"{mean([r['lag'][i] for r in mode_runs]):g}" for i in range(3))
        print(f"| {mode} | {to_target} | {mean([r['wall_s'] for r in mode_runs]):.0f} | {s_per_step:.2f} | "
              f"{sync / s_per_step:.2f}x | {mean([r['tokens_per_s'] for r in mode_runs]):.0f} | {lag} | "
              f"{mean([r['tool_share'] for r in mode_runs]):.2f} |", flush=True)


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft", type=Path, help="the SFT warm-up's weights (made under outputs/bench when unset)")
    parser.add_argument("--sft-steps", type=int, default=200, help="steps of the warm-up when it is made")
    parser.add_argument("--steps", type=int, default=60, help="RL steps of each run")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bounds", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--tail", type=float, default=20, help="the tool service's p99/p50")
    parser.add_argument("--sweep", action="store_true", help="p99/p50 1, 5, 20, 50 instead of --tail")
    parser.add_argument("--p50-s", type=float, default=0.2)
    parser.add_argument("--target-reward", type=float)
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    model = warm_up(args.sft, args.sft_steps)
    for tail in [1, 5, 20, 50] if args.sweep else [args.tail]:
        report(tail, run_tail(tail, model, args, extra), args.target_reward)


if __name__ == "__main__":
    main()
