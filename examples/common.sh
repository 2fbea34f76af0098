# What the examples' run.sh scripts share (sourced, from the repository root).

EVAL_EXAMPLES=${EVAL_EXAMPLES:-200}
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}

newest_step_dir() { ls -d "$1"/step_* | sort -t_ -k2 -n | tail -1; }

avg_reward() {  # the avg@k of an `rlkube eval` results file
  python3 -c 'import json,sys; print("%.3f" % json.load(open(sys.argv[1]))["results"][0]["avg_at_k"])' "$1"
}

report() {  # report OUT SFT_DIR RL_DIR: the held-out rewards before and after RL
  echo
  echo "held-out greedy reward (avg@1 over $EVAL_EXAMPLES examples)"
  echo "  after SFT: $(avg_reward "$1/eval/before/eval_results.json")   ($2)"
  echo "  after RL:  $(avg_reward "$1/eval/after/eval_results.json")   ($3)"
  echo "training reward per step: $1/rl/metrics/orchestrator.jsonl (reward/all/mean)"
}

eval_rewards() {  # the orchestrator's held-out eval reward at its first and last eval, from its metrics file
  python3 -c 'import json,sys; r=[x["eval/reward"] for x in map(json.loads, open(sys.argv[1])) if "eval/reward" in x]; print("%.3f -> %.3f" % (r[0], r[-1]))' "$1"
}
