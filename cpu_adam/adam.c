/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpu_adam/adam.c: the public optimizer entry points. Takes the caller's options into a local
 * copy (common/opts.h), validates arguments (nothing is modified on error), computes each step's
 * scalars once in float64 (Adam's also for the CUDA kernel: adam_scalars_get), asks
 * adam_registry.c for the SIMD path's kernel table, and runs it over cache-sized tiles with an
 * OpenMP static partition. The arithmetic itself lives in the per-ISA files.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "common/opts.h"
#include "common/util.h"
#include "cpu_adam/adam_bf16m_internal.h"
#include "cpu_adam/adam_internal.h"
#include "cpu_adam/adam_q8_internal.h"
#include "cpu_adam/adam_bench.h"
#include "cpu_adam/adam_scalars_internal.h"

/* No struct may end in tail padding (common/opts.h). */
ZINF_OPTS_NO_TAIL_PAD(struct zinf_adam_opts, simd);
ZINF_OPTS_NO_TAIL_PAD(struct zinf_adagrad_opts, simd);
ZINF_OPTS_NO_TAIL_PAD(struct zinf_lion_opts, simd);
ZINF_OPTS_NO_TAIL_PAD(struct zinf_grad_opts, reserved);
ZINF_OPTS_NO_TAIL_PAD(struct zinf_q8_opts, no_decay);
ZINF_OPTS_NO_TAIL_PAD(struct zinf_bf16master_opts, no_decay);
_Static_assert(ZINF_ADAM_TILE % ZINF_Q8_BLOCK == 0, "q8 blocks must not straddle tiles");

static int
thread_count(int threads, size_t ntiles)
{
	int nt = threads > 0 ? threads : omp_get_max_threads();
	if ((size_t)nt > ntiles) {
		nt = (int)ntiles;
	}
	return nt < 1 ? 1 : nt;
}

/*
 * Run fn over [0, n) in tiles of ZINF_ADAM_TILE elements, thread k taking the k-th contiguous
 * block of tiles (schedule(static)), so that pages stay with the threads that first touched them
 * when the caller keeps the thread count. Tile boundaries do not depend on the thread count.
 */
static void
run_tiles(zinf_opt_kernel_fn fn, const struct zinf_opt_args *a, size_t n, int threads)
{
	size_t ntiles = ZINF_DIV_ROUND_UP(n, (size_t)ZINF_ADAM_TILE);
	int nt = thread_count(threads, ntiles);
	if (nt == 1) {
		fn(a, 0, n);
		return;
	}
#pragma omp parallel for schedule(static) num_threads(nt)
	for (size_t t = 0; t < ntiles; t++) {
		size_t i0 = t * ZINF_ADAM_TILE;
		fn(a, i0, ZINF_MIN(n, i0 + ZINF_ADAM_TILE));
	}
}

static bool
dtype_ok(enum zinf_dtype dt)
{
	return dt == ZINF_F32 || dt == ZINF_F16 || dt == ZINF_BF16;
}

static enum zinf_copy_kind
copy_kind(const void *copy, enum zinf_dtype dt)
{
	if (!copy) {
		return ZINF_COPY_NONE;
	}
	return dt == ZINF_F32 ? ZINF_COPY_F32 : dt == ZINF_F16 ? ZINF_COPY_F16 : ZINF_COPY_BF16;
}

/* Checks shared by every step: step, grad_scale, arrays, dtypes, threads. */
static int
check_common(const char *fn, int64_t step, float grad_scale, const void *param, const void *grad,
	     enum zinf_dtype gdt, const void *s1, const void *s2, size_t n, const void *copy,
	     enum zinf_dtype cdt, int threads)
{
	if (step < 1) {
		return ZINF_FAIL(-EINVAL, "%s: step %lld < 1", fn, (long long)step);
	}
	if (!isfinite(grad_scale)) {
		return ZINF_FAIL(-EINVAL, "%s: grad_scale %g is not finite", fn, grad_scale);
	}
	if (!dtype_ok(gdt)) {
		return ZINF_FAIL(-EINVAL, "%s: unknown grad dtype %d", fn, (int)gdt);
	}
	if (copy && !dtype_ok(cdt)) {
		return ZINF_FAIL(-EINVAL, "%s: unknown copy dtype %d", fn, (int)cdt);
	}
	if (threads < 0) {
		return ZINF_FAIL(-EINVAL, "%s: threads %d < 0", fn, threads);
	}
	if (n > 0 && (!param || !grad || !s1 || !s2)) {
		return ZINF_FAIL(-EINVAL,
				 "%s: NULL array with n = %zu (param %p grad %p state %p %p)", fn,
				 n, param, grad, s1, s2);
	}
	return 0;
}

static int
check_hyper(const char *fn, const char *name, float x, float lo, float hi, bool hi_open)
{
	if (!isfinite(x) || x < lo || (hi_open ? x >= hi : x > hi)) {
		return ZINF_FAIL(-EINVAL, "%s: %s %g outside [%g, %g%c", fn, name, x, lo, hi,
				 hi_open ? ')' : ']');
	}
	return 0;
}

/*
 * Take the caller's options into *dst, which holds the defaults (common/opts.h's rule), so that
 * nothing the caller changes during the call is seen. Also -EINVAL for NULL unless null_ok (an
 * optimizer's hyper-parameters are never guessed), and for a size that ends inside the simd
 * pointer at simd_off: half a pointer would be copied over the default.
 */
static int
take_opts(const char *fn, void *dst, size_t size, const void *src, const char *type,
	  size_t simd_off, bool null_ok)
{
	if (!src) {
		return null_ok ? 0 : ZINF_FAIL(-EINVAL, "%s: NULL options", fn);
	}
	size_t n;
	memcpy(&n, src, sizeof(n));
	if (n > simd_off && n < simd_off + sizeof(const char *)) {
		return ZINF_FAIL(
			-EINVAL,
			"%s: struct %s: size %zu ends inside the field simd (bytes %zu..%zu)", fn,
			type, n, simd_off, simd_off + sizeof(const char *));
	}
	return zc_opts_take(dst, size, src, type);
}

/*
 * Run optimizer `kind` of the SIMD path `simd` over the n elements of *a, after every check
 * passed: choosing the path is the last check (an unknown or unavailable path modifies nothing).
 */
static int
run_step(const char *fn, const char *simd, enum zinf_opt_kind kind, struct zinf_opt_args *a,
	 size_t n, int threads)
{
	const struct zinf_adam_ops *ops;
	int r = adam_select(simd, fn, &ops);
	if (r) {
		return r;
	}
	a->hw_bf16 = adam_cpu_features()->avx512bf16;
	if (n) {
		run_tiles(ops->step[kind], a, n, threads);
	}
	return 0;
}

void
zinf_adam_opts_init(struct zinf_adam_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	o->lr = 1e-3f;
	o->beta1 = 0.9f;
	o->beta2 = 0.999f;
	o->eps = 1e-8f;
	o->weight_decay = 0.0f;
	o->adamw_mode = true;
	o->bias_correction = true;
	o->threads = 0;
	o->simd = NULL;
}

/*
 * Adam's step scalars (cpu_adam/adam_scalars_internal.h), for this file's kernels and for the
 * CUDA kernel's block (device/device.c): each computed in float64 and rounded to float once,
 * without FMA contraction (this module's -ffp-contract=off).
 */
void
adam_scalars_get(const struct zinf_adam_opts *o, int64_t step, struct zinf_adam_scalars *out)
{
	double lr = o->lr, wd = o->weight_decay, b1 = o->beta1, b2 = o->beta2;
	memset(out, 0, sizeof(*out));
	out->l2 = !o->adamw_mode && o->weight_decay != 0.0f;
	out->wd = o->weight_decay;
	out->decay = o->adamw_mode ? (float)(1.0 - lr * wd) : 1.0f;
	out->b1 = o->beta1;
	out->omb1 = (float)(1.0 - b1);
	out->b2 = o->beta2;
	out->omb2 = (float)(1.0 - b2);
	out->eps = o->eps;
	if (o->bias_correction) {
		double bc1 = 1.0 - pow(b1, (double)step);
		double bc2 = 1.0 - pow(b2, (double)step);
		out->nstep = (float)(-lr / bc1);
		out->bc2_sqrt = (float)sqrt(bc2);
		out->inv_bc2_sqrt = (float)(1.0 / sqrt(bc2));
	} else {
		out->nstep = -o->lr;
		out->bc2_sqrt = 1.0f;
		out->inv_bc2_sqrt = 1.0f;
	}
}

/* Take and check the Adam options and arguments into *o and the argument block *a. */
static int
adam_prepare(const char *fn, const struct zinf_adam_opts *opts, struct zinf_adam_opts *o,
	     int64_t step, float grad_scale, const void *param, const void *grad,
	     enum zinf_dtype gdt, const void *m, const void *v, size_t n, void *copy,
	     enum zinf_dtype cdt, struct zinf_opt_args *a)
{
	int r;
	zinf_adam_opts_init(o);
	if ((r = take_opts(fn, o, sizeof(*o), opts, "zinf_adam_opts",
			   offsetof(struct zinf_adam_opts, simd), false)) ||
	    (r = check_hyper(fn, "lr", o->lr, 0, INFINITY, true)) ||
	    (r = check_hyper(fn, "beta1", o->beta1, 0, 1, true)) ||
	    (r = check_hyper(fn, "beta2", o->beta2, 0, 1, true)) ||
	    (r = check_hyper(fn, "eps", o->eps, 0, INFINITY, true)) ||
	    (r = check_hyper(fn, "weight_decay", o->weight_decay, 0, INFINITY, true)) ||
	    (r = check_common(fn, step, grad_scale, param, grad, gdt, m, v, n, copy, cdt,
			      o->threads))) {
		return r;
	}
	struct zinf_adam_scalars sc;
	adam_scalars_get(o, step, &sc);
	memset(a, 0, sizeof(*a));
	a->param = (float *)param;
	a->grad = grad;
	a->m = (void *)m;
	a->v = (void *)v;
	a->copy = copy;
	a->gdt = gdt;
	a->ck = copy_kind(copy, cdt);
	a->grad_scale = grad_scale;
	a->l2 = sc.l2;
	a->wd = sc.wd;
	a->decay = sc.decay;
	a->b1 = sc.b1;
	a->omb1 = sc.omb1;
	a->b2 = sc.b2;
	a->omb2 = sc.omb2;
	a->eps = sc.eps;
	a->nstep = sc.nstep;
	a->bc2_sqrt = sc.bc2_sqrt;
	a->inv_bc2_sqrt = sc.inv_bc2_sqrt;
	return 0;
}

int
zinf_adam_step(const struct zinf_adam_opts *opts, int64_t step, float grad_scale, float *param,
	       const void *grad, enum zinf_dtype grad_dtype, float *exp_avg, float *exp_avg_sq,
	       size_t n, void *param_copy, enum zinf_dtype copy_dtype)
{
	struct zinf_adam_opts o;
	struct zinf_opt_args a;
	int r = adam_prepare(__func__, opts, &o, step, grad_scale, param, grad, grad_dtype, exp_avg,
			     exp_avg_sq, n, param_copy, copy_dtype, &a);
	return r ? r : run_step(__func__, o.simd, ZINF_OPT_ADAM, &a, n, o.threads);
}

/* splitmix64's finaliser */
static uint64_t
mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* A 32-bit hash key from (seed, step): splitmix64's finaliser (bf16 state, q8, and the moments
 * beside a bf16 master). */
