"""The console's answers for the store, topic, message and consumer pages, one function a
page: each returns the JSON document its API route sends and its page renders, from the
public MessageStore API only (the browser, lookups and DLQ pages have their own modules)."""
from __future__ import annotations

import base64
import json
import os
import zlib
from typing import Any

from rmqstore import MessageExt, MessageNotFoundError, MessageStore
from rmqstore.console import charts, pop
from rmqstore.errors import InvalidArgumentError, StoreError
from rmqstore.report import message_dict, store_stats

COMPRESSED = 0x1        # SYSFLAG bit: the body is zlib-compressed
BODY_VIEW_LIMIT = 1 << 20   # bytes of a body a detail page shows (the raw download has all)


def topic_kind(topic: str) -> str:
    """retry | dlq | system | normal, from the topic's name (RocketMQ's prefixes and system topics)."""
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
    except (ValueError, RecursionError):   # not JSON, or nested deeper than the parser goes
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


# -- consumer groups --------------------------------------------------------------------------------
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
