/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpu_adam/adam_scalar.c: the portable kernels: one element at a time with the exact scalar
 * helpers of adam_internal.h. Built without FMA contraction (-ffp-contract=off, for the whole
 * module in cpu_adam/CMakeLists.txt), so each operation rounds once, as PyTorch's unfused CPU
 * ops do, in every build type. The reference the vector paths are
 * compared with in spirit; the tests compare every path with float64.
 */
#include "cpu_adam/adam_internal.h"
#include "cpu_adam/adam_bf16m_internal.h"
#include "cpu_adam/adam_q8_internal.h"

static const char *
scalar_missing(const struct zinf_cpu_features *f)
{
	return NULL;
}

/* One optimizer over [i0, i1): its per-element update (adam_internal.h) in a loop. */
#define SCALAR_KERNEL(name, elem)                                                                  \
	static void scalar_##name(const struct zinf_opt_args *a, size_t i0, size_t i1)             \
	{                                                                                          \
		for (size_t i = i0; i < i1; i++) {                                                 \
			elem(a, i);                                                                \
		}                                                                                  \
	}

SCALAR_KERNEL(adam, adam_elem)
SCALAR_KERNEL(adam_bf16state, adam_bf16state_elem)
SCALAR_KERNEL(adagrad, adam_adagrad_elem)
SCALAR_KERNEL(lion, adam_lion_elem)
SCALAR_KERNEL(bf16master_run, adam_bf16master_elem)

/* q8 state: the blocks decoded, stepped by the scalar Adam kernel above, encoded */
static void
scalar_adam_q8state(const struct zinf_opt_args *a, size_t i0, size_t i1)
{
	q8_step(a, i0, i1, scalar_adam);
}

/* bf16 master: the runs (q8: decoded blocks) through adam_bf16master_elem() */
static void
scalar_adam_bf16master(const struct zinf_opt_args *a, size_t i0, size_t i1)
{
	bf16m_step(a, i0, i1, scalar_bf16master_run);
}

static double
scalar_sumsq(const void *g, enum zinf_dtype dt, size_t i0, size_t i1)
{
	/* Four partial sums, as the vector paths keep several accumulators. */
	double s[4] = {0, 0, 0, 0};
	size_t i = i0;
	for (; i + 4 <= i1; i += 4) {
		for (int k = 0; k < 4; k++) {
			s[k] += adam_sumsq_elem(g, dt, i + k);
		}
	}
	for (; i < i1; i++) {
		s[0] += adam_sumsq_elem(g, dt, i);
	}
	return (s[0] + s[1]) + (s[2] + s[3]);
}

static bool
scalar_has_inf_nan(const void *g, enum zinf_dtype dt, size_t i0, size_t i1)
{
	return adam_nonfinite_range(g, dt, i0, i1);
}

static void
scalar_scale(void *g, enum zinf_dtype dt, float s, size_t i0, size_t i1)
{
	for (size_t i = i0; i < i1; i++) {
		float x = adam_load_grad(g, dt, i) * s;
		switch (dt) {
		case ZINF_F16:
			((uint16_t *)g)[i] = dt_f32_to_f16_rne(x);
			break;
		case ZINF_BF16:
			((uint16_t *)g)[i] = dt_f32_to_bf16_rne(x);
			break;
		default:
			((float *)g)[i] = x;
			break;
		}
	}
}

static void
scalar_convert(const float *src, void *dst, enum zinf_copy_kind ck, size_t i0, size_t i1)
{
	for (size_t i = i0; i < i1; i++) {
		adam_store_copy(dst, ck, i, src[i]);
	}
}

const struct zinf_adam_ops zinf_adam_scalar_ops = {
	.name = "scalar",
	.missing = scalar_missing,
	.step =
		{
			[ZINF_OPT_ADAM] = scalar_adam,
			[ZINF_OPT_ADAM_BF16STATE] = scalar_adam_bf16state,
			[ZINF_OPT_ADAGRAD] = scalar_adagrad,
			[ZINF_OPT_LION] = scalar_lion,
			[ZINF_OPT_ADAM_Q8STATE] = scalar_adam_q8state,
			[ZINF_OPT_ADAM_BF16MASTER] = scalar_adam_bf16master,
		},
	.sumsq = scalar_sumsq,
	.has_inf_nan = scalar_has_inf_nan,
	.scale = scalar_scale,
	.convert = scalar_convert,
};
