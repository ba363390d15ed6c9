/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench/sr_streams.c: how related the bf16 master's stochastic-rounding bits are to the
 * moments' (cpu_adam/README.md, "bf16 master weight"). For each scheme, the fraction of index
 * pairs (i, j) whose random bit b (of the low 16 that round the master and bf16 m) agrees, worst
 * over bits 0-15 and over 64 random key pairs, for j = i (the same element) and for the pairing
 * that makes the two hashes' inputs meet (j = i ^ key difference). 1/2 is unrelated; sigma of
 * one fraction 0.5 / sqrt(n).
 *   old:     the master's key = the moments' key ^ 0x632be5ab, one function (lowbias32)
 *   twice:   lowbias32 with a second master key xored in between its rounds (tried, left)
 *   now:     adam_sr_bits_master (another function) with its own key (cpu_adam/adam_internal.h)
 *
 * build: cc -O2 -std=gnu11 -I. -Iinclude bench/sr_streams.c -o sr_streams -lm
 * usage: sr_streams [log2 n = 22]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cpu_adam/adam_internal.h"

static uint64_t rs = 88172645463325252ull;

static uint32_t
rnd32(void)
{
	rs ^= rs << 13;
	rs ^= rs >> 7;
	rs ^= rs << 17;
	return (uint32_t)rs;
}

/* lowbias32 with k1 xored in between its rounds */
static uint32_t
twice(uint32_t k0, uint32_t k1, uint32_t i)
{
	uint32_t h = i ^ k0;
	h ^= h >> 16;
	h *= 0x7feb352du;
	h ^= h >> 15;
	h ^= k1;
	h *= 0x846ca68bu;
	h ^= h >> 16;
	return h;
}

enum { OLD, TWICE, NOW };

static uint32_t
master_bits(int scheme, uint32_t k, uint32_t km, uint32_t km1, uint32_t i)
{
	switch (scheme) {
	case OLD:
		return adam_sr_bits(k ^ 0x632be5abu, i);
	case TWICE:
		return twice(km, km1, i);
	default:
		return adam_sr_bits_master(km, i);
	}
}

int
main(int argc, char **argv)
{
	int lg = argc > 1 ? atoi(argv[1]) : 22;
	size_t n = (size_t)1 << lg;
	const char *name[] = {"old", "twice", "now"};
	printf("n %zu per key pair, sigma %.5f\n", n, 0.5 / sqrt((double)n));
	for (int scheme = OLD; scheme <= NOW; scheme++) {
		double worst[2] = {0, 0};
		for (int t = 0; t < 64; t++) {
			uint32_t k = rnd32(), km = rnd32(), km1 = rnd32() | 1u;
			/* the pairing that makes the inputs meet: i ^ (master key ^ moments' key)
			 */
			uint32_t c = scheme == OLD ? 0x632be5abu : km ^ k;
			size_t agree[2][16] = {{0}};
			for (size_t s = 0; s < n; s++) {
				uint32_t i = rnd32();
				uint32_t a = master_bits(scheme, k, km, km1, i);
				uint32_t e[2] = {~(a ^ adam_sr_bits(k, i)),
						 ~(a ^ adam_sr_bits(k, i ^ c))};
				for (int r = 0; r < 2; r++) {
					for (int b = 0; b < 16; b++) {
						agree[r][b] += (e[r] >> b) & 1u;
					}
				}
			}
			for (int r = 0; r < 2; r++) {
				for (int b = 0; b < 16; b++) {
					double d = fabs((double)agree[r][b] / (double)n - 0.5);
					worst[r] = d > worst[r] ? d : worst[r];
				}
			}
		}
		printf("%-5s  same element: worst |agree - 1/2| %.4f   inputs met: %.4f\n",
		       name[scheme], worst[0], worst[1]);
	}
	return 0;
}
