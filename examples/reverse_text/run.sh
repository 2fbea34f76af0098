#!/usr/bin/env bash
# The reverse-text example end to end (what `make reverse-text` runs):
#   tiny model -> SFT warm-up -> held-out eval -> RL -> held-out eval, then before/after.
# Everything lands under outputs/reverse_text/ (OUT= to change it). Needs `rlkube` on PATH.
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-outputs/reverse_text}
EVAL_EXAMPLES=${EVAL_EXAMPLES:-200}
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}

newest_step_dir() { ls -d "$1"/step_* | sort -t_ -k2 -n | tail -1; }

avg_reward() {  # the avg@k of an `rlkube eval` results file
  python3 -c 'import json,sys; print("%.3f" % json.load(open(sys.argv[1]))["results"][0]["avg_at_k"])' "$1"
}

rlkube model init --out "$OUT/model"
rlkube sft @ examples/reverse_text/sft.toml --model.name "$OUT/model" --output-dir "$OUT/sft" --clean-output-dir
SFT="$(newest_step_dir "$OUT/sft/weights")"

rlkube eval --model.name "$SFT" --num-examples "$EVAL_EXAMPLES" --output-dir "$OUT/eval/before"

rlkube rl @ examples/reverse_text/rl.toml --model.name "$SFT" --output-dir "$OUT/rl" --clean-output-dir
RL="$(newest_step_dir "$OUT/rl/weights")"

rlkube eval --model.name "$RL" --num-examples "$EVAL_EXAMPLES" --output-dir "$OUT/eval/after"

echo
echo "held-out greedy reward (avg@1 over $EVAL_EXAMPLES examples)"
echo "  after SFT: $(avg_reward "$OUT/eval/before/eval_results.json")   ($SFT)"
echo "  after RL:  $(avg_reward "$OUT/eval/after/eval_results.json")   ($RL)"
echo "training reward per step: $OUT/rl/metrics/orchestrator.jsonl (reward/all/mean)"
