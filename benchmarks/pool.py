"""Many runs on one pool against the same runs alone: wall time, CPU, memory and reward, side by side.

The same LoRA runs (the same configs, seeds and SFT warm-up) first as separate `rlkube rl` runs
one after another, then as members of one `rlkube pool`. Each solo run is the member's own RL
config as the pool runs it (`rlkube.launch.pool.members`: the pool's model and inference
settings, its own trainer, orchestrator and seed), with inference of its own.

    python benchmarks/pool.py                                   # examples/pool_reverse_text
    python benchmarks/pool.py --max-steps 10 --seeds 3 --sft outputs/reverse_text/sft/weights/final

Prints, for the solo runs and the pool: the wall time until all runs finished, the CPU-seconds
of every process (user + system, summed over the launcher's process tree, sampled from /proc),
the peak proportional set size (PSS: shared pages split between the processes sharing them)
of the trainer, inference and orchestrator processes and of all of them together, and each
run's held-out greedy reward after RL (its orchestrator's eval at the last step) against its
solo run's; with `--seeds N` each run is also run alone with seeds s..s+N-1, and their spread
is shown. The SFT warm-up is examples/reverse_text's (`--sft`; made with its sft.toml when
missing). Results also go to `<out>/results.json`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rlkube.config import RLConfig, load_config, to_toml
from rlkube.config.pool import PoolConfig
from rlkube.launch.pool import RunArgs, members

EXAMPLE = Path("examples/pool_reverse_text")
LEARNING_RATES = ("5e-4", "1e-3", "2e-3")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ROLES = (("pool_trainer", "trainer"), ("entrypoints.trainer", "trainer"), ("torchrun", "trainer"),
         ("entrypoints.inference", "inference"), ("entrypoints.orchestrator", "orchestrator"),
         ("entrypoints.env_worker", "orchestrator"))
"""A launcher's child (by its command line) and the role its process tree is counted under."""


def proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds so far) of every process."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        table[int(stat.parent.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS)
    return table


def pss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def role_of(pid: int) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "other"
    return next((role for needle, role in ROLES if needle in cmdline), "other")


class Sampler:
    """Samples a process tree every `interval_s`: CPU seconds per process (the newest reading
    of each, so a process that exited keeps what it used until its last sample) and the PSS of
    each role (the tree under each of the root's children), summed at each sample, and its peak."""

    def __init__(self, root: int, interval_s: float = 1.0):
        self.root, self.interval_s = root, interval_s
        self.cpu: dict[int, float] = {}
        self.peak: dict[str, float] = {}
        self.roles: dict[int, str] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        table = proc_table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        now: dict[str, float] = {}
        stack = [(self.root, "launcher")]
        while stack:
            pid, role = stack.pop()
            if pid != self.root and role == "launcher":
                role = self.roles.setdefault(pid, role_of(pid))  # a direct child of the launcher
            self.cpu[pid] = max(self.cpu.get(pid, 0.0), table.get(pid, (0, 0.0))[1])
            now[role] = now.get(role, 0.0) + pss_mb(pid)
            stack += [(child, role) for child in children.get(pid, [])]
        now["all"] = sum(now.values())
        for role, mb in now.items():
            self.peak[role] = max(self.peak.get(role, 0.0), mb)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