static uint32_t
sr_key(uint64_t seed, int64_t step)
{
	return (uint32_t)mix64(seed + ZINF_Q8_STEP_SEED * ((uint64_t)step + 1));
}

/* The bf16 master's key (adam_sr_bits_master) from (seed, step): the same splitmix64 state as
 * sr_key's, mixed again with a constant of the master's stream. */
#define BF16M_STREAM 0x632be5ab5bd1e995ull
static uint32_t
sr_key_master(uint64_t seed, int64_t step)
{
	return (uint32_t)mix64(mix64(seed + ZINF_Q8_STEP_SEED * ((uint64_t)step + 1)) ^
			       BF16M_STREAM);
}

int
zinf_adam_step_bf16state(const struct zinf_adam_opts *opts, int64_t step, float grad_scale,
			 float *param, const void *grad, enum zinf_dtype grad_dtype,
			 uint16_t *exp_avg, uint16_t *exp_avg_sq, size_t n, void *param_copy,
			 enum zinf_dtype copy_dtype, enum zinf_rounding rounding, uint64_t seed)
{
	struct zinf_adam_opts o;
	struct zinf_opt_args a;
	if (rounding != ZINF_ROUND_NEAREST_EVEN && rounding != ZINF_ROUND_STOCHASTIC) {
		return ZINF_FAIL(-EINVAL, "%s: unknown rounding %d", __func__, (int)rounding);
	}
	int r = adam_prepare(__func__, opts, &o, step, grad_scale, param, grad, grad_dtype, exp_avg,
			     exp_avg_sq, n, param_copy, copy_dtype, &a);
	if (r) {
		return r;
	}
	a.rounding = rounding;
	a.sr_key = sr_key(seed, step);
	return run_step(__func__, o.simd, ZINF_OPT_ADAM_BF16STATE, &a, n, o.threads);
}

