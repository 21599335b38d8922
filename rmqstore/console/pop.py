"""What ``rmqstore serve`` (the gRPC endpoint) knows of its consumers, read from the store's
``config/popState.json`` and ``popState.log`` without changing them: per group and queue the
first offset never handed out and the messages handed out and not acked yet (in flight until
their invisible time, with their delivery attempts). Shown only for stores an endpoint
served."""
from __future__ import annotations

import os
import threading
import time
from typing import Any

from rmqstore import MessageExt, MessageStore
from rmqstore.errors import StoreError
from rmqstore.pop_state import PopState

FILES = ("popState.json", "popState.log")
_read: dict[str, tuple[Any, Any]] = {}   # store path -> (the files' stamp, the PopState read at it)
_read_lock = threading.Lock()


def _files_stamp(root: str) -> tuple[tuple[int, ...] | None, ...]:
    """(mtime ns, size) of the snapshot and the log (None for a missing one), the log's with
    where its records end (it is written ahead with zeros, so its size stays while records
    are added, and two within one clock tick leave its mtime as well): a write to either
    changes it."""
    out: list[tuple[int, ...] | None] = []
    for f in FILES:
        path = os.path.join(root, "config", f)
        try:
            st = os.stat(path)
            if f == "popState.log":
                with open(path, "rb") as log:
                    out.append((st.st_mtime_ns, st.st_size, log.read().rfind(b"\n")))
            else:
                out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


def read_state(root: str) -> PopState | None:
    """The endpoint's PopState of the store at ``root`` (read-only), or None when no
    endpoint served it. Read again only when the snapshot or the log changed since the
    last read."""
    stamp = _files_stamp(root)
    if stamp == (None, None):
        return None
    with _read_lock:
        cached = _read.get(root)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    state = PopState(root, read_only=True)
    with _read_lock:
        _read[root] = (stamp, state)
    return state


def message_state(s: MessageStore, m: MessageExt) -> list[dict[str, Any]]:
    """Per endpoint group consuming ``m``'s queue: delivered or not, in flight (until when,
    attempt), finished, and whether a copy went to the group's ``%DLQ%`` topic."""
    state = read_state(s.path)
    if state is None:
        return []
    now = int(time.time() * 1000)
    out = []
    for (group, topic, q), qs in sorted(state.queues.items()):
        if topic != m.topic or q != m.queue_id:
            continue
        entry = qs.pending.get(m.queue_offset)
        if entry is not None:
            until, attempts = entry[0], entry[1]
            status = "delayed" if attempts == 0 else "in flight" if until > now else "due for redelivery"
        else:
            until, attempts = 0, None
            status = "finished" if m.queue_offset < qs.next else "not delivered yet"
        out.append({"group": group, "status": status, "attempts": attempts, "invisibleUntil": until,
                    "next": qs.next, "deadLettered": _dead_lettered(s, group, m)})
    return out


def _dead_lettered(s: MessageStore, group: str, m: MessageExt) -> bool:
    """Whether ``%DLQ%group`` holds a copy of ``m`` (same UNIQ_KEY, the endpoint's copy
    names its origin in DLQ_ORIGIN_TOPIC)."""
    key = m.uniq_key
    if not key or "%DLQ%" + group not in s.topics():
        return False
    try:
        return any(d.properties.get("DLQ_ORIGIN_TOPIC") == m.topic for d in s.query_by_key("%DLQ%" + group, key))
    except StoreError:
        return False


def queue_states(root: str) -> dict[tuple[str, str, int], dict[str, int]]:
    """(group, topic, queue) -> {next, inFlight} of every endpoint queue state."""
    state = read_state(root)
    if state is None:
        return {}
    now = int(time.time() * 1000)
    return {k: {"next": qs.next, "inFlight": sum(1 for e in qs.pending.values() if e[1] > 0 and e[0] > now)}
            for k, qs in state.queues.items()}
