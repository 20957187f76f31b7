"""A multi-turn agent with a calculator tool, trained from its sessions (docs/agents.md).

    grpojob run examples/environments/calculator.yaml   # starts it next to the trainer

It is an ordinary OpenAI client: it never sees a token. Every episode is one session (the
`X-Session-Id` header) of two turns on /v1/chat/completions with `tools=[calculator]`:

    user: what is a + b ?
    assistant: ...                       turn 1: a tool call (Hermes <tool_call>...</tool_call>) or text
    tool: <the calculator's result>      if the call parsed; else a user message asking it to use the tool
    assistant: ...                       turn 2: the answer

The rollout server records each turn's tokens, log-probs and policy versions on the trainer; the
agent posts the episode's reward to /v1/sessions/{id}/reward, and each group of groupSize episodes
of one problem (`X-Session-Group`) is trained on, the tool result and user turns masked out.
The reward is the sum of three parts: `call` (turn 1 opened a tool call: `<tool_call>`), `parsed`
(it was a valid call of the calculator) and `correct` (the answer's first integer is a + b).

It reads what the job gives every environment process (grpojob.plan): OPENAI_BASE_URL and
GRPOJOB_OPENAI_BASE_URLS (the rollout servers, /v1), GRPOJOB_TRAJECTORY_URL (the trainer's status:
group size, queue room), GRPOJOB_ENVIRONMENT (its name), GRPOJOB_TOKEN_FILE (the job's token: the
API key); and CALCULATOR_MAX_OPERAND (default 9), CALCULATOR_BATCH (groups run at once, default 4),
SEED. It needs only `openai` and `httpx`.
"""
from __future__ import annotations

import ast
import json
import operator
import os
import random
import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
from openai import OpenAI

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression such as 3 + 4.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.USub: operator.neg}
_WORD = re.compile(r"-?\d+|[^\W\d_]+|[^\s\w]")


def log(event: str, **fields: Any) -> None:
    print(json.dumps({"time": round(time.time(), 3), "event": event, **fields}), flush=True)


def calculate(expression: str) -> str:
    """The tool: + - * / and parentheses over numbers, nothing else."""
    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError("only numbers and + - * / ( )")
    try:
        result = value(ast.parse(str(expression), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        return f"error: {e}"
    return str(int(result)) if float(result).is_integer() else str(result)


def score(opened: bool, parsed: bool, answer: str, result: int) -> dict[str, float]:
    numbers = [w for w in _WORD.findall(answer) if w.lstrip("-").isdecimal()]
    return {"call": float(opened), "parsed": float(parsed),
            "correct": 1.0 if numbers and int(numbers[0]) == result else 0.0}


class Calculator:
    def __init__(self, name: str, urls: list[str], status_url: str, token: str, max_operand: int, seed: int):
        self.name, self.urls, self.status_url = name, urls, status_url.rstrip("/") + "/status"
        self.clients = [OpenAI(base_url=u, api_key=token, max_retries=5) for u in urls]
        self.http = httpx.Client(timeout=120, headers={"Authorization": f"Bearer {token}"})
        self.rng, self.max_operand, self.calls = random.Random(seed), max_operand, 0

    def episode(self, a: int, b: int, group: str) -> dict[str, float]:
        """One session: two turns, then its reward to the rollout server (which passes it on)."""
        k = self.calls = self.calls + 1
        client, base = self.clients[k % len(self.clients)], self.urls[k % len(self.urls)]
        sid = f"{self.name}-{uuid.uuid4().hex}"
        headers = {"X-Session-Id": sid, "X-Session-Group": group, "X-Session-Environment": self.name}
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"what is {a} + {b} ?"}]
        first = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                               extra_headers=headers).choices[0].message
        opened = bool(first.tool_calls) or "<tool_call>" in (first.content or "")
        messages.append(first.model_dump(exclude_none=True))  # the reply as it came
        parsed = False
        for call in first.tool_calls or ():
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (ValueError, AttributeError):
                expression = ""
            parsed = parsed or call.function.name == "calculator"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(expression)})
        if not first.tool_calls:
            messages.append({"role": "user", "content": "use the calculator , then answer with the number"})
        answer = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                                extra_headers=headers).choices[0].message.content or ""
        parts = score(opened, parsed, answer, a + b)
        r = self.http.post(f"{base}/sessions/{sid}/reward", json={"reward": sum(parts.values()), "reward_parts": parts})
        if r.status_code != 200:
            log("reward refused", status=r.status_code, body=r.text[:300])
        return parts

    def room(self) -> tuple[int, int]:
        """(groups the trainer's queue takes now, groupSize); 0 while it is full or not started."""
        r = self.http.get(self.status_url)
        st = r.json() if r.status_code == 200 else {}  # 503: the trainer is still loading
        return (st["queue_limit"] - st["queued"] if st.get("started") else 0), st.get("group_size", 0)

    def run(self, batch: int) -> None:
        with ThreadPoolExecutor(max_workers=128) as pool:
            while True:  # until stopped (SIGTERM): the trainer or rollout servers may restart meanwhile
                try:
                    room, size = self.room()
                    if room <= 0:
                        time.sleep(0.2)
                        continue
                    jobs = []
                    for _ in range(min(batch, room)):
                        a, b = self.rng.randint(0, self.max_operand), self.rng.randint(0, self.max_operand)
                        group = f"{a}-{b}-{uuid.uuid4().hex[:8]}"
                        jobs += [pool.submit(self.episode, a, b, group) for _ in range(size)]
                    parts = [j.result() for j in jobs]
                    log("episodes", sessions=len(parts),
                        **{k: round(sum(p[k] for p in parts) / len(parts), 3) for k in parts[0]})
                except (httpx.TransportError, openai.APIConnectionError) as e:
                    log("unreachable, retrying", error=str(e))
                    time.sleep(1)


def main() -> None:
    env = os.environ
    urls = (env.get("GRPOJOB_OPENAI_BASE_URLS") or env["OPENAI_BASE_URL"]).split(",")
    token = open(env["GRPOJOB_TOKEN_FILE"]).read().strip()
    Calculator(env.get("GRPOJOB_ENVIRONMENT", "calculator"), urls, env["GRPOJOB_TRAJECTORY_URL"],
               env.get("OPENAI_API_KEY") or token, int(env.get("CALCULATOR_MAX_OPERAND", "9")),
               int(env.get("SEED", "0"))).run(int(env.get("CALCULATOR_BATCH", "4")))


if __name__ == "__main__":
    main()
