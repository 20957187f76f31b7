"""What a GRPOJob says about its pods: image, resources, scheduling, environment, volumes and
security. The Kubernetes sub-objects are the real core/v1 types (grpojob.api.k8s), so the CRD, the
CLI and the operator all refuse a bad one with its field path."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import ValidationInfo, model_validator

from grpojob.api.base import Model, deferring, field, invalid_all
from grpojob.api.k8s import K8s
from grpojob.api.names import Annotations, Labels, ObjectName, annotations_field, labels_field

# Volume names the operator gives its own pod volumes (config, run dir, caches, /tmp...).
RESERVED_VOLUME_PREFIX = "grpojob-"
# A role's tolerations carry CEL rules (tools/vendor_k8s_schemas.py): the API server costs a rule
# under an unbounded list as if the list filled a request (docs/real-cluster-rules.md).
MAX_TOLERATIONS = 32

Toleration = Annotated[dict[str, Any], K8s("Toleration")]
Resources = Annotated[dict[str, Any], K8s("ResourceRequirements")]
Affinity = Annotated[dict[str, Any], K8s("Affinity")]
EnvVar = Annotated[dict[str, Any], K8s("EnvVar")]
Volume = Annotated[dict[str, Any], K8s("Volume")]
VolumeMount = Annotated[dict[str, Any], K8s("VolumeMount")]
PodSecurityContext = Annotated[dict[str, Any], K8s("PodSecurityContext")]
SecurityContext = Annotated[dict[str, Any], K8s("SecurityContext")]


class WorkloadSpec(Model):
    image: Optional[str] = field(None, description="Container image; defaults to the operator's runtime image.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = field(
        "IfNotPresent", description="Kubernetes image pull policy.")
    resources: Resources = field(default_factory=dict, description="Per-pod resources (a Kubernetes "
                                 "ResourceRequirements, e.g. limits: {nvidia.com/gpu: 8}).")
    env: list[EnvVar] = field(default_factory=list, description="Extra environment variables (Kubernetes "
                              "EnvVar: value or valueFrom); one named like a grpojob variable replaces it.")
    node_selector: Labels = field(**labels_field("Kubernetes node selector (label keys and values)."))
    tolerations: list[Toleration] = field(default_factory=list, max_length=MAX_TOLERATIONS,
                                          description=f"Kubernetes tolerations. At most {MAX_TOLERATIONS}.")
    affinity: Optional[Affinity] = field(None, description="Kubernetes affinity.")
    priority_class_name: Optional[ObjectName] = field(None, description="Kubernetes priority class.")
    service_account_name: Optional[ObjectName] = field(None, description="Service account of the pods.")
    labels: Labels = field(**labels_field("Extra pod labels."))
    annotations: Annotations = field(**annotations_field("Extra pod annotations."))
    volumes: list[Volume] = field(default_factory=list, description="Extra pod volumes (Kubernetes Volume; "
                                  f"names starting with {RESERVED_VOLUME_PREFIX} are the operator's).")
    volume_mounts: list[VolumeMount] = field(
        default_factory=list, description="Mounts of `volumes` into the container. A mount at a path the "
        "operator mounts an emptyDir at ($HOME, /tmp, the run or checkpoint directory) replaces that emptyDir, "
        "e.g. a PersistentVolumeClaim at /home/grpojob/.cache keeps the Hugging Face cache across restarts.")
    pod_security_context: Optional[PodSecurityContext] = field(
        None, description="Pod security context, merged key by key over the default (runAsNonRoot, uid "
        "10001, fsGroup 10001, seccompProfile RuntimeDefault: PodSecurity restricted).")
    security_context: Optional[SecurityContext] = field(
        None, description="Container security context, merged key by key over the default "
        "(allowPrivilegeEscalation false, capabilities drop ALL, readOnlyRootFilesystem true).")

    @model_validator(mode="after")
    def _volumes(self, info: ValidationInfo) -> "WorkloadSpec":
        """Volume names unique and not the operator's, mounts of existing volumes at distinct paths
        (validation.go validateVolumes, validateVolumeMounts): every problem at once."""
        if deferring(info):
            return self
        problems = []
        names = [v.get("name", "") for v in self.volumes]
        for i, name in enumerate(names):
            if name.startswith(RESERVED_VOLUME_PREFIX):
                problems.append((f"volumes[{i}].name", f"'{name}': names starting with {RESERVED_VOLUME_PREFIX} "
                                 "are reserved for the operator's volumes"))
            if name in names[:i]:
                problems.append((f"volumes[{i}].name", f"'{name}' is used twice"))
        paths: list[str] = []
        for i, m in enumerate(self.volume_mounts):
            if m.get("name") not in names:
                problems.append((f"volumeMounts[{i}].name", f"'{m.get('name')}' names no entry of volumes"))
            if m.get("mountPath") in paths:
                problems.append((f"volumeMounts[{i}].mountPath", f"'{m.get('mountPath')}' is mounted twice"))
            paths.append(m.get("mountPath"))
        if problems:
            raise invalid_all(problems)
        return self
