"""Lookups: by key or unique key (exact, every hit, paged, hash collisions removed) and by
msgId (decoded: any age)."""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

from rmqstore import MessageExt, MessageStore
from rmqstore.console import limits
from rmqstore.console.views import summary
from rmqstore.errors import InvalidArgumentError

CACHED_WALKS = 64   # index walks kept for the next pages of their lookups
_walks: OrderedDict[tuple[Any, ...], tuple[int, ...]] = OrderedDict()
_walks_lock = threading.Lock()


def _has_key(m: MessageExt, key: str, uniq_only: bool) -> bool:
    if m.uniq_key == key:
        return True
    return not uniq_only and key in (m.properties.get("KEYS") or "").split(" ")


def by_key(s: MessageStore, topic: str, key: str, uniq_only: bool = False, cursor: str | None = None,
           size: int = limits.DEFAULT_PAGE, begin: int = 0, end: int | None = None,
           handle: tuple[int, int] | None = None) -> dict[str, Any]:
    """Every message of ``topic`` whose UNIQ_KEY (or, unless ``uniq_only``, a KEYS token)
    is ``key``, newest first, paged: the index gives hash matches (colliding keys among
    them), each is read and kept only if it really holds the key. ``cursor`` is
    ``END_MS:BELOW_OFFSET`` (the next page: matches stored by END_MS below commitlog
    offset BELOW_OFFSET). ``handle``: the key of the console handle ``s`` is (stores.Handle),
    under which the index walks are cached for the next pages (not cached without it)."""
    limits.check_size(size)
    if cursor:
        e, sep, b = cursor.partition(":")
        if not (sep and e.isdigit() and b.isdigit() and e.isascii() and b.isascii()):
            raise InvalidArgumentError(f"cursor must be END_MS:BELOW_OFFSET, not {cursor!r}")
        end, below = int(e), int(b)
    else:
        below = None
    deadline = time.monotonic() + limits.DEADLINE
    rows: list[dict[str, Any]] = []
    read = 0
    while True:
        hits = _hash_matches(s, handle, topic, key, begin, end)
        full = len(hits) == limits.INDEX_WALK
        todo = sorted((o for o in hits if below is None or o < below), reverse=True)
        for o in todo:
            if len(rows) == size or (read and time.monotonic() > deadline):
                return _key_page(topic, key, rows, read, f"{end if end is not None else (1 << 63) - 1}:{o + 1}")
            m = s.get_by_offset(o)
            read += 1
            below = o
            if _has_key(m, key, uniq_only):
                rows.append(summary(m))
        if not (full and todo):
            return _key_page(topic, key, rows, read, None)
        # an index walk holds the newest INDEX_WALK matches: go on with the older ones (index
        # times are whole seconds from the file's start, so the next window overlaps by one)
        end = s.get_by_offset(todo[-1]).store_timestamp + 1000


def _hash_matches(s: MessageStore, handle: tuple[int, int] | None, topic: str, key: str, begin: int,
                  end: int | None) -> tuple[int, ...]:
    """The index walk's commitlog offsets, kept (the CACHED_WALKS used last) for the next
    pages of the same lookup on the same handle: a handle sees no later appends, and the
    console replaces it when the store changes."""
    ident = (handle, topic, key, begin, end)
    with _walks_lock:
        if handle is not None and ident in _walks:
            _walks.move_to_end(ident)
            return _walks[ident]
    hits = tuple(s.query_offsets(topic, key, limits.INDEX_WALK, begin, end))
    if handle is not None:
        with _walks_lock:
            _walks[ident] = hits
            while len(_walks) > CACHED_WALKS:
                _walks.popitem(last=False)
    return hits


def forget(handle: tuple[int, int]) -> None:
    """Drop the cached walks of a handle the console closes."""
    with _walks_lock:
        for ident in [i for i in _walks if i[0] == handle]:
            del _walks[ident]


def cached_handles() -> set[Any]:
    """The handle keys the cache holds walks of."""
    with _walks_lock:
        return {i[0] for i in _walks}


def _key_page(topic: str, key: str, rows: list[dict[str, Any]], read: int, cursor: str | None) -> dict[str, Any]:
    return {"topic": topic, "key": key, "messages": rows, "read": read, "next": cursor}


def by_msg_id(s: MessageStore, msg_id: str) -> MessageExt:
    """The message a msgId names (decoded from the id: any age, no index needed)."""
    text = msg_id.strip()
    if len(text) not in (32, 56) or not all(c in "0123456789abcdefABCDEF" for c in text):
        raise InvalidArgumentError(f"a msgId is 32 or 56 hex digits, not {msg_id!r}")
    return s.get_by_msg_id(text.upper())