void
zinf_q8_opts_init(struct zinf_q8_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	o->rounding = ZINF_ROUND_NEAREST_EVEN;
}

/* Take the q8 options (NULL: defaults) into *o and check them; ranges too when check_nd. */
static int
q8_prepare(const char *fn, const struct zinf_q8_opts *q, struct zinf_q8_opts *o, bool check_nd)
{
	zinf_q8_opts_init(o);
	int r = q ? zc_opts_take(o, sizeof(*o), q, "zinf_q8_opts") : 0;
	if (r) {
		return r;
	}
	if (o->rounding != ZINF_ROUND_NEAREST_EVEN && o->rounding != ZINF_ROUND_STOCHASTIC) {
		return ZINF_FAIL(-EINVAL, "%s: unknown rounding %d", fn, (int)o->rounding);
	}
	if (!check_nd) {
		return 0;
	}
	if (o->n_no_decay > 0 && !o->no_decay) {
		return ZINF_FAIL(-EINVAL, "%s: q8 opts: NULL no_decay with n_no_decay %u", fn,
				 o->n_no_decay);
	}
	const uint64_t *nd = o->no_decay;
	for (uint32_t i = 0; i < o->n_no_decay; i++) {
		if (nd[2 * i] >= nd[2 * i + 1] || (i && nd[2 * i] < nd[2 * i - 1])) {
			return ZINF_FAIL(
				-EINVAL, "%s: q8 opts: no-decay range %u [%llu, %llu) is %s", fn, i,
				(unsigned long long)nd[2 * i], (unsigned long long)nd[2 * i + 1],
				nd[2 * i] >= nd[2 * i + 1]
					? "empty"
					: "not after the one before it (sorted, disjoint)");
		}
	}
	return 0;
}

