# cython: boundscheck=False, wraparound=False, cdivision=True
"""The native dispatch ("reput") loop: follows the commitlog and appends consume-queue and
index entries on a thread of its own that never takes the GIL.

``Reput`` holds what the loop needs as plain C: the commitlog segment it reads, one slot per
known queue (its topic, queue id, last consume-queue file and the commitlog end of its last
entry) and the current index file. It allocates the disk blocks its files need next
itself, and moves to the writer's next commitlog segment when the writer offers it at its
roll (``offer``). Everything else (a queue's first file, a full file, a new index file, a
record that is not valid, a delay level in non-ASCII digits, an unsafe topic, a failed
allocation) is a *request*: the loop stops before that record, publishes its position and
waits; a Python helper thread (rmqstore.dispatch) dispatches a few records there the Python
way, hands the new files back (``set_segment``, ``set_queue``, ``set_index``) and resumes it.

Every segment the loop writes or reads is pinned by the Python side (pins change with the
GIL held, while the loop is paused or stopped), so no unmap can happen under it. Entries are
written as the Python kernels write them: a consume-queue entry's SIZE last, an index entry
before its slot before its header (rmq_order.h); a queue offset or commitlog position the
queue already holds is skipped, as ConsumeQueue.put skips it after recovery."""
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcmp, memcpy, memmove, memset
from rmqstore._cext cimport rmq_java_hash, rmq_ld32, rmq_ld64
from rmqstore._cq cimport store_entry
from rmqstore._index_file cimport keys_at, put_keys, topic_prefix
from rmqstore._layout cimport REC_BLANK, REC_OK, TRANSACTION_MASK, TRAN_ROLLBACK, gets_cq_entry_c
from rmqstore._record cimport IndexProps, RecView, find_property, index_props, parse_record
from rmqstore._cext cimport rmq_map_t, rmq_page_size, rmq_wait64
from rmqstore._segment cimport MappedSegment, pin, reserve_range, unpin

cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    cdef struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clk, timespec *ts)
    int CLOCK_REALTIME
    int CLOCK_MONOTONIC

cdef extern from "<pthread.h>" nogil:
    ctypedef unsigned long pthread_t
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    ctypedef void *(*start_fn)(void *) noexcept nogil
    int pthread_create(pthread_t *t, const void *attr, start_fn start, void *arg)
    int pthread_join(pthread_t t, void **ret)
    int pthread_mutex_init(pthread_mutex_t *m, const void *attr)
    int pthread_mutex_destroy(pthread_mutex_t *m)
    int pthread_mutex_lock(pthread_mutex_t *m)
    int pthread_mutex_unlock(pthread_mutex_t *m)
    int pthread_cond_init(pthread_cond_t *c, const void *attr)
    int pthread_cond_destroy(pthread_cond_t *c)
    int pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m)
    int pthread_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m, const timespec *t)
    int pthread_cond_broadcast(pthread_cond_t *c)
    int pthread_setname_np(pthread_t t, const char *name)


cdef extern from "<unistd.h>" nogil:
    int getpid()

cdef extern from *:
    """
    static inline int64_t rmq_acq64(const int64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void rmq_rel64(int64_t *p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static inline int rmq_acq32(const int *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void rmq_rel32(int *p, int v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static inline void rmq_cpu_relax(void) {
    #if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
    #elif defined(__aarch64__)
        __asm__ __volatile__("yield");
    #endif
    }
    """
    int64_t rmq_acq64(const int64_t *p) noexcept nogil
    void rmq_rel64(int64_t *p, int64_t v) noexcept nogil
    int rmq_acq32(const int *p) noexcept nogil
    void rmq_rel32(int *p, int v) noexcept nogil
    void rmq_cpu_relax() noexcept nogil

# Why the loop stopped and waits (``Reput.wait_request``'s answer; -1: stopped).
cpdef enum Request:
    NONE = 0
    SEGMENT = 1      # no commitlog segment is known at the position (none yet, or the last one ended)
    PYTHON = 2       # the record at the position needs the Python dispatch path

