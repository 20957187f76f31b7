"""The GRPO training loop: prompts -> groups (generate) -> rewards (score) -> advantages and
packed, globally normalised policy-gradient steps (train) -> weights out (sync) -> checkpoint.

Runs the same with one process or as one rank of many (torchrun): every rank takes its share of
each step's prompts, all reductions are global, and only rank 0 writes files and serves HTTP.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

import torch

from .. import algorithms, checkpoint
from ..api import GRPOJob
from ..plan import ENV_CHECKPOINT_DIR, ENV_RUN_DIR
from . import dist
from .batch import Prepared, prepare
from .logprobs import PolicyLogprobs
from .packing import MicroBatch, dummy
from .server import StatusBoard
from .sizing import for_device, master_dtype
from .sources import GroupSource, InProcessSource, WeightPublisher

log = logging.getLogger("grpojob.trainer")

METRICS_FILE = "metrics.jsonl"
FINAL_MODEL_DIR = "final-model"
PREFIX = "model."  # PolicyLogprobs holds the HF model as `.model`


class TrainerError(RuntimeError):
    pass


@contextlib.contextmanager
def _timed(stages: dict[str, float], name: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        stages[name] = stages.get(name, 0.0) + time.perf_counter() - t0


def lr_lambda(schedule: str, warmup: int, total: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return f


SourceArg = Union[GroupSource, Callable[["Trainer"], GroupSource], None]


class Trainer:
    """One rank of the trainer.

    source: a GroupSource, or a factory called with the built (and resumed) Trainer; default an
    InProcessSource. publisher: where weights go; defaults to the source when it has `publish`."""

    def __init__(self, job: GRPOJob, *, env: Optional[dist.DistEnv] = None,
                 source: SourceArg = None, publisher: Optional[WeightPublisher] = None,
                 stream=None, scorer=None, checkpoint_dir: Optional[str] = None, run_dir: Optional[str] = None,
                 on_step: Optional[Callable[[dict], None]] = None, board: Optional[StatusBoard] = None,
                 suspend_event: Optional[threading.Event] = None):
        from transformers import AutoTokenizer

        self.job, self.spec = job, job.spec
        self.env = env or dist.DistEnv()
        spec, env = self.spec, self.env
        self.checkpoint_dir = Path(checkpoint_dir or os.environ.get(ENV_CHECKPOINT_DIR) or spec.checkpoint.path)
        run_dir = run_dir or os.environ.get(ENV_RUN_DIR)
        self.run_dir = Path(run_dir) if run_dir else None
        self.on_step = on_step
        self.board = board if board is not None else (StatusBoard(spec.training.steps) if env.is_leader else None)
        self.suspend_event = suspend_event or threading.Event()
        if self.board is not None:  # HTTP /suspend and SIGTERM set the same event
            self.board.suspend_requested = self.suspend_event
        self.max_tokens = spec.rollout.sampling.max_tokens
        t = spec.rollout.sampling.temperature
        self.temperature = t if t > 0 else 1.0  # greedy rollouts report temperature-1 log-probs

        torch.manual_seed(spec.training.seed)
        for field_name, where in (("spec.model.path", spec.model.path), ("spec.model.tokenizer", spec.model.tokenizer)):
            if where is not None and not Path(where).is_dir():
                raise TrainerError(f"{field_name}: '{where}' is not a directory (a Hugging Face model "
                                   f"directory with config.json, safetensors and tokenizer is expected)")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(spec.model.tokenizer or spec.model.path,
                                                           trust_remote_code=spec.model.trust_remote_code)
        except (OSError, ValueError) as e:
            raise TrainerError(f"spec.model: cannot load a tokenizer from "
                               f"'{spec.model.tokenizer or spec.model.path}': {e}") from e
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.model = self.load_model()
        self.model.config.use_cache = False
        if spec.training.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model.train()
        self.strategy = dist.strategy(spec.training.strategy, env)
        layers = getattr(self.model.base_model, "layers", None)
        self.shape = for_device(env.device, self.model)
        log.info("trainer shape: %s", self.shape.describe())
        self.policy = dist.wrap(PolicyLogprobs(self.model, self.shape), self.strategy, env, list(layers or []))
        self.ref = None
        if spec.algorithm.kl_beta > 0:  # with beta 0 no reference model is loaded at all
            ref = self.load_model().eval()
            for p in ref.parameters():
                p.requires_grad_(False)
            self.ref = PolicyLogprobs(ref, self.shape)
        self.algorithm = algorithms.build(spec.algorithm, self.max_tokens)
        tr = spec.training
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=tr.learning_rate,
                                           weight_decay=tr.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(tr.lr_schedule, tr.warmup_steps, tr.steps))
        if stream is None:
            from ..data import PromptStream
            stream = PromptStream(spec, self.tokenizer, rank=env.rank, world=env.world)
        if scorer is None:
            from ..rewards import RewardScorer
            scorer = RewardScorer(spec, self.tokenizer)
        self.stream, self.scorer = stream, scorer
        self.reward_names = list(getattr(scorer, "names", []) or [r.name for r in spec.rewards])
        self.step_count = 0
        self.version = 0
        self.last_checkpoint_step: Optional[int] = None
        self.published_version: Optional[int] = None
        self.resumed_from = self._resume() if spec.checkpoint.resume else None
        if source is None:
            source = InProcessSource.for_trainer
        if not hasattr(source, "next_groups"):
            source = source(self)
        if isinstance(source, tuple):  # a factory may return (source, publisher)
            source, publisher = source[0], publisher or source[1]
        self.source = source
        self.publisher = publisher if publisher is not None else (source if hasattr(source, "publish") else None)
        self._set_status(phase="starting", step=self.step_count, policy_version=self.version,
                         last_checkpoint_step=self.last_checkpoint_step)

    def load_model(self) -> torch.nn.Module:
        """A fresh copy of spec.model.path on this rank's device (policy, reference, rollout copy)."""
        from transformers import AutoModelForCausalLM

        spec = self.spec
        dtype = master_dtype(spec.model.dtype)
        try:
            model = AutoModelForCausalLM.from_pretrained(spec.model.path, dtype=dtype, attn_implementation="sdpa",
                                                         trust_remote_code=spec.model.trust_remote_code)
        except (OSError, ValueError) as e:
            raise TrainerError(f"spec.model.path: cannot load a causal LM from '{spec.model.path}': {e}") from e
        return model.to(self.env.device)

    # ---- status ---------------------------------------------------------------------------
    def _set_status(self, **fields: Any) -> None:
        if self.board is not None:
            self.board.update(**fields)

    def request_suspend(self) -> None:
        """Finish the current step, checkpoint, stop (HTTP /suspend and SIGTERM)."""
        self.suspend_event.set()

    # ---- weights --------------------------------------------------------------------------
    def hf_state(self, everywhere: bool = False) -> dict[str, torch.Tensor]:
        """The full HF-named state dict (collective; empty on ranks other than 0 unless everywhere)."""
        msd, _ = dist.full_state(self.policy, None, self.env, everywhere=everywhere)
        return {k[len(PREFIX):]: v for k, v in msd.items()}

    def _publish(self) -> None:
        # The gather is collective; ranks other than 0 need the full weights only when one of
        # them has a publisher (the in-process source), and all ranks must agree on that.
        others = torch.tensor([int(self.publisher is not None and not self.env.is_leader)])
        state = self.hf_state(everywhere=bool(dist.all_max(others, self.env).item()))
        if self.publisher is not None:
            self.publisher.publish(state.items(), self.version)
        self.published_version = self.version

    # ---- checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self) -> Path | None:
        msd, osd = dist.full_state(self.policy, self.optimizer, self.env)
        per_rank = dist.gather_objects({"rng": checkpoint.rng_state(), "data": self.stream.state_dict()}, self.env)
        path = None
        if self.env.is_leader:
            state = {"step": self.step_count, "policy_version": self.version, "optimizer": osd,
                     "scheduler": self.scheduler.state_dict(), "ranks": per_rank, "world": self.env.world}
            path = checkpoint.save(self.checkpoint_dir, self.step_count, model=self.model,
                                   model_state={k[len(PREFIX):]: v for k, v in msd.items()},
                                   tokenizer=self.tokenizer, trainer_state=state,
                                   keep_last=self.spec.checkpoint.keep_last)
        dist.barrier(self.env)
        self.last_checkpoint_step = self.step_count
        return path

    def _resume(self) -> Optional[Path]:
        found = checkpoint.latest(self.checkpoint_dir) if self.env.is_leader else None
        found = dist.broadcast_object(str(found) if found else None, self.env)
        if not found:
            return None
        msd = osd = state = None
        if self.env.is_leader:
            state = checkpoint.load_state(found)
            weights = checkpoint.load_model_state(found)
            if getattr(self.model.config, "tie_word_embeddings", False) and "lm_head.weight" not in weights:
                weights["lm_head.weight"] = weights[self._embed_key(weights)]
            msd = {PREFIX + k: v for k, v in weights.items()}
            osd = state.pop("optimizer")
        dist.load_full_state(self.policy, self.optimizer, self.env, msd, osd)
        state = dist.broadcast_object(state, self.env)
        self.scheduler.load_state_dict(state["scheduler"])
        self.step_count, self.version = int(state["step"]), int(state["policy_version"])
        ranks = state["ranks"]
        mine = ranks[self.env.rank] if state.get("world") == self.env.world else ranks[0]
        self.stream.load_state_dict(mine["data"])
        if state.get("world") == self.env.world:
            checkpoint.set_rng_state(mine["rng"])
        self.last_checkpoint_step = self.step_count
        log.info("resumed", extra={"path": found, "step": self.step_count})
        return Path(found)

    @staticmethod
    def _embed_key(weights: dict) -> str:
        return next(k for k in weights if k.endswith("embed_tokens.weight"))

    # ---- one step -------------------------------------------------------------------------
    def _forward(self, module, mb: MicroBatch, entropy: bool):
        return module(**mb.inputs(self.env.device, self.shape.attention), temperature=self.temperature,
                      entropy=entropy)

    def _optimize(self, prep: Prepared) -> dict[str, Any]:
        spec, env = self.spec, self.env
        mbs = self.shape.pack(prep.seqs, spec.training.micro_batch_tokens, self.pad_id)
        n_mb = int(dist.all_max(torch.tensor([len(mbs)]), env).item())
        out: dict[str, Any] = {"micro_batches": n_mb}
        if n_mb == 0:  # every group filtered out on every rank: a defined no-op step
            log.warning("step %d: no trainable sequences (all groups filtered); no update", self.step_count + 1)
            return {**out, "skipped": True, "loss": 0.0, "grad_norm": 0.0}
        mbs += [dummy(self.pad_id) for _ in range(n_mb - len(mbs))]
        d = env.device
        if self.ref is not None:
            with torch.no_grad():
                for mb in mbs:
                    mb.ref_logp = self._forward(self.ref, mb, False)[0]
        # sums: loss, clipped, is_weight, kl, entropy, tokens; max: raw importance weight
        sums = torch.zeros(6, dtype=torch.float64)
        is_max = torch.zeros(1, dtype=torch.float64)
        grad_norm = 0.0
        params = [p for p in self.policy.parameters() if p.requires_grad]
        for epoch in range(spec.algorithm.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for i, mb in enumerate(mbs):
                with dist.no_grad_sync(self.policy, skip=i < n_mb - 1):
                    logp, ent = self._forward(self.policy, mb, entropy=epoch == 0)
                    if mb.old_logp is None:  # epoch 0 runs at theta_old: pi_old is free
                        mb.old_logp = logp.detach()
                    terms = self.algorithm.policy_loss(algorithms.TokenBatch(
                        logp=logp, old_logp=mb.old_logp, rollout_logp=mb.rollout_logp.to(d),
                        advantages=mb.advantages.to(d), seq_index=mb.seq_index.to(d), n_seqs=mb.n_seqs,
                        ref_logp=mb.ref_logp))
                    coef = mb.coef.to(d)
                    loss = (terms.loss * coef).sum()
                    # DDP / FSDP average gradients over ranks; the coefficients already divide by
                    # global counts, so scale back up to get the global sum.
                    (loss * env.world).backward()
                if epoch == 0 and not mb.is_dummy:
                    n = float(logp.numel())
                    sums += torch.tensor([float(loss.detach()), float(terms.clipped.sum()),
                                          float(terms.is_weight.sum()),
                                          float(terms.kl.detach().sum()) if terms.kl is not None else 0.0,
                                          float(ent.sum()), n], dtype=torch.float64)
                    is_max = torch.maximum(is_max, terms.is_raw.max().double().cpu().reshape(1))
            gn = torch.nn.utils.clip_grad_norm_(params, spec.training.grad_clip or float("inf"))
            gn = gn.full_tensor() if hasattr(gn, "full_tensor") else gn
            grad_norm = float(gn)
            if not math.isfinite(grad_norm):
                raise TrainerError(f"step {self.step_count + 1}: non-finite gradient norm ({grad_norm}); "
                                   f"lower training.learningRate or check the rewards")
            self.optimizer.step()
        sums = dist.all_sum(sums, env)
        is_max = dist.all_max(is_max, env)
        ntok = float(sums[5]) or 1.0
        out.update(skipped=False, loss=float(sums[0]), grad_norm=grad_norm,
                   clip_fraction=float(sums[1]) / ntok, importance_weight_mean=float(sums[2]) / ntok,
                   importance_weight_max=float(is_max[0]), entropy=float(sums[4]) / ntok,
                   kl=(float(sums[3]) / ntok) if self.ref is not None else None)
        return out

    def step(self) -> dict[str, Any]:
        """One full step; returns its record (identical numbers on every rank)."""
        spec, env = self.spec, self.env
        t0 = time.perf_counter()
        stages: dict[str, float] = {}
        samples = self.stream.next_batch()
        with _timed(stages, "generate"):
            groups = self.source.next_groups(samples, self.version)
        if len(groups) != len(samples):
            raise TrainerError(f"group source returned {len(groups)} groups for {len(samples)} prompts")
        with _timed(stages, "score"):
            self.scorer.score(groups)
        with _timed(stages, "train"):
            prep = prepare(groups, self.algorithm, spec.algorithm.overlong, self.max_tokens, self.version,
                           env, self.reward_names)
            lr = self.scheduler.get_last_lr()[0]
            train = self._optimize(prep)
            with warnings.catch_warnings():  # a skipped step has no optimizer.step(); the schedule is per step
                warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
                self.scheduler.step()
        self.step_count += 1
        self.version += 1
        published = False
        with _timed(stages, "sync"):
            if self.step_count % spec.weight_sync.every_steps == 0 and self.step_count < spec.training.steps:
                self._publish()
                published = True
        last = self.step_count >= spec.training.steps
        with _timed(stages, "checkpoint"):
            if self.step_count % spec.checkpoint.every_steps == 0 or last:
                self._set_status(phase="checkpointing")
                self.save_checkpoint()
        seconds = time.perf_counter() - t0
        record: dict[str, Any] = {
            "step": self.step_count, "policy_version": self.version, "learning_rate": lr,
            **{k: v for k, v in prep.stats.items()},
            "rewards": {k: v[0] for k, v in prep.reward_parts.items()},
            "rewards_std": {k: v[1] for k, v in prep.reward_parts.items()},
            **train,
            "tokens": prep.total_tokens, "trained_tokens": prep.n_tokens,
            "tokens_per_second": prep.total_tokens / seconds if seconds > 0 else None,
            "train_tokens_per_second": prep.total_tokens / stages["train"] if stages.get("train") else None,
            "stage_seconds": {k: round(v, 6) for k, v in stages.items()},
            "step_seconds": seconds, "published": published, "time": time.time(),
        }
        return record

    def _emit(self, record: dict[str, Any]) -> None:
        if not self.env.is_leader:
            return
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            with open(self.run_dir / METRICS_FILE, "a") as f:
                f.write(json.dumps(record) + "\n")
        if self.board is not None:
            self.board.observe(record)
            self._set_status(phase="running", step=record["step"], policy_version=record["policy_version"],
                             reward_mean=record.get("reward_mean"), kl=record.get("kl"),
                             tokens_per_second=record.get("tokens_per_second"),
                             last_checkpoint_step=self.last_checkpoint_step,
                             weights_in_sync=self.published_version == self.version)
        log.info("step %d/%d reward %.3f loss %.4f %.0f tok/s", record["step"], self.spec.training.steps,
                 record.get("reward_mean") or 0.0, record.get("loss") or 0.0, record.get("tokens_per_second") or 0.0,
                 extra={"record": record})
        if self.on_step is not None:
            self.on_step(record)

    # ---- the run --------------------------------------------------------------------------
    def _suspend_agreed(self) -> bool:
        flag = torch.tensor([int(self.suspend_event.is_set())])
        return bool(dist.all_max(flag, self.env).item())

    def run(self) -> str:
        """Train to training.steps (or until suspended). Returns the final phase."""
        spec = self.spec
        if self.version > 0:  # resumed: the rollout side must serve the resumed policy
            self._publish()
        self._set_status(phase="running", step=self.step_count, policy_version=self.version)
        while self.step_count < spec.training.steps:
            if self._suspend_agreed():
                return self._suspend()
            self._emit(self.step())
        if self.last_checkpoint_step != self.step_count:
            self.save_checkpoint()
        self.save_final_model()
        self._set_status(phase="completed", step=self.step_count, last_checkpoint_step=self.last_checkpoint_step,
                         message="training completed")
        return "completed"

    def _suspend(self) -> str:
        self._set_status(phase="checkpointing", message="suspending")
        if self.last_checkpoint_step != self.step_count:
            self.save_checkpoint()
        self._set_status(phase="suspended", last_checkpoint_step=self.last_checkpoint_step,
                         message=f"suspended after step {self.step_count}")
        log.info("suspended", extra={"step": self.step_count})
        return "suspended"

    def save_final_model(self) -> None:
        """HF model + tokenizer in $GRPOJOB_RUN_DIR/final-model (collective; rank 0 writes)."""
        state = self.hf_state()
        if not self.env.is_leader or self.run_dir is None:
            return
        path = self.run_dir / FINAL_MODEL_DIR
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path, state_dict=state, safe_serialization=True)
        self.tokenizer.save_pretrained(path)
