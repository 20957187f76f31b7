"""The shared episodes -> groups converter: exact tokens, masks, log-probs and versions."""
import pytest

from grpojob.contracts.rollout import Sample
from grpojob.integrations.episodes import Episode, EpisodeError, from_sequence, to_completion, to_group

SAMPLE = Sample(index=3, prompt="p", prompt_ids=[1, 2])


def test_a_multi_turn_sequence_splits_at_the_first_trained_token_and_keeps_its_masks():
    # prompt 5 6 | policy 7 8 | tool 9 | policy 10   (AReaL's layout: -1 versions where not the policy's)
    ep = from_sequence([5, 6, 7, 8, 9, 10], [0, 0, 1, 1, 0, 1], [0, 0, -0.5, -0.25, 0, -1.0],
                       versions=[-1, -1, 3, 3, -1, 4], reward=1.0)
    c = to_completion(ep)
    assert (c.prompt_ids, c.completion_ids, c.loss_mask) == ([5, 6], [7, 8, 9, 10], [1, 1, 0, 1])
    assert c.logprobs == [-0.5, -0.25, 0.0, -1.0]
    assert c.versions == [3, 3, 3, 4] and c.policy_version == 3  # the oldest trained token's
    assert c.reward == 1.0


def test_one_version_and_an_all_trained_mask_are_left_implicit():
    c = to_completion(Episode([1], [4, 5], [-0.1, -0.2], loss_mask=[1, 1], versions=[2, 2]))
    assert c.loss_mask is None and c.versions is None and c.policy_version == 2 and c.reward is None


def test_rejected_episodes_are_left_out_and_a_group_of_none_is_refused():
    g = to_group(SAMPLE, [None, Episode([1], [4], [-0.1]), None])
    assert len(g.completions) == 1 and g.sample is SAMPLE
    with pytest.raises(EpisodeError, match="every episode of sample 3 was rejected"):
        to_group(SAMPLE, [None, None])


@pytest.mark.parametrize("ep, why", [
    (Episode([1], [4, 5], [-0.1]), "2 completion tokens has 1 log-probs"),
    (Episode([1], [4], [-0.1], loss_mask=[0]), "no token of the policy's"),
    (Episode([], [4], [-0.1]), "empty prompt"),
])
def test_an_episode_that_does_not_fit_says_why(ep, why):
    with pytest.raises(EpisodeError, match=why):
        to_completion(ep)


def test_a_sequence_without_a_trained_token_is_refused():
    with pytest.raises(EpisodeError, match="no trained token"):
        from_sequence([1, 2], [0, 0])
