"""Names, labels and in-cluster addresses of a run's children: one place, so builders, the
reconciler and the status reader agree."""

from dataclasses import dataclass

from rlkube_operator import API_VERSION

CONFIG_MOUNT = "/etc/rlkube"
TORCHRUN_PORT = 29500
SFT_STATUS_PORT = 8080  # the SFT trainer's GET /status on pod 0 (the RLRun's is the orchestrator's)
COMPONENTS = ("inference", "orchestrator", "trainer")


@dataclass(frozen=True)
class RunRef:
    """Identity of one RLRun/SFTRun: what every child's name, labels and owner derive from."""

    kind: str
    name: str
    namespace: str
    uid: str

    def child(self, component: str) -> str:
        """`<run>-inference`, `<run>-orchestrator`, `<run>-trainer`, `<run>-config`, `<run>-data`."""
        return f"{self.name}-{component}"

    def labels(self, component: str | None = None) -> dict[str, str]:
        labels = {
            "app.kubernetes.io/name": "rlkube",
            "app.kubernetes.io/instance": self.name,
            "app.kubernetes.io/managed-by": "rlkube-operator",
            "rlkube.dev/run": self.name,
            "rlkube.dev/kind": self.kind,
        }
        if component:
            labels["app.kubernetes.io/component"] = component
        return labels

    def selector(self, component: str) -> dict[str, str]:
        """The stable subset of labels used in selectors (immutable once created)."""
        return {"rlkube.dev/run": self.name, "app.kubernetes.io/component": component}

    def owner_reference(self) -> dict:
        return {
            "apiVersion": API_VERSION,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

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

    def trainer_pod0(self, attempt: int) -> str:
        """Pod 0 of the attempt's indexed Job (its hostname is `<job>-0`) under the trainer's
        headless Service, without the namespace: what the status URL template's {service} takes."""
        return f"{self.trainer_job(attempt)}-0.{self.child('trainer')}"

    def trainer_master(self, attempt: int) -> str:
        """Pod 0 of the attempt's indexed Job, the torchrun master."""
        return f"{self.trainer_pod0(attempt)}.{self.namespace}.svc"
