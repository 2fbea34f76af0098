#!/usr/bin/env bash
# The reverse-text example end to end (what `make reverse-text` runs):
#   tiny model -> SFT warm-up -> held-out eval -> RL -> held-out eval, then before/after.
# Everything lands under outputs/reverse_text/ (OUT= to change it). Needs `rlkube` on PATH.
# MOE=1: the same with the tiny Qwen3-MoE (`model init --moe`, sft_moe.toml and rl_moe.toml
# over the dense configs), under outputs/reverse_text_moe/.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [[ "${MOE:-0}" == 1 ]]; then
  OUT=${OUT:-outputs/reverse_text_moe}
  INIT=(--moe) SFT_MOE=(@ examples/reverse_text/sft_moe.toml) RL_MOE=(@ examples/reverse_text/rl_moe.toml)
else
  OUT=${OUT:-outputs/reverse_text}
  INIT=() SFT_MOE=() RL_MOE=()
fi
source examples/common.sh

rlkube model init "${INIT[@]}" --out "$OUT/model"
rlkube sft @ examples/reverse_text/sft.toml "${SFT_MOE[@]}" --model.name "$OUT/model" --output-dir "$OUT/sft" --clean-output-dir
SFT="$(newest_step_dir "$OUT/sft/weights")"

rlkube eval --model.name "$SFT" --num-examples "$EVAL_EXAMPLES" --output-dir "$OUT/eval/before"

rlkube rl @ examples/reverse_text/rl.toml "${RL_MOE[@]}" --model.name "$SFT" --output-dir "$OUT/rl" --clean-output-dir
RL="$(newest_step_dir "$OUT/rl/weights")"

rlkube eval --model.name "$RL" --num-examples "$EVAL_EXAMPLES" --output-dir "$OUT/eval/after"

report "$OUT" "$SFT" "$RL"
