/* A segment's write position with a wake-up for a thread waiting for it to move.
 *
 * The store's one writer publishes each new position with rmq_publish64; the native reput,
 * caught up, waits with rmq_wait64 instead of polling with naps (on a virtual machine each
 * nap cost ~15 µs of CPU, ~100 per message at a gRPC endpoint's rate). The waiter sets the
 * flag, then reads the position; the writer stores the position, then reads the flag (both
 * sequentially consistent), so one of them sees the other: a waiter that read the old
 * position is woken (or FUTEX_WAIT finds the flag cleared and returns at once). The wait
 * has a timeout besides, so a position moved without rmq_publish64 is seen as late as that. */
#ifndef RMQ_WAKE_H
#define RMQ_WAKE_H

#include <limits.h>
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static inline void rmq_publish64(int64_t *pos, int64_t v, int *waiting) {
    __atomic_store_n(pos, v, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(waiting, __ATOMIC_SEQ_CST) && __atomic_exchange_n(waiting, 0, __ATOMIC_SEQ_CST))
        syscall(SYS_futex, waiting, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Wait until *pos is no longer ``seen`` (published), at most ``timeout_ns`` (< 1 s). */
static inline void rmq_wait64(const int64_t *pos, int64_t seen, int *waiting, long timeout_ns) {
    struct timespec t = {0, timeout_ns};
    __atomic_store_n(waiting, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(pos, __ATOMIC_SEQ_CST) == seen)
        syscall(SYS_futex, waiting, FUTEX_WAIT_PRIVATE, 1, &t, NULL, 0);
}

#endif
