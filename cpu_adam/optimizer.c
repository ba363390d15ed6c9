/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpu_adam/optimizer.c: the optimizer descriptor of zinf/blocks/optimizer.h: a kind's state parts
 * (names, bytes per element) and one step function over a range of them, on top of the public
 * kernels of zinf/blocks/adam.h. No arithmetic of its own: the kernels validate the
 * hyper-parameters and do the work; this file only maps parts to their arguments.
 */
#include <inttypes.h>
#include <string.h>

#include "common/opts.h"
#include "common/util.h"
#include "zinf/blocks/optimizer.h"

ZINF_OPTS_NO_TAIL_PAD(struct zinf_optimizer_opts, simd);

struct optim_kind {
	const char *name;
	uint32_t nparts;
	const char *part[ZINF_OPTIM_MAX_PARTS];
};

/* Indexed by enum zinf_optim_kind. */
static const struct optim_kind kinds[] = {
	[ZINF_OPTIM_ADAM] = {"adam", 3, {"fp32", "exp_avg", "exp_avg_sq"}},
	[ZINF_OPTIM_ADAMW] = {"adamw", 3, {"fp32", "exp_avg", "exp_avg_sq"}},
	[ZINF_OPTIM_ADAGRAD] = {"adagrad", 2, {"fp32", "state_sum"}},
	[ZINF_OPTIM_LION] = {"lion", 2, {"fp32", "exp_avg"}},
};

struct zinf_optimizer {
	struct zinf_optimizer_opts o;
	const struct optim_kind *k;
	uint32_t bytes[ZINF_OPTIM_MAX_PARTS];
	/* the kernel's options, built once from o; the _nd ones with weight_decay 0 */
	struct zinf_adam_opts adam, adam_nd;
	struct zinf_adagrad_opts adagrad, adagrad_nd;
	struct zinf_lion_opts lion, lion_nd;
	/* zinf_optimizer_set_no_decay: n_nd ranges [nd[2i], nd[2i + 1]) of index0's space */
	uint64_t *nd;
	uint32_t n_nd;
};

void
zinf_optimizer_opts_init(struct zinf_optimizer_opts *o, enum zinf_optim_kind kind)
{
	if (!o) {
		return;
	}
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	o->kind = kind;
	o->state_dtype = ZINF_F32;
	o->master_dtype = ZINF_F32;
	o->rounding = ZINF_ROUND_STOCHASTIC;
	o->bias_correction = true;
	if (kind == ZINF_OPTIM_ADAGRAD) {
		struct zinf_adagrad_opts a;
		zinf_adagrad_opts_init(&a);
		o->lr = a.lr, o->lr_decay = a.lr_decay, o->eps = a.eps;
		o->weight_decay = a.weight_decay;
	} else if (kind == ZINF_OPTIM_LION) {
		struct zinf_lion_opts l;
		zinf_lion_opts_init(&l);
		o->lr = l.lr, o->beta1 = l.beta1, o->beta2 = l.beta2;
		o->weight_decay = l.weight_decay;
	} else {
		struct zinf_adam_opts a;
		zinf_adam_opts_init(&a);
		o->lr = a.lr, o->beta1 = a.beta1, o->beta2 = a.beta2, o->eps = a.eps;
		o->weight_decay = a.weight_decay;
		o->bias_correction = a.bias_correction;
	}
}

