/* CRC-32 (ISO-HDLC, java.util.zip.CRC32's and zlib's): RocketMQ's BODYCRC. */
#ifndef RMQ_CRC_H
#define RMQ_CRC_H
#include <stddef.h>
#include <stdint.h>

/* zlib's crc32() contract (start from 0, feed chunks in order): carry-less multiply
 * folding where the CPU has PCLMULQDQ, zlib's tables for short inputs and the tail. */
uint32_t rmq_crc32(uint32_t crc, const char *buf, size_t len);

#endif