def measure(cmd: list[str], log: Path) -> dict:
    """Run `cmd` to its end under a Sampler: wall seconds, CPU seconds, peak PSS by role."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        with Sampler(process.pid) as sampler:
            code = process.wait()
    if code != 0:
        sys.exit(f"{' '.join(cmd[:4])} ... failed ({code}); see {log}")
    return {"wall_s": time.perf_counter() - start, "cpu_s": sum(sampler.cpu.values()), "peak_mb": sampler.peak}


def eval_rewards(run_dir: Path) -> tuple[float, float]:
    """The held-out greedy reward (the orchestrator's eval) at its first and last eval."""
    rewards = [record["eval/reward"] for line in (run_dir / "metrics" / "orchestrator.jsonl").read_text().splitlines()
               if "eval/reward" in (record := json.loads(line))]
    if not rewards:
        sys.exit(f"{run_dir}: no eval/reward in its metrics (the runs need [orchestrator.eval])")
    return rewards[0], rewards[-1]


def warm_up(sft: Path, out: Path) -> Path:
    """examples/reverse_text's SFT warm-up at `sft`, made there when missing."""
    if (sft / "config.json").is_file():
        return sft
    rlkube = [sys.executable, "-m", "rlkube.entrypoints.main"]
    base = out / "warm_up"
    subprocess.run([*rlkube, "model", "init", "--out", str(base / "model")], check=True)
    subprocess.run([*rlkube, "sft", "@", "examples/reverse_text/sft.toml", "--model.name", str(base / "model"),
                    "--output-dir", str(base / "sft"), "--clean-output-dir"], check=True)
    return base / "sft" / "weights" / "final"


def solo_config(config: RLConfig, out: Path, seed: int) -> RLConfig:
    """A member's RL config as the run it is alone: its own inference (the pool's settings), its
    outputs under `out`, `seed`."""
    data = config.model_dump()
    del data["orchestrator"]["client"]["base_urls"]
    return RLConfig.model_validate(data | {"output_dir": out, "seed": seed, "clean_output_dir": True})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool", type=Path, default=EXAMPLE / "pool.toml")
    parser.add_argument("--member", type=Path, default=EXAMPLE / "member.toml", help="what the runs share")
    parser.add_argument("--lr", nargs="+", default=list(LEARNING_RATES), help="one run per learning rate")
    parser.add_argument("--sft", type=Path, default=Path("outputs/reverse_text/sft/weights/final"))
    parser.add_argument("--max-steps", type=int, help="each run's (member.toml's when unset)")
    parser.add_argument("--batch-size", type=int, help="each run's orchestrator.batch_size")
    parser.add_argument("--eval-examples", type=int, help="each run's orchestrator.eval.num_examples")
    parser.add_argument("--seeds", type=int, default=1, help="solo runs of each member, seeds s..s+N-1")
    parser.add_argument("--out", type=Path, default=Path("outputs/bench/pool"))
    parser.add_argument("--reuse", action="store_true",
                        help="take a solo run's figures from an earlier benchmark under --out (the same settings)")
    args = parser.parse_args()

    sft = warm_up(args.sft, args.out)
    flags = [f for name, value in (("--max-steps", args.max_steps), ("--orchestrator.batch-size", args.batch_size),
                                   ("--orchestrator.eval.num-examples", args.eval_examples)) if value is not None
             for f in (name, str(value))]
    pool_argv = ["@", str(args.pool), "--model.name", str(sft), "--output-dir", str(args.out / "pool")]
    runs = [RunArgs(f"lr-{lr}", ["@", str(args.member), "--trainer.optim.lr", lr, *flags]) for lr in args.lr]
    pool = load_config(PoolConfig, pool_argv)
    pool_members = members(pool, runs)

    solo: dict[str, list[dict]] = {}
    for k in range(args.seeds):
        for m in pool_members:
            out = args.out / "solo" / m.name / f"seed_{m.config.seed + k}"
            path, saved = out.with_suffix(".toml"), out.with_suffix(".json")
            config = solo_config(m.config, out, m.config.seed + k)
            if args.reuse and saved.is_file() and path.is_file() and load_config(RLConfig, ["@", str(path)]) == config:
                result = json.loads(saved.read_text())
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(to_toml(config, exclude_unset=True))  # base_urls unset: inference of its own
                result = measure([sys.executable, "-m", "rlkube.entrypoints.rl", "@", str(path)], out.with_suffix(".log"))
                result["reward_before"], result["reward"] = eval_rewards(out)
                saved.write_text(json.dumps(result))
            solo.setdefault(m.name, []).append(result)
            print(f"solo {m.name} seed {m.config.seed + k}: {result['wall_s']:.0f} s, reward {result['reward']:.3f}")
    cmd = [sys.executable, "-m", "rlkube.entrypoints.pool", *pool_argv, "--clean-output-dir",
           *[a for run in runs for a in ("--run", run.name, *run.argv)]]
    pooled = measure(cmd, args.out / "pool.log")
    rewards = {m.name: eval_rewards(m.output_dir) for m in pool_members}
    report(solo, pooled, rewards, args)
    (args.out / "results.json").write_text(json.dumps({"solo": solo, "pool": pooled, "pool_rewards": rewards,
                                                       "args": {k: str(v) for k, v in vars(args).items()}}, indent=1))


def report(solo: dict[str, list[dict]], pooled: dict, rewards: dict[str, tuple[float, float]], args) -> None:
    first = [runs[0] for runs in solo.values()]  # seed s of each run: the three solo runs one after another
    console = Console(width=120)
    table = Table(title=f"{len(solo)} LoRA runs: one after another alone, then on one pool")
    for column in ("", "alone (one after another)", "pool", "pool / alone"):
        table.add_column(column, justify="right" if column else "left")

    def row(what: str, alone: float, pool: float, unit: str) -> None:
        table.add_row(what, f"{alone:,.0f} {unit}", f"{pool:,.0f} {unit}", f"{pool / alone:.2f}x" if alone else "")

    row("wall time until all finished", sum(r["wall_s"] for r in first), pooled["wall_s"], "s")
    row("CPU-seconds, all processes", sum(r["cpu_s"] for r in first), pooled["cpu_s"], "s")
    for role in ("trainer", "inference", "orchestrator", "all"):
        alone = max(r["peak_mb"].get(role, 0.0) for r in first)  # one run at a time: its peak
        row(f"peak PSS, {role}" + (" (one solo run's)" if role == "all" else ""), alone,
            pooled["peak_mb"].get(role, 0.0), "MB")
    console.print(table)

    rewards_table = Table(title="held-out greedy reward (the orchestrator's eval at step 0 and at the last step)")
    for column in ("run", "after SFT", "alone", f"alone, {args.seeds} seeds", "pool", "pool within the spread"):
        rewards_table.add_column(column, justify="left" if column == "run" else "right")
    for name, runs in solo.items():
        values = [r["reward"] for r in runs]
        spread = (f"{min(values):.3f}-{max(values):.3f} (mean {statistics.mean(values):.3f}"
                  + (f", sd {statistics.stdev(values):.3f})" if len(values) > 1 else ")"))
        within = "yes" if min(values) <= rewards[name][1] <= max(values) else "no"
        rewards_table.add_row(name, f"{runs[0]['reward_before']:.3f}", f"{runs[0]['reward']:.3f}", spread,
                              f"{rewards[name][1]:.3f}", within if len(values) > 1 else "")
    console.print(rewards_table)


if __name__ == "__main__":
    main()