int
zinf_adam_step_q8state(const struct zinf_adam_opts *opts, int64_t step, float grad_scale,
		       float *param, const void *grad, enum zinf_dtype grad_dtype, void *exp_avg,
		       void *exp_avg_sq, size_t n, void *param_copy, enum zinf_dtype copy_dtype,
		       const struct zinf_q8_opts *q)
{
	struct zinf_adam_opts o;
	struct zinf_q8_opts qo;
	struct zinf_opt_args a;
	int r = q8_prepare(__func__, q, &qo, true);
	if (r == 0) {
		r = adam_prepare(__func__, opts, &o, step, grad_scale, param, grad, grad_dtype,
				 exp_avg, exp_avg_sq, n, param_copy, copy_dtype, &a);
	}
	if (r) {
		return r;
	}
	a.rounding = qo.rounding;
	a.sr_key = sr_key(qo.seed, step);
	a.index0 = qo.index0;
	a.nd = qo.no_decay;
	a.n_nd = qo.n_no_decay;
	return run_step(__func__, o.simd, ZINF_OPT_ADAM_Q8STATE, &a, n, o.threads);
}

void
zinf_bf16master_opts_init(struct zinf_bf16master_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	o->moments = ZINF_MOMENTS_F32;
	o->rounding = ZINF_ROUND_STOCHASTIC;
	o->state_rounding = ZINF_ROUND_STOCHASTIC;
}

