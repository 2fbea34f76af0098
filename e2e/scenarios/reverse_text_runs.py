"""The reverse-text scenario's RL part, run with `rlkube rl` on this machine, many times:

    python -m e2e.scenarios.reverse_text_runs --runs 20 --out outputs/scenario-rl

It makes the tiny model and its SFT warm-up once (the scenario's SFTRun config), then runs the
scenario's RLRun config (e2e/scenarios/reverse_text.py; env workers as the scenario's pods)
once per seed, and prints each run's training reward by thirds and its trend, its worst mismatch-KL step and
whether it rose, as the cluster scenario asserts, and its weight updates (bytes, publish and load
times). One run takes 2-3 minutes on two cores. `--set KEY=VALUE` overrides the RL config (a
TOML value) to compare settings, e.g. `--set 'weights.type="nixl"'`; the cluster scenario takes
the same overrides from `RLKUBE_E2E_RL_SET`."""

import argparse
import subprocess
import sys
from pathlib import Path

import tomli_w
from rlkube.metrics import read_metrics
from rlkube.models.tiny import init_tiny_model

from e2e.scenarios.manifests import short_rl, short_sft
from e2e.scenarios.reverse_text import (
    MIN_TREND_T,
    RL_CONFIG,
    RL_STEPS,
    SFT_STEPS,
    Rise,
    overrides,
    weight_updates,
)

ENV_WORKERS = 2


def rlkube(command: str, config: dict, path: Path) -> None:
    """`rlkube <command> @ path` with `config` written there; its output goes to `path`.log."""
    path.write_text(tomli_w.dumps(config))
    with path.with_suffix(".log").open("w") as log:
        subprocess.run([str(Path(sys.executable).with_name("rlkube")), command, "@", str(path)], check=True,
                       stdout=log, stderr=subprocess.STDOUT)


def warm_up(out: Path) -> Path:
    """The scenario's SFT warm-up of a new tiny model, made once under `out`."""
    weights = out / "sft" / "weights" / "final"
    if not (weights / "config.json").exists():
        init_tiny_model(out / "model")
        _, run = short_sft(str(out / "model"), "unused", SFT_STEPS)
        rlkube("sft", run["spec"]["config"] | {"output_dir": str(out / "sft")}, out / "sft.toml")
    return weights


def rl_config(model: Path, output_dir: Path, seed: int, overrides: dict) -> dict:
    config = short_rl("scenario", str(model), "unused", RL_STEPS, **(RL_CONFIG | overrides))["spec"]["config"]
    config["orchestrator"]["env_workers"] = ENV_WORKERS
    return config | {"output_dir": str(output_dir), "seed": seed, "clean_output_dir": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("outputs/scenario-rl"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an RL config override, e.g. orchestrator.sampling.max_tokens=16")
    args = parser.parse_args()
    settings = overrides(args.set)
    model = warm_up(args.out)
    rose = 0
    for seed in range(args.first_seed, args.first_seed + args.runs):
        output_dir = args.out / f"rl-{seed}"
        rlkube("rl", rl_config(model, output_dir, seed, settings), args.out / f"rl-{seed}.toml")
        orchestrator, trainer = read_metrics(output_dir, "orchestrator"), read_metrics(output_dir, "trainer")
        rise = Rise.of(orchestrator, trainer)
        rose += rise.rose
        worst = max(rise.mismatch_kl, key=rise.mismatch_kl.get)
        print(f"seed {seed}: {rise.summary()}, lowest step reward {min(rise.rewards.values()):.3f}, worst "
              f"mismatch KL {rise.mismatch_kl[worst]:.3f} at step {worst}: {'rose' if rise.rose else 'DID NOT RISE'}; "
              f"{weight_updates(orchestrator, trainer)}", flush=True)
    print(f"{rose} of {args.runs} runs rose (trend t >= {MIN_TREND_T:g})")


if __name__ == "__main__":
    main()
