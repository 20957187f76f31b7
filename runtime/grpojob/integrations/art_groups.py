"""ART trajectories -> the trajectory API's groups (grpojob.integrations.art), with the exact tokens.

A trajectory's trained turns are its `Choice`s with log-probs. Through the backend's endpoint
(art_endpoint) every choice carries what the rollout server served: `prompt_token_ids`,
`token_ids`, `policy_version` (and `token_versions` when a weight push landed mid-generation), and
log-prob entries written `"token_id:N"`. A trajectory becomes one sequence:

    prompt of turn 1 | tokens of turn 1 | context | tokens of turn 2 | ...

where each later turn's prompt must start with the previous prompt and tokens (the chat template
rendered the history as it was served); the rest of that prompt (the template's end of the
assistant turn, user and tool messages) is context, loss mask 0. A turn whose prompt does not
continue the previous one (the script rewrote the history) cannot be trained on exactly, so the
trajectory is refused with that reason (ART's own tokenizer would re-render it: inexact). The
group's prompt is the tokens every trajectory starts with; what differs before each one's first
trained token is masked context of its completion. Nothing here imports ART: the objects are read
by their attributes (pydantic models of `openai` and `art`).
"""
from __future__ import annotations

from typing import Any, Optional

from grpojob.integrations.episodes import Episode, EpisodeError, to_completion

__all__ = ["EpisodeError", "group_doc", "trajectory_episode"]


def _extra(choice: Any) -> dict[str, Any]:
    return dict(getattr(choice, "model_extra", None) or {})


def _is_choice(item: Any) -> bool:
    return not isinstance(item, dict) and hasattr(item, "message") and hasattr(item, "logprobs")


def _ids_from_entries(entries: list[Any]) -> Optional[list[int]]:
    ids = []
    for e in entries:
        token = getattr(e, "token", "") or ""
        if not token.startswith("token_id:"):
            return None
        ids.append(int(token.split(":", 1)[1]))
    return ids


def _turn(choice: Any, i: int) -> tuple[list[int], list[int], list[float], list[int], str]:
    """(prompt ids, token ids, log-probs, versions, finish_reason) of one trained choice."""
    extra = _extra(choice)
    entries = list(getattr(choice.logprobs, "content", None) or [])
    ids = extra.get("token_ids")
    from_entries = _ids_from_entries(entries)
    if ids is None:
        ids = from_entries
    prompt = extra.get("prompt_token_ids")
    if ids is None or prompt is None:
        raise EpisodeError(f"turn {i}: the choice has no token ids from the rollout server (prompt_token_ids, "
                           "token_ids): sample through the model's client (model.openai_client(), or "
                           "model.inference_base_url), which the grpojob backend points at the job")
    if from_entries is not None and from_entries != list(ids):
        raise EpisodeError(f"turn {i}: its log-prob entries' token ids differ from its token_ids")
    if len(entries) != len(ids):
        raise EpisodeError(f"turn {i}: {len(entries)} log-prob entries for {len(ids)} tokens")
    versions = extra.get("token_versions") or [int(extra.get("policy_version") or 0)] * len(ids)
    finish = "length" if getattr(choice, "finish_reason", "stop") == "length" else "stop"
    return list(prompt), list(ids), [float(e.logprob) for e in entries], [int(v) for v in versions], finish


def trajectory_episode(traj: Any) -> Episode:
    """One ART Trajectory as an Episode (prompt, then every later token with its mask)."""
    if getattr(traj, "additional_histories", None):
        raise EpisodeError("additional_histories (several conversations in one trajectory) are not supported by "
                           "the grpojob backend: make each conversation a trajectory of its own")
    turns = [m for m in traj.messages_and_choices if _is_choice(m) and m.logprobs is not None]
    if not turns:
        raise EpisodeError("no trained turn: a trajectory needs a Choice with log-probs (the backend's endpoint "
                           "returns them for every request)")
    prompt, ids, lps, vers, finish = _turn(turns[0], 0)
    seq, mask, logprobs, versions = list(ids), [1] * len(ids), list(lps), list(vers)
    for i, choice in enumerate(turns[1:], start=1):
        p, ids, lps, vers, finish = _turn(choice, i)
        served = prompt + seq
        if p[:len(served)] != served:
            raise EpisodeError(f"turn {i}: its prompt does not continue the tokens of the turns before it (the "
                               "history was rewritten or rendered differently): not exact, so not trained on")
        context = p[len(served):]
        seq += context + ids
        mask += [0] * len(context) + [1] * len(ids)
        logprobs += [0.0] * len(context) + lps
        versions += [versions[-1]] * len(context) + vers
    return Episode(prompt_ids=prompt, completion_ids=seq, logprobs=logprobs, loss_mask=mask, versions=versions,
                   reward=float(traj.reward), finish_reason=finish)


def _common(prompts: list[list[int]]) -> list[int]:
    first = prompts[0]
    n = min(len(p) for p in prompts)
    for k in range(n):
        if any(p[k] != first[k] for p in prompts):
            return first[:k]
    return first[:n]


def _parts(trajectories: list[Any]) -> dict[str, list[float]]:
    """Numeric metrics every trajectory of the group has, as reward parts; durations and token counts
    (ART's own completion_tokens, prompt_tokens) left out."""
    keys = set.intersection(*(set(getattr(t, "metrics", None) or {}) for t in trajectories))
    out = {}
    for k in sorted(keys):
        values = [t.metrics[k] for t in trajectories]
        if not k.endswith(("duration", "_tokens")) and all(isinstance(v, (int, float)) for v in values):
            out[k] = [float(v) for v in values]
    return out


def group_doc(trajectories: list[Any], tokenizer: Any = None) -> dict[str, Any]:
    """The trajectory API's group (docs/environments.md) of one ART TrajectoryGroup's trajectories."""
    episodes = [trajectory_episode(t) for t in trajectories]
    prompt = _common([e.prompt_ids for e in episodes])
    if not prompt:
        raise EpisodeError("the group's trajectories share no prompt token")
    completions = []
    for e in episodes:
        rest = e.prompt_ids[len(prompt):]
        c = to_completion(Episode(prompt_ids=prompt, completion_ids=rest + e.completion_ids,
                                  logprobs=[0.0] * len(rest) + e.logprobs, loss_mask=[0] * len(rest) + e.mask(),
                                  versions=[e.versions[0]] * len(rest) + e.versions, reward=e.reward,
                                  finish_reason=e.finish_reason), tokenizer)
        completions.append({"token_ids": c.completion_ids, "logprobs": c.logprobs, "policy_version": c.policy_version,
                            "versions": c.versions, "loss_mask": c.loss_mask, "finish_reason": c.finish_reason,
                            "text": c.text})
    return {"prompt_ids": prompt, "completions": completions, "rewards": [float(e.reward) for e in episodes],
            "reward_parts": _parts(trajectories)}
