"""The rlkube Kubernetes operator: RLRun and SFTRun custom resources, reconciled with kopf.

Imports only `rlkube.config` from the runtime (no torch, no vLLM): the operator image is slim.
"""

GROUP = "rlkube.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
