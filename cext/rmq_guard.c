#define _GNU_SOURCE
#include "rmq_guard.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Slots live in chunks that are never freed, linked by `next`, so the handler can walk
 * them without a lock while rmq_guard_add/remove (under `lock`) fill and clear slots. A
 * slot is live while `start` is non-zero; `start` is written last when filling and first
 * when clearing. */
#define CHUNK_SLOTS 1024

struct rmq_guard_slot {
    _Atomic uintptr_t start;
    size_t len;
    int prot;
    volatile sig_atomic_t *hits;
};

typedef struct chunk {
    struct rmq_guard_slot slots[CHUNK_SLOTS];
    struct chunk *_Atomic next;
} chunk;

static chunk first;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction prev;           /* the handler ours was installed over */
static volatile sig_atomic_t chained;   /* a signal sent by kill/raise was passed on once */

static struct rmq_guard_slot *find(uintptr_t a) {
    for (chunk *c = &first; c; c = atomic_load_explicit(&c->next, memory_order_acquire))
        for (int i = 0; i < CHUNK_SLOTS; i++) {
            uintptr_t s = atomic_load_explicit(&c->slots[i].start, memory_order_acquire);
            if (s && a >= s && a - s < c->slots[i].len) return &c->slots[i];
        }
    return NULL;
}

static void pass_on(int sig, siginfo_t *info, void *ctx) {
    int sent = info->si_code <= 0;   /* kill/raise, not a fault: returning would not repeat it */
    if (sent && prev.sa_handler == SIG_IGN && !(prev.sa_flags & SA_SIGINFO)) return;   /* ignored, as before */
    if (!(sent && chained)) {
        if (sent) chained = 1;   /* a handler that raises it again (faulthandler) gets it once */
        if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction) { prev.sa_sigaction(sig, info, ctx); return; }
        if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) { prev.sa_handler(sig); return; }
    }
    signal(sig, SIG_DFL);   /* the default action: a fault repeats on return, a sent signal is re-sent */
    if (sent) raise(sig);
}

static void on_sigbus(int sig, siginfo_t *info, void *ctx) {
    uintptr_t a = (uintptr_t)info->si_addr;
    struct rmq_guard_slot *s = info->si_code > 0 ? find(a) : NULL;
    if (s) {
        /* mmap is no POSIX async-signal-safe function, but on Linux it is the bare system
         * call, which is (as sysconf(_SC_PAGESIZE) only reads a cached value). */
        uintptr_t page = a - a % (uintptr_t)sysconf(_SC_PAGESIZE);
        void *p = mmap((void *)page, (size_t)sysconf(_SC_PAGESIZE), s->prot,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (p != MAP_FAILED) {
            *s->hits += 1;
            return;
        }
    }
    pass_on(sig, info, ctx);
}

/* fork() while another thread holds `lock` would leave it held in the child forever. */
static void lock_for_fork(void) { pthread_mutex_lock(&lock); }
static void unlock_after_fork(void) { pthread_mutex_unlock(&lock); }

/* Put on_sigbus in front unless it is there; the caller holds `lock`. */
static int install(void) {
    static int forks_handled;
    struct sigaction cur, sa;
    if (!forks_handled && pthread_atfork(lock_for_fork, unlock_after_fork, unlock_after_fork) == 0) forks_handled = 1;
    if (sigaction(SIGBUS, NULL, &cur)) return -1;
    if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigbus) return 0;
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    prev = cur;
    chained = 0;
    return sigaction(SIGBUS, &sa, NULL);
}

rmq_guard_slot *rmq_guard_add(char *base, size_t len, int prot, volatile sig_atomic_t *hits) {
    struct rmq_guard_slot *found = NULL;
    if (base == NULL || len == 0) return NULL;
    pthread_mutex_lock(&lock);
    if (install() == 0) {
        chunk *c = &first;
        while (!found) {
            for (int i = 0; i < CHUNK_SLOTS && !found; i++)
                if (atomic_load_explicit(&c->slots[i].start, memory_order_relaxed) == 0) found = &c->slots[i];
            if (found) break;
            chunk *next = atomic_load_explicit(&c->next, memory_order_relaxed);
            if (!next) {
                next = calloc(1, sizeof(chunk));
                if (!next) break;
                atomic_store_explicit(&c->next, next, memory_order_release);
            }
            c = next;
        }
        if (found) {
            found->len = len;
            found->prot = prot;
            found->hits = hits;
            atomic_store_explicit(&found->start, (uintptr_t)base, memory_order_release);
        }
    }
    pthread_mutex_unlock(&lock);
    return found;
}

void rmq_guard_remove(rmq_guard_slot *slot) {
    if (!slot) return;
    pthread_mutex_lock(&lock);
    atomic_store_explicit(&slot->start, 0, memory_order_release);
    pthread_mutex_unlock(&lock);
}
