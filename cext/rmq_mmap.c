#define _GNU_SOURCE
#include "rmq_mmap.h"
#include "rmq_fault.h"
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

#define PREFAULT_STEP ((size_t)2 << 20)   /* bytes populated per madvise call */

int64_t rmq_page_size(void) { return (int64_t)sysconf(_SC_PAGESIZE); }

/* The first fault in a file's mapping reads around it: up to the device's read_ahead_kb
 * (8 MB here), which for a file of holes or fresh blocks is that many pages filled with
 * zeros, 1-11 ms. A consume-queue file takes 20 bytes a message, so a small store uses a
 * few pages of each; with no_readahead each fault maps its own page only (MADV_RANDOM, a
 * hint: an error is ignored). Writing a whole 6 MB file costs the same either way. Only a
 * file this open creates gets it, for as long as it stays mapped: read back from disk after
 * its pages left the page cache, it comes a page a fault (slower, never wrong); a file
 * opened again at the next start reads around as usual. */
static int map_fd(rmq_map_t *m, int no_readahead) {
    int prot = m->readonly ? PROT_READ : PROT_READ | PROT_WRITE;
    if (m->size == 0) { m->base = NULL; return 0; }
    void *p = mmap(NULL, (size_t)m->size, prot, MAP_SHARED, m->fd, 0);
    if (p == MAP_FAILED) return -errno;
    m->base = (char *)p;
    m->guard = rmq_guard_add(m->base, (size_t)m->size, prot, &m->truncated);
    if (no_readahead) (void)madvise(p, (size_t)m->size, MADV_RANDOM);
    return 0;
}

/* Allocate the blocks of [off, off+len) with posix_fallocate; 0 or errno. A file system
 * without fallocate keeps the file's holes (0): nothing more can be done there. */
static int reserve(int fd, int64_t off, int64_t len) {
    int rc = RMQ_FAULT(RMQ_OP_FALLOCATE, NULL, fd);
    if (rc == 0 && len > 0) rc = posix_fallocate(fd, (off_t)off, (off_t)len);
    return rc == EOPNOTSUPP || rc == EINVAL ? 0 : rc;
}

/* 0, or EFBIG when RLIMIT_FSIZE forbids a file to reach `end` bytes. The kernel answers such
 * an ftruncate or pwrite with SIGXFSZ, whose default action kills the process: CPython
 * ignores it, a host that embeds Python (or resets the signal) may not. */
static int fsize_allows(int64_t end) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (uint64_t)end > rl.rlim_cur)
        return EFBIG;
    return 0;
}

int rmq_map_open(const char *path, int64_t size, int64_t reserve_bytes, int flags, int mode, rmq_map_t *m) {
    struct stat st;
    int ro = (flags & RMQ_READONLY) != 0;
    int oflags = ro ? O_RDONLY : O_RDWR;
    int created = 0, rc;
    m->fd = -1; m->base = NULL; m->size = 0; m->reserved = 0; m->readonly = ro; m->dense = 0;
    m->truncated = 0; m->guard = NULL;
    if (size < 0) return -EINVAL;
    if ((rc = RMQ_FAULT(RMQ_OP_OPEN, path, -1))) return -rc;
    /* O_NOFOLLOW: a store file that is a symlink fails with ELOOP, never written through;
     * O_NONBLOCK: a FIFO there does not wait for a writer (RMQ_ENOTREG below). */
    int fd = open(path, oflags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0 && errno == ENOENT && (flags & RMQ_CREATE) && !ro && size > 0) {
        fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
        created = 1;
    }
    if (fd < 0) return -errno;
    if (reserve_bytes > size) reserve_bytes = size;
    /* On tmpfs even reading a hole through a mapping takes a page, so a reader past the
     * data could meet SIGBUS on a full file system: files there are allocated whole. */
    struct statfs fs;
    int fs_tmpfs = !ro && size > 0 && fstatfs(fd, &fs) == 0 && fs.f_type == TMPFS_MAGIC;
    if (fs_tmpfs) reserve_bytes = size;
    if (created) {
        /* A sparse file of its full size; the first `reserve_bytes` get their blocks now, so
         * a full disk fails here, not as SIGBUS later (rmq_map_reserve does the rest). */
        rc = RMQ_FAULT(RMQ_OP_FTRUNCATE, NULL, fd);
        if (rc == 0) rc = fsize_allows(size);
        if (rc == 0) rc = ftruncate(fd, (off_t)size) ? errno : 0;
        if (rc == 0) rc = reserve(fd, 0, reserve_bytes);
        if (rc) { close(fd); unlink(path); return -rc; }
    }
    if (fstat(fd, &st)) { rc = -errno; close(fd); return rc; }
    if (!S_ISREG(st.st_mode)) { close(fd); return RMQ_ENOTREG; }
    if (size > 0 && st.st_size != size) { close(fd); return RMQ_ESIZE; }
    if (!created && fs_tmpfs && (rc = reserve(fd, 0, size))) { close(fd); return -rc; }
    m->reserved = created || fs_tmpfs ? reserve_bytes : 0;
    m->dense = fs_tmpfs;
    m->fd = fd;
    m->size = st.st_size;
    rc = map_fd(m, created && (flags & RMQ_NO_READAHEAD));
    if (rc) { close(fd); m->fd = -1; m->size = 0; }
    return rc;
}

