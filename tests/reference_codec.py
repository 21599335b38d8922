"""An independent pure-Python codec for RocketMQ store files, written from DESIGN.md only
(never calling rmqstore): the tests' oracle for commitlog records and consume-queue entries.

Record (all integers big-endian): TOTALSIZE i32, MAGICCODE i32, BODYCRC i32, QUEUEID i32,
FLAG i32, QUEUEOFFSET i64, PHYSICALOFFSET i64, SYSFLAG i32, BORNTIMESTAMP i64,
BORNHOST (4 or 16 bytes by SYSFLAG 0x10) + port i32, STORETIMESTAMP i64, STOREHOST (by 0x20)
+ port i32, RECONSUMETIMES i32, PREPAREDTRANSACTIONOFFSET i64, BODYLEN i32 + BODY,
TOPICLEN i8 (v2: i16) + TOPIC, PROPLEN i16 + PROPERTIES.
"""
import ipaddress
import os
import struct
import zlib

MAGIC_V1 = -626843481
MAGIC_V2 = -626843477
BLANK_MAGIC = -875286124
BORN_V6 = 0x10
STORE_V6 = 0x20
CQ_ENTRY = 20


class RefCorrupt(ValueError):
    def __init__(self, msg, offset):
        super().__init__(f"offset {offset}: {msg}")
        self.offset = offset


def java_hash(s):
    """Java String.hashCode over UTF-16 code units, as a signed 32-bit int."""
    data = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def body_crc(body):
    return zlib.crc32(body) & 0x7FFFFFFF


def format_host(addr, port):
    """Java InetSocketAddress.toString() without the leading '/': a.b.c.d:p or [x:..:x]:p."""
    if len(addr) == 4:
        return "%d.%d.%d.%d:%d" % (*addr, port)
    groups = ["%x" % int.from_bytes(addr[i:i + 2], "big") for i in range(0, 16, 2)]
    return "[%s]:%d" % (":".join(groups), port)


def pack_host(host):
    ip, _, port = host.lstrip("/").rpartition(":")
    return ipaddress.ip_address(ip.strip("[]")).packed + struct.pack(">i", int(port))


def msg_id(store_host_packed, phy_offset):
    return (store_host_packed + struct.pack(">q", phy_offset)).hex().upper()


def parse_properties(raw):
    """name\\x01value pairs joined by \\x02 (a trailing \\x02 allowed); RocketMQ drops pairs
    with an empty name or value."""
    out = {}
    for item in raw.decode("utf-8", "replace").split("\x02"):
        name, sep, value = item.partition("\x01")
        if sep and name and value:
            out[name] = value
    return out


def encode_properties(props, trailing=False):
    s = "\x02".join(f"{k}\x01{v}" for k, v in props.items())
    if trailing and s:
        s += "\x02"
    return s.encode("utf-8")


def decode_record(buf, pos=0, base_offset=0):
    """The record at ``buf[pos:]``: a dict of every field, ("blank", size), or ("end", 0).
    Raises RefCorrupt (with the global offset) when the record is malformed."""
    where = base_offset + pos
    avail = len(buf) - pos
    if avail < 8:
        if any(buf[pos:]):
            raise RefCorrupt("truncated header", where)
        return ("end", 0)
    total, magic = struct.unpack_from(">ii", buf, pos)
    if total == 0:
        return ("end", 0)
    if magic == BLANK_MAGIC:
        if not 8 <= total <= avail:
            raise RefCorrupt(f"blank record of size {total}", where)
        return ("blank", total)
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise RefCorrupt(f"magic {magic}", where)
    if total < 0 or total > avail:
        raise RefCorrupt(f"total size {total} with {avail} bytes left", where)
    rec = memoryview(buf)[pos:pos + total].tobytes()
    cur = [0]

    def take(n):
        if cur[0] + n > total:
            raise RefCorrupt(f"field at {cur[0]} of {n} bytes past total {total}", where)
        b = rec[cur[0]:cur[0] + n]
        cur[0] += n
        return b

    def i32():
        return struct.unpack(">i", take(4))[0]

    def i64():
        return struct.unpack(">q", take(8))[0]

    m = {}
    m["store_size"] = i32()
    m["magic"] = i32()
    m["body_crc"] = i32()
    m["queue_id"] = i32()
    m["flag"] = i32()
    m["queue_offset"] = i64()
    m["phy_offset"] = i64()
    m["sys_flag"] = sf = i32()
    m["born_timestamp"] = i64()
    born = take(16 if sf & BORN_V6 else 4)
    m["born_host_packed"] = born + take(4)
    m["born_host"] = format_host(born, struct.unpack(">i", m["born_host_packed"][-4:])[0])
    m["store_timestamp"] = i64()
    store = take(16 if sf & STORE_V6 else 4)
    m["store_host_packed"] = store + take(4)
    m["store_host"] = format_host(store, struct.unpack(">i", m["store_host_packed"][-4:])[0])
    m["reconsume_times"] = i32()
    m["prepared_transaction_offset"] = i64()
    blen = i32()
    if blen < 0:
        raise RefCorrupt(f"body length {blen}", where)
    m["body"] = take(blen)
    if magic == MAGIC_V1:
        tlen = take(1)[0]
        m["version"] = 1
    else:
        tlen = struct.unpack(">h", take(2))[0]
        m["version"] = 2
        if tlen < 0:
            raise RefCorrupt(f"topic length {tlen}", where)
    m["topic_bytes"] = take(tlen)
    m["topic"] = m["topic_bytes"].decode("utf-8", "replace")
    plen = struct.unpack(">h", take(2))[0]
    if plen < 0:
        raise RefCorrupt(f"properties length {plen}", where)
    m["properties_raw"] = take(plen)
    if cur[0] != total:
        raise RefCorrupt(f"fields end at {cur[0]}, total size {total}", where)
    m["properties"] = parse_properties(m["properties_raw"])
    m["msg_id"] = msg_id(m["store_host_packed"], m["phy_offset"])
    m["tags_code"] = java_hash(m["properties"]["TAGS"]) if "TAGS" in m["properties"] else 0
    m["record"] = rec
    return m