static int
check(const struct zinf_optimizer_opts *o)
{
	if ((unsigned)o->kind >= ZINF_ARRAY_SIZE(kinds)) {
		return ZINF_FAIL(-EINVAL, "optimizer: unknown kind %d", (int)o->kind);
	}
	const char *name = kinds[o->kind].name;
	bool adam = o->kind == ZINF_OPTIM_ADAM || o->kind == ZINF_OPTIM_ADAMW;
	if (o->state_dtype != ZINF_F32 && !(adam && o->state_dtype == ZINF_BF16)) {
		return ZINF_FAIL(-EINVAL, "optimizer %s: state_dtype %s is not supported (f32%s)",
				 name, zinf_dtype_name(o->state_dtype),
				 adam ? ", or bf16" : " only");
	}
	if (o->state_format != ZINF_STATE_PLAIN && o->state_format != ZINF_STATE_Q8) {
		return ZINF_FAIL(-EINVAL, "optimizer %s: unknown state_format %d", name,
				 (int)o->state_format);
	}
	if (o->state_format == ZINF_STATE_Q8 && (!adam || o->state_dtype != ZINF_F32)) {
		return ZINF_FAIL(-EINVAL,
				 "optimizer %s: state_format q8 is for Adam/AdamW with state_dtype "
				 "f32 (the master), not %s state_dtype %s",
				 name, name, zinf_dtype_name(o->state_dtype));
	}
	if (o->master_dtype != ZINF_F32 && !(adam && o->master_dtype == ZINF_BF16)) {
		return ZINF_FAIL(-EINVAL, "optimizer %s: master_dtype %s is not supported (f32%s)",
				 name, zinf_dtype_name((enum zinf_dtype)o->master_dtype),
				 adam ? ", or bf16" : " only");
	}
	if (o->rounding != ZINF_ROUND_STOCHASTIC && o->rounding != ZINF_ROUND_NEAREST_EVEN) {
		return ZINF_FAIL(-EINVAL, "optimizer %s: unknown rounding %d", name,
				 (int)o->rounding);
	}
	if (o->threads < 0) {
		return ZINF_FAIL(-EINVAL, "optimizer %s: threads %d < 0", name, o->threads);
	}
	for (size_t i = 0; i < sizeof(o->reserved); i++) {
		if (o->reserved[i]) {
			return ZINF_FAIL(-EINVAL, "optimizer %s: reserved[%zu] is not zero", name,
					 i);
		}
	}
	return 0;
}

/* The kernel's options from the descriptor's (each kernel checks its values at the step). */
static void
kernel_opts(struct zinf_optimizer *z)
{
	const struct zinf_optimizer_opts *o = &z->o;
	zinf_adam_opts_init(&z->adam);
	z->adam.lr = o->lr, z->adam.beta1 = o->beta1, z->adam.beta2 = o->beta2;
	z->adam.eps = o->eps, z->adam.weight_decay = o->weight_decay;
	z->adam.adamw_mode = o->kind == ZINF_OPTIM_ADAMW;
	z->adam.bias_correction = o->bias_correction;
	z->adam.threads = o->threads;
	z->adam.simd = o->simd;
	zinf_adagrad_opts_init(&z->adagrad);
	z->adagrad.lr = o->lr, z->adagrad.lr_decay = o->lr_decay, z->adagrad.eps = o->eps;
	z->adagrad.weight_decay = o->weight_decay;
	z->adagrad.threads = o->threads;
	z->adagrad.simd = o->simd;
	zinf_lion_opts_init(&z->lion);
	z->lion.lr = o->lr, z->lion.beta1 = o->beta1, z->lion.beta2 = o->beta2;
	z->lion.weight_decay = o->weight_decay;
	z->lion.threads = o->threads;
	z->lion.simd = o->simd;
	z->adam_nd = z->adam;
	z->adam_nd.weight_decay = 0;
	z->adagrad_nd = z->adagrad;
	z->adagrad_nd.weight_decay = 0;
	z->lion_nd = z->lion;
	z->lion_nd.weight_decay = 0;
}

/* The learning rate of the following steps (the kernels' options are rebuilt). */
int
zinf_optimizer_set_lr(struct zinf_optimizer *opt, float lr)
{
	if (!opt) {
		return ZINF_FAIL(-EINVAL, "optimizer: set_lr with a NULL optimizer");
	}
	if (!(lr >= 0) || lr > 3.4e38f) {
		return ZINF_FAIL(-EINVAL, "optimizer %s: lr %g is not a finite value >= 0",
				 opt->k->name, (double)lr);
	}
	opt->o.lr = lr;
	kernel_opts(opt);
	return 0;
}

