// SPDX-License-Identifier: Apache-2.0
/*
 * cpu_adam/adam.c: the public optimizer entry points. Validates arguments (nothing is modified
 * on error), computes each step's scalars once in float64, picks the kernel table for this CPU
 * (or ZINF_SIMD), and runs it over cache-sized tiles with an OpenMP static partition. The
 * arithmetic itself lives in the per-ISA files.
 */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "cpu_adam/adam_internal.h"

/* The registry, best first: the only place that knows which kernels were built. */
static const struct zinf_adam_ops *const adam_registry[] = {
#if ZINF_ADAM_HAVE_AVX512
	&zinf_adam_avx512_ops,
#endif
#if ZINF_ADAM_HAVE_AVX2
	&zinf_adam_avx2_ops,
#endif
	&zinf_adam_scalar_ops,
};

/* zinf_adam_select() that also says whether the CPU converts to bf16 in hardware. */
/*
 * cpuid traps to the hypervisor in a VM (about 50 us for the whole probe on the development VM,
 * more than a small step takes), so the features are read once per process. They cannot change
 * while it runs: this is a constant computed late, not mutable state.
 */
static struct zinf_cpu_features cpu_features;
static pthread_once_t cpu_features_once = PTHREAD_ONCE_INIT;

static void
cpu_features_probe(void)
{
	zinf_cpu_features_get(&cpu_features);
}

static int
select_ops(const struct zinf_adam_ops **out, bool *hw_bf16)
{
	pthread_once(&cpu_features_once, cpu_features_probe);
	const struct zinf_cpu_features f = cpu_features;
	*hw_bf16 = f.avx512bf16;
	const char *want = getenv("ZINF_SIMD");
	if (want && *want) {
		if (strcmp(want, "scalar") && strcmp(want, "avx2") && strcmp(want, "avx512")) {
			return ZINF_FAIL(-EINVAL, "ZINF_SIMD=%s: expected scalar, avx2 or avx512",
					 want);
		}
		for (size_t k = 0; k < ZINF_ARRAY_SIZE(adam_registry); k++) {
			if (strcmp(adam_registry[k]->name, want) == 0) {
				if (!adam_registry[k]->supported(&f)) {
					return ZINF_FAIL(-ENODEV,
							 "ZINF_SIMD=%s: this CPU cannot run it",
							 want);
				}
				*out = adam_registry[k];
				return 0;
			}
		}
		return ZINF_FAIL(-ENODEV, "ZINF_SIMD=%s: not built into this library", want);
	}
	for (size_t k = 0; k < ZINF_ARRAY_SIZE(adam_registry); k++) {
		if (adam_registry[k]->supported(&f)) {
			*out = adam_registry[k];
			return 0;
		}
	}
	*out = &zinf_adam_scalar_ops;
	return 0;
}

int
zinf_adam_select(const struct zinf_adam_ops **out)
{
	bool hw;
	return select_ops(out, &hw);
}

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
}

