/* Native toucher: one pthread that makes the next segment (creates, allocates and maps its
 * file) and allocates disk blocks and faults pages in ahead of a segment's writer (what RocketMQ's warmMappedFile and Chronicle's pretoucher do), so the
 * writer neither waits for a fresh page nor for a Python thread holding the GIL. Jobs name
 * mappings their owner keeps mapped (pinned) until the job is done; nothing here touches a
 * Python object or a byte of the file (pages are populated for writing, never written).
 * A failure only costs warmth: the writer's own reserve raises DiskFullError before it
 * writes (DESIGN.md), and the next job tries again. */
#ifndef RMQ_TOUCH_H
#define RMQ_TOUCH_H
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>
#include "rmq_mmap.h"

typedef int (*rmq_reserve_fn)(rmq_map_t *m, int64_t off, int64_t len);

/* A segment made ahead: its file created, allocated and mapped (rmq_map_open) by the
 * toucher's thread, or by its writer if that needs it before the thread started on it.
 * `state` says which: one claims it from QUEUED with a compare-and-swap, so exactly one
 * makes the file and none after it is dropped. */
#define RMQ_MAKE_QUEUED  1   /* not started (maybe never handed to the thread) */
#define RMQ_MAKE_RUNNING 2   /* being made */
#define RMQ_MAKE_DROPPED 3   /* dropped before it was started: no file was made */
typedef int (*rmq_open_fn)(const char *path, int64_t size, int64_t reserve_bytes, int flags, int mode, rmq_map_t *m);
typedef struct {
    rmq_open_fn open;      /* rmq_map_open of the module that made this (each has its own copy of cext) */
    const char *path;      /* kept alive by the owner until the state is final */
    int64_t size, reserve; /* rmq_map_open's arguments */
    int flags, mode;
    int state;             /* the above, then 0 (made) or rmq_map_open's error (< 0) */
    pid_t owner;           /* the process whose thread may be making it */
} rmq_make_t;

/* Describe a make; called by the module whose rmq_map_open (with its fault injection and
 * SIGBUS guard) is to make the file. */
void rmq_make_init(rmq_make_t *mk, const char *path, int64_t size, int64_t reserve, int flags, int mode);
/* Claim a queued make and run it into `m`: 1 if this call made (or failed to make) it. */
int rmq_make_run(rmq_make_t *mk, rmq_map_t *m);
/* Make it here unless another thread started on it, then wait for that one: the final
 * state, or RMQ_MAKE_RUNNING in a forked child whose parent's thread was making it. */
int rmq_make_wait(rmq_make_t *mk, rmq_map_t *m);
/* Drop it if not started, else wait for the make under way: the final state (0: the file
 * was made, and is the caller's to remove). */
int rmq_make_drop(rmq_make_t *mk);
static inline int rmq_make_state(const rmq_make_t *mk) { return __atomic_load_n(&mk->state, __ATOMIC_ACQUIRE); }

typedef struct {
    rmq_map_t *m;
    int64_t start, stop;   /* fault [start, stop) in, */
    int reserve;           /* after allocating the blocks of [0, stop) (1) */
    rmq_make_t *make;      /* first make the segment (NULL: it is made); nothing else if another did */
    int64_t ticket;        /* its number: jobs done is the count of those finished */
} rmq_touch_job;

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    rmq_touch_job *jobs;    /* queued, oldest first */
    int njobs, cap;
    int64_t submitted, done; /* tickets handed out / finished (or dropped) */
    int stop, running;
    pid_t owner, tid;
    pthread_t thread;
    rmq_reserve_fn reserve;  /* the segment kernel's (fault injection sees it) */
} rmq_toucher;

int rmq_toucher_init(rmq_toucher *t, rmq_reserve_fn reserve);
/* Start the thread (named `name`, signals blocked in it). */
int rmq_toucher_start(rmq_toucher *t, const char *name);
/* Queue a job; its ticket (> 0), or -ENOMEM. */
int64_t rmq_toucher_submit(rmq_toucher *t, rmq_map_t *m, int64_t start, int64_t stop, int reserve);
/* Queue making the segment `mk` describes into `m`, then faulting [0, stop) in. */
int64_t rmq_toucher_make(rmq_toucher *t, rmq_map_t *m, rmq_make_t *mk, int64_t stop);
/* Tickets before this one are all finished or dropped. */
int64_t rmq_toucher_done(rmq_toucher *t);
/* Stop and join the thread once the job under way ends; queued jobs are dropped (counted
 * done). A no-op in a forked child, which has no thread. */
void rmq_toucher_stop(rmq_toucher *t);
void rmq_toucher_destroy(rmq_toucher *t);

#endif
