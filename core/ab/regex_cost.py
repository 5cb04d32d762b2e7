"""What a regex can cost RE2 for each byte it reads (docs/architecture.md, "Jobs and
evidence"): a metric's regex is its job owner's to write, and a worker reads it over up to a
MiB of output a command.

RE2 reads a text in one pass, but where its DFA needs too many states (it builds one a byte,
then gives up for its NFA), and within each match (where it finds the groups), it works at
each byte for every place of the regex that can be matching there: a place is one
character, class or ``.``, each copy of a repetition counted (``(.*a){20}`` has 40). Each
place matching at once cost 10 to 45 ms of CPU a MiB of output on a busy 2-core machine;
no output makes more places match at once than ``at_once`` says. Regexes people write keep
a handful; ``(.*a){20}`` keeps all 40 in a run of a's.

The places and what may follow what come from Python's own parse of the regex (RE2 gives no
parse tree; a metric's regex is Python's as well as RE2's, and where the two differ, in
``\\d`` for instance, Python's reading takes in more characters: a bound on it bounds RE2's).
Characters past ASCII are one symbol, which each place that takes any of them takes.
"""
from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable, Iterator
from typing import Any

_parser: Any = importlib.import_module("re._parser")  # (the parser of Python's re, private but stable)

#: A regex's places, its repetitions counted, past which it is not looked at further.
MAX_PLACES = 1000
#: The states of a regex's automaton looked at (RE2's DFA keeps some thousands in its 8 MiB),
#: and the places followed in all, before its bound comes from its last bytes alone.
_MAX_STATES = 2000
_MAX_WORK = 50_000
_FEW = 16  # places in a state followed one by one (past it, 8 at a time)
#: The bytes of context that bound places matching at once when its states are too many.
_MAX_CONTEXT = 8
_NON_ASCII = 128  # the symbol of every character past ASCII
_SYMBOLS = 129
_ALL_ASCII = (1 << 128) - 1


def _ascii_where(test: Callable[[str], bool]) -> int:
    return sum(1 << code for code in range(128) if test(chr(code)))


_LETTERS = _ascii_where(str.isalpha)
#: Python's \d, \s and \w over ASCII (past it, each takes some characters).
_CATEGORIES = {
    "CATEGORY_DIGIT": _ascii_where(str.isdigit),
    "CATEGORY_SPACE": _ascii_where(str.isspace),
    "CATEGORY_WORD": _ascii_where(lambda c: c.isalnum() or c == "_"),
}


class Unbounded(ValueError):
    """What the regex costs is not bounded here: it has more than ``MAX_PLACES`` places (or
    steps to read them), or a part this does not know."""


def at_once(regex: str, limit: int) -> int:
    """The most places of ``regex`` that RE2 may have matching at once at a byte of any text,
    where that is at most ``limit``; else a number above ``limit``. ``Unbounded`` past
    ``MAX_PLACES``; ``ValueError`` for a regex Python's ``re`` does not read.

    Where RE2's automata have few states (forwards, a match starting at each byte; and
    backwards, from a match's end to its start), it reads the text a state a byte, however
    many places a state has, and place by place only within a match, from its start: those
    places count. Otherwise it may read the text place by place (its NFA, or its DFA building
    a state a byte): every place some text makes match at once counts, a match starting at
    each byte (where there are too many states to look at, every place the last bytes allow)."""
    try:
        tree = _parser.parse(regex)
    except re.error as exc:
        raise ValueError(str(exc)) from None
    forwards, backwards = _Places(backwards=False), _Places(backwards=True)
    forwards_first = forwards.sequence(tree.data, tree.state.flags)[0]
    backwards_first = backwards.sequence(tree.data, tree.state.flags)[0]
    searched, search_all = forwards.explore(forwards_first, anchored=False)
    started, start_all = backwards.explore(backwards_first, anchored=True)
    if search_all and start_all:
        within_a_match, complete = forwards.explore(forwards_first, anchored=True)
        if complete:
            return within_a_match
    if not search_all and searched <= limit:
        searched = forwards.bounded_by_context(forwards_first, limit)
    if not start_all and started <= limit:
        started = backwards.bounded_by_context(backwards_first, limit)
    return max(searched, started)


def _bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


