"""The greedy-baseline workflow's baseline (ReMax): advantages are measured against the reward
of the greedy completion instead of the group's own mean."""
import pytest

from grpojob.algorithms.advantages import compute


def test_external_baseline_replaces_the_group_mean():
    adv = compute([[1.0, 0.0, 0.5]], normalization="none", external=[0.5])
    assert adv == [[0.5, -0.5, 0.0]]


def test_equal_rewards_still_differ_from_a_greedy_baseline():
    # every sample beat the greedy completion: all pushed up (the group mean would give 0)
    assert compute([[1.0, 1.0]], normalization="group", external=[0.0]) == [[1.0, 1.0]]
    assert compute([[1.0, 1.0]], normalization="group") == [[0.0, 0.0]]


def test_group_normalisation_scales_by_the_group_std():
    adv = compute([[2.0, 0.0]], normalization="group", external=[1.0])
    std = 2 ** 0.5  # sample std of (2, 0)
    assert adv[0] == pytest.approx([1 / std, -1 / std], rel=1e-5)


def test_groups_without_a_baseline_keep_their_own():
    adv = compute([[1.0, 0.0], [1.0, 0.0]], normalization="none", external=[None, 0.0])
    assert adv == [[0.5, -0.5], [1.0, 0.0]]