# How a queue's records are dispatched (``Reput.set_queue``).
cpdef enum Kind:
    KIND_NATIVE = 0      # entries written by the loop
    KIND_SCHEDULE = 1    # SCHEDULE_TOPIC_XXXX: tags code = delivery time, computed here
    KIND_PYTHON = 2      # every record of the queue handed to Python

cdef enum:
    STATE_RUN = 0
    STATE_PAUSED = 1
    MAX_KEYS = 1 << 15   # index keys one record can hold (a UNIQ_KEY + a KEYS token per 2 property bytes)
    NOTIFY_EVERY = 1024  # records between two wake-ups of wait_dispatched's waiters
    SPINS = 200          # empty polls before waiting for the writer (see run)
    OFFER_WAIT_MS = 20   # how long the loop at a segment's end waits for the writer's offer of the next
    OFFERS = 16          # segments offered ahead of the loop it keeps (the oldest is let go past that)
    QID_CACHE = 64       # queue ids find remembers a slot for (see find)

cdef struct Slot:            # one known consume queue
    char *topic              # UTF-8, malloc'd
    int32_t topic_len
    uint32_t topic_hash      # rmq_java_hash of the topic
    int32_t topic_no         # the topic's first slot: slots of one topic share it
    int32_t queue_id
    int32_t kind
    char *base               # its last file's mapping (NULL: no file, the first is Python's to make)
    int64_t *wrote           # &that MappedSegment.wrote_pos
    rmq_map_t *m             # its mapping (m.reserved: blocks allocated, moved by the loop too)
    int64_t ahead            # blocks allocated past a write (MappedSegment.ahead; 0: the whole file)
    int64_t size             # file size
    int64_t file_base        # the file's first queue offset × 20
    int64_t max_phy          # commitlog end of the queue's last entry (ConsumeQueue.max_physic_offset)


cdef struct Segment:         # a commitlog segment the loop reads
    char *base
    const int64_t *wrote          # &its MappedSegment.wrote_pos
    int *waiting                  # its flag for a waiting reader (rmq_wake.h)
    int64_t size
    int64_t file_base


cdef inline uint64_t slot_hash(uint32_t topic_hash, int32_t qid) noexcept nogil:
    return (<uint64_t>topic_hash * 31 + <uint32_t>qid) * 0x9E3779B97F4A7C15ULL


cdef struct State:           # what the loop's thread reads and writes, apart from any Python object
    pthread_mutex_t lock
    pthread_cond_t changed        # state, request, stop or position changed
    int state
    int request
    int stop
    int waiters                   # threads in wait_position
    int64_t position              # every record before it is dispatched
    int64_t requests              # requests made
    int64_t cq_ts                 # store time of the last message given a CQ entry
    int64_t index_ts              # newest store time of the messages passed to the index
    # the commitlog segment at the position
    char *cl_base
    const int64_t *cl_wrote
    int *cl_waiting               # its flag for a waiting reader (rmq_wake.h)
    int64_t cl_size
    int64_t cl_file_base
    # segments the writer offered after it, oldest first
    Segment offered[OFFERS]
    int noffered
    # known queues
    Slot *slots
    Py_ssize_t nslots
    Py_ssize_t cap
    int32_t *table                # open addressing: slot index + 1, 0 empty
    Py_ssize_t table_cap
    Py_ssize_t last               # the slot found last (records of one queue come in runs)
    int32_t by_qid[QID_CACHE]     # slot index + 1 found last for a queue id (mod QID_CACHE), 0 none
    # the index (index_on: the store has one)
    int index_on
    char *ix_base
    rmq_map_t *ix_m
    int64_t ix_ahead
    int32_t ix_slots
    int32_t ix_entries
    int ix_more_files             # more than one index file: a header's end offset is indexed
    # delay levels, ms
    int64_t *delays
    Py_ssize_t ndelays
    # scratch for one record's keys
    int32_t *hashes
    int64_t *phys
    int64_t *tss


