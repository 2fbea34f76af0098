#!/usr/bin/env bash
# Three reverse-text LoRA runs with different learning rates on one pool (README.md):
#   examples/reverse_text's SFT warm-up (made when missing) -> `rlkube pool` with one member per
#   lr_*.toml -> each member's held-out greedy reward at step 0 and at its last step.
# The pool lands under outputs/pool_reverse_text/ (OUT= to change it), each member in
# pool/members/<member>/; the warm-up is read from outputs/reverse_text/ (WARM_UP= to change it).
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=examples/pool_reverse_text
OUT=${OUT:-outputs/pool_reverse_text}
WARM_UP=${WARM_UP:-outputs/reverse_text}
source examples/common.sh

if [[ ! -e "$WARM_UP/sft/weights/final" ]]; then
  rlkube model init --out "$WARM_UP/model"
  rlkube sft @ examples/reverse_text/sft.toml --model.name "$WARM_UP/model" --output-dir "$WARM_UP/sft" --clean-output-dir
fi

runs=()
for lr in "$HERE"/lr_*.toml; do
  runs+=(--run @ "$HERE/member.toml" @ "$lr" --orchestrator.eval.num-examples "$EVAL_EXAMPLES")
done
rlkube pool @ "$HERE/pool.toml" --model.name "$WARM_UP/sft/weights/final" --output-dir "$OUT/pool" \
  --clean-output-dir "${runs[@]}"

echo
echo "held-out greedy reward (avg@1 over $EVAL_EXAMPLES examples), step 0 -> last step"
for member in "$OUT"/pool/members/*/; do
  echo "  $(basename "$member"): $(eval_rewards "$member/metrics/orchestrator.jsonl")"
done
