#!/usr/bin/env bash
# The reverse-text example end to end (what `make reverse-text` runs):
#   tiny model -> SFT warm-up -> held-out eval -> RL -> held-out eval, then before/after.
# Everything lands under outputs/reverse_text/ (OUT= to change it). Needs `rlkube` on PATH.
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-outputs/reverse_text}
source examples/common.sh

rlkube model init --out "$OUT/model"
rlkube sft @ examples/reverse_text/sft.toml --model.name "$OUT/model" --output-dir "$OUT/sft" --clean-output-dir
SFT="$(newest_step_dir "$OUT/sft/weights")"

rlkube eval --model.name "$SFT" --num-examples "$EVAL_EXAMPLES" --output-dir "$OUT/eval/before"

rlkube rl @ examples/reverse_text/rl.toml --model.name "$SFT" --output-dir "$OUT/rl" --clean-output-dir
RL="$(newest_step_dir "$OUT/rl/weights")"

rlkube eval --model.name "$RL" --num-examples "$EVAL_EXAMPLES" --output-dir "$OUT/eval/after"

report "$OUT" "$SFT" "$RL"