@functools.lru_cache(maxsize=4096)
def _accepts(op: Any, av: Any, ignore_case: bool, dot_all: bool) -> int:
    """The symbols (a mask of ASCII's 128, and ``_NON_ASCII``) one place takes."""
    past_ascii = 1 << _NON_ASCII
    if op is _parser.ANY:
        return (_ALL_ASCII if dot_all else _ALL_ASCII & ~(1 << ord("\n"))) | past_ascii
    if op is _parser.LITERAL or op is _parser.NOT_LITERAL:
        items, negate = ((_parser.LITERAL, av),), op is _parser.NOT_LITERAL
    elif op is _parser.IN:
        negate = any(item_op is _parser.NEGATE for item_op, _ in av)
        items = tuple(item for item in av if item[0] is not _parser.NEGATE)
    else:
        raise Unbounded(f"it has a part this does not bound: {op}")
    mask, wide = 0, negate  # (a negated class takes every character past ASCII but few)
    for item_op, item in items:
        if item_op is _parser.CATEGORY:
            name = str(item)
            positive = _CATEGORIES.get(name.replace("_NOT", ""))
            if positive is None:
                raise Unbounded(f"it has a class this does not bound: {name}")
            mask |= _ALL_ASCII & ~positive if "_NOT" in name else positive
            wide = True
            continue
        if item_op is _parser.LITERAL:
            low = high = item
        elif item_op is _parser.RANGE:
            low, high = item
        else:
            raise Unbounded(f"it has a part of a class this does not bound: {item_op}")
        mask |= sum(1 << code for code in range(low, min(high, 127) + 1))
        wide |= high > 127
        if ignore_case and high > 127:  # (K, the Kelvin sign, is k's other case)
            mask |= _LETTERS
    if ignore_case:
        mask |= sum(1 << ord(chr(code).swapcase()) for code in _bits(mask & _LETTERS))
        wide |= bool(mask & _LETTERS)
    if negate:
        mask = _ALL_ASCII & ~mask
    return mask | (past_ascii if wide else 0)


