/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpu_adam/adam_internal.h: what the optimizer front end (adam.c) shares with the per-ISA kernel
 * files (adam_scalar.c, adam_avx2.c, adam_avx512.c): the argument block of one step, the kernel
 * table each ISA exports, the exact scalar conversions and the per-element updates of the scalar
 * kernel. The vector kernels themselves are written once, in adam_simd_body.h.
 * Nothing here validates arguments: adam.c does, once per call.
 */
#ifndef ZINF_ADAM_INTERNAL_H
#define ZINF_ADAM_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/dtype.h"
#include "cpu_adam/adam_bench.h" /* ZINF_ADAM_TILE */
#include "zinf/blocks/adam.h"

enum zinf_copy_kind { ZINF_COPY_NONE = 0, ZINF_COPY_F32, ZINF_COPY_F16, ZINF_COPY_BF16 };

/* One step's arrays (host memory, n elements each, any alignment) and its scalars, computed in
 * float64 by adam.c and rounded to float once. */
struct zinf_opt_args {
	float *param;
	const void *grad; /* gdt */
	void *m;	  /* float, or uint16_t bf16 in the bf16-state step */
	void *v;	  /* float, or uint16_t bf16; Adagrad's state_sum */
	void *copy;	  /* ck; NULL when ck == ZINF_COPY_NONE */
	enum zinf_dtype gdt;
	enum zinf_copy_kind ck;
	bool l2; /* add wd * p to the gradient (Adam L2 mode, Adagrad) */
	float grad_scale;
	float wd;	/* L2 coefficient (used when l2) */
	float decay;	/* p *= decay first (AdamW, Lion: 1 - lr * wd; else 1) */
	float b1, omb1; /* beta1, 1 - beta1 */
	float b2, omb2; /* beta2, 1 - beta2 */
	float eps;
	float nstep;		     /* -step_size (Adam), -clr (Adagrad), -lr (Lion) */
	float bc2_sqrt;		     /* sqrt(1 - beta2^t), 1 without bias correction */
	float inv_bc2_sqrt;	     /* 1 / bc2_sqrt from float64 (vector paths multiply) */
	bool hw_bf16;		     /* the CPU has vcvtneps2bf16 (AVX512-BF16) */
	enum zinf_rounding rounding; /* bf16 state */
	uint32_t sr_key;	     /* stochastic rounding: hash key of (seed, step) */
	/* q8 state (adam_q8_internal.h): m and v are q8 arrays; element i's index in nd's space
	 * (and the stochastic rounding's hash) is index0 + i; n_nd ranges [nd[2k], nd[2k + 1])
	 * get weight decay 0 */
	uint64_t index0;
	const uint64_t *nd;
	uint32_t n_nd;
	/* bf16 state's stochastic rounding: element i's hash index is hbase + i (0 for
	 * zinf_adam_step_bf16state; index0 + the run's offset under a bf16 master) */
	uint64_t hbase;
	/* bf16 master (adam_bf16m_internal.h): the master is `master` (param unused), stepped in
	 * float by the path's bf16-master kernel with m and v as mv says (bf16, or floats: f32, or
	 * q8 decoded) and rounded back with mrounding, element i's random bits
	 * adam_sr_bits_master(mkey, hbase + i) (hbase: index0 + the run's offset) */
	uint16_t *master;
	enum zinf_moments mv;
	enum zinf_rounding mrounding;
	uint32_t mkey;
};

typedef void (*zinf_opt_kernel_fn)(const struct zinf_opt_args *a, size_t i0, size_t i1);

/* The optimizers, as indices of zinf_adam_ops.step[]. */
enum zinf_opt_kind {
	ZINF_OPT_ADAM,
	ZINF_OPT_ADAM_BF16STATE,
	ZINF_OPT_ADAGRAD,
	ZINF_OPT_LION,
	ZINF_OPT_ADAM_Q8STATE,
	ZINF_OPT_ADAM_BF16MASTER,
	ZINF_OPT_KINDS
};

