"""The GRPOJob API: spec and status models, validation, manifests, CRD generation. Imports no torch."""
from .manifest import load_file, load_manifest, set_path
from .spec import API_VERSION, GROUP, KIND, PLURAL, VERSION, GRPOJob, GRPOJobSpec
from .status import GRPOJobStatus, TrainerStatus
from .validate import FieldError, InvalidSpec, check, parse

__all__ = ["API_VERSION", "GROUP", "KIND", "PLURAL", "VERSION", "GRPOJob", "GRPOJobSpec",
           "GRPOJobStatus", "TrainerStatus", "FieldError", "InvalidSpec", "check", "load_file",
           "load_manifest", "parse", "set_path"]
