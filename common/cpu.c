/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common/cpu.c: CPU feature detection with cpuid and xgetbv, so that an instruction set is
 * reported only when the OS also saves its registers. x86-64 only; elsewhere: no features.
 */
#include <string.h>

#include "common/util.h"

#if defined(__x86_64__)
#include <cpuid.h>

static uint64_t
xgetbv0(void)
{
	uint32_t eax, edx;
	__asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
	return ((uint64_t)edx << 32) | eax;
}

void
zinf_cpu_features_get(struct zinf_cpu_features *out)
{
	unsigned a, b, c, d;
	memset(out, 0, sizeof(*out));
	if (!__get_cpuid(1, &a, &b, &c, &d)) {
		return;
	}
	out->sse42 = c & bit_SSE4_2;
	bool osxsave = c & bit_OSXSAVE;
	bool avx = c & bit_AVX;
	bool fma = c & bit_FMA;
	bool f16c = c & bit_F16C;
	uint64_t xcr0 = osxsave ? xgetbv0() : 0;
	bool ymm_ok = (xcr0 & 0x6) == 0x6;	       /* SSE and AVX state */
	bool zmm_ok = ymm_ok && (xcr0 & 0xe0) == 0xe0; /* opmask, ZMM_Hi256, Hi16_ZMM */
	if (!ymm_ok || !avx) {
		return;
	}
	out->fma = fma;
	out->f16c = f16c;
	if (__get_cpuid_max(0, NULL) < 7) {
		return;
	}
	__cpuid_count(7, 0, a, b, c, d);
	out->avx2 = b & bit_AVX2;
	if (zmm_ok) {
		out->avx512f = b & bit_AVX512F;
		out->avx512bw = b & bit_AVX512BW;
		out->avx512vl = b & bit_AVX512VL;
		__cpuid_count(7, 1, a, b, c, d);
		out->avx512bf16 = out->avx512f && (a & (1u << 5));
	}
}
#else
void
zinf_cpu_features_get(struct zinf_cpu_features *out)
{
	memset(out, 0, sizeof(*out));
}
#endif