int
zinf_adam_step_bf16master(const struct zinf_adam_opts *opts, int64_t step, float grad_scale,
			  uint16_t *master, const void *grad, enum zinf_dtype grad_dtype,
			  void *exp_avg, void *exp_avg_sq, size_t n, void *param_copy,
			  enum zinf_dtype copy_dtype, const struct zinf_bf16master_opts *b)
{
	const char *fn = __func__;
	struct zinf_adam_opts o;
	struct zinf_bf16master_opts bo;
	struct zinf_q8_opts q, qo; /* the ranges' check, shared with the q8 step */
	struct zinf_opt_args a;
	zinf_bf16master_opts_init(&bo);
	int r = b ? zc_opts_take(&bo, sizeof(bo), b, "zinf_bf16master_opts") : 0;
	if (r) {
		return r;
	}
	if (bo.moments != ZINF_MOMENTS_F32 && bo.moments != ZINF_MOMENTS_BF16 &&
	    bo.moments != ZINF_MOMENTS_Q8) {
		return ZINF_FAIL(-EINVAL, "%s: unknown moments format %d", fn, (int)bo.moments);
	}
	if (bo.rounding != ZINF_ROUND_NEAREST_EVEN && bo.rounding != ZINF_ROUND_STOCHASTIC) {
		return ZINF_FAIL(-EINVAL, "%s: unknown master rounding %d", fn, (int)bo.rounding);
	}
	zinf_q8_opts_init(&q);
	q.rounding = bo.state_rounding;
	q.n_no_decay = bo.n_no_decay;
	q.no_decay = bo.no_decay;
	if ((r = q8_prepare(fn, &q, &qo, true)) ||
	    (r = adam_prepare(fn, opts, &o, step, grad_scale, master, grad, grad_dtype, exp_avg,
			      exp_avg_sq, n, param_copy, copy_dtype, &a))) {
		return r;
	}
	a.param = NULL;
	a.master = master;
	a.mv = bo.moments;
	a.mrounding = bo.rounding;
	a.rounding = bo.state_rounding;
	a.sr_key = sr_key(bo.seed, step);
	a.mkey = sr_key_master(bo.seed, step);
	a.index0 = bo.index0;
	a.hbase = bo.index0;
	a.nd = bo.no_decay;
	a.n_nd = bo.n_no_decay;
	return run_step(fn, o.simd, ZINF_OPT_ADAM_BF16MASTER, &a, n, o.threads);
}

int
zinf_q8_encode(const float *x, size_t n, enum zinf_q8_moment which, void *out,
	       const struct zinf_q8_opts *q)
{
	struct zinf_q8_opts qo;
	int r = q8_prepare(__func__, q, &qo, false);
	if (r) {
		return r;
	}
	if (n > 0 && (!x || !out)) {
		return ZINF_FAIL(-EINVAL, "%s: NULL %s with n = %zu", __func__,
				 x ? "output" : "input", n);
	}
	if (which != ZINF_Q8_EXP_AVG && which != ZINF_Q8_EXP_AVG_SQ) {
		return ZINF_FAIL(-EINVAL, "%s: unknown moment %d", __func__, (int)which);
	}
	/* the step's hash key has the step in it; the encoder's is the seed's (step 0): sr_key's
	 * sum makes step t of seed s the encoder's seed s + t * ZINF_Q8_STEP_SEED */
	uint32_t key = sr_key(qo.seed, 0);
	_Alignas(64) float b[ZINF_Q8_BLOCK];
	for (size_t b0 = 0; b0 < n; b0 += ZINF_Q8_BLOCK) {
		size_t k = ZINF_MIN(n - b0, (size_t)ZINF_Q8_BLOCK);
		memcpy(b, x + b0, k * sizeof(float));
		q8_encode_block(b, k, which == ZINF_Q8_EXP_AVG_SQ,
				(uint8_t *)out + zinf_q8_bytes(b0),
				qo.rounding == ZINF_ROUND_STOCHASTIC, key, qo.index0 + b0);
	}
	return 0;
}

