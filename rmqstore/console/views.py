"""The console's answers, one function a page: each returns the JSON document its API route
sends and its page renders, from the public MessageStore API only. Every answer is bounded:
pages hold at most MAX_PAGE messages, scans stop after SCAN_LIMIT records or DEADLINE
seconds and hand back a cursor to continue from."""
from __future__ import annotations

import base64
import functools
import heapq
import json
import os
import time
import zlib
from typing import Any, Iterator

from rmqstore import Message, MessageExt, MessageNotFoundError, MessageStore
from rmqstore.cli.common import message_dict
from rmqstore.cli.read import store_stats
from rmqstore.console import charts, pop
from rmqstore.console.filters import ContentFilter, searchable, tag_set
from rmqstore.errors import InvalidArgumentError, StoreError

MAX_PAGE = 200
DEFAULT_PAGE = 50
SCAN_LIMIT = 20_000     # records a filtered page looks at before it hands back a "continue" cursor
DEADLINE = 0.08         # seconds a filtered page or a key lookup spends at most
CHUNK = 32              # messages read from a queue at a time (getMessage's transfer limit)
COMPRESSED = 0x1        # SYSFLAG bit: the body is zlib-compressed
BODY_VIEW_LIMIT = 1 << 20   # bytes of a body a detail page shows (the raw download has all)
INDEX_WALK = 65_535     # hash matches one index walk returns (the store's max_msgs_num_batch limit)
ORIGIN_PROPERTIES = ("RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "DLQ_ORIGIN_TOPIC", "DLQ_ORIGIN_MESSAGE_ID", "REAL_TOPIC",
                     "REAL_QID")


def topic_kind(topic: str) -> str:
    if topic.startswith("%RETRY%"):
        return "retry"
    if topic.startswith("%DLQ%"):
        return "dlq"
    if topic in ("SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC") \
            or topic.startswith("rmq_sys_"):
        return "system"
    return "normal"


def summary(m: MessageExt) -> dict[str, Any]:
    """The fields a list row shows."""
    return {"topic": m.topic, "queueId": m.queue_id, "queueOffset": m.queue_offset, "commitLogOffset": m.phy_offset,
            "storeSize": m.store_size, "msgId": m.msg_id, "tags": m.tags, "keys": m.properties.get("KEYS"),
            "storeTimestamp": m.store_timestamp, "bodyLength": len(m.body),
            "bodyPreview": bytes(m.body[:80]).decode("utf-8", "replace")}


def last_store_time(s: MessageStore, topic: str, queue_id: int) -> int:
    """Store time of a queue's newest message (0 for an empty queue)."""
    hi = s.max_offset(topic, queue_id)
    if hi <= s.min_offset(topic, queue_id):
        return 0
    e = s.consume_queue_entries(topic, queue_id, hi - 1, 1)
    try:
        return s.get_by_offset(int(e["phy_offset"][0])).store_timestamp if len(e) else 0
    except StoreError:
        return 0


def _first_store_time(s: MessageStore) -> int:
    for m in s.scan(s.min_phy_offset):
        return m.store_timestamp
    return 0


def _disk_usage(root: str) -> tuple[int, int]:
    """(bytes allocated on disk, apparent bytes) of every file under ``root``."""
    used = apparent = 0
    for d, _, files in os.walk(root):
        for f in files:
            try:
                st = os.lstat(os.path.join(d, f))
            except OSError:
                continue
            used += st.st_blocks * 512
            apparent += st.st_size
    return used, apparent


def overview(s: MessageStore, number: int, name: str) -> dict[str, Any]:
    """RocketMQ's store facts (``rmqstore stats --json``) plus disk use, dispatch lag and
    a messages/bytes-per-minute chart over the store's life."""
    st = store_stats(s)
    used, apparent = _disk_usage(s.path)
    queues = [(q["topic"], q["queueId"]) for q in st["queues"]]
    first = _first_store_time(s)
    last = max((last_store_time(s, t, q) for t, q in queues), default=0)
    dispatched = 0
    for t, q in queues:
        hi = s.max_offset(t, q)
        if hi > s.min_offset(t, q):
            e = s.consume_queue_entries(t, q, hi - 1, 1)
            if len(e):
                dispatched = max(dispatched, int(e["phy_offset"][0]) + int(e["size"][0]))
    st.update({"number": number, "name": name, "diskBytes": used, "apparentBytes": apparent,
               "topicCount": len(st["topics"]), "queueCount": len(queues), "firstStoreTimestamp": first,
               "lastStoreTimestamp": last, "messages": sum(q["messages"] for q in st["queues"]),
               "dispatchLagBytes": max(0, st["commitlog"]["maxOffset"] - dispatched) if dispatched else 0,
               "chart": charts.rates(s, queues, first, last, with_bytes=True)})
    return st


