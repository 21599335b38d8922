#define _GNU_SOURCE
#include "rmq_touch.h"
#include "rmq_background.h"
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

void rmq_make_init(rmq_make_t *mk, const char *path, int64_t size, int64_t reserve, int flags, int mode) {
    mk->open = rmq_map_open;
    mk->path = path; mk->size = size; mk->reserve = reserve; mk->flags = flags; mk->mode = mode;
    mk->state = RMQ_MAKE_QUEUED;
    mk->owner = getpid();
}

int rmq_make_run(rmq_make_t *mk, rmq_map_t *m) {
    int queued = RMQ_MAKE_QUEUED;
    if (!__atomic_compare_exchange_n(&mk->state, &queued, RMQ_MAKE_RUNNING, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return 0;
    int rc = mk->open(mk->path, mk->size, mk->reserve, mk->flags, mk->mode, m);
    __atomic_store_n(&mk->state, rc, __ATOMIC_RELEASE);   /* the map's fields are written before */
    return 1;
}

static int settled(rmq_make_t *mk) {
    struct timespec step = {0, 50000};
    int st;
    while ((st = rmq_make_state(mk)) == RMQ_MAKE_RUNNING && getpid() == mk->owner) nanosleep(&step, NULL);
    return st;
}

int rmq_make_wait(rmq_make_t *mk, rmq_map_t *m) {
    rmq_make_run(mk, m);
    return settled(mk);
}

int rmq_make_drop(rmq_make_t *mk) {
    int queued = RMQ_MAKE_QUEUED;
    __atomic_compare_exchange_n(&mk->state, &queued, RMQ_MAKE_DROPPED, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    return settled(mk);
}

int rmq_toucher_init(rmq_toucher *t, rmq_reserve_fn reserve) {
    memset(t, 0, sizeof *t);
    t->reserve = reserve;
    t->owner = getpid();
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->wake, NULL);
    return 0;
}

static void run_job(rmq_toucher *t, const rmq_touch_job *j) {
    rmq_map_t *m = j->m;
    if (j->make && (!rmq_make_run(j->make, m) || rmq_make_state(j->make) != 0)) return;   /* the writer's, or failed */
    int64_t ps = rmq_page_size(), stop = j->stop, reserved = __atomic_load_n(&m->reserved, __ATOMIC_ACQUIRE);
    if (j->reserve && stop > reserved) {
        int64_t end = (stop + ps - 1) / ps * ps;
        if (end > m->size) end = m->size;
        if (t->reserve(m, reserved, end - reserved) != 0) return;   /* the writer's own reserve will say why */
        /* a writer that reserved further meanwhile keeps its larger mark: only raise it */
        int64_t seen = __atomic_load_n(&m->reserved, __ATOMIC_ACQUIRE);
        while (seen < end && !__atomic_compare_exchange_n(&m->reserved, &seen, end, 0, __ATOMIC_RELEASE,
                                                          __ATOMIC_ACQUIRE)) {}
        reserved = end > seen ? end : seen;
    }
    if (stop > reserved) stop = reserved;   /* never a page without its block */
    if (stop > j->start) rmq_map_prefault(m, j->start, stop - j->start, 2);
}

static void *run(void *arg) {
    rmq_toucher *t = arg;
    t->tid = (pid_t)syscall(SYS_gettid);
    rmq_background_priority(t->tid);
    pthread_mutex_lock(&t->lock);
    while (!t->stop) {
        if (t->njobs == 0) {
            pthread_cond_wait(&t->wake, &t->lock);
            continue;
        }
        rmq_touch_job j = t->jobs[0];
        memmove(t->jobs, t->jobs + 1, sizeof *t->jobs * (size_t)(t->njobs - 1));
        t->njobs--;
        pthread_mutex_unlock(&t->lock);
        run_job(t, &j);
        pthread_mutex_lock(&t->lock);
        __atomic_store_n(&t->done, j.ticket, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

int rmq_toucher_start(rmq_toucher *t, const char *name) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&t->thread, NULL, run, t);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) return -rc;
    pthread_setname_np(t->thread, name);
    t->running = 1;
    return 0;
}

static int64_t queue_job(rmq_toucher *t, rmq_touch_job j) {
    pthread_mutex_lock(&t->lock);
    if (t->njobs == t->cap) {
        int cap = t->cap ? t->cap * 2 : 8;
        rmq_touch_job *grown = realloc(t->jobs, sizeof *grown * (size_t)cap);
        if (grown == NULL) { pthread_mutex_unlock(&t->lock); return -ENOMEM; }
        t->jobs = grown;
        t->cap = cap;
    }
    j.ticket = ++t->submitted;
    t->jobs[t->njobs++] = j;
    pthread_cond_signal(&t->wake);
    pthread_mutex_unlock(&t->lock);
    return j.ticket;
}

int64_t rmq_toucher_submit(rmq_toucher *t, rmq_map_t *m, int64_t start, int64_t stop, int reserve) {
    return queue_job(t, (rmq_touch_job){m, start, stop, reserve, NULL, 0});
}

int64_t rmq_toucher_make(rmq_toucher *t, rmq_map_t *m, rmq_make_t *mk, int64_t stop) {
    return queue_job(t, (rmq_touch_job){m, 0, stop, 0, mk, 0});
}

int64_t rmq_toucher_done(rmq_toucher *t) { return __atomic_load_n(&t->done, __ATOMIC_ACQUIRE); }

void rmq_toucher_stop(rmq_toucher *t) {
    if (!t->running) return;
    t->running = 0;
    if (t->owner != getpid()) return;
    pthread_mutex_lock(&t->lock);
    t->stop = 1;
    pthread_cond_signal(&t->wake);
    pthread_mutex_unlock(&t->lock);
    pthread_join(t->thread, NULL);
    t->njobs = 0;
    t->done = t->submitted;
}

void rmq_toucher_destroy(rmq_toucher *t) {
    if (t->owner == getpid()) {
        pthread_mutex_destroy(&t->lock);
        pthread_cond_destroy(&t->wake);
    }
    free(t->jobs);
    t->jobs = NULL;
    t->njobs = t->cap = 0;
}