/* One ISA's kernels. Each works on elements [i0, i1) of the arrays in the argument block. */
struct zinf_adam_ops {
	const char *name; /* "avx512" | "avx2" | "scalar": the values of opts.simd and ZINF_SIMD */
	/* NULL when this CPU runs the path; else what is missing, for the -ENODEV message ("this
	 * CPU lacks AVX2", or for a path not built "not built into this library ..."). */
	const char *(*missing)(const struct zinf_cpu_features *f);
	zinf_opt_kernel_fn step[ZINF_OPT_KINDS];
	double (*sumsq)(const void *g, enum zinf_dtype dt, size_t i0, size_t i1);
	bool (*has_inf_nan)(const void *g, enum zinf_dtype dt, size_t i0, size_t i1);
	/* The separate passes of the three-pass flow (benchmark comparison): g *= s in place, and
	 * dst = src converted to ck. */
	void (*scale)(void *g, enum zinf_dtype dt, float s, size_t i0, size_t i1);
	void (*convert)(const float *src, void *dst, enum zinf_copy_kind ck, size_t i0, size_t i1);
};

/*
 * The registry (adam_registry.c): every SIMD path, best first; a path that was not built is a
 * stub table (name and missing() only). Never registered from constructors.
 */
extern const struct zinf_adam_ops *const zinf_adam_registry[];
extern const unsigned zinf_adam_registry_len;
extern const struct zinf_adam_ops zinf_adam_scalar_ops;

/* This CPU's features, probed once per process (adam_registry.c). */
const struct zinf_cpu_features *adam_cpu_features(void);

/*
 * The kernel table for `simd` (NULL: $ZINF_SIMD as read once, else the best path here); the
 * rule is in zinf/blocks/adam.h. who: the caller, named in the message.
 * Returns 0; -EINVAL unknown name; -ENODEV the path is not built or this CPU cannot run it.
 */
int adam_select(const char *simd, const char *who, const struct zinf_adam_ops **out);

/* The exact scalar conversions (dt_f32_to_bf16_rne, ...) are in common/dtype.h. */

/*
 * Counter-based random bits for stochastic rounding: a function of (key, the element's 64-bit
 * index) only: the index's low word mixed with the key and its high word, then Wellons' lowbias32
 * (two multiplies: cheap in the vector paths, which compute the same bits, adam_simd_body.h
 * sr_bits). The bf16 state's and q8's streams, and the moments' beside a bf16 master.
 */
static inline uint32_t
adam_sr_lane(uint32_t key, uint64_t i)
{
	return (uint32_t)i ^ key ^ (uint32_t)(i >> 32) * 0x85ebca77u;
}

static inline uint32_t
adam_sr_bits(uint32_t key, uint64_t i)
{
	uint32_t h = adam_sr_lane(key, i);
	h ^= h >> 16;
	h *= 0x7feb352du;
	h ^= h >> 15;
	h *= 0x846ca68bu;
	h ^= h >> 16;
	return h;
}

/*
 * The bf16 master's random bits: the same index mixing with its own key (sr_key_master in
 * adam.c), then another hash of the same shape with other constants (Wellons' hash prospector's
 * [16 21f0aaad 15 d35a2d97 15]). A key enters as an xor of the index, so two streams of one
 * hash function are one stream read at indices i and i ^ (key difference): the master's bits used
 * to be the moments' (one hash, the key xored with a constant) for index i ^ 0x632be5ab. A
 * different function has no such relation to the moments' for any keys (tested:
 * master_and_moment_random_bits_are_unrelated).
 */
static inline uint32_t
adam_sr_bits_master(uint32_t key, uint64_t i)
{
	uint32_t h = adam_sr_lane(key, i);
	h ^= h >> 16;
	h *= 0x21f0aaadu;
	h ^= h >> 15;
	h *= 0xd35a2d97u;
	h ^= h >> 15;
	return h;
}

/*
 * The bf16 master's stochastic rounding of f with 16 random bits r: dt_f32_to_bf16_sr, except that
 * a finite f never becomes infinity: a finite |f| above the largest finite bf16 (0x7f7f,
 * 3.3895e38; the next step up is infinity) gives that value with f's sign, where rounding up
 * would overflow. Infinities stay, NaN is quieted. (Round to nearest even overflows only from
 * the midpoint 0x7f7f8000 up, as IEEE says; a rounding whose expected value is f has no finite
 * value to go to above 0x7f7f, so it saturates instead of turning a finite weight into inf.)
 */