static int
adam_prepare(const char *fn, const struct zinf_adam_opts *o, int64_t step, float grad_scale,
	     const void *param, const void *grad, enum zinf_dtype gdt, const void *m, const void *v,
	     size_t n, void *copy, enum zinf_dtype cdt, struct zinf_opt_args *a)
{
	int r;
	if (!o) {
		return ZINF_FAIL(-EINVAL, "%s: NULL options", fn);
	}
	if (o->size < sizeof(struct zinf_adam_opts)) {
		return ZINF_FAIL(-EINVAL, "%s: opts.size %zu < %zu (call zinf_adam_opts_init)", fn,
				 o->size, sizeof(struct zinf_adam_opts));
	}
	if ((r = check_hyper(fn, "lr", o->lr, 0, INFINITY, true)) ||
	    (r = check_hyper(fn, "beta1", o->beta1, 0, 1, true)) ||
	    (r = check_hyper(fn, "beta2", o->beta2, 0, 1, true)) ||
	    (r = check_hyper(fn, "eps", o->eps, 0, INFINITY, true)) ||
	    (r = check_hyper(fn, "weight_decay", o->weight_decay, 0, INFINITY, true))) {
		return r;
	}
	r = check_common(fn, step, grad_scale, param, grad, gdt, m, v, n, copy, cdt, o->threads);
	if (r) {
		return r;
	}
	double lr = o->lr, wd = o->weight_decay, b1 = o->beta1, b2 = o->beta2;
	memset(a, 0, sizeof(*a));
	a->param = (float *)param;
	a->grad = grad;
	a->m = (void *)m;
	a->v = (void *)v;
	a->copy = copy;
	a->gdt = gdt;
	a->ck = copy_kind(copy, cdt);
	a->grad_scale = grad_scale;
	a->l2 = !o->adamw_mode && o->weight_decay != 0.0f;
	a->wd = o->weight_decay;
	a->decay = o->adamw_mode ? (float)(1.0 - lr * wd) : 1.0f;
	a->b1 = o->beta1;
	a->omb1 = (float)(1.0 - b1);
	a->b2 = o->beta2;
	a->omb2 = (float)(1.0 - b2);
	a->eps = o->eps;
	if (o->bias_correction) {
		double bc1 = 1.0 - pow(b1, (double)step);
		double bc2 = 1.0 - pow(b2, (double)step);
		a->nstep = (float)(-lr / bc1);
		a->bc2_sqrt = (float)sqrt(bc2);
		a->inv_bc2_sqrt = (float)(1.0 / sqrt(bc2));
	} else {
		a->nstep = -o->lr;
		a->bc2_sqrt = 1.0f;
		a->inv_bc2_sqrt = 1.0f;
	}
	return 0;
}

int
zinf_adam_step(const struct zinf_adam_opts *o, int64_t step, float grad_scale, float *param,
	       const void *grad, enum zinf_dtype grad_dtype, float *exp_avg, float *exp_avg_sq,
	       size_t n, void *param_copy, enum zinf_dtype copy_dtype)
{
	struct zinf_opt_args a;
	const struct zinf_adam_ops *ops;
	int r = adam_prepare(__func__, o, step, grad_scale, param, grad, grad_dtype, exp_avg,
			     exp_avg_sq, n, param_copy, copy_dtype, &a);
	if (r) {
		return r;
	}
	if ((r = select_ops(&ops, &a.hw_bf16))) {
		return r;
	}
	if (n) {
		run_tiles(ops->adam, &a, n, o->threads);
	}
	return 0;
}

/* A 32-bit hash key from (seed, step): splitmix64's finaliser. */
static uint32_t
sr_key(uint64_t seed, int64_t step)
{
	uint64_t z = seed + 0x9e3779b97f4a7c15ull * ((uint64_t)step + 1);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return (uint32_t)(z ^ (z >> 31));
}

