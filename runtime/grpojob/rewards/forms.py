"""The signatures a reward function may be written in, and how a function of each is called.

- native: `(prompt, completion, **row) -> float`, grpojob's own: one completion a call, the
  rendered prompt, every field of the dataset row as a keyword.
- cosmos: `(to_be_evaluated, reference, *args, **kwargs) -> float`, cosmos-rl's: the completion
  text and the dataset's reference answer (cosmos-rl passes both by position), then `prompt=`,
  `tokenizer=` and `config=` (the spec under cosmos-rl's names) by keyword. cosmos-rl's
  `data_packer` has no counterpart here.
- trl: `(prompts, completions, **kwargs) -> list[float]`, TRL GRPOTrainer's: one call per group,
  everything by keyword; `completions` aligned with the group's completions, `completion_ids`, and
  the row's other columns as lists of the same length. None in the returned list: not scored.
- cosmos-group: cosmos-rl's batched form (its `group_reward_calculation`): the cosmos form once per
  group, `to_be_evaluated` the list of the group's texts, returning a list. Only when declared (its
  parameter names are the cosmos form's).
- verl: `compute_score(data_source, solution_str, ground_truth, extra_info, **kw)`, verl's: one
  completion a call, everything by keyword, the row read as verl's dataset format has it.

cosmos results may be `(value, dict)` (per completion; cosmos-group: `(list, list of dicts)`) and verl
results a dict with "score": the dicts' numeric parts are reported as metrics (`<reward>/<part>`).

A form is declared (spec.rewards[i].signature) or else recognised by the one parameter name only it
uses (MARKERS). A function is never called with an argument in a meaning it did not ask for: either
its parameters carry the form's names, or its author declared the form and it is called exactly as
that framework calls it.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional

from grpojob.api.plugins import REWARD_SIGNATURES


# What cosmos-rl passes besides the two leading arguments (its data_packer has no counterpart here;
# config is grpojob.data.config.CosmosConfig: the spec under cosmos-rl's names).
COSMOS_EXTRAS = ("prompt", "tokenizer", "config")


@dataclass(frozen=True)
class Form:
    name: str
    lead: tuple[str, str]  # the form's two leading arguments, by name
    marker: str  # the parameter that receives the completion(s): it recognises the form
    extras: Optional[tuple[str, ...]]  # the other keywords it passes; None: the row's fields too (unknown here)
    batched: bool  # one call per group (lists in, a list out), else one call per completion
    positional: bool  # its framework passes `lead` by position (a declared form whose names differ is called so)
    shape: str
    auto: bool = True  # recognised by its marker (else only when declared: it shares another form's names)


FORMS = {f.name: f for f in (
    Form("native", ("prompt", "completion"), "completion", None, batched=False, positional=True,
         shape="(prompt, completion, **row) -> float"),
    Form("cosmos", ("to_be_evaluated", "reference"), "to_be_evaluated", COSMOS_EXTRAS, batched=False,
         positional=True, shape="(to_be_evaluated, reference, *args, **kwargs) -> float | (float, dict)"),
    Form("trl", ("prompts", "completions"), "completions", None, batched=True, positional=False,
         shape="(prompts, completions, **kwargs) -> list[float]"),
    Form("cosmos-group", ("to_be_evaluated", "reference"), "to_be_evaluated", COSMOS_EXTRAS, batched=True,
         positional=True, auto=False,
         shape="(to_be_evaluated: list[str], reference, *args, **kwargs) -> list[float] | (list[float], list[dict])"),
    Form("verl", ("solution_str", "ground_truth"), "solution_str", ("data_source", "extra_info"), batched=False,
         positional=False, shape="(data_source, solution_str, ground_truth, extra_info, **kwargs) -> float | dict"),
)}
assert tuple(FORMS) == REWARD_SIGNATURES
MARKERS = {f.marker: f.name for f in FORMS.values() if f.auto}
EXPECTED = "; ".join(f"{f.name} {f.shape}" for f in FORMS.values() if f.auto)


class FormError(ValueError):
    pass


@dataclass(frozen=True)
class Binding:
    """How one reward function is called: its form; whether the form's two leading arguments go by
    position (then `lead_params` are the parameters taking them); the keyword names it accepts
    (None: any, it has **kwargs)."""
    form: Form
    lead_params: Optional[tuple[str, ...]]
    accepts: Optional[frozenset[str]]

    def call(self, fn: Callable[..., Any], first: Any, second: Any, extras: dict[str, Any]) -> Any:
        if self.lead_params is not None:
            return fn(first, second, **self._keep(extras, skip=self.lead_params))
        a, b = self.form.lead
        return fn(**self._keep({**extras, a: first, b: second}))

    def _keep(self, kwargs: dict[str, Any], skip: tuple[str, ...] = ()) -> dict[str, Any]:
        return {k: v for k, v in kwargs.items() if (self.accepts is None or k in self.accepts) and k not in skip}


_BY_NAME = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def bind(fn: Callable[..., Any], signature: str = "auto", args: Optional[dict[str, Any]] = None) -> Binding:
    """The Binding of `fn` declared as `signature` (auto: recognised by its parameter names);
    FormError says why it cannot be honoured. `args`: the keywords spec.rewards[i].args adds."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as e:
        raise FormError(f"has a signature that cannot be read ({e})") from None
    shape = "(" + ", ".join(str(p.replace(annotation=p.empty, default=p.empty)) for p in params) + ")"
    named = {p.name for p in params if p.kind in _BY_NAME}
    any_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    if signature == "auto":
        found = [m for m in MARKERS if m in named]
        if len(found) != 1:
            *rest, last = MARKERS
            why = (f"its parameters {' and '.join(found)} belong to different signatures" if found else
                   f"none of its parameters is named {', '.join(rest)} or {last}")
            raise FormError(f"takes {shape}: {why}. Write it as one of: {EXPECTED}; "
                            f"or declare its form with signature: {'|'.join(FORMS)}")
        signature = MARKERS[found[0]]
    form = FORMS[signature]
    lead_params = None
    if form.marker not in named:
        if not form.positional:
            if not any_kw:
                raise FormError(f"takes {shape}: a {form.name} reward is called with {form.marker}= (by name), "
                                f"which it does not accept. Expected {form.shape}")
        else:  # declared: the two leading arguments by position, as its framework passes them
            lead_params = tuple(p.name for p in params if p.kind in _POSITIONAL)[:2]
            if len(lead_params) < 2 and not any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
                raise FormError(f"takes {shape}: a {form.name} reward gets two arguments by position. "
                                f"Expected {form.shape}")
    accepts = None if any_kw else frozenset(named - set(lead_params or ()))
    args = args or {}
    unknown = [k for k in args if accepts is not None and k not in accepts]
    if unknown:
        raise FormError(f"takes {shape}: it has no parameter {', '.join(unknown)} (given in args)")
    # What every parameter gets: cosmos passes a fixed set; native and trl also pass the row's
    # fields, unknown until the data is read (a missing one fails the call, naming the reward).
    if form.extras is not None:
        given = {*form.extras, *args, *(form.lead if lead_params is None else lead_params)}
        missing = [p.name for p in params if p.default is p.empty and p.kind in _BY_NAME and p.name not in given]
        if missing:
            raise FormError(f"takes {shape}: its parameter {', '.join(missing)} would get no value; a "
                            f"{form.name} reward gets {', '.join(form.lead)}, {', '.join(form.extras)} "
                            f"and spec.rewards[].args. Expected {form.shape}")
    return Binding(form, lead_params, accepts)