def encode_record(topic, body, properties, *, queue_id=0, flag=0, queue_offset=0, phy_offset=0, sys_flag=0,
                  born_timestamp=0, born_host="127.0.0.1:1", store_timestamp=0, store_host="127.0.0.1:10911",
                  reconsume_times=0, prepared_transaction_offset=0, version=1, trailing_separator=False):
    """Bytes of one record, laid out from DESIGN.md."""
    born = pack_host(born_host)
    store = pack_host(store_host)
    sys_flag = (sys_flag & ~(BORN_V6 | STORE_V6)) | (BORN_V6 if len(born) == 20 else 0) \
        | (STORE_V6 if len(store) == 20 else 0)
    t = topic.encode("utf-8")
    p = encode_properties(properties, trailing_separator)
    tl = struct.pack(">B", len(t)) if version == 1 else struct.pack(">h", len(t))
    rest = (struct.pack(">iiiqqiq", body_crc(body), queue_id, flag, queue_offset, phy_offset, sys_flag,
                        born_timestamp) + born + struct.pack(">q", store_timestamp) + store
            + struct.pack(">iqi", reconsume_times, prepared_transaction_offset, len(body)) + body
            + tl + t + struct.pack(">h", len(p)) + p)
    total = 8 + len(rest)
    return struct.pack(">ii", total, MAGIC_V1 if version == 1 else MAGIC_V2) + rest


def segment_files(directory):
    """(start offset, path) of every 20-digit-named file in ``directory``, in order."""
    out = []
    for name in os.listdir(directory):
        if len(name) == 20 and name.isdigit():
            out.append((int(name), os.path.join(directory, name)))
    return sorted(out)


def iter_commitlog(store_dir, with_blanks=False):
    """Every record of ``store_dir/commitlog`` in order (dicts), following BLANK records to
    the next file; with ``with_blanks`` also yields ("blank", global offset, size)."""
    for base, path in segment_files(os.path.join(store_dir, "commitlog")):
        with open(path, "rb") as f:
            data = f.read()
        pos = 0
        while pos < len(data):
            r = decode_record(data, pos, base)
            if isinstance(r, tuple):
                if r[0] == "blank" and with_blanks:
                    yield ("blank", base + pos, r[1])
                break
            yield r
            pos += r["store_size"]


def read_cq_entries(store_dir, topic, queue_id):
    """[(queue offset, phy offset, size, tags code)] of a consume queue's files, up to the
    first all-zero entry."""
    d = os.path.join(store_dir, "consumequeue", topic, str(queue_id))
    out = []
    for base, path in segment_files(d):
        with open(path, "rb") as f:
            data = f.read()
        for pos in range(0, len(data) - CQ_ENTRY + 1, CQ_ENTRY):
            phy, size, tags = struct.unpack_from(">qiq", data, pos)
            if phy == 0 and size == 0 and tags == 0:
                break
            out.append(((base + pos) // CQ_ENTRY, phy, size, tags))
    return out
