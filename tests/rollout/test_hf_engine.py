"""The hf engine in process (tiny model, float32 CPU): continuous batching, per-request seeds, and
weight swaps between decode steps with and without partial rollouts."""
from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest
import torch

from grpojob.rollout import hf_generate, hf_requests
from grpojob.rollout.hf_engine import HFEngine
from grpojob.contracts.rollout import SamplingParams

from .harness import PROMPTS, greedy, load_model, make_job, perturb

pytestmark = pytest.mark.contract  # what we use of transformers: every CI dependency set runs it

LONG = 120  # tokens of a request that is still running when a swap is asked for


async def _engine(model_dir, partial=False, max_batch=16) -> HFEngine:
    engine = HFEngine(make_job(model_dir, algorithm={"groupSize": 4, "partialRollouts": partial, "maxStaleness": 1},
                               rollout={"maxModelLen": 256}).spec, device="cpu", max_batch=max_batch)
    await engine.start()
    return engine


def _greedy(max_tokens):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


@pytest.fixture(scope="module")
def models(tiny_dir):
    return load_model(tiny_dir), perturb(load_model(tiny_dir), seed=3)


@pytest.fixture(scope="module")
def long_prompt(models, tokenizer):
    """A prompt whose greedy continuation runs LONG tokens without EOS under both weight sets."""
    old, new = models
    for text in PROMPTS + ["a b c d", "zero one two", "the end of"]:
        ids = tokenizer.encode(text)
        if all(len(greedy(m, tokenizer, ids, LONG)[0]) == LONG for m in (old, new)):
            return ids
    pytest.skip("every candidate prompt hits EOS early with this tiny model")


async def _wait_running(engine, tokens: int = 3, timeout: float = 30) -> None:
    """Until a row in flight has generated `tokens` tokens."""
    end = time.monotonic() + timeout
    while not any(len(r.tokens) >= tokens for r in list(engine._decoder.rows)):
        assert time.monotonic() < end, "no request got going"
        await asyncio.sleep(0.001)


async def _load(engine, model, version):
    """engine.load from another thread (as the sync agent calls it); returns when it returned."""
    await asyncio.to_thread(engine.load, model.state_dict().items(), version, f"v{version}")
    return time.monotonic()


async def test_concurrent_requests_equal_transformers_greedy(tiny_dir, tokenizer, models, monkeypatch):
    monkeypatch.setattr(hf_generate, "PREFILL_TOKENS", 8)  # prompts prefilled in several packed chunks
    monkeypatch.setattr(hf_generate, "PREFILL_TOKENS_CPU", 8)
    engine = await _engine(tiny_dir, max_batch=3)  # fewer slots than rows: rows wait, join, leave
    try:
        prompts = [tokenizer.encode(p) for p in PROMPTS]
        lengths = [5, 17, 9, 12]
        outs = await asyncio.gather(*(engine.generate(p, 2, _greedy(n)) for p, n in zip(prompts, lengths)))
        for p, n, out in zip(prompts, lengths, outs):
            ref_ids, ref_lp = greedy(models[0], tokenizer, p, n)
            for c in out:
                assert c.completion_ids == ref_ids and c.versions is None and c.policy_version == 0
                assert c.logprobs == pytest.approx(ref_lp, abs=1e-5)
                assert c.text == tokenizer.decode(ref_ids, skip_special_tokens=True)
    finally:
        await engine.close()


async def test_an_engine_that_goes_idle_releases_its_cpu_threads(tiny_dir, tokenizer, monkeypatch):
    """Once its requests are done, the scheduler thread hands its OpenMP workers back before it
    waits (devices.release_cpu_threads): an idle team beside an in-process trainer's throttles it."""
    from grpojob import devices

    calls: list[tuple[str, int]] = []
    engine = await _engine(tiny_dir)
    release = devices.release_cpu_threads
    monkeypatch.setattr(devices, "release_cpu_threads",
                        lambda: (calls.append((threading.current_thread().name, engine.decode_steps)), release())[1])
    try:
        out = await engine.generate(tokenizer.encode(PROMPTS[0]), 2, _greedy(6))
        end = time.monotonic() + 10
        while not calls and time.monotonic() < end:  # the scheduler reaches its wait after the last step
            await asyncio.sleep(0.01)
        assert len(out) == 2 and engine.decode_steps > 0
        assert calls and calls[-1] == ("hf-scheduler", engine.decode_steps)  # after the last decode step
    finally:
        await engine.close()


