"""RocketMQ's getMessage (DefaultMessageStore.getMessage) as one C call: the argument
checks, the store's operation gate, the queue's state machine and the read, with no Python
frame between them (a Python get_message cost about 3 us a call, 1 of 32 messages' worth)."""
import logging

from rmqstore._gate cimport ArgChecks, Gate
from rmqstore._gate import MISSING, misfit
from rmqstore._layout cimport CqEntry
from rmqstore._segment cimport MappedSegment, queue_end, queue_find
from rmqstore._read import gather_messages
from rmqstore.consumer import GetMessageResult, GetMessageStatus, TagFilter, fill_result
from rmqstore.errors import InvalidArgumentError
from rmqstore.topics import is_safe_dirname

log = logging.getLogger("rmqstore.consumer")

cdef long long ENTRY = sizeof(CqEntry)   # bytes of a consume-queue entry
cdef object ALL = TagFilter(None)       # no expression: every message
# looking a member up on the Enum class costs about 0.1 us
cdef object FOUND = GetMessageStatus.FOUND
cdef object NO_MATCHED = GetMessageStatus.NO_MATCHED_MESSAGE
cdef object REMOVING = GetMessageStatus.MESSAGE_WAS_REMOVING
cdef object NEW = object.__new__
cdef object FILL = fill_result


cdef inline object result(status, long long next_offset, long long lo, long long hi, list msgs=None,
                          list problems=None):
    """A GetMessageResult of arguments known to be right, without the checks its __init__
    makes (a Python frame and a check per field) for results built by hand."""
    r = NEW(GetMessageResult)
    FILL(r, status, next_offset, lo, hi, [] if msgs is None else msgs, [] if problems is None else problems)
    return r


cdef class QueueReader:
    """MessageStore.get_messages over a consume-queue table and the commitlog's segments
    (a SegmentQueue); ``limits``: the store's (max_transfer_count_on_message_in_memory,
    max_transfer_bytes_on_message_in_memory, consume_queue_entries)."""
    cdef Gate gate
    cdef ArgChecks checks
    cdef object queues, segments
    cdef Py_ssize_t max_msgs, per_file
    cdef long long max_bytes

    def __cinit__(self, Gate gate not None, ArgChecks checks not None, queues not None, segments not None,
                 tuple limits not None):
        self.gate = gate
        self.checks = checks
        self.queues = queues
        self.segments = segments
        self.max_msgs, self.max_bytes, self.per_file = limits

    def get_messages(self, topic=MISSING, queue_id=MISSING, offset=MISSING, max_count=32, tags=None, *more,
                     **unknown):
        """MessageStore.get_messages (see its documentation)."""
        if topic is MISSING or queue_id is MISSING or offset is MISSING or more or unknown:
            misfit("get_messages", (topic, queue_id, offset, max_count, tags), more, unknown)
        return self.gate.read_logics(read_once, self, self.checks.run((topic, queue_id, offset, max_count, tags), None))

    def rebind(self, queues not None):
        """Read the consume-queue table ``queues`` from now on (a rebuild's new one)."""
        self.queues = queues

    cdef object read(self, topic, queue_id, object offset, object max_count, tags):
        """Up to ``max_count`` messages of one queue from ``offset``, filtered by a tag
        expression; statuses and next offsets as RocketMQ's (a call never crosses a
        consume-queue file). The arguments passed get_messages' checks (topic a str, the
        numbers int64s)."""
        cdef long long lo, hi, off, n, avail, window, first, per_file, pos
        cdef MappedSegment seg
        if max_count <= 0:
            raise InvalidArgumentError(f"max_count must be a positive int, got {max_count!r}")
        flt = TagFilter(tags) if tags is not None else ALL
        cq = self.queues.queues.get((topic, queue_id))     # ConsumeQueueTable.get, and below the
        if cq is None:                                      # ConsumeQueue calls, without Python frames
            # RocketMQ's findConsumeQueue creates any queue asked for, so an unknown
            # topic/queue answers NO_MESSAGE_IN_QUEUE; one that cannot exist does not.
            if queue_id < 0 or not is_safe_dirname(topic):
                return result(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
            return result(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
        files = cq.segments
        lo, hi = cq.min_logic_offset // ENTRY, queue_end(files) // ENTRY
        if hi == 0:
            return result(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0, lo, hi)
        if offset < lo:
            return result(GetMessageStatus.OFFSET_TOO_SMALL, lo, lo, hi)
        if offset == hi:
            return result(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, lo, hi)
        if offset > hi:
            # 4.9.8 and 5.3.3 both answer nextBeginOffset = maxOffset here (manifests)
            return result(GetMessageStatus.OFFSET_OVERFLOW_BADLY, hi, lo, hi)
        off = offset        # within [lo, hi): fits
        seg = queue_find(files, off * ENTRY)     # the file holding the entry, and its entries from there
        avail = 0 if seg is None else max(0, seg.wrote_pos - (off * ENTRY - seg.base_offset)) // ENTRY
        if avail == 0:
            per_file = self.per_file
            return result(GetMessageStatus.OFFSET_FOUND_NULL, off - off % per_file + per_file, lo, hi)
        # RocketMQ looks at up to 800 entries (16000 bytes) of the file. Without a tag filter
        # the first max_count usually decide the answer: read those, and the 800 only when the
        # walk used them all without filling the batch (holes, records gone).
        n = max_count       # checked to fit an int64
        window = min(avail, max(800, n))
        first = window if flt.codes is not None else min(window, n)
        pos = off * ENTRY - seg.base_offset
        found = self.gather(seg, pos, first, n, flt)
        if len(found[0]) < n and found[1] == first < window:
            found = self.gather(seg, pos, window, n, flt)
        msgs, used, removing, problems = found
        for k, _, _, why in problems:
            if why:
                log.warning("%s/%d offset %d: %s", topic, queue_id, off + k, why)
        return result(FOUND if msgs else REMOVING if removing else NO_MATCHED, off + used, lo, hi, msgs,
                                [(off + k, phy, size) for k, phy, size, _ in problems])

    cdef tuple gather(self, seg, pos, long long count, long long max_count, flt):
        """gather_messages over ``count`` entries at ``pos`` of ``seg``, with the store's limits."""
        segs = self.segments
        return gather_messages(segs.segments, seg, pos, count, max_count, self.max_msgs, self.max_bytes,
                               queue_end(segs), segs.file_size, flt.codes, flt.tags)


cdef object read_once(object reader, tuple a):
    """QueueReader.read of get_messages' checked arguments (Gate.read_logics)."""
    return (<QueueReader>reader).read(a[0], a[1], a[2], a[3], a[4])
