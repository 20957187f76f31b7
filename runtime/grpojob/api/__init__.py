"""The GRPOJob API: spec and status models, validation, CRD generation. Imports no torch."""
from .spec import API_VERSION, GROUP, KIND, PLURAL, VERSION, GRPOJob, GRPOJobSpec
from .status import GRPOJobStatus, TrainerStatus
from .validate import FieldError, InvalidSpec, check, load_file, parse, set_path

__all__ = ["API_VERSION", "GROUP", "KIND", "PLURAL", "VERSION", "GRPOJob", "GRPOJobSpec",
           "GRPOJobStatus", "TrainerStatus", "FieldError", "InvalidSpec", "check", "load_file",
           "parse", "set_path"]
