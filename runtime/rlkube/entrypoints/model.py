"""`rlkube model init --out DIR [--moe] [--layers N --hidden N ...]`: make a tiny Qwen3 model.

No download: the model is randomly initialized and the tokenizer is built locally
(see rlkube.models.tiny).
"""

import sys

from rlkube.config import parse_cli
from rlkube.config.shared import ModelInitConfig
from rlkube.entrypoints.checks import check_references

USAGE = (
    "usage: rlkube model init --out DIR [--moe --experts N --experts-per-token K]"
    " [--layers N --hidden N --heads N --kv-heads N ...]"
)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE + "\n\nsubcommands:\n  init  write an untrained tiny Qwen3 or Qwen3-MoE model (`init --help`)")
        return 0
    if argv[0] != "init":
        print(f"rlkube model: unknown subcommand '{argv[0]}'\n{USAGE}", file=sys.stderr)
        return 2
    config, dry_run = parse_cli(ModelInitConfig, "model init", argv[1:], check=check_references)
    if dry_run:
        from rlkube.config import to_toml

        print(to_toml(config))
        return 0
    from rlkube.models.tiny import init_tiny_model

    fields = config.model_dump(exclude={"out"})
    out = init_tiny_model(config.out, **fields)
    print(f"wrote a tiny {'Qwen3-MoE' if config.moe else 'Qwen3'} model to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