int rmq_map_reserve(rmq_map_t *m, int64_t off, int64_t len) {
    if (m->readonly || off < 0 || len < 0 || off > m->size) return -EINVAL;
    if (m->truncated) return RMQ_EFAULTED;
    if (len > m->size - off) len = m->size - off;
    return -reserve(m->fd, off, len);
}

int rmq_map_discard(rmq_map_t *m, int64_t off, int64_t len) {
    if (m->readonly || off < 0 || len < 0 || off > m->size || m->base == NULL) return -EINVAL;
    if (m->truncated) return RMQ_EFAULTED;   /* zeros read there are no end of data: cut nothing */
    if (len > m->size - off) len = m->size - off;
    if (len == 0) return 0;
    if (!m->dense) {
        if (fallocate(m->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) == 0) return 0;
        if (errno != EOPNOTSUPP && errno != ENOSYS) return -errno;
    }
    int rc = reserve(m->fd, off, len);   /* no holes here: zero the bytes, blocks first */
    if (rc) return -rc;
    memset(m->base + off, 0, (size_t)len);
    return 0;
}

/* Clamp [off, off+len) to the mapping and widen it to whole pages. */
static int page_range(rmq_map_t *m, int64_t off, int64_t len, char **start, size_t *n) {
    int64_t ps = rmq_page_size();
    if (off < 0 || len < 0 || m->base == NULL) return -EINVAL;
    if (off > m->size) off = m->size;
    if (len > m->size - off) len = m->size - off;
    int64_t a = off - off % ps;
    *start = m->base + a;
    *n = (size_t)(off + len - a);
    return 0;
}

int rmq_map_let_go(rmq_map_t *m, int64_t off, int64_t len) {
    /* Pages read once (a scan) leave the process's resident set: for a MAP_SHARED file
     * mapping MADV_DONTNEED only drops the page-table entries; the page cache (and any
     * dirty page, whose dirty bit the kernel moves to the page) stays, and the next read
     * maps it again. Only whole pages inside the range go. */
    int64_t ps = rmq_page_size();
    if (off < 0 || len < 0 || m->base == NULL) return -EINVAL;
    if (off > m->size) off = m->size;
    if (len > m->size - off) len = m->size - off;
    int64_t a = (off + ps - 1) / ps * ps, b = (off + len) / ps * ps;
    if (b <= a) return 0;
    return madvise(m->base + a, (size_t)(b - a), MADV_DONTNEED) ? -errno : 0;
}

int rmq_map_sync(rmq_map_t *m, int64_t off, int64_t len) {
    char *s; size_t n;
    if (m->readonly) return 0;
    int rc = page_range(m, off, len, &s, &n);
    if (rc) return rc;
    if (m->truncated) return RMQ_EFAULTED;
    if (n == 0) return 0;
    if ((rc = RMQ_FAULT(RMQ_OP_MSYNC, NULL, m->fd))) return -rc;
    if (msync(s, n, MS_SYNC)) return -errno;
    /* A truncation drops dirty pages past the new end without a fault here, and msync of
     * pages that are gone succeeds: a file that is no longer its mapping's size lost them. */
    struct stat st;
    if (fstat(m->fd, &st) == 0 && st.st_size < m->size) {
        m->truncated += 1;
        return RMQ_EFAULTED;
    }
    return 0;
}

