"""The GRPOJob API: spec and status models, validation, manifests, CRD generation. Imports no torch."""
from grpojob.api.manifest import load_file, load_manifest, set_path
from grpojob.api.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION, GRPOJob, GRPOJobSpec
from grpojob.api.status import GRPOJobStatus, TrainerStatus
from grpojob.api.validate import FieldError, InvalidSpec, check, parse

__all__ = ["API_VERSION", "GROUP", "KIND", "PLURAL", "VERSION", "GRPOJob", "GRPOJobSpec",
           "GRPOJobStatus", "TrainerStatus", "FieldError", "InvalidSpec", "check", "load_file",
           "load_manifest", "parse", "set_path"]
