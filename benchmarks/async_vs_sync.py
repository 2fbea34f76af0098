"""Steps per minute of the whole RL loop, one-step async (async_level=1) vs synchronous (0).

Runs `rlkube rl` twice on the same config, changing only `orchestrator.async_level`, and reads
each trainer's `time/step` from `<output_dir>/metrics/trainer.jsonl`. Step 1 (engine warm-up,
the first batch generated from nothing) is left out of the rate.

    python benchmarks/async_vs_sync.py @ examples/reverse_text/rl.toml --max-steps 12 \
        --model.name outputs/reverse_text/sft/weights/final

Arguments after the script name are passed to both runs (`@ file.toml` and dotted flags).
"""

import json
import subprocess
import sys
import time
from pathlib import Path

OUT = Path("outputs/bench/async_vs_sync")


def step_times(metrics_file: Path) -> dict[int, float]:
    times = {}
    for line in metrics_file.read_text().splitlines():
        record = json.loads(line)
        if "time/step" in record:
            times[int(record["step"])] = float(record["time/step"])
    return times


def run_rl(out: Path, args: list[str]) -> tuple[float, float]:
    """`rlkube rl` with `args` into a clean `out`, no checkpoints: (unix start time, wall s).
    Exits naming the run's logs when it fails."""
    cmd = [sys.executable, "-m", "rlkube.entrypoints.rl", *args, "--output-dir", str(out),
           "--clean-output-dir", "--no-ckpt"]
    started, start = time.time(), time.perf_counter()
    code = subprocess.call(cmd)
    if code != 0:
        sys.exit(f"{out.name}: rlkube rl failed ({code}); see {out / 'logs'}")
    return started, time.perf_counter() - start


def run(async_level: int, args: list[str]) -> dict:
    out = OUT / f"async_level_{async_level}"
    _, wall = run_rl(out, [*args, "--orchestrator.async-level", str(async_level)])
    times = step_times(out / "metrics" / "trainer.jsonl")
    steady = [t for step, t in sorted(times.items()) if step > 1]
    if not steady:
        sys.exit(f"async_level={async_level}: need at least 2 steps to measure")
    return {"steps": len(times), "s_per_step": sum(steady) / len(steady),
            "steps_per_min": 60 * len(steady) / sum(steady), "wall_s": wall}


def main() -> None:
    args = sys.argv[1:]
    results = {level: run(level, args) for level in (1, 0)}
    print(f"\n{'':<22}{'async (1)':>12}{'sync (0)':>12}")
    for key, fmt in (("steps", "{:>12d}"), ("s_per_step", "{:>12.2f}"), ("steps_per_min", "{:>12.2f}"), ("wall_s", "{:>12.1f}")):
        print(f"{key:<22}" + "".join(fmt.format(results[level][key]) for level in (1, 0)))
    ratio = results[1]["steps_per_min"] / results[0]["steps_per_min"]
    print(f"\nasync / sync steps per minute: {ratio:.2f}x")


if __name__ == "__main__":
    main()