/* The betas of the following steps (the kernels' options are rebuilt). */
int
zinf_optimizer_set_betas(struct zinf_optimizer *opt, float beta1, float beta2)
{
	if (!opt) {
		return ZINF_FAIL(-EINVAL, "optimizer: set_betas with a NULL optimizer");
	}
	if (opt->o.kind == ZINF_OPTIM_ADAGRAD) {
		return -EOPNOTSUPP;
	}
	if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1)) {
		return ZINF_FAIL(-EINVAL, "optimizer %s: betas (%g, %g) outside [0, 1)",
				 opt->k->name, (double)beta1, (double)beta2);
	}
	opt->o.beta1 = beta1;
	opt->o.beta2 = beta2;
	kernel_opts(opt);
	return 0;
}

int
zinf_optimizer_create(const struct zinf_optimizer_opts *opts, struct zinf_optimizer **out)
{
	if (!out) {
		return ZINF_FAIL(-EINVAL, "optimizer: NULL output");
	}
	struct zinf_optimizer_opts o;
	zinf_optimizer_opts_init(&o, ZINF_OPTIM_ADAMW);
	int rc = zc_opts_take(&o, sizeof(o), opts, "zinf_optimizer_opts");
	if (rc == 0) {
		rc = check(&o);
	}
	if (rc == 0) {
		/* A constant name from the registry: nothing of the caller's is kept. */
		rc = zinf_simd_resolve(o.simd, &o.simd);
	}
	if (rc) {
		return rc;
	}
	struct zinf_optimizer *z = zc_calloc(1, sizeof(*z));
	if (!z) {
		return ZINF_FAIL(-ENOMEM, "optimizer %s: out of memory", kinds[o.kind].name);
	}
	z->o = o;
	z->k = &kinds[o.kind];
	for (uint32_t i = 0; i < z->k->nparts; i++) {
		z->bytes[i] = i == 0 ? (uint32_t)zinf_dtype_size(o.master_dtype)
			      : o.state_format == ZINF_STATE_Q8
				      ? 1
				      : (uint32_t)zinf_dtype_size(o.state_dtype);
	}
	kernel_opts(z);
	*out = z;
	return 0;
}

void
zinf_optimizer_destroy(struct zinf_optimizer *opt)
{
	if (opt) {
		zc_free(opt->nd);
	}
	zc_free(opt);
}

int
zinf_optimizer_set_no_decay(struct zinf_optimizer *opt, const uint64_t *ranges, uint32_t n)
{
	if (!opt || (!ranges && n > 0)) {
		return ZINF_FAIL(-EINVAL, "optimizer: set_no_decay with a NULL %s",
				 opt ? "ranges array" : "optimizer");
	}
	for (uint32_t i = 0; i < n; i++) {
		if (ranges[2 * i] >= ranges[2 * i + 1] ||
		    (i && ranges[2 * i] < ranges[2 * i - 1])) {
			return ZINF_FAIL(
				-EINVAL,
				"optimizer %s: no-decay range %u [%" PRIu64 ", %" PRIu64 ") is %s",
				opt->k->name, i, ranges[2 * i], ranges[2 * i + 1],
				ranges[2 * i] >= ranges[2 * i + 1]
					? "empty"
					: "not after the one before it (sorted, disjoint)");
		}
	}
	uint64_t *nd = NULL;
	if (n > 0 && !(nd = zc_calloc(2 * (size_t)n, sizeof(uint64_t)))) {
		return ZINF_FAIL(-ENOMEM, "optimizer %s: out of memory for %u no-decay ranges",
				 opt->k->name, n);
	}
	if (n > 0) {
		memcpy(nd, ranges, 2 * (size_t)n * sizeof(uint64_t));
	}
	zc_free(opt->nd);
	opt->nd = nd;
	opt->n_nd = n;
	return 0;
}

