"""Protocol messages (``definition_pb2.Message``) to store messages and back.

A sent message is stored the way a RocketMQ broker stores it: the client's message id as
``UNIQ_KEY``, tag as ``TAGS``, keys space-separated in ``KEYS``, the FIFO message group as
``__SHARDINGKEY`` and a delivery time as ``__STARTDELIVERTIME`` (ms); user properties as they
are. ``rmqstore query`` / ``msg`` therefore find it by key or message id.
"""
from __future__ import annotations

import functools
import re
import time
import zlib

from rocketmq.grpc_protocol import definition_pb2

from rmqstore._message import Message, MessageExt
from rmqstore._record import pack_host

Code = definition_pb2.Code
UNIQ_KEY = "UNIQ_KEY"
TAGS = "TAGS"
KEYS = "KEYS"
MESSAGE_GROUP = "__SHARDINGKEY"
DELIVER_MS = "__STARTDELIVERTIME"
DLQ_PREFIX = "%DLQ%"      # a group's dead-letter topic is this + the group
MAX_DELAY_MS = 40 * 86_400_000      # how far ahead a delivery time may be
# RocketMQ proxy's defaults: user properties (count; bytes of their names and values with the
# tag and keys), message group bytes (a group of this many or more is refused)
MAX_USER_PROPERTIES = 128
MAX_USER_PROPERTY_BYTES = 16 * 1024
MAX_GROUP_BYTES = 64
PROPERTIES_MAX = 32767      # a record's properties length is an i16
RETRY_PREFIX = "%RETRY%"    # a group's retry topic is this + the group
# a record's bytes besides its body, at most: the fixed fields with IPv6 hosts, a topic of 255
# bytes with its i16 length, the properties with theirs
RECORD_OVERHEAD = 4 * 5 + 8 * 2 + 4 + 8 + 20 + 8 + 20 + 4 + 8 + 4 + 2 + 255 + 2 + PROPERTIES_MAX
SYSTEM_PROPERTIES = frozenset({UNIQ_KEY, TAGS, KEYS, MESSAGE_GROUP, DELIVER_MS, "DLQ_ORIGIN_TOPIC",
                               "DLQ_ORIGIN_MESSAGE_ID"})
# names a sent message's user properties may not use: ours, and RocketMQ's MessageConst.STRING_HASH_SET,
# which its proxy refuses (DELAY would move the message to SCHEDULE_TOPIC_XXXX, never delivered here)
RESERVED_PROPERTIES = SYSTEM_PROPERTIES | frozenset(
    "TRACE_ON MSG_REGION WAIT DELAY RETRY_TOPIC REAL_TOPIC REAL_QID TRAN_MSG PGROUP MIN_OFFSET MAX_OFFSET "
    "BUYER_ID ORIGIN_MESSAGE_ID TRANSFER_FLAG CORRECTION_FLAG MQ2_FLAG RECONSUME_TIME MAX_RECONSUME_TIMES "
    "CONSUME_START_TIME POP_CK POP_CK_OFFSET 1ST_POP_TIME TRAN_PREPARED_QUEUE_OFFSET DUP_INFO EXTEND_UNIQ_INFO "
    "INSTANCE_ID CORRELATION_ID REPLY_TO_CLIENT TTL ARRIVE_TIME PUSH_REPLY_TIME CLUSTER MSG_TYPE "
    "INNER_MULTI_QUEUE_OFFSET TIMER_DELAY_SEC TIMER_DELIVER_MS TIMER_ENQUEUE_MS TIMER_DEQUEUE_MS TIMER_ROLL_TIMES "
    "TIMER_OUT_MS TIMER_DEL_UNIQKEY TIMER_DELAY_LEVEL __BORNHOST BORN_TIMESTAMP TRANSACTION_CHECK_TIMES "
    "CHECK_IMMUNITY_TIME_IN_SECONDS".split())


