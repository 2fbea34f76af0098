"""Where a run's files live: a PersistentVolumeClaim, an object store, or neither.

Every pod of the run mounts the claim, so a claim the operator creates must reach them all: the
CRD's rules (`PVC_NODES_RULE`, `one_pod_claim_rule`) and `check_claim_reaches` refuse one that
cannot, at admission and in the operator.
"""

from typing import Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from rlkube_operator.credentials import URL_CREDENTIALS_RE, url_credentials
from rlkube_operator.schema import K8sModel, cel


class PVCStorage(K8sModel):
    """A PersistentVolumeClaim holding the output directory (checkpoints, weights, logs)."""

    claim_name: str | None = Field(default=None, max_length=253)
    """Use this existing claim (it outlives the run). Unset: the operator creates `<run>-data`,
    owned by the run."""

    size: str = Field(default="20Gi", pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")
    """Size of the claim the operator creates."""

    storage_class_name: str | None = None
    """Storage class of the claim the operator creates; the cluster default when unset."""

    access_modes: list[Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"]] = Field(
        default=["ReadWriteOnce"], min_length=1
    )
    """Access modes of the claim the operator creates. Every pod of the run mounts it, so pods
    on several nodes share it only with ReadWriteMany: a trainer of more than one node needs
    it. With ReadWriteOnce every pod must land on one node (a pod elsewhere waits with a
    Multi-Attach error, shown in its component's condition)."""

    mount_path: str = Field(default="/data", pattern=r"^/")
    """Where pods mount the claim; the run's output directory is `<mountPath>/<run name>`."""


class ObjectStoreStorage(K8sModel):
    """An object store (an fsspec URL such as `s3://bucket/prefix`) for weight snapshots and
    checkpoints."""

    model_config = ConfigDict(json_schema_extra=cel(*(
        (f"!has(self.{field}) || !self.{field}.matches('{URL_CREDENTIALS_RE}')",
         (f"storage.objectStore.{field} must not hold credentials (user info before '@', or a key,"
          " secret, token, password or signature query parameter): put them in the Secret named by secretName"))
        for field in ("url", "endpointUrl")
    )))

    url: str = Field(pattern=r"^[a-z][a-z0-9+.-]*://.+")
    """Base URL; weights go to `<url>/<namespace>/<run>/weights`, checkpoints to
    `<url>/<namespace>/<run>/checkpoints` (unless `config.weights.url` / `config.ckpt.url` are set).
    No credentials in it (`s3://KEY:SECRET@bucket` is refused): they go in `secretName`."""

    secret_name: str | None = None
    """A Secret whose keys become environment variables of the pods that write the store (for
    example `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`): the trainer and the orchestrator, and
    the inference servers when weights go through the store (`readOnlySecretName` for them
    instead, if set). Env workers, the teacher and the judge never get it. The operator never reads it."""

    read_only_secret_name: str | None = None
    """A Secret with read-only credentials for the inference servers, which only download
    weight snapshots; unset, they get `secretName`'s."""

    endpoint_url: str | None = None
    """S3-compatible endpoint (MinIO, Ceph), passed as `AWS_ENDPOINT_URL`; no credentials in it."""

    @model_validator(mode="after")
    def _no_credentials_in_urls(self):
        """Checked on the whole section, so that the error does not echo the URL's secret."""
        for field in ("url", "endpoint_url"):
            if (url := getattr(self, field)) is not None and (found := url_credentials(url)):
                raise ValueError(f"{to_camel(field)} holds a credential ({found}); put credentials in "
                                 "the Secret named by secretName, never in a URL")
        return self


class StorageSpec(K8sModel):
    """Where the run's files live. Without a PVC, output goes to an emptyDir and is lost with
    the pod: restarts then start from scratch."""

    pvc: PVCStorage | None = None
    """Output directory (checkpoints, weights, logs) on a PersistentVolumeClaim."""

    object_store: ObjectStoreStorage | None = None
    """Weight snapshots and checkpoints in an object store, so the pods need no shared filesystem."""


PVC_NODES_RULE = (
    (
        "!has(self.storage.pvc) || has(self.storage.pvc.claimName) || self.trainer.nodes <= 1"
        " || 'ReadWriteMany' in self.storage.pvc.accessModes"
    ),
    (
        "storage.pvc.accessModes must include ReadWriteMany when trainer.nodes > 1: every trainer"
        " pod mounts the claim from its own node"
    ),
)


def one_pod_claim_rule(unless: str = "") -> tuple[str, str]:
    """ReadWriteOncePod refused for a claim the operator creates, `unless` the run has one pod."""
    rule = ("!has(self.storage.pvc) || has(self.storage.pvc.claimName)"
            f" || self.storage.pvc.accessModes != ['ReadWriteOncePod']{unless}")
    message = ("storage.pvc.accessModes ['ReadWriteOncePod'] lets one pod use the claim, and every pod"
               " of the run mounts it: use ReadWriteOnce or ReadWriteMany")
    return rule, message


def check_claim_reaches(pvc: PVCStorage | None, trainer_nodes: int, pods: int) -> None:
    """`PVC_NODES_RULE` and `one_pod_claim_rule` in Python: ValueError for a claim the operator
    would create that some of the run's `pods` could not mount."""
    if pvc is not None and not pvc.claim_name and "ReadWriteMany" not in pvc.access_modes:
        if trainer_nodes > 1:
            raise ValueError(
                f"storage.pvc.accessModes {pvc.access_modes}: trainer.nodes is {trainer_nodes}, "
                "and every trainer pod mounts the claim, from its own node: that needs ReadWriteMany "
                "(ReadWriteOnce attaches to one node only)"
            )
        if pvc.access_modes == ["ReadWriteOncePod"] and pods > 1:
            raise ValueError(
                f"storage.pvc.accessModes ['ReadWriteOncePod'] lets one pod use the claim, and all "
                f"{pods} pods of the run mount it: use ReadWriteOnce or ReadWriteMany"
            )
