/* Store ordering for records that must never be seen half-written.
 *
 * A killed process leaves in the page cache exactly the stores it executed, and a reader
 * thread sees another's stores as the CPU orders them; the compiler, though, may reorder
 * plain stores to different fields (gcc wrote a consume-queue entry's SIZE before its
 * OFFSET). So each on-disk structure is written with the field that makes it valid last
 * (a record's TOTALSIZE, an entry's SIZE, an index slot after its entry), after a
 * release fence: whatever sees that field sees everything written before it. */
#ifndef RMQ_ORDER_H
#define RMQ_ORDER_H

static inline void rmq_release(void) { __atomic_thread_fence(__ATOMIC_RELEASE); }

#endif