async def test_requests_arriving_together_at_an_idle_engine_share_one_prefill(tiny_dir, tokenizer, monkeypatch):
    """A trainer's step sends its prompts one by one: an idle engine gathers those that come a few
    milliseconds apart into one admission (one prefill, rows decoding in step) instead of starting
    on the first alone."""
    monkeypatch.setattr(hf_requests, "GATHER_QUIET", 0.2)  # a busy CI machine delays the sleeps below
    monkeypatch.setattr(hf_requests, "GATHER_MOST", 2.0)
    engine = await _engine(tiny_dir)
    admitted = []
    admit = engine._decoder.admit
    engine._decoder.admit = lambda groups, version: (admitted.append(len(groups)), admit(groups, version))[1]
    try:
        async def later(i, p):
            await asyncio.sleep(0.002 * i)
            return await engine.generate(p, 2, _greedy(6))

        outs = await asyncio.gather(*(later(i, tokenizer.encode(p)) for i, p in enumerate(PROMPTS)))
        assert admitted == [len(PROMPTS)] and all(len(o) == 2 for o in outs)
    finally:
        await engine.close()


async def test_a_short_request_joins_and_leaves_while_a_long_one_runs(tiny_dir, tokenizer, long_prompt):
    engine = await _engine(tiny_dir)
    try:
        long = asyncio.ensure_future(engine.generate(long_prompt, 1, _greedy(LONG)))
        await _wait_running(engine)
        short = await engine.generate(tokenizer.encode(PROMPTS[0]), 3, SamplingParams(max_tokens=4, seed=1))
        assert not long.done(), "the short request waited for the long one (no continuous batching)"
        assert [len(c.completion_ids) for c in short] == [4, 4, 4] or any(c.finish_reason == "stop" for c in short)
        assert len((await long)[0].completion_ids) == LONG
    finally:
        await engine.close()


async def test_a_seeded_request_samples_the_same_alone_and_amid_others(tiny_dir, tokenizer):
    engine = await _engine(tiny_dir, max_batch=5)
    try:
        prompt = tokenizer.encode(PROMPTS[1])
        sampling = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=20, seed=1234)
        alone = await engine.generate(prompt, 4, sampling)
        others = [engine.generate(tokenizer.encode(p), n, SamplingParams(temperature=t, top_k=k, max_tokens=m))
                  for p, n, t, k, m in ((PROMPTS[0], 3, 0.7, 5, 25), (PROMPTS[2], 2, 1.3, -1, 7),
                                        (PROMPTS[3], 1, 0.0, -1, 30))]
        amid = (await asyncio.gather(*others[:2], engine.generate(prompt, 4, sampling), *others[2:]))[2]
        assert [c.completion_ids for c in alone] == [c.completion_ids for c in amid]
        for a, b in zip(alone, amid):  # float32 CPU: the batch shape moves the last bits only
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert len({tuple(c.completion_ids) for c in alone}) == 4  # completions differ from each other
        other_seed = await engine.generate(prompt, 4, SamplingParams(temperature=1.0, top_p=0.9, max_tokens=20,
                                                                     seed=1235))
        assert [c.completion_ids for c in other_seed] != [c.completion_ids for c in alone]
    finally:
        await engine.close()


async def test_swap_without_partial_rollouts_waits_for_requests_in_flight(tiny_dir, tokenizer, models, long_prompt):
    old, new = models
    engine = await _engine(tiny_dir, partial=False)
    try:
        a = asyncio.ensure_future(engine.generate(long_prompt, 1, _greedy(LONG)))
        await _wait_running(engine)
        loaded = asyncio.ensure_future(_load(engine, new, 1))
        await asyncio.sleep(0.05)  # the swap is pending now: B must wait for it
        b = asyncio.ensure_future(engine.generate(long_prompt, 1, _greedy(10)))
        (ca,), (cb,), loaded_at = await a, await b, await loaded
        assert ca.completion_ids == greedy(old, tokenizer, long_prompt, LONG)[0]  # A finished on the old weights
        assert ca.policy_version == 0 and ca.versions is None
        assert cb.completion_ids == greedy(new, tokenizer, long_prompt, 10)[0]  # B ran on the new ones
        assert cb.policy_version == 1 and cb.versions is None
        assert engine.version == 1 and engine.last_pause_seconds is not None and engine.last_pause_seconds >= 0
        assert a.done() and loaded_at > 0
    finally:
        await engine.close()


