"""The console's pages: each a view function over one served store and the query
parameters, the template that shows its answer, and what the OpenAPI document says of it.
app.py serves each twice, as ``/s/{store}/PAGE`` (HTML) and ``/api/s/{store}/PAGE`` (JSON),
from the same answer."""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable

from rmqstore.console import browser, dlq, filters, limits, lookups, views
from rmqstore.console.stores import Handle, ServedStore
from rmqstore.errors import InvalidArgumentError

I64_MAX = (1 << 63) - 1
TEXT_LIMIT = 4096   # characters a text parameter may have


def parse_number(name: str, text: str, lo: int = 0, hi: int = I64_MAX) -> int:
    """``text`` as an integer in ``lo..hi`` (ASCII digits only, at most 19 of them, so no
    request makes int() parse a huge number); InvalidArgumentError naming ``name`` else."""
    if not (text.isascii() and text.isdigit() and len(text) <= 19) or not lo <= int(text) <= hi:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise InvalidArgumentError(f"{name} must be an integer in {lo}..{hi}, not {shown!r}")
    return int(text)


class Params:
    """Query parameters, checked: ints in range, text bounded, choices; made when the request
    arrives, they hold when its bounded work ends (``deadline``, time.monotonic())."""

    def __init__(self, query: Any):
        self.q = query
        self.deadline = time.monotonic() + limits.DEADLINE

    def text(self, name: str, default: str | None = None) -> str | None:
        v = self.q.get(name)
        if v is None or v == "":
            return default
        if len(v) > TEXT_LIMIT:
            raise InvalidArgumentError(f"parameter {name} is {len(v)} characters; at most {TEXT_LIMIT}")
        return str(v)

    def required(self, name: str) -> str:
        v = self.text(name)
        if v is None:
            raise InvalidArgumentError(f"parameter {name} is required")
        return v

    def number(self, name: str, default: int = 0, lo: int = 0, hi: int = I64_MAX) -> int:
        v = self.optional_number(name, lo, hi)
        return default if v is None else v

    def optional_number(self, name: str, lo: int = 0, hi: int = I64_MAX) -> int | None:
        v = self.text(name)
        return None if v is None else parse_number(f"parameter {name}", v, lo, hi)

    def choice(self, name: str, choices: tuple[str, ...]) -> str:
        v = self.text(name, choices[0])
        if v not in choices:
            raise InvalidArgumentError(f"parameter {name} must be one of {choices}, not {v!r}")
        return v

    def flag(self, name: str) -> bool:
        return self.text(name) in ("1", "true", "on", "yes")


@dataclass(frozen=True)
class Page:
    """One page: its name in the URL, its title, its view and its query parameters."""
    name: str
    title: str
    view: Callable[[ServedStore, Handle, Params], dict[str, Any]]   # (store, handle read, parameters)
    params: tuple[tuple[str, str, str], ...]   # (name, schema type, description)


def _overview(st: ServedStore, h: Handle, p: Params) -> dict[str, Any]:
    return views.overview(h.store, st.number, st.name)


def _topics(st: ServedStore, h: Handle, p: Params) -> dict[str, Any]:
    return views.topics(h.store, p.text("match", "") or "",
                        p.choice("sort", ("topic", "messages", "queues", "last", "rate")), p.flag("desc"))


def _topic(st: ServedStore, h: Handle, p: Params) -> dict[str, Any]:
    return views.topic(h.store, p.required("name"))


def _browse(st: ServedStore, h: Handle, p: Params) -> dict[str, Any]:
    s = h.store
    topic = p.required("topic")
    forward = p.choice("order", ("oldest", "newest")) == "oldest"
    known = s.queue_ids(topic)
    if not known:
        raise InvalidArgumentError(f"no topic {topic!r} in this store")
    pos = p.text("pos")
    if pos is not None:
        positions = browser.parse_positions(pos)
        if not set(positions) <= set(known):
            raise InvalidArgumentError(f"queues {sorted(set(positions) - set(known))} are not queues of {topic!r}")
    else:
        queues = p.text("queues")
        chosen = sorted({parse_number("a queue id in queues", q.strip(), 0, 65_535)
                         for q in queues.split(",") if q.strip()}) \
            if queues else known
        if not set(chosen) <= set(known):
            raise InvalidArgumentError(f"queues {sorted(set(chosen) - set(known))} are not queues of {topic!r}")
        positions = browser.start_positions(s, topic, chosen, forward, p.optional_number("offset"),
                                            _when(p.text("time")))
    content = filters.make_filter(p.text("q"), p.choice("mode", filters.FILTER_MODES), p.flag("icase"))
    out = browser.browse(s, topic, positions, forward, p.number("size", limits.DEFAULT_PAGE, 1, limits.MAX_PAGE),
                       p.text("tags"), content, p.deadline)
    out["queueIds"] = known
    return out


