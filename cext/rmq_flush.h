/* Native flusher: one pthread that msyncs a commitlog's segments, and the SYNC writers that
 * wait for it, meeting on a mutex and condition variables over the published flushed
 * position (group commit). No Python object is touched here: the segments are described by
 * pointers into MappedSegment objects their owner keeps alive and mapped (pinned) while
 * they are tracked, and msync goes through `sync` (the segment kernel's own, which fault
 * injection sees). Every call returns 0 or a negative status: -errno, RMQ_E* of
 * rmq_mmap.h, or RMQ_EROOT_* below. The first failure is sticky (flush.py, invariant 4). */
#ifndef RMQ_FLUSH_H
#define RMQ_FLUSH_H
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>
#include "rmq_mmap.h"

#define RMQ_EROOT_GONE     (-100010)  /* the store directory cannot be stat'ed (root_errno says why) */
#define RMQ_EROOT_REPLACED (-100011)  /* the store directory is another one (device, inode) */
#define RMQ_EBEHIND        (-100012)  /* a flush could not reach the offset waited for (not tracked) */

typedef int (*rmq_sync_fn)(rmq_map_t *m, int64_t off, int64_t len);

typedef struct {
    rmq_map_t *m;
    int64_t base, size;
    const int64_t *wrote;      /* MappedSegment.wrote_pos, published by the writer */
    int64_t *flushed;          /* MappedSegment.flushed_pos, moved here */
    const int64_t *store_ts;   /* MappedSegment.store_timestamp, set after wrote_pos */
} rmq_flush_seg;

typedef struct {
    pthread_mutex_t lock;        /* the fields below but flush_lock */
    pthread_cond_t wake;         /* the thread: a request, or stop */
    pthread_cond_t done;         /* waiters: `flushed` moved, or `error` set */
    pthread_mutex_t flush_lock;  /* one flush at a time */
    rmq_flush_seg *segs;         /* tracked segments, in offset order */
    int nsegs, cap;
    int64_t flushed;             /* every byte before it is durable */
    int64_t flushed_ts;          /* store time of a message wholly before `flushed` */
    int64_t requested;           /* the largest offset a waiter asked for */
    int error, root_errno;       /* sticky: 0 or the status of the first failure */
    int64_t error_base;          /* base offset of the segment whose msync failed (-1: none) */
    int stop, running, periodic;
    int64_t interval_ms, least_pages, thorough_ms;
    int64_t rounds;              /* flushes that synced something */
    pid_t owner, tid;            /* the process that started the thread; the thread's id */
    pthread_t thread;
    char *root;
    dev_t dev;
    ino_t ino;
    rmq_sync_fn sync;
} rmq_flusher;

/* Prepare `f` for the store directory `root` (stat'ed now: its identity), with everything
 * before `flushed` durable already. */
int rmq_flusher_init(rmq_flusher *f, const char *root, rmq_sync_fn sync, int64_t flushed);
/* Start the thread: it flushes for waiters and, `periodic`, every `interval_ms` once
 * `least_pages` pages are dirty, and everything every `thorough_ms`. Signals stay blocked
 * in it (Python handles them on its main thread). */
int rmq_flusher_start(rmq_flusher *f, int periodic, int64_t interval_ms, int64_t least_pages, int64_t thorough_ms);
/* Stop and join the thread (a no-op in a forked child, which has none). */
void rmq_flusher_stop(rmq_flusher *f);
/* Track a segment newer than every tracked one; then drop from the front those wholly
 * flushed. Returns how many were dropped (their owner unpins them), or -ENOMEM. */
int rmq_flusher_track(rmq_flusher *f, const rmq_flush_seg *s);
/* Invariant 5 alone: 0, or the (sticky) failure when the store directory is gone or another. */
int rmq_flusher_check_root(rmq_flusher *f);
/* Flush now in the calling thread (`least_pages` as above; 0: everything). */
int rmq_flusher_flush(rmq_flusher *f, int64_t least_pages);
/* Return once everything before `offset` is durable (0) or a flush failed (its status);
 * flushes itself when no thread runs. */
int rmq_flusher_wait(rmq_flusher *f, int64_t offset);
/* Free what init allocated (the thread must be stopped). */
void rmq_flusher_destroy(rmq_flusher *f);

static inline int rmq_flusher_failed(const rmq_flusher *f) { return __atomic_load_n(&f->error, __ATOMIC_ACQUIRE); }
static inline int64_t rmq_flusher_flushed(const rmq_flusher *f) { return __atomic_load_n(&f->flushed, __ATOMIC_ACQUIRE); }

#endif
