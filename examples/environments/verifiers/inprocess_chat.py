"""A verifiers v1 harness of one's own (verifiers' public API only; no grpojob import): one chat turn
run in the environment's own process instead of a program per rollout. verifiers' Harness contract
allows it ("a harness may run its loop in-process instead of launching a program, as long as every
model call goes through `endpoint` + `secret`"): the call goes to verifiers' interception server,
which records it in the trace, so rewards read `trace.last_reply` as with the null harness. Named by
id: `--env-config '{"agent": {"harness": {"id": "inprocess_chat"}}}'`. Why: the null harness starts
a Python process per rollout whose imports (openai, mcp) cost seconds of CPU each."""
from openai import AsyncOpenAI

import verifiers.v1 as vf
from verifiers.v1.runtimes import ProgramResult

__all__ = ["InprocessChat"]


class InprocessChatConfig(vf.HarnessConfig):
    pass


class InprocessChat(vf.Harness[InprocessChatConfig]):
    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data) -> ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages = ([{"role": "system", "content": system}] if system else []) + (
            [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt or []))
        async with AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=2) as client:
            await client.chat.completions.create(model=ctx.model, messages=messages)
        return ProgramResult(exit_code=0, stdout="", stderr="")
