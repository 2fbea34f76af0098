"""Names, labels and in-cluster addresses of a run's children: one place, so builders, the
reconciler and the status reader agree.

An RLRun's children are `<run>-<component>`; an SFTRun's are `<run>-sft-<component>`, so an
RLRun and an SFTRun of the same name never share a child. Every child and every pod carries the
run's uid (`rlkube.dev/run-uid`): pods are matched by it, children by their controller
ownerReference, never by name alone (a run deleted and recreated under the same name must
not adopt what its predecessor left for the garbage collector).
"""

from dataclasses import dataclass

from rlkube.scopes import WEIGHTS_PEERS_ENV
from rlkube.withheld import CHECKPOINT_KEY_ENV, CREDENTIAL_ENVS, TOKEN_ENV

from rlkube_operator import API_VERSION

CONFIG_MOUNT = "/etc/rlkube"
TORCHRUN_PORT = 29500
SFT_STATUS_PORT = 8080  # the SFT trainer's GET /status on pod 0 (the RLRun's is the orchestrator's)
TRAINER_METRICS_PORT = 8090  # the RL trainer's /metrics on pod 0 unless trainer.metrics.prometheus_port says
COMPONENTS = ("inference", "orchestrator", "trainer")
CHILD_PREFIX = {"RLRun": "", "SFTRun": "sft-", "RLPool": ""}
RUN_UID_LABEL = "rlkube.dev/run-uid"
POOL_UID_LABEL = "rlkube.dev/pool-uid"
"""On a pool member's pods: the uid of the RLPool they attach to (its NetworkPolicies admit them)."""
RESERVED_PREFIX = "rlkube.dev/"
APP_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by",
              "app.kubernetes.io/component")
# What the operator sets in every pod: a user's pod settings may not override it.
RUN_CREDENTIAL_ENVS = (TOKEN_ENV, *CREDENTIAL_ENVS, WEIGHTS_PEERS_ENV, CHECKPOINT_KEY_ENV)
"""The run's token and credentials (`rlkube.withheld`), the weight servers inference sends its
credential to (`rlkube.scopes.WEIGHTS_PEERS_ENV`), and the trainer's checkpoint key (`rlkube.manifest`)."""
CHECKPOINT_KEY = "checkpoint"
"""The checkpoint key's key in `<run>-token`; only the trainer's pods and the export Job's get it."""
OPERATOR_ENV = ("PYTHONUNBUFFERED", "HOME", "AWS_ENDPOINT_URL", "NODE_RANK", "MASTER_ADDR", *RUN_CREDENTIAL_ENVS)
OPERATOR_VOLUMES = ("config", "data", "dshm", "tmp")
# Set by the Job controller on each pod of an Indexed Job (Kubernetes >= 1.28).
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
# Set by the Job controller on each of its pods (Kubernetes >= 1.27).
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
# A run's name becomes part of its children's names and of their pods' host names and labels
# (`<run>-sft-trainer-master`, `<run>-sft-trainer-<attempt>-<index>`, the StatefulSet's
# `controller-revision-hash: <run>-inference-<hash>`): a DNS-1035 label of at most 40 characters
# keeps all of them valid DNS labels of at most 63.
NAME_MAX_LENGTH = 40
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


@dataclass(frozen=True)
class RunRef:
    """Identity of one RLRun/SFTRun: what every child's name, labels and owner derive from."""

    kind: str
    name: str
    namespace: str
    uid: str

    @property
    def plural(self) -> str:
        """The run's resource: `rlruns`, `sftruns` or `rlpools`."""
        return f"{self.kind.lower()}s"

    def child(self, component: str) -> str:
        """`<run>-inference`, `<run>-orchestrator`, `<run>-config`, `<run>-data`,
        `<run>-trainer-master` (SFTRun: `<run>-sft-config`, …)."""
        return f"{self.name}-{CHILD_PREFIX[self.kind]}{component}"

    def labels(self, component: str | None = None) -> dict[str, str]:
        labels = {
            "app.kubernetes.io/name": "rlkube",
            "app.kubernetes.io/instance": self.name,
            "app.kubernetes.io/managed-by": "rlkube-operator",
            "rlkube.dev/run": self.name,
            "rlkube.dev/kind": self.kind,
            RUN_UID_LABEL: self.uid,
        }
        if component:
            labels["app.kubernetes.io/component"] = component
        return labels

    def selector(self, component: str) -> dict[str, str]:
        """The workloads' pod selector (immutable once created, so unchanged since v0.1)."""
        return {"rlkube.dev/run": self.name, "app.kubernetes.io/component": component}

    def service_selector(self, component: str) -> dict[str, str]:
        """A Service's selector: this run's pods only, never a recreated run's predecessor's."""
        return self.selector(component) | {RUN_UID_LABEL: self.uid}

    def pod_labels(self) -> dict[str, str]:
        """What every pod of this run (and of no other) carries."""
        return {RUN_UID_LABEL: self.uid}

    def owner_reference(self) -> dict:
        return {
            "apiVersion": API_VERSION,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def owns(self, obj: dict) -> bool:
        return controller_uid(obj) == self.uid

    def metadata(self, component: str, name: str | None = None) -> dict:
        return {
            "name": name or self.child(component),
            "namespace": self.namespace,
            "labels": self.labels(component),
            "ownerReferences": [self.owner_reference()],
        }

    # In-cluster DNS names (headless Services give each pod a stable name).
    def service_host(self, component: str) -> str:
        return f"{self.child(component)}.{self.namespace}.svc"

    def pod_host(self, component: str, index: int) -> str:
        """Pod `index` of the inference StatefulSet, by its headless Service."""
        return f"{self.child(component)}-{index}.{self.child(component)}.{self.namespace}.svc"

    def trainer_job(self, attempt: int) -> str:
        """Each trainer start (first, gang restart, resume) is a new Job: `<run>-trainer-<attempt>`."""
        return f"{self.child('trainer')}-{attempt}"

    @property
    def trainer_master_service(self) -> str:
        """`<run>-trainer-master`: pod 0 of whichever trainer Job is current. The torchrun
        master, the gRPC weight server and the NCCL rendezvous: an address that survives
        gang restarts, unlike the pod's own name."""
        return self.child("trainer-master")

    @property
    def trainer_master(self) -> str:
        return f"{self.trainer_master_service}.{self.namespace}.svc"


def operator_label(key: str) -> bool:
    """A label the operator sets on its pods and selects them by."""
    return key.startswith(RESERVED_PREFIX) or key in APP_LABELS


def controller_uid(obj: dict) -> str | None:
    """The uid of the object's controller (its ownerReference with `controller: true`)."""
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return next((r.get("uid") for r in refs if r.get("controller")), None)
