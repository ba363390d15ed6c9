/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/nvme/test_crc.c: CRC32C (Castagnoli): published test vectors, and the SSE4.2
 * instruction path against the table path on random data, offsets and lengths, including
 * continuing from a partial CRC.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "nvme/crc32c.h"
#include "zinf/blocks/swap.h"

/* ---- CRC32C ------------------------------------------------------------------------------- */

Test(crc32c, crc32c_vectors)
{
	unsigned char b[32];
	cr_assert_eq(zinf_crc32c(0, "123456789", 9), 0xe3069283u);
	cr_assert_eq(crc32c_sw(0, "123456789", 9), 0xe3069283u);
	cr_assert_eq(zinf_crc32c(0, b, 0), 0u);
	/* RFC 3720 B.4 */
	memset(b, 0, 32);
	cr_assert_eq(zinf_crc32c(0, b, 32), 0x8a9136aau);
	memset(b, 0xff, 32);
	cr_assert_eq(zinf_crc32c(0, b, 32), 0x62a8ab43u);
	for (int i = 0; i < 32; i++) {
		b[i] = (unsigned char)i;
	}
	cr_assert_eq(zinf_crc32c(0, b, 32), 0x46dd794eu);
	for (int i = 0; i < 32; i++) {
		b[i] = (unsigned char)(31 - i);
	}
	cr_assert_eq(zinf_crc32c(0, b, 32), 0x113fdb5cu);
}

Test(crc32c, crc32c_hw_matches_table)
{
	if (!crc32c_hw_available()) {
		cr_skip_test("no SSE4.2 crc32 instruction on this CPU: only the table runs");
	}
	uint64_t st = zt_seed();
	size_t n = 400000; /* several rounds of 3 x 32 KiB lanes, and tails */
	unsigned char *b = malloc(n + 64);
	zt_rand_fill(b, n + 64, &st);
	for (int i = 0; i < 300; i++) {
		size_t off = zt_rand(&st) % 64;
		size_t len = i < 100 ? zt_rand(&st) % 64 : zt_rand(&st) % n;
		uint32_t seed = (uint32_t)zt_rand(&st);
		uint32_t sw = crc32c_sw(seed, b + off, len);
		uint32_t hw = crc32c_hw(seed, b + off, len);
		cr_assert_eq(hw, sw, "off %zu len %zu: hw %08x table %08x", off, len, hw, sw);
		/* Continuing from a partial CRC is the CRC of the concatenation. */
		size_t cut = len ? zt_rand(&st) % len : 0;
		uint32_t two =
			zinf_crc32c(zinf_crc32c(seed, b + off, cut), b + off + cut, len - cut);
		cr_assert_eq(two, sw, "split at %zu of %zu", cut, len);
	}
	free(b);
}
