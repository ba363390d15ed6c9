/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvme/swap_internal.h: what the swap files share privately with crc32c.c, the tests and the
 * benchmarks: the two CRC32C implementations (so that a test can compare them, and a bench can
 * time each) and the test hook that fakes the free space a directory reports.
 */
#ifndef ZINF_SWAP_INTERNAL_H
#define ZINF_SWAP_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* CRC32C with the byte table (any CPU). Same contract as zinf_crc32c(). */
uint32_t zinf_crc32c_sw(uint32_t crc, const void *buf, size_t len);
/* CRC32C with the SSE4.2 crc32 instruction, three streams interleaved. Only where sse42. */
uint32_t zinf_crc32c_hw(uint32_t crc, const void *buf, size_t len);
/* True when zinf_crc32c() uses the instruction. */
bool zinf_crc32c_hw_available(void);

/*
 * Test hook: make zinf_swap_reserve() believe every directory has `bytes` bytes free (as
 * statvfs f_bavail * f_frsize would say); UINT64_MAX restores the real figure. Process-wide;
 * only tests call it.
 */
void zinf_swap_test_set_free_bytes(uint64_t bytes);

#endif
