/* SIGBUS guard for store mappings.
 *
 * A page of a MAP_SHARED file mapping past the file's end, after another process truncated
 * the file while it was mapped (or a page the disk could not read back), raises SIGBUS on
 * access, which kills the process. Every store mapping is registered here; a SIGBUS inside
 * one puts a private zero page over the faulting page, counts the fault in the mapping's
 * `truncated` field, and lets the access run on: reads there see zeros (no record, so readers
 * stop or report corruption), and rmq_map_sync of a mapping with a fault fails with EIO, so
 * the store turns read-only and acknowledges nothing written there (flush.py, invariant 4).
 * A SIGBUS anywhere else goes to the handler installed before (default: the process dies;
 * one sent with kill while it was ignored stays ignored).
 * The handler is (re)installed by every rmq_guard_add, so it stays in front of one that
 * Python's faulthandler installs later. */
#ifndef RMQ_GUARD_H
#define RMQ_GUARD_H
#include <stdint.h>
#include <stddef.h>
#include <signal.h>

typedef struct rmq_guard_slot rmq_guard_slot;

/* Register [base, base+len), mapped with `prot`; faults there increment *hits. Returns the
 * slot (NULL when the handler could not be installed or memory ran out: the mapping is
 * then unguarded). */
rmq_guard_slot *rmq_guard_add(char *base, size_t len, int prot, volatile sig_atomic_t *hits);
/* Unregister before the range is unmapped. NULL is allowed. The handler reads slots
 * without a lock, so no thread may touch a range while it is removed and unmapped (store
 * mappings are pinned while kernels read them, and closed only after the last pin). */
void rmq_guard_remove(rmq_guard_slot *slot);

#endif
