"""Lookups: by key or unique key (exact, every hit, paged, hash collisions removed) and by
msgId (decoded: any age)."""
from __future__ import annotations

import time
from typing import Any

from rmqstore import MessageExt, MessageStore
from rmqstore.console import limits
from rmqstore.console.views import summary
from rmqstore.errors import InvalidArgumentError


def _has_key(m: MessageExt, key: str, uniq_only: bool) -> bool:
    if m.uniq_key == key:
        return True
    return not uniq_only and key in (m.properties.get("KEYS") or "").split(" ")


def by_key(s: MessageStore, topic: str, key: str, uniq_only: bool = False, cursor: str | None = None,
           size: int = limits.DEFAULT_PAGE, begin: int = 0, end: int | None = None,
           deadline: float | None = None) -> dict[str, Any]:
    """Every message of ``topic`` whose UNIQ_KEY (or, unless ``uniq_only``, a KEYS token)
    is ``key``, newest first, paged: the index's hash matches are walked a page at a time
    (query_offsets_page: a page costs its own matches, not the hits before it), each is
    read and kept only if it really holds the key (colliding keys are not). ``cursor`` is
    ``RESUME:BELOW_OFFSET``: the walk's resume token and the offset read last (a message
    indexed twice under the key, as UNIQ_KEY and KEYS token, is read once). Past ``deadline``
    (time.monotonic(); default DEADLINE from now) the page ends with what it has."""
    limits.check_size(size)
    resume, below = None, None
    if cursor:
        resume, sep, b = cursor.rpartition(":")
        if not (sep and resume and b.isascii() and b.isdigit()):
            raise InvalidArgumentError(f"cursor must be RESUME:BELOW_OFFSET, not {cursor!r}")
        below = int(b)
    deadline = time.monotonic() + limits.DEADLINE if deadline is None else deadline
    rows: list[dict[str, Any]] = []
    read = 0
    while True:
        offsets, resume = s.query_offsets_page(topic, key, size - len(rows), begin, end, resume)
        for o in offsets:
            if below is not None and o >= below:   # read already: the walk is newest first
                continue
            m = s.get_by_offset(o)
            read += 1
            below = o
            if _has_key(m, key, uniq_only):
                rows.append(summary(m))
        if resume is None or len(rows) == size or time.monotonic() > deadline:
            return {"topic": topic, "key": key, "messages": rows, "read": read,
                    "next": None if resume is None else f"{resume}:{below if below is not None else (1 << 63) - 1}"}


def by_msg_id(s: MessageStore, msg_id: str) -> MessageExt:
    """The message a msgId names (decoded from the id: any age, no index needed)."""
    text = msg_id.strip()
    if len(text) not in (32, 56) or not all(c in "0123456789abcdefABCDEF" for c in text):
        raise InvalidArgumentError(f"a msgId is 32 or 56 hex digits, not {msg_id!r}")
    return s.get_by_msg_id(text.upper())
