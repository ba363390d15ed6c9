/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common/dtype.h: the exact scalar conversions between float32 and the 16-bit types, inline for
 * the kernels that call them per element (cpu_adam/, the host device, the CLI), and the private
 * side of zinf_dtype. The public side (sizes, names, array conversion) is zinf/common.h.
 * Not installed.
 */
#ifndef ZINF_COMMON_DTYPE_H
#define ZINF_COMMON_DTYPE_H

#include <stdint.h>
#include <string.h>

#include "zinf/common.h"

/* The conversions are also the CUDA kernels' (kernels/ (*.cu)): one definition, bit for bit. */
#ifdef __CUDACC__
#define ZINF_HD __host__ __device__
#else
#define ZINF_HD
#endif

static inline ZINF_HD uint32_t
dt_f2u(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static inline ZINF_HD float
dt_u2f(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static inline ZINF_HD float
dt_bf16_to_f32(uint16_t h)
{
	return dt_u2f((uint32_t)h << 16);
}

/* Round to nearest even; NaN stays NaN (quieted, sign and top payload kept), as vcvtneps2bf16
 * does; subnormals are rounded exactly (the instruction flushes them, so the AVX-512 path
 * patches them). */
static inline ZINF_HD uint16_t
dt_f32_to_bf16_rne(float f)
{
	uint32_t x = dt_f2u(f);
	if ((x & 0x7fffffffu) > 0x7f800000u) {
		return (uint16_t)((x >> 16) | 0x40);
	}
	return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* Stochastic rounding with 16 random bits r: rounds up with probability (dropped bits) / 2^16. */
static inline ZINF_HD uint16_t
dt_f32_to_bf16_sr(float f, uint32_t r)
{
	uint32_t x = dt_f2u(f);
	if ((x & 0x7fffffffu) > 0x7f800000u) {
		return (uint16_t)((x >> 16) | 0x40);
	}
	if ((x & 0x7fffffffu) == 0x7f800000u) {
		return (uint16_t)(x >> 16);
	}
	return (uint16_t)((x + (r & 0xffffu)) >> 16);
}

static inline ZINF_HD float
dt_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t e = (h >> 10) & 0x1f, mant = h & 0x3ff;
	if (e == 0) {
		float f = (float)mant * 0x1p-24f; /* exact: zero or subnormal */
		return dt_u2f(dt_f2u(f) | sign);
	}
	if (e == 31) {
		return dt_u2f(sign | 0x7f800000u | (mant << 13));
	}
	return dt_u2f(sign | ((e + 112) << 23) | (mant << 13));
}

/* Round to nearest even, as F16C's vcvtps2ph with _MM_FROUND_TO_NEAREST_INT: overflow to
 * infinity from 65520 up, subnormal results rounded exactly, NaN quieted with the top 9 payload
 * bits kept. */
static inline ZINF_HD uint16_t
dt_f32_to_f16_rne(float f)
{
	uint32_t x = dt_f2u(f);
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
	x &= 0x7fffffffu;
	if (x >= 0x7f800000u) {
		return x == 0x7f800000u ? (sign | 0x7c00)
					: (uint16_t)(sign | 0x7e00 | ((x >> 13) & 0x3ff));
	}
	if (x >= 0x477ff000u) { /* >= 65520: rounds to 65536, not representable */
		return sign | 0x7c00;
	}
	if (x >= 0x38800000u) { /* normal half: rebias the exponent, round 13 bits away */
		uint32_t r = x - 0x38000000u;
		r += 0xfffu + ((r >> 13) & 1);
		return (uint16_t)(sign | (r >> 13));
	}
	if (x <= 0x33000000u) { /* <= 2^-25: half the smallest subnormal or less, ties to 0 */
		return sign;
	}
	uint32_t e = x >> 23, mant = (x & 0x7fffffu) | 0x800000u;
	uint32_t shift = 126 - e; /* 14..24: units of 2^-24 */
	uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
	if (rem > half || (rem == half && (q & 1))) {
		q++;
	}
	return (uint16_t)(sign | q);
}

/* Element i of x (dtype t) as float, exactly; and f stored as element i (16-bit: RNE). */
static inline ZINF_HD float
dt_load(const void *x, enum zinf_dtype t, size_t i)
{
	switch (t) {
	case ZINF_F16:
		return dt_f16_to_f32(((const uint16_t *)x)[i]);
	case ZINF_BF16:
		return dt_bf16_to_f32(((const uint16_t *)x)[i]);
	default:
		return ((const float *)x)[i];
	}
}

static inline ZINF_HD void
dt_store(void *x, enum zinf_dtype t, size_t i, float f)
{
	switch (t) {
	case ZINF_F16:
		((uint16_t *)x)[i] = dt_f32_to_f16_rne(f);
		break;
	case ZINF_BF16:
		((uint16_t *)x)[i] = dt_f32_to_bf16_rne(f);
		break;
	default:
		((float *)x)[i] = f;
		break;
	}
}

#endif