async def test_partial_rollouts_resume_requests_in_flight_on_the_new_weights(tiny_dir, tokenizer, models,
                                                                             long_prompt):
    old, new = models
    engine = await _engine(tiny_dir, partial=True)
    try:
        a = asyncio.ensure_future(engine.generate(long_prompt, 1, _greedy(LONG)))
        await _wait_running(engine, tokens=5)
        await _load(engine, new, 1)
        assert not a.done(), "the swap did not land mid-generation"
        (c,) = await a
        k = c.versions.index(1)
        assert 5 <= k < LONG and c.versions == [0] * k + [1] * (LONG - k) and c.policy_version == 0
        old_ids, old_lp = greedy(old, tokenizer, long_prompt, k)
        assert c.completion_ids[:k] == old_ids and c.logprobs[:k] == pytest.approx(old_lp, abs=1e-5)
        # after the swap: exactly what the new weights say after the prompt and the tokens so far
        new_ids, new_lp = greedy(new, tokenizer, long_prompt + c.completion_ids[:k], LONG - k)
        assert c.completion_ids[k:] == new_ids and c.logprobs[k:] == pytest.approx(new_lp, abs=1e-4)
        assert c.completion_ids != greedy(old, tokenizer, long_prompt, LONG)[0]  # the swap changed the output
        assert engine.last_pause_seconds > 0
    finally:
        await engine.close()


async def test_closing_releases_a_pending_swap_and_the_requests_in_flight(tiny_dir, models, long_prompt):
    engine = await _engine(tiny_dir, partial=False)
    a = asyncio.ensure_future(engine.generate(long_prompt, 1, _greedy(LONG)))
    await _wait_running(engine)
    loading = asyncio.ensure_future(_load(engine, models[1], 1))
    await asyncio.sleep(0.05)
    await engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        await asyncio.wait_for(loading, 30)
    with pytest.raises(RuntimeError, match="closed"):
        await asyncio.wait_for(a, 30)


@pytest.mark.parametrize("partial", [False, True])
async def test_pushes_racing_requests_never_deadlock(tiny_dir, tokenizer, models, partial):
    engine = await _engine(tiny_dir, partial=partial, max_batch=6)
    rng = random.Random(0)
    try:
        version = {"n": 0}
        lock = threading.Lock()

        def pusher(stop: threading.Event):
            while not stop.is_set():
                with lock:  # versions rise, as the publisher pushes them
                    version["n"] += 1
                    v = version["n"]
                    engine.load(models[v % 2].state_dict().items(), v, f"v{v}")
                time.sleep(rng.random() * 0.02)

        stop = threading.Event()
        pushers = [threading.Thread(target=pusher, args=(stop,)) for _ in range(2)]
        for t in pushers:
            t.start()
        try:
            outs = await asyncio.wait_for(asyncio.gather(*(
                engine.generate(tokenizer.encode(PROMPTS[i % 4]), rng.randint(1, 4),
                                SamplingParams(temperature=1.0, max_tokens=rng.randint(1, 40), seed=i))
                for i in range(24))), timeout=120)
        finally:
            stop.set()
            for t in pushers:
                t.join(timeout=60)
        assert not any(t.is_alive() for t in pushers), "a load() never returned"
        assert version["n"] >= 2
        for c in (c for out in outs for c in out):
            if c.versions is None:
                continue
            assert partial, "without partial rollouts a completion comes from one version"
            assert len(c.versions) == len(c.completion_ids) and c.versions == sorted(c.versions)
            assert c.policy_version == c.versions[0]
        if partial:  # pushes every few ms: some swaps landed mid-completion
            assert any(c.versions is not None for out in outs for c in out)
        assert engine.errored() is None and engine.load_info() == (0, 0)
    finally:
        await engine.close()


