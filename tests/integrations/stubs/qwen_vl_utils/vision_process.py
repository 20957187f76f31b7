"""The stand-in's submodule (cosmos-rl imports it by name; see __init__)."""
from qwen_vl_utils import _absent  # noqa: F401
