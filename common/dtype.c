/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common/dtype.c: element types: sizes, names, parsing and the array conversion. The per-element
 * conversions are inline in common/dtype.h for the kernels; this file is the public, checked
 * entry point over whole arrays.
 */
#include <strings.h>

#include "common/dtype.h"
#include "common/util.h"

size_t
zinf_dtype_size(enum zinf_dtype dtype)
{
	switch (dtype) {
	case ZINF_F32:
		return 4;
	case ZINF_F16:
	case ZINF_BF16:
		return 2;
	}
	return 0;
}

const char *
zinf_dtype_name(enum zinf_dtype dtype)
{
	switch (dtype) {
	case ZINF_F32:
		return "f32";
	case ZINF_F16:
		return "f16";
	case ZINF_BF16:
		return "bf16";
	}
	return "?";
}

int
zinf_dtype_parse(const char *name, enum zinf_dtype *out)
{
	static const struct {
		const char *name;
		enum zinf_dtype dt;
	} names[] = {
		{"f32", ZINF_F32},	 {"fp32", ZINF_F32}, {"float32", ZINF_F32},
		{"float", ZINF_F32},	 {"f16", ZINF_F16},  {"fp16", ZINF_F16},
		{"float16", ZINF_F16},	 {"half", ZINF_F16}, {"bf16", ZINF_BF16},
		{"bfloat16", ZINF_BF16},
	};
	if (!name || !out) {
		return -EINVAL;
	}
	for (size_t i = 0; i < ZINF_ARRAY_SIZE(names); i++) {
		if (strcasecmp(name, names[i].name) == 0) {
			*out = names[i].dt;
			return 0;
		}
	}
	return -EINVAL;
}

int
zinf_dtype_convert(void *dst, enum zinf_dtype dst_dtype, const void *src, enum zinf_dtype src_dtype,
		   size_t n)
{
	if (!zinf_dtype_size(dst_dtype) || !zinf_dtype_size(src_dtype)) {
		return ZINF_FAIL(-EINVAL, "zinf_dtype_convert: unknown dtype (dst %d, src %d)",
				 (int)dst_dtype, (int)src_dtype);
	}
	if (n && (!dst || !src)) {
		return ZINF_FAIL(-EINVAL, "zinf_dtype_convert: NULL %s with n = %zu",
				 dst ? "src" : "dst", n);
	}
	if (dst_dtype == src_dtype) {
		memmove(dst, src, n * zinf_dtype_size(dst_dtype));
		return 0;
	}
	for (size_t i = 0; i < n; i++) {
		float f = dt_load(src, src_dtype, i);
		switch (dst_dtype) {
		case ZINF_F32:
			((float *)dst)[i] = f;
			break;
		case ZINF_F16:
			((uint16_t *)dst)[i] = dt_f32_to_f16_rne(f);
			break;
		case ZINF_BF16:
			((uint16_t *)dst)[i] = dt_f32_to_bf16_rne(f);
			break;
		}
	}
	return 0;
}
