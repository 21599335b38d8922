/* A prefetch that stays in the code.
 *
 * __builtin_prefetch has no side effect in GCC's eyes, so a function whose only work is
 * prefetching (prefetch_bytes, span_prefetch) is found pure and its calls deleted as dead:
 * GCC 12 -O3 left no prefetch instruction in _columns or in _index's record read-back.
 * The empty volatile asm is a side effect the optimizer keeps, at no cost at run time. */
#ifndef RMQ_PREFETCH_H
#define RMQ_PREFETCH_H

static inline void rmq_prefetch(const void *p)
{
    __builtin_prefetch(p);
    __asm__ __volatile__("" : : "r"(p));
}

#endif
