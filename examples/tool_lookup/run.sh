#!/usr/bin/env bash
# The tool-lookup example end to end:
#   tiny model -> SFT data -> SFT warm-up -> held-out eval -> RL -> held-out eval, then before/after.
# Everything lands under outputs/tool_lookup/ (OUT= to change it). Needs `rlkube` on PATH.
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-outputs/tool_lookup}
source examples/common.sh

rlkube model init --out "$OUT/model"
python -m rlkube.envs.tool_lookup --out "$OUT/sft.jsonl" --num-examples 20000
rlkube sft @ examples/tool_lookup/sft.toml --model.name "$OUT/model" --data.name "$OUT/sft.jsonl" \
  --output-dir "$OUT/sft" --clean-output-dir
SFT="$(newest_step_dir "$OUT/sft/weights")"

rlkube eval @ examples/tool_lookup/eval.toml --model.name "$SFT" --num-examples "$EVAL_EXAMPLES" --output-dir "$OUT/eval/before"

rlkube rl @ examples/tool_lookup/rl.toml --model.name "$SFT" --output-dir "$OUT/rl" --clean-output-dir
RL="$(newest_step_dir "$OUT/rl/weights")"

rlkube eval @ examples/tool_lookup/eval.toml --model.name "$RL" --num-examples "$EVAL_EXAMPLES" --output-dir "$OUT/eval/after"

report "$OUT" "$SFT" "$RL"
