# The layouts every kernel shares, written once: record constants, sys_flag bits, the
# decoder status codes and the packed rows the kernels exchange through numpy arrays.
from libc.stdint cimport int32_t, int64_t

# MAGICCODE of a commitlog record (V1: 1-byte topic length, V2: 2-byte) and of a BLANK.
cdef enum:
    C_MAGIC_V1 = -626843481
    C_MAGIC_V2 = -626843477
    C_BLANK = -875286124

# sys_flag bits; the transaction type is (sys_flag & TRANSACTION_MASK).
cdef enum:
    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_MASK = 0xC
    TRAN_NOT_TYPE = 0x0
    TRAN_PREPARED = 0x4
    TRAN_COMMIT = 0x8
    TRAN_ROLLBACK = 0xC
    BORN_V6 = 0x10
    STORE_V6 = 0x20
    # what a writer takes: the rest mean what rmqstore does not do (MULTI_TAGS 0x2, 5.x's
    # NEED_UNWRAP 0x40 and INNER_BATCH 0x80, its compression type 0x700) and a broker or
    # client would act on. COMPRESSED passes, as a broker stores a producer's zlib body.
    WRITABLE_SYS_FLAG = COMPRESSED | TRANSACTION_MASK | BORN_V6 | STORE_V6


cdef inline bint gets_cq_entry_c(int32_t sys_flag) noexcept nogil:
    """Whether a message of this sys_flag gets a consume-queue entry: all but PREPARED and
    ROLLBACK transaction messages (``_record.gets_cq_entry`` for Python and numpy)."""
    cdef int32_t tran = sys_flag & TRANSACTION_MASK
    return tran != TRAN_PREPARED and tran != TRAN_ROLLBACK


# Decoder statuses (parse_record, record_at); _record.status_error is their one translator.
cdef enum RecStatus:
    REC_OK = 0
    REC_END = 1          # TOTALSIZE 0: end of written data
    REC_BLANK = 2        # BLANK end-of-file record
    REC_NOSEG = 3        # no segment holds the offset (read path only)
    REC_SHORT = -1       # fewer bytes left than the record claims / than a header needs
    REC_MAGIC = -2       # unknown MAGICCODE
    REC_SIZE = -3        # TOTALSIZE out of range
    REC_FIELDS = -4      # field lengths do not add up to TOTALSIZE
    REC_CRC = -5         # BODYCRC mismatch
    REC_PLACE = -6       # a valid record that says it is at another offset (read path only)
    REC_NOTSTART = -7    # a caller's offset at which no record starts (read path only; see at_offset)

# MappedSegment.prefault modes, as rmq_map_prefault takes them.
cdef enum PrefaultMode:
    PF_READ = 0          # fault pages in for reading
    PF_WRITE = 1         # fault in writable pages of a segment nobody uses yet
    PF_AHEAD = 2         # warm ahead of a live writer without touching its bytes

cdef enum:
    HOLE = 0x7FFFFFFF    # size of a consume-queue entry that names no message

# Bytes from which a read kernel copies or decodes with the GIL released: below it, dropping
# the GIL and taking it back costs more than the work, and may wait out another thread's
# switch interval (5 ms) for a copy of a few hundred bytes.
cdef enum:
    NOGIL_MIN = 1 << 16

# A write from a background thread that is the first to touch a page (any page size is a
# multiple of 4 KiB) faults it in: done with the GIL released, so the fault stalls no one.
cdef enum:
    PAGE_SHIFT = 12

# Where the fields of a commitlog record's fixed head lie (big-endian: read them with
# rmq_ld32 / rmq_ld64); parse_record decodes them into a RecView.
cdef enum:
    AT_TOTAL = 0            # int32 TOTALSIZE
    AT_MAGIC = 4            # int32 MAGICCODE
    AT_BODY_CRC = 8         # int32
    AT_QUEUE_ID = 12        # int32
    AT_FLAG = 16            # int32
    AT_QUEUE_OFFSET = 20    # int64
    AT_PHY_OFFSET = 28      # int64
    AT_SYS_FLAG = 36        # int32
    AT_BORN_TS = 40         # int64
    AT_BORN_HOST = 48       # 4 or 16 address bytes (BORN_V6), then a 4-byte port

# _cq.ENTRY_DTYPE: one consume-queue entry, native order (20 bytes).
cdef packed struct CqEntry:
    int64_t phy_offset
    int32_t size
    int64_t tags_code

# _read.DISPATCH_DTYPE: one record indexed for dispatch, native order (60 bytes); topic and
# properties positions are relative to the raw bytes returned beside the rows (those fields only).
cdef packed struct DispatchRow:
    int64_t phy_offset
    int32_t size
    int32_t queue_id
    int64_t queue_offset
    int32_t sys_flag
    int64_t tags_code
    int64_t store_timestamp
    int32_t topic_off
    int32_t topic_len
    int32_t props_off
    int32_t props_len

# One index-file entry as stored (big-endian, 20 bytes): read and write its fields with
# rmq_ld*/rmq_st* at their addresses.
cdef packed struct IndexEntry:
    int32_t key_hash
    int64_t phy_offset
    int32_t time_diff    # seconds since the file's beginTimestamp
    int32_t prev_index   # older entry of the same slot, 0 = none