def topics(s: MessageStore, match: str = "", sort: str = "topic", descending: bool = False) -> dict[str, Any]:
    """Every topic with its queues, messages, newest store time and recent rate
    (messages a minute over the last hour before the store's newest message)."""
    rows: list[dict[str, Any]] = []
    for t in s.topics():
        if match and match.casefold() not in t.casefold():
            continue
        qs = s.queue_ids(t)
        last = max((last_store_time(s, t, q) for q in qs), default=0)
        total = sum(s.max_offset(t, q) - s.min_offset(t, q) for q in qs)
        recent = sum(s.max_offset(t, q) - s.offset_by_time(t, q, last - 3_600_000) for q in qs) if last else 0
        rows.append({"topic": t, "kind": topic_kind(t), "queues": len(qs), "messages": total,
                     "lastStoreTimestamp": last, "ratePerMinute": round(recent / 60, 3)})
    keys = {"topic": "topic", "messages": "messages", "queues": "queues", "last": "lastStoreTimestamp",
            "rate": "ratePerMinute"}
    if sort not in keys:
        raise InvalidArgumentError(f"sort must be one of {sorted(keys)}, not {sort!r}")
    rows.sort(key=lambda r: r[keys[sort]], reverse=descending)
    return {"topics": rows, "sort": sort, "descending": descending, "match": match}


def topic(s: MessageStore, name: str) -> dict[str, Any]:
    """One topic: each queue's min/max offsets, messages and newest store time; a rate chart."""
    qs = s.queue_ids(name)
    if not qs:
        raise MessageNotFoundError(f"no topic {name!r} in this store")
    queues = [{"queueId": q, "minOffset": s.min_offset(name, q), "maxOffset": s.max_offset(name, q),
               "lastStoreTimestamp": last_store_time(s, name, q)} for q in qs]
    for q in queues:
        q["messages"] = q["maxOffset"] - q["minOffset"]
    firsts = []
    for q in queues:
        if q["messages"]:
            e = s.consume_queue_entries(name, q["queueId"], q["minOffset"], 1)
            if len(e):
                firsts.append(s.get_by_offset(int(e["phy_offset"][0])).store_timestamp)
    first, last = min(firsts, default=0), max((q["lastStoreTimestamp"] for q in queues), default=0)
    return {"topic": name, "kind": topic_kind(name), "queues": queues, "messages": sum(q["messages"] for q in queues),
            "chart": charts.rates(s, [(name, q) for q in qs], first, last, with_bytes=False)}


# -- the message browser -------------------------------------------------------------------------
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
    return ",".join(f"{q}:{o}" for q, o in sorted(pos.items()))


def _queue_reader(s: MessageStore, topic: str, q: int, start: int, forward: bool) -> Iterator[MessageExt]:
    """A queue's messages from ``start`` (forward: up; else down from ``start - 1``)."""
    lo, hi = s.min_offset(topic, q), s.max_offset(topic, q)
    if forward:
        pos = max(start, lo)
        while pos < hi:
            r = s.get_messages(topic, q, pos, CHUNK)
            yield from r.messages
            if r.next_offset <= pos:
                return
            pos = r.next_offset
    else:
        pos = min(start, hi)
        while pos > lo:
            begin = max(lo, pos - CHUNK)
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


def browse(s: MessageStore, topic: str, positions: dict[int, int], forward: bool = True, size: int = DEFAULT_PAGE,
           tags: str | None = None, content: ContentFilter | None = None) -> dict[str, Any]:
    """One page of ``topic``'s messages merged across the queues of ``positions`` by store
    time (forward: oldest first from each queue's position; else newest first below it).

    A page is its positions: ``next`` is where the following page starts and ``previous``
    where the page before this one starts, so links are stable and nothing is skipped or
    repeated. With a tag set or content filter, at most SCAN_LIMIT records (or DEADLINE
    seconds) are looked at; ``complete`` false means the page stopped early and ``next``
    continues the scan (``previous`` is then not known: go back with the browser)."""
    if not 1 <= size <= MAX_PAGE:
        raise InvalidArgumentError(f"page size must be 1..{MAX_PAGE}, not {size}")
    filtered = tag_set(tags) is not None or content is not None
    rows, after, more, scanned, timed_out, complete = _walk(s, topic, positions, forward, size, tag_set(tags),
                                                            content)
    previous = None
    if not filtered:
        back, before, _, _, _, _ = _walk(s, topic, positions, not forward, size, None, None)
        previous = format_positions(before) if back else None
    return {"topic": topic, "order": "oldest" if forward else "newest", "positions": format_positions(positions),
            "next": format_positions(after) if more else None, "previous": previous,
            "messages": rows, "scanned": scanned, "timedOut": timed_out, "complete": complete}


