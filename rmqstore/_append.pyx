# cython: boundscheck=False, wraparound=False, cdivision=True
"""The Appender, which puts messages, batches and column rows at the end of the commitlog
under its write lock (queue ids, queue offsets, the roll) through the encoder in _encode,
and the StoreWriter, MessageStore.put and put_batch as C methods over it."""
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING
from libc.stdlib cimport free, malloc, realloc
from cpython.pythread cimport (PyThread_type_lock, PyThread_allocate_lock, PyThread_free_lock, PyThread_get_thread_ident,
                               PyThread_acquire_lock, PyThread_release_lock, NOWAIT_LOCK, WAIT_LOCK)
from libc.stdint cimport int32_t, int64_t
from posix.time cimport clock_gettime, timespec, CLOCK_REALTIME
from rmqstore._layout cimport *
from rmqstore._message cimport Message, PutResult, text_arg
from rmqstore._message import queue_id_arg, sys_flag_arg
from rmqstore._segment cimport MappedSegment, SegmentList, announce, ensure, made, publish
from rmqstore._gate cimport Gate
from rmqstore._flusher cimport Flusher
from rmqstore._gate import MISSING, misfit
from rmqstore._encode cimport (NOGIL_BYTES, STAGE_BYTES, RecordHead, Rows, encode, held_body, properties_bytes,
                               record_size, write_blank, write_run, write_staged)
from rmqstore._rows cimport BodyRows, column_offsets, int_column, zeros
import numpy as np
from rmqstore.errors import (InvalidArgumentError, InvalidArgumentTypeError, InvalidTopicError, MessageTooLargeError,
                             ReentrantCallError, StoreClosedError)

cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object s, Py_ssize_t *size) except NULL


cdef inline int64_t now_ms() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <int64_t>ts.tv_sec * 1000 + ts.tv_nsec // 1000000


cdef enum:
    DENSE_QUEUES = 1024     # queue ids below this keep their next offset in a C array
cdef int64_t NOT_SET = -0x7FFFFFFFFFFFFFFF - 1     # in that array: no offset set for the queue


@cython.final
cdef class _TopicState:
    """One topic's write state: next round-robin queue id, next offset per queue id (0
    until one is set): ids in [0, DENSE_QUEUES) in a C array, grown to the largest id met
    (a dict of ints cost a put 370 instructions), the rest in a dict."""
    cdef int32_t next_qid
    cdef bint checked                   # the name passed check_topic
    cdef int64_t *dense                 # next offset per queue id below ndense, or NOT_SET
    cdef int32_t ndense
    cdef dict sparse                    # other queue ids (a corrupt record's may be negative) -> next offset

    def __cinit__(self):
        self.sparse = {}

    def __dealloc__(self):
        free(self.dense)

    cdef inline int64_t next_offset(self, int64_t qid) except? -1:
        if 0 <= qid < self.ndense:
            return 0 if self.dense[qid] == NOT_SET else self.dense[qid]
        return 0 if 0 <= qid < DENSE_QUEUES else self.sparse.get(qid, 0)

    cdef int set_next(self, int64_t qid, int64_t offset) except -1:
        cdef int32_t n, i
        cdef int64_t *grown
        if offset == NOT_SET:
            raise InvalidArgumentError(f"queue {qid}: next offset {offset} is out of range")
        if not 0 <= qid < DENSE_QUEUES:
            self.sparse[qid] = offset
            return 0
        if qid >= self.ndense:
            n = min(DENSE_QUEUES, max(qid + 1, 2 * self.ndense, 8))
            grown = <int64_t *>realloc(self.dense, n * sizeof(int64_t))
            if grown == NULL:
                raise MemoryError()
            for i in range(self.ndense, n):
                grown[i] = NOT_SET
            self.dense, self.ndense = grown, n
        self.dense[qid] = offset
        return 0

    cdef dict offsets(self):
        """Queue id -> next offset, of the queues set."""
        cdef int32_t q
        out = {q: self.dense[q] for q in range(self.ndense) if self.dense[q] != NOT_SET}
        out.update(self.sparse)
        return out

    cdef void clear(self) noexcept:
        free(self.dense)
        self.dense, self.ndense = NULL, 0
        self.sparse.clear()