class RequestError(Exception):
    """A request the endpoint refuses: carries the protocol status code to answer with."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def body_limit(max_message_size: int, segment_size: int) -> int:
    """The largest body the endpoint takes (and tells clients): the store's limit on a whole
    record (and a segment's room) less the most a record's other fields can take, so a body of
    this size is stored whatever its topic and properties. A limit too small to leave room for
    the largest properties leaves room for the fixed fields and topic only."""
    limit = min(max_message_size, segment_size - 8)
    room = limit - RECORD_OVERHEAD
    return room if room >= RECORD_OVERHEAD else max(1, limit - (RECORD_OVERHEAD - PROPERTIES_MAX))


def _millis(ts: object) -> int:
    return int(ts.seconds) * 1000 + int(ts.nanos) // 1_000_000  # type: ignore[attr-defined]


def _set_millis(ts: object, ms: int) -> None:
    ts.seconds, ts.nanos = divmod(ms, 1000)  # type: ignore[attr-defined]
    ts.nanos *= 1_000_000  # type: ignore[attr-defined]


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]").search   # Java's Character.isISOControl, as the proxy checks
_SPACE = re.compile(r"\s").search


def _control(text: str) -> bool:
    """Whether some character of ``text`` is a control character."""
    return _CONTROL(text) is not None


def _utf8(text: str) -> int:
    return len(text.encode())


def _born_ms(sp: definition_pb2.SystemProperties) -> int:
    """The client's born time in ms; 0 (the store time) when it is absent or not one the
    record holds (the proxy ignores an invalid one)."""
    ms = _millis(sp.born_timestamp) if sp.HasField("born_timestamp") else 0
    return ms if 0 <= ms < 1 << 63 else 0


def _gunzip(data: bytes, limit: int) -> bytes:
    """A GZIP body (one member or several, as gzip reads them) uncompressed; RequestError
    when it is over ``limit`` bytes so, truncated, or not GZIP (or with bytes after it)."""
    out: list[bytes] = []
    size, whole = 0, len(data)
    while data:
        d = zlib.decompressobj(31)
        try:
            out.append(d.decompress(data, limit + 1 - size))
        except zlib.error as e:
            raise RequestError(Code.MESSAGE_CORRUPTED, f"GZIP body at byte {whole - len(data)}: {e}") from None
        size += len(out[-1])
        if size > limit or d.unconsumed_tail:
            raise RequestError(Code.MESSAGE_BODY_TOO_LARGE, f"body is over {limit} bytes uncompressed")
        if not d.eof:
            raise RequestError(Code.MESSAGE_CORRUPTED, "GZIP body is truncated")
        data = d.unused_data
    return b"".join(out)


@functools.lru_cache(maxsize=1024)
def _peer_host(peer: str) -> bytes | None:
    """gRPC's ``ipv4:1.2.3.4:5`` / ``ipv6:[::1]:5`` packed as a record's born host; None for
    anything else (parsed once a peer: a client sends many messages)."""
    kind, _, addr = peer.partition(":")
    return pack_host(addr) if kind in ("ipv4", "ipv6") else None


def to_store(pb: definition_pb2.Message, peer: str, max_body: int) -> Message:
    """The store message for a sent protocol message; RequestError, with the code RocketMQ's
    proxy answers, for what cannot be stored."""
    sp = pb.system_properties
    mid, tag, keys = sp.message_id, sp.tag, list(sp.keys)
    if not mid.strip() or _control(mid):
        raise RequestError(Code.ILLEGAL_MESSAGE_ID, f"message_id {mid[:80]!r} is blank or holds a control character")
    body = _gunzip(pb.body, max_body) if sp.body_encoding == definition_pb2.Encoding.GZIP else pb.body
    if not body:
        raise RequestError(Code.MESSAGE_BODY_EMPTY, "message body is empty")
    if len(body) > max_body:
        raise RequestError(Code.MESSAGE_BODY_TOO_LARGE, f"body of {len(body)} bytes is over the limit of {max_body}")
    if tag and ("|" in tag or tag.isspace() or _control(tag)):
        raise RequestError(Code.ILLEGAL_MESSAGE_TAG, f"tag {tag!r} is blank or holds '|' or a control character")
    if keys and any(not k or _SPACE(k) or _control(k) for k in keys):
        raise RequestError(Code.ILLEGAL_MESSAGE_KEY, "keys must be non-empty and contain no whitespace or control "
                           "character")
    props = dict(pb.user_properties)
    user_bytes = _utf8(tag) + sum(map(_utf8, keys))
    if props:
        clash = RESERVED_PROPERTIES.intersection(props)
        if clash:
            raise RequestError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"reserved property name(s): "
                               f"{', '.join(sorted(clash))}")
        bad = sorted(k for k, v in props.items() if not k or _control(k) or _control(v))
        if bad:
            raise RequestError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"user property {bad[0]!r} has an empty name or a "
                               "control character in its name or value")
        user_bytes += sum(_utf8(k) + _utf8(v) for k, v in props.items())
    if len(props) > MAX_USER_PROPERTIES or user_bytes > MAX_USER_PROPERTY_BYTES:
        raise RequestError(Code.MESSAGE_PROPERTIES_TOO_LARGE, f"{len(props)} user properties of {user_bytes} bytes "
                           f"(with tag and keys): at most {MAX_USER_PROPERTIES} of {MAX_USER_PROPERTY_BYTES} bytes")
    props[UNIQ_KEY] = mid
    group = sp.message_group
    if group:
        if not group.strip() or _utf8(group) >= MAX_GROUP_BYTES or _control(group):
            raise RequestError(Code.ILLEGAL_MESSAGE_GROUP, f"message group {group[:80]!r} is blank, holds a control "
                               f"character or is not under {MAX_GROUP_BYTES} bytes")
        props[MESSAGE_GROUP] = group
    if sp.HasField("delivery_timestamp"):
        due = _millis(sp.delivery_timestamp)
        if due > time.time() * 1000 + MAX_DELAY_MS:
            raise RequestError(Code.ILLEGAL_DELIVERY_TIME, f"delivery time {due} is more than 40 days ahead")
        props[DELIVER_MS] = str(due)
    size = sum(_utf8(k) + _utf8(v) + 2 for k, v in props.items())
    size += (len(TAGS) + 2 + _utf8(tag) if tag else 0) + (len(KEYS) + 2 + _utf8(" ".join(keys)) if keys else 0)
    if size > PROPERTIES_MAX:
        raise RequestError(Code.MESSAGE_PROPERTIES_TOO_LARGE, f"properties of {size} bytes (the message id's "
                           f"{_utf8(mid)} among them) exceed {PROPERTIES_MAX}")
    msg = Message(pb.topic.name, body, tags=tag or None, keys=keys or None, properties=props,
                  born_timestamp=_born_ms(sp))
    msg.born_host_packed = _peer_host(peer)
    return msg


def message_type(props: dict[str, str]) -> int:
    if props.get("TRAN_MSG") == "true":     # kept on a committed transactional message, as the broker keeps it
        return definition_pb2.MessageType.TRANSACTION
    if MESSAGE_GROUP in props:
        return definition_pb2.MessageType.FIFO
    if DELIVER_MS in props:
        return definition_pb2.MessageType.DELAY
    return definition_pb2.MessageType.NORMAL


def deliver_at(m: MessageExt) -> int:
    """The delivery time (ms) of a delayed message, 0 for any other (and for a time that is
    not a number in 0..2^63-1: the property comes from disk, untrusted)."""
    v = m.properties.get(DELIVER_MS)
    try:
        due = int(v) if v else 0
    except ValueError:
        return 0
    return due if 0 <= due < 1 << 63 else 0


def to_proto(m: MessageExt, out: definition_pb2.Message, receipt: str, attempt: int, invisible_ms: int) -> None:
    """Fill ``out`` with stored message ``m`` as handed to a consumer."""
    props = m.properties
    out.topic.name = m.topic
    out.body = m.body
    for k, v in props.items():
        if k not in RESERVED_PROPERTIES and v is not None:   # the user's: RocketMQ's own names are refused on send
            out.user_properties[k] = v
    sp = out.system_properties
    if props.get(TAGS):
        sp.tag = props[TAGS]
    sp.keys.extend(m.keys)
    sp.message_id = props.get(UNIQ_KEY) or m.msg_id
    sp.body_digest.type = definition_pb2.DigestType.CRC32
    sp.body_digest.checksum = format(zlib.crc32(m.body) & 0xFFFFFFFF, "08X")
    sp.body_encoding = definition_pb2.Encoding.IDENTITY
    sp.message_type = message_type(props)
    _set_millis(sp.born_timestamp, m.born_timestamp)
    sp.born_host = m.born_host
    _set_millis(sp.store_timestamp, m.store_timestamp)
    sp.store_host = m.store_host
    if DELIVER_MS in props:
        _set_millis(sp.delivery_timestamp, deliver_at(m))
    if MESSAGE_GROUP in props:
        sp.message_group = props[MESSAGE_GROUP]
    sp.receipt_handle = receipt
    sp.queue_id = m.queue_id
    sp.queue_offset = m.queue_offset
    sp.invisible_duration.seconds, ms = divmod(invisible_ms, 1000)
    sp.invisible_duration.nanos = ms * 1_000_000
    sp.delivery_attempt = attempt


def to_dead_letter(m: MessageExt, group: str, attempts: int) -> Message:
    """A copy of ``m`` for the group's ``%DLQ%`` topic (same UNIQ_KEY, origin noted)."""
    props = {k: v for k, v in m.properties.items() if v is not None and k not in (TAGS, KEYS)}
    props["DLQ_ORIGIN_TOPIC"] = m.topic
    props["DLQ_ORIGIN_MESSAGE_ID"] = props.get(UNIQ_KEY) or m.msg_id
    return Message(DLQ_PREFIX + group, m.body, tags=m.tags, keys=m.keys or None, properties=props,
                   born_timestamp=m.born_timestamp, reconsume_times=max(0, attempts - 1))
