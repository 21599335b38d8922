/* C mmap layer: fixed-size shared file mappings. Every call returns 0 or -errno
 * (or RMQ_ESIZE) and never touches Python objects, so callers may hold no GIL. */
#ifndef RMQ_MMAP_H
#define RMQ_MMAP_H
#include <stdint.h>
#include <stddef.h>
#include "rmq_guard.h"

#define RMQ_CREATE   1   /* create the file at `size` if it does not exist */
#define RMQ_READONLY 2   /* PROT_READ mapping of an O_RDONLY descriptor */
#define RMQ_NO_READAHEAD 4  /* a file created here: a fault maps its own page, no read-around (map_fd) */
#define RMQ_ESIZE    (-100000)  /* file exists with a size other than the one asked for */
#define RMQ_ENOTREG  (-100001)  /* a directory, FIFO, socket or device where a file is due */
#define RMQ_EFAULTED (-100002)  /* the mapping met a SIGBUS (rmq_guard.h): written data is lost */

#define RMQ_ADV_NORMAL     0
#define RMQ_ADV_SEQUENTIAL 1
#define RMQ_ADV_WILLNEED   2
#define RMQ_ADV_DONTNEED   3

typedef struct {
    int fd;
    char *base;      /* NULL when size == 0 */
    int64_t size;    /* bytes mapped == file size as fstat saw it */
    int64_t reserved; /* [0, reserved) known to have its blocks (set by open; callers move it) */
    int readonly;
    int dense;        /* on tmpfs: kept wholly allocated, holes are never punched */
    volatile sig_atomic_t truncated;  /* SIGBUS faults met in the mapping (rmq_guard.h) */
    rmq_guard_slot *guard;
} rmq_map_t;

/* size > 0: the file must be exactly `size` bytes (created so with RMQ_CREATE: sparse,
 * with the blocks of its first `reserve_bytes` allocated; on tmpfs, and for a writable
 * open with reserve_bytes == size, the whole file is); size == 0: map the file as fstat
 * finds it. `mode` applies to a created file. m->reserved tells what is allocated. */
int rmq_map_open(const char *path, int64_t size, int64_t reserve_bytes, int flags, int mode, rmq_map_t *m);
/* Allocate the blocks of [off, off+len) (clamped to the file), so that writing there
 * through the mapping can never fault on a full disk: -ENOSPC comes back here instead. */
int rmq_map_reserve(rmq_map_t *m, int64_t off, int64_t len);
/* Zero [off, off+len) by punching a hole (its whole blocks are freed), or by writing
 * zeros over reserved blocks where the file system cannot punch holes or on tmpfs. */
int rmq_map_discard(rmq_map_t *m, int64_t off, int64_t len);
/* RMQ_EFAULTED once the mapping met a SIGBUS (its file was truncated under it, or a page
 * could not be read), or when the file is found shorter than the mapping after the msync:
 * what was written there is gone, so nothing may be reported durable. rmq_map_reserve,
 * rmq_map_discard and rmq_map_prefault refuse such a mapping the same way (the zeros a
 * reader saw there are no end of data to cut at). */
/* Drop the whole pages of [off, off+len) from the resident set (MADV_DONTNEED; data kept). */
int rmq_map_let_go(rmq_map_t *m, int64_t off, int64_t len);
int rmq_map_sync(rmq_map_t *m, int64_t off, int64_t len);
/* Write `len` bytes at file offset `off` with pwrite instead of through the mapping, which
 * sees them (one page cache). A page of a hole or of preallocated blocks written through
 * the mapping is first faulted in filled with zeros; pwrite of whole pages skips that fill,
 * which costs more than the copy itself. 0 or -errno (-EINVAL: not within the file), or
 * RMQ_EFAULTED once the mapping met a SIGBUS. */
int rmq_map_write(rmq_map_t *m, int64_t off, const char *buf, int64_t len);
/* Fault pages of [off, off+len) in: write 0 read-only, 1 for writing (pages nobody else
 * uses yet), 2 for writing pages a writer may be using (never touches their bytes). */
int rmq_map_prefault(rmq_map_t *m, int64_t off, int64_t len, int write);
int rmq_map_close(rmq_map_t *m);
int64_t rmq_page_size(void);

/* Java String.hashCode() of UTF-8 bytes taken as UTF-16 code units (surrogate pairs
 * for non-BMP characters, U+FFFD for malformed input, as Java's decoder does). */
int32_t rmq_java_hash(const char *s, size_t n);
/* The same hash continued from `h`, the hash of bytes before `s` that end in an ASCII
 * character (a malformed sequence never reads past one): the hash of `prefix + s` from
 * the prefix's hash, without joining the two. */
int32_t rmq_java_hash_from(uint32_t h, const char *s, size_t n);

#endif
