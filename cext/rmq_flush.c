#define _GNU_SOURCE
#include "rmq_flush.h"
#include "rmq_background.h"
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct timespec deadline_after(int64_t ms) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec += 1; ts.tv_nsec -= 1000000000L; }
    return ts;
}

int rmq_flusher_init(rmq_flusher *f, const char *root, rmq_sync_fn sync, int64_t flushed) {
    struct stat st;
    pthread_condattr_t ca;
    memset(f, 0, sizeof *f);
    if (stat(root, &st)) return -errno;
    if ((f->root = strdup(root)) == NULL) return -ENOMEM;
    f->dev = st.st_dev;
    f->ino = st.st_ino;
    f->sync = sync;
    f->flushed = f->requested = flushed;
    f->error_base = -1;
    f->owner = getpid();
    pthread_mutex_init(&f->lock, NULL);
    pthread_mutex_init(&f->flush_lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&f->wake, &ca);
    pthread_cond_init(&f->done, &ca);
    pthread_condattr_destroy(&ca);
    return 0;
}

/* Record the first failure and wake every waiter with it. */
static int fail(rmq_flusher *f, int rc, int64_t base, int root_errno) {
    pthread_mutex_lock(&f->lock);
    if (!f->error) {
        f->error_base = base;
        f->root_errno = root_errno;
        __atomic_store_n(&f->error, rc, __ATOMIC_RELEASE);
    }
    rc = f->error;
    pthread_cond_broadcast(&f->done);
    pthread_mutex_unlock(&f->lock);
    return rc;
}

/* Invariant 5: the store directory is still the one opened. */
static int check_root(rmq_flusher *f) {
    struct stat st;
    if (stat(f->root, &st)) return fail(f, RMQ_EROOT_GONE, -1, errno);
    if (st.st_dev != f->dev || st.st_ino != f->ino) return fail(f, RMQ_EROOT_REPLACED, -1, 0);
    return 0;
}

int rmq_flusher_check_root(rmq_flusher *f) {
    int rc = rmq_flusher_failed(f);
    return rc ? rc : check_root(f);
}

static int flush_locked(rmq_flusher *f, int64_t least) {
    int64_t ps = rmq_page_size(), where, end = 0, ts = 0;
    rmq_flush_seg small[8], *snap = small;
    int n = 0, rc;
    if ((rc = rmq_flusher_failed(f))) return rc;
    if ((rc = check_root(f))) return rc;
    pthread_mutex_lock(&f->lock);
    where = f->flushed;
    if (f->nsegs > (int)(sizeof small / sizeof small[0]) &&
        (snap = malloc(sizeof *snap * (size_t)f->nsegs)) == NULL) {
        pthread_mutex_unlock(&f->lock);
        return fail(f, -ENOMEM, -1, 0);   /* what cannot be flushed is never acknowledged */
    }
    for (int i = 0; i < f->nsegs; i++)     /* only these are dereferenced: the rest may be dropped meanwhile */
        if (f->segs[i].base + f->segs[i].size > where) snap[n++] = f->segs[i];
    pthread_mutex_unlock(&f->lock);
    if (n > 0) {   /* the newest message's time, read before the end (invariant 3; the writer sets it after) */
        ts = __atomic_load_n(snap[n - 1].store_ts, __ATOMIC_ACQUIRE);
        end = snap[n - 1].base + __atomic_load_n(snap[n - 1].wrote, __ATOMIC_ACQUIRE);
    }
    int synced = 0;
    for (int i = 0; i < n; i++) {
        rmq_flush_seg *s = &snap[i];
        int64_t wrote = __atomic_load_n(s->wrote, __ATOMIC_ACQUIRE), fl = *s->flushed;
        if (wrote > fl && !(least > 0 && wrote < s->size && wrote / ps - fl / ps < least)) {
            if ((rc = f->sync(s->m, fl, wrote - fl))) {
                if (snap != small) free(snap);
                return fail(f, rc, s->base, 0);
            }
            __atomic_store_n(s->flushed, wrote, __ATOMIC_RELEASE);
            fl = wrote;
            synced = 1;
        }
        where = s->base + fl;
        if (fl < __atomic_load_n(s->wrote, __ATOMIC_ACQUIRE)) break;
    }
    if (snap != small) free(snap);
    pthread_mutex_lock(&f->lock);
    if (where > f->flushed) __atomic_store_n(&f->flushed, where, __ATOMIC_RELEASE);
    if (ts && f->flushed >= end && ts > f->flushed_ts) f->flushed_ts = ts;
    f->rounds += synced;
    pthread_cond_broadcast(&f->done);
    pthread_mutex_unlock(&f->lock);
    return 0;
}

int rmq_flusher_flush(rmq_flusher *f, int64_t least_pages) {
    pthread_mutex_lock(&f->flush_lock);
    int rc = flush_locked(f, least_pages);
    pthread_mutex_unlock(&f->flush_lock);
    return rc;
}