def _walk(s: MessageStore, topic: str, positions: dict[int, int], forward: bool, size: int,
          wanted: frozenset[str] | None, content: ContentFilter | None
          ) -> tuple[list[dict[str, Any]], dict[int, int], bool, int, int, bool]:
    """browse's merge: (rows, the positions after them, more to read, records looked at,
    of them passed over because their regex match outlasted the page's time, complete: not
    stopped by the scan bound)."""
    deadline = time.monotonic() + DEADLINE
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
        if bounded and looked and (looked >= SCAN_LIMIT or time.monotonic() > deadline):
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


# -- lookups -------------------------------------------------------------------------------------
def _has_key(m: MessageExt, key: str, uniq_only: bool) -> bool:
    if m.uniq_key == key:
        return True
    return not uniq_only and key in (m.properties.get("KEYS") or "").split(" ")


def by_key(s: MessageStore, topic: str, key: str, uniq_only: bool = False, cursor: str | None = None,
           size: int = DEFAULT_PAGE, begin: int = 0, end: int | None = None) -> dict[str, Any]:
    """Every message of ``topic`` whose UNIQ_KEY (or, unless ``uniq_only``, a KEYS token)
    is ``key``, newest first, paged: the index gives hash matches (colliding keys among
    them), each is read and kept only if it really holds the key. ``cursor`` is
    ``END_MS:BELOW_OFFSET`` (the next page: matches stored by END_MS below commitlog
    offset BELOW_OFFSET)."""
    if not 1 <= size <= MAX_PAGE:
        raise InvalidArgumentError(f"page size must be 1..{MAX_PAGE}, not {size}")
    if cursor:
        e, sep, b = cursor.partition(":")
        if not (sep and e.isdigit() and b.isdigit() and e.isascii() and b.isascii()):
            raise InvalidArgumentError(f"cursor must be END_MS:BELOW_OFFSET, not {cursor!r}")
        end, below = int(e), int(b)
    else:
        below = None
    deadline = time.monotonic() + DEADLINE
    rows: list[dict[str, Any]] = []
    read = 0
    while True:
        hits = _hash_matches(s, topic, key, begin, end)
        full = len(hits) == INDEX_WALK
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


@functools.lru_cache(maxsize=64)
def _hash_matches(s: MessageStore, topic: str, key: str, begin: int, end: int | None) -> tuple[int, ...]:
    """The index walk's commitlog offsets, kept for the next pages of the same lookup (a
    handle sees no later appends, and the console replaces it when the store changes)."""
    return tuple(s.query_offsets(topic, key, INDEX_WALK, begin, end))


def _key_page(topic: str, key: str, rows: list[dict[str, Any]], read: int, cursor: str | None) -> dict[str, Any]:
    return {"topic": topic, "key": key, "messages": rows, "read": read, "next": cursor}


def by_msg_id(s: MessageStore, msg_id: str) -> MessageExt:
    """The message a msgId names (decoded from the id: any age, no index needed)."""
    text = msg_id.strip()
    if len(text) not in (32, 56) or not all(c in "0123456789abcdefABCDEF" for c in text):
        raise InvalidArgumentError(f"a msgId is 32 or 56 hex digits, not {msg_id!r}")
    return s.get_by_msg_id(text.upper())


# -- one message -----------------------------------------------------------------------------------
def body_views(m: MessageExt) -> dict[str, Any]:
    """The body as text, pretty JSON (when it parses), hex dump, base64; decompressed first
    when the COMPRESSED flag is set (bounded at BODY_VIEW_LIMIT)."""
    raw = bytes(m.body)
    data, note = raw, None
    if m.sys_flag & COMPRESSED:
        try:
            d = zlib.decompressobj()
            data = d.decompress(raw, BODY_VIEW_LIMIT)
            note = "decompressed (zlib)" + (", cut" if d.unconsumed_tail else "")
        except zlib.error as e:
            note = f"flagged compressed but not zlib: {e}"
    shown = data[:BODY_VIEW_LIMIT]
    text = shown.decode("utf-8", "replace")
    try:
        pretty = json.dumps(json.loads(shown), indent=2, ensure_ascii=False)
    except ValueError:
        pretty = None
    hexdump = "\n".join(f"{i:08x}  {shown[i:i + 16].hex(' '):<47}  "
                        + "".join(chr(b) if 32 <= b < 127 else "." for b in shown[i:i + 16])
                        for i in range(0, min(len(shown), 64 * 1024), 16))
    return {"text": text, "json": pretty, "hex": hexdump, "base64": base64.b64encode(shown).decode("ascii"),
            "note": note, "cut": len(data) > len(shown)}


def consumption(s: MessageStore, m: MessageExt) -> list[dict[str, Any]]:
    """Per consumer group of the message's topic: its committed offset and whether the
    message is consumed (committed offset past its queue offset)."""
    out = []
    for group, t in s.consumer_groups():
        if t == m.topic:
            c = s.committed_offset(group, t, m.queue_id)
            out.append({"group": group, "committedOffset": c, "consumed": c > m.queue_offset})
    return out