size_t
zinf_optimizer_decay_run(const struct zinf_optimizer *opt, uint64_t index0, size_t n, bool *decays)
{
	*decays = true;
	if (!opt || opt->n_nd == 0 || n == 0 || opt->o.weight_decay == 0) {
		return n; /* nothing to split (a weight decay of 0 is no decay either way) */
	}
	/* the first range that ends after index0 */
	uint32_t lo = 0, hi = opt->n_nd;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (opt->nd[2 * mid + 1] <= index0) {
			lo = mid + 1;
		} else {
			hi = mid;
		}
	}
	if (lo == opt->n_nd) {
		return n;
	}
	uint64_t start = opt->nd[2 * lo], end = opt->nd[2 * lo + 1];
	if (start <= index0) {
		*decays = false;
		return (size_t)ZINF_MIN((uint64_t)n, end - index0);
	}
	return (size_t)ZINF_MIN((uint64_t)n, start - index0);
}

const char *
zinf_optimizer_name(const struct zinf_optimizer *opt)
{
	return opt ? opt->k->name : "?";
}

uint32_t
zinf_optimizer_part_count(const struct zinf_optimizer *opt)
{
	return opt ? opt->k->nparts : 0;
}

const char *
zinf_optimizer_part_name(const struct zinf_optimizer *opt, uint32_t i)
{
	return opt && i < opt->k->nparts ? opt->k->part[i] : NULL;
}

uint32_t
zinf_optimizer_part_bytes(const struct zinf_optimizer *opt, uint32_t i)
{
	return opt && i < opt->k->nparts ? opt->bytes[i] : 0;
}

enum zinf_dtype
zinf_optimizer_part_dtype(const struct zinf_optimizer *opt, uint32_t i)
{
	return zinf_optimizer_part_bytes(opt, i) == 2 ? ZINF_BF16 : ZINF_F32;
}

uint32_t
zinf_optimizer_state_bytes(const struct zinf_optimizer *opt)
{
	uint32_t b = 0;
	for (uint32_t i = 0; i < zinf_optimizer_part_count(opt); i++) {
		b += opt->bytes[i];
	}
	return b;
}

static bool
part_q8(const struct zinf_optimizer *opt, uint32_t i)
{
	return opt->o.state_format == ZINF_STATE_Q8 && i > 0;
}

uint64_t
zinf_optimizer_part_size(const struct zinf_optimizer *opt, uint32_t i, uint64_t n)
{
	if (!opt || i >= opt->k->nparts) {
		return 0;
	}
	return part_q8(opt, i) ? zinf_q8_bytes(n) : n * opt->bytes[i];
}

uint32_t
zinf_optimizer_part_align(const struct zinf_optimizer *opt, uint32_t i)
{
	if (!opt || i >= opt->k->nparts) {
		return 0;
	}
	return part_q8(opt, i) ? ZINF_Q8_BLOCK : 1;
}

uint64_t
zinf_optimizer_state_size(const struct zinf_optimizer *opt, uint64_t n)
{
	uint64_t b = 0;
	for (uint32_t i = 0; i < zinf_optimizer_part_count(opt); i++) {
		b += zinf_optimizer_part_size(opt, i, n);
	}
	return b;
}

enum zinf_state_format
zinf_optimizer_state_format(const struct zinf_optimizer *opt)
{
	return opt ? (enum zinf_state_format)opt->o.state_format : ZINF_STATE_PLAIN;
}

/* splitmix64's finaliser: the per-call seed of stochastic rounding from the range's start. */
static uint64_t
mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* One kernel call over n elements that all decay (decays) or none. */
static int
step_run(const struct zinf_optimizer *opt, bool decays, int64_t step, float grad_scale,
	 void *const parts[], const void *grad, enum zinf_dtype grad_dtype, uint64_t index0,
	 size_t n, void *copy, enum zinf_dtype copy_dtype)
{
	float *p = parts[0];
	switch (opt->o.kind) {
	case ZINF_OPTIM_ADAGRAD:
		return zinf_adagrad_step(decays ? &opt->adagrad : &opt->adagrad_nd, step,
					 grad_scale, p, grad, grad_dtype, parts[1], n, copy,
					 copy_dtype);
	case ZINF_OPTIM_LION:
		return zinf_lion_step(decays ? &opt->lion : &opt->lion_nd, step, grad_scale, p,
				      grad, grad_dtype, parts[1], n, copy, copy_dtype);
	default:
		break;
	}
	const struct zinf_adam_opts *a = decays ? &opt->adam : &opt->adam_nd;
	if (opt->o.state_dtype == ZINF_BF16) {
		return zinf_adam_step_bf16state(a, step, grad_scale, p, grad, grad_dtype, parts[1],
						parts[2], n, copy, copy_dtype, opt->o.rounding,
						opt->o.seed ^ mix64(index0));
	}
	return zinf_adam_step(a, step, grad_scale, p, grad, grad_dtype, parts[1], parts[2], n, copy,
			      copy_dtype);
}