@cython.final
@cython.no_gc           # refers to nothing that refers back to it
@cython.freelist(8)
cdef class _Plan:
    """A checked message and where it goes (Appender._plan): what _write encodes."""
    cdef Message msg
    cdef str topic                      # the effective topic (DELAY: SCHEDULE_TOPIC_XXXX)
    cdef bytes props                    # the properties string, laid out
    cdef int32_t queue_id
    cdef _TopicState state              # the topic's
    cdef int64_t size                   # of the record
    cdef object body                    # held: bytes, or a memoryview of the caller's buffer
    cdef bytes born                     # packed born host, None: the store's


cdef class Appender:
    """The write side of a commitlog: picks the queue id (round robin per topic when none
    is given), assigns the queue offset (PREPARED / ROLLBACK get 0 and do not advance it)
    and encodes the record at the end of the last segment, rolling when it is full; a
    batch runs as one C loop with one store timestamp. Queue ids, offsets and the
    transaction rule stay here, not in Python: the same rules in Python over the encoder
    measured 1.74 us per put against 1.00 us (issue 10).

    Policy stays in Python callbacks, called only when needed: ``check_topic(topic)`` the
    first time a topic is written (raises if the name is not allowed), ``delay(msg, topic,
    queue_id, props)`` -> (topic, queue_id, props) for a message with a DELAY property, and
    ``warm(seg)`` once the end of written data reaches ``warm_mark`` (a commitlog offset),
    and ``stamp(msg)`` (None: off) on every message before it is checked (UNIQ_KEY).
    ``stage_bulk``: put_columns writes batches of NOGIL_BYTES or more with pwrite
    (write_staged), for a commitlog whose pages nobody faults in ahead of the writer.
    The segment queue is used through its public face only: ``last``, ``roll()``,
    ``make_room()``, ``premade``, ``prepare_next()`` and ``file_size`` (read once: it never
    changes).
    Thread-safe: ``put``/``put_batch`` hold the appender's own write lock, a C lock taken
    without a Python call when free (waiting for it releases the GIL). ``with appender:``
    holds it for other writers of the commitlog (retention, truncation).
    ``failed``: the commitlog's sticky I/O error (CommitLog.failed), None while writable."""
    cdef public int64_t warm_mark
    cdef public object failed
    cdef PyThread_type_lock _lock
    cdef unsigned long holder       # the thread holding _lock (0: none), to refuse a re-entrant take
    cdef dict topics                    # topic -> _TopicState
    cdef bint stage_bulk
    cdef char *stage                    # put_columns' bulk runs (STAGE_BYTES, allocated on first use)
    cdef str last_topic                 # the topic _plan checked last, and its state
    cdef _TopicState last_state
    cdef object segments, check_topic, delay, warm, stamp
    cdef SegmentList published          # segments, for its C fields
    cdef MappedSegment seg              # the last segment, during a call
    cdef bytes store_host
    cdef int version
    cdef int32_t queue_nums
    cdef int64_t max_size
    cdef int64_t seg_size               # the segments' file size
    cdef bint rolled                    # _roll took a segment of published.premade: prepare_next due
    cdef object deferred                # what warm raised in the middle of a write, raised at its end

    def __cinit__(self, segments, bytes store_host not None, int version, int64_t max_size, int32_t queue_nums,
                  check_topic, delay, warm, stamp=None, bint stage_bulk=False):
        if queue_nums <= 0:
            raise InvalidArgumentError("queue_nums must be positive")
        if not isinstance(segments, SegmentList) or not (callable(check_topic) and callable(delay) and callable(warm)):
            raise InvalidArgumentTypeError("an Appender takes a segment queue and callable check_topic, delay, warm")
        self.segments = self.published = segments
        self.store_host = store_host
        self.version = version
        self.max_size = max_size
        self.seg_size = self.published.file_size
        self.queue_nums = queue_nums
        self.check_topic = check_topic
        self.delay = delay
        self.warm = warm
        self.stamp = stamp
        self.stage_bulk = stage_bulk
        self.topics = {}
        self.warm_mark = 0
        self._lock = PyThread_allocate_lock()
        if self._lock == NULL:
            raise MemoryError("cannot allocate the commitlog write lock")

    def __dealloc__(self):
        if self._lock != NULL:
            PyThread_free_lock(self._lock)
        free(self.stage)

    cdef inline int _acquire(self) except -1:
        """Take the write lock; ReentrantCallError if this thread holds it already (a put
        from a callback run under it: rebuild's progress, put_batch's iterable), which
        would wait for itself forever."""
        cdef unsigned long me = PyThread_get_thread_ident()
        if not PyThread_acquire_lock(self._lock, NOWAIT_LOCK):
            if self.holder == me:
                raise ReentrantCallError("the commitlog write lock is held by this thread: a write (or rebuild, "
                                         "clean_expired) from within one (its callback or iterable) would wait forever")
            with nogil:
                PyThread_acquire_lock(self._lock, WAIT_LOCK)
        self.holder = me
        return 0

    cdef inline int _release(self) except -1:
        """Release the write lock. Warm's error is still pending only when the write failed
        after it: a KeyboardInterrupt (or SystemExit) is raised then, the write's error its
        context, so the user's Ctrl-C is not lost; an ordinary error of warm only cost
        warmth and gives way to the write's."""
        cdef object e = self.deferred
        self.holder = 0
        self.deferred = None
        PyThread_release_lock(self._lock)
        if e is not None and not isinstance(e, Exception):
            raise e
        return 0

    def __enter__(self):
        self._acquire()
        return self

    def __exit__(self, *exc):
        self._release()

    def release_stage(self):
        """Free put_columns' bulk buffer now (at close: a closed store may wait for a
        collection to be freed); a later bulk batch allocates it again."""
        self._acquire()
        free(self.stage)
        self.stage = NULL
        self._release()

    @property
    def held_here(self):
        """Whether this thread holds the write lock (is inside a write, rebuild or clean)."""
        return self.holder == PyThread_get_thread_ident()

    @property
    def queue_offsets(self):
        """(topic, queue_id) -> next queue offset, as a new dict."""
        cdef _TopicState st
        return {(t, q): o for t, st in self.topics.items() for q, o in st.offsets().items()}

    @queue_offsets.setter
    def queue_offsets(self, table):
        cdef _TopicState st
        for st in self.topics.values():
            st.clear()
        for (t, q), o in table.items():
            self._state(t).set_next(q, o)

    cdef _TopicState _state(self, str topic):
        cdef _TopicState st = self.topics.get(topic)
        if st is None:
            st = self.topics[topic] = _TopicState()
        return st

    def put(self, msg, queue_id=None):
        """Append one message; returns its PutResult."""
        return self._put(msg, queue_id)

    cdef PutResult _put(self, object msg, object queue_id):
        cdef _Plan plan
        cdef PutResult res
        if not isinstance(msg, Message):
            raise InvalidArgumentTypeError(f"put takes a Message, not {type(msg).__name__}")
        if queue_id is not None:
            queue_id = queue_id_arg(queue_id)
        self._acquire()
        try:
            plan = self._plan(<Message>msg, queue_id)
            self.seg = self._last()
            res = self._write(plan, now_ms())
            if self.rolled or self.deferred is not None:
                self._finish()
            return res
        finally:
            self._release()

    def put_batch(self, msgs, queue_id=None):
        """Append every message of ``msgs`` with one store timestamp; list of PutResult.
        ``queue_id``: None (round robin), one queue id, or a list/tuple of one per message
        (each a queue id or None).
        All or nothing: every message is checked (type, topic, properties, size, queue id),
        and every segment it rolls into is created, before the first is written, so a bad
        message anywhere or a full disk stores none of them."""
        return self._put_batch(msgs, queue_id)

    cdef list _put_batch(self, object msgs, object queue_id):
        # an error checking message i names it: "put_batch message i: ...", .message_index i
        cdef list plans = [], out = [], qids = None
        cdef Py_ssize_t i = 0
        if isinstance(queue_id, (list, tuple)):
            qids = [queue_id_arg(q) for q in queue_id]
        else:
            queue_id = queue_id_arg(queue_id)
        it = None
        if not isinstance(msgs, (str, bytes, Message)):
            try:   # what iter() refuses (an int, a 0-d numpy array despite its __iter__) is no iterable
                it = iter(msgs)
            except TypeError:
                pass
        if it is None:
            raise InvalidArgumentTypeError(f"put_batch takes an iterable of Message, not {type(msgs).__name__}")
        self._acquire()
        try:
            for m in it:
                if not isinstance(m, Message):
                    raise batch_error(InvalidArgumentTypeError(f"{type(m).__name__} where a Message is due"), i)
                if qids is not None:
                    if i >= len(qids):
                        raise InvalidArgumentError(f"put_batch: more messages than the {len(qids)} queue ids")
                    queue_id = qids[i]
                try:
                    plans.append(self._plan(<Message>m, queue_id))
                except (InvalidArgumentError, InvalidTopicError, MessageTooLargeError) as e:
                    raise batch_error(e, i) from None
                i += 1
            if qids is not None and i != len(qids):
                raise InvalidArgumentError(f"put_batch: {i} messages for {len(qids)} queue ids")
            ts = now_ms()
            self.seg = self._last()
            self._make_room(np.array([(<_Plan>plan).size for plan in plans], np.int64))
            for plan in plans:
                out.append(self._write(plan, ts))
            if self.rolled or self.deferred is not None:
                self._finish()
            return out
        finally:
            self._release()

    def put_columns(self, list topics not None, topic_ids, body_data not None, body_offsets,
                    props_data=None, props_offsets=None, queue_ids=None, *, flag=None, sys_flag=None,
                    born_timestamp=None, reconsume_times=None, born_host_data=None, born_host_offsets=None):
        """Append ``n`` messages from columns, with no Python object per message: row i goes
        to ``topics[topic_ids[i]]`` (``topic_ids`` None: all to ``topics[0]``), its body is
        ``body_data[body_offsets[i]:body_offsets[i + 1]]`` (``body_offsets`` None: item i of
        the sequence ``body_data``, copied from where it is, see BodyRows) and its properties string
        (RocketMQ's ``name\\x01value\\x02...``, checked by the caller) likewise from
        ``props_data``/``props_offsets`` (None: none). ``queue_ids``: None (round robin per
        topic), an int, or ``n`` ints (-1: that row round robin). Optional ``n`` ints each
        (None: all 0): ``flag``, ``sys_flag`` (the host IPv6 bits are set from the hosts;
        PREPARED / ROLLBACK rows get queue offset 0, as put gives them),
        ``born_timestamp`` (ms; 0: the store time) and ``reconsume_times``. Born hosts
        packed (8 or 20 bytes) as a column like the bodies (None, or 0 bytes: the store
        host). One store timestamp, one lock; all or nothing: every size and queue id
        is checked, and every segment the batch rolls into is made, before the first record
        is written. The records are written with the GIL released, in runs that end where
        the segment ends or the warm mark is passed. Returns numpy arrays (phy_offset,
        size, queue_id, queue_offset) and the records' store timestamp."""
        cdef BodyRows bodies = BodyRows(body_data, body_offsets)
        cdef const unsigned char[::1] pd = props_data if props_data is not None else b""
        cdef Py_ssize_t n = bodies.n, i, j, nt = len(topics), tlen
        cdef const int64_t[::1] po
        cdef const int64_t[::1] flg = int_column(flag, n, -0x80000000, 0x7FFFFFFF, "flag")
        cdef const int64_t[::1] sfl = int_column(sys_flag, n, 0, 0x7FFFFFFF, "sys_flag")
        if n and np.bitwise_or.reduce(sfl) & ~WRITABLE_SYS_FLAG:
            i = np.flatnonzero(np.asarray(sfl) & ~WRITABLE_SYS_FLAG)[0]
            sys_flag_arg(sfl[i], f"row {i}'s sys_flag")
        cdef const int64_t[::1] bts = int_column(born_timestamp, n, 0, 0x7FFFFFFFFFFFFFFF, "born_timestamp")
        cdef const int64_t[::1] rct = int_column(reconsume_times, n, 0, 0x7FFFFFFF, "reconsume_times")
        cdef const unsigned char[::1] hd = born_host_data if born_host_data is not None else b"\0"
        cdef const int64_t[::1] ho = column_offsets(born_host_offsets, hd.shape[0], "born host") \
            if born_host_data is not None else zeros(n + 1)
        if ho.shape[0] != n + 1:
            raise InvalidArgumentError(f"{ho.shape[0] - 1} born hosts for {n} bodies")
        cdef const int64_t[::1] tids = int_column(topic_ids, n, 0, nt - 1, "topic_ids")
        cdef const char *store_p = PyBytes_AS_STRING(self.store_host)
        cdef int32_t hlen = <int32_t>len(self.store_host), born_len
        cdef int32_t host_bits = STORE_V6 if hlen == 20 else 0
        cdef int64_t fixed, plen, total, ts = 0, wpos, seg_size = self.seg_size, batch_bytes = 0
        cdef Rows r
        cdef list names = [], encoded = [], states = []
        cdef const int64_t[::1] slots
        cdef int64_t[::1] next_off
        next_a = None
        cdef int64_t[::1] tlens = np.empty(len(topics), np.int64)
        cdef _TopicState st
        cdef MappedSegment seg
        cdef RecordHead h
        sizes_a, phys_a = np.empty(n, np.int64), np.empty(n, np.int64)
        qids_a, qoffs_a = np.empty(n, np.int32), np.empty(n, np.int64)
        cdef int64_t[::1] sizes = sizes_a, phys = phys_a, qoffs = qoffs_a
        cdef int32_t[::1] qids = qids_a
        if props_data is None:
            po = zeros(n + 1)
        else:
            po = column_offsets(props_offsets, pd.shape[0], "properties")
            if po.shape[0] != n + 1:
                raise InvalidArgumentError(f"{po.shape[0] - 1} properties for {n} bodies")
        if nt == 0:
            raise InvalidArgumentError("put_columns needs a topic")
        for i, name in enumerate(topics):
            name = text_arg("topic", name)
            PyUnicode_AsUTF8AndSize(name, &tlen)
            if self.version == 1 and tlen > 255 or tlen > 32767:
                raise InvalidArgumentError(f"topic of {tlen} bytes does not fit message version {self.version}")
            names.append(name)
            encoded.append(name.encode())
            tlens[i] = tlen
        fixed = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + hlen + 4 + 8 + 4 + (1 if self.version == 1 else 2) + 2
        for i in range(n):
            plen = po[i + 1] - po[i]
            if plen > 32767:
                raise MessageTooLargeError(f"row {i}: properties of {plen} bytes exceed 32767")
            born_len = <int32_t>(ho[i + 1] - ho[i]) if ho[i + 1] > ho[i] else hlen
            if born_len != 8 and born_len != 20:
                raise InvalidArgumentError(f"row {i}: a born host packed in {born_len} bytes, not 8 or 20")
            total = fixed + born_len + tlens[tids[i]] + bodies.length(i) + plen
            if total > self.max_size or total + 8 > seg_size:
                raise MessageTooLargeError(f"row {i}: message of {total} bytes exceeds the limit "
                                           f"({min(self.max_size, seg_size - 8)} bytes)")
            sizes[i] = total
            batch_bytes += total
        if queue_ids is not None and not isinstance(queue_ids, int):
            qids_a[:] = int_column(queue_ids, n, -1, 0x7FFFFFFF, "queue_ids")
        else:
            qids_a[:] = -1 if queue_ids is None else queue_id_arg(queue_ids)
        self._acquire()
        try:
            for name in names:
                st = self.topics.get(name)
                if st is None or not st.checked:
                    self.check_topic(name)
                    st = self._state(name)
                    st.checked = True
                states.append(st)
            for i in range(n):
                if qids[i] < 0:
                    st = states[tids[i]]
                    qids[i] = st.next_qid
                    st.next_qid = (st.next_qid + 1) % self.queue_nums
            # every (topic, queue) the batch touches gets a slot; its next offset sits in a C array
            top = int(qids_a.max()) + 1 if n else 1
            tids_a = np.asarray(tids)
            if nt * top <= 1 << 16:   # few topics and queues: dense slots, no sort
                dense = tids_a * top + qids_a
                used = np.flatnonzero(np.bincount(dense, minlength=nt * top))
                keys_a = (used // top) << 32 | used % top
                slot_of = np.empty(nt * top, np.int64)
                slot_of[used] = np.arange(len(used))
                slots_v = slot_of[dense]
            else:
                keys_a, slots_v = np.unique(tids_a << 32 | qids_a, return_inverse=True)
                slots_v = slots_v.astype(np.int64)
            slots = slots_v
            next_a = np.array([(<_TopicState>states[k >> 32]).next_offset(k & 0xFFFFFFFF) for k in keys_a.tolist()],
                              np.int64)
            first_a = next_a.copy()
            next_off = next_a
            seg = self.seg = self._last()
            self._make_room(sizes_a)
            ts = now_ms()
            h.store_ts, h.prepared, h.version = ts, 0, self.version
            topic_ptrs = np.array([<size_t>PyBytes_AS_STRING(b) for b in encoded], np.uintp)
            r.body, r.body_len, r.body_base = bodies.ptr, bodies.len, bodies.base
            if bodies.ptr == NULL:
                r.body_off = &bodies.off[0]
            r.props, r.po = "", &po[0]
            if pd.shape[0]:
                r.props = <const char *>&pd[0]
            r.hosts, r.ho = <const char *>&hd[0], &ho[0]
            r.flg, r.sfl, r.bts, r.rct, r.tids = &flg[0], &sfl[0], &bts[0], &rct[0], &tids[0]
            r.qids, r.slots, r.sizes, r.next_off, r.qoffs, r.phys = &qids[0], &slots[0], &sizes[0], \
                &next_off[0], &qoffs[0], &phys[0]
            r.topic, r.tlen = <const char **><size_t>topic_ptrs.ctypes.data, &tlens[0]
            r.store_host, r.hlen, r.host_bits = store_p, hlen, host_bits
            i = 0
            while i < n:
                wpos = seg.wrote_pos
                if sizes[i] + 8 > seg.m.size - wpos:
                    if seg.m.size - wpos >= 8:
                        write_blank(seg.m.base + wpos, <int32_t>(seg.m.size - wpos))
                    publish(seg, seg.m.size)
                    seg = self.seg = self._roll()
                    continue
                if seg.m.readonly or seg.closing or seg.unmapped:
                    raise StoreClosedError(f"{seg.path}: segment not writable")
                if batch_bytes >= NOGIL_BYTES and self.stage_bulk:
                    if self.stage == NULL:
                        self.stage = <char *>malloc(STAGE_BYTES)
                        if self.stage == NULL:
                            raise MemoryError()
                    try:
                        write_staged(&r, &h, i, n, self.stage, seg, &wpos, self.warm_mark, &j)
                    except OSError as e:
                        self.failed = e
                        raise
                elif batch_bytes >= NOGIL_BYTES:
                    with nogil:
                        j = write_run(&r, &h, i, n, seg.m.base + wpos, seg.base_offset, seg.m.size, &wpos,
                                      self.warm_mark)
                else:
                    j = write_run(&r, &h, i, n, seg.m.base + wpos, seg.base_offset, seg.m.size, &wpos, self.warm_mark)
                publish(seg, wpos)
                seg.store_timestamp = ts
                if seg.base_offset + wpos >= self.warm_mark:
                    self._warm_now(seg)
                i = j
            if self.rolled or self.deferred is not None:
                self._finish()
        finally:
            if next_a is not None:   # the offsets taken, also by rows written before an error
                for k, first, nxt in zip(keys_a.tolist(), first_a.tolist(), next_a.tolist()):
                    if nxt != first:
                        (<_TopicState>states[k >> 32]).set_next(k & 0xFFFFFFFF, nxt)
            self._release()
        return phys_a, sizes_a, qids_a, qoffs_a, ts

    cdef _make_room(self, const int64_t[::1] sizes):
        """Before a batch writes anything, allocate the disk blocks that appending records of
        ``sizes`` will write: in the last segment, and in every segment it rolls into, which
        the segment queue creates now (the encoder's rule: a record and an 8-byte BLANK
        must fit, else BLANK and roll)."""
        cdef int64_t pos = self.seg.wrote_pos, seg_size = self.seg.m.size
        cdef Py_ssize_t i
        cdef list ends = []
        for i in range(sizes.shape[0]):
            if sizes[i] + 8 > seg_size - pos:
                ends.append(min(pos + 8, seg_size))   # the BLANK record
                pos = 0
            pos += sizes[i]
        ends.append(pos)
        ensure(self.seg, ends[0])
        if len(ends) > 1:
            self.segments.make_room(self.seg, ends[1:])

    cdef MappedSegment _roll(self):
        """The segment after the last, for a write under way. One that _make_room made is
        taken from ``premade`` and published here with no Python code run, so no signal
        handler runs either: its exception (KeyboardInterrupt) cannot stop a batch half
        written, nor a roll half done; so is one the toucher made ahead, once made. Else the
        segment queue's roll() (which waits for one being made)."""
        cdef SegmentList q = self.published
        cdef MappedSegment seg = None
        cdef int64_t at = q.last.base_offset + self.seg_size
        if q.premade:
            seg = q.premade.get(at)
        if seg is None or not made(seg):
            return self.segments.roll()
        del q.premade[at]
        q.segments = q.segments + [seg]
        q.last = seg
        announce(q, seg)
        self.rolled = True
        return seg

    cdef _warm_now(self, MappedSegment seg):
        """warm(seg) in the middle of a write: what it raises (a signal handler's
        KeyboardInterrupt, run in its Python code) waits for the write's end (_finish), so
        a batch is not left half written; only warmth is lost."""
        try:
            self.warm(seg)
        except BaseException as e:
            if self.deferred is None:
                self.deferred = e

    cdef _finish(self):
        """After a write that rolled into made segments or met an error in warm: the next
        segment starts in the background, and warm's error is raised."""
        cdef object e = self.deferred
        if self.rolled:
            self.rolled = False
            self.segments.prepare_next()
        if e is not None:
            self.deferred = None
            raise e

    cdef MappedSegment _last(self):
        cdef MappedSegment last = self.published.last
        return last if last is not None else self.segments.roll(0)

    cdef _Plan _plan(self, Message msg, object queue_id):
        """Check ``msg`` and decide where it goes (a _Plan). What is written is what was checked
        here, whatever another thread does to ``msg`` meanwhile. Raises before anything is
        written; only the round-robin position moves."""
        cdef str topic = text_arg("topic", msg.topic)
        cdef dict props
        cdef _TopicState st = self.last_state if topic is self.last_topic else self.topics.get(topic)
        cdef int32_t qid
        cdef _Plan plan
        cdef bint delayed = False
        if msg.properties is None:
            raise InvalidArgumentTypeError("message properties must be a dict, not None")
        if msg.sys_flag & ~WRITABLE_SYS_FLAG:   # one set through the field's descriptor, past Message's check
            sys_flag_arg(msg.sys_flag)
        if self.stamp is not None:
            self.stamp(msg)
        props = msg.properties
        if st is None or not st.checked:
            self.check_topic(topic)
            st = self._state(topic)
            st.checked = True
        self.last_topic, self.last_state = topic, st
        if queue_id is None:
            qid = st.next_qid
            st.next_qid = (qid + 1) % self.queue_nums
        else:
            qid = queue_id
        plan = _Plan.__new__(_Plan)
        plan.props = properties_bytes(props, &delayed)
        if delayed:
            topic, qid, props = self.delay(msg, topic, qid, props)
            st = self._state(topic)
            plan.props = properties_bytes(props)
        plan.msg, plan.topic, plan.queue_id, plan.state = msg, topic, qid, st
        plan.body = body = held_body(msg.body)
        plan.born = msg.born_host_packed
        plan.size = record_size(plan.born, topic, len(plan.props), self.store_host, self.version, self.max_size,
                                self.seg_size, len(body) if type(body) is bytes else (<memoryview>body).nbytes)
        return plan

    cdef PutResult _write(self, _Plan plan, int64_t ts):
        """Encode a planned message at the end of the log (rolling when the segment is full):
        the queue offset is taken here, PREPARED / ROLLBACK get 0 and do not advance it."""
        cdef Message msg = plan.msg
        cdef int32_t qid = plan.queue_id
        cdef _TopicState st = plan.state
        cdef bint counted = gets_cq_entry_c(msg.sys_flag)
        cdef int64_t qoff = st.next_offset(qid) if counted else 0
        cdef PutResult res
        res = encode(self.seg, msg, plan.body, plan.born, plan.topic, plan.props, qid, qoff, ts, self.store_host,
                     self.version, self.max_size, plan.size)
        if res is None:
            self.seg = self._roll()
            res = encode(self.seg, msg, plan.body, plan.born, plan.topic, plan.props, qid, qoff, ts, self.store_host,
                         self.version, self.max_size, plan.size)
        if counted:
            st.set_next(qid, qoff + 1)
        if res.phy_offset + res.size >= self.warm_mark:
            self._warm_now(self.seg)
        return res


cdef object batch_error(object e, Py_ssize_t i):
    """``e``, raised checking put_batch's message ``i``, as an error of its type naming it."""
    err = type(e)(f"put_batch message {i}: {e}")
    err.message_index = i
    return err


cdef class StoreWriter:
    """MessageStore.put and put_batch as one C call each: the store's operation gate, the
    writable check, the append and, in SYNC mode, the wait for the flush, with no Python
    frame between them (they were 0.7 of the 1.2 us a put cost).
    ``refuse()`` raises why the store takes no writes; it is called when the commitlog is
    read-only, the appender's ``failed`` (a failed flush) is set or ``flusher`` (the native
    one, None: read-only) met a failure. ``sync``: each call waits for the flusher to cover
    its records (SYNC mode), with the GIL released."""
    cdef Gate gate
    cdef Appender appender
    cdef Flusher flusher
    cdef object refuse
    cdef bint readonly, sync

    def __cinit__(self, Gate gate not None, Appender appender not None, bint readonly, Flusher flusher, bint sync,
                  refuse not None):
        self.gate = gate
        self.appender = appender
        self.readonly = readonly
        self.flusher = flusher
        self.sync = sync and flusher is not None
        self.refuse = refuse

    def put(self, msg=MISSING, queue_id=None, *more, **unknown):
        """MessageStore.put (see its documentation)."""
        if msg is MISSING or more or unknown:
            misfit("put", (msg, queue_id), more, unknown)
        return self._append(False, msg, queue_id)

    def put_batch(self, msgs=MISSING, queue_id=None, *more, **unknown):
        """MessageStore.put_batch (see its documentation)."""
        if msgs is MISSING or more or unknown:
            misfit("put_batch", (msgs, queue_id), more, unknown)
        return self._append(True, msgs, queue_id)

    cdef object _append(self, bint batch, object what, object queue_id):
        cdef PutResult last
        self.gate.enter()
        try:
            if self.readonly or self.appender.failed is not None or (self.flusher is not None and self.flusher.failed()):
                self.refuse()
            out = self.appender._put_batch(what, queue_id) if batch else self.appender._put(what, queue_id)
            if self.sync and (not batch or out):
                last = out[len(out) - 1] if batch else out
                self.flusher.wait_flushed(last.phy_offset + last.size)
            return out
        finally:
            self.gate.leave()
