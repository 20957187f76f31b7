"""GRPOTrainer: one rank's learner. It owns the policy, its optimizer and learning-rate schedule,
and turns one step's scored groups into one optimizer update.

Its methods are the seams users override (subclass it, `grpojob.GRPOTrainer`, and name the class
in spec.trainer.class): each has a contract in its docstring and a default that is grpojob's own
behaviour. The loop around it (groups in, weights out, checkpoints, metrics) is
`grpojob.leader.loop`; it runs the same with one process or as one rank of many (torchrun): every
reduction is global, only rank 0 writes files. Methods marked "Collective" must be called by every
rank the same number of times. `self.args` holds spec.trainer.args; numbers a hook wants in the
step record go into `Prepared.extra` (prepare_batch) or `LossTerms.extra` (loss_fn) and come out
in metrics.jsonl, /status's log line and the trackers under `extra`.

The step, as step_training runs it:

    prep = prepare_batch(groups)        # sequences, per-sequence or per-token advantages, weights
    for epoch in algorithm.epochs:       # optimize(prep)
        for mb in pack(prep.seqs):       # micro-batches of packed sequences
            logp, ent = compute_logprobs(policy, mb)
            loss, terms = loss_fn(logp, mb)
            backward(loss)
        optimizer.step()
    scheduler.step()
"""
from __future__ import annotations

import logging
import math
import warnings
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from grpojob import algorithms
from grpojob.api import GRPOJob
from grpojob.contracts.rollout import Group
from grpojob.sync import adapter
from grpojob.sync.tensorfiles import write_safetensors
from grpojob.sync.stream import TensorStream
from grpojob.rewards import reward_names
from grpojob.learner import cosmos_loss, dist, flops, kernels, lora, sizing
from grpojob.learner.errors import TrainerError
from grpojob.learner.batch import Prepared, prepare, skips_zero_advantage
from grpojob.learner.logprobs import PolicyLogprobs
from grpojob.learner.packing import MicroBatch, TrainSeq, dummy
from grpojob.learner.schedule import lr_lambda
from grpojob.learner.sizing import Budget, TrainShape, for_device, master_dtype

log = logging.getLogger("grpojob.trainer")

PREFIX = "model."  # PolicyLogprobs holds the HF model as `.model`