int
zinf_optimizer_step(const struct zinf_optimizer *opt, int64_t step, float grad_scale,
		    void *const parts[], const void *grad, enum zinf_dtype grad_dtype,
		    uint64_t index0, size_t n, void *copy, enum zinf_dtype copy_dtype)
{
	if (!opt || !parts) {
		return ZINF_FAIL(-EINVAL, "optimizer %s: step with a NULL %s",
				 zinf_optimizer_name(opt), opt ? "parts array" : "optimizer");
	}
	for (uint32_t i = 0; i < opt->k->nparts && n > 0; i++) {
		if (!parts[i]) {
			return ZINF_FAIL(-EINVAL,
					 "optimizer %s: part %u (%s) is NULL for %zu elements "
					 "at %" PRIu64,
					 opt->k->name, i, opt->k->part[i], n, index0);
		}
	}
	if (opt->o.master_dtype == ZINF_BF16) {
		/* one call: the kernel splits each block by weight decay and hashes the index */
		struct zinf_bf16master_opts b;
		zinf_bf16master_opts_init(&b);
		b.moments = opt->o.state_format == ZINF_STATE_Q8 ? ZINF_MOMENTS_Q8
			    : opt->o.state_dtype == ZINF_BF16	 ? ZINF_MOMENTS_BF16
								 : ZINF_MOMENTS_F32;
		b.state_rounding = opt->o.rounding; /* bf16 and q8 moments alike: stochastic by
						       default (cpu_adam/README.md) */
		b.seed = opt->o.seed;
		b.index0 = index0;
		b.no_decay = opt->nd;
		b.n_no_decay = opt->n_nd;
		return zinf_adam_step_bf16master(&opt->adam, step, grad_scale, parts[0], grad,
						 grad_dtype, parts[1], parts[2], n, copy,
						 copy_dtype, &b);
	}
	if (opt->o.state_format == ZINF_STATE_Q8) {
		/* one call: the kernel splits each block by weight decay and encodes it once */
		struct zinf_q8_opts q;
		zinf_q8_opts_init(&q);
		q.rounding = opt->o.rounding; /* stochastic by default: cpu_adam/README.md */
		q.seed = opt->o.seed;
		q.index0 = index0;
		q.no_decay = opt->nd;
		q.n_no_decay = opt->n_nd;
		return zinf_adam_step_q8state(&opt->adam, step, grad_scale, parts[0], grad,
					      grad_dtype, parts[1], parts[2], n, copy, copy_dtype,
					      &q);
	}
	bool decays;
	size_t run = zinf_optimizer_decay_run(opt, index0, n, &decays);
	if (run == n) { /* one kernel call, as without no-decay ranges */
		return step_run(opt, decays, step, grad_scale, parts, grad, grad_dtype, index0, n,
				copy, copy_dtype);
	}
	/* runs of elements alike: the pointers advance by each array's element size */
	size_t gsz = zinf_dtype_size(grad_dtype), csz = zinf_dtype_size(copy_dtype);
	int rc = 0;
	for (size_t done = 0; !rc && done < n; done += run) {
		run = zinf_optimizer_decay_run(opt, index0 + done, n - done, &decays);
		void *p[ZINF_OPTIM_MAX_PARTS] = {NULL};
		for (uint32_t i = 0; i < opt->k->nparts; i++) {
			p[i] = (char *)parts[i] + done * opt->bytes[i];
		}
		rc = step_run(opt, decays, step, grad_scale, p, (const char *)grad + done * gsz,
			      grad_dtype, index0 + done, run,
			      copy ? (char *)copy + done * csz : NULL, copy_dtype);
	}
	return rc;
}