def message(s: MessageStore, phy_offset: int) -> dict[str, Any]:
    """Every field of the message at ``phy_offset`` under RocketMQ's MessageExt names
    (as ``rmqstore at --json``), its body views and its consumption by each group."""
    m = s.get_by_offset(phy_offset)
    d = message_dict(m, "none")
    d.update(transactionType=str(m.transaction_type), magic=m.magic, tagsCode=m.tags_code,
             views=body_views(m), consumption=consumption(s, m), endpointState=pop.message_state(s, m))
    return d


# -- consumer groups and DLQ -------------------------------------------------------------------
def groups(s: MessageStore) -> dict[str, Any]:
    """Per group and queue: max offset, committed offset and lag (and, for a store an
    endpoint serves, the messages in flight); totals per group."""
    out: dict[str, dict[str, Any]] = {}
    endpoint = pop.queue_states(s.path)
    for group, t in s.consumer_groups():
        g = out.setdefault(group, {"group": group, "queues": [], "lag": 0, "maxOffset": 0, "committed": 0})
        for q in s.queue_ids(t):
            hi, c = s.max_offset(t, q), s.committed_offset(group, t, q)
            lag = hi - (c if c >= 0 else s.min_offset(t, q))
            g["queues"].append({"topic": t, "queueId": q, "maxOffset": hi, "committedOffset": c, "lag": max(0, lag),
                                "inFlight": endpoint.get((group, t, q), {}).get("inFlight")})
            g["lag"] += max(0, lag)
            g["maxOffset"] += hi
            g["committed"] += max(0, c)
    rows = list(out.values())
    return {"groups": rows, "totalLag": sum(g["lag"] for g in rows),
            "chart": charts.bars([(g["group"], g["lag"]) for g in rows])}


def dlq(s: MessageStore, size: int = DEFAULT_PAGE) -> dict[str, Any]:
    """Each group's ``%DLQ%`` topic: its size and newest messages with the properties that
    name where they came from (RETRY_TOPIC, ORIGIN_MESSAGE_ID, ...)."""
    out = []
    for t in s.topics():
        if not t.startswith("%DLQ%"):
            continue
        qs = s.queue_ids(t)
        page = browse(s, t, start_positions(s, t, qs, False, None, None), False, size)
        rows = []
        for r in page["messages"]:
            m = s.get_by_offset(r["commitLogOffset"])
            rows.append({**r, "reconsumeTimes": m.reconsume_times,
                         "origin": {k: m.properties[k] for k in ORIGIN_PROPERTIES if k in m.properties}})
        out.append({"topic": t, "group": t[len("%DLQ%"):], "messages": sum(s.max_offset(t, q) - s.min_offset(t, q)
                                                                          for q in qs),
                    "newest": rows, "more": page["next"]})
    return {"dlq": out}


DLQ_ORIGIN = ("DLQ_ORIGIN_TOPIC", "RETRY_TOPIC")   # where a dead letter came from (the endpoint's, a broker's)
NOT_RESENT = ("DLQ_ORIGIN_TOPIC", "DLQ_ORIGIN_MESSAGE_ID", "TAGS", "KEYS", "REAL_TOPIC", "REAL_QID", "MIN_OFFSET",
              "MAX_OFFSET")


def resend_dead_letter(writer: MessageStore, phy_offset: int) -> dict[str, Any]:
    """Put a copy of the ``%DLQ%`` message at ``phy_offset`` on its origin topic (its
    DLQ_ORIGIN_TOPIC or RETRY_TOPIC property), same body, tags, keys and user properties,
    with CONSOLE_RESENT_FROM naming the dead letter's msgId. Returns where it went."""
    m = writer.get_by_offset(phy_offset)
    if not m.topic.startswith("%DLQ%"):
        raise InvalidArgumentError(f"the message at {phy_offset} is on {m.topic!r}, not a %DLQ% topic")
    origin = next((m.properties[k] for k in DLQ_ORIGIN if m.properties.get(k)), None)
    if origin is None:
        raise InvalidArgumentError(f"the dead letter at {phy_offset} names no origin topic ({' or '.join(DLQ_ORIGIN)})")
    props = {k: v for k, v in m.properties.items() if k not in NOT_RESENT and v is not None}
    props["CONSOLE_RESENT_FROM"] = m.msg_id
    keys = (m.properties.get("KEYS") or "").split()
    r = writer.put(Message(origin, bytes(m.body), tags=m.tags, keys=keys or None, properties=props))
    return {"topic": origin, "queueId": r.queue_id, "queueOffset": r.queue_offset, "commitLogOffset": r.phy_offset,
            "msgId": r.msg_id}