int
zinf_adam_step_bf16state(const struct zinf_adam_opts *o, int64_t step, float grad_scale,
			 float *param, const void *grad, enum zinf_dtype grad_dtype,
			 uint16_t *exp_avg, uint16_t *exp_avg_sq, size_t n, void *param_copy,
			 enum zinf_dtype copy_dtype, enum zinf_rounding rounding, uint64_t seed)
{
	struct zinf_opt_args a;
	const struct zinf_adam_ops *ops;
	if (rounding != ZINF_ROUND_NEAREST_EVEN && rounding != ZINF_ROUND_STOCHASTIC) {
		return ZINF_FAIL(-EINVAL, "%s: unknown rounding %d", __func__, (int)rounding);
	}
	int r = adam_prepare(__func__, o, step, grad_scale, param, grad, grad_dtype, exp_avg,
			     exp_avg_sq, n, param_copy, copy_dtype, &a);
	if (r) {
		return r;
	}
	if ((r = select_ops(&ops, &a.hw_bf16))) {
		return r;
	}
	a.rounding = rounding;
	a.sr_key = sr_key(seed, step);
	if (n) {
		run_tiles(ops->adam_bf16state, &a, n, o->threads);
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
}

int
zinf_adagrad_step(const struct zinf_adagrad_opts *o, int64_t step, float grad_scale, float *param,
		  const void *grad, enum zinf_dtype grad_dtype, float *state_sum, size_t n,
		  void *param_copy, enum zinf_dtype copy_dtype)
{
	const char *fn = __func__;
	const struct zinf_adam_ops *ops;
	int r;
	if (!o) {
		return ZINF_FAIL(-EINVAL, "%s: NULL options", fn);
	}
	if (o->size < sizeof(struct zinf_adagrad_opts)) {
		return ZINF_FAIL(-EINVAL, "%s: opts.size %zu < %zu (call zinf_adagrad_opts_init)",
				 fn, o->size, sizeof(struct zinf_adagrad_opts));
	}
	if ((r = check_hyper(fn, "lr", o->lr, 0, INFINITY, true)) ||
	    (r = check_hyper(fn, "lr_decay", o->lr_decay, 0, INFINITY, true)) ||
	    (r = check_hyper(fn, "eps", o->eps, 0, INFINITY, true)) ||
	    (r = check_hyper(fn, "weight_decay", o->weight_decay, 0, INFINITY, true))) {
		return r;
	}
	r = check_common(fn, step, grad_scale, param, grad, grad_dtype, state_sum, state_sum, n,
			 param_copy, copy_dtype, o->threads);
	if (r) {
		return r;
	}
	bool hw_bf16;
	if ((r = select_ops(&ops, &hw_bf16))) {
		return r;
	}
	struct zinf_opt_args a = {
		.param = param,
		.grad = grad,
		.v = state_sum,
		.copy = param_copy,
		.gdt = grad_dtype,
		.ck = copy_kind(param_copy, copy_dtype),
		.l2 = o->weight_decay != 0.0f,
		.grad_scale = grad_scale,
		.wd = o->weight_decay,
		.decay = 1.0f,
		.eps = o->eps,
		.nstep = (float)(-(double)o->lr / (1.0 + (double)(step - 1) * o->lr_decay)),
		.bc2_sqrt = 1.0f,
		.inv_bc2_sqrt = 1.0f,
		.hw_bf16 = hw_bf16,
	};
	if (n) {
		run_tiles(ops->adagrad, &a, n, o->threads);
	}
	return 0;
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
}

int
zinf_lion_step(const struct zinf_lion_opts *o, int64_t step, float grad_scale, float *param,
	       const void *grad, enum zinf_dtype grad_dtype, float *exp_avg, size_t n,
	       void *param_copy, enum zinf_dtype copy_dtype)
{
	const char *fn = __func__;
	const struct zinf_adam_ops *ops;
	int r;
	if (!o) {
		return ZINF_FAIL(-EINVAL, "%s: NULL options", fn);
	}
	if (o->size < sizeof(struct zinf_lion_opts)) {
		return ZINF_FAIL(-EINVAL, "%s: opts.size %zu < %zu (call zinf_lion_opts_init)", fn,
				 o->size, sizeof(struct zinf_lion_opts));
	}
	if ((r = check_hyper(fn, "lr", o->lr, 0, INFINITY, true)) ||
	    (r = check_hyper(fn, "beta1", o->beta1, 0, 1, false)) ||
	    (r = check_hyper(fn, "beta2", o->beta2, 0, 1, false)) ||
	    (r = check_hyper(fn, "weight_decay", o->weight_decay, 0, INFINITY, true))) {
		return r;
	}
	r = check_common(fn, step, grad_scale, param, grad, grad_dtype, exp_avg, exp_avg, n,
			 param_copy, copy_dtype, o->threads);
	if (r) {
		return r;
	}
	bool hw_bf16;
	if ((r = select_ops(&ops, &hw_bf16))) {
		return r;
	}
	double lr = o->lr;
	struct zinf_opt_args a = {
		.param = param,
		.grad = grad,
		.m = exp_avg,
		.copy = param_copy,
		.gdt = grad_dtype,
		.ck = copy_kind(param_copy, copy_dtype),
		.grad_scale = grad_scale,
		.decay = (float)(1.0 - lr * o->weight_decay),
		.b1 = o->beta1,
		.omb1 = (float)(1.0 - (double)o->beta1),
		.b2 = o->beta2,
		.omb2 = (float)(1.0 - (double)o->beta2),
		.nstep = -o->lr,
		.bc2_sqrt = 1.0f,
		.inv_bc2_sqrt = 1.0f,
		.hw_bf16 = hw_bf16,
	};
	if (n) {
		run_tiles(ops->lion, &a, n, o->threads);
	}
	return 0;
}

/* ---- gradient helpers --------------------------------------------------------------------- */

static int
check_grad(const char *fn, const void *grad, enum zinf_dtype dt, size_t n, int threads)
{
	if (!dtype_ok(dt)) {
		return ZINF_FAIL(-EINVAL, "%s: unknown dtype %d", fn, (int)dt);
	}
	if (n > 0 && !grad) {
		return ZINF_FAIL(-EINVAL, "%s: NULL gradient with n = %zu", fn, n);
	}
	if (threads < 0) {
		return ZINF_FAIL(-EINVAL, "%s: threads %d < 0", fn, threads);
	}
	return 0;
}

/* Tiles of the helpers: bigger than the step's (one stream, nothing written). */
#define GRAD_TILE	(8 * ZINF_ADAM_TILE)
#define SUMSQ_MAX_TILES 4096

int
zinf_grad_sumsq(const void *grad, enum zinf_dtype dtype, size_t n, int threads, double *out)
{
	const struct zinf_adam_ops *ops;
	int r = check_grad(__func__, grad, dtype, n, threads);
	if (r) {
		return r;
	}
	if (!out) {
		return ZINF_FAIL(-EINVAL, "%s: NULL out", __func__);
	}
	if ((r = zinf_adam_select(&ops))) {
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
	int nt = thread_count(threads, ntiles);
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
zinf_grad_has_inf_nan(const void *grad, enum zinf_dtype dtype, size_t n, int threads)
{
	const struct zinf_adam_ops *ops;
	int r = check_grad(__func__, grad, dtype, n, threads);
	if (r) {
		return r;
	}
	if ((r = zinf_adam_select(&ops))) {
		return r;
	}
	size_t ntiles = ZINF_DIV_ROUND_UP(n, (size_t)GRAD_TILE);
	int nt = thread_count(threads, ntiles);
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
zinf_adam_unscale(void *grad, enum zinf_dtype dt, size_t n, float s, int threads)
{
	const struct zinf_adam_ops *ops;
	int r = check_grad(__func__, grad, dt, n, threads);
	if (r || (r = zinf_adam_select(&ops))) {
		return r;
	}
	size_t ntiles = ZINF_DIV_ROUND_UP(n, (size_t)ZINF_ADAM_TILE);
	int nt = thread_count(threads, ntiles);
#pragma omp parallel for schedule(static) num_threads(nt)
	for (size_t t = 0; t < ntiles; t++) {
		size_t i0 = t * ZINF_ADAM_TILE;
		ops->scale(grad, dt, s, i0, ZINF_MIN(n, i0 + ZINF_ADAM_TILE));
	}
	return 0;
}

int
zinf_adam_convert(const float *src, void *dst, enum zinf_dtype dt, size_t n, int threads)
{
	const struct zinf_adam_ops *ops;
	int r = check_grad(__func__, src, dt, n, threads);
	if (r || (r = zinf_adam_select(&ops))) {
		return r;
	}
	enum zinf_copy_kind ck = copy_kind(dst, dt);
	size_t ntiles = ZINF_DIV_ROUND_UP(n, (size_t)ZINF_ADAM_TILE);
	int nt = thread_count(threads, ntiles);
#pragma omp parallel for schedule(static) num_threads(nt)
	for (size_t t = 0; t < ntiles; t++) {
		size_t i0 = t * ZINF_ADAM_TILE;
		ops->convert(src, dst, ck, i0, ZINF_MIN(n, i0 + ZINF_ADAM_TILE));
	}
	return 0;
}
