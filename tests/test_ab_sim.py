"""A/B pairs on simulated boards (docs/architecture.md, "The A/B analysis"): the order of the
runs is fixed before the first one; with B truly 5 % cheaper, ABAB with settle recovers the
5 % and says faster, while AABB without settle, on the same seed, does not."""
from __future__ import annotations

import pytest

from device_loop.client.schedule import cells, group_target, measured_arms, warmup_arms
from device_loop.core.jobs import ABSpec, JobSpec, Target

pytestmark = pytest.mark.timeout(120)


def ab(**fields) -> ABSpec:
    return ABSpec(baseline=["a"], patch=["b"], **fields)


def test_the_order_of_runs_is_fixed_by_the_spec_alone():
    assert "".join(warmup_arms(ab(warmup=2)) + measured_arms(ab(warmup=2), 0, 3)) == "ABABABABAB"
    assert "".join(measured_arms(ab(order="aabb"), 0, 3)) == "AAABBB"
    assert "".join(warmup_arms(ab(order="aabb"))) == "AB"
    shuffled = ab(order="random", seed=7, rounds=40)
    blocks = "".join(measured_arms(shuffled, 0, 40))
    assert sorted(blocks[i:i + 2] for i in range(0, 80, 2)) != ["AB"] * 40, "some blocks are BA"
    assert all(sorted(blocks[i:i + 2]) == ["A", "B"] for i in range(0, 80, 2)), "each block has one A and one B"
    assert blocks == "".join(measured_arms(shuffled, 0, 40)), "the same seed, the same order"
    assert blocks[:40] + "".join(measured_arms(shuffled, 20, 40)) == blocks, "a later look goes on where it stopped"
    assert blocks != "".join(measured_arms(ab(order="random", seed=8, rounds=40), 0, 40))


def test_matrix_groups_and_their_refusals():
    spec = JobSpec(target=Target(device_class="sim-board"), ab=ab(),
                   matrix={"over": ["tags=sve2", "tags=rvv,fast", "class=other", "device=d1"]})
    assert [(c.index, c.group, c.target.device_class, c.target.tags, c.target.device) for c in cells(spec)] == [
        (0, "tags=sve2", "sim-board", ["sve2"], None), (1, "tags=rvv,fast", "sim-board", ["rvv", "fast"], None),
        (2, "class=other", "other", [], None), (3, "device=d1", None, [], "d1")]
    for bad in ("sve2", "tags=", "colour=red", "=x"):
        with pytest.raises(ValueError, match="tags=a,b, class=C or device=D"):
            group_target(bad, Target())
    with pytest.raises(ValueError, match="names a device"):
        group_target("tags=x", Target(device="d0"))
