"""grpojob's Kubernetes operator (kopf): GRPOJob -> ConfigMap, Services, trainer StatefulSet,
rollout Deployment; status, lifecycle and metrics. Imports kopf and the kubernetes client lazily
through its modules; `names` and `children` need neither."""
from .names import DEFAULT_IMAGE, IMAGE_ENV

__all__ = ["DEFAULT_IMAGE", "IMAGE_ENV"]