def _when(text: str | None) -> int | None:
    """A store time given as epoch ms or ISO-8601 (local time unless it names its offset)."""
    if text is None:
        return None
    if text.isascii() and text.isdigit():
        return parse_number("time", text)
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise InvalidArgumentError(f"time must be epoch ms or ISO-8601, not {text!r}") from None


LOOKUP_KINDS = ("msgid", "key", "uniq", "offset")


def _lookup(st: ServedStore, h: Handle, p: Params) -> dict[str, Any]:
    s = h.store
    kind = p.choice("kind", LOOKUP_KINDS)
    value = p.text("value")
    out: dict[str, Any] = {"kind": kind, "value": value, "topic": p.text("topic"), "messages": [], "next": None,
                           "topics": s.topics()}
    if value is None:
        return out
    if kind == "msgid":
        out["messages"] = [views.summary(lookups.by_msg_id(s, value))]
    elif kind == "offset":
        out["messages"] = [views.summary(s.get_by_offset(parse_number("a commitlog offset", value)))]
    else:
        page = lookups.by_key(s, p.required("topic"), value, kind == "uniq", p.text("cursor"),
                            p.number("size", limits.DEFAULT_PAGE, 1, limits.MAX_PAGE), p.number("begin"),
                            p.optional_number("end"), p.deadline)
        out.update(messages=page["messages"], next=page["next"], read=page["read"])
    return out


def _message(st: ServedStore, h: Handle, p: Params) -> dict[str, Any]:
    out = views.message(h.store, p.number("offset"))
    out["view"] = p.choice("view", ("text", "json", "hex", "base64"))
    return out


def _groups(st: ServedStore, h: Handle, p: Params) -> dict[str, Any]:
    return views.groups(h.store)


def _dead_letters(st: ServedStore, h: Handle, p: Params) -> dict[str, Any]:
    return dlq.dlq(h.store, p.number("size", 20, 1, limits.MAX_PAGE))


def _path_only(st: ServedStore, h: Handle, p: Params) -> dict[str, Any]:
    s = h.store
    return {"topics": s.topics(), "maxPhyOffset": s.max_phy_offset, "cleanShutdown": s.clean_shutdown}


_SIZE = ("size", "integer", f"messages a page (1..{limits.MAX_PAGE})")
PAGES = [
    Page("overview", "Overview", _overview, ()),
    Page("topics", "Topics", _topics, (("match", "string", "substring of the topic name"),
                                       ("sort", "string", "topic | messages | queues | last | rate"),
                                       ("desc", "boolean", "sort descending"))),
    Page("topic", "Topic", _topic, (("name", "string", "the topic (required)"),)),
    Page("browse", "Messages", _browse, (
        ("topic", "string", "the topic (required)"), ("queues", "string", "queue ids joined by ',' (default all)"),
        ("order", "string", "oldest | newest"), ("offset", "integer", "start at this queue offset in each queue"),
        ("time", "integer", "start at this store time (epoch ms; binary search on the consume queues)"),
        ("pos", "string", "a page's positions, queue:offset joined by ',' (from next / previous)"), _SIZE,
        ("tags", "string", "tag expression, e.g. TagA || TagB"),
        ("q", "string", "content filter over body text, keys and properties"),
        ("mode", "string", "substring | regex"), ("icase", "boolean", "ignore case"))),
    Page("lookup", "Lookup", _lookup, (
        ("kind", "string", "msgid | key | uniq | offset"), ("value", "string", "the msgId, key or commitlog offset"),
        ("topic", "string", "the topic (key and uniq)"), ("cursor", "string", "next page of key hits (from next)"),
        _SIZE, ("begin", "integer", "stored at or after (epoch ms)"),
        ("end", "integer", "stored at or before (epoch ms)"))),
    Page("message", "Message", _message, (("offset", "integer", "the message's commitlog offset (required)"),
                                          ("view", "string", "text | json | hex | base64 (the page's body view)"))),
    Page("groups", "Consumer groups", _groups, ()),
    Page("dlq", "DLQ", _dead_letters, (_SIZE,)),
    Page("health", "Health", _path_only, ()),
    Page("tail", "Live tail", _path_only, ()),
]
BY_NAME = {p.name: p for p in PAGES}
NAV = [p for p in PAGES if p.name not in ("topic", "message")]
