"""How ``./lab test`` spreads the suite over its workers: pytest-xdist's work stealing
(``--dist worksteal``) with two rules of this suite (conftest.py hands it to xdist).

- The longest tests (conftest ``LONGEST_FIRST``) are dealt out first, in turn, one share at
  the head of each worker's first batch. Work stealing alone gives the first worker the
  first part of the collection, where the longest stand together: it runs them one after
  another while the others steal from its tail, so the longest begin late and end the run.
- A module whose tests share a costly module fixture (conftest ``KEPT_TOGETHER``: a lab of
  VMs booted under TCG, CPU-bound) is never split between workers, which would each set the
  fixture up: it is dealt, sent and stolen whole.
"""
from __future__ import annotations

from collections.abc import Sequence

from xdist.scheduler import WorkStealingScheduling
from xdist.scheduler.worksteal import MIN_PENDING


def module_of(nodeid: str) -> str:
    """The test file of a test id, as its file's name."""
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1]


def longest_units(collection: Sequence[str], longest: Sequence[str], kept: Sequence[str]) -> list[list[int]]:
    """The indices of ``collection``'s longest tests (those a name of ``longest`` is part of,
    in its order), as units dealt to one worker each: a test, or a kept-together module's
    tests (all of them, in their order)."""
    units: list[list[int]] = []
    taken: set[int] = set()
    for name in longest:
        for index, nodeid in enumerate(collection):
            if index in taken or name not in nodeid:
                continue
            module = module_of(nodeid)
            unit = [i for i, other in enumerate(collection) if module_of(other) == module] \
                if module in kept else [index]
            taken.update(unit)
            units.append(unit)
    return units


def dealt(order: Sequence[int], units: list[list[int]], workers: int) -> list[int]:
    """``order`` (indices) arranged so that xdist's first distribution (the head of what is
    left, ``len(left) // workers_left`` tests, to each worker in turn) begins each worker's
    batch with its share of ``units``, dealt in turn; the rest follow in their order."""
    shares: list[list[int]] = [[] for _ in range(workers)]
    for n, unit in enumerate(units):
        shares[n % workers] += unit
    heads = {i for share in shares for i in share}
    rest = [i for i in order if i not in heads]
    arranged: list[int] = []
    for worker, share in enumerate(shares):
        size = (len(order) - len(arranged)) // (workers - worker)
        filled = max(0, size - len(share))
        arranged += share + rest[:filled]
        rest = rest[filled:]
    return arranged + rest


class SuiteStealing(WorkStealingScheduling):
    """xdist's work stealing, dealing the longest tests first and keeping ``kept`` modules whole."""

    def __init__(self, config, log=None, *, longest: Sequence[str] = (), kept: Sequence[str] = ()) -> None:
        super().__init__(config, log)
        self.longest, self.kept = tuple(longest), frozenset(kept)
        self.dealt_out = False

    def _kept_module(self, index: int) -> str | None:
        assert self.collection is not None
        module = module_of(self.collection[index])
        return module if module in self.kept else None

    def _splits(self, indices: list[int], cut: int) -> bool:
        """Cutting ``indices`` before ``cut`` would split a kept-together module."""
        return 0 < cut < len(indices) and (module := self._kept_module(indices[cut])) is not None \
            and module == self._kept_module(indices[cut - 1])

    def _whole(self, indices: list[int], cut: int, step: int = 1) -> int:
        """``cut`` moved past (``step`` 1) or before (-1) the kept-together module it would split."""
        while self._splits(indices, cut):
            cut += step
        return cut

    def check_schedule(self) -> None:
        """xdist's ``WorkStealingScheduling.check_schedule`` (3.x), with this suite's two rules."""
        nodes_up = [(node, pending) for node, pending in self.node2pending.items() if not node.shutting_down]

        def idle() -> list:
            return [node for node, pending in nodes_up if len(pending) < MIN_PENDING]

        idle_nodes = idle()
        if not idle_nodes:
            return
        if self.pending:
            if not self.dealt_out and self.collection is not None:
                self.dealt_out = True
                units = longest_units(self.collection, self.longest, self.kept)
                self.pending[:] = dealt(self.pending, units, len(idle_nodes))
            for n, node in enumerate(idle_nodes):
                self._send_tests(node, self._whole(self.pending, len(self.pending) // (len(idle_nodes) - n)))
            idle_nodes = idle()
            if not idle_nodes:
                return
        if self.steal_requested_from_node is not None:
            return
        # from the longest queue that has some to give: half of it, from its tail, but at
        # least its running test and the next stay; never part of a kept-together module
        for node, pending in sorted(nodes_up, key=lambda up: len(up[1]), reverse=True):
            count = min(len(pending) // 2, max(0, len(pending) - MIN_PENDING))
            start = self._whole(pending, len(pending) - count, -1) if count else len(pending)
            if start < MIN_PENDING:  # (the module's first test runs, or is next: it stays)
                start = self._whole(pending, len(pending) - count)
            if start < len(pending):
                node.send_steal(pending[start:])
                self.steal_requested_from_node = node
                return
        for node in idle_nodes:  # nothing more to give them: they end once their last test has run
            node.shutdown()
