"""The hf engine's sleep and wake (spec.placement colocated): asleep it frees its KV slots and runs
no decode step, requests wait, and at wake the rows it parked go on to the same tokens."""
from __future__ import annotations

import asyncio
import time

import pytest

from grpojob.rollout.hf_engine import HFEngine
from grpojob.contracts.rollout import SamplingParams

from .harness import make_job


async def _engine(model_dir) -> HFEngine:
    engine = HFEngine(make_job(model_dir, rollout={"maxModelLen": 256}).spec, device="cpu", max_batch=8)
    await engine.start()
    return engine


def test_sleep_frees_the_slots_and_stops_decoding_until_wake(tiny_dir, tokenizer):
    async def main():
        engine = await _engine(tiny_dir)
        try:
            greedy = SamplingParams(temperature=0.0, max_tokens=40)
            ids = tokenizer.encode("one two three")
            (awake,) = await engine.generate(ids, 1, greedy)
            slept = await engine.sleep(1)
            assert engine.asleep and slept["freed_bytes"] > 0 and not engine._decoder.cache.kv
            pending = asyncio.ensure_future(engine.generate(ids, 1, greedy))
            await asyncio.sleep(0.3)  # a request that comes while asleep waits: no decode step runs
            assert not pending.done() and engine.decode_steps == slept["decode_steps"]
            woke = await engine.wake()
            (after,) = await asyncio.wait_for(pending, 30)
            assert not engine.asleep and woke["decode_steps"] == slept["decode_steps"]
            assert engine.decode_steps > woke["decode_steps"]
            assert after.completion_ids == awake.completion_ids  # the slots came back intact
            with pytest.raises(ValueError, match="level 1 only"):
                await engine.sleep(2)
        finally:
            await engine.close()

    asyncio.run(main())


def test_rows_in_flight_are_parked_and_finish_the_same_after_wake(tiny_dir, tokenizer):
    async def main():
        engine = await _engine(tiny_dir)
        try:
            greedy = SamplingParams(temperature=0.0, max_tokens=120)
            ids = tokenizer.encode("the end of")
            (straight,) = await engine.generate(ids, 1, greedy)
            running = asyncio.ensure_future(engine.generate(ids, 1, greedy))
            end = time.monotonic() + 30
            while not any(len(r.tokens) >= 3 for r in list(engine._decoder.rows)) and not running.done():
                assert time.monotonic() < end
                await asyncio.sleep(0.001)
            slept = await engine.sleep(1)
            assert slept["parked_rows"] == (0 if running.done() else 1)
            await engine.wake()
            (parked,) = await asyncio.wait_for(running, 30)
            # parked at the sleep (the usual case: 120 tokens outlast the sleep's round trip), its KV
            # freed, then rebuilt at wake: the same tokens as a run straight through
            assert parked.completion_ids == straight.completion_ids
        finally:
            await engine.close()

    asyncio.run(main())
