/* Background threads, the ASYNC flusher and the toucher, run at a lower CPU priority: 10
 * nice steps below the thread that starts them (19 at most), as RocksDB lowers its
 * compaction threads' with setpriority. On a machine with fewer cores than busy threads the
 * scheduler then stops taking a putting thread's core for their msyncs and page faults:
 * traced on 2 cores, the writer lost 4 ms ticks to the flusher. Their work is not urgent,
 * the writer's is. Under contention they still get about a tenth of a core (CFS weight 110
 * against 1024), so they are never starved. A failure (a sandbox that forbids it) leaves
 * the priority as it was. */
#ifndef RMQ_BACKGROUND_H
#define RMQ_BACKGROUND_H
#include <errno.h>
#include <sys/resource.h>
#include <sys/types.h>

#define RMQ_BACKGROUND_NICE 10

/* Lower the calling thread's priority; `tid` is its gettid(). */
static inline void rmq_background_priority(pid_t tid) {
    errno = 0;
    int nice = getpriority(PRIO_PROCESS, (id_t)tid);   /* -1 is a nice value too: errno tells */
    if (errno) return;
    nice += RMQ_BACKGROUND_NICE;
    (void)setpriority(PRIO_PROCESS, (id_t)tid, nice > 19 ? 19 : nice);
}

#endif
