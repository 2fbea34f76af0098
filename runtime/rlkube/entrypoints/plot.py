"""`rlkube plot RUN_DIR [--out DIR]`: PNG curves of a run's reward, held-out eval, KL, entropy,
throughput and step time, from `<RUN_DIR>/metrics/*.jsonl` (see `rlkube.plot`).

    rlkube plot outputs/reverse_text/rl            # writes outputs/reverse_text/rl/plots/*.png
"""

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlkube plot", description="PNG curves of a run from its metrics files.")
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run's output_dir (holds metrics/)")
    parser.add_argument("--out", type=Path, metavar="DIR", help="where the PNGs go (default: RUN_DIR/plots)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    from rlkube.plot import MetricsError, plot_run

    try:
        paths, notes = plot_run(args.run_dir, args.out or args.run_dir / "plots")
    except MetricsError as e:
        print(f"rlkube plot: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        if e.name != "matplotlib":
            raise
        print("rlkube plot: needs matplotlib (pip install 'rlkube[plot]')", file=sys.stderr)
        return 2
    for note in notes:
        print(note)
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
