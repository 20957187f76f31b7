"""spec.rollout.autoscale: rollout servers that follow the trainer's backpressure.

The rule is one pure function, `decide`, that the operator (grpojob_operator.status.autoscaling:
the rollout Deployment's replicas) and `grpojob run` (grpojob.local.autoscaler: rollout processes)
both call with what the trainer leader reports for its last step (`Signals`, from /status or
metrics.jsonl), the scaler's own state (`State`, kept in GRPOJob.status.autoscale on a cluster)
and the time. It returns the replicas to run, why, and the next state.

The model behind the numbers: a step is the trainer's wait for groups (W) plus the rest (T - W:
training, scoring, the push); more rollout servers shorten generation, in inverse proportion,
and leave the rest alone. So r servers that make the trainer wait W of a T-second step need

    r' = ceil(r * W * (1 - t) / (t * (T - W)))

to bring its wait share down to the target t (the trainer waiting for groups more than
targetWaitFraction of the step: scale up). Scaling down is asked by the servers' idle share of
the step (idle > targetIdleFraction), sized as the HorizontalPodAutoscaler sizes on utilisation,
r' = ceil(r * busy / (1 - targetIdleFraction)), and never below the r' above (a smaller pool
would make the trainer wait more than the target: no bounce). Between the two: hold (the band).
Hysteresis: a direction must hold `steps` consecutive trainer steps (a look at an unchanged step
counts nothing; a trainer resumed from an earlier checkpoint counts on from its new steps); within
the streak, a scale-up takes the smallest size it asked for and a scale-down the largest (like the
HPA's stabilisation window). Cool-down: no scale-up within
scaleUp.cooldownSeconds, no scale-down within scaleDown.cooldownSeconds, of the last change.
Each change moves at most maxChange replicas, and never outside [minReplicas, maxReplicas].

A scale-up is a trial: the formula assumes the servers get devices (or cores) of their own, which a
CPU job on a few shared cores does not, and there more servers only slow each other down. So the
step time before the change is compared with the step time of the whole new pool, each the mean of
n = max(scaleUp.steps, TRIAL_STEPS) steps: before, a running mean over the last n steps at this
count (the job's first step, which pays the start-up, left out, and no trial before n steps are
measured); after, the first n steps the whole new pool served (the first such step left out: its
groups were partly generated before). Unless the step got faster by scaleUp.minGain (the steps a
second rose by that share), the servers are scaled back at once (ScaleUpNoGain, whatever the idle
share) and no scale-up is taken within scaleUp.backoffSeconds of a change (doubled at each failed
trial in a row) until a trial pays. Scale-downs are not held by a trial or a back-off.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

from pydantic import field_validator

from grpojob.api.base import Model, field

UP, DOWN, HOLD = "up", "down", "hold"
NO_GAIN = "ScaleUpNoGain"
KEPT = "ScaleUpKept"  # a trial that paid (Decision.kept): said once, the servers stay
# A trial's fewest steps on each side: a step's time varies by about 15% (sd) from one step to the next
# on a shared machine (2 CPU cores: 0.38-0.61 s for the same work), so the means of two steps either
# side told a 10% gain from none only by chance (a second server that gained nothing was kept in 2 of 3
# runs).
TRIAL_STEPS = 3


class ScaleRule(Model):
    """One direction of the autoscaler (the HPA's behavior.scaleUp/scaleDown)."""
    steps: int = field(2, ge=1, le=1000, description="Trainer steps in a row asking for it.")
    cooldown_seconds: int = field(60, ge=0, le=86400, description="Seconds after the last change before it "
                                  "may act.")
    max_change: int = field(2, ge=1, le=1000, description="Most replicas per change.")


class ScaleUpRule(ScaleRule):
    """scaleUp: a ScaleRule whose changes must pay for themselves."""
    min_gain: float = field(0.1, ge=-1, description="Least steps/s gain kept (-1: any).")
    backoff_seconds: int = field(300, ge=0, le=86400, description="No scale-up this long after (doubling).")


class AutoscaleSpec(Model):
    """Rollout servers scaled on the trainer's signals (docs/services.md)."""
    model_config = Model.model_config | {"json_schema_extra": {"x-kubernetes-validations": [
        {"rule": "(has(self.minReplicas) ? self.minReplicas : 1) <= self.maxReplicas",
         "message": "minReplicas must not exceed maxReplicas"}]}}

    min_replicas: int = field(1, ge=1, le=1000, description="Fewest rollout servers.")
    max_replicas: int = field(ge=1, le=1000, description="Most rollout servers.")
    target_wait_fraction: float = field(0.2, gt=0, lt=1, description="Scale up while the trainer waits "
                                        "over this share of its step.")
    target_idle_fraction: float = field(0.5, gt=0, lt=1, description="Scale down while the servers idle over "
                                        "this share of the step.")
    scale_up: ScaleUpRule = field(default_factory=ScaleUpRule, description="When and how far to scale up.")
    scale_down: ScaleRule = field(default_factory=lambda: ScaleRule(steps=5, cooldown_seconds=300, max_change=1),
                                  description="When and how far to scale down.")

    @field_validator("scale_up", mode="before")
    @classmethod
    def _a_plain_rule(cls, v):  # a ScaleRule built before scaleUp had its own fields still does
        return v.model_dump() if type(v) is ScaleRule else v


def problems(spec) -> list[tuple[str, str]]:
    """(field path relative to spec, why) of what spec.rollout.autoscale cannot work with."""
    a = spec.rollout.autoscale
    if a is None:
        return []
    out = []
    if a.min_replicas > a.max_replicas:
        out.append(("rollout.autoscale.minReplicas", f"{a.min_replicas} exceeds maxReplicas ({a.max_replicas})"))
    elif not a.min_replicas <= spec.rollout.replicas <= a.max_replicas:
        out.append(("rollout.replicas", f"{spec.rollout.replicas}: the servers to start with must be within "
                    f"rollout.autoscale's minReplicas..maxReplicas ({a.min_replicas}..{a.max_replicas})"))
    if spec.placement == "colocated":
        out.append(("rollout.autoscale", "placement colocated runs one engine inside the trainer pod: there is "
                    "nothing to scale; use placement separate"))
    if spec.scheduling.gang == "kueue":
        out.append(("rollout.autoscale", "scheduling.gang kueue puts the pod group's size in every pod's template: "
                    "each new count would be a new gang that restarts every pod; use scheduling.gang volcano or none"))
    if spec.mode == "service":
        out.append(("rollout.autoscale", "mode service has no training loop whose wait for groups could drive it: "
                    "scale rollout.replicas yourself, or use mode train"))
    return out


@dataclass(frozen=True)
class Signals:
    """What the trainer leader reports of its last step (TrainerStatus.pipeline, a metrics.jsonl record)."""
    step: int
    wait_seconds: Optional[float] = None  # the trainer's wait for groups
    step_seconds: Optional[float] = None
    idle_fraction: Optional[float] = None  # share of the step no group was being generated
    groups_in_flight: Optional[int] = None  # reported alongside, not decided on
    policy_lag: Optional[float] = None  # reported alongside, not decided on
    servers: Optional[int] = None  # rollout servers in the trainer's weight-sync group (None: not known)

    @property
    def wait_fraction(self) -> Optional[float]:
        if self.wait_seconds is None or not self.step_seconds:
            return None
        return min(1.0, max(0.0, self.wait_seconds / self.step_seconds))

    def words(self) -> str:
        parts = [f"step {self.step}"]
        if self.wait_fraction is not None:
            parts.append(f"trainer waited {self.wait_fraction:.0%} of the step for groups "
                         f"({self.wait_seconds:.2f}/{self.step_seconds:.2f} s)")
        if self.idle_fraction is not None:
            parts.append(f"rollout servers idle {self.idle_fraction:.0%}")
        if self.groups_in_flight is not None:
            parts.append(f"{self.groups_in_flight} groups in flight")
        if self.policy_lag is not None:
            parts.append(f"policy lag {self.policy_lag:g}")
        return ", ".join(parts)


@dataclass(frozen=True)
class State:
    """The scaler's memory between looks."""
    replicas: int
    last_step: int = -1  # the last trainer step counted
    direction: str = HOLD  # of the current streak
    streak: int = 0  # consecutive steps asking for `direction`
    proposal: int = 0  # replicas the streak asks for (up: the smallest asked, down: the largest)
    last_change: Optional[float] = None  # time (seconds) of the last change of replicas
    seconds: float = 0.0  # running mean step time at this count (0: none measured yet)
    measured: int = 0  # steps in it; -1: the next step of the whole pool is left out (just changed)
    trial_from: int = 0  # replicas before the scale-up on trial (0: none)
    before: float = 0.0  # the mean step time before it
    backoff: float = 0.0  # no scale-up within this many seconds of a change, until a trial pays (0: none)


@dataclass(frozen=True)
class Decision:
    replicas: int
    reason: str  # Bounds, ScaleUp, ScaleDown, ScaleUpNoGain, InBand, AtLimit, Waiting, CoolingDown, Measuring,
    #              BackingOff, NoNewStep, NoSignal (a trial that paid is `kept`, beside one of these)
    message: str
    state: State
    kept: str = ""  # a scale-up's trial paid at this look: its figures (an Event / a line of its own)

    @property
    def changed(self) -> bool:
        return self.reason in ("Bounds", "ScaleUp", "ScaleDown", NO_GAIN)


def replicas_for_wait(replicas: int, wait: float, step: float, target: float) -> float:
    """Servers that bring the trainer's wait share to `target` (generation time in inverse
    proportion to servers, the rest of the step unchanged); inf when the step is all waiting."""
    if wait <= 0:
        return 0.0
    rest = step - wait
    if rest <= 0:
        return math.inf
    return replicas * wait * (1 - target) / (target * rest)


def want(spec: AutoscaleSpec, replicas: int, s: Signals) -> tuple[str, int]:
    """(direction, replicas asked for) from one step's signals, within the bounds and maxChange."""
    wait = s.wait_fraction
    needed = replicas_for_wait(replicas, s.wait_seconds or 0.0, s.step_seconds or 0.0, spec.target_wait_fraction) \
        if wait is not None else 0.0
    if wait is not None and wait > spec.target_wait_fraction:
        top = min(spec.max_replicas, replicas + spec.scale_up.max_change)
        return UP, min(top, max(replicas + 1, _ceil(needed)))
    if s.idle_fraction is not None and s.idle_fraction > spec.target_idle_fraction:
        busy = _ceil(replicas * (1 - s.idle_fraction) / (1 - spec.target_idle_fraction))
        floor = max(spec.min_replicas, replicas - spec.scale_down.max_change)
        target = max(floor, busy, _ceil(needed))
        if target < replicas:
            return DOWN, target
    return HOLD, replicas


def decide(spec: AutoscaleSpec, state: State, s: Optional[Signals], now: float) -> Decision:
    """The replicas to run now, why, and the next state (module docstring: the rule)."""
    r = state.replicas
    bounded = min(spec.max_replicas, max(spec.min_replicas, r))
    if bounded != r:  # the bounds were edited (or a first look): obey them at once
        return Decision(bounded, "Bounds", f"{r} replicas are outside minReplicas..maxReplicas "
                        f"({spec.min_replicas}..{spec.max_replicas})",
                        replace(state, replicas=bounded, direction=HOLD, streak=0, proposal=0, last_change=now,
                                seconds=0.0, measured=-1, trial_from=0))
    if s is None or s.wait_fraction is None:
        return Decision(r, "NoSignal", "the trainer has not reported a step's wait yet", state)
    if s.step == state.last_step:  # (a step below it is a trainer resumed from an earlier checkpoint: new)
        return Decision(r, "NoNewStep", f"no step since step {state.last_step}", state)
    n = trial_steps(spec)
    state = measure(state, s, n)
    kept = ""
    if state.trial_from and state.measured >= n:
        gain = state.before / state.seconds - 1
        if gain < spec.scale_up.min_gain:
            return no_gain(spec, state, s, gain, now)
        kept = f"the {state.trial_from} -> {r} scale-up paid: {trial_words(spec, state, gain)}: they stay"
        state = replace(state, trial_from=0, backoff=0.0)  # it paid: the next failed trial backs off from the start
    d = _move(spec, state, s, now, n)
    return replace(d, kept=kept) if kept else d


def _move(spec: AutoscaleSpec, state: State, s: Signals, now: float, n: int) -> Decision:
    """decide's rest, once the step is measured and no trial is undone: the streaks and limits
    (`n`: the trial's steps, trial_steps)."""
    r = state.replicas
    direction, asked = want(spec, r, s)
    if direction == UP and asked <= r:  # at maxReplicas: asks for nothing it can have
        return Decision(r, "AtLimit", f"{s.words()}: the trainer waits over {spec.target_wait_fraction:.0%}, and "
                        f"{r} is maxReplicas", replace(state, last_step=s.step, direction=HOLD, streak=0, proposal=0))
    held = state.backoff and state.last_change is not None and now < state.last_change + state.backoff
    if direction == UP and (state.trial_from or held):
        calm = replace(state, last_step=s.step, direction=HOLD, streak=0, proposal=0)
        if state.trial_from:
            return Decision(r, "Measuring", f"{s.words()}: no scale-up before the {state.trial_from} -> {r} one is "
                            f"measured ({max(0, state.measured)} of {n} steps)", calm)
        return Decision(r, "BackingOff", f"{s.words()}: no scale-up for {state.last_change + state.backoff - now:.0f} s "
                        f"more (the last one did not pay)", calm)
    if direction == HOLD:
        return Decision(r, "InBand", s.words(), replace(state, last_step=s.step, direction=HOLD, streak=0, proposal=0))
    same = direction == state.direction
    proposal = (min if direction == UP else max)(state.proposal, asked) if same else asked
    streak = state.streak + 1 if same else 1
    counted = replace(state, last_step=s.step, direction=direction, streak=streak, proposal=proposal)
    rule = spec.scale_up if direction == UP else spec.scale_down
    if streak < rule.steps:
        return Decision(r, "Waiting", f"{s.words()}: scale {direction} to {proposal} asked for {streak} of "
                        f"{rule.steps} steps", counted)
    if direction == UP and state.measured < n:  # as many steps before as the trial measures
        return Decision(r, "Measuring", f"{s.words()}: scale up to {proposal} waits for a step time to compare "
                        f"it with ({max(0, state.measured)} of {n} steps)", counted)
    if state.last_change is not None and now - state.last_change < rule.cooldown_seconds:
        left = rule.cooldown_seconds - (now - state.last_change)
        return Decision(r, "CoolingDown", f"{s.words()}: scale {direction} to {proposal} waits {left:.0f} s more "
                        f"(scale{direction.capitalize()}.cooldownSeconds {rule.cooldown_seconds})", counted)
    why = (f"the trainer waits for groups over {spec.target_wait_fraction:.0%} of its step"
           if direction == UP else f"rollout servers idle over {spec.target_idle_fraction:.0%} of the step")
    changed = State(replicas=proposal, last_step=s.step, last_change=now, measured=-1, backoff=state.backoff)
    if direction == UP:  # on trial until its steps are measured
        changed = replace(changed, trial_from=r, before=state.seconds)
    return Decision(proposal, "ScaleUp" if direction == UP else "ScaleDown",
                    f"{r} -> {proposal} rollout servers: {why} for {streak} steps ({s.words()})", changed)


def trial_steps(spec: AutoscaleSpec) -> int:
    """Steps measured on each side of a scale-up: scaleUp.steps, at least TRIAL_STEPS."""
    return max(spec.scale_up.steps, TRIAL_STEPS)


def measure(state: State, s: Signals, n: int) -> State:
    """The step time's running mean at this count over the last `n` steps (the plain mean of the
    first n, then each new step weighs 1/n), from steps the whole pool served (a step with fewer
    servers than wanted, the first whole one after a change, and the job's first step, are left
    out)."""
    if s.servers is not None and s.servers < state.replicas:
        return state
    if state.measured < 0 or state.last_step < 0:  # the first step ever also pays the start-up: left out
        return replace(state, measured=0)
    seconds = state.seconds + (s.step_seconds - state.seconds) / min(state.measured + 1, n)
    return replace(state, seconds=seconds, measured=state.measured + 1)


def no_gain(spec: AutoscaleSpec, state: State, s: Signals, gain: float, now: float) -> Decision:
    """Undo the scale-up on trial, and hold off the next ones (doubling)."""
    r, back = state.replicas, state.trial_from
    backoff = min(86400.0, 2 * state.backoff) if state.backoff else float(spec.scale_up.backoff_seconds)
    return Decision(back, NO_GAIN, f"{r} -> {back} rollout servers: {trial_words(spec, state, gain)}: they slow "
                    f"each other down; no scale-up for {backoff:.0f} s ({s.words()})",
                    State(replicas=back, last_step=s.step, last_change=now, measured=-1, backoff=backoff))


def trial_words(spec: AutoscaleSpec, state: State, gain: float) -> str:
    """What a finished trial compared, for ScaleUpNoGain and ScaleUpKept alike."""
    return (f"{state.replicas} servers made a step {state.seconds:.2f} s against {state.before:.2f} s with "
            f"{state.trial_from} ({gain:+.0%} steps a second; scaleUp.minGain {spec.scale_up.min_gain:.0%})")


def _ceil(x: float) -> int:
    if math.isinf(x):
        return 1 << 30
    return math.ceil(x - 1e-9)
