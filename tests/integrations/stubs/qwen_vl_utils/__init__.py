"""A stand-in for qwen-vl-utils, named as such: cosmos-rl imports it at package import (for its
vision packers), and the real one imports torchvision, whose PyPI build is CUDA's and does not load
beside the CPU torch of CI. Nothing the tests run calls these."""


def _absent(*args, **kwargs):
    raise RuntimeError("qwen_vl_utils stand-in: vision processing is not available in this test set")


process_vision_info = extract_vision_info = fetch_image = fetch_video = _absent
