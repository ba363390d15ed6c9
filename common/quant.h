/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common/quant.h: blockwise symmetric quantization of f32/f16/bf16 arrays to int8 or int4
 * codes with one fp32 scale per block (ZeRO++'s qwZ and qgZ wire format). The per-block steps
 * are inline and ZINF_HD, so that the CUDA kernels (kernels/quant.cu) round exactly as the C
 * reference (common/quant.c, the host device's and the host collectives' codec). Not installed.
 *
 * The format, for n elements cut into blocks of `block` elements from element 0 (the last block
 * may be shorter):
 * - scale[b] = M / Q, M = max |x| over block b, Q = 127 (8 bits) or 7 (4 bits), one fp32
 *   division; M below FLT_MIN (2^-126: zero or subnormal) gives scale 0 (every code 0); when
 *   Q x scale overflows (M within a rounding of FLT_MAX) the scale steps down one ulp, so that
 *   no finite block dequantizes to an infinity;
 * - code[i] = x[i] / scale, one fp32 division, rounded to nearest (ties to even), clamped to
 *   [-Q, Q]; 8 bits: one int8 per element; 4 bits: two's complement nibbles, element 2i in the
 *   low nibble of byte i, 2i + 1 in the high one (block must be even);
 * - deq(i) = code[i] * scale[b], one fp32 multiplication (then the output type's rounding).
 * Per element |x - deq| <= scale / 2 + 2^-22 M (the fp32 division and product; = M / 254 for 8
 * bits, M / 14 for 4 bits) for a normal M, and <= M < 2^-126 for a flushed block.
 * A block holding a NaN or an infinity gets scale NaN and codes 0: every element of it
 * dequantizes to NaN (so the overflow check of fp16 training sees it after the collective).
 */
#ifndef ZINF_COMMON_QUANT_H
#define ZINF_COMMON_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"

#define QZ_BLOCK_DEFAULT 256u

#include <math.h>
#ifdef __CUDA_ARCH__ /* nvcc's device pass: each operation one IEEE _rn intrinsic */
#define QZ_DIV(a, b) __fdiv_rn((a), (b))
#define QZ_MUL(a, b) __fmul_rn((a), (b))
#define QZ_ADD(a, b) __fadd_rn((a), (b))
#define QZ_SUB(a, b) __fsub_rn((a), (b))
#define QZ_RINT(a)   rintf(a)
#else
#define QZ_DIV(a, b) ((a) / (b))
#define QZ_MUL(a, b) ((a) * (b))
#define QZ_ADD(a, b) ((a) + (b))
#define QZ_SUB(a, b) ((a) - (b))
#define QZ_RINT(a)   rintf(a) /* the default rounding mode: to nearest even */
#endif

/* The largest code: 127 for 8 bits, 7 for 4 bits. */
static inline ZINF_HD int
qz_qmax(unsigned bits)
{
	return bits == 4 ? 7 : 127;
}

/* Bytes of codes for n elements of `bits`. */
static inline ZINF_HD size_t
qz_code_bytes(size_t n, unsigned bits)
{
	return bits == 4 ? (n + 1) / 2 : n;
}

/* Blocks of n elements. */
static inline ZINF_HD size_t
qz_blocks(size_t n, size_t block)
{
	return (n + block - 1) / block;
}

/* |v|, or +inf for a NaN (so that a max over a block is +inf, not finite, when one is NaN). */
static inline ZINF_HD float
qz_mag(float v)
{
	uint32_t u = dt_f2u(v) & 0x7fffffffu;
	return u > 0x7f800000u ? dt_u2f(0x7f800000u) : dt_u2f(u);
}

/* The scale of a block from M, the max of qz_mag over it (order-free: max is exact). */
static inline ZINF_HD float
qz_scale(float m, unsigned bits)
{
	if (!(m < dt_u2f(0x7f800000u))) {
		return dt_u2f(0x7fc00000u); /* an infinity or a NaN in the block: poisoned */
	}
	if (m < dt_u2f(0x00800000u)) {
		return 0.0f; /* zero or subnormal: flushed */
	}
	float q = (float)qz_qmax(bits), s = QZ_DIV(m, q);
	/* M near FLT_MAX: Q x s may round past FLT_MAX, and code Q would dequantize to an
	   infinity; s steps down an ulp (once is enough) until Q x s is finite; the error stays
	   within the bound (a few ulps of M more than s / 2 at most for the largest elements) */
	while (!(QZ_MUL(q, s) < dt_u2f(0x7f800000u))) {
		s = nextafterf(s, 0.0f);
	}
	return s;
}

/* The code of v in a block of scale s (0 for a flushed or poisoned block). */
static inline ZINF_HD int
qz_code(float v, float s, unsigned bits)
{
	if (!(s > 0.0f)) {
		return 0;
	}
	float q = QZ_RINT(QZ_DIV(v, s));
	float lim = (float)qz_qmax(bits);
	q = q > lim ? lim : (q < -lim ? -lim : q);
	return (int)q;
}

/* Code i of an array of `bits`-bit codes. */
static inline ZINF_HD int
qz_get(const void *codes, size_t i, unsigned bits)
{
	if (bits == 4) {
		uint8_t b = ((const uint8_t *)codes)[i / 2];
		int nib = (i & 1) ? (b >> 4) : (b & 0xf);
		return nib >= 8 ? nib - 16 : nib;
	}
	return ((const int8_t *)codes)[i];
}

/* The dequantized value: code x scale in fp32 (NaN for a poisoned block, 0 for a flushed one). */
static inline ZINF_HD float
qz_deq(int code, float s)
{
	return QZ_MUL((float)code, s);
}

#ifndef __CUDACC__
/*
 * The C reference over arrays (common/quant.c). x: n elements of dtype t; codes:
 * qz_code_bytes(n, bits) bytes; scales: qz_blocks(n, block) floats. block >= 1 (even for 4 bits),
 * bits 8 or 4: the callers check them. err (optional, n floats): error feedback: each element
 * quantized is c = x + err[i] (one fp32 addition), and err[i] becomes beta x (c - deq(c))
 * afterwards (beta 0: err is zeroed; 0 in a poisoned block, so one overflow does not stay).
 */
void qz_quantize(void *codes, float *scales, const void *x, enum zinf_dtype t, size_t n,
		 size_t block, unsigned bits, float *err, float beta);
/* y[i] = deq(i), stored as dtype t (16-bit: to nearest even). */
void qz_dequantize(void *y, enum zinf_dtype t, const void *codes, const float *scales, size_t n,
		   size_t block, unsigned bits);
/* acc[i] += deq(i), one fp32 addition per element. */
void qz_dequantize_add(float *acc, const void *codes, const float *scales, size_t n, size_t block,
		       unsigned bits);
/* 0 when block and bits are a format this codec writes; else -EINVAL with a message (who:). */
int qz_check(size_t block, unsigned bits, const char *who);
#endif

#endif
