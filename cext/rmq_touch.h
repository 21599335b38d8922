/* Native toucher: one pthread that allocates disk blocks and faults pages in ahead of a
 * segment's writer (what RocketMQ's warmMappedFile and Chronicle's pretoucher do), so the
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

typedef struct {
    rmq_map_t *m;
    int64_t start, stop;   /* fault [start, stop) in, */
    int reserve;           /* after allocating the blocks of [0, stop) (1) */
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
/* Tickets before this one are all finished or dropped. */
int64_t rmq_toucher_done(rmq_toucher *t);
/* Stop and join the thread once the job under way ends; queued jobs are dropped (counted
 * done). A no-op in a forked child, which has no thread. */
void rmq_toucher_stop(rmq_toucher *t);
void rmq_toucher_destroy(rmq_toucher *t);

#endif
