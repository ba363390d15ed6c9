/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvme/crc32c.h: the two CRC32C implementations behind zinf_crc32c() (crc32c.c), declared for
 * the swap store, its tests and `zinf bench io`, which times both: a declared internal
 * interface, not installed.
 */
#ifndef ZINF_NVME_CRC32C_H
#define ZINF_NVME_CRC32C_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* CRC32C with the byte table (any CPU). Same contract as zinf_crc32c(). */
uint32_t crc32c_sw(uint32_t crc, const void *buf, size_t len);
/* CRC32C with the SSE4.2 crc32 instruction, three streams interleaved. Only where sse42. */
uint32_t crc32c_hw(uint32_t crc, const void *buf, size_t len);
/* True when zinf_crc32c() uses the instruction. */
bool crc32c_hw_available(void);

#endif
