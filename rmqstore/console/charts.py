"""Chart data, computed without reading every record, and drawn as SVG on the server (the
templates turn these numbers into ``<svg>`` elements; labels go through autoescaping): no
chart library, no script, so charts work offline and under the console's strict CSP.

Messages per bucket come from binary searches on the consume queues (offset_by_time at each
bucket boundary, per queue); bytes per bucket from the commitlog position at each boundary
(the smallest commitlog offset of the first message at or after it, over the queues)."""
from __future__ import annotations

from typing import Any

from rmqstore import MessageStore

BUCKETS = 60
MINUTE = 60_000
WIDTH, HEIGHT = 600, 120


def _boundaries(first: int, last: int) -> list[int]:
    """BUCKETS+1 bucket edges over [first, last], each bucket a whole number of minutes."""
    span = max(1, last - first + 1)
    width = max(MINUTE, -(-span // BUCKETS // MINUTE) * MINUTE)
    start = first - first % MINUTE
    n = max(1, -(-(last + 1 - start) // width))
    return [start + i * width for i in range(n + 1)]


def rates(s: MessageStore, queues: list[tuple[str, int]], first: int, last: int, with_bytes: bool) -> dict[str, Any]:
    """Messages (and bytes) per minute in buckets over [first, last] (store times, ms)."""
    if not first or not last or last < first:
        return {"buckets": [], "bucketMs": 0}
    edges = _boundaries(first, last)
    counts = [0] * (len(edges) - 1)
    pos = [s.max_phy_offset] * len(edges)
    for t, q in queues:
        offs = [s.offset_by_time(t, q, e, "lower") for e in edges]
        for i in range(len(counts)):
            counts[i] += offs[i + 1] - offs[i]
        if with_bytes:
            hi = s.max_offset(t, q)
            for i, o in enumerate(offs):
                if o < hi:
                    e = s.consume_queue_entries(t, q, o, 1)
                    if len(e):
                        pos[i] = min(pos[i], int(e["phy_offset"][0]))
    width = edges[1] - edges[0]
    per_min = width / MINUTE
    buckets: list[dict[str, Any]] = [
        {"start": edges[i], "messages": counts[i], "messagesPerMinute": round(counts[i] / per_min, 3)}
        for i in range(len(counts))]
    if with_bytes:
        for i in range(len(counts)):
            pos[i + 1] = max(pos[i + 1], pos[i])
            buckets[i]["bytes"] = pos[i + 1] - pos[i]
    return {"bucketMs": width, "buckets": buckets,
            "svg": {"messages": _line([b["messages"] for b in buckets]),
                    "bytes": _line([b["bytes"] for b in buckets]) if with_bytes else None}}


def _line(values: list[int]) -> dict[str, Any]:
    """An SVG polyline's points for ``values`` scaled into WIDTH x HEIGHT."""
    top = max(values, default=0) or 1
    step = WIDTH / max(1, len(values) - 1)
    points = " ".join(f"{i * step:.1f},{HEIGHT - v * HEIGHT / top:.1f}" for i, v in enumerate(values))
    return {"points": points, "max": max(values, default=0), "width": WIDTH, "height": HEIGHT}


def bars(pairs: list[tuple[str, int]]) -> dict[str, Any]:
    """Horizontal bars (label, value): each bar's width in WIDTH."""
    top = max((v for _, v in pairs), default=0) or 1
    return {"bars": [{"label": k, "value": v, "width": round(v * (WIDTH - 200) / top, 1), "y": i * 20}
                     for i, (k, v) in enumerate(pairs)], "width": WIDTH, "height": max(20, 20 * len(pairs))}
