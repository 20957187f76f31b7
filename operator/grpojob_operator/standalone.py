"""For `kopf run -m grpojob_operator.standalone [-A | -n NS]`: registers the handlers with kopf's
default registry, configured from the environment (GRPOJOB_OPERATOR_INTERVAL, GRPOJOB_TRAINER_URL,
GRPOJOB_RUNTIME_IMAGE, GRPOJOB_METRICS_PORT)."""
from __future__ import annotations

import os

import kopf

from .config import OperatorConfig
from .controller import Controller
from .handlers import register

_port = os.environ.get("GRPOJOB_METRICS_PORT", "8080")
controller = Controller(OperatorConfig.from_env(metrics_port=int(_port) if _port else None))
register(kopf.get_default_registry(), controller)