int
zinf_q8_decode(const void *in, size_t n, enum zinf_q8_moment which, float *out)
{
	if (n > 0 && (!in || !out)) {
		return ZINF_FAIL(-EINVAL, "%s: NULL %s with n = %zu", __func__,
				 in ? "output" : "input", n);
	}
	if (which != ZINF_Q8_EXP_AVG && which != ZINF_Q8_EXP_AVG_SQ) {
		return ZINF_FAIL(-EINVAL, "%s: unknown moment %d", __func__, (int)which);
	}
	for (size_t b0 = 0; b0 < n; b0 += ZINF_Q8_BLOCK) {
		q8_decode_block((const uint8_t *)in + zinf_q8_bytes(b0),
				ZINF_MIN(n - b0, (size_t)ZINF_Q8_BLOCK),
				which == ZINF_Q8_EXP_AVG_SQ, out + b0);
	}
	return 0;
}

void
zinf_adagrad_opts_init(struct zinf_adagrad_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	o->lr = 1e-2f;
	o->lr_decay = 0.0f;
	o->eps = 1e-10f;
	o->weight_decay = 0.0f;
	o->threads = 0;
	o->simd = NULL;
}

int
zinf_adagrad_step(const struct zinf_adagrad_opts *opts, int64_t step, float grad_scale,
		  float *param, const void *grad, enum zinf_dtype grad_dtype, float *state_sum,
		  size_t n, void *param_copy, enum zinf_dtype copy_dtype)
{
	const char *fn = __func__;
	struct zinf_adagrad_opts o;
	int r;
	zinf_adagrad_opts_init(&o);
	if ((r = take_opts(fn, &o, sizeof(o), opts, "zinf_adagrad_opts",
			   offsetof(struct zinf_adagrad_opts, simd), false)) ||
	    (r = check_hyper(fn, "lr", o.lr, 0, INFINITY, true)) ||
	    (r = check_hyper(fn, "lr_decay", o.lr_decay, 0, INFINITY, true)) ||
	    (r = check_hyper(fn, "eps", o.eps, 0, INFINITY, true)) ||
	    (r = check_hyper(fn, "weight_decay", o.weight_decay, 0, INFINITY, true)) ||
	    (r = check_common(fn, step, grad_scale, param, grad, grad_dtype, state_sum, state_sum,
			      n, param_copy, copy_dtype, o.threads))) {
		return r;
	}
	struct zinf_opt_args a = {
		.param = param,
		.grad = grad,
		.v = state_sum,
		.copy = param_copy,
		.gdt = grad_dtype,
		.ck = copy_kind(param_copy, copy_dtype),
		.l2 = o.weight_decay != 0.0f,
		.grad_scale = grad_scale,
		.wd = o.weight_decay,
		.decay = 1.0f,
		.eps = o.eps,
		.nstep = (float)(-(double)o.lr / (1.0 + (double)(step - 1) * o.lr_decay)),
		.bc2_sqrt = 1.0f,
		.inv_bc2_sqrt = 1.0f,
	};
	return run_step(fn, o.simd, ZINF_OPT_ADAGRAD, &a, n, o.threads);
}

void
zinf_lion_opts_init(struct zinf_lion_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	o->lr = 1e-4f;
	o->beta1 = 0.9f;
	o->beta2 = 0.99f;
	o->weight_decay = 0.0f;
	o->threads = 0;
	o->simd = NULL;
}

