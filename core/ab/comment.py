"""The evidence markdown cut to fit where CI shows it (docs/architecture.md, "Results where CI
shows them"): a pull-request comment (under 65,536 characters) or a step summary (1 MiB); and
what a ``device-loop with`` says there (``command_markdown``).

What is cut, in turn, until it fits: the tables' rows (every table keeps as many as the
fit allows, the longest losing most), then the fenced blocks' lines, then, should that not
be enough, the document's end. Every cut says how much it left out and links the job's
page, which shows the whole. A cut never leaves a table or a fence open.

Sizes are counted in UTF-8 bytes: a document under N bytes is under N characters however a
forge counts them (code points, UTF-16 units).
"""
from __future__ import annotations

import re
import shlex
import urllib.parse
from dataclasses import dataclass

from device_loop.core.ab.evidence import fence, md, table, when
from device_loop.core.command_outcome import CommandOutcome

#: A comment on a GitHub pull request is at most 65,536 characters: the cut stays below.
PR_COMMENT_BYTES = 65_536
#: What a step may write to ``$GITHUB_STEP_SUMMARY`` (GitHub refuses a larger summary).
STEP_SUMMARY_BYTES = 1 << 20
_FENCE = re.compile(r"^(`{3,})")


@dataclass
class _Block:
    """Lines of the markdown: ``text``, a ``table`` (header, rule, rows) or a ``fence``."""
    kind: str
    lines: list[str]
    keep: int = -1              # rows (a table) or inner lines (a fence) kept; -1: all

    def body(self) -> list[str]:
        """The rows of a table, the lines inside a fence; nothing of text."""
        if self.kind == "table":
            return self.lines[2:]
        if self.kind == "fence":
            return self.lines[1:-1]
        return []

    def render(self, link: str) -> list[str]:
        body = self.body()
        if self.keep < 0 or self.keep >= len(body):
            return self.lines
        left = len(body) - self.keep
        if self.kind == "table":
            return [*self.lines[:2], *body[:self.keep], "", f"*{left} more row{'s' if left != 1 else ''} cut to fit: "
                                                          f"the whole table is on {link}.*"]
        return [self.lines[0], *body[:self.keep], self.lines[-1], "",
                f"*{left} more line{'s' if left != 1 else ''} cut to fit: the whole block is on {link}.*"]


def _blocks(markdown: str) -> list[_Block]:
    blocks: list[_Block] = []
    lines = markdown.split("\n")
    at = 0
    while at < len(lines):
        line = lines[at]
        opened = _FENCE.match(line)
        if opened:
            marks = opened.group(1)
            end = next((i for i in range(at + 1, len(lines)) if lines[i].startswith(marks)
                        and lines[i].strip("`").strip() == ""), None)
            if end is not None:
                blocks.append(_Block("fence", lines[at:end + 1]))
                at = end + 1
                continue
        if line.startswith("|") and at + 1 < len(lines) and re.match(r"^\|[\s|:-]+\|$", lines[at + 1]):
            end = at + 2
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            blocks.append(_Block("table", lines[at:end]))
            at = end
            continue
        if blocks and blocks[-1].kind == "text":
            blocks[-1].lines.append(line)
        else:
            blocks.append(_Block("text", [line]))
        at += 1
    return blocks


def _size(blocks: list[_Block], link: str) -> int:
    return len("\n".join(line for b in blocks for line in b.render(link)).encode())


def _cut(blocks: list[_Block], kind: str, budget: int, link: str) -> bool:
    """Keep at most K body lines of each block of ``kind``, the largest K that fits; False
    when even none fits."""
    cuttable = [b for b in blocks if b.kind == kind and b.body()]
    if not cuttable:
        return _size(blocks, link) < budget
    low, high = 0, max(len(b.body()) for b in cuttable)
    for b in cuttable:
        b.keep = 0
    if _size(blocks, link) >= budget:
        return False
    while low < high:                       # the largest K whose document fits
        middle = (low + high + 1) // 2
        for b in cuttable:
            b.keep = min(middle, len(b.body()))
        if _size(blocks, link) < budget:
            low = middle
        else:
            high = middle - 1
    for b in cuttable:
        b.keep = min(low, len(b.body()))
    return True


def page_link(job_url: str, job_id: str) -> str:
    """A markdown link to the job's page, or, without its address, the command that shows the
    whole evidence."""
    if not job_url:
        return f"`device-loop job evidence {job_id.replace('`', '')}`"
    safe = urllib.parse.quote(job_url, safe=":/?#@!$&'*+,;=%~-._")   # no parenthesis, space or bracket
    return f"[the job's page]({safe})"


def fit(markdown: str, budget_bytes: int, job_url: str, job_id: str) -> str:
    """``markdown`` in fewer than ``budget_bytes`` UTF-8 bytes: itself when it fits, else with
    its tables' rows cut, then its fenced blocks' lines, then its end, each cut saying so and
    linking the job's page."""
    if len(markdown.encode()) < budget_bytes:
        return markdown
    link = page_link(job_url, job_id)
    blocks = _blocks(markdown)
    if _cut(blocks, "table", budget_bytes, link) or _cut(blocks, "fence", budget_bytes, link):
        return "\n".join(line for b in blocks for line in b.render(link))
    # what is left past the cut tables and fences is too long: keep whole blocks (a text
    # block's lines one by one) while they fit
    notice = f"\n\n*The rest is cut to fit: the whole evidence is on {link}.*\n"
    room = budget_bytes - len(notice.encode())
    kept: list[str] = []
    used = -1                                   # bytes of "\n".join(kept)
    for block in blocks:
        lines = block.render(link) if block.kind != "text" else []
        cost = sum(len(line.encode()) + 1 for line in lines)
        if block.kind != "text":
            if used + cost >= room:
                break
            kept += lines
            used += cost
            continue
        for line in block.lines:
            if used + len(line.encode()) + 1 >= room:
                return "\n".join(kept) + notice
            kept.append(line)
            used += len(line.encode()) + 1
    return "\n".join(kept) + notice


#: Of a ``with``'s command line, what its markdown shows (a command line may be 1 MiB).
MAX_COMMAND_SHOWN = 2000


def command_markdown(outcome: CommandOutcome) -> str:
    """A ``device-loop with``'s outcome for a step summary or a comment: what ran, where, how
    it ended and whose failure it was, and how long each part took."""
    line = shlex.join(outcome.command)
    if len(line) > MAX_COMMAND_SHOWN:
        line = line[:MAX_COMMAND_SHOWN] + f" … ({len(line) - MAX_COMMAND_SHOWN} more characters)"
    if outcome.status == 0:
        verdict = "passed"
    elif outcome.cancelled:
        verdict = f"cancelled ({outcome.cancelled})"
    else:
        verdict = f"{outcome.failure.value if outcome.failure else 'test'} failure"
    t = outcome.timings
    rows = [["exit status", str(outcome.status)], ["result", md(verdict)],
            ["reason", md(outcome.reason or "-")], ["device", md(outcome.device or "-")],
            ["lease", md(outcome.lease or "-")],
            ["image", md(outcome.image or "-") + (" (flashed first)" if outcome.flashed else "")],
            ["started (UTC)", when(outcome.started_at or None)],
            ["waited / flashed / ran / in all", f"{t.wait_s:.1f} s / {t.flash_s:.1f} s / {t.run_s:.1f} s / "
                                                f"{t.total_s:.1f} s"]]
    return "\n".join([f"### device-loop with: {md(verdict)}", "", fence(line, "sh"), "",
                      table(["what", "said"], rows), ""])
