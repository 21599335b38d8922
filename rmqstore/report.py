"""The documents the front ends (the rmqstore command, the console) report of a store: its
stats, a message under RocketMQ's MessageExt names, CRC32C digests of its commitlog
segments; every key in camelCase, the one key convention of their JSON."""
from __future__ import annotations

import base64
import os
from typing import Any, Callable

import crc32c

from rmqstore import batch
from rmqstore._message import MessageExt
from rmqstore.files import open_reader
from rmqstore.store import MessageStore

BODY_MODES = ("utf8", "base64", "none")
_CHUNK = 1 << 20   # bytes a digest reads at a time


def camel(name: str) -> str:
    """A snake_case name in camelCase: ``end_offset`` -> ``endOffset``."""
    head, *rest = name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def camel_keys(obj: Any) -> Any:
    """``obj`` (dicts, lists, values) with every dict key in camelCase. The keys of a
    ``properties`` dict are message data and stay as they are."""
    if isinstance(obj, dict):
        return {camel(k): v if k == "properties" else camel_keys(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [camel_keys(v) for v in obj]
    return obj


def message_dict(m: MessageExt, body: str = "utf8") -> dict[str, Any]:
    """A stored message under RocketMQ's MessageExt names. ``body``: ``utf8`` (falls back
    to base64 for bytes that are not UTF-8; ``bodyEncoding`` says which), ``base64`` or
    ``none``. Bodies are given as stored (COMPRESSED ones stay compressed)."""
    d = {
        "topic": m.topic, "queueId": m.queue_id, "queueOffset": m.queue_offset,
        "commitLogOffset": m.phy_offset, "storeSize": m.store_size, "msgId": m.msg_id,
        "uniqKey": m.uniq_key, "tags": m.tags, "keys": m.properties.get("KEYS"),
        "bornTimestamp": m.born_timestamp, "storeTimestamp": m.store_timestamp,
        "bornHost": m.born_host, "storeHost": m.store_host, "bodyCRC": m.body_crc,
        "sysFlag": m.sys_flag, "flag": m.flag, "reconsumeTimes": m.reconsume_times,
        "preparedTransactionOffset": m.prepared_transaction_offset, "version": m.version,
        "properties": m.properties, "bodyLength": len(m.body),
    }
    if body != "none":
        data = m.body
        if body == "utf8":
            try:
                d["body"], d["bodyEncoding"] = data.decode("utf-8"), "utf8"
                return d
            except UnicodeDecodeError:
                pass
        d["body"], d["bodyEncoding"] = base64.b64encode(data).decode("ascii"), "base64"
    return d


def _index_files(s: MessageStore) -> list[dict[str, Any]]:
    """Header of every index file (RocketMQ IndexHeader) and its geometry."""
    out = []
    for f in s.index.files if s.index is not None else ():
        begin_ts, end_ts, begin_phy, end_phy, used_slots, count = f.header
        out.append({"file": os.path.basename(f.seg.path), "slots": f.slots, "capacity": f.entries - 1,
                    "beginTimestamp": begin_ts, "endTimestamp": end_ts, "beginPhyOffset": begin_phy,
                    "endPhyOffset": end_phy, "hashSlotCount": used_slots, "entries": max(0, count - 1)})
    return out


def store_stats(s: MessageStore) -> dict[str, Any]:
    """The store's commitlog range and segments, its queues' offsets, index files and checkpoint."""
    segs = s.commitlog.segments
    queues = [{"topic": t, "queueId": q, "minOffset": s.min_offset(t, q), "maxOffset": s.max_offset(t, q),
               "messages": s.max_offset(t, q) - s.min_offset(t, q)}
              for t in s.topics() for q in s.queue_ids(t)]
    return {
        "path": s.path, "cleanShutdown": s.clean_shutdown,
        "commitlog": {"segmentSize": segs.file_size, "segments": len(segs.segments),
                      "bytes": len(segs.segments) * segs.file_size,
                      "minOffset": s.min_phy_offset, "maxOffset": s.max_phy_offset},
        "consumeQueueEntriesPerFile": s.config.consume_queue_entries,
        "topics": s.topics(), "queues": queues, "index": _index_files(s),
        "checkpoint": {"exists": s.checkpoint.existed, **s.checkpoint.as_dict()},
    }


def segment_files(store: str | os.PathLike[str]) -> list[tuple[int, str, int]]:
    """(offset, path, size) of the commitlog segments of ``store`` (``batch.segment_files``)."""
    return [(base, path, size) for path, base, size in batch.segment_files(store)]


def digest_segments(files: list[tuple[int, str, int]], update: Callable[[int], Any]) -> dict[int, int]:
    """{offset: CRC32C of the file} for (offset, path, size) ``files``; ``update(n)`` after
    each ``n`` bytes read."""
    out = {}
    for off, path, _ in files:
        crc = 0
        with open_reader(path) as f:
            while chunk := f.read(_CHUNK):
                crc = crc32c.crc32c(chunk, crc)
                update(len(chunk))
        out[off] = crc
    return out


def segment_digests(files: list[tuple[int, str, int]], update: Callable[[int], Any]) -> list[dict[str, Any]]:
    """Per (offset, path, size) of ``files``: its file name, offset, size and CRC32C (hex)."""
    crcs = digest_segments(files, update)
    return [{"file": os.path.basename(p), "offset": off, "size": n, "crc32c": f"{crcs[off]:08x}"}
            for off, p, n in files]
