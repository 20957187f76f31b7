"""Build a tiny Qwen2-style model with random weights and a BPE tokenizer trained on the in-repo
corpus, saved with save_pretrained. Nothing comes from a hub: tests, benchmarks and the local demo
load it from disk like any Hugging Face model (transformers and vLLM alike)."""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

log = logging.getLogger("grpojob.tiny")

CORPUS = Path(__file__).parent / "assets" / "corpus.txt"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML, plus tools the way Qwen2.5's template shows them (a system turn listing them) and Hermes
# tool calls (<tool_call>{"name": ..., "arguments": ...}</tool_call>, what grpojob.rollout.openai_tools
# parses). Without tools and tool calls it renders exactly plain ChatML.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "You can call these tools:\n<tools>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n"
    "To call one, reply <tool_call>{\"name\": NAME, \"arguments\": {...}}</tool_call>.<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if not (tools and loop.first and m['role'] == 'system') %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] if m['content'] is not none else '' }}"
    "{% for c in m.tool_calls or [] %}<tool_call>"
    "{{ {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}</tool_call>"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# `build(tools=True)`: tool-call markers as single (non-special) tokens, as Qwen2.5's vocabulary has
# them, so a tiny random model can learn to open a tool call in a few dozen steps.
TOOL_TOKENS = ["<tool_call>", "</tool_call>"]

# Sizes: "tiny" is for tests and the local demo, "small" (about 6.8M parameters) for benchmarks.
SIZES = {
    "tiny": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=512),
    "small": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=8, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=2048),
}


def build_tokenizer(vocab_size: int, tools: bool = False):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 0, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(CORPUS)], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>", bos_token=None,
                                   additional_special_tokens=SPECIALS[1:])
    fast.chat_template = CHAT_TEMPLATE
    if tools:
        fast.add_tokens(TOOL_TOKENS)  # added, not special: decoded text keeps them
    return fast


# A pretrained model's logits span tens; a random one's (weights of std 0.02) about +-1.3, and
# since the final norm fixes the hidden state's scale, only the output layer (or that norm) can
# widen them. Full fine-tuning trains the output layer; LoRA leaves it frozen (PEFT's all-linear
# skips it, and an adapter there is refused), so on a random model an adapter cannot make any
# token likely. OUTPUT_SCALE x the output layer gives the tiny model a pretrained one's range:
# `grpojob tiny --output-scale`, annotation grpojob.io/build-tiny-model: "lora" (docs/lora.md).
LORA_OUTPUT_SCALE = 10.0


def build(output: str | Path, size: str = "tiny", tie_embeddings: bool = False, seed: int = 0,
          tools: bool = False, output_scale: float = 1.0) -> Path:
    """Write a model directory at `output` (returns it). Deterministic for a given seed. `tools`:
    with the tool-call tokens (TOOL_TOKENS); `output_scale`: the output layer's weights times this
    (untied embeddings only: scaling a tied one would scale the input too)."""
    if output_scale != 1.0 and tie_embeddings:
        raise ValueError("output_scale needs untied embeddings (a tied output layer is the input's too)")
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    output = Path(output)
    dims = dict(SIZES[size])
    tokenizer = build_tokenizer(dims.pop("vocab_size"), tools=tools)
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer), max_position_embeddings=1024, tie_word_embeddings=tie_embeddings,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, torch_dtype="float32", **dims)
    model = Qwen2ForCausalLM(config)
    if output_scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(output_scale)
    output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output, safe_serialization=True)
    tokenizer.save_pretrained(output)
    (output / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}))
    return output


def ensure(path: str | Path, **kw) -> bool:
    """Build the model at `path` unless one is there; True when it was built."""
    path = Path(path)
    if (path / "config.json").exists():
        return False
    build(path, **kw)
    return True


def cli(args: argparse.Namespace) -> int:
    out = build(args.output, tie_embeddings=args.tie_embeddings, tools=args.tools, output_scale=args.output_scale)
    print(f"tiny model written to {out}")
    return 0