int rmq_map_write(rmq_map_t *m, int64_t off, const char *buf, int64_t len) {
    if (m->readonly || off < 0 || len < 0 || len > m->size - off) return -EINVAL;
    if (m->truncated) return RMQ_EFAULTED;
    int rc = RMQ_FAULT(RMQ_OP_PWRITE, NULL, m->fd);
    if (rc == 0) rc = fsize_allows(off + len);
    if (rc) return -rc;
    while (len > 0) {
        ssize_t w = pwrite(m->fd, buf, (size_t)len, (off_t)off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        buf += w;
        off += w;
        len -= w;
    }
    return 0;
}

int rmq_map_prefault(rmq_map_t *m, int64_t off, int64_t len, int write) {
    char *s; size_t n;
    int64_t ps = rmq_page_size();
    int rc = page_range(m, off, len, &s, &n);
    if (rc) return rc;
    if (n == 0) return 0;
    if (m->truncated) return RMQ_EFAULTED;
    int populate_write = write && !m->readonly;
    int advice = populate_write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ;
    /* A populate holds the process's mmap lock (shared) across its whole range, and a thread
     * that maps, unmaps or grows its heap meanwhile waits for it (20 ms seen for 8 MB here):
     * in steps of PREFAULT_STEP that wait is a few ms at most. (Steps of 256 KiB looked
     * slower for 16 KiB puts, which outrun the warmer; 2 MiB measured as fast as one call.) */
    size_t done = 0;
    while (done < n) {
        size_t k = n - done < PREFAULT_STEP ? n - done : PREFAULT_STEP;
        if (madvise(s + done, k, advice)) break;
        done += k;
    }
    if (done == n) return 0;
    if (errno != EINVAL || done > 0) return -errno;
    /* Kernels before 5.14. Touching a byte is only safe where nobody else writes. */
    if (write == 2) return madvise(s, n, MADV_WILLNEED) ? -errno : 0;
    volatile char *p = s;
    for (size_t i = 0; i < n; i += (size_t)ps) {
        char c = p[i];
        if (populate_write) p[i] = c;
    }
    return 0;
}

int rmq_map_close(rmq_map_t *m) {
    int rc = 0;
    rmq_guard_remove(m->guard);
    m->guard = NULL;
    if (m->base && munmap(m->base, (size_t)m->size)) rc = -errno;
    m->base = NULL;
    m->size = 0;
    if (m->fd >= 0 && close(m->fd) && rc == 0) rc = -errno;
    m->fd = -1;
    return rc;
}

int32_t rmq_java_hash(const char *s, size_t n) { return rmq_java_hash_from(0, s, n); }

int32_t rmq_java_hash_from(uint32_t h, const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    uint64_t w;
    uint32_t u;
    while (p < end) {
        /* ASCII 8 bytes at once: h*31^8 + c0*31^7 + ... + c7, the same sum mod 2^32 with a
         * chain of one multiply instead of eight (keys and tags are mostly ASCII) */
        while (end - p >= 8 && (memcpy(&w, p, 8), (w & 0x8080808080808080ULL) == 0)) {
            h = h * 0x94446F01u + p[0] * 0x67E12CDFu + p[1] * 0x34E63B41u + p[2] * 0x1B4D89Fu
                + p[3] * 0xE1781u + p[4] * 0x745Fu + p[5] * 0x3C1u + p[6] * 0x1Fu + p[7];
            p += 8;
        }
        if (end - p >= 4 && (memcpy(&u, p, 4), (u & 0x80808080u) == 0)) {   /* 4 more (a short tag) */
            h = h * 0xE1781u + p[0] * 0x745Fu + p[1] * 0x3C1u + p[2] * 0x1Fu + p[3];
            p += 4;
        }
        while (p < end && *p < 0x80) h = 31 * h + *p++;
        if (p == end) break;
        uint32_t c = *p, need = 0, min = 0;
        if ((c & 0xE0) == 0xC0) { need = 1; c &= 0x1F; min = 0x80; }
        else if ((c & 0xF0) == 0xE0) { need = 2; c &= 0x0F; min = 0x800; }
        else if ((c & 0xF8) == 0xF0) { need = 3; c &= 0x07; min = 0x10000; }
        else { p++; h = 31 * h + 0xFFFD; continue; }
        const unsigned char *q = p + 1;
        uint32_t k;
        for (k = 0; k < need && q < end && (*q & 0xC0) == 0x80; k++, q++) c = (c << 6) | (*q & 0x3F);
        if (k < need || c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
            h = 31 * h + 0xFFFD;
            p = q > p + 1 ? q : p + 1;
            continue;
        }
        p = q;
        if (c >= 0x10000) {
            c -= 0x10000;
            h = 31 * h + (0xD800 + (c >> 10));
            h = 31 * h + (0xDC00 + (c & 0x3FF));
        } else {
            h = 31 * h + c;
        }
    }
    return (int32_t)h;
}