/* The thread: flush for waiters at once (everything written, so all who wrote meanwhile
 * share it), and on the periodic cadence. After a failure it only waits for stop. */
static void *run(void *arg) {
    rmq_flusher *f = arg;
    int64_t last_thorough = now_ms();
    struct timespec next = deadline_after(f->interval_ms);
    f->tid = (pid_t)syscall(SYS_gettid);
    if (f->periodic) rmq_background_priority(f->tid);   /* SYNC writers wait for it: not then */
    pthread_mutex_lock(&f->lock);
    while (!f->stop) {
        int64_t least = 0;
        if (!(f->requested > f->flushed && !f->error)) {
            if (!f->periodic || f->error) {
                pthread_cond_wait(&f->wake, &f->lock);
                continue;
            }
            if (pthread_cond_timedwait(&f->wake, &f->lock, &next) != ETIMEDOUT) continue;
            int64_t now = now_ms();
            least = f->least_pages;
            if (now - last_thorough >= f->thorough_ms) { least = 0; last_thorough = now; }
        }
        int64_t want = f->requested;   /* published before it was asked for: this flush covers it */
        pthread_mutex_unlock(&f->lock);
        int rc = rmq_flusher_flush(f, least);
        if (f->periodic) next = deadline_after(f->interval_ms);
        pthread_mutex_lock(&f->lock);
        if (!rc && !least && want > f->flushed) {   /* asked for bytes no tracked segment holds: a bug */
            pthread_mutex_unlock(&f->lock);
            fail(f, RMQ_EBEHIND, -1, 0);
            pthread_mutex_lock(&f->lock);
        }
    }
    pthread_mutex_unlock(&f->lock);
    return NULL;
}

int rmq_flusher_start(rmq_flusher *f, int periodic, int64_t interval_ms, int64_t least_pages, int64_t thorough_ms) {
    sigset_t all, old;
    f->periodic = periodic;
    f->interval_ms = interval_ms;
    f->least_pages = least_pages;
    f->thorough_ms = thorough_ms;
    f->stop = 0;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&f->thread, NULL, run, f);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) return -rc;
    pthread_setname_np(f->thread, "rmq-flush");
    f->running = 1;
    return 0;
}

void rmq_flusher_stop(rmq_flusher *f) {
    if (!f->running) return;
    f->running = 0;
    if (f->owner != getpid()) return;   /* a forked child: the thread is the parent's */
    pthread_mutex_lock(&f->lock);
    f->stop = 1;
    pthread_cond_broadcast(&f->wake);
    pthread_mutex_unlock(&f->lock);
    pthread_join(f->thread, NULL);
}

int rmq_flusher_track(rmq_flusher *f, const rmq_flush_seg *s) {
    int drop = 0;
    pthread_mutex_lock(&f->lock);
    if (f->nsegs == f->cap) {
        int cap = f->cap ? f->cap * 2 : 8;
        rmq_flush_seg *grown = realloc(f->segs, sizeof *grown * (size_t)cap);
        if (grown == NULL) { pthread_mutex_unlock(&f->lock); return -ENOMEM; }
        f->segs = grown;
        f->cap = cap;
    }
    f->segs[f->nsegs++] = *s;
    while (drop < f->nsegs - 1 && f->segs[drop].base + f->segs[drop].size <= f->flushed) drop++;
    memmove(f->segs, f->segs + drop, sizeof *f->segs * (size_t)(f->nsegs - drop));
    f->nsegs -= drop;
    pthread_mutex_unlock(&f->lock);
    return drop;
}

int rmq_flusher_wait(rmq_flusher *f, int64_t offset) {
    int rc;
    pthread_mutex_lock(&f->lock);
    while (f->flushed < offset && !f->error) {
        if (!f->running || f->stop || f->owner != getpid()) {   /* nobody to ask: flush here */
            pthread_mutex_unlock(&f->lock);
            rc = rmq_flusher_flush(f, 0);
            pthread_mutex_lock(&f->lock);
            if (!rc && f->flushed < offset) { pthread_mutex_unlock(&f->lock); return RMQ_EBEHIND; }
            continue;
        }
        if (f->requested < offset) {
            f->requested = offset;
            pthread_cond_signal(&f->wake);
        }
        pthread_cond_wait(&f->done, &f->lock);
    }
    rc = f->error;
    pthread_mutex_unlock(&f->lock);
    return rc;
}

void rmq_flusher_destroy(rmq_flusher *f) {
    if (f->owner == getpid()) {   /* a child's copies may be held by a parent thread: leave them */
        pthread_mutex_destroy(&f->lock);
        pthread_mutex_destroy(&f->flush_lock);
        pthread_cond_destroy(&f->wake);
        pthread_cond_destroy(&f->done);
    }
    free(f->segs);
    free(f->root);
    f->segs = NULL;
    f->root = NULL;
    f->nsegs = f->cap = 0;
}