static inline uint16_t
adam_bf16_sr_sat(float f, uint32_t r)
{
	uint32_t x = dt_f2u(f), ax = x & 0x7fffffffu;
	if (ax > 0x7f7f0000u && ax < 0x7f800000u) {
		return (uint16_t)(((x >> 16) & 0x8000u) | 0x7f7fu);
	}
	return dt_f32_to_bf16_sr(f, r);
}

static inline float
adam_load_grad(const void *g, enum zinf_dtype dt, size_t i)
{
	switch (dt) {
	case ZINF_F16:
		return dt_f16_to_f32(((const uint16_t *)g)[i]);
	case ZINF_BF16:
		return dt_bf16_to_f32(((const uint16_t *)g)[i]);
	default:
		return ((const float *)g)[i];
	}
}

static inline void
adam_store_copy(void *c, enum zinf_copy_kind ck, size_t i, float p)
{
	switch (ck) {
	case ZINF_COPY_F32:
		((float *)c)[i] = p;
		break;
	case ZINF_COPY_F16:
		((uint16_t *)c)[i] = dt_f32_to_f16_rne(p);
		break;
	case ZINF_COPY_BF16:
		((uint16_t *)c)[i] = dt_f32_to_bf16_rne(p);
		break;
	default:
		break;
	}
}

/* ---- the vector paths ----------------------------------------------------------------------- */

/* The vector paths' width layers (adam_avx2.c, adam_avx512.c) and the body they share
 * (adam_simd_body.h, with the tails through zero-padded buffers) force every helper inline: the
 * inner loops must not call out, and each helper must be specialised for its constant arguments
 * (grad dtype, copy kind). */
#define ZINF_ALWAYS_INLINE static inline __attribute__((always_inline))

/* ---- one element of each optimizer: the scalar path ----------------------------------------- */

static inline float
adam_grad_in(const struct zinf_opt_args *a, float p, size_t i)
{
	float g = adam_load_grad(a->grad, a->gdt, i) * a->grad_scale;
	if (a->l2) {
		g = g + a->wd * p;
	}
	return g;
}

/* Adam's update of one element from p and its gradient g: m and v in place, the new p returned.
 * The one sequence of operations of the scalar Adam kernels (f32 and bf16 state, bf16 master). */
static inline float
adam_update(const struct zinf_opt_args *a, float p, float g, float *m, float *v)
{
	p = p * a->decay;
	*m = a->b1 * *m + a->omb1 * g;
	*v = a->b2 * *v + a->omb2 * (g * g);
	float denom = sqrtf(*v) / a->bc2_sqrt + a->eps;
	return p + a->nstep * (*m / denom);
}

static inline void
adam_elem(const struct zinf_opt_args *a, size_t i)
{
	float *mp = a->m, *vp = a->v;
	float p = a->param[i];
	float g = adam_grad_in(a, p, i);
	float m = mp[i], v = vp[i];
	p = adam_update(a, p, g, &m, &v);
	mp[i] = m;
	vp[i] = v;
	a->param[i] = p;
	adam_store_copy(a->copy, a->ck, i, p);
}

/* The bf16 state's m and v of element i from their floats: RNE, or stochastic with one hash per
 * element of index hbase + i, its low half for m and its high half for v. */
static inline void
adam_bf16state_store(const struct zinf_opt_args *a, size_t i, float m, float v)
{
	uint16_t *mp = a->m, *vp = a->v;
	if (a->rounding == ZINF_ROUND_STOCHASTIC) {
		uint32_t r = adam_sr_bits(a->sr_key, a->hbase + i);
		mp[i] = dt_f32_to_bf16_sr(m, r & 0xffffu);
		vp[i] = dt_f32_to_bf16_sr(v, r >> 16);
	} else {
		mp[i] = dt_f32_to_bf16_rne(m);
		vp[i] = dt_f32_to_bf16_rne(v);
	}
}

static inline void
adam_bf16state_elem(const struct zinf_opt_args *a, size_t i)
{
	const uint16_t *mp = a->m, *vp = a->v;
	float p = a->param[i];
	float g = adam_grad_in(a, p, i);
	float m = dt_bf16_to_f32(mp[i]), v = dt_bf16_to_f32(vp[i]);
	p = adam_update(a, p, g, &m, &v);
	adam_bf16state_store(a, i, m, v);
	a->param[i] = p;
	adam_store_copy(a->copy, a->ck, i, p);
}

