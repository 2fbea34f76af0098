#!/usr/bin/env bash
# The agentic-tail example end to end: the tool service in the background, then
#   tiny model -> SFT data -> SFT warm-up -> held-out eval -> RL -> held-out eval.
# Everything lands under outputs/agentic_tail/ (OUT= to change it). Needs `rlkube` on PATH.
# Tool latency: TOOL_P50_S (0.2) and TOOL_TAIL_RATIO (p99/p50, 20).
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-outputs/agentic_tail}
source examples/common.sh

rlkube tool-service --port 8790 --p50-s "${TOOL_P50_S:-0.2}" --tail-ratio "${TOOL_TAIL_RATIO:-20}" &
SERVICE=$!
trap 'kill $SERVICE' EXIT

rlkube model init --out "$OUT/model"
python -m rlkube.envs.tool_chain --out "$OUT/sft.jsonl" --num-examples 20000
rlkube sft @ examples/agentic_tail/sft.toml --model.name "$OUT/model" --data.name "$OUT/sft.jsonl" \
  --output-dir "$OUT/sft" --clean-output-dir
SFT="$(newest_step_dir "$OUT/sft/weights")"

rlkube eval @ examples/agentic_tail/eval.toml --model.name "$SFT" --num-examples "$EVAL_EXAMPLES" --output-dir "$OUT/eval/before"

rlkube rl @ examples/agentic_tail/rl.toml --model.name "$SFT" --output-dir "$OUT/rl" --clean-output-dir
RL="$(newest_step_dir "$OUT/rl/weights")"

rlkube eval @ examples/agentic_tail/eval.toml --model.name "$RL" --num-examples "$EVAL_EXAMPLES" --output-dir "$OUT/eval/after"

report "$OUT" "$SFT" "$RL"
