/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common/quant.c: the C reference of the blockwise int8/int4 codec (common/quant.h): the host
 * device's kernels and the host collectives' codec run it, and the CUDA kernels
 * (kernels/quant.cu) are compared with it. One pass per block: the max, then the codes. It
 * checks nothing (qz_check is for the callers, which name their object in the message).
 * Compiled without FP contraction, so each operation rounds as the kernel's _rn intrinsic.
 */
#include "common/quant.h"
#include "common/util.h"

int
qz_check(size_t block, unsigned bits, const char *who)
{
	if (bits != 8 && bits != 4) {
		return ZINF_FAIL(-EINVAL, "%s: %u-bit codes: the codec writes 8 or 4", who, bits);
	}
	if (block == 0 || block > (1u << 30) || (bits == 4 && block % 2)) {
		return ZINF_FAIL(-EINVAL,
				 "%s: block of %zu elements: expected 1..2^30 elements per scale, "
				 "even for 4-bit codes (two per byte)",
				 who, block);
	}
	return 0;
}

static void
put(void *codes, size_t i, int q, unsigned bits)
{
	if (bits == 4) {
		uint8_t *b = (uint8_t *)codes + i / 2;
		uint8_t nib = (uint8_t)(q & 0xf);
		*b = (i & 1) ? (uint8_t)((*b & 0x0f) | (nib << 4)) : (uint8_t)((*b & 0xf0) | nib);
	} else {
		((int8_t *)codes)[i] = (int8_t)q;
	}
}

void
qz_quantize(void *codes, float *scales, const void *x, enum zinf_dtype t, size_t n, size_t block,
	    unsigned bits, float *err, float beta)
{
	if (bits == 4 && n % 2) {
		((uint8_t *)codes)[n / 2] = 0; /* the unused high nibble of an odd count */
	}
	for (size_t lo = 0; lo < n; lo += block) {
		size_t hi = ZINF_MIN(n, lo + block);
		float m = 0.0f;
		for (size_t i = lo; i < hi; i++) {
			float v = dt_load(x, t, i);
			v = err ? QZ_ADD(v, err[i]) : v;
			float a = qz_mag(v);
			m = a > m ? a : m;
		}
		float s = qz_scale(m, bits);
		scales[lo / block] = s;
		for (size_t i = lo; i < hi; i++) {
			float v = dt_load(x, t, i);
			v = err ? QZ_ADD(v, err[i]) : v;
			int q = qz_code(v, s, bits);
			put(codes, i, q, bits);
			if (err) { /* a poisoned block keeps no error: NaN would stay for good */
				err[i] = s == s ? QZ_MUL(beta, QZ_SUB(v, qz_deq(q, s))) : 0.0f;
			}
		}
	}
}

void
qz_dequantize(void *y, enum zinf_dtype t, const void *codes, const float *scales, size_t n,
	      size_t block, unsigned bits)
{
	for (size_t i = 0; i < n; i++) {
		dt_store(y, t, i, qz_deq(qz_get(codes, i, bits), scales[i / block]));
	}
}

void
qz_dequantize_add(float *acc, const void *codes, const float *scales, size_t n, size_t block,
		  unsigned bits)
{
	for (size_t i = 0; i < n; i++) {
		acc[i] = QZ_ADD(acc[i], qz_deq(qz_get(codes, i, bits), scales[i / block]));
	}
}