/* The bf16 master's rounding of its float update x, element index idx (hbase + i). */
static inline uint16_t
adam_bf16m_round(const struct zinf_opt_args *a, float x, uint64_t idx)
{
	return a->mrounding == ZINF_ROUND_STOCHASTIC
		       ? adam_bf16_sr_sat(x, adam_sr_bits_master(a->mkey, idx) & 0xffffu)
		       : dt_f32_to_bf16_rne(x);
}

/*
 * One element of a bf16-master step, in one pass (adam_bf16m_internal.h sets up the run): the
 * master widened, Adam's update with m and v as bf16 (mv ZINF_MOMENTS_BF16) or floats (f32
 * moments, or q8's decoded), the master rounded back; the copy: f16 from the float update, bf16
 * the new master, f32 it widened.
 */
static inline void
adam_bf16master_elem(const struct zinf_opt_args *a, size_t i)
{
	bool mvb = a->mv == ZINF_MOMENTS_BF16;
	float p = dt_bf16_to_f32(a->master[i]);
	float g = adam_grad_in(a, p, i);
	float m = mvb ? dt_bf16_to_f32(((const uint16_t *)a->m)[i]) : ((float *)a->m)[i];
	float v = mvb ? dt_bf16_to_f32(((const uint16_t *)a->v)[i]) : ((float *)a->v)[i];
	p = adam_update(a, p, g, &m, &v);
	if (mvb) {
		adam_bf16state_store(a, i, m, v);
	} else {
		((float *)a->m)[i] = m;
		((float *)a->v)[i] = v;
	}
	uint16_t w = adam_bf16m_round(a, p, a->hbase + i);
	a->master[i] = w;
	if (a->ck == ZINF_COPY_F16) {
		((uint16_t *)a->copy)[i] = dt_f32_to_f16_rne(p);
	} else if (a->ck == ZINF_COPY_BF16) {
		((uint16_t *)a->copy)[i] = w;
	} else if (a->ck == ZINF_COPY_F32) {
		((float *)a->copy)[i] = dt_bf16_to_f32(w);
	}
}

static inline void
adam_adagrad_elem(const struct zinf_opt_args *a, size_t i)
{
	float *hp = a->v;
	float p = a->param[i];
	float g = adam_grad_in(a, p, i);
	float h = hp[i] + g * g;
	float std = sqrtf(h) + a->eps;
	p = p + a->nstep * (g / std);
	hp[i] = h;
	a->param[i] = p;
	adam_store_copy(a->copy, a->ck, i, p);
}

static inline void
adam_lion_elem(const struct zinf_opt_args *a, size_t i)
{
	float *mp = a->m;
	float p = a->param[i] * a->decay;
	float g = adam_load_grad(a->grad, a->gdt, i) * a->grad_scale;
	float m = mp[i];
	float c = a->b1 * m + a->omb1 * g;
	float s = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : 0.0f);
	p = p + a->nstep * s;
	mp[i] = a->b2 * m + a->omb2 * g;
	a->param[i] = p;
	adam_store_copy(a->copy, a->ck, i, p);
}

static inline double
adam_sumsq_elem(const void *g, enum zinf_dtype dt, size_t i)
{
	double x = adam_load_grad(g, dt, i);
	return x * x;
}

static inline bool
adam_nonfinite_elem(const void *g, enum zinf_dtype dt, size_t i)
{
	switch (dt) {
	case ZINF_F16:
		return (((const uint16_t *)g)[i] & 0x7c00) == 0x7c00;
	case ZINF_BF16:
		return (((const uint16_t *)g)[i] & 0x7f80) == 0x7f80;
	default:
		return (dt_f2u(((const float *)g)[i]) & 0x7f800000u) == 0x7f800000u;
	}
}

/* Whether any of elements [i0, i1) is an infinity or a NaN, one at a time: the scalar path, and
 * the vector paths' last few elements. */
static inline bool
adam_nonfinite_range(const void *g, enum zinf_dtype dt, size_t i0, size_t i1)
{
	for (size_t i = i0; i < i1; i++) {
		if (adam_nonfinite_elem(g, dt, i)) {
			return true;
		}
	}
	return false;
}

#endif