cdef class Reput:
    """The native dispatch loop's state and thread (see the module docstring). Methods that
    change slots or files are for the Python side, and only while the loop is paused,
    stopped or not started."""
    cdef State *s
    cdef pthread_t thread
    cdef int started                   # a thread was created (and not joined) by process ``pid``
    cdef int pid
    # the Python objects pinned for the loop
    cdef list cl_segs                  # commitlog segments: the one read and those offered after it
    cdef list queue_segs
    cdef object ix_seg

    def __cinit__(self, int64_t position, bint index_on, delays):
        cdef State *st = <State *>calloc(1, sizeof(State))
        if st == NULL:
            raise MemoryError()
        self.s = st
        pthread_mutex_init(&st.lock, NULL)
        pthread_cond_init(&st.changed, NULL)
        st.position, st.index_on, st.ndelays = position, index_on, len(delays)
        self.queue_segs = []
        self.cl_segs = []
        st.delays = <int64_t *>malloc(max(1, st.ndelays) * sizeof(int64_t))
        st.hashes = <int32_t *>malloc(MAX_KEYS * sizeof(int32_t))
        st.phys = <int64_t *>malloc(MAX_KEYS * sizeof(int64_t))
        st.tss = <int64_t *>malloc(MAX_KEYS * sizeof(int64_t))
        st.table_cap = 64
        st.table = <int32_t *>calloc(st.table_cap, sizeof(int32_t))
        if not (st.delays and st.hashes and st.phys and st.tss and st.table):
            raise MemoryError()
        for i, d in enumerate(delays):
            st.delays[i] = d

    def __dealloc__(self):
        cdef State *st = self.s
        cdef Py_ssize_t i
        if st == NULL:
            return
        if self.running:   # never halted (a bug): stop it before its state is freed
            wake(st, 1)
            with nogil:
                pthread_join(self.thread, NULL)
        for i in range(st.nslots):
            free(st.slots[i].topic)
        free(st.slots)
        free(st.table)
        free(st.delays)
        free(st.hashes)
        free(st.phys)
        free(st.tss)
        pthread_cond_destroy(&st.changed)
        pthread_mutex_destroy(&st.lock)
        free(st)

    # -- what Python reads -----------------------------------------------------------------
    @property
    def position(self):
        """Every record before this commitlog offset is dispatched."""
        return rmq_acq64(&self.s.position)

    @position.setter
    def position(self, int64_t value):
        rmq_rel64(&self.s.position, value)

    @property
    def cq_timestamp(self):
        """Store time of the last message given a consume-queue entry."""
        return rmq_acq64(&self.s.cq_ts)

    @cq_timestamp.setter
    def cq_timestamp(self, int64_t value):
        rmq_rel64(&self.s.cq_ts, value)

    @property
    def index_timestamp(self):
        """Newest store time of the messages the index was given."""
        return rmq_acq64(&self.s.index_ts)

    @index_timestamp.setter
    def index_timestamp(self, int64_t value):
        rmq_rel64(&self.s.index_ts, value)

    @property
    def requests(self):
        """How many times the loop asked the Python side for something."""
        return rmq_acq64(&self.s.requests)

    @property
    def running(self):
        """Whether this process started the thread and has not joined it (a forked child
        has no thread: False there)."""
        return bool(self.started) and self.pid == getpid()

    def __len__(self):
        return self.s.nslots

    def slot_max_phy(self, Py_ssize_t i):
        """The commitlog end of slot ``i``'s last entry."""
        if not 0 <= i < self.s.nslots:
            raise IndexError(i)
        return self.s.slots[i].max_phy

    # -- what Python hands over (loop paused, stopped or not started) -----------------------
    def set_segment(self, MappedSegment seg):
        """Read the commitlog from ``seg`` (None: none at the position yet); pins it."""
        cdef State *st = self.s
        if seg is None:
            st.cl_base = NULL
        else:
            self.hold(seg)
            st.cl_base, st.cl_wrote, st.cl_size, st.cl_file_base = seg.m.base, &seg.wrote_pos, seg.m.size, \
                seg.base_offset
            st.cl_waiting = &seg.waiting
        self.let_go_behind()

    def offer(self, MappedSegment seg not None):
        """The writer's newest commitlog segment, at its roll (the loop may be running): the
        loop reads on into it when the one before ends, with no request. Pins it."""
        cdef State *st = self.s
        cdef Segment *o
        if seg.m.base == NULL:
            return
        self.hold(seg)
        pthread_mutex_lock(&st.lock)
        if st.noffered == OFFERS:   # far ahead of the loop: it asks for the oldest instead
            memmove(&st.offered[0], &st.offered[1], (OFFERS - 1) * sizeof(Segment))
            st.noffered -= 1
        o = &st.offered[st.noffered]
        o.base, o.wrote, o.waiting, o.size, o.file_base = seg.m.base, &seg.wrote_pos, &seg.waiting, seg.m.size, \
            seg.base_offset
        st.noffered += 1
        pthread_cond_broadcast(&st.changed)
        pthread_mutex_unlock(&st.lock)
        self.let_go_behind()

    cdef int hold(self, MappedSegment seg) except -1:
        if seg not in self.cl_segs:
            pin(seg)
            self.cl_segs.append(seg)
        return 0

    cdef int let_go_behind(self) except -1:
        """Unpin the commitlog segments the loop has left: wholly before its position and
        not the one it reads (it never goes back; Python moves it back only while paused)."""
        cdef State *st = self.s
        cdef int64_t pos
        cdef list keep = []
        cdef MappedSegment seg
        pthread_mutex_lock(&st.lock)
        pos = rmq_acq64(&st.position)
        for seg in self.cl_segs:
            if seg.base_offset + seg.m.size <= pos and not (st.cl_base != NULL and seg.base_offset == st.cl_file_base):
                unpin(seg)
            else:
                keep.append(seg)
        pthread_mutex_unlock(&st.lock)
        self.cl_segs = keep
        return 0

    def set_queue(self, bytes topic not None, int32_t queue_id, int kind, MappedSegment seg, int64_t max_phy):
        """Slot of queue ``topic``/``queue_id`` (made on first call; returns its index):
        its kind (KIND_*), last file ``seg`` (None: none yet) and the commitlog end of its
        last entry; pins ``seg``, unpins the slot's file before."""
        cdef State *st = self.s
        cdef Py_ssize_t i = find(st, topic, len(topic), queue_id)
        cdef Slot *sl
        if i < 0:
            i = self.add_slot(topic, queue_id)
        sl = &st.slots[i]
        old = self.queue_segs[i]
        if seg is not old:
            if seg is not None:
                pin(seg)
            if old is not None:
                unpin(<MappedSegment>old)
            self.queue_segs[i] = seg
        sl.kind, sl.max_phy = kind, max_phy
        if seg is None or seg.m.readonly:
            sl.base = NULL
        else:
            sl.base, sl.wrote, sl.m, sl.ahead, sl.size, sl.file_base = seg.m.base, &seg.wrote_pos, &seg.m, seg.ahead, \
                seg.m.size, seg.base_offset
        return i

    def set_index(self, MappedSegment seg, int32_t slots, int32_t entries, bint more_files):
        """Write index entries into ``seg`` (None: no file yet); pins it."""
        cdef State *st = self.s
        if seg is not None:
            if slots <= 0 or entries < 2 or seg.m.size < 40 + <int64_t>slots * 4 + <int64_t>entries * 20:
                raise ValueError(f"{seg.path}: {seg.m.size} bytes do not hold {slots} slots / {entries} entries")
            pin(seg)
        if self.ix_seg is not None:
            unpin(<MappedSegment>self.ix_seg)
        self.ix_seg = seg
        if seg is None or seg.m.readonly:
            st.ix_base = NULL
        else:
            st.ix_base, st.ix_m, st.ix_ahead, st.ix_slots, st.ix_entries = seg.m.base, &seg.m, seg.ahead, slots, entries
        st.ix_more_files = more_files

    def release(self):
        """Unpin every segment (once stopped)."""
        self.s.cl_base, self.s.noffered = NULL, 0
        for seg in self.cl_segs:
            unpin(<MappedSegment>seg)
        self.cl_segs = []
        self.set_index(None, 0, 0, False)
        for i, seg in enumerate(self.queue_segs):
            if seg is not None:
                unpin(<MappedSegment>seg)
            self.queue_segs[i] = None
            self.s.slots[i].base = NULL

    cdef Py_ssize_t add_slot(self, bytes topic, int32_t queue_id) except -1:
        cdef State *st = self.s
        cdef Py_ssize_t n = len(topic), i
        cdef Slot *grown
        cdef Slot *sl
        cdef int32_t *table
        if st.nslots == st.cap:
            grown = <Slot *>realloc(st.slots, max(16, 2 * st.cap) * sizeof(Slot))
            if grown == NULL:
                raise MemoryError()
            st.slots, st.cap = grown, max(16, 2 * st.cap)
        sl = &st.slots[st.nslots]
        memset(sl, 0, sizeof(Slot))
        sl.topic = <char *>malloc(max(1, n))
        if sl.topic == NULL:
            raise MemoryError()
        memcpy(sl.topic, <const char *>topic, n)
        sl.topic_len, sl.queue_id, sl.max_phy = <int32_t>n, queue_id, -1
        sl.topic_hash = <uint32_t>rmq_java_hash(sl.topic, n)
        sl.topic_no = <int32_t>st.nslots
        for i in range(st.nslots):
            if st.slots[i].topic_hash == sl.topic_hash and st.slots[i].topic_len == n \
                    and memcmp(st.slots[i].topic, sl.topic, n) == 0:
                sl.topic_no = st.slots[i].topic_no
                break
        st.nslots += 1
        self.queue_segs.append(None)
        if 2 * st.nslots > st.table_cap:   # rehash every slot into a table twice the size
            table = <int32_t *>calloc(2 * st.table_cap, sizeof(int32_t))
            if table == NULL:
                raise MemoryError()
            free(st.table)
            st.table, st.table_cap = table, 2 * st.table_cap
            for i in range(st.nslots - 1):
                place(st, i)
        place(st, st.nslots - 1)
        return st.nslots - 1

    # -- running ---------------------------------------------------------------------------
    def start(self):
        """Start the loop's thread (named rmq-reput)."""
        cdef int rc
        if self.running:
            return
        self.s.stop, self.s.state, self.s.request = 0, STATE_RUN, NONE
        rc = pthread_create(&self.thread, NULL, thread_main, <void *>self.s)
        if rc:
            raise OSError(rc, "pthread_create failed for the dispatch thread")
        pthread_setname_np(self.thread, "rmq-reput")   # named by its starter: it is, once start returns
        self.started, self.pid = 1, getpid()

    def halt(self):
        """Stop the loop and join its thread (nothing to join in a forked child)."""
        if self.running:
            wake(self.s, 1)
            with nogil:
                pthread_join(self.thread, NULL)
        else:
            rmq_rel32(&self.s.stop, 1)
        self.started = 0

    def kick(self):
        """Wake wait_position's waiters (dispatch failed or stalled: they look again)."""
        wake(self.s, 0)

    def wait_request(self):
        """Block (GIL released) until the loop asks for something; returns the Request, or
        -1 once stopped."""
        cdef State *st = self.s
        cdef int r
        with nogil:
            pthread_mutex_lock(&st.lock)
            while st.state != STATE_PAUSED and not st.stop:
                pthread_cond_wait(&st.changed, &st.lock)
            r = -1 if st.stop else st.request
            pthread_mutex_unlock(&st.lock)
        return r

    def resume(self):
        """Let the loop go on from ``position`` once its request is served (the GIL kept:
        the loop holds the lock for a few instructions only, and taking the GIL back after
        would make the thread running Python hand it over)."""
        cdef State *st = self.s
        pthread_mutex_lock(&st.lock)
        st.state, st.request = STATE_RUN, NONE
        pthread_cond_broadcast(&st.changed)
        pthread_mutex_unlock(&st.lock)

    def wait_position(self, int64_t target, double timeout):
        """Block (GIL released) until ``position`` >= ``target``, the loop stops, kick() is
        called or ``timeout`` seconds pass; returns whether the position is reached."""
        cdef State *st = self.s
        cdef timespec until
        cdef bint reached
        clock_gettime(CLOCK_REALTIME, &until)
        until.tv_sec += <time_t>timeout
        until.tv_nsec += <long>((timeout - <time_t>timeout) * 1e9)
        if until.tv_nsec >= 1000000000:
            until.tv_sec, until.tv_nsec = until.tv_sec + 1, until.tv_nsec - 1000000000
        with nogil:
            pthread_mutex_lock(&st.lock)
            st.waiters += 1
            if rmq_acq64(&st.position) < target and not st.stop:
                pthread_cond_timedwait(&st.changed, &st.lock, &until)
            st.waiters -= 1
            reached = rmq_acq64(&st.position) >= target
            pthread_mutex_unlock(&st.lock)
        return reached

    def run_here(self):
        """Run the loop in the calling thread, GIL released, until it is caught up (NONE) or
        asks for something (the Request: serve it and call again). Catch-up without a thread."""
        cdef int r
        with nogil:
            r = run(self.s, 0)
        return r