int
zinf_lion_step(const struct zinf_lion_opts *opts, int64_t step, float grad_scale, float *param,
	       const void *grad, enum zinf_dtype grad_dtype, float *exp_avg, size_t n,
	       void *param_copy, enum zinf_dtype copy_dtype)
{
	const char *fn = __func__;
	struct zinf_lion_opts o;
	int r;
	zinf_lion_opts_init(&o);
	if ((r = take_opts(fn, &o, sizeof(o), opts, "zinf_lion_opts",
			   offsetof(struct zinf_lion_opts, simd), false)) ||
	    (r = check_hyper(fn, "lr", o.lr, 0, INFINITY, true)) ||
	    (r = check_hyper(fn, "beta1", o.beta1, 0, 1, false)) ||
	    (r = check_hyper(fn, "beta2", o.beta2, 0, 1, false)) ||
	    (r = check_hyper(fn, "weight_decay", o.weight_decay, 0, INFINITY, true)) ||
	    (r = check_common(fn, step, grad_scale, param, grad, grad_dtype, exp_avg, exp_avg, n,
			      param_copy, copy_dtype, o.threads))) {
		return r;
	}
	double lr = o.lr;
	struct zinf_opt_args a = {
		.param = param,
		.grad = grad,
		.m = exp_avg,
		.copy = param_copy,
		.gdt = grad_dtype,
		.ck = copy_kind(param_copy, copy_dtype),
		.grad_scale = grad_scale,
		.decay = (float)(1.0 - lr * o.weight_decay),
		.b1 = o.beta1,
		.omb1 = (float)(1.0 - (double)o.beta1),
		.b2 = o.beta2,
		.omb2 = (float)(1.0 - (double)o.beta2),
		.nstep = -o.lr,
		.bc2_sqrt = 1.0f,
		.inv_bc2_sqrt = 1.0f,
	};
	return run_step(fn, o.simd, ZINF_OPT_LION, &a, n, o.threads);
}

/* ---- gradient helpers --------------------------------------------------------------------- */

void
zinf_grad_opts_init(struct zinf_grad_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	o->simd = NULL;
	o->threads = 0;
}

/* Take the helper options (NULL: defaults) into *o, check the arguments, choose the path. */
static int
grad_prepare(const char *fn, const struct zinf_grad_opts *opts, struct zinf_grad_opts *o,
	     const void *grad, enum zinf_dtype dt, size_t n, const struct zinf_adam_ops **ops)
{
	zinf_grad_opts_init(o);
	int r = take_opts(fn, o, sizeof(*o), opts, "zinf_grad_opts",
			  offsetof(struct zinf_grad_opts, simd), true);
	if (r) {
		return r;
	}
	if (o->reserved) {
		return ZINF_FAIL(-EINVAL, "%s: opts.reserved %u: must be 0", fn, o->reserved);
	}
	if (!dtype_ok(dt)) {
		return ZINF_FAIL(-EINVAL, "%s: unknown dtype %d", fn, (int)dt);
	}
	if (n > 0 && !grad) {
		return ZINF_FAIL(-EINVAL, "%s: NULL gradient with n = %zu", fn, n);
	}
	if (o->threads < 0) {
		return ZINF_FAIL(-EINVAL, "%s: threads %d < 0", fn, o->threads);
	}
	return adam_select(o->simd, fn, ops);
}

/* Tiles of the helpers: bigger than the step's (one stream, nothing written). */
#define GRAD_TILE	(8 * ZINF_ADAM_TILE)
#define SUMSQ_MAX_TILES 4096

