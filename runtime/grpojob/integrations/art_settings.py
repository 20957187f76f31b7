"""ART's per-call training settings (`backend.train(model, groups, learning_rate=..., ...)`) against
the GRPOJob's spec (grpojob.integrations.art).

A GRPOJob's optimisation is its spec: the trainer takes groups from the trajectory API into steps
it runs with `spec.training` and `spec.algorithm`, the same for every group. So a setting ART passes
per call is honoured when the job already does what it asks (its value is the spec's, or a no-op
here), and refused by name otherwise, with the spec field that sets it: the script and the job
then say the same thing, or the script stops at its first `train` before anything is posted.
Settings the caller does not pass are not checked (the job's own values apply).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Optional

__all__ = ["SettingRefused", "check", "SPEC_DEFAULTS"]


class SettingRefused(ValueError):
    """A setting of `train` that the job cannot honour; the message names it and the fix."""


# the spec's defaults (grpojob.api.spec), for a runtime config written without them
SPEC_DEFAULTS = {
    ("training", "learningRate"): 1e-6, ("algorithm", "name"): "grpo", ("algorithm", "clipEpsLow"): 0.2,
    ("algorithm", "clipEpsHigh"): 0.2, ("algorithm", "advantageNormalization"): "group",
    ("algorithm", "importanceCap"): 2.0, ("algorithm", "klBeta"): 0.0,
}
PPO_CLIP = {"grpo", "dapo", "dr_grpo", "gspo"}  # the built-ins with PPO's clipped ratio


def _spec(spec: Mapping[str, Any], section: str, name: str) -> Any:
    value = (spec.get(section) or {}).get(name)
    return SPEC_DEFAULTS.get((section, name)) if value is None else value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return a == b


def _equal(section: str, name: str, to_spec: Callable[[Any], Any] = lambda v: v):
    """A setting honoured when it equals spec.<section>.<name> (after `to_spec`)."""
    def rule(key: str, value: Any, spec: Mapping[str, Any]) -> Optional[str]:
        want = _spec(spec, section, name)
        if _same(to_spec(value), want):
            return None
        return (f"{key}={value!r}: this job trains with spec.{section}.{name} = {want!r} for every step; set "
                f"spec.{section}.{name} to {to_spec(value)!r} in the GRPOJob (or drop {key} from the train call)")
    return rule


def _only(*accepted: Any, why: str):
    """A setting honoured only at the given values (ART's defaults, or what the job always does)."""
    def rule(key: str, value: Any, spec: Mapping[str, Any]) -> Optional[str]:
        if any(_same(value, a) for a in accepted):
            return None
        return f"{key}={value!r} is not supported by the grpojob backend: {why}"
    return rule


def _loss(key: str, value: Any, spec: Mapping[str, Any]) -> Optional[str]:
    ppo = value is True or value == "ppo"
    name = _spec(spec, "algorithm", "name")
    if ppo and name in PPO_CLIP:
        return None
    if ppo or value is False or value == "cispo":
        hint = "ppo=True" if key == "ppo" else "loss_fn='ppo'"
        return (f"{key}={value!r}: this job's loss is spec.algorithm.name = {name!r}; the grpojob backend has "
                f"PPO's clipped loss (algorithm grpo, dapo, dr_grpo or gspo) and no CISPO: pass "
                f"{hint} with one of those, or name an algorithm "
                "class of your own in spec.algorithm.name (docs/plugins.md)")
    return f"{key}={value!r}: unknown loss (ART's are 'cispo' and 'ppo')"


def _scale(key: str, value: Any, spec: Mapping[str, Any]) -> Optional[str]:
    want = "group" if value else "none"
    have = _spec(spec, "algorithm", "advantageNormalization")
    if have == want:
        return None
    return (f"{key}={value!r}: this job normalises advantages with spec.algorithm.advantageNormalization = "
            f"{have!r}; set it to {want!r} (True: divide by the group's reward std, False: do not)")


def _level(key: str, value: Any, spec: Mapping[str, Any]) -> Optional[str]:
    name = _spec(spec, "algorithm", "name")
    want = "sequence" if name == "gspo" else "token"
    if value == want:
        return None
    return (f"{key}={value!r}: spec.algorithm.name = {name!r} weighs importance per {want}; "
            "per-sequence weights are algorithm gspo, per token the other built-ins ('average' and "
            "'geometric_average' have no built-in)")


NO_EFFECT = "accepted and without effect here"
RULES: dict[str, Callable[[str, Any, Mapping[str, Any]], Optional[str]]] = {
    "learning_rate": _equal("training", "learningRate"),
    "epsilon": _equal("algorithm", "clipEpsLow"),
    "epsilon_high": _equal("algorithm", "clipEpsHigh"),
    "truncated_importance_sampling": _equal("algorithm", "importanceCap"),
    "loss_fn": _loss,
    "ppo": _loss,
    "normalize_advantages": _scale,
    "scale_rewards": _scale,
    "importance_sampling_level": _level,
    "kl_penalty_coef": _only(0, 0.0, why="ART's KL-penalised advantages have no equivalent; the job's KL "
                             "penalty is in the loss (spec.algorithm.klBeta)"),
    "kl_penalty_reference_step": _only(None, why="the job's KL reference is the initial model"),
    "kl_ref_adapter_path": _only(None, why="the job's KL reference is the initial model"),
    "loss_fn_config": _only(None, {}, why="the loss is the job's algorithm (spec.algorithm)"),
    "adam_params": _only(None, why="the optimizer is the job's (spec.training: learningRate, weightDecay)"),
    "advantage_balance": _only(0, 0.0, why="no advantage balancing in the job's algorithms"),
    "max_negative_advantage_importance_sampling_weight": _only(None, why="no such cap in the job's algorithms"),
    "mask_prob_ratio": _only(False, why="no such mask in the job's algorithms"),
    "kimi_k2_tau": _only(None, why="no Kimi K2 loss in the job's algorithms"),
    "allow_training_without_logprobs": _only(False, why="the trainer needs the exact tokens and log-probs "
                                             "the rollout servers return (the backend asks for them)"),
    "scale_learning_rate_by_reward_std_dev": _only(False, why="the learning rate is spec.training's"),
    "num_trajectories_learning_rate_multiplier_power": _only(0, 0.0, why="the learning rate is spec.training's"),
    "plot_tensors": _only(False, why="no tensor plots"),
}
# settings of how ART's own trainer computes, not what it computes: nothing to do here
ACCEPTED = {"precalculate_logprobs", "logprob_calculation_chunk_size", "packed_sequence_length", "verbose",
            "save_checkpoint"}


def check(settings: Mapping[str, Any], spec: Mapping[str, Any]) -> None:
    """Raise SettingRefused naming every setting the job cannot honour (TypeError for a name ART's
    backends do not take, as a keyword argument they do not know would)."""
    unknown = sorted(k for k in settings if k not in RULES and k not in ACCEPTED)
    if unknown:
        raise TypeError(f"train() got unexpected keyword argument(s) {', '.join(unknown)} (ART 0.5's "
                        "LocalBackend and ServerlessBackend take none of these)")
    problems = [why for key, value in settings.items() if key in RULES and (why := RULES[key](key, value, spec))]
    if problems:
        raise SettingRefused("the grpojob backend cannot honour: " + "; ".join(problems))