cdef Py_ssize_t find(State *st, const char *t, int32_t n, int32_t qid) noexcept nogil:
    """The slot of queue ``t[:n]``/``qid``, -1 for none. The slot found last is tried
    first, and its topic's hash and number reused for another queue of the topic (records
    of one topic's queues come interleaved): the topic is compared once, and the slot found
    last for the queue id is tried before the table."""
    cdef Py_ssize_t k
    cdef int32_t v, tno = -1
    cdef uint32_t th
    cdef Slot *sl
    if st.last < st.nslots and st.slots[st.last].topic_len == n and memcmp(st.slots[st.last].topic, t, n) == 0:
        if st.slots[st.last].queue_id == qid:
            return st.last
        th, tno = st.slots[st.last].topic_hash, st.slots[st.last].topic_no
        v = st.by_qid[<uint32_t>qid % QID_CACHE]
        if v and st.slots[v - 1].queue_id == qid and st.slots[v - 1].topic_no == tno:
            st.last = v - 1
            return v - 1
    else:
        th = <uint32_t>rmq_java_hash(t, n)
    k = <Py_ssize_t>(slot_hash(th, qid) >> 32) & (st.table_cap - 1)
    while True:
        v = st.table[k]
        if v == 0:
            return -1
        sl = &st.slots[v - 1]
        if sl.queue_id == qid and (sl.topic_no == tno if tno >= 0 else
                                   sl.topic_len == n and memcmp(sl.topic, t, n) == 0):
            st.last = v - 1
            st.by_qid[<uint32_t>qid % QID_CACHE] = v
            return v - 1
        k = (k + 1) & (st.table_cap - 1)


