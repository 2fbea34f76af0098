"""rlkube: asynchronous RL post-training for LLMs, on one machine or as a Kubernetes operator."""
