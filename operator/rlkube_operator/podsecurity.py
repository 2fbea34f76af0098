"""The security context of every pod of the run: the `restricted` Pod Security Standard by default,
as the rlkube runtime images run (`IMAGE_UID`)."""

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from rlkube_operator.schema import K8sModel, cel


class SeccompProfile(K8sModel):
    type: Literal["RuntimeDefault", "Unconfined"] = "RuntimeDefault"
    """`RuntimeDefault`: the container runtime's default profile (the restricted Pod Security
    Standard requires it)."""


IMAGE_UID = 1000
"""The user (and group) the rlkube runtime images run as (images/runtime-*.Dockerfile)."""


class PodSecurityContext(K8sModel):
    """The security context of every pod of the run (Kubernetes' PodSecurityContext, in part).
    The defaults meet the `restricted` Pod Security Standard and match the rlkube runtime
    images (uid and gid 1000). Whatever is set here, every container also runs with
    `allowPrivilegeEscalation: false`, every capability dropped, a read-only root filesystem
    (writable: `/tmp`, the run's volume, `/dev/shm`) and no service-account token. The guardrails
    (`guardrails.py`: the operator's, and the chart's admission policy) refuse root
    (`runAsUser: 0`, `runAsNonRoot: false`) and `Unconfined` unless the cluster admin allows
    them."""

    model_config = ConfigDict(json_schema_extra=cel((
        "!has(self.runAsNonRoot) || !self.runAsNonRoot || !has(self.runAsUser) || self.runAsUser != 0",
        "securityContext.runAsUser 0 is root, and runAsNonRoot is true: no container could start",
    )))

    run_as_non_root: bool = True
    """Refuse to start a container whose user is root."""

    run_as_user: int = Field(default=IMAGE_UID, ge=0)
    """User id of the processes."""

    run_as_group: int = Field(default=IMAGE_UID, ge=0)
    """Primary group id of the processes."""

    fs_group: int | None = Field(default=IMAGE_UID, ge=0)
    """Group that owns the pods' volumes (Kubernetes makes them group-writable for it), so the
    pods can write checkpoints on storage classes that create root-owned volumes."""

    seccomp_profile: SeccompProfile = SeccompProfile()
    """Seccomp profile of every container."""

    @model_validator(mode="after")
    def _startable(self):
        """The kubelet refuses to start such a container (CreateContainerConfigError): say so now."""
        if self.run_as_non_root and self.run_as_user == 0:
            raise ValueError("runAsUser 0 is root, and runAsNonRoot is true: no container could start; "
                             "set runAsNonRoot to false (if the cluster admin allows root) or a non-zero runAsUser")
        return self