cdef void place(State *st, Py_ssize_t i) noexcept nogil:
    cdef Slot *sl = &st.slots[i]
    cdef Py_ssize_t k = <Py_ssize_t>(slot_hash(sl.topic_hash, sl.queue_id) >> 32) & (st.table_cap - 1)
    while st.table[k]:
        k = (k + 1) & (st.table_cap - 1)
    st.table[k] = <int32_t>(i + 1)


cdef void wake(State *st, int stop) noexcept nogil:
    pthread_mutex_lock(&st.lock)
    if stop:
        rmq_rel32(&st.stop, 1)
    pthread_cond_broadcast(&st.changed)
    pthread_mutex_unlock(&st.lock)


cdef inline void notify(State *st) noexcept nogil:
    if rmq_acq32(&st.waiters):
        wake(st, 0)


cdef int run(State *st, bint follow) noexcept nogil:
    """Dispatch records from ``position``; returns the Request that stops it, NONE when
    caught up and not ``follow``, -1 when stopped. Following, it waits for the writer:
    ``SPINS`` empty polls, then a wait the writer's next record ends (rmq_wake.h; 1 ms at
    most, so a stop is seen). Naps of 5 µs instead cost ~15 µs of CPU each on a virtual
    machine: ~100 µs a message while puts came a millisecond apart (a gRPC endpoint's rate)."""
    cdef int64_t pos, limit, end, idle = 0, done = 0
    cdef int r, code
    cdef RecView rv
    while not rmq_acq32(&st.stop):
        if st.cl_base == NULL:
            r = SEGMENT
            break
        pos = rmq_acq64(&st.position)
        end = pos - st.cl_file_base
        limit = rmq_acq64(st.cl_wrote)
        if limit > st.cl_size:
            limit = st.cl_size
        if end >= st.cl_size:
            if next_segment(st, follow):
                continue
            r = SEGMENT
            break
        if end >= limit:
            if done:
                notify(st)
                done = 0
            if not follow:
                return NONE
            idle += 1
            if idle < SPINS:
                rmq_cpu_relax()
                continue
            rmq_wait64(st.cl_wrote, limit, st.cl_waiting, 1000000)   # the writer's next record ends it (or 1 ms)
            continue
        idle = 0
        code = parse_record(st.cl_base + end, limit - end, False, &rv)
        if code == REC_BLANK:
            rmq_rel64(&st.position, st.cl_file_base + st.cl_size)
            if next_segment(st, follow):
                continue
            r = SEGMENT
            break
        if code != REC_OK:   # a hole or a bad record: the Python path says what it is
            r = PYTHON
            break
        r = dispatch(st, st.cl_base + end, pos, &rv)
        if r != NONE:
            break
        rmq_rel64(&st.position, pos + rv.total)
        done += 1
        if done == NOTIFY_EVERY:
            notify(st)
            done = 0
    else:
        return -1
    notify(st)
    return r


