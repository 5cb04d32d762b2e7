"""What a job runs where and in which order, fixed before its first run (docs/architecture.md,
"The A/B analysis"): its cells (one, or one per matrix group), and each cell's arms run
after run: warmup blocks first, then ABAB, a seeded random order within each AB block, or
every A then every B."""
from __future__ import annotations

import random
from dataclasses import dataclass

from device_loop.core.ab.jobs import ABSpec, JobSpec, Order, Target, group_target
from device_loop.core.vocabulary import Arm

@dataclass(frozen=True)
class Cell:
    """One place a job runs: a device by name, or any device of a group."""
    index: int
    group: str       # the matrix's "tags=sve2", "" for a job's only cell
    target: Target


def cells(spec: JobSpec) -> list[Cell]:
    """The cells of a job, in the matrix's order (a job without a matrix has one, 0)."""
    if spec.matrix is None:
        return [Cell(0, "", spec.target)]
    return [Cell(n, group, group_target(group, spec.target)) for n, group in enumerate(spec.matrix.over)]


def _block(ab: ABSpec, block: int) -> list[Arm]:
    """One AB block's order: the seed and the block's number decide it, whatever came before."""
    if ab.order is Order.RANDOM and random.Random(ab.seed * 1_000_003 + block).random() < 0.5:
        return [Arm.B, Arm.A]
    return [Arm.A, Arm.B]


def warmup_arms(ab: ABSpec) -> list[Arm]:
    """The warmup runs: ``ab.warmup`` AB blocks, in the order's way (AABB warms up as ABAB)."""
    return [arm for block in range(ab.warmup) for arm in _block(ab, block)]


def measured_arms(ab: ABSpec, first_round: int, last_round: int) -> list[Arm]:
    """The measured runs of rounds ``first_round`` up to (not with) ``last_round``, counted
    from 0: rounds added by a later look are a segment of their own, so AABB stays every A
    then every B within each segment."""
    count = max(0, last_round - first_round)
    if ab.order is Order.AABB:
        return [Arm.A] * count + [Arm.B] * count
    return [arm for n in range(first_round, last_round) for arm in _block(ab, ab.warmup + n)]