int
zinf_grad_sumsq(const void *grad, enum zinf_dtype dtype, size_t n,
		const struct zinf_grad_opts *opts, double *out)
{
	struct zinf_grad_opts o;
	const struct zinf_adam_ops *ops;
	if (!out) {
		return ZINF_FAIL(-EINVAL, "%s: NULL out", __func__);
	}
	int r = grad_prepare(__func__, opts, &o, grad, dtype, n, &ops);
	if (r) {
		return r;
	}
	/*
	 * Per-tile partial sums added in tile order: the association depends on n only, never on
	 * the thread count. Tiles grow with n so that the partials fit on the stack.
	 */
	double part[SUMSQ_MAX_TILES];
	size_t tile = ZINF_MAX((size_t)GRAD_TILE, ZINF_DIV_ROUND_UP(n, (size_t)SUMSQ_MAX_TILES));
	tile = ZINF_ALIGN_UP(tile, (size_t)64);
	size_t ntiles = ZINF_DIV_ROUND_UP(n, tile);
	int nt = thread_count(o.threads, ntiles);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
	for (size_t t = 0; t < ntiles; t++) {
		size_t i0 = t * tile;
		part[t] = ops->sumsq(grad, dtype, i0, ZINF_MIN(n, i0 + tile));
	}
	double s = 0;
	for (size_t t = 0; t < ntiles; t++) {
		s += part[t];
	}
	*out = s;
	return 0;
}

int
zinf_grad_has_inf_nan(const void *grad, enum zinf_dtype dtype, size_t n,
		      const struct zinf_grad_opts *opts)
{
	struct zinf_grad_opts o;
	const struct zinf_adam_ops *ops;
	int r = grad_prepare(__func__, opts, &o, grad, dtype, n, &ops);
	if (r) {
		return r;
	}
	size_t ntiles = ZINF_DIV_ROUND_UP(n, (size_t)GRAD_TILE);
	int nt = thread_count(o.threads, ntiles);
	int found = 0;
#pragma omp parallel for schedule(static) num_threads(nt)
	for (size_t t = 0; t < ntiles; t++) {
		int seen;
#pragma omp atomic read relaxed
		seen = found;
		if (seen) {
			continue; /* another tile already answered */
		}
		size_t i0 = t * GRAD_TILE;
		if (ops->has_inf_nan(grad, dtype, i0, ZINF_MIN(n, i0 + GRAD_TILE))) {
#pragma omp atomic write relaxed
			found = 1;
		}
	}
	return found;
}

/* ---- three-pass helpers (benchmark) ------------------------------------------------------- */

int
adam_unscale(void *grad, enum zinf_dtype dt, size_t n, float s, const struct zinf_grad_opts *opts)
{
	struct zinf_grad_opts o;
	const struct zinf_adam_ops *ops;
	int r = grad_prepare(__func__, opts, &o, grad, dt, n, &ops);
	if (r) {
		return r;
	}
	size_t ntiles = ZINF_DIV_ROUND_UP(n, (size_t)ZINF_ADAM_TILE);
	int nt = thread_count(o.threads, ntiles);
#pragma omp parallel for schedule(static) num_threads(nt)
	for (size_t t = 0; t < ntiles; t++) {
		size_t i0 = t * ZINF_ADAM_TILE;
		ops->scale(grad, dt, s, i0, ZINF_MIN(n, i0 + ZINF_ADAM_TILE));
	}
	return 0;
}

int
adam_convert(const float *src, void *dst, enum zinf_dtype dt, size_t n,
	     const struct zinf_grad_opts *opts)
{
	struct zinf_grad_opts o;
	const struct zinf_adam_ops *ops;
	if (n > 0 && !dst) {
		return ZINF_FAIL(-EINVAL, "%s: NULL destination with n = %zu", __func__, n);
	}
	int r = grad_prepare(__func__, opts, &o, src, dt, n, &ops);
	if (r) {
		return r;
	}
	enum zinf_copy_kind ck = copy_kind(dst, dt);
	size_t ntiles = ZINF_DIV_ROUND_UP(n, (size_t)ZINF_ADAM_TILE);
	int nt = thread_count(o.threads, ntiles);
#pragma omp parallel for schedule(static) num_threads(nt)
	for (size_t t = 0; t < ntiles; t++) {
		size_t i0 = t * ZINF_ADAM_TILE;
		ops->convert(src, dst, ck, i0, ZINF_MIN(n, i0 + ZINF_ADAM_TILE));
	}
	return 0;
}
