"""An answer as JSON, measured as it renders: on the event loop while it is small, the rest in a
thread (docs/architecture.md, "Shares of one lab"); and an agent's tool answer cut to a size.

No guess from one item: what a list's items weigh is what they render to, and runs are not
alike (a run's output tail and samples may be 128 KiB, or 300 bytes)."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

LARGE_ANSWER = 256 << 10  # bytes of JSON rendered on the event loop at most (past it: a thread)
PIECES_DEPTH = 2  # an answer's lists' items (a job's runs, a list's devices) are its pieces


def rendered(value: Any) -> bytes:
    """``value`` as JSONResponse renders it."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()


def pieces(value: Any, depth: int = PIECES_DEPTH) -> Iterator[bytes]:
    """``value`` rendered as ``rendered`` does, its lists' items and objects' values ``depth``
    levels down one by one: a thread rendering it lets the event loop's thread run between
    two (one ``json.dumps`` holds the interpreter until it ends), and a reader can stop."""
    if depth and isinstance(value, list):
        yield b"["
        for n, item in enumerate(value):
            if n:
                yield b","
            yield from pieces(item, depth - 1)
        yield b"]"
    elif depth and isinstance(value, dict) and value and all(isinstance(key, str) for key in value):
        # an object of scalars (a lease's answer) is one piece: only what holds a list is split
        if not any(isinstance(item, (list, dict)) for item in value.values()):
            yield rendered(value)
            return
        yield b"{"
        for n, (key, item) in enumerate(value.items()):
            yield (b"," if n else b"") + rendered(key) + b":"
            yield from pieces(item, depth - 1)
        yield b"}"
    else:
        yield rendered(value)


SMALL_ENTRIES = 64          # an answer of at most this many keys, items and values ...
SMALL_TEXT = 16 << 10       # ... whose texts are at most this many characters in all is small


def small(value: Any) -> bool:
    """Whether ``value`` is small for certain (rendered at once: a lease's answer): at most
    ``SMALL_ENTRIES`` keys, items and values and ``SMALL_TEXT`` characters of text, counted
    until either is passed (what renders to more is counted, not guessed)."""
    entries, text, todo = 0, 0, [value]
    while todo:
        item = todo.pop()
        entries += 1
        if isinstance(item, str):
            text += len(item)
        elif isinstance(item, (dict, list)):
            entries += len(item)
            if entries > SMALL_ENTRIES:  # (before a list of thousands is looked into)
                return False
            if isinstance(item, dict):
                text += sum(len(key) for key in item if isinstance(key, str))
                todo.extend(item.values())
            else:
                todo.extend(item)
        if entries > SMALL_ENTRIES or text > SMALL_TEXT:
            return False
    return True


async def answer_bytes(value: Any, bound: int = LARGE_ANSWER) -> bytes:
    """``value`` rendered: a small one at once, others in pieces on the event loop until they
    pass ``bound`` bytes, the rest in a thread. At most ``bound`` and one piece (a run: 128 KiB
    as reported) are rendered on the loop, whatever the answer."""
    if small(value):
        return rendered(value)
    parts = pieces(value)
    head: list[bytes] = []
    size = 0
    for part in parts:
        head.append(part)
        size += len(part)
        if size > bound:
            head.append(await asyncio.to_thread(b"".join, parts))  # the generator goes on there
            break
    return b"".join(head)


def larger_than(value: Any, bound: int) -> bool:
    """Whether ``value`` renders to more than ``bound`` bytes: rendered in pieces until it has
    (never more than ``bound`` and one piece)."""
    size = 0
    for part in pieces(value):
        size += len(part)
        if size > bound:
            return True
    return False


def _fitting(items: list[Any], bound: int) -> int:
    """How many of ``items``, from the first, render to at most ``bound`` bytes (at least one, so
    that a page always goes on)."""
    size = 0
    for n, item in enumerate(items):
        size += len(rendered(item)) + 1
        if size > bound:
            return max(n, 1)
    return len(items)


async def cut_to(answer: Any, bound: int, cursor: Callable[[dict[str, Any]], str]) -> Any:
    """``answer`` with its list cut to about ``bound`` bytes, saying where it goes on: a job's
    runs (``runs`` with ``runs_next``, or a page's ``next``: the cursor after the last kept,
    ``cursor(run)``), or a list's first items (what an agent narrows with its filters). An
    answer within ``bound`` is as it was; measuring it renders at most ``bound`` on the loop,
    cutting it is done in a thread."""
    if not larger_than(answer, bound):
        return answer
    if isinstance(answer, list):
        return answer[:await asyncio.to_thread(_fitting, answer, bound)]
    runs = answer.get("runs") if isinstance(answer, dict) else None
    if not isinstance(runs, list):
        return answer  # (no list to cut: an answer of fixed fields)
    kept = runs[:await asyncio.to_thread(_fitting, runs, bound)]
    if len(kept) == len(runs):
        return answer
    goes_on = "next" if "next" in answer else "runs_next"
    return {**answer, "runs": kept, goes_on: cursor(kept[-1])}
