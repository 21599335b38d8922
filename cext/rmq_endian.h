/* Big-endian load/store helpers: the one copy every kernel uses. */
#ifndef RMQ_ENDIAN_H
#define RMQ_ENDIAN_H
#include <stdint.h>
#include <string.h>

static inline int16_t rmq_ld16(const char *p) { uint16_t v; memcpy(&v, p, 2); return (int16_t)__builtin_bswap16(v); }
static inline int32_t rmq_ld32(const char *p) { uint32_t v; memcpy(&v, p, 4); return (int32_t)__builtin_bswap32(v); }
static inline int64_t rmq_ld64(const char *p) { uint64_t v; memcpy(&v, p, 8); return (int64_t)__builtin_bswap64(v); }
static inline void rmq_st16(char *p, int16_t x) { uint16_t v = __builtin_bswap16((uint16_t)x); memcpy(p, &v, 2); }
static inline void rmq_st32(char *p, int32_t x) { uint32_t v = __builtin_bswap32((uint32_t)x); memcpy(p, &v, 4); }
static inline void rmq_st64(char *p, int64_t x) { uint64_t v = __builtin_bswap64((uint64_t)x); memcpy(p, &v, 8); }

#endif
