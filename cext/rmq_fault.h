/* Fault injection for tests: make the Nth call of one operation fail with a chosen errno,
 * optionally only on files whose path contains a given substring. Off by default; when off
 * a check costs one load of `rmq_fault_armed`. Armed by rmq_fault_set() or, at load time,
 * by the environment variable RMQ_FAULTS="op:nth:errno[:match][,...]", where op is one of
 * open, msync, fallocate, ftruncate, fsync, pwrite and errno a number or a name (EIO, ENOSPC, ...). */
#ifndef RMQ_FAULT_H
#define RMQ_FAULT_H
#include <stdint.h>

enum { RMQ_OP_OPEN, RMQ_OP_MSYNC, RMQ_OP_FALLOCATE, RMQ_OP_FTRUNCATE, RMQ_OP_FSYNC, RMQ_OP_PWRITE, RMQ_OP_COUNT };

extern int rmq_fault_armed;

/* Fail the `nth` (1-based, counted from now) call of `op` whose path contains `match`
 * ("" for any) with `err`; nth 0 disarms `op`. Returns 0 or -EINVAL. */
int rmq_fault_set(int op, int64_t nth, int err, const char *match);
/* The errno the current call of `op` on `path` (or, when path is NULL, on descriptor
 * `fd`) must fail with, or 0. */
int rmq_fault_hit(int op, const char *path, int fd);
/* Tests only: `on` 1 makes every call of `op` on a file whose path contains `match` wait
 * (sleeping, in whatever thread made it) until a call with `on` 0; an armed failure of the
 * same call is decided after the wait. Returns 0 or -EINVAL. */
int rmq_fault_stall(int op, int on, const char *match);
/* The thread id (gettid) of the last call of `op` that stalled since the stall was set, or 0. */
int rmq_fault_stalled(int op);
/* Operation number of a name ("msync"), or -1. */
int rmq_fault_op(const char *name);

#define RMQ_FAULT(op, path, fd) (rmq_fault_armed ? rmq_fault_hit((op), (path), (fd)) : 0)

#endif
