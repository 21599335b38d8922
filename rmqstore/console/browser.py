"""The message browser: a topic's queues merged by store time, paged by positions (one
queue offset per queue), so links are stable and nothing is skipped or repeated; time seeks
by binary search on the consume queues; tag and content filters bounded per page."""
from __future__ import annotations

import heapq
import threading
import time
from typing import Any, Iterator

from rmqstore import MessageExt, MessageStore
from rmqstore.console import limits
from rmqstore.console.filters import ContentFilter, searchable, tag_set
from rmqstore.console.views import summary
from rmqstore.errors import InvalidArgumentError

SCAN_SLOTS = 1   # filtered scans at a time: the interpreter runs one at once anyway
_SCAN_SLOTS = threading.BoundedSemaphore(SCAN_SLOTS)

def parse_positions(text: str) -> dict[int, int]:
    """``0:12,1:40`` -> {0: 12, 1: 40}: a page's start, one queue offset per queue."""
    out = {}
    for part in text.split(","):
        q, sep, o = part.partition(":")
        if not (sep and q.isdigit() and o.isdigit() and q.isascii() and o.isascii()):
            raise InvalidArgumentError(f"positions must be queue:offset pairs joined by ',', not {text!r}")
        out[int(q)] = int(o)
    return out


def format_positions(pos: dict[int, int]) -> str:
    """A page's positions as its links carry them, ``queue:offset`` joined by ``,`` (parse_positions reads them)."""
    return ",".join(f"{q}:{o}" for q, o in sorted(pos.items()))


def _queue_reader(s: MessageStore, topic: str, q: int, start: int, forward: bool) -> Iterator[MessageExt]:
    """A queue's messages from ``start`` (forward: up; else down from ``start - 1``)."""
    lo, hi = s.min_offset(topic, q), s.max_offset(topic, q)
    if forward:
        pos = max(start, lo)
        while pos < hi:
            r = s.get_messages(topic, q, pos, limits.CHUNK)
            yield from r.messages
            if r.next_offset <= pos:
                return
            pos = r.next_offset
    else:
        pos = min(start, hi)
        while pos > lo:
            begin = max(lo, pos - limits.CHUNK)
            chunk: list[MessageExt] = []
            at = begin
            while at < pos:   # getMessage returns at most its transfer limit a call
                r = s.get_messages(topic, q, at, pos - at)
                chunk.extend(m for m in r.messages if m.queue_offset < pos)
                if r.next_offset <= at:
                    break
                at = r.next_offset
            yield from reversed(chunk)
            pos = begin


def start_positions(s: MessageStore, topic: str, queues: list[int], forward: bool, offset: int | None,
                    at_time: int | None) -> dict[int, int]:
    """Where a browse starts in each queue: the queue offset given, the first message stored
    at or after ``at_time`` (binary search on the consume queue: offset_by_time), or the
    oldest (forward) / newest end."""
    out = {}
    for q in queues:
        if at_time is not None:
            out[q] = s.offset_by_time(topic, q, at_time if forward else at_time + 1, "lower")
        elif offset is not None:
            out[q] = offset
        else:
            out[q] = s.min_offset(topic, q) if forward else s.max_offset(topic, q)
    return out


def browse(s: MessageStore, topic: str, positions: dict[int, int], forward: bool = True,
           size: int = limits.DEFAULT_PAGE, tags: str | None = None, content: ContentFilter | None = None,
           deadline: float | None = None) -> dict[str, Any]:
    """One page of ``topic``'s messages merged across the queues of ``positions`` by store
    time (forward: oldest first from each queue's position; else newest first below it).

    A page is its positions: ``next`` is where the following page starts and ``previous``
    where the page before this one starts, so links are stable and nothing is skipped or
    repeated. With a tag set or content filter, at most SCAN_LIMIT records are looked at,
    until ``deadline`` (time.monotonic(); default DEADLINE from now), while the page holds
    the scan slot (SCAN_SLOTS scans at a time: scans sharing the interpreter would each
    take several times their time); ``complete`` false means the page stopped early and
    ``next`` continues the scan (``previous`` is then not known: go back with the browser)."""
    limits.check_size(size)
    filtered = tag_set(tags) is not None or content is not None
    deadline = time.monotonic() + limits.DEADLINE if deadline is None else deadline
    rows, after, more, scanned, timed_out, complete = _walk(s, topic, positions, forward, size, tag_set(tags),
                                                            content, deadline)
    previous = None
    if not filtered:
        back, before, _, _, _, _ = _walk(s, topic, positions, not forward, size, None, None, deadline)
        previous = format_positions(before) if back else None
    return {"topic": topic, "order": "oldest" if forward else "newest", "positions": format_positions(positions),
            "next": format_positions(after) if more else None, "previous": previous,
            "messages": rows, "scanned": scanned, "timedOut": timed_out, "complete": complete}


def _walk(s: MessageStore, topic: str, positions: dict[int, int], forward: bool, size: int,
          wanted: frozenset[str] | None, content: ContentFilter | None, deadline: float
          ) -> tuple[list[dict[str, Any]], dict[int, int], bool, int, int, bool]:
    """browse's merge: (rows, the positions after them, more to read, records looked at,
    of them passed over because their regex match outlasted the page's time, complete: not
    stopped by the scan bound)."""
    bounded = wanted is not None or content is not None
    slot = bounded and _SCAN_SLOTS.acquire(timeout=max(0.0, deadline - time.monotonic()))
    try:
        return _merge(s, topic, positions, forward, size, wanted, content, deadline if slot or not bounded else 0.0)
    finally:
        if slot:
            _SCAN_SLOTS.release()


def _merge(s: MessageStore, topic: str, positions: dict[int, int], forward: bool, size: int,
           wanted: frozenset[str] | None, content: ContentFilter | None, deadline: float
           ) -> tuple[list[dict[str, Any]], dict[int, int], bool, int, int, bool]:
    """_walk's work, filtered until ``deadline`` (0: a page that got no scan slot in time
    looks at one record)."""
    sign = 1 if forward else -1
    readers = {q: _queue_reader(s, topic, q, o, forward) for q, o in positions.items()}
    heap: list[tuple[int, int, int, MessageExt]] = []

    def refill(q: int) -> None:
        m = next(readers[q], None)
        if m is not None:
            heapq.heappush(heap, (sign * m.store_timestamp, sign * m.phy_offset, q, m))

    for q in readers:
        refill(q)
    after = dict(positions)
    rows: list[dict[str, Any]] = []
    looked, timed_out, complete = 0, 0, True
    bounded = wanted is not None or content is not None
    while heap and len(rows) < size:
        # at least one message a page, so a "continue" link always moves on
        if bounded and looked and (looked >= limits.SCAN_LIMIT or time.monotonic() > deadline):
            complete = False
            break
        _, _, q, m = heapq.heappop(heap)
        hit = wanted is None or m.tags in wanted
        if hit and content is not None:
            try:
                hit = content.matches(searchable(m), deadline)
            except TimeoutError:
                if looked:   # look at it again, first, on the next page
                    heapq.heappush(heap, (sign * m.store_timestamp, sign * m.phy_offset, q, m))
                    complete = False
                    break
                hit = False   # one message alone outlasts a page's time: passed over, counted
                timed_out += 1
        looked += 1
        after[q] = m.queue_offset + 1 if forward else m.queue_offset
        refill(q)
        if hit:
            rows.append(summary(m))
    if not heap:
        for q in readers:   # every queue read to its end (the first or last offset)
            after[q] = s.max_offset(topic, q) if forward else s.min_offset(topic, q)
    return rows, after, bool(heap), looked, timed_out, complete


