#define _GNU_SOURCE
#include "rmq_fault.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int64_t left;        /* calls still to pass before the failing one; 0 = disarmed */
    int err;
    char match[256];
} fault_t;

int rmq_fault_armed = 0;
static fault_t faults[RMQ_OP_COUNT];
static int stalls[RMQ_OP_COUNT];            /* 1: a matching call waits until cleared */
static char stall_match[RMQ_OP_COUNT][256];
static int stalled_tid[RMQ_OP_COUNT];       /* the thread of the last call that stalled */
static void rearm(void);
static const char *const op_names[RMQ_OP_COUNT] = {"open", "msync", "fallocate", "ftruncate", "fsync", "pwrite"};

int rmq_fault_op(const char *name) {
    for (int i = 0; i < RMQ_OP_COUNT; i++)
        if (strcmp(name, op_names[i]) == 0) return i;
    return -1;
}

int rmq_fault_set(int op, int64_t nth, int err, const char *match) {
    if (op < 0 || op >= RMQ_OP_COUNT || nth < 0 || err <= 0 || strlen(match) >= sizeof faults[0].match)
        return -EINVAL;
    fault_t *f = &faults[op];
    strcpy(f->match, match);
    f->err = err;
    __atomic_store_n(&f->left, nth, __ATOMIC_SEQ_CST);
    rearm();
    return 0;
}

static void rearm(void) {
    int armed = 0;
    for (int i = 0; i < RMQ_OP_COUNT; i++) armed |= faults[i].left > 0 || __atomic_load_n(&stalls[i], __ATOMIC_SEQ_CST);
    __atomic_store_n(&rmq_fault_armed, armed, __ATOMIC_SEQ_CST);
}

int rmq_fault_stall(int op, int on, const char *match) {
    if (op < 0 || op >= RMQ_OP_COUNT || strlen(match) >= sizeof stall_match[0]) return -EINVAL;
    if (on) {
        strcpy(stall_match[op], match);
        __atomic_store_n(&stalled_tid[op], 0, __ATOMIC_SEQ_CST);
    }
    __atomic_store_n(&stalls[op], on, __ATOMIC_SEQ_CST);
    rearm();
    return 0;
}

int rmq_fault_stalled(int op) {
    return op < 0 || op >= RMQ_OP_COUNT ? 0 : __atomic_load_n(&stalled_tid[op], __ATOMIC_SEQ_CST);
}

/* Whether the file `path` (NULL: that of descriptor `fd`) contains `match` ("" matches all). */
static int matches(const char *match, const char *path, int fd) {
    char buf[4096], link[64];
    if (!match[0]) return 1;
    if (path == NULL) {
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, buf, sizeof buf - 1);
        if (n < 0) return 0;
        buf[n] = 0;
        path = buf;
    }
    return strstr(path, match) != NULL;
}

int rmq_fault_hit(int op, const char *path, int fd) {
    fault_t *f = &faults[op];
    if (__atomic_load_n(&stalls[op], __ATOMIC_SEQ_CST) && matches(stall_match[op], path, fd)) {
        struct timespec ms = {0, 1000000};
        __atomic_store_n(&stalled_tid[op], (int)syscall(SYS_gettid), __ATOMIC_SEQ_CST);
        while (__atomic_load_n(&stalls[op], __ATOMIC_SEQ_CST)) nanosleep(&ms, NULL);
    }
    if (__atomic_load_n(&f->left, __ATOMIC_SEQ_CST) <= 0 || !matches(f->match, path, fd)) return 0;
    return __atomic_sub_fetch(&f->left, 1, __ATOMIC_SEQ_CST) == 0 ? f->err : 0;
}

static int parse_errno(const char *s) {
    static const struct { const char *name; int code; } names[] = {
        {"EIO", EIO}, {"ENOSPC", ENOSPC}, {"EDQUOT", EDQUOT}, {"EACCES", EACCES},
        {"EPERM", EPERM}, {"ENOMEM", ENOMEM}, {"EROFS", EROFS}, {"EOPNOTSUPP", EOPNOTSUPP}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0) return names[i].code;
    return atoi(s);
}

/* RMQ_FAULTS="op:nth:errno[:match],..." arms faults as the library loads. */
__attribute__((constructor)) static void fault_from_env(void) {
    const char *env = getenv("RMQ_FAULTS");
    char spec[1024];
    if (env == NULL || strlen(env) >= sizeof spec) return;
    strcpy(spec, env);
    char *save = NULL;
    for (char *item = strtok_r(spec, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *f[4] = {NULL, NULL, NULL, ""}, *s2 = NULL;
        int k = 0;
        for (char *p = strtok_r(item, ":", &s2); p && k < 4; p = strtok_r(NULL, ":", &s2)) f[k++] = p;
        if (k < 3) continue;
        rmq_fault_set(rmq_fault_op(f[0]), atoll(f[1]), parse_errno(f[2]), f[3]);
    }
}
