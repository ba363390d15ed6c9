/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/offload/test_step.c: the pipelined optimizer step. With state on NVMe (real files
 * through the I/O engine and swap files) it must give every optimizer part and the 16-bit copy
 * bit for bit equal to the same optimizer in memory (zinf_optimizer_step): for every optimizer
 * whose elements do not depend on the cuts (Adam, AdamW, bf16-state Adam with RNE, Adagrad,
 * Lion) ONE call over the whole array per step; for bf16 state with stochastic rounding the
 * same cuts as the step (sub-groups, ZINF_STEP_CHUNK pieces, index0 = the piece's start), as
 * zinf/blocks/offload.h documents. Over several steps, for any sub-group size (not a multiple of
 * the alignment; n not a multiple of it), any buffer count from the minimum (1) up, both schedules,
 * in-order, reverse and shuffled readiness, and the CPU tier through the same calls. Bytes moved
 * per step equal the parts' bytes exactly. Injected read and write errors fail the step with the
 * sub-group, one tensor and the file named, without leaking buffers or reporting unwritten state
 * as written. Budget errors: buffers too small. The parts' names, sizes and swap ids through
 * the public API. NULL handles, the options and statistics size rule.
 *
 * No Criterion `.timeout` here (ctest's TIMEOUT catches a hang): with --jobs=2 the runner's
 * timeout watchdog (BoxFort, timeout-posix.c) can leave a cancelled 48-byte request unfreed at
 * exit, and LSan (detect_leaks=1 in CI) then fails the binary although every test passed.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/test_util.h"
#include "common/util.h"
#include "offload/swap_rig.h"
#include "zinf/blocks/offload.h"

/* The optimizers under test. */
enum {
	OPT_ADAMW = 0,
	OPT_ADAM,
	OPT_ADAM_BF16_RNE,
	OPT_ADAMW_BF16_SR,
	OPT_ADAGRAD,
	OPT_LION,
	OPT_ADAMW_Q8,	      /* 8-bit blockwise m and v */
	OPT_ADAMW_BF16M,      /* a bf16 master, fp32 m and v */
	OPT_ADAMW_BF16M_BF16, /* a bf16 master, bf16 m and v (stochastic rounding) */
};

static struct zinf_optimizer *
make_opt(int which)
{
	static const enum zinf_optim_kind kind[] = {
		ZINF_OPTIM_ADAMW, ZINF_OPTIM_ADAM,    ZINF_OPTIM_ADAM,
		ZINF_OPTIM_ADAMW, ZINF_OPTIM_ADAGRAD, ZINF_OPTIM_LION,
		ZINF_OPTIM_ADAMW, ZINF_OPTIM_ADAMW,   ZINF_OPTIM_ADAMW,
	};
	struct zinf_optimizer_opts o;
	zinf_optimizer_opts_init(&o, kind[which]);
	o.weight_decay = 0.01f;
	o.lr = which == OPT_LION ? 1e-3f : 1e-2f;
	if (which == OPT_ADAM_BF16_RNE || which == OPT_ADAMW_BF16_SR) {
		o.state_dtype = ZINF_BF16;
		o.rounding = which == OPT_ADAM_BF16_RNE ? ZINF_ROUND_NEAREST_EVEN
							: ZINF_ROUND_STOCHASTIC;
		o.seed = 0x5eed;
	}
	if (which == OPT_ADAGRAD) {
		o.lr_decay = 0.01f;
	}
	if (which == OPT_ADAMW_Q8) {
		o.state_format = ZINF_STATE_Q8;
	}
	if (which == OPT_ADAMW_BF16M || which == OPT_ADAMW_BF16M_BF16) {
		o.master_dtype = ZINF_BF16;
		o.state_dtype = which == OPT_ADAMW_BF16M_BF16 ? ZINF_BF16 : ZINF_F32;
		o.seed = 0x5eed;
	}
	struct zinf_optimizer *z = NULL;
	cr_assert_eq(zinf_optimizer_create(&o, &z), 0, "%s", zinf_last_error());
	return z;
}

struct rig {
	char *dir;
	struct zinf_io *io;
	struct zinf_swap *swap;
	struct zinf_pool *pool;
	struct zinf_step *st;
	struct zinf_optimizer *opt;
};

/* I/O and a swap space on a fresh scratch directory; skips without an I/O backend. */
static void
rig_open_swap(struct rig *r, bool fault)
{
	zt_log_to_stderr();
	memset(r, 0, sizeof(*r));
	/* blocks of 16 KiB: several per tensor, so that faults land mid-tensor */
	swap_rig_open(16384, fault, &r->dir, &r->io, &r->swap);
}

/* I/O, swap space, pool (buffers of one sub-group each), optimizer `which`, step. */
static void
rig_init_opt(struct rig *r, struct zinf_step_opts *so, uint32_t buffers, bool fault, int which)
{
	rig_open_swap(r, fault);
	r->opt = make_opt(which);
	so->optimizer = r->opt;
	so->swap = r->swap;
	if (so->param_swap) {
		so->param_swap = r->swap;
	}
	if (so->tier == ZINF_TIER_NVME || so->param_swap || so->copy_fn) {
		/* CPU tier with param_swap or copy_fn: buffers for the copy, the state in the CPU
		 * region. */
		struct zinf_pool_opts po;
		zinf_pool_opts_init(&po);
		po.buffer_count = buffers;
		po.buffer_bytes = zinf_step_buffer_bytes(so, zinf_swap_align(r->swap));
		if (so->tier == ZINF_TIER_CPU) {
			po.cpu_bytes = 3 * ZINF_ALIGN_UP(so->n * 4, 4096);
		}
		po.io = r->io;
		cr_assert_eq(zinf_pool_create(&po, &r->pool), 0, "%s", zinf_last_error());
		so->pool = r->pool;
	}
	cr_assert_eq(zinf_step_create(so, &r->st), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_swap_reserve(r->swap), 0, "%s", zinf_last_error());
}

static void
rig_init(struct rig *r, struct zinf_step_opts *so, uint32_t buffers, bool fault)
{
	rig_init_opt(r, so, buffers, fault, OPT_ADAMW);
}

static void
rig_fini(struct rig *r)
{
	if (r->pool) {
		cr_assert_eq(zinf_pool_free_count(r->pool), zinf_pool_buffer_count(r->pool),
			     "a buffer leaked");
	}
	zinf_step_destroy(r->st);
	zinf_optimizer_destroy(r->opt);
	zinf_pool_destroy(r->pool);
	zinf_swap_destroy(r->swap);
	zinf_io_destroy(r->io);
	zt_rmtree(r->dir);
	free(r->dir);
}

/* The reference: the same state in memory, one array per optimizer part. */
struct ref {
	size_t n;
	const struct zinf_optimizer *opt;
	uint32_t np;
	void *part[ZINF_OPTIM_MAX_PARTS];
	void *grad;
	uint16_t *copy;
};

static void
ref_init(struct ref *f, const struct zinf_optimizer *opt, size_t n, uint64_t *seed)
{
	f->n = n;
	f->opt = opt;
	f->np = zinf_optimizer_part_count(opt);
	float *tmp = malloc(n * 4);
	for (uint32_t p = 0; p < f->np; p++) {
		/* master in [-1, 1]; exp_avg signed; exp_avg_sq, state_sum >= 0 */
		const char *name = zinf_optimizer_part_name(opt, p);
		double lo = p == 0 ? -1 : strcmp(name, "exp_avg") == 0 ? -0.01 : 0;
		double hi = p == 0 ? 1 : lo < 0 ? 0.01 : 1e-4;
		for (size_t i = 0; i < n; i++) {
			tmp[i] = (float)zt_uniform(seed, lo, hi);
		}
		uint32_t esz = zinf_optimizer_part_bytes(opt, p);
		f->part[p] = malloc(n * esz);
		cr_assert_eq(zinf_dtype_convert(f->part[p], esz == 2 ? ZINF_BF16 : ZINF_F32, tmp,
						ZINF_F32, n),
			     0);
	}
	free(tmp);
	f->grad = malloc(n * 4);
	f->copy = malloc(n * 2);
}

static void
ref_fini(struct ref *f)
{
	for (uint32_t p = 0; p < f->np; p++) {
		free(f->part[p]);
	}
	free(f->grad);
	free(f->copy);
}

static void
fill_grad(struct ref *f, enum zinf_dtype dt, uint64_t *seed)
{
	for (size_t i = 0; i < f->n; i++) {
		float g = (float)zt_uniform(seed, -2, 2);
		if (dt == ZINF_F32) {
			((float *)f->grad)[i] = g;
		} else {
			uint32_t u;
			memcpy(&u, &g, 4);
			/* any 16-bit pattern that is a finite number of the dtype */
			uint16_t h = dt == ZINF_BF16
					     ? (uint16_t)(u >> 16)
					     : (uint16_t)(0x3800 ^ (zt_rand(seed) & 0x83ff));
			((uint16_t *)f->grad)[i] = h;
		}
	}
}

/* Part pointers of the reference at element i. */
static void
ref_parts_at(const struct ref *f, size_t i, void *out[])
{
	for (uint32_t p = 0; p < f->np; p++) {
		out[p] = (char *)f->part[p] + i * zinf_optimizer_part_bytes(f->opt, p);
	}
}

/*
 * One step of the reference in memory. cut false: one call over the whole array (an element's
 * result depends on nothing else); cut true: the step's cuts, sub-groups of st in
 * ZINF_STEP_CHUNK pieces with index0 their start (bf16 stochastic rounding).
 */
static void
ref_step(const struct zinf_step *st, struct ref *f, int64_t t, float scale, enum zinf_dtype gdt,
	 void *copy, enum zinf_dtype cdt, bool cut)
{
	void *parts[ZINF_OPTIM_MAX_PARTS];
	size_t gsz = zinf_dtype_size(gdt), csz = zinf_dtype_size(cdt);
	if (!cut) {
		ref_parts_at(f, 0, parts);
		cr_assert_eq(zinf_optimizer_step(f->opt, t, scale, parts, f->grad, gdt, 0, f->n,
						 copy, cdt),
			     0, "%s", zinf_last_error());
		return;
	}
	for (uint32_t k = 0; k < zinf_step_sub_groups(st); k++) {
		uint64_t s = zinf_step_sub_group_start(st, k), len = zinf_step_sub_group_len(st, k);
		for (uint64_t i0 = 0; i0 < len; i0 += ZINF_STEP_CHUNK) {
			uint64_t i = s + i0, n = ZINF_MIN(len - i0, ZINF_STEP_CHUNK);
			ref_parts_at(f, i, parts);
			cr_assert_eq(zinf_optimizer_step(f->opt, t, scale, parts,
							 (char *)f->grad + i * gsz, gdt, i, n,
							 copy ? (char *)copy + i * csz : NULL, cdt),
				     0, "%s", zinf_last_error());
		}
	}
}

static bool
opt_cuts(int which)
{
	return which == OPT_ADAMW_BF16_SR;
}

static void
load_state(struct rig *r, const struct ref *f)
{
	for (uint32_t k = 0; k < zinf_step_sub_groups(r->st); k++) {
		void *parts[ZINF_OPTIM_MAX_PARTS];
		ref_parts_at(f, zinf_step_sub_group_start(r->st, k), parts);
		cr_assert_eq(zinf_step_load(r->st, k, (const void *const *)parts), 0, "%s",
			     zinf_last_error());
	}
}

/* Every sub-group's state on its tier equals the reference, bit for bit. */
static void
check_state(struct rig *r, const struct ref *f)
{
	struct ref got = *f;
	for (uint32_t p = 0; p < f->np; p++) {
		got.part[p] = malloc(f->n * zinf_optimizer_part_bytes(f->opt, p));
	}
	for (uint32_t k = 0; k < zinf_step_sub_groups(r->st); k++) {
		void *parts[ZINF_OPTIM_MAX_PARTS];
		ref_parts_at(&got, zinf_step_sub_group_start(r->st, k), parts);
		cr_assert_eq(zinf_step_save(r->st, k, parts), 0, "%s", zinf_last_error());
	}
	for (uint32_t p = 0; p < f->np; p++) {
		uint32_t esz = zinf_optimizer_part_bytes(f->opt, p);
		for (size_t i = 0; i < f->n; i++) {
			if (memcmp((char *)got.part[p] + i * esz, (char *)f->part[p] + i * esz,
				   esz)) {
				cr_assert_fail("%s: element %zu of part %s differs",
					       zinf_optimizer_name(f->opt), i,
					       zinf_optimizer_part_name(f->opt, p));
			}
		}
		free(got.part[p]);
	}
}

struct scase {
	size_t n;
	uint64_t sg;
	uint32_t buffers;
	int schedule;
	int grad_dtype;
	int copy_dtype;
	int order;    /* 0 run(), 1 reverse via begin/ready, 2 shuffled */
	bool to_swap; /* 16-bit copy to the parameter tier's files (and to the host) */
	int tier;
	int optim; /* OPT_* */
};

/* A case with sub_group_ends and/or copy_fn. */
struct xcase {
	struct scase c;
	uint64_t ends[8]; /* sub_group_ends (no pointers: parameters cross into the test
			     process) */
	uint32_t n_ends;  /* n_sub_groups; 0: sub-groups of c.sg elements */
	bool copy_fn;	  /* take the copy through copy_fn too */
};

/* What copy_fn received: each sub-group's bytes at its place, the calls per sub-group. */
struct crec {
	struct rig *r;
	char *copy; /* n elements of the copy dtype */
	size_t csz;
	uint32_t *calls; /* per sub-group, this step */
	pthread_t thread;
	int bad;    /* calls with a wrong length, sub-group or thread */
	int fail_k; /* return -EIO for this sub-group (-1: never) */
};

static int
rec_copy(void *ctx, uint32_t k, const void *copy, uint64_t n)
{
	struct crec *c = ctx;
	if (k >= zinf_step_sub_groups(c->r->st) || n != zinf_step_sub_group_len(c->r->st, k) ||
	    !pthread_equal(pthread_self(), c->thread)) {
		c->bad++;
		return 0;
	}
	c->calls[k]++;
	if ((int)k == c->fail_k) {
		return -EIO;
	}
	memcpy(c->copy + zinf_step_sub_group_start(c->r->st, k) * c->csz, copy, n * c->csz);
	return 0;
}

static void
rec_init(struct crec *c, struct rig *r, size_t n, enum zinf_dtype dt, uint32_t nsg)
{
	c->r = r;
	c->csz = zinf_dtype_size(dt);
	c->copy = malloc(n * c->csz);
	c->calls = calloc(nsg, sizeof(*c->calls));
	c->thread = pthread_self();
	c->bad = 0;
	c->fail_k = -1;
}

static void
rec_fini(struct crec *c)
{
	free(c->copy);
	free(c->calls);
}

/* One step through begin/ready/finish in the case's order. */
static void
step_in_order(struct rig *r, const struct scase *c, int64_t t, float scale, const void *grad,
	      void *copy, uint32_t *perm, uint64_t *seed)
{
	uint32_t nsg = zinf_step_sub_groups(r->st);
	size_t gsz = zinf_dtype_size(c->grad_dtype);
	for (uint32_t i = 0; i < nsg; i++) {
		perm[i] = c->order == 1 ? nsg - 1 - i : i;
	}
	if (c->order == 2) {
		for (uint32_t i = nsg - 1; i > 0; i--) {
			uint32_t j = (uint32_t)(zt_rand(seed) % (i + 1));
			uint32_t x = perm[i];
			perm[i] = perm[j];
			perm[j] = x;
		}
	}
	cr_assert_eq(zinf_step_begin(r->st, t, scale, copy, c->order == 1), 0);
	for (uint32_t i = 0; i < nsg; i++) {
		uint32_t k = perm[i];
		const char *g = (const char *)grad + zinf_step_sub_group_start(r->st, k) * gsz;
		cr_assert_eq(zinf_step_ready(r->st, k, g, c->grad_dtype), 0, "%s",
			     zinf_last_error());
	}
	cr_assert_eq(zinf_step_finish(r->st), 0, "%s", zinf_last_error());
}

/* The step's statistics: exactly the parts' bytes moved, the buffers and the read-ahead. */
static void
check_stats(struct rig *r, const struct scase *c)
{
	uint32_t nsg = zinf_step_sub_groups(r->st);
	uint64_t state = (uint64_t)c->n * zinf_optimizer_state_bytes(r->opt);
	uint64_t copy = c->to_swap ? (uint64_t)c->n * zinf_dtype_size(c->copy_dtype) : 0;
	struct zinf_step_stats s = {.size = sizeof(s)};
	cr_assert_eq(zinf_step_get_stats(r->st, &s), 0);
	if (c->tier == ZINF_TIER_NVME) {
		/* Shuffled readiness may drop a prefetched sub-group and read it again. */
		if (c->order == 2) {
			cr_assert_geq(s.read_bytes, state);
		} else {
			cr_assert_eq(s.read_bytes, state, "%" PRIu64, s.read_bytes);
		}
		cr_assert_eq(s.write_bytes, state + copy);
		cr_assert_leq(s.buffers, c->buffers);
		if (c->schedule == ZINF_SCHEDULE_DEEPSPEED) {
			cr_assert_leq(s.max_reads_in_flight, 2);
		} else {
			/* As deep as the buffers allow, not one: begin reads into every buffer it
			 * took (the pool's, at most sub-groups + 1). */
			cr_assert_eq(s.buffers, ZINF_MIN(c->buffers, nsg + 1));
			cr_assert_geq(s.max_reads_in_flight, ZINF_MIN(s.buffers, nsg),
				      "read-ahead %u with %u buffers", s.max_reads_in_flight,
				      s.buffers);
		}
	} else {
		cr_assert_eq(s.read_bytes, 0);
		cr_assert_eq(s.write_bytes, copy);
		cr_assert_leq(s.buffers, c->buffers);
	}
}

static void
run_case(const struct scase *c, const struct xcase *x)
{
	uint64_t seed = zt_seed();
	struct zinf_step_opts so;
	zinf_step_opts_init(&so);
	so.n = c->n;
	so.sub_group_size = c->sg;
	so.tier = c->tier;
	so.schedule = c->schedule;
	so.copy_dtype = c->copy_dtype;
	so.param_swap = c->to_swap ? (struct zinf_swap *)1 : NULL; /* rig sets the real one */
	struct rig r;
	struct crec rec;
	uint64_t *ends = NULL;
	if (x && x->n_ends) {
		/* The step keeps its own copy: the caller's array may go at once after create. */
		ends = malloc(x->n_ends * sizeof(*ends));
		memcpy(ends, x->ends, x->n_ends * sizeof(*ends));
		so.sub_group_ends = ends;
		so.n_sub_groups = x->n_ends;
		so.sub_group_size = 0;
	}
	if (x && x->copy_fn) {
		so.copy_fn = rec_copy;
		so.copy_ctx = &rec;
	}
	rig_init_opt(&r, &so, c->buffers, false, c->optim);
	if (ends) {
		memset(ends, 0xff, x->n_ends * sizeof(*ends));
		free(ends);
		cr_assert_eq(zinf_step_sub_groups(r.st), x->n_ends);
		for (uint32_t k = 0; k < x->n_ends; k++) {
			uint64_t s0 = k ? x->ends[k - 1] : 0;
			cr_assert_eq(zinf_step_sub_group_start(r.st, k), s0);
			cr_assert_eq(zinf_step_sub_group_len(r.st, k), x->ends[k] - s0);
		}
		cr_assert_eq(zinf_step_sub_group_len(r.st, x->n_ends), 0);
	}
	struct ref f;
	ref_init(&f, r.opt, c->n, &seed);
	load_state(&r, &f);
	uint16_t *copy = malloc(c->n * 2);
	uint32_t nsg = zinf_step_sub_groups(r.st);
	uint32_t *perm = malloc(nsg * sizeof(*perm));
	rec_init(&rec, &r, c->n, c->copy_dtype, nsg);
	for (int64_t t = 1; t <= 3; t++) {
		fill_grad(&f, c->grad_dtype, &seed);
		float scale = t == 2 ? 0.5f : 1.0f;
		memset(copy, 0xee, c->n * 2);
		memset(rec.copy, 0xee, c->n * rec.csz);
		memset(rec.calls, 0, nsg * sizeof(*rec.calls));
		if (c->order == 0) {
			cr_assert_eq(zinf_step_run(r.st, t, scale, f.grad, c->grad_dtype, copy), 0,
				     "%s", zinf_last_error());
		} else {
			step_in_order(&r, c, t, scale, f.grad, copy, perm, &seed);
		}
		ref_step(r.st, &f, t, scale, c->grad_dtype, f.copy, c->copy_dtype,
			 opt_cuts(c->optim));
		cr_assert_eq(memcmp(copy, f.copy, c->n * 2), 0, "16-bit copy differs at step %d",
			     (int)t);
		if (so.copy_fn) {
			cr_assert_eq(rec.bad, 0, "copy_fn: wrong length, sub-group or thread");
			for (uint32_t k = 0; k < nsg; k++) {
				cr_assert_eq(rec.calls[k], 1, "copy_fn called %u times for %u",
					     rec.calls[k], k);
			}
			cr_assert_eq(memcmp(rec.copy, f.copy, c->n * rec.csz), 0,
				     "copy_fn's copy differs at step %d", (int)t);
		}
		for (uint32_t k = 0; k < nsg; k++) {
			cr_assert_eq(zinf_step_sub_group_written(r.st, k), t);
		}
		check_stats(&r, c);
	}
	check_state(&r, &f);
	if (c->to_swap) {
		/* The parameter tier's files hold the same 16-bit copy. */
		for (uint32_t k = 0; k < nsg; k++) {
			int id = zinf_swap_find(r.swap, "param16", k);
			cr_assert_geq(id, 0);
			uint64_t len = zinf_step_sub_group_len(r.st, k);
			void *b = zinf_alloc_aligned(4096, zinf_swap_buf_bytes(r.swap, id));
			cr_assert_eq(zinf_swap_read(r.swap, id, b), 0);
			cr_assert_eq(
				memcmp(b, f.copy + zinf_step_sub_group_start(r.st, k), len * 2), 0,
				"param16[%u] differs", k);
			zinf_free_aligned(b);
		}
	}
	free(perm);
	free(copy);
	rec_fini(&rec);
	ref_fini(&f);
	rig_fini(&r);
}

/* Sub-groups of different sizes, as the engine cuts at parameter boundaries: one of a single
 * element, a large one, a tail; and one longer than ZINF_STEP_CHUNK starting off any multiple
 * of it (the chunks are cut from the sub-group's start). */
#define ENDS_A	   {1, 5000, 5001, 40000, 40003, 61000, 100003}, 7
#define ENDS_CHUNK {17, (1 << 20) + 20, (1 << 20) + 4099}, 3

#define PIPE ZINF_SCHEDULE_PIPELINED
#define NVME ZINF_TIER_NVME
#define CPU  ZINF_TIER_CPU

ParameterizedTestParameters(step, bit_identical_to_the_optimizer_in_memory)
{
	static struct scase cases[] = {
		/* minimum buffers: one */
		{100003, 10007, 1, PIPE, ZINF_F32, ZINF_F16, 0, false, NVME, OPT_ADAMW},
		{100003, 10007, 2, PIPE, ZINF_F16, ZINF_BF16, 0, false, NVME, OPT_ADAMW},
		{100003, 10007, 5, PIPE, ZINF_BF16, ZINF_F16, 0, true, NVME, OPT_ADAMW},
		/* more buffers than sub-groups */
		{50000, 7777, 16, PIPE, ZINF_F32, ZINF_BF16, 0, false, NVME, OPT_ADAMW},
		{100003, 10007, 3, ZINF_SCHEDULE_DEEPSPEED, ZINF_F32, ZINF_F16, 0, false, NVME,
		 OPT_ADAMW},
		{100003, 10007, 3, PIPE, ZINF_F16, ZINF_F16, 1, true, NVME, OPT_ADAMW},
		{100003, 9001, 2, PIPE, ZINF_F32, ZINF_F16, 2, false, NVME, OPT_ADAMW},
		{100003, 9001, 4, PIPE, ZINF_BF16, ZINF_BF16, 2, true, NVME, OPT_ADAMW},
		/* one sub-group larger than n; a chunked (> ZINF_STEP_CHUNK) sub-group */
		{3001, 1 << 20, 1, PIPE, ZINF_F32, ZINF_F16, 0, false, NVME, OPT_ADAMW},
		{(1 << 20) + 4099, (1 << 20) + 17, 2, PIPE, ZINF_F32, ZINF_F16, 0, false, NVME,
		 OPT_ADAMW},
		/* the CPU tier: the same interface, no I/O */
		{100003, 10007, 0, PIPE, ZINF_F16, ZINF_F16, 2, false, CPU, OPT_ADAMW},
		/* the CPU tier, the 16-bit copy to the parameter tier's files through pool
		 * buffers: the minimum (one), more, and more than sub-groups */
		{100003, 10007, 1, PIPE, ZINF_F32, ZINF_F16, 0, true, CPU, OPT_ADAMW},
		{100003, 9001, 3, PIPE, ZINF_BF16, ZINF_BF16, 2, true, CPU, OPT_ADAMW},
		{50000, 7777, 16, PIPE, ZINF_F16, ZINF_F16, 1, true, CPU, OPT_ADAMW},
		/* every optimizer on both tiers: Adam (L2), bf16-state Adam (RNE, and stochastic
		 * rounding, also over a chunked sub-group), Adagrad (2 parts), Lion (2 parts) */
		{100003, 10007, 3, PIPE, ZINF_F32, ZINF_F16, 0, true, NVME, OPT_ADAM},
		{100003, 10007, 2, PIPE, ZINF_F16, ZINF_F16, 1, false, CPU, OPT_ADAM},
		{100003, 10007, 3, PIPE, ZINF_F32, ZINF_BF16, 0, false, NVME, OPT_ADAM_BF16_RNE},
		{100003, 9001, 2, PIPE, ZINF_BF16, ZINF_BF16, 2, true, CPU, OPT_ADAM_BF16_RNE},
		{100003, 10007, 2, PIPE, ZINF_F32, ZINF_F16, 2, true, NVME, OPT_ADAMW_BF16_SR},
		{100003, 10007, 0, PIPE, ZINF_F16, ZINF_F16, 1, false, CPU, OPT_ADAMW_BF16_SR},
		{(1 << 20) + 4099, (1 << 20) + 17, 2, PIPE, ZINF_F32, ZINF_F16, 0, false, NVME,
		 OPT_ADAMW_BF16_SR},
		{100003, 10007, 1, PIPE, ZINF_F32, ZINF_F16, 0, false, NVME, OPT_ADAGRAD},
		{100003, 9001, 4, ZINF_SCHEDULE_DEEPSPEED, ZINF_BF16, ZINF_F16, 0, true, NVME,
		 OPT_ADAGRAD},
		{100003, 10007, 2, PIPE, ZINF_F32, ZINF_BF16, 2, true, CPU, OPT_ADAGRAD},
		{100003, 10007, 3, PIPE, ZINF_F16, ZINF_F16, 2, true, NVME, OPT_LION},
		{100003, 10007, 0, PIPE, ZINF_F32, ZINF_F16, 0, false, CPU, OPT_LION},
		/* a bf16 master (its rounding hashes the element's index: the reference is one
		 * call), with fp32 and with bf16 moments, on both tiers, over a chunked sub-group
		 */
		{100003, 10007, 3, PIPE, ZINF_F32, ZINF_BF16, 2, true, NVME, OPT_ADAMW_BF16M},
		{100003, 9001, 2, PIPE, ZINF_BF16, ZINF_F16, 0, true, CPU, OPT_ADAMW_BF16M},
		{(1 << 20) + 4099, (1 << 20) + 17, 2, PIPE, ZINF_F32, ZINF_BF16, 0, false, NVME,
		 OPT_ADAMW_BF16M_BF16},
		{100003, 10007, 2, PIPE, ZINF_F16, ZINF_BF16, 1, false, CPU, OPT_ADAMW_BF16M_BF16},
	};
	return cr_make_param_array(struct scase, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct scase *c, step, bit_identical_to_the_optimizer_in_memory)
{
	run_case(c, NULL);
}

ParameterizedTestParameters(step, variable_sub_groups_and_copy_fn_bit_identical)
{
	static struct xcase cases[] = {
		/* variable sub-groups (sub_group_ends), both tiers; bf16 stochastic rounding
		 * is the optimizer whose result depends on the cuts */
		{{100003, 0, 2, PIPE, ZINF_F32, ZINF_F16, 0, false, NVME, OPT_ADAMW},
		 ENDS_A,
		 false},
		{{100003, 0, 3, PIPE, ZINF_BF16, ZINF_F16, 2, true, NVME, OPT_ADAMW_BF16_SR},
		 ENDS_A,
		 false},
		{{100003, 0, 1, ZINF_SCHEDULE_DEEPSPEED, ZINF_F16, ZINF_BF16, 1, false, NVME,
		  OPT_ADAMW_BF16_SR},
		 ENDS_A,
		 false},
		{{(1 << 20) + 4099, 0, 2, PIPE, ZINF_F32, ZINF_F16, 0, false, NVME,
		  OPT_ADAMW_BF16_SR},
		 ENDS_CHUNK,
		 false},
		{{100003, 0, 0, PIPE, ZINF_F32, ZINF_F16, 2, false, CPU, OPT_ADAMW_BF16_SR},
		 ENDS_A,
		 false},
		{{100003, 0, 2, PIPE, ZINF_F16, ZINF_F16, 1, true, CPU, OPT_ADAMW_BF16_SR},
		 ENDS_A,
		 false},
		{{(1 << 20) + 4099, 0, 0, PIPE, ZINF_F32, ZINF_F16, 0, false, CPU,
		  OPT_ADAMW_BF16_SR},
		 ENDS_CHUNK,
		 false},
		/* copy_fn: alone, with param_swap, both tiers, uniform and variable sub-groups
		 * (copy_host is given in every case) */
		{{100003, 10007, 1, PIPE, ZINF_F32, ZINF_F16, 0, false, NVME, OPT_ADAMW},
		 {0},
		 0,
		 true},
		{{100003, 0, 3, PIPE, ZINF_BF16, ZINF_BF16, 2, true, NVME, OPT_ADAMW_BF16_SR},
		 ENDS_A,
		 true},
		{{100003, 0, 2, ZINF_SCHEDULE_DEEPSPEED, ZINF_F32, ZINF_F16, 1, false, NVME,
		  OPT_LION},
		 ENDS_A,
		 true},
		{{100003, 10007, 1, PIPE, ZINF_F16, ZINF_F16, 0, false, CPU, OPT_ADAMW},
		 {0},
		 0,
		 true},
		{{100003, 0, 2, PIPE, ZINF_F32, ZINF_BF16, 2, false, CPU, OPT_ADAGRAD},
		 ENDS_A,
		 true},
		{{100003, 0, 3, PIPE, ZINF_F32, ZINF_F16, 1, true, CPU, OPT_ADAMW_BF16_SR},
		 ENDS_A,
		 true},
	};
	return cr_make_param_array(struct xcase, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct xcase *x, step, variable_sub_groups_and_copy_fn_bit_identical)
{
	run_case(&x->c, x);
}

/* Copy the reference's state (to step it on apart). */
static void
ref_clone(struct ref *dst, const struct ref *src)
{
	*dst = *src;
	for (uint32_t p = 0; p < src->np; p++) {
		size_t bytes = src->n * zinf_optimizer_part_bytes(src->opt, p);
		dst->part[p] = malloc(bytes);
		memcpy(dst->part[p], src->part[p], bytes);
	}
	dst->grad = malloc(src->n * 4);
	memcpy(dst->grad, src->grad, src->n * 4);
	dst->copy = malloc(src->n * 2);
}

/* Does sub-group k of the step hold exactly f's state? (-errno of the read-back otherwise.) */
static int
sub_group_equals(struct rig *r, uint32_t k, const struct ref *f, bool *equal)
{
	uint64_t s = zinf_step_sub_group_start(r->st, k), len = zinf_step_sub_group_len(r->st, k);
	void *got[ZINF_OPTIM_MAX_PARTS], *want[ZINF_OPTIM_MAX_PARTS];
	ref_parts_at(f, s, want);
	for (uint32_t p = 0; p < f->np; p++) {
		got[p] = malloc(len * 4);
	}
	int rc = zinf_step_save(r->st, k, got);
	*equal = rc == 0;
	for (uint32_t p = 0; p < f->np; p++) {
		*equal = *equal &&
			 !memcmp(got[p], want[p], len * zinf_optimizer_part_bytes(f->opt, p));
		free(got[p]);
	}
	return rc;
}

/* Every "KIND[K]" named in e is `tensor`: the message names one tensor consistently. */
static void
assert_names_one_tensor(const char *e, const char *tensor)
{
	static const char *const kinds[] = {"fp32[", "exp_avg[", "exp_avg_sq[", "param16["};
	int seen = 0;
	for (size_t i = 0; i < ZINF_ARRAY_SIZE(kinds); i++) {
		for (const char *q = strstr(e, kinds[i]); q; q = strstr(q + 1, kinds[i])) {
			if (q > e && (q[-1] == '_' || (q[-1] >= 'a' && q[-1] <= 'z'))) {
				continue; /* "exp_avg_sq[" also contains "sq[" after "exp_avg_" */
			}
			cr_assert_eq(strncmp(q, tensor, strlen(tensor)), 0,
				     "the message names %.16s and %s: %s", q, tensor, e);
			seen++;
		}
	}
	cr_assert_geq(seen, 2, "the step and the swap space both name %s: %s", tensor, e);
}

/* The tensor the step's message blames: "<op> of KIND[K]". */
static void
blamed_tensor(const char *e, const char *op, char *out, size_t len)
{
	char pat[32];
	snprintf(pat, sizeof(pat), "%s of ", op);
	const char *q = strstr(e, pat);
	cr_assert(q, "no \"%s\" in: %s", pat, e);
	q += strlen(pat);
	const char *end = strchr(q, ']');
	cr_assert(end && (size_t)(end - q + 2) < len, "%s", e);
	snprintf(out, len, "%.*s", (int)(end - q + 1), q);
}

/* A fault in the middle of a step: it fails, names the sub-group, one tensor and the file, leaks
 * nothing. */
static void
fault_case(int op)
{
	uint64_t seed = zt_seed();
	struct zinf_step_opts so;
	zinf_step_opts_init(&so);
	so.n = 100003;
	so.sub_group_size = 10007;
	so.rank = 3;
	struct rig r;
	rig_init(&r, &so, 3, true);
	struct ref f;
	ref_init(&f, r.opt, so.n, &seed);
	load_state(&r, &f);
	uint16_t *copy = malloc(so.n * 2);
	fill_grad(&f, ZINF_F32, &seed);
	cr_assert_eq(zinf_step_run(r.st, 1, 1.0f, f.grad, ZINF_F32, copy), 0, "%s",
		     zinf_last_error());
	ref_step(r.st, &f, 1, 1.0f, ZINF_F32, NULL, ZINF_F16, false);

	/* Each tensor is 3 blocks of 16 KiB: the 40th op is in sub-group 4 or so. */
	struct zinf_io_fault fl = {.kind = ZINF_IO_FAULT_FAIL, .op = op, .nth = 40, .err = EIO};
	cr_assert_eq(zinf_io_fault_add(r.io, &fl), 0);
	fill_grad(&f, ZINF_F32, &seed);
	int rc = zinf_step_run(r.st, 2, 1.0f, f.grad, ZINF_F32, copy);
	cr_assert_eq(rc, -EIO, "the step must fail, got %d", rc);
	const char *e = zinf_last_error();
	cr_assert(strstr(e, "optimizer step (rank 3, 10 sub-groups): step 2: sub-group ") &&
			  strstr(e, r.dir),
		  "message must name the step, sub-group, operation and file: %s", e);
	char tensor[32];
	blamed_tensor(e, op == ZINF_IO_READ ? "read" : "write", tensor, sizeof(tensor));
	assert_names_one_tensor(e, tensor);
	cr_assert_eq(zinf_pool_free_count(r.pool), zinf_pool_buffer_count(r.pool),
		     "a buffer leaked");
	/* What says it was written at step 2 reads back as step 2's state; the rest as step 1's
	 * (reads failed before the optimizer) or not at all (a failed write leaves the tensor
	 * unwritten). */
	struct ref f2;
	ref_clone(&f2, &f);
	ref_step(r.st, &f2, 2, 1.0f, ZINF_F32, NULL, ZINF_F16, false);
	uint32_t nsg = zinf_step_sub_groups(r.st);
	uint32_t n2 = 0, nfail = 0;
	for (uint32_t k = 0; k < nsg; k++) {
		int64_t w = zinf_step_sub_group_written(r.st, k);
		bool eq = false;
		if (w == 2) {
			n2++;
			cr_assert_eq(sub_group_equals(&r, k, &f2, &eq), 0);
			cr_assert(eq,
				  "sub-group %u reported written at step 2 but does not hold it",
				  k);
		} else if (sub_group_equals(&r, k, &f, &eq) == 0) {
			cr_assert_eq(w, 1);
			cr_assert(eq, "sub-group %u not written at step 2 but changed", k);
		} else {
			nfail++;
			cr_assert_eq(op, ZINF_IO_WRITE);
			cr_assert(strstr(zinf_last_error(), "reading back sub-group"),
				  "a torn write must read as no data: %s", zinf_last_error());
			char torn[32];
			blamed_tensor(zinf_last_error(), "read", torn, sizeof(torn));
			assert_names_one_tensor(zinf_last_error(), torn);
			/* Step 1's update is no longer on disk either: no step's is. */
			cr_assert_eq(
				w, 0,
				"sub-group %u torn by a failed write reported as step %" PRId64, k,
				w);
		}
	}
	cr_assert_lt(n2, nsg, "not every sub-group can have been written");
	cr_assert_gt(n2, 0, "the fault was meant to land mid-step");
	if (op == ZINF_IO_WRITE) {
		cr_assert_geq(nfail, 1);
		/* A step over the torn state: its read is refused at start (no data), and the
		 * message still names that one tensor and its file. */
		cr_assert_eq(zinf_step_run(r.st, 3, 1.0f, f.grad, ZINF_F32, copy), -ENODATA);
		e = zinf_last_error();
		blamed_tensor(e, "read", tensor, sizeof(tensor));
		assert_names_one_tensor(e, tensor);
	}
	/* The step object and the pool still work: a clean step on a fresh state. */
	load_state(&r, &f);
	cr_assert_eq(zinf_step_run(r.st, 3, 1.0f, f.grad, ZINF_F32, copy), 0, "%s",
		     zinf_last_error());
	free(copy);
	ref_fini(&f2);
	ref_fini(&f);
	rig_fini(&r);
}

Test(step, read_error_mid_step)
{
	fault_case(ZINF_IO_READ);
}

Test(step, write_error_mid_step)
{
	fault_case(ZINF_IO_WRITE);
}

Test(step, too_few_buffers_for_one_sub_group)
{
	struct rig r;
	rig_open_swap(&r, false);
	struct zinf_step_opts so;
	zinf_step_opts_init(&so);
	so.n = 100000;
	so.sub_group_size = 40000;
	so.swap = r.swap;
	struct zinf_pool_opts po;
	zinf_pool_opts_init(&po);
	po.buffer_count = 4;
	po.buffer_bytes = 3 * 160000 - 1;
	cr_assert_eq(zinf_pool_create(&po, &r.pool), 0);
	so.pool = r.pool;
	struct zinf_step *st = NULL;
	cr_assert_eq(zinf_step_create(&so, &st), -ENOMEM);
	const char *e = zinf_last_error();
	cr_assert(strstr(e, "too few buffers for one sub-group") && strstr(e, "40000 elements") &&
			  strstr(e, "491520 bytes"),
		  "%s", e);
	cr_assert_null(st);
	zinf_pool_destroy(r.pool);
	r.pool = NULL;
	/* A pool with no buffers at all (CPU region only). */
	zinf_pool_opts_init(&po);
	po.cpu_bytes = 4096;
	cr_assert_eq(zinf_pool_create(&po, &r.pool), 0);
	so.pool = r.pool;
	cr_assert_eq(zinf_step_create(&so, &st), -ENOMEM);
	cr_assert(strstr(zinf_last_error(), "too few buffers"));
	rig_fini(&r);
}

/* Buffers big enough but not aligned for the swap space would make every I/O fail mid-step:
 * refused at create, naming the alignment; the same pool with the right align works. */
Test(step, pool_buffers_not_aligned_for_the_swap_space)
{
	struct rig r;
	rig_open_swap(&r, false);
	uint32_t align = zinf_swap_align(r.swap);
	cr_assert_geq(align, 128);
	struct zinf_step_opts so;
	zinf_step_opts_init(&so);
	so.n = 100000;
	so.sub_group_size = 40000;
	so.swap = r.swap;
	struct zinf_pool_opts po;
	zinf_pool_opts_init(&po);
	po.buffer_count = 2;
	po.align = 64;
	po.buffer_bytes = zinf_step_buffer_bytes(&so, align) + 64;
	cr_assert_eq(zinf_pool_create(&po, &r.pool), 0);
	so.pool = r.pool;
	struct zinf_step *st = NULL;
	cr_assert_eq(zinf_step_create(&so, &st), -EINVAL);
	char want[64];
	snprintf(want, sizeof(want), "alignment (%u bytes)", align);
	cr_assert(strstr(zinf_last_error(), want), "%s", zinf_last_error());
	cr_assert_null(st);
	zinf_pool_destroy(r.pool);
	po.align = align;
	cr_assert_eq(zinf_pool_create(&po, &r.pool), 0);
	so.pool = r.pool;
	cr_assert_eq(zinf_step_create(&so, &st), 0, "%s", zinf_last_error());
	zinf_step_destroy(st);
	rig_fini(&r);
}

Test(step, a_sub_group_never_ready_fails_the_step)
{
	uint64_t seed = zt_seed();
	struct zinf_step_opts so;
	zinf_step_opts_init(&so);
	so.n = 30000;
	so.sub_group_size = 10000;
	struct rig r;
	rig_init(&r, &so, 2, false);
	struct ref f;
	ref_init(&f, r.opt, so.n, &seed);
	load_state(&r, &f);
	fill_grad(&f, ZINF_F32, &seed);
	cr_assert_eq(zinf_step_begin(r.st, 1, 1.0f, NULL, false), 0);
	cr_assert_eq(zinf_step_begin(r.st, 1, 1.0f, NULL, false), -EBUSY);
	cr_assert_eq(zinf_step_ready(r.st, 0, f.grad, ZINF_F32), 0);
	cr_assert_eq(zinf_step_ready(r.st, 0, f.grad, ZINF_F32), -EINVAL);
	cr_assert_eq(zinf_step_ready(r.st, 2, (float *)f.grad + 20000, ZINF_F32), 0);
	cr_assert_eq(zinf_step_finish(r.st), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "sub-group 1 was never made ready"), "%s",
		  zinf_last_error());
	cr_assert_eq(zinf_step_sub_group_written(r.st, 0), 1);
	cr_assert_eq(zinf_step_sub_group_written(r.st, 1), 0);
	cr_assert_eq(zinf_step_sub_group_written(r.st, 2), 1);
	ref_fini(&f);
	rig_fini(&r);
}

/* CPU tier, copy to the parameter tier's files: a failed write of a copy fails the step with the
 * sub-group and the file named, that sub-group does not count as written, no buffer leaks. */
Test(step, cpu_tier_param_swap_write_error)
{
	uint64_t seed = zt_seed();
	struct zinf_step_opts so;
	zinf_step_opts_init(&so);
	so.n = 100003;
	so.sub_group_size = 10007;
	so.tier = ZINF_TIER_CPU;
	so.param_swap = (struct zinf_swap *)1; /* rig sets the real one */
	struct rig r;
	rig_init(&r, &so, 2, true);
	struct ref f;
	ref_init(&f, r.opt, so.n, &seed);
	load_state(&r, &f);
	fill_grad(&f, ZINF_F32, &seed);
	uint16_t *copy = malloc(so.n * 2);
	/* Each copy is 20014 bytes (2 blocks of 16 KiB): the 9th write is sub-group 4's first
	 * block, or sub-group 3's second one when the I/O threads run the two copies' blocks out
	 * of order (with 2 buffers both are in flight): the fault lands in sub-group 3 or 4. */
	struct zinf_io_fault fl = {
		.kind = ZINF_IO_FAULT_FAIL, .op = ZINF_IO_WRITE, .nth = 9, .err = EIO};
	cr_assert_eq(zinf_io_fault_add(r.io, &fl), 0);
	int rc = zinf_step_run(r.st, 1, 1.0f, f.grad, ZINF_F32, copy);
	cr_assert_eq(rc, -EIO, "the step must fail, got %d", rc);
	const char *e = zinf_last_error();
	const char *at = strstr(e, "optimizer step (10 sub-groups): step 1: sub-group ");
	unsigned k = 0;
	cr_assert(at && sscanf(at + strlen("optimizer step (10 sub-groups): step 1: sub-group "),
			       "%u", &k) == 1,
		  "message must name the step and sub-group: %s", e);
	cr_assert(k == 3 || k == 4, "the 9th write is sub-group 3's or 4's, not %u: %s", k, e);
	char what[32];
	snprintf(what, sizeof(what), "write of param16[%u]", k);
	cr_assert(strstr(e, what) && strstr(e, r.dir),
		  "message must name the operation and file: %s", e);
	cr_assert_eq(zinf_pool_free_count(r.pool), zinf_pool_buffer_count(r.pool),
		     "a buffer leaked");
	cr_assert_eq(zinf_step_sub_group_written(r.st, k), 0, "a failed write never counts");
	cr_assert_eq(zinf_step_sub_group_written(r.st, k - 1), 1);
	/* Still usable. */
	cr_assert_eq(zinf_step_run(r.st, 2, 1.0f, f.grad, ZINF_F32, copy), 0, "%s",
		     zinf_last_error());
	cr_assert_eq(zinf_step_sub_group_written(r.st, k), 2);
	free(copy);
	ref_fini(&f);
	rig_fini(&r);
}

/* copy_fn failing on sub-group 2 fails the step naming it; nothing of sub-group 2 is written
 * (NVMe: its state stays the previous step's), no buffer leaks, the step stays usable. */
static void
copy_fn_error_case(int tier)
{
	uint64_t seed = zt_seed();
	static const uint64_t ends[] = {3000, 10000, 10001, 30011};
	struct zinf_step_opts so;
	zinf_step_opts_init(&so);
	so.n = 30011;
	so.sub_group_ends = ends;
	so.n_sub_groups = 4;
	so.tier = tier;
	struct crec rec;
	so.copy_fn = rec_copy;
	so.copy_ctx = &rec;
	struct rig r;
	rig_init(&r, &so, 2, false);
	rec_init(&rec, &r, so.n, ZINF_F16, 4);
	struct ref f;
	ref_init(&f, r.opt, so.n, &seed);
	load_state(&r, &f);
	fill_grad(&f, ZINF_F32, &seed);
	cr_assert_eq(zinf_step_run(r.st, 1, 1.0f, f.grad, ZINF_F32, NULL), 0, "%s",
		     zinf_last_error());
	ref_step(r.st, &f, 1, 1.0f, ZINF_F32, NULL, ZINF_F16, false);
	rec.fail_k = 2;
	memset(rec.calls, 0, 4 * sizeof(*rec.calls));
	int rc = zinf_step_run(r.st, 2, 1.0f, f.grad, ZINF_F32, NULL);
	cr_assert_eq(rc, -EIO, "the step must fail, got %d", rc);
	const char *e = zinf_last_error();
	cr_assert(strstr(e, "step 2: sub-group 2 (elements 10000..10001): copy_fn failed: "
			    "returned -5"),
		  "%s", e);
	cr_assert_eq(rec.calls[3], 0, "in order, the step stops at the failed sub-group");
	cr_assert_eq(zinf_pool_free_count(r.pool), zinf_pool_buffer_count(r.pool),
		     "a buffer leaked");
	cr_assert_eq(zinf_step_sub_group_written(r.st, 0), 2);
	cr_assert_eq(zinf_step_sub_group_written(r.st, 2), 1);
	if (tier == NVME) {
		bool eq = false;
		cr_assert_eq(sub_group_equals(&r, 2, &f, &eq), 0, "%s", zinf_last_error());
		cr_assert(eq, "sub-group 2 must still hold step 1's state");
	}
	rec.fail_k = -1;
	cr_assert_eq(zinf_step_run(r.st, 3, 1.0f, f.grad, ZINF_F32, NULL), 0, "%s",
		     zinf_last_error());
	cr_assert_eq(zinf_step_sub_group_written(r.st, 2), 3);
	cr_assert_eq(rec.bad, 0);
	rec_fini(&rec);
	ref_fini(&f);
	rig_fini(&r);
}

Test(step, copy_fn_error_fails_the_step_nvme)
{
	copy_fn_error_case(NVME);
}

Test(step, copy_fn_error_fails_the_step_cpu)
{
	copy_fn_error_case(CPU);
}

/* Bad sub_group_ends / n_sub_groups / copy_fn: -EINVAL at create naming the field, and
 * zinf_step_buffer_bytes() 0 for bad ends. */
struct ecase {
	uint64_t ends[4];
	uint32_t n_ends;
	bool ends_null;
	bool copy_fn_no_pool;
	char want[96];
};

static int
nop_copy(void *ctx, uint32_t k, const void *copy, uint64_t n)
{
	(void)ctx, (void)k, (void)copy, (void)n;
	return 0;
}

ParameterizedTestParameters(step, sub_group_ends_and_copy_fn_errors)
{
	static struct ecase cases[] = {
		{{100, 50, 1000}, 3, false, false, "sub_group_ends[1] = 50 is not above 100"},
		{{100, 100, 1000}, 3, false, false, "sub_group_ends[1] = 100 is not above 100"},
		{{0, 500, 1000}, 3, false, false, "sub_group_ends[0] = 0 is not above 0"},
		{{100, 500, 999},
		 3,
		 false,
		 false,
		 "sub_group_ends[2] = 999, the last end, must "
		 "equal n 1000"},
		{{100, 500, 1001}, 3, false, false, "the last end, must equal n 1000"},
		{{1000}, 0, false, false, "sub_group_ends given with n_sub_groups 0"},
		{{0}, 2, true, false, "n_sub_groups 2 without sub_group_ends"},
		{{0}, 0, true, true, "with a copy_fn needs a pinned pool"},
	};
	return cr_make_param_array(struct ecase, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct ecase *c, step, sub_group_ends_and_copy_fn_errors)
{
	zt_log_to_stderr();
	struct zinf_step_opts so;
	zinf_step_opts_init(&so);
	so.n = 1000;
	so.sub_group_size = 300;
	so.tier = ZINF_TIER_CPU;
	so.sub_group_ends = c->ends_null ? NULL : c->ends;
	so.n_sub_groups = c->n_ends;
	if (c->copy_fn_no_pool) {
		so.copy_fn = nop_copy;
	}
	struct zinf_step *st = (void *)0x1;
	cr_assert_eq(zinf_step_create(&so, &st), -EINVAL);
	cr_assert(strstr(zinf_last_error(), c->want), "want \"%s\" in: %s", c->want,
		  zinf_last_error());
	cr_assert_eq(st, (void *)0x1, "*out untouched");
	if (!c->ends_null) {
		so.tier = ZINF_TIER_NVME;
		cr_assert_eq(zinf_step_buffer_bytes(&so, 4096), 0, "bad ends size nothing");
	}
}

/* The buffer holds the largest sub-group (not sub_group_size's): worked by hand, and a pool
 * sized for smaller sub-groups is refused at create naming the largest. */
Test(step, sub_group_ends_size_the_buffer_by_the_largest)
{
	struct rig r;
	rig_open_swap(&r, false);
	static const uint64_t ends[] = {10000, 60000, 70000, 100000};
	struct zinf_step_opts so;
	zinf_step_opts_init(&so);
	so.n = 100000;
	so.sub_group_size = 10000; /* ignored with ends */
	so.sub_group_ends = ends;
	so.n_sub_groups = 4;
	so.swap = r.swap;
	/* AdamW fp32: 3 parts of 50000 x 4 = 200000 bytes, each aligned up to 4096: 200704. */
	cr_assert_eq(zinf_step_buffer_bytes(&so, 4096), 3 * 200704ull);
	so.copy_fn = nop_copy; /* + the f16 copy: 100000 bytes, aligned 102400 */
	cr_assert_eq(zinf_step_buffer_bytes(&so, 4096), 3 * 200704ull + 102400);
	so.tier = ZINF_TIER_CPU;
	cr_assert_eq(zinf_step_buffer_bytes(&so, 4096), 102400ull);
	so.tier = ZINF_TIER_NVME;
	so.copy_fn = NULL;
	struct zinf_pool_opts po;
	zinf_pool_opts_init(&po);
	po.buffer_count = 2;
	po.buffer_bytes = 3 * 40960; /* enough for sub-groups of 10000 */
	cr_assert_eq(zinf_pool_create(&po, &r.pool), 0);
	so.pool = r.pool;
	struct zinf_step *st = NULL;
	cr_assert_eq(zinf_step_create(&so, &st), -ENOMEM);
	cr_assert(strstr(zinf_last_error(), "the largest sub-group, of 50000 elements"), "%s",
		  zinf_last_error());
	cr_assert_null(st);
	rig_fini(&r);
}

/* Names, sizes and swap ids of the parts through the public API, for every optimizer and both
 * tiers; the bytes a step moves are exactly the parts' bytes (bf16 state: 8 of fp32's 12). */
struct pcase {
	int optim;
	int tier;
	bool to_swap;
	uint32_t nparts;
	char kind[4][16]; /* no pointers: parameters cross into the test process */
	uint32_t bytes[4];
};

ParameterizedTestParameters(step, part_info_names_sizes_and_swap_ids)
{
	static struct pcase cases[] = {
		{OPT_ADAMW, NVME, false, 3, {"fp32", "exp_avg", "exp_avg_sq"}, {4, 4, 4}},
		{OPT_ADAM_BF16_RNE,
		 NVME,
		 true,
		 4,
		 {"fp32", "exp_avg", "exp_avg_sq", "param16"},
		 {4, 2, 2, 2}},
		{OPT_ADAMW_BF16_SR, NVME, false, 3, {"fp32", "exp_avg", "exp_avg_sq"}, {4, 2, 2}},
		{OPT_ADAGRAD, NVME, true, 3, {"fp32", "state_sum", "param16"}, {4, 4, 2}},
		{OPT_LION, NVME, false, 2, {"fp32", "exp_avg"}, {4, 4}},
		{OPT_ADAGRAD, CPU, true, 3, {"fp32", "state_sum", "param16"}, {4, 4, 2}},
		{OPT_LION, CPU, false, 2, {"fp32", "exp_avg"}, {4, 4}},
	};
	return cr_make_param_array(struct pcase, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct pcase *c, step, part_info_names_sizes_and_swap_ids)
{
	uint64_t seed = zt_seed();
	struct zinf_step_opts so;
	zinf_step_opts_init(&so);
	so.n = 30011;
	so.sub_group_size = 10000;
	so.tier = c->tier;
	so.param_swap = c->to_swap ? (struct zinf_swap *)1 : NULL;
	struct rig r;
	rig_init_opt(&r, &so, 2, false, c->optim);
	cr_assert_eq(zinf_step_part_count(r.st), c->nparts);
	uint32_t per_elem = 0;
	for (uint32_t p = 0; p < c->nparts; p++) {
		struct zinf_step_part_info i = {.size = sizeof(i)};
		cr_assert_eq(zinf_step_part_info(r.st, p, &i), 0, "%s", zinf_last_error());
		cr_assert_str_eq(i.kind, c->kind[p]);
		cr_assert_eq(i.elem_bytes, c->bytes[p], "part %u (%s)", p, i.kind);
		cr_assert_eq(i.copy, c->to_swap && p == c->nparts - 1);
		bool in_swap = i.copy || c->tier == NVME;
		cr_assert_eq(i.swap, in_swap ? r.swap : NULL);
		per_elem += i.copy ? 0 : i.elem_bytes;
		for (uint32_t k = 0; k < zinf_step_sub_groups(r.st); k++) {
			int id = zinf_step_swap_id(r.st, k, p);
			if (!in_swap) {
				cr_assert_eq(id, -ENOENT);
				continue;
			}
			cr_assert_eq(id, zinf_swap_find(r.swap, c->kind[p], k));
			cr_assert_eq(zinf_swap_bytes(r.swap, id),
				     zinf_step_sub_group_len(r.st, k) * c->bytes[p]);
		}
	}
	cr_assert_eq(per_elem, zinf_optimizer_state_bytes(r.opt));
	struct zinf_step_part_info i = {.size = sizeof(i)};
	cr_assert_eq(zinf_step_part_info(r.st, c->nparts, &i), -EINVAL);
	cr_assert_eq(zinf_step_swap_id(r.st, 4, 0), -EINVAL);
	cr_assert_eq(zinf_step_swap_id(r.st, 0, c->nparts), -EINVAL);

	/* One step: bytes moved are the parts' bytes, worked by hand. */
	struct ref f;
	ref_init(&f, r.opt, so.n, &seed);
	load_state(&r, &f);
	fill_grad(&f, ZINF_F32, &seed);
	cr_assert_eq(zinf_step_run(r.st, 1, 1.0f, f.grad, ZINF_F32, NULL), 0, "%s",
		     zinf_last_error());
	struct zinf_step_stats s = {.size = sizeof(s)};
	cr_assert_eq(zinf_step_get_stats(r.st, &s), 0);
	uint64_t state = 0;
	for (uint32_t p = 0; p < c->nparts; p++) {
		state += c->to_swap && p == c->nparts - 1 ? 0 : 30011ull * c->bytes[p];
	}
	uint64_t copy = c->to_swap ? 30011ull * 2 : 0;
	cr_assert_eq(s.read_bytes, c->tier == NVME ? state : 0);
	cr_assert_eq(s.write_bytes, (c->tier == NVME ? state : 0) + copy);
	if (c->optim == OPT_ADAM_BF16_RNE || c->optim == OPT_ADAMW_BF16_SR) {
		cr_assert_eq(s.read_bytes, 240088u, "bf16 state moves 8 bytes a parameter");
		cr_assert_eq(s.read_bytes, 30011ull * 12 * 2 / 3);
	}
	ref_fini(&f);
	rig_fini(&r);
}

/* Every public step function given a NULL handle: -EINVAL with a message; getters neutral. */
Test(step, null_handles_are_einval_not_a_crash)
{
	zt_log_to_stderr();
	struct zinf_step_stats s = {.size = sizeof(s)};
	struct zinf_step_part_info i = {.size = sizeof(i)};
	const char *const names[] = {
		"zinf_step_begin",     "zinf_step_ready",     "zinf_step_finish",
		"zinf_step_run",       "zinf_step_load",      "zinf_step_save",
		"zinf_step_get_stats", "zinf_step_part_info", "zinf_step_swap_id"};
	int rcs[] = {
		zinf_step_begin(NULL, 1, 1.0f, NULL, false),
		zinf_step_ready(NULL, 0, &s, ZINF_F32),
		zinf_step_finish(NULL),
		zinf_step_run(NULL, 1, 1.0f, &s, ZINF_F32, NULL),
		zinf_step_load(NULL, 0, NULL),
		zinf_step_save(NULL, 0, NULL),
		zinf_step_get_stats(NULL, &s),
		zinf_step_part_info(NULL, 0, &i),
		zinf_step_swap_id(NULL, 0, 0),
	};
	for (size_t k = 0; k < ZINF_ARRAY_SIZE(rcs); k++) {
		cr_assert_eq(rcs[k], -EINVAL, "%s", names[k]);
	}
	cr_assert(strstr(zinf_last_error(), "zinf_step_swap_id: NULL step"), "%s",
		  zinf_last_error());
	cr_assert_eq(zinf_step_sub_groups(NULL), 0);
	cr_assert_eq(zinf_step_sub_group_len(NULL, 0), 0);
	cr_assert_eq(zinf_step_sub_group_start(NULL, 0), 0);
	cr_assert_eq(zinf_step_sub_group_written(NULL, 0), 0);
	cr_assert_eq(zinf_step_part_count(NULL), 0);
	cr_assert_eq(zinf_step_buffer_bytes(NULL, 4096), 0);
	cr_assert_eq(zinf_step_create(NULL, NULL), -EINVAL);
	struct zinf_step *st = (void *)0x1;
	cr_assert_eq(zinf_step_create(NULL, &st), -EINVAL); /* defaults: n 0 */
	cr_assert(strstr(zinf_last_error(), "n 0 and sub_group_size 0 must be > 0"), "%s",
		  zinf_last_error());
	cr_assert_eq(st, (void *)0x1, "*out untouched");
	zinf_step_destroy(NULL);
}

/*
 * The size rule: a caller built against an older zinf_step_opts (without `rank`) keeps the
 * default (unnamed rank); a newer, larger struct is refused; statistics and part info are
 * given up to the caller's size. Sizes that overflow 64 bits are refused at create.
 */
Test(step, options_and_statistics_size_rule)
{
	uint64_t seed = zt_seed();
	struct rig r;
	rig_open_swap(&r, false);
	struct zinf_step_opts so;
	zinf_step_opts_init(&so);
	so.n = 30000;
	so.sub_group_size = 10000;
	so.tier = ZINF_TIER_CPU;
	so.rank = 7;
	so.size = offsetof(struct zinf_step_opts, timeout_ms); /* an older caller */
	struct zinf_step *st = NULL;
	cr_assert_eq(zinf_step_create(&so, &st), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_step_begin(st, 0, 1.0f, NULL, false), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "optimizer step (3 sub-groups): step 0 < 1"), "%s",
		  zinf_last_error());
	/* Statistics into an older, smaller struct: its fields only. */
	struct ref f;
	f.np = 0;
	struct zinf_optimizer *opt = NULL;
	cr_assert_eq(zinf_optimizer_create(NULL, &opt), 0);
	ref_init(&f, opt, so.n, &seed);
	fill_grad(&f, ZINF_F32, &seed);
	cr_assert_eq(zinf_step_run(st, 1, 1.0f, f.grad, ZINF_F32, NULL), 0);
	struct zinf_step_stats s;
	memset(&s, 0xab, sizeof(s));
	s.size = offsetof(struct zinf_step_stats, optim_s);
	cr_assert_eq(zinf_step_get_stats(st, &s), 0);
	cr_assert_eq(s.size, offsetof(struct zinf_step_stats, optim_s));
	cr_assert_eq(s.read_bytes, 0);
	cr_assert_eq(s.write_bytes, 0);
	uint64_t poison;
	memset(&poison, 0xab, sizeof(poison));
	cr_assert_eq(memcmp(&s.optim_s, &poison, 8), 0, "written past the caller's size");
	s.size = 4;
	cr_assert_eq(zinf_step_get_stats(st, &s), -EINVAL);
	zinf_step_destroy(st);
	st = NULL;
	/* A newer caller's larger struct. */
	so.size = sizeof(so) + 8;
	struct {
		struct zinf_step_opts o;
		uint64_t more;
	} big = {.o = so};
	cr_assert_eq(zinf_step_create(&big.o, &st), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "zinf_step_opts") &&
			  strstr(zinf_last_error(), "newer zinf"),
		  "%s", zinf_last_error());
	/* Wrap-around: n x bytes. */
	zinf_step_opts_init(&so);
	so.n = UINT64_MAX / 2;
	so.sub_group_size = UINT64_MAX / 4;
	so.tier = ZINF_TIER_CPU;
	cr_assert_eq(zinf_step_create(&so, &st), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "overflow 64 bits"), "%s", zinf_last_error());
	cr_assert_eq(zinf_step_buffer_bytes(&so, 4096), 0, "an overflowing layout reads as 0");
	so.tier = ZINF_TIER_NVME;
	so.param_swap = r.swap;
	cr_assert_eq(zinf_step_buffer_bytes(&so, 4096), 0);
	ref_fini(&f);
	zinf_optimizer_destroy(opt);
	rig_fini(&r);
}

/*
 * q8 state: each sub-group is a q8 array of its own (blocks from its start), on both tiers, for
 * uniform and variable sub-groups and one longer than ZINF_STEP_CHUNK, with no-decay ranges that
 * start and end inside blocks. Three steps equal, bit for bit, the descriptor stepping such
 * per-sub-group arrays in memory in ZINF_STEP_CHUNK pieces; the NVMe bytes are the q8 sizes.
 */
struct q8case {
	size_t n;
	uint64_t sg;
	uint64_t ends[8];
	uint32_t n_ends;
	int tier;
	uint32_t buffers;
};

ParameterizedTestParameters(step, q8_state_bit_identical_per_sub_group)
{
	static struct q8case cases[] = {
		{100003, 10007, {0}, 0, NVME, 2},
		{100003, 0, ENDS_A, NVME, 3},
		{100003, 0, ENDS_A, CPU, 0},
		{(1 << 20) + 4099, 0, ENDS_CHUNK, NVME, 2},
		{(1 << 20) + 4099, 0, ENDS_CHUNK, CPU, 0},
	};
	return cr_make_param_array(struct q8case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct q8case *c, step, q8_state_bit_identical_per_sub_group)
{
	struct zinf_step_opts so;
	zinf_step_opts_init(&so);
	so.n = c->n;
	so.sub_group_size = c->sg;
	so.sub_group_ends = c->n_ends ? c->ends : NULL;
	so.n_sub_groups = c->n_ends;
	so.tier = c->tier;
	struct rig r;
	rig_init_opt(&r, &so, c->buffers, false, OPT_ADAMW_Q8);
	const uint64_t nd[] = {3, 700, 5000, 5003, 40001, 52000};
	cr_assert_eq(zinf_optimizer_set_no_decay(r.opt, nd, 3), 0);
	uint32_t nsg = zinf_step_sub_groups(r.st);
	uint64_t *qoff = calloc(nsg + 1, sizeof(*qoff));
	for (uint32_t k = 0; k < nsg; k++) {
		qoff[k + 1] = qoff[k] + zinf_q8_bytes(zinf_step_sub_group_len(r.st, k));
	}
	uint64_t seed = 0x9812;
	float *master = malloc(c->n * 4), *grad = malloc(c->n * 4);
	uint8_t *mq = calloc(qoff[nsg], 1), *vq = calloc(qoff[nsg], 1);
	uint16_t *copy = malloc(c->n * 2), *copy_ref = malloc(c->n * 2);
	for (size_t i = 0; i < c->n; i++) {
		master[i] = (float)zt_uniform(&seed, -1, 1);
	}
	for (uint32_t k = 0; k < nsg; k++) {
		const void *st[3] = {master + zinf_step_sub_group_start(r.st, k), NULL, NULL};
		cr_assert_eq(zinf_step_load(r.st, k, st), 0, "%s", zinf_last_error());
	}
	struct scase sc = {.n = c->n, .grad_dtype = ZINF_F32, .copy_dtype = ZINF_F16};
	uint32_t *perm = calloc(nsg, sizeof(*perm));
	for (int64_t t = 1; t <= 3; t++) {
		for (size_t i = 0; i < c->n; i++) {
			grad[i] = (float)zt_uniform(&seed, -2, 2);
		}
		step_in_order(&r, &sc, t, 0.5f, grad, copy, perm, &seed);
		for (uint32_t k = 0; k < nsg; k++) {
			uint64_t s = zinf_step_sub_group_start(r.st, k);
			uint64_t len = zinf_step_sub_group_len(r.st, k);
			for (uint64_t i0 = 0, n; (n = zinf_step_piece(i0, len)) > 0; i0 += n) {
				void *parts[3] = {master + s + i0, mq + qoff[k] + zinf_q8_bytes(i0),
						  vq + qoff[k] + zinf_q8_bytes(i0)};
				cr_assert_eq(zinf_optimizer_step(r.opt, t, 0.5f, parts,
								 grad + s + i0, ZINF_F32, s + i0, n,
								 copy_ref + s + i0, ZINF_F16),
					     0, "%s", zinf_last_error());
			}
		}
	}
	cr_assert(!memcmp(copy, copy_ref, c->n * 2), "the 16-bit copies differ");
	for (uint32_t k = 0; k < nsg; k++) {
		uint64_t s = zinf_step_sub_group_start(r.st, k);
		uint64_t len = zinf_step_sub_group_len(r.st, k);
		void *got[3] = {malloc(len * 4), malloc(zinf_q8_bytes(len)),
				malloc(zinf_q8_bytes(len))};
		cr_assert_eq(zinf_optimizer_part_size(r.opt, 1, len), zinf_q8_bytes(len));
		cr_assert_eq(zinf_step_save(r.st, k, got), 0, "%s", zinf_last_error());
		cr_assert(!memcmp(got[0], master + s, len * 4), "fp32[%u] differs", k);
		cr_assert(!memcmp(got[1], mq + qoff[k], zinf_q8_bytes(len)), "exp_avg[%u]", k);
		cr_assert(!memcmp(got[2], vq + qoff[k], zinf_q8_bytes(len)), "exp_avg_sq[%u]", k);
		for (int p = 0; p < 3; p++) {
			free(got[p]);
		}
	}
	struct zinf_step_stats st = {.size = sizeof(st)};
	cr_assert_eq(zinf_step_get_stats(r.st, &st), 0);
	uint64_t state = c->n * 4 + 2 * qoff[nsg];
	if (c->tier == NVME) {
		cr_assert_eq(st.read_bytes, state, "read %" PRIu64 ", want %" PRIu64, st.read_bytes,
			     state);
		cr_assert_eq(st.write_bytes, state, "written %" PRIu64 ", want %" PRIu64,
			     st.write_bytes, state);
	}
	free(qoff), free(master), free(grad), free(mq), free(vq), free(copy), free(copy_ref);
	free(perm);
	rig_fini(&r);
}
