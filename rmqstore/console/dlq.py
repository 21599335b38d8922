"""The DLQ page: each group's ``%DLQ%`` topic with its origin properties, and the one write
the console can make, resending a dead letter to its origin topic."""
from __future__ import annotations

from typing import Any

from rmqstore import Message, MessageStore
from rmqstore.console import limits
from rmqstore.console.browser import browse, start_positions
from rmqstore.errors import InvalidArgumentError

ORIGIN_PROPERTIES = ("RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "DLQ_ORIGIN_TOPIC", "DLQ_ORIGIN_MESSAGE_ID", "REAL_TOPIC",
                     "REAL_QID")


def dlq(s: MessageStore, size: int = limits.DEFAULT_PAGE) -> dict[str, Any]:
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