cdef bint next_segment(State *st, bint follow) noexcept nogil:
    """At the end of the segment read: move to the one the writer offered after it, waiting
    up to OFFER_WAIT_MS for the offer when following (the writer fills a segment, then
    rolls and offers the next). False when there is none: a request."""
    cdef int64_t want = st.cl_file_base + st.cl_size
    cdef timespec until
    cdef Py_ssize_t i
    cdef bint moved = False
    pthread_mutex_lock(&st.lock)
    i = offered_at(st, want)
    if follow and i < 0:
        clock_gettime(CLOCK_REALTIME, &until)
        until.tv_nsec += OFFER_WAIT_MS * 1000000
        if until.tv_nsec >= 1000000000:
            until.tv_sec, until.tv_nsec = until.tv_sec + until.tv_nsec // 1000000000, until.tv_nsec % 1000000000
        while not st.stop and i < 0:
            if pthread_cond_timedwait(&st.changed, &st.lock, &until) != 0:
                break
            i = offered_at(st, want)
    if i >= 0:
        st.cl_base, st.cl_wrote, st.cl_waiting = st.offered[i].base, st.offered[i].wrote, st.offered[i].waiting
        st.cl_size, st.cl_file_base = st.offered[i].size, st.offered[i].file_base
        st.noffered -= i + 1   # it and those before it (left behind) are done with
        memmove(&st.offered[0], &st.offered[i + 1], st.noffered * sizeof(Segment))
        moved = True
    pthread_mutex_unlock(&st.lock)
    return moved