class GRPOTrainer:
    def __init__(self, job: GRPOJob, env: Optional[dist.DistEnv] = None):
        self.job, self.spec = job, job.spec
        self.args: dict[str, Any] = dict(job.spec.trainer.args)
        self.env = env or dist.lone()
        spec = self.spec
        self.max_tokens = spec.rollout.sampling.max_tokens
        t = spec.rollout.sampling.temperature
        self.temperature = t if t > 0 else 1.0  # greedy rollouts report temperature-1 log-probs
        torch.manual_seed(spec.training.seed)
        self.tokenizer = self.load_tokenizer()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.model = self.load_model()
        self.model.config.use_cache = False
        self.fused = kernels.apply(self.model, self.env.device)  # liger's kernels (CUDA, when installed)
        if spec.training.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        layers = getattr(self.model.base_model, "layers", None)  # before LoRA wraps the model
        # spec.model.lora: PEFT injects the adapter into self.model's layers in place; self.model
        # stays the Hugging Face model, `self.peft` is PEFT's handle on it (trainer.lora).
        self.peft: Optional[nn.Module] = lora.attach(self.model, spec.model.lora) if spec.model.lora else None
        self.model.train()
        self.strategy = dist.strategy(spec.training.strategy, self.env)
        self.shape: TrainShape = for_device(self.env.device, self.model, self.fused)  # per-device choices (sizing)
        log.info("trainer shape: %s", self.shape.describe())
        self.policy = dist.wrap(PolicyLogprobs(self.model, self.shape), self.strategy, self.env, list(layers or []))
        # with klBeta 0 no reference model is loaded at all
        self.ref: Optional[PolicyLogprobs] = self.build_reference() if spec.algorithm.kl_beta > 0 else None
        self.algorithm = algorithms.build(spec.algorithm, self.max_tokens)
        self.cosmos_loss = cosmos_loss.build(spec)  # spec.trainer.lossFn, or None
        self.loss_counts = {"sequences": 0, "tokens": 0}  # the step's global trained counts (optimize)
        self.optimizer = self.build_optimizer(self.optimizer_params())
        self.scheduler = self.build_lr_scheduler(self.optimizer)
        # micro-batch tokens: the spec's, or on CUDA when it leaves them unset, from the free memory
        tr = spec.training
        self.budget = Budget(tr.micro_batch_tokens, "micro_batch_tokens" not in tr.model_fields_set
                             and self.env.device.type == "cuda", lambda: sizing.cuda_cap(
                                 self.model, self.env.device, tr.micro_batch_tokens,
                                 sum(p.numel() for p in self.optimizer_params()), 4 * self.shape.head_tile))
        self.flops = flops.model_flops(self.model)  # the train stage's MFU (train_flops, peak_flops)
        self.peak_flops = flops.device_peak(self.env.device)
        self.step = 0  # optimizer steps done
        self.version = 0  # policy version of the weights (one per step)

    # ---- hooks: building ------------------------------------------------------------------------
    def load_tokenizer(self):
        """The tokenizer of spec.model (or spec.model.tokenizer)."""
        from transformers import AutoTokenizer

        m = self.spec.model
        for field_name, where in (("spec.model.path", m.path), ("spec.model.tokenizer", m.tokenizer)):
            if where is not None and not Path(where).is_dir():
                raise TrainerError(f"{field_name}: '{where}' is not a directory (a Hugging Face model "
                                   f"directory with config.json, safetensors and tokenizer is expected)")
        try:
            return AutoTokenizer.from_pretrained(m.tokenizer or m.path, trust_remote_code=m.trust_remote_code)
        except (OSError, ValueError) as e:
            raise TrainerError(f"spec.model: cannot load a tokenizer from '{m.tokenizer or m.path}': {e}") from e

    def load_model(self) -> nn.Module:
        """A fresh copy of the policy on this rank's device: a Hugging Face *ForCausalLM (the policy
        and, with klBeta > 0, the frozen reference). Called before any distributed wrapping."""
        from transformers import AutoModelForCausalLM

        spec = self.spec
        dtype = master_dtype(spec.model.dtype)
        try:
            model = AutoModelForCausalLM.from_pretrained(spec.model.path, dtype=dtype, attn_implementation="sdpa",
                                                         trust_remote_code=spec.model.trust_remote_code)
        except (OSError, ValueError) as e:
            raise TrainerError(f"spec.model.path: cannot load a causal LM from '{spec.model.path}': {e}") from e
        return model.to(self.env.device)

    def build_reference(self) -> nn.Module:
        """A frozen copy of the initial policy (load_model, eval, no gradients), not wrapped for data
        parallelism: the KL reference when klBeta > 0. A trainer that folds a KL penalty into the
        reward builds its own with this and scores sequences with token_logprobs. With LoRA: the
        policy itself with its adapter disabled (the base model; no second copy)."""
        if self.peft is not None:
            return lora.AdapterOff(self.peft, dist.unwrap(self.policy))
        ref = self.load_model().eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return PolicyLogprobs(ref, self.shape)

    def build_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        """The optimizer over the trainable parameters (default AdamW from spec.training, its fused
        kernel on CPU and CUDA: one pass over all parameters instead of a loop of small ops, 5x
        faster on a CPU at the benchmark's small shape; TRL's default too)."""
        tr = self.spec.training
        return torch.optim.AdamW(params, lr=tr.learning_rate, weight_decay=tr.weight_decay,
                                 fused=self.env.device.type in ("cpu", "cuda"))

    def build_lr_scheduler(self, optimizer: torch.optim.Optimizer):
        """A torch LR scheduler stepped once per optimizer step (default: warmup + constant,
        linear or cosine decay over training.steps)."""
        tr = self.spec.training
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(tr.lr_schedule, tr.warmup_steps, tr.steps))

    # ---- hooks: one step ----------------------------------------------------------------------------
    def compute_advantages(self, rewards: Sequence[Sequence[float]],
                           baselines: Optional[Sequence[Optional[float]]] = None) -> list[list[float]]:
        """One advantage per completion: `rewards[g][i]` is completion i of group g (shaped: overlong
        penalty applied; only the groups this rank trains on, after dynamic sampling); `baselines[g]`
        is the group's greedy-baseline reward (ReMax) or None. Returns the same shape. Collective:
        batch normalisation reduces over ranks, so every rank calls it once per step (with its own
        groups, possibly none). Default: the algorithm's (group mean or leave-one-out baseline,
        normalised by algorithm.advantageNormalization)."""
        return self.algorithm.advantages(rewards, allreduce=lambda t: dist.all_sum(t, self.env),
                                         baselines=baselines)

    def prepare_batch(self, groups: Sequence[Group]) -> Prepared:
        """This rank's share of the step's scored groups -> `Prepared`: the training sequences
        (`TrainSeq`: prompt and completion ids, loss mask, rollout log-probs, the group's shaped
        `reward`, the `advantage` of the sequence, and the aggregation weight `coef` of its tokens),
        the step's global statistics and `extra` numbers for the step record. Collective.

        Override it to work on the batch as a whole. Per-token signals go on each sequence:
        `token_advantages` (one per completion token, replacing `advantage`) and `fields` (named
        per-token lists, e.g. token-level rewards or a KL; loss_fn reads them as `mb.field(name)`).
        Sequences may be dropped or re-weighted (`coef`), not added. Default: batch.prepare with
        compute_advantages (overlong shaping, dynamic sampling, token-mean weights)."""
        return prepare(groups, self.algorithm, self.spec.algorithm.overlong, self.max_tokens, self.version,
                       self.env, self.reward_names, advantage_fn=self.compute_advantages)

    def compute_logprobs(self, module: nn.Module, mb: MicroBatch, entropy: bool) -> tuple[Tensor, Tensor]:
        """(log-probs [N], entropies [N], or an empty tensor when `entropy` is False) of the
        micro-batch's N trained tokens under `module` (the wrapped policy, or a PolicyLogprobs
        reference), at the sampling temperature, in `mb.token_index` order. Collective when
        `module` is the wrapped policy (FSDP gathers parameters)."""
        return module(**mb.inputs(self.env.device, self.shape.attention), temperature=self.temperature,
                      entropy=entropy)

    def loss_fn(self, logp: Tensor, mb: MicroBatch) -> tuple[Tensor, algorithms.LossTerms]:
        """(the micro-batch's share of the step's loss: a scalar to backpropagate, the per-token
        parts for logging: `LossTerms` with the per-token loss, clip indicator, importance weights,
        the KL [N] or None, and `extra`: named per-token tensors [N] reported as their token mean
        over the step under StepRecord.extra).

        The scalar must be the sum over tokens of (per-token loss x `mb.coef`): the coefficients
        already divide by the step's global token or sequence counts, so micro-batches and ranks
        add up to the aggregated loss. `mb.rollout_logp` is the behaviour policy; `mb.old_logp` is
        the proximal policy recomputed by the trainer (decoupled PPO): the ratio is clipped against
        it and the behaviour weight min(pi_prox/pi_behav, importanceCap) corrects stale samples.
        `mb.ref_logp` is set when klBeta > 0. A dummy micro-batch (`mb.is_dummy`, a rank with fewer
        micro-batches than others) must still return a loss connected to `logp` (its coef is 0).
        With spec.trainer.lossFn: that cosmos-rl loss_fn's (learner.cosmos_loss)."""
        if self.cosmos_loss is not None:
            return self.cosmos_loss(logp, mb, self.loss_counts)
        d = self.env.device
        terms = self.algorithm.policy_loss(algorithms.TokenBatch(
            logp=logp, old_logp=mb.old_logp, rollout_logp=mb.rollout_logp.to(d), advantages=mb.advantages.to(d),
            seq_index=mb.seq_index.to(d), n_seqs=len(mb.seqs), ref_logp=mb.ref_logp))
        return (terms.loss * mb.coef.to(d)).sum(), terms

    def step_training(self, groups: Sequence[Group]) -> tuple[Prepared, dict[str, Any]]:
        """The whole update for one step: prepare the batch, optimise (algorithm.epochs passes),
        advance the LR schedule, step and policy version. Returns the prepared batch and the
        optimisation's statistics (identical on every rank; the keys of StepRecord, plus `extra`).
        Collective."""
        prep = self.prepare_batch(groups)
        if self.skips_zero_advantage():
            prep.seqs = [x for x in prep.seqs if x.has_signal]
        stats = {"learning_rate": self.scheduler.get_last_lr()[0], **self.optimize(prep)}
        with warnings.catch_warnings():  # a skipped step has no optimizer.step(); the schedule is per step
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
            self.scheduler.step()
        self.step += 1
        self.version += 1
        return prep, stats

    def skips_zero_advantage(self) -> bool:
        """Sequences whose every advantage is 0 may be left out of the forward/backward (see
        batch.skips_zero_advantage): only with the stock loss_fn."""
        return type(self).loss_fn is GRPOTrainer.loss_fn and self.cosmos_loss is None and \
            skips_zero_advantage(self.algorithm)

    def token_logprobs(self, module: nn.Module, seqs: Sequence[TrainSeq]) -> list[list[float]]:
        """Per sequence, the log-prob of each completion token under `module` (as compute_logprobs
        gives them; NaN where the loss mask is 0), without gradients. Collective (same micro-batch
        count on every rank), for prepare_batch: e.g. a reference policy's log-probs for a KL
        penalty folded into the reward."""
        mbs = self.shape.pack(seqs, self.budget.for_step(seqs), self.pad_id)
        n_mb = int(dist.all_max(torch.tensor([len(mbs)]), self.env).item())
        mbs += [dummy(self.pad_id) for _ in range(n_mb - len(mbs))]
        out = [[math.nan] * len(s.completion_ids) for s in seqs]
        with torch.no_grad():
            for mb in mbs:
                logp = self.compute_logprobs(module, mb, False)[0].float().cpu().tolist()
                if mb.is_dummy:
                    continue
                for lp, seq_at, k in zip(logp, mb.seq_index.tolist(), mb.token_pos.tolist()):
                    out[mb.seqs[seq_at]][k] = lp
        return out

    def train_flops(self, prep: Prepared) -> float:
        """Model FLOPs of this rank's forward and backward passes over `prep`'s trained
        sequences (learner.flops; per epoch), what the step record's MFU is made of."""
        lengths = [(len(s.prompt_ids), len(s.completion_ids)) for s in prep.seqs]
        return self.spec.algorithm.epochs * self.flops.total(lengths)

    def optimizer_params(self) -> list[nn.Parameter]:
        return [p for p in self.policy.parameters() if p.requires_grad]

    @property
    def reward_names(self) -> list[str]:
        return reward_names(self.spec.rewards)

    # ---- optimisation ------------------------------------------------------------------------------
    def optimize(self, prep: Prepared) -> dict[str, Any]:
        """Packed micro-batches, forward/backward with gradient accumulation, clipping, optimizer step."""
        spec, env = self.spec, self.env
        self.loss_counts = {"sequences": prep.n_seqs, "tokens": prep.n_tokens}
        mbs = self.shape.pack(prep.seqs, self.budget.for_step(prep.seqs), self.pad_id)
        n_mb = int(dist.all_max(torch.tensor([len(mbs)]), env).item())
        out: dict[str, Any] = {"micro_batches": n_mb}
        if n_mb == 0:  # every group filtered out on every rank: a defined no-op step
            log.warning("step %d: no trainable sequences (all groups filtered); no update", self.step + 1)
            return {**out, "skipped": True, "loss": 0.0, "grad_norm": 0.0}
        mbs += [dummy(self.pad_id) for _ in range(n_mb - len(mbs))]
        if self.ref is not None:
            with torch.no_grad():
                for mb in mbs:
                    mb.ref_logp = self.compute_logprobs(self.ref, mb, False)[0]
        # sums: loss, clipped, is_weight, kl, entropy, tokens; max: raw importance weight
        sums = torch.zeros(6, dtype=torch.float64)
        is_max = torch.zeros(1, dtype=torch.float64)
        extra: dict[str, float] = {}  # loss_fn's own per-token numbers, summed
        grad_norm = 0.0
        params = self.optimizer_params()
        for epoch in range(spec.algorithm.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for i, mb in enumerate(mbs):
                with dist.no_grad_sync(self.policy, skip=i < n_mb - 1):
                    logp, ent = self.compute_logprobs(self.policy, mb, entropy=epoch == 0)
                    if mb.old_logp is None:  # epoch 0 runs at the proximal policy: pi_prox is free
                        mb.old_logp = logp.detach()
                    loss, terms = self.loss_fn(logp, mb)
                    # DDP / FSDP average gradients over ranks; the coefficients already divide by
                    # global counts, so scale back up to get the global sum.
                    (loss * env.world).backward()
                if epoch == 0 and not mb.is_dummy:
                    sums += torch.tensor([float(loss.detach()), float(terms.clipped.sum()),
                                          float(terms.is_weight.sum()),
                                          float(terms.kl.detach().sum()) if terms.kl is not None else 0.0,
                                          float(ent.sum()), float(logp.numel())], dtype=torch.float64)
                    is_max = torch.maximum(is_max, terms.is_raw.max().double().cpu().reshape(1))
                if epoch == 0:  # every rank runs loss_fn at least once (dummies too): it knows the names
                    for k, v in terms.extra.items():
                        extra[k] = extra.get(k, 0.0) + (0.0 if mb.is_dummy else float(v.detach().sum()))
            gn = torch.nn.utils.clip_grad_norm_(params, spec.training.grad_clip or float("inf"))
            gn = gn.full_tensor() if isinstance(gn, DTensor) else gn
            grad_norm = float(gn)
            if not math.isfinite(grad_norm):
                raise TrainerError(f"step {self.step + 1}: non-finite gradient norm ({grad_norm}); "
                                   f"lower training.learningRate or check the rewards")
            self.optimizer.step()
        names = sorted(extra)
        sums = dist.all_sum(torch.cat([sums, torch.tensor([extra[k] for k in names], dtype=torch.float64)]), env)
        is_max = dist.all_max(is_max, env)
        ntok = float(sums[5]) or 1.0
        out["extra"] = {k: float(sums[6 + i]) / ntok for i, k in enumerate(names)}
        out.update(skipped=False, loss=float(sums[0]), grad_norm=grad_norm,
                   clip_fraction=float(sums[1]) / ntok, importance_weight_mean=float(sums[2]) / ntok,
                   importance_weight_max=float(is_max[0]), entropy=float(sums[4]) / ntok,
                   kl=(float(sums[3]) / ntok) if self.ref is not None else None)
        return out

    # ---- weights -------------------------------------------------------------------------------------
    def weight_stream(self, dtype: Optional[torch.dtype] = None) -> TensorStream:
        """The policy's Hugging Face-named weights as a TensorStream (floating-point tensors in
        `dtype` when given): each full tensor is produced only when it is taken, gathered from
        this rank's shard (FSDP2: DTensor.full_tensor()), so no rank holds the whole model.
        Collective: every rank walks it to the end in the same order (rank 0 takes the tensors,
        the others `drain()`). Tied weights appear once (the first name). With LoRA: the adapter
        alone, under PEFT's names, its config in `stream.adapter` (the base never changes)."""
        if self.peft is not None:
            return lora.stream(self.peft, dtype)
        params: dict[str, Tensor] = {}
        seen: set[int] = set()
        for name, t in self.model.state_dict(keep_vars=True).items():
            if id(t) not in seen:
                seen.add(id(t))
                params[name] = t

        return TensorStream.gathered(params, dtype)

    def adapter_stream(self) -> Optional[TensorStream]:
        """Under LoRA, the adapter as weight_stream gives it (collective); None for full fine-tuning."""
        return self.weight_stream() if self.peft is not None else None

    def save_model_files(self, directory: Path) -> None:
        """What makes a checkpoint a model directory besides its weights: the config and tokenizer."""
        self.model.config.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)

    def sharded_state(self) -> dict[str, Any]:
        """{"model": ..., "optimizer": ...}: this rank's shards of the policy and optimizer state
        (torch.distributed.checkpoint.state_dict.get_state_dict: FQN keys that are the same for
        any world size and wrapper, DTensors under FSDP2), what a checkpoint saves with
        torch.distributed.checkpoint and loads in place. Collective."""
        return dist.sharded_state(self.policy, self.optimizer, trainable_only=self.peft is not None)

    def load_sharded_state(self, state: dict[str, Any]) -> None:
        """Load a `sharded_state()` (filled by torch.distributed.checkpoint.load) into the wrapped
        policy and optimizer. Collective."""
        dist.load_sharded_state(self.policy, self.optimizer, state, trainable_only=self.peft is not None)

    def export_model(self, path: Optional[Path]) -> None:
        """Write the policy as a Hugging Face model directory (config, tokenizer and one
        model.safetensors, loadable by transformers and vLLM), streamed tensor by tensor from
        `weight_stream()`: no rank holds the whole model. Collective; rank 0 writes (`path` is
        read there only). With LoRA: the adapter in PEFT's format (adapter_config.json,
        adapter_model.safetensors) and the tokenizer."""
        stream = self.weight_stream()
        try:
            if self.env.is_leader and path is not None and stream.adapter is not None:
                adapter.save(path, stream)
                self.tokenizer.save_pretrained(path)
            elif self.env.is_leader and path is not None:
                path = Path(path)
                path.mkdir(parents=True, exist_ok=True)
                self.model.config.save_pretrained(path)
                if getattr(self.model, "generation_config", None) is not None:
                    self.model.generation_config.save_pretrained(path)
                self.tokenizer.save_pretrained(path)
                write_safetensors(path / "model.safetensors", stream)
        finally:
            stream.drain()

    def load_state(self, weights: Optional[dict[str, Tensor]], optimizer: Optional[dict]) -> None:
        """Load full (unsharded) weights and optimizer state, given on rank 0 (None elsewhere), into
        the wrapped policy and optimizer: checkpoints written before sharded checkpoints existed
        (grpojob.checkpoint.legacy). Collective."""
        msd = None
        if weights is not None:
            if getattr(self.model.config, "tie_word_embeddings", False) and "lm_head.weight" not in weights:
                weights["lm_head.weight"] = weights[next(k for k in weights if k.endswith("embed_tokens.weight"))]
            msd = {PREFIX + k: v for k, v in weights.items()}
        dist.load_full_state(self.policy, self.optimizer, self.env, msd, optimizer)