class _Places:
    """A regex's places (Glushkov's construction, read forwards or backwards): the symbols
    each takes, and the places that may come after each."""

    def __init__(self, backwards: bool):
        self.backwards = backwards
        self.accepts: list[int] = []
        self.follow: list[int] = []
        self.steps = 0  # parts read and places linked: bounded too, past MAX_PLACES' bound

    def sequence(self, items: list, flags: int) -> tuple[int, int, bool]:
        """The places a sequence may begin and end with, and whether it may match nothing."""
        first, last, empty = 0, 0, True
        for op, av in (reversed(items) if self.backwards else items):
            node_first, node_last, node_empty = self._node(op, av, flags)
            self._link(last, node_first)
            first |= node_first if empty else 0
            last = node_last | (last if node_empty else 0)
            empty = empty and node_empty
        return first, last, empty

    def _link(self, last: int, first: int) -> None:
        if first and last:
            self._step(last.bit_count())
            for place in _bits(last):
                self.follow[place] |= first

    def _step(self, steps: int) -> None:
        self.steps += steps
        if self.steps > _MAX_WORK:
            raise Unbounded(f"its parts and what may follow what make more than {_MAX_WORK} steps to read, "
                                f"its repetitions counted")

    def _node(self, op: Any, av: Any, flags: int) -> tuple[int, int, bool]:
        self._step(1)
        if op is _parser.SUBPATTERN:
            _, add, remove, sub = av
            return self.sequence(sub.data, (flags | add) & ~remove)
        if op is _parser.ATOMIC_GROUP:
            return self.sequence(av.data, flags)
        if op is _parser.BRANCH:
            first, last, empty = 0, 0, False
            for alternative in av[1]:
                alt_first, alt_last, alt_empty = self.sequence(alternative.data, flags)
                first, last, empty = first | alt_first, last | alt_last, empty or alt_empty
            return first, last, empty
        # (POSSESSIVE_REPEAT: Python reads RE2's a{,3}+, a literal "a{,3" then "}" repeated, as one)
        if op in (_parser.MAX_REPEAT, _parser.MIN_REPEAT, _parser.POSSESSIVE_REPEAT):
            low, high, sub = av
            return self._repeat(low, high, sub, flags)
        if op is _parser.AT:  # (an anchor matches no character: taking it as nothing bounds more texts)
            return 0, 0, True
        if len(self.accepts) >= MAX_PLACES:
            raise Unbounded(f"it has more than {MAX_PLACES} places to match, its repetitions counted")
        self.accepts.append(_accepts(op, tuple(av) if isinstance(av, list) else av,
                                     bool(flags & _parser.SRE_FLAG_IGNORECASE), bool(flags & _parser.SRE_FLAG_DOTALL)))
        self.follow.append(0)
        place = 1 << (len(self.accepts) - 1)
        return place, place, False

    def _repeat(self, low: int, high: int, sub: Any, flags: int) -> tuple[int, int, bool]:
        """``sub{low,high}`` as RE2 has it, ``sub`` ``low`` times then each further copy
        optional within the one before, the last copy looping when there is no ``high``."""
        endless = high is _parser.MAXREPEAT
        copies = max(low, 1) if endless else high
        first, last, chain_last, chain_empty, empty = 0, 0, 0, True, low == 0
        for copy in range(copies):
            copy_first, copy_last, copy_empty = self.sequence(sub.data, flags)
            if endless and copy == copies - 1:
                self._link(copy_last, copy_first)
            self._link(chain_last, copy_first)
            first |= copy_first if chain_empty else 0
            chain_last = copy_last | (chain_last if copy_empty else 0)
            chain_empty = chain_empty and copy_empty
            if copy >= low - 1:  # (it may end after this copy)
                last |= chain_last
                empty = empty or chain_empty
        return first, last, empty

    def explore(self, first: int, anchored: bool) -> tuple[int, bool]:
        """The most places matching at once over the states (the sets of places matching at
        once after some text) reachable from the start, a new match starting at every byte
        unless ``anchored``; and whether those were all of them (else there were more than
        ``_MAX_STATES``, or more than ``_MAX_WORK`` to follow them)."""
        symbols = self._symbols
        new_each_byte = 0 if anchored else first
        seen = {0}
        pending = [first]  # what may match the next byte, after each state not yet followed
        most, work = 0, 0
        while pending:
            may = pending.pop()
            for takes in symbols:
                state = may & takes
                if state in seen:
                    continue
                seen.add(state)
                most, work = max(most, state.bit_count()), work + self._cost(state)
                if len(seen) > _MAX_STATES or work > _MAX_WORK:
                    return most, False
                pending.append(self._next(new_each_byte, state))
        return most, True

    def bounded_by_context(self, first: int, limit: int) -> int:
        """A bound on the places matching at once, from the last bytes read alone: whatever
        came before them, what matches is within what would, had every place been matching
        before them. At most ``limit`` if the last ``_MAX_CONTEXT`` bytes show it."""
        symbols = self._symbols
        level, most, work = {(1 << len(self.accepts)) - 1}, len(self.accepts), 0
        for _ in range(_MAX_CONTEXT):
            below: set[int] = set()
            for state in level:
                below.update(self._next(first, state) & takes for takes in symbols)
                work += self._cost(state)
                if len(below) > _MAX_STATES or work > _MAX_WORK:
                    return most
            level = below
            most = max((state.bit_count() for state in level), default=0)
            if most <= limit:
                break
        return most

    def _next(self, new_each_byte: int, state: int) -> int:
        """What may match the byte after ``state``."""
        may = new_each_byte
        if state.bit_count() <= _FEW:
            for place in _bits(state):
                may |= self.follow[place]
            return may
        for chunk, byte in enumerate(state.to_bytes(len(self._follow_by_byte), "little")):
            if byte:
                may |= self._follow_by_byte[chunk][byte]
        return may

    def _cost(self, state: int) -> int:
        """The work ``_next`` does for ``state``, and taking each symbol after it."""
        count = state.bit_count()
        return (count if count <= _FEW else len(self._follow_by_byte)) + len(self._symbols)

    @functools.cached_property
    def _follow_by_byte(self) -> list[list[int]]:
        """For each 8 places, what may follow each set of them (a byte of a state)."""
        tables = []
        for chunk in range((len(self.follow) + 7) // 8):
            follow = self.follow[chunk * 8:chunk * 8 + 8]
            table = [0] * 256
            for byte in range(1, 1 << len(follow)):
                low = byte & -byte
                table[byte] = table[byte ^ low] | follow[low.bit_length() - 1]
            tables.append(table)
        return tables

    @functools.cached_property
    def _symbols(self) -> list[int]:
        """For each symbol (characters no place tells apart are one), the places that take it."""
        by_accepts: dict[int, int] = {}
        for place, accepts in enumerate(self.accepts):
            by_accepts[accepts] = by_accepts.get(accepts, 0) | 1 << place
        takers: dict[int, None] = {}
        for symbol in range(_SYMBOLS):
            places = 0
            for accepts, those in by_accepts.items():
                if accepts >> symbol & 1:
                    places |= those
            takers[places] = None
        return [places for places in takers if places]