@pytest.mark.gpu
async def test_engine_on_cuda_equals_transformers_greedy_and_seeds_are_device_independent(tiny_dir, tokenizer):
    """float32 on the GPU (bf16 kernels differ between any two implementations): greedy equals
    transformers' greedy there, and a seeded request samples what it samples on the CPU."""
    spec = make_job(tiny_dir, model={"dtype": "float32"}, rollout={"maxModelLen": 256}).spec
    gpu, cpu = HFEngine(spec, device="cuda"), HFEngine(spec, device="cpu")
    await gpu.start()
    await cpu.start()
    try:
        model = load_model(tiny_dir).to("cuda")
        for text in PROMPTS:
            p = tokenizer.encode(text)
            (c,) = await gpu.generate(p, 1, _greedy(16))
            ids = torch.tensor([p], device="cuda")
            ref = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=16, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)[0, len(p):].tolist()
            assert c.completion_ids == ref[:len(c.completion_ids)]
        seeded = SamplingParams(temperature=1.0, max_tokens=12, seed=7)
        p = tokenizer.encode(PROMPTS[2])
        on_gpu, on_cpu = await gpu.generate(p, 3, seeded), await cpu.generate(p, 3, seeded)
        same = sum(a.completion_ids == b.completion_ids for a, b in zip(on_gpu, on_cpu))
        assert same >= 2  # float differences may flip a near-tie token, not the noise
    finally:
        await gpu.close()
        await cpu.close()



@pytest.mark.parametrize("backend", ["gloo", "shm"])
async def test_a_delta_push_writes_only_what_changed_into_the_engine_bit_for_bit(tiny_dir, tokenizer, backend):
    """Delta pushes onto the weights the engine generates with: only the changed values are
    written into its parameters (the rest stay as they are), and after every push the engine's
    parameters equal the trainer's bit for bit; greedy generation then equals transformers'."""
    from grpojob.api.spec import WeightSyncSpec
    from grpojob.sync import delta as dl
    from grpojob.sync.agent import SyncAgent
    from grpojob.sync.publisher import WeightPublisher

    from .harness import TOKEN, wait_for

    engine = await _engine(tiny_dir)
    pub = WeightPublisher(WeightSyncSpec(timeout_seconds=30, bucket_size_mb=1, backend=backend, delta=True),
                          host="127.0.0.1", port=0, device="cpu", token=TOKEN, heartbeat_timeout=5)
    agent = SyncAgent(engine, f"127.0.0.1:{pub.port}", token=TOKEN, replica="e", url="http://e:1",
                      model_dir=str(tiny_dir), heartbeat_seconds=0.2).start()
    trainer = load_model(tiny_dir)
    g = torch.Generator().manual_seed(0)
    try:
        await asyncio.to_thread(wait_for, lambda: pub.rollout_addresses() == ["http://e:1"], 20, "registration")
        for version in range(1, 7):
            with torch.no_grad():  # a few values of a few tensors change (fp32 weights: an optimizer step moves all)
                for p in list(trainer.parameters())[version % 3::3]:
                    flat = p.view(-1)
                    flat[torch.randint(0, flat.numel(), (7,), generator=g)] += 0.01
            view = {n: t.detach().clone() for n, t in trainer.state_dict().items()}
            stats = await asyncio.to_thread(pub.push, view.items(), version)
            assert stats["servers"] == 1 and engine.version == version
            for n, t in view.items():
                assert torch.equal(dl.bits(engine._params[n].reshape(-1)), dl.bits(t.reshape(-1))), (version, n)
            d = stats["delta"]
            if version >= 3:  # whole, a probe, then deltas
                assert d["delta_buckets"] == stats["buckets"] and 0 < d["sent_values"] <= 7 * len(view)
                assert engine.last_swap_values == d["sent_values"], "only the changed values were written"
            elif version == 1:
                assert engine.last_swap_values == sum(t.numel() for t in view.values())  # whole
        ids = tokenizer.encode(PROMPTS[0])
        out = await engine.generate(ids, 1, _greedy(12))
        assert out[0].completion_ids == greedy(trainer, tokenizer, ids, 12)[0] and out[0].policy_version == 6
    finally:
        agent.stop()
        pub.close()
        await engine.close()