cdef Py_ssize_t offered_at(State *st, int64_t base) noexcept nogil:
    """The index of the offered segment starting at ``base``, -1 for none."""
    cdef Py_ssize_t i
    for i in range(st.noffered):
        if st.offered[i].file_base == base:
            return i
    return -1


cdef bint room(rmq_map_t *m, int64_t end, int64_t ahead) noexcept nogil:
    """Have the blocks of ``[0, end)`` of a file the loop writes allocated, as
    MappedSegment's ensure() does (``ahead`` past it, 0: the whole file); False when
    allocating failed (the Python path meets the failure again and says what it is)."""
    cdef int64_t ps, stop
    if end <= m.reserved:
        return True
    ps = rmq_page_size()
    stop = m.size if ahead == 0 else min(m.size, (end + ahead + ps - 1) // ps * ps)
    if reserve_range(m, m.reserved, stop - m.reserved) != 0:
        return False
    m.reserved = stop
    return True


cdef int dispatch(State *st, const char *p, int64_t phy, const RecView *rv) noexcept nogil:
    """The consume-queue entry and index keys of the record at ``p``: both written, or
    neither and PYTHON returned."""
    cdef Slot *sl = NULL
    cdef Py_ssize_t i
    cdef int64_t tags = 0, cur, nkeys = 0, end_phy, ts = rv.store_ts, used
    cdef int32_t count = 0
    cdef uint32_t prefix
    cdef bint cq = gets_cq_entry_c(rv.sys_flag), skip_cq = False, indexed = False
    cdef const char *props = p + rv.props_off
    cdef IndexProps ip
    index_props(props, rv.props_len, &ip)   # TAGS, UNIQ_KEY and KEYS: one pass for the entry and the keys
    if cq:
        i = find(st, p + rv.topic_off, rv.topic_len, rv.queue_id)
        if i < 0:
            return PYTHON
        sl = &st.slots[i]
        if sl.kind == KIND_PYTHON or sl.base == NULL:
            return PYTHON
        if ip.tags_len:
            tags = rmq_java_hash(props + ip.tags_off, ip.tags_len)
        if sl.kind == KIND_SCHEDULE and not deliver_time(st, props, rv.props_len, ts, &tags):
            return PYTHON
        cur = sl.file_base + sl.wrote[0]
        # ConsumeQueue.put: an entry the queue holds already is skipped (re-dispatch)
        if rv.queue_offset < 0 or rv.queue_offset < cur // 20 or phy + rv.total <= sl.max_phy:
            skip_cq = True
        elif rv.queue_offset != cur // 20 or cur % 20 or sl.wrote[0] + 20 > sl.size \
                or not room(sl.m, sl.wrote[0] + 20, sl.ahead):
            return PYTHON   # a gap, a full file or blocks that could not be allocated
    if st.index_on:
        indexed = True
        if st.ix_base != NULL:
            end_phy, count = rmq_ld64(st.ix_base + 24), rmq_ld32(st.ix_base + 36)
            indexed = phy > end_phy if (count > 1 or st.ix_more_files) else phy >= end_phy
        if indexed and (rv.sys_flag & TRANSACTION_MASK) != TRAN_ROLLBACK:
            prefix = <uint32_t>sl.topic_hash * 31 + 35 if sl != NULL else topic_prefix(p + rv.topic_off, rv.topic_len)
            nkeys = keys_at(prefix, props, &ip, phy, ts, st.hashes, st.phys, st.tss)
            used = max(1, count) + nkeys
            if nkeys and (st.ix_base == NULL or used > st.ix_entries
                          or (count > 1 and ts < rmq_ld64(st.ix_base))
                          or not room(st.ix_m, 40 + <int64_t>st.ix_slots * 4 + used * 20, st.ix_ahead)):
                return PYTHON   # a new file (also for a key stored before this one began), or no blocks
    if cq:
        if not skip_cq:
            store_entry(sl.base + sl.wrote[0], phy, rv.total, tags)
            rmq_rel64(sl.wrote, sl.wrote[0] + 20)
            sl.max_phy = phy + rv.total
        rmq_rel64(&st.cq_ts, ts)
    if indexed:
        if nkeys:
            put_keys(st.ix_base, st.ix_slots, st.ix_entries, st.hashes, st.phys, st.tss, 0, nkeys)
        if ts > st.index_ts:
            rmq_rel64(&st.index_ts, ts)
    return NONE


cdef bint deliver_time(State *st, const char *props, int32_t plen, int64_t ts, int64_t *tags) noexcept nogil:
    """dispatch.deliver_time for a DELAY level of ASCII digits into ``tags``; False for a
    level Python must read (a byte past ASCII: maybe a digit of another script)."""
    cdef int32_t voff = 0, vlen = 0, i
    cdef int64_t level = 0
    cdef unsigned char c
    if not find_property(props, plen, b"DELAY", 5, &voff, &vlen) or vlen == 0:
        return True
    for i in range(vlen):
        c = <unsigned char>props[voff + i]
        if c >= 0x80:
            return False
        if c < 48 or c > 57:
            return True    # not a level: the tags code stays
        if level <= st.ndelays:
            level = level * 10 + (c - 48)
    if level > st.ndelays:
        level = st.ndelays
    if level > 0:
        tags[0] = ts + st.delays[level - 1]
    return True


cdef void *thread_main(void *arg) noexcept nogil:
    """The rmq-reput thread: run, and at each request pause until Python resumes it."""
    cdef State *st = <State *>arg
    cdef int req
    while True:
        req = run(st, 1)
        pthread_mutex_lock(&st.lock)
        if req < 0 or st.stop:
            pthread_cond_broadcast(&st.changed)
            pthread_mutex_unlock(&st.lock)
            return NULL
        st.state, st.request = STATE_PAUSED, req
        rmq_rel64(&st.requests, st.requests + 1)
        pthread_cond_broadcast(&st.changed)
        while st.state == STATE_PAUSED and not st.stop:
            pthread_cond_wait(&st.changed, &st.lock)
        pthread_mutex_unlock(&st.lock)
