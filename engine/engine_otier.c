/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine_otier.c: where the optimizer state lives, one table per tier (struct eng_otier),
 * chosen once at create from zero_optimization.offload_optimizer.device:
 *  - gpu (none): the master, the moments and the fp32 gradient partition in device memory,
 *    stepped by the device's Adam on the stepping thread's stream (the "host" device: by
 *    cpu_adam on that memory, any optimizer);
 *  - cpu: the same arrays in the optimizer pool's pinned CPU region, stepped by cpu_adam;
 *  - nvme: the state in the optimizer's swap space, stepped by zinf_step (its reads ahead and
 *    writes behind, the engine's sub-group ends, a copy callback taking each sub-group's new
 *    16-bit values home and a before callback that keeps a speculated sub-group's state as
 *    read); the gradients in the gradient window (engine_gwin.c).
 * The tiers in memory cut a sub-group with zinf_step_piece as zinf_step does (index0 the piece's
 * flat index), so that every tier gives the same bits. Each table also says how a sub-group's
 * state is written at init and load, read for read_master and checkpoints (the state visitor of
 * engine_module.h), and kept and restored by the speculative step (engine_spec.c).
 */
#include <errno.h>
#include <string.h>

#include "common/dtype.h"
#include "engine/engine_internal.h"

static size_t
part_bytes(const struct zinf_engine *e, uint32_t i)
{
	return zinf_optimizer_part_bytes(e->opt, i);
}

/* Bytes of n elements of part i from a block boundary (q8 parts: codes and scales). */
static uint64_t
part_size(const struct zinf_engine *e, uint32_t i, uint64_t n)
{
	return zinf_optimizer_part_size(e->opt, i, n);
}

static bool
part_q8(const struct zinf_engine *e, uint32_t i)
{
	return zinf_optimizer_part_align(e->opt, i) > 1;
}

/* Bytes of part i's array in memory (cpu tier): the flat partition, or with q8 state the
 * sub-groups' q8 arrays one after another. */
static uint64_t
part_total(const struct zinf_engine *e, uint32_t i)
{
	if (!part_q8(e, i)) {
		return e->flat_n * part_bytes(e, i);
	}
	uint64_t b = 0;
	for (uint32_t k = 0; k < e->n_sg; k++) {
		b += zinf_q8_bytes(e->sg_end[k] - eng_sg_start(e, k));
	}
	return b;
}

/* Part i of sub-group k at flat element off (the sub-group's start, or a piece's: a multiple of
 * ZINF_STEP_CHUNK from it, so of ZINF_Q8_BLOCK) in the arrays in memory. */
static char *
part_at(const struct zinf_engine *e, uint32_t i, uint32_t k, uint64_t off)
{
	if (e->os.q8_off && part_q8(e, i)) {
		return (char *)e->os.state[i] + e->os.q8_off[k] +
		       zinf_q8_bytes(off - eng_sg_start(e, k));
	}
	return (char *)e->os.state[i] + off * part_bytes(e, i);
}

/* ---- the tiers in memory (gpu, cpu) --------------------------------------------------------- */

/* The device's Adam over flat elements [off, off + n) (parts, grad and copy at off), one call
 * per run of elements that decay or not (ZINF_PARAM_NO_DECAY: weight decay 0), as
 * zinf_optimizer_step cuts the host tiers' calls. */
static int
device_adam(struct zinf_engine *e, struct ectx *x, int64_t step, void *const parts[],
	    const float *grad, uint64_t off, uint64_t n, void *copy)
{
	struct zinf_adam_opts a;
	zinf_adam_opts_init(&a);
	a.lr = e->step_lr, a.beta1 = e->step_beta1, a.beta2 = e->step_beta2;
	a.eps = e->o.optimizer.eps;
	a.adamw_mode = e->o.optimizer.kind == ZINF_OPTIM_ADAMW;
	a.bias_correction = e->o.optimizer.bias_correction;
	size_t ds = eng_dsize(e), run;
	int ret = 0;
	for (uint64_t i = 0; !ret && i < n; i += run) {
		bool decays;
		run = zinf_optimizer_decay_run(e->opt, off + i, n - i, &decays);
		a.weight_decay = decays ? e->o.optimizer.weight_decay : 0.0f;
		/* fp32 state (the device tier refuses any other): 4 bytes an element per part */
		ret = zinf_device_adam(x->s, &a, step, e->step_scale, (float *)parts[0] + i,
				       grad + i, ZINF_F32, (float *)parts[1] + i,
				       (float *)parts[2] + i, run,
				       copy ? (char *)copy + i * ds : NULL, e->o.dtype);
	}
	return ret;
}

/* The optimizer over sub-group k's pieces, its new 16-bit values home through x->s. The gradient
 * of k is final in grad_part as seen from the host (cpu) or from x->s (gpu). */
static int
step_in_memory(struct zinf_engine *e, struct ectx *x, uint32_t k, float *grad)
{
	int64_t step = e->steps + 1;
	uint64_t start = eng_sg_start(e, k), end = e->sg_end[k];
	bool dev = e->ot->dev;
	bool host_dev = e->host_comm; /* the host device: device memory is host memory */
	void *copy = dev ? e->os.dev_copy : e->os.host_copy;
	int ret = 0;
	for (uint64_t off = start, n; !ret && (n = zinf_step_piece(off, end)) > 0; off += n) {
		void *parts[ZINF_OPTIM_MAX_PARTS] = {0};
		for (uint32_t i = 0; i < e->nparts; i++) {
			parts[i] = part_at(e, i, k, off);
		}
		double t0 = zinf_now_s();
		if (dev && !host_dev) {
			ret = device_adam(e, x, step, parts, grad + (off - start), off, n, copy);
		} else {
			ret = zinf_optimizer_step(e->opt, step, e->step_scale, parts,
						  grad + (off - start), ZINF_F32, off, n, copy,
						  e->o.dtype);
		}
		x->st->optimizer_s += zinf_now_s() - t0;
		if (!ret) {
			ret = eng_param_home_write(e, x, off, copy, dev, n);
		}
		if (!ret && dev && host_dev) {
			ret = zinf_stream_sync(x->s); /* the copy buffer is reused on this thread */
		}
	}
	return ret ? ENG_FAIL(e, ret, "step %" PRId64 ": sub-group %u", step, k) : 0;
}

static int
begin_none(struct zinf_engine *e)
{
	(void)e;
	return 0;
}

static int
finish_none(struct zinf_engine *e, bool partial)
{
	(void)e;
	(void)partial;
	return 0;
}

static int
skip_none(struct zinf_engine *e, uint32_t k)
{
	(void)e;
	(void)k;
	return 0;
}

static size_t
bounce_none(const struct zinf_engine *e)
{
	(void)e;
	return 0;
}

void
eng_choose_tiers(struct zinf_engine *e)
{
	e->ot = e->o.offload_optimizer.device == ZINF_OFFLOAD_NVME  ? &eng_otier_nvme
		: e->o.offload_optimizer.device == ZINF_OFFLOAD_CPU ? &eng_otier_cpu
								    : &eng_otier_gpu;
	e->pt = e->o.stage < 3					 ? &eng_ptier_full
		: e->o.offload_param.device == ZINF_OFFLOAD_NVME ? &eng_ptier_nvme
		: e->o.offload_param.device == ZINF_OFFLOAD_CPU	 ? &eng_ptier_cpu
								 : &eng_ptier_gpu;
}

/* A tier without a pool of its own. */
static int
pool_none(const struct zinf_engine *e, const struct eng_tier_needs *needs, uint32_t align,
	  struct zinf_pool_opts *po)
{
	(void)e, (void)needs, (void)align;
	zinf_pool_opts_init(po);
	return 0;
}

/* ---- gpu ------------------------------------------------------------------------------------ */

static int
gpu_setup(struct zinf_engine *e, const struct eng_tier_needs *needs)
{
	(void)needs; /* no pool */
	uint64_t chunk = ZINF_MIN((uint64_t)ZINF_STEP_CHUNK, e->max_sg);
	int ret;
	for (uint32_t i = 0; i < e->nparts; i++) {
		uint32_t pb = part_bytes(e, i);
		if ((ret = zinf_device_alloc(e->dev, e->flat_n * pb, &e->os.state[i])) ||
		    (ret = zinf_device_fill(e->cs, e->os.state[i],
					    zinf_optimizer_part_dtype(e->opt, i), 0.0f,
					    e->flat_n))) {
			return ENG_FAIL(e, ret, "init: device memory for optimizer part %s",
					zinf_optimizer_part_name(e->opt, i));
		}
	}
	if ((ret = zinf_device_alloc(e->dev, e->flat_n * 4, (void **)&e->os.grad_part)) ||
	    (ret = zinf_device_fill(e->cs, e->os.grad_part, ZINF_F32, 0.0f, e->flat_n)) ||
	    (ret = zinf_device_alloc(e->dev, chunk * eng_dsize(e), &e->os.dev_copy))) {
		return ENG_FAIL(e, ret, "init: device memory for the gradient partition");
	}
	e->os.align = 0;
	return zinf_stream_sync(e->cs);
}

static void
gpu_free(struct zinf_engine *e)
{
	for (uint32_t i = 0; i < ZINF_OPTIM_MAX_PARTS; i++) {
		zinf_device_free(e->dev, e->os.state[i]);
	}
	zinf_device_free(e->dev, e->os.grad_part);
	zinf_device_free(e->dev, e->os.dev_copy);
}

static int
gpu_write_master(struct zinf_engine *e, uint32_t k, uint64_t off, float *m, uint64_t n)
{
	(void)k;
	int ret = zinf_device_copy(e->cs, (float *)e->os.state[0] + off, m, n * 4, ZINF_COPY_H2D);
	return ret ? ret : zinf_stream_sync(e->cs);
}

static int
gpu_read_master(struct zinf_engine *e, const struct eparam *p, float *mine, float *sg)
{
	(void)sg;
	int ret = zinf_device_copy(e->cs, mine, (float *)e->os.state[0] + p->flat_off,
				   p->part.part * 4, ZINF_COPY_D2H);
	return ret ? ret : zinf_stream_sync(e->cs);
}

static size_t
gpu_bounce(const struct zinf_engine *e)
{
	return (size_t)ZINF_STEP_CHUNK * zinf_optimizer_state_bytes(e->opt);
}

/* The pieces of k through the bounce buffer, copied on cs (D2H before fn, H2D after it). */
static int
gpu_visit(struct zinf_engine *e, uint32_t k, bool write, eng_visit_fn fn, void *ctx, void *bounce,
	  struct zinf_stream *cs)
{
	void *parts[ZINF_OPTIM_MAX_PARTS] = {NULL};
	uint64_t end = e->sg_end[k];
	int ret = 0;
	for (uint64_t off = eng_sg_start(e, k), n; !ret && (n = zinf_step_piece(off, end)) > 0;
	     off += n) {
		char *b = bounce;
		for (uint32_t i = 0; i < e->nparts; i++) {
			parts[i] = b;
			b += (size_t)ZINF_STEP_CHUNK * part_bytes(e, i);
		}
		for (uint32_t i = 0; i < e->nparts && !write && !ret; i++) {
			size_t pb = part_bytes(e, i);
			ret = zinf_device_copy(cs, parts[i], (char *)e->os.state[i] + off * pb,
					       n * pb, ZINF_COPY_D2H);
		}
		if (!ret && !write) {
			ret = zinf_stream_sync(cs);
		}
		if (!ret) {
			ret = fn(ctx, off, n, parts);
		}
		for (uint32_t i = 0; i < e->nparts && write && !ret; i++) {
			size_t pb = part_bytes(e, i);
			ret = zinf_device_copy(cs, (char *)e->os.state[i] + off * pb, parts[i],
					       n * pb, ZINF_COPY_H2D);
		}
		if (!ret && write) {
			ret = zinf_stream_sync(cs);
		}
	}
	return ret;
}

/* Sub-group k's state to or from its reserve slot (device memory), on s. */
static int
gpu_keep(struct zinf_engine *e, const struct ectx *x, uint32_t k, char *slot)
{
	uint64_t start = eng_sg_start(e, k), len = e->sg_end[k] - start;
	int ret = 0;
	for (uint32_t i = 0; i < e->nparts && !ret; i++) {
		size_t pb = part_bytes(e, i);
		ret = zinf_device_copy(x->s, slot + e->sp.off[i],
				       (char *)e->os.state[i] + start * pb, len * pb,
				       ZINF_COPY_D2D);
	}
	return ret;
}

static int
gpu_restore(struct zinf_engine *e, uint32_t k, const char *slot)
{
	uint64_t start = eng_sg_start(e, k), len = e->sg_end[k] - start;
	int ret = 0;
	for (uint32_t i = 0; i < e->nparts && !ret; i++) {
		size_t pb = part_bytes(e, i);
		ret = zinf_device_copy(e->cs, (char *)e->os.state[i] + start * pb,
				       slot + e->sp.off[i], len * pb, ZINF_COPY_D2D);
	}
	return ret;
}

const struct eng_otier eng_otier_gpu = {
	.name = "gpu",
	.dev = true,
	.setup = gpu_setup,
	.pool = pool_none,
	.free = gpu_free,
	.write_master = gpu_write_master,
	.read_master = gpu_read_master,
	.bounce_bytes = gpu_bounce,
	.visit = gpu_visit,
	.begin = begin_none,
	.step = step_in_memory,
	.skip = skip_none,
	.finish = finish_none,
	.keep = gpu_keep,
	.restore = gpu_restore,
};

/* ---- cpu ------------------------------------------------------------------------------------ */

/* Pinned bytes for the bucket staging (this rank's piece of a bucket) and the copy piece, which
 * the cpu and nvme tiers both carve from their pool. */
static uint64_t
host_buffers_bytes(const struct zinf_engine *e)
{
	uint64_t chunk = ZINF_MIN((uint64_t)ZINF_STEP_CHUNK, e->max_sg);
	uint64_t stage = e->gr.bucket_cap / (uint64_t)e->W;
	return ZINF_ALIGN_UP(stage * 4, 4096) + ZINF_ALIGN_UP(chunk * eng_dsize(e), 4096);
}

static int
host_buffers_alloc(struct zinf_engine *e)
{
	uint64_t chunk = ZINF_MIN((uint64_t)ZINF_STEP_CHUNK, e->max_sg);
	uint64_t stage = e->gr.bucket_cap / (uint64_t)e->W;
	int ret;
	if ((ret = zinf_pool_cpu_alloc(e->os.opool, stage * 4, (void **)&e->gr.host_stage)) ||
	    (ret = zinf_pool_cpu_alloc(e->os.opool, chunk * eng_dsize(e), &e->os.host_copy))) {
		return ENG_FAIL(e, ret, "init: pinned gradient staging");
	}
	return 0;
}

/* The optimizer pool's options of the host tiers, but for its sizes. */
static void
host_pool_opts(const struct zinf_engine *e, struct zinf_pool_opts *po)
{
	zinf_pool_opts_init(po);
	po->pin_memory = e->o.offload_optimizer.pin_memory;
	po->pin_fallback = true;
	po->what = "offload_optimizer";
}

/* cpu: one CPU region: the state parts and the gradient partition over the flat partition, the
   staging and copy buffers, what the others carve (the speculation's reserve) */
static int
cpu_pool(const struct zinf_engine *e, const struct eng_tier_needs *needs, uint32_t align,
	 struct zinf_pool_opts *po)
{
	(void)align; /* no swap space: 4096 */
	uint64_t cpu =
		host_buffers_bytes(e) + ZINF_ALIGN_UP(e->flat_n * 4, 4096) + needs->pinned(e, 4096);
	for (uint32_t i = 0; i < e->nparts; i++) {
		cpu += ZINF_ALIGN_UP(part_total(e, i), 4096);
	}
	host_pool_opts(e, po);
	po->cpu_bytes = cpu;
	return 1;
}

static int
cpu_setup(struct zinf_engine *e, const struct eng_tier_needs *needs)
{
	struct zinf_pool_opts po;
	cpu_pool(e, needs, 4096, &po);
	po.device = e->dev;
	int ret = zinf_pool_create(&po, &e->os.opool);
	if (ret) {
		return ENG_FAIL(e, ret, "init: pinned pool for offload_optimizer");
	}
	if (zinf_optimizer_state_format(e->opt) == ZINF_STATE_Q8) {
		e->os.q8_off = zc_calloc((size_t)e->n_sg + 1, sizeof(uint64_t));
		if (!e->os.q8_off) {
			return ENG_FAIL(e, -ENOMEM, "init: q8 state offsets of %u sub-groups",
					e->n_sg);
		}
		for (uint32_t k = 0; k < e->n_sg; k++) {
			e->os.q8_off[k + 1] =
				e->os.q8_off[k] + zinf_q8_bytes(e->sg_end[k] - eng_sg_start(e, k));
		}
	}
	for (uint32_t i = 0; i < e->nparts; i++) {
		uint64_t b = part_total(e, i);
		if ((ret = zinf_pool_cpu_alloc(e->os.opool, b, &e->os.state[i]))) {
			return ENG_FAIL(e, ret, "init: optimizer part %s",
					zinf_optimizer_part_name(e->opt, i));
		}
		memset(e->os.state[i], 0, b);
	}
	if ((ret = zinf_pool_cpu_alloc(e->os.opool, e->flat_n * 4, (void **)&e->os.grad_part))) {
		return ENG_FAIL(e, ret, "init: pinned gradient partition");
	}
	memset(e->os.grad_part, 0, e->flat_n * 4);
	e->os.align = 4096;
	return host_buffers_alloc(e);
}

static void
host_free(struct zinf_engine *e)
{
	/* the state is the pool's (eng_step_free destroys it) */
	zc_free(e->os.q8_off);
	e->os.q8_off = NULL;
}

/* The master's dtype in the host tiers: ZINF_F32, or ZINF_BF16 (zinf_optimizer_opts.master_dtype)
 */
static enum zinf_dtype
master_dtype(const struct zinf_engine *e)
{
	return zinf_optimizer_part_dtype(e->opt, 0);
}

static int
cpu_write_master(struct zinf_engine *e, uint32_t k, uint64_t off, float *m, uint64_t n)
{
	(void)k;
	/* f32: a copy; bf16: rounded to nearest */
	return zinf_dtype_convert((char *)e->os.state[0] + off * part_bytes(e, 0), master_dtype(e),
				  m, ZINF_F32, n);
}

static int
cpu_read_master(struct zinf_engine *e, const struct eparam *p, float *mine, float *sg)
{
	(void)sg;
	return zinf_dtype_convert(mine, ZINF_F32,
				  (char *)e->os.state[0] + p->flat_off * part_bytes(e, 0),
				  master_dtype(e), p->part.part);
}

static int
cpu_visit(struct zinf_engine *e, uint32_t k, bool write, eng_visit_fn fn, void *ctx, void *bounce,
	  struct zinf_stream *cs)
{
	(void)write, (void)bounce, (void)cs;
	uint64_t start = eng_sg_start(e, k);
	void *parts[ZINF_OPTIM_MAX_PARTS] = {NULL};
	for (uint32_t i = 0; i < e->nparts; i++) {
		parts[i] = part_at(e, i, k, start);
	}
	return fn(ctx, start, e->sg_end[k] - start, parts);
}

static int
cpu_keep(struct zinf_engine *e, const struct ectx *x, uint32_t k, char *slot)
{
	(void)x;
	uint64_t start = eng_sg_start(e, k), len = e->sg_end[k] - start;
	for (uint32_t i = 0; i < e->nparts; i++) {
		memcpy(slot + e->sp.off[i], part_at(e, i, k, start), part_size(e, i, len));
	}
	return 0;
}

static int
cpu_restore(struct zinf_engine *e, uint32_t k, const char *slot)
{
	uint64_t start = eng_sg_start(e, k), len = e->sg_end[k] - start;
	for (uint32_t i = 0; i < e->nparts; i++) {
		memcpy(part_at(e, i, k, start), slot + e->sp.off[i], part_size(e, i, len));
	}
	return 0;
}

const struct eng_otier eng_otier_cpu = {
	.name = "cpu",
	.setup = cpu_setup,
	.pool = cpu_pool,
	.free = host_free,
	.write_master = cpu_write_master,
	.read_master = cpu_read_master,
	.bounce_bytes = bounce_none,
	.visit = cpu_visit,
	.begin = begin_none,
	.step = step_in_memory,
	.skip = skip_none,
	.finish = finish_none,
	.keep = cpu_keep,
	.restore = cpu_restore,
};

/* ---- nvme ----------------------------------------------------------------------------------- */

/* zinf_step's before_fn: sub-group k's state as read, before the optimizer runs on it. */
static int
before_cb(void *ctx, uint32_t k, const void *const parts[], uint64_t len)
{
	struct zinf_engine *e = ctx;
	return e->os.keep_read ? e->os.keep_read(e, k, parts, len) : 0;
}

static int
copy_cb(void *ctx, uint32_t k, const void *copy, uint64_t n)
{
	struct zinf_engine *e = ctx;
	return eng_param_home_write(e, e->cb, eng_sg_start(e, k), copy, false, n);
}

/* zinf_step's fill_fn, the master shared with the 16-bit values (eng_master_shared): part 0 of
 * sub-group k is its parameters' 16-bit values, read from their home with the context of
 * whoever called the step (e->cb: the stepping thread's, or the visitor's). A partition in the
 * store's cache is a memcpy; else a read of the parameter store, counted as its bytes. */
static int
fill_cb(void *ctx, uint32_t k, uint32_t part, void *buf, uint64_t len)
{
	struct zinf_engine *e = ctx;
	uint64_t want = k < e->n_sg ? e->sg_end[k] - eng_sg_start(e, k) : 0;
	if (part != 0 || k >= e->n_sg || len != want) {
		return ENG_FAIL(e, -EPROTO,
				"the shared master's fill: part %u of sub-group %u, %" PRIu64
				" elements (the master is part 0, the sub-group %" PRIu64 ")",
				part, k, len, want);
	}
	return eng_param_home_read(e, e->cb ? e->cb : &e->main, k, buf, false);
}

/* The step over NVMe's options from the layout (its swap space and pool set by the caller). */
static void
nvme_step_opts(const struct zinf_engine *e, struct zinf_step_opts *so)
{
	zinf_step_opts_init(so);
	so->n = e->flat_n;
	so->sub_group_size = e->o.sub_group_size;
	so->tier = ZINF_TIER_NVME;
	so->optimizer = e->opt;
	so->copy_dtype = e->o.dtype;
	so->rank = e->rank;
	so->sub_group_ends = e->sg_end;
	so->n_sub_groups = e->n_sg;
	so->copy_fn = copy_cb;
	so->copy_ctx = (void *)e;
	so->before_fn = before_cb;
	so->before_ctx = (void *)e;
	if (eng_master_shared(e)) {
		so->external_parts = 1u; /* the master: the parameters' home keeps it */
		so->fill_fn = fill_cb;
		so->fill_ctx = (void *)e;
	}
	so->schedule = (enum zinf_step_schedule)e->o.optimizer_schedule;
}

/* nvme: buffer_count buffers of one sub-group's state and copy (zinf_step_buffer_bytes), and a
   CPU region of the staging and copy buffers and what the others carve */
static int
nvme_pool(const struct zinf_engine *e, const struct eng_tier_needs *needs, uint32_t align,
	  struct zinf_pool_opts *po)
{
	struct zinf_step_opts so;
	nvme_step_opts(e, &so);
	host_pool_opts(e, po);
	po->buffer_bytes = zinf_step_buffer_bytes(&so, align);
	po->buffer_count = e->o.offload_optimizer.buffer_count;
	po->cpu_bytes = host_buffers_bytes(e) + needs->pinned(e, align);
	po->align = align;
	return 1;
}

static int
nvme_setup(struct zinf_engine *e, const struct eng_tier_needs *needs)
{
	int ret = eng_open_swap(e, &e->o.offload_optimizer, "optim", &e->os.oswap);
	if (ret) {
		return ret;
	}
	struct zinf_step_opts so;
	nvme_step_opts(e, &so);
	so.swap = e->os.oswap;
	uint32_t align = zinf_swap_align(e->os.oswap);
	struct zinf_pool_opts po;
	nvme_pool(e, needs, align, &po);
	po.io = e->io;
	po.device = e->dev;
	if (po.buffer_bytes == 0) {
		return ENG_FAIL(e, -EINVAL, "init: optimizer sub-groups too large for a buffer");
	}
	if ((ret = zinf_pool_create(&po, &e->os.opool))) {
		return ENG_FAIL(e, ret, "init: pinned pool for offload_optimizer");
	}
	so.pool = e->os.opool;
	if ((ret = zinf_step_create(&so, &e->os.step))) {
		return ENG_FAIL(e, ret, "init: optimizer step over NVMe");
	}
	if ((ret = needs->declare(e))) {
		return ret;
	}
	if ((ret = zinf_swap_reserve(e->os.oswap))) {
		return ENG_FAIL(e, ret, "init: reserving the optimizer's swap files");
	}
	e->os.align = align;
	return host_buffers_alloc(e);
}

static void
nvme_free(struct zinf_engine *e)
{
	zinf_step_destroy(e->os.step);
	e->os.step = NULL;
}

static int
nvme_write_master(struct zinf_engine *e, uint32_t k, uint64_t off, float *m, uint64_t n)
{
	(void)off; /* whole: the sub-group */
	/* shared with the 16-bit values: the caller wrote them home, the same bits (rounded to
	   nearest), and zinf_step_load leaves part 0 alone */
	if (master_dtype(e) == ZINF_BF16 && !eng_master_shared(e)) {
		/* rounded to nearest in place, front to back: element i's two bytes land on bytes
		   the floats before i + 1 held, which are read already */
		for (uint64_t i = 0; i < n; i++) {
			uint16_t h = dt_f32_to_bf16_rne(m[i]);
			memcpy((char *)m + 2 * i, &h, sizeof(h));
		}
	}
	const void *st[ZINF_OPTIM_MAX_PARTS] = {m};
	return zinf_step_load(e->os.step, k, st);
}

static int
nvme_read_master(struct zinf_engine *e, const struct eparam *p, float *mine, float *sg)
{
	void *st[ZINF_OPTIM_MAX_PARTS] = {sg};
	struct ectx *cb = e->cb;
	e->cb = &e->main; /* a shared master: from the parameters' home (fill_cb) */
	int ret = zinf_step_save(e->os.step, p->sg, st);
	e->cb = cb;
	if (!ret) {
		uint64_t at = (p->flat_off - eng_sg_start(e, p->sg)) * part_bytes(e, 0);
		ret = zinf_dtype_convert(mine, ZINF_F32, (char *)sg + at, master_dtype(e),
					 p->part.part);
	}
	return ret;
}

struct nvme_visit {
	struct zinf_engine *e;
	eng_visit_fn fn;
	void *ctx;
};

static int
nvme_visit_cb(void *ctx, uint32_t k, void *const parts[], uint64_t len)
{
	struct nvme_visit *v = ctx;
	(void)len;
	return v->fn(v->ctx, eng_sg_start(v->e, k), v->e->sg_end[k] - eng_sg_start(v->e, k), parts);
}

static int
nvme_visit(struct zinf_engine *e, uint32_t k, bool write, eng_visit_fn fn, void *ctx, void *bounce,
	   struct zinf_stream *cs)
{
	(void)bounce;
	struct nvme_visit v = {e, fn, ctx};
	/* a shared master comes from the parameters' home (fill_cb), copied on the visitor's
	   stream; counters of its own, dropped (a background save runs beside the training
	   thread), and the parameter store's reads taken out of the window (nvme_read): a save's
	   I/O is not a step's */
	struct zinf_engine_stats st = {.size = sizeof(st)};
	struct ectx x = {cs, &st, true}, *cb = e->cb;
	e->cb = &x;
	int ret =
		zinf_step_visit(e->os.step, k, write ? ZINF_STEP_VISIT_WRITE : ZINF_STEP_VISIT_READ,
				nvme_visit_cb, &v);
	e->cb = cb;
	return ret;
}

static int
nvme_begin(struct zinf_engine *e)
{
	return zinf_step_begin(e->os.step, e->steps + 1, e->step_scale, NULL, false);
}

static int
nvme_step(struct zinf_engine *e, struct ectx *x, uint32_t k, float *grad)
{
	e->cb = x;
	int ret = zinf_step_ready(e->os.step, k, grad, ZINF_F32);
	return ret ? ENG_FAIL(e, ret, "step %" PRId64 ": sub-group %u", e->steps + 1, k) : 0;
}

static int
nvme_skip(struct zinf_engine *e, uint32_t k)
{
	return zinf_step_skip(e->os.step, k);
}

/* The pass ends: its reads, writes and optimizer time into the window (a partial pass, ended
 * by the speculative step, is followed by another that counts its own). */
static int
nvme_finish(struct zinf_engine *e, bool partial)
{
	(void)partial;
	int ret = zinf_step_finish(e->os.step);
	struct zinf_step_stats st = {.size = sizeof(st)};
	if (!zinf_step_get_stats(e->os.step, &st)) {
		e->win.nvme_read_bytes += st.read_bytes;
		e->win.nvme_write_bytes += st.write_bytes;
		e->win.optimizer_s += st.optim_s;
	}
	return ret;
}

static int
nvme_keep(struct zinf_engine *e, const struct ectx *x, uint32_t k, char *slot)
{
	(void)e, (void)x, (void)k, (void)slot; /* before_cb keeps it, as read */
	return 0;
}

static int
nvme_restore(struct zinf_engine *e, uint32_t k, const char *slot)
{
	const void *st[ZINF_OPTIM_MAX_PARTS] = {0};
	uint64_t len = e->sg_end[k] - eng_sg_start(e, k);
	for (uint32_t i = 0; i < e->nparts; i++) {
		st[i] = slot + e->sp.off[i];
	}
	/* a shared master is not written here: eng_spec_restore puts it home with the 16-bit
	   values */
	int ret = zinf_step_load(e->os.step, k, st);
	for (uint32_t i = eng_master_shared(e) ? 1 : 0; i < e->nparts && !ret; i++) {
		e->win.nvme_write_bytes += part_size(e, i, len);
	}
	return ret;
}

const struct eng_otier eng_otier_nvme = {
	.name = "nvme",
	.whole = true,
	.reads_ahead = true,
	.window = true,
	.setup = nvme_setup,
	.pool = nvme_pool,
	.free = nvme_free,
	.write_master = nvme_write_master,
	.read_master = nvme_read_master,
	.bounce_bytes = bounce_none,
	.visit = nvme_visit,
	.begin = nvme_begin,
	.step = nvme_step,
	.skip = nvme_skip,
	.finish = nvme_finish,
	.keep = nvme_keep,
	.restore = nvme_restore,
};

/* ---- the state visitor (engine_module.h) ---------------------------------------------------- */

size_t
eng_state_bounce_bytes(const struct zinf_engine *e)
{
	return e->ot->bounce_bytes(e);
}

int
eng_state_visit(struct zinf_engine *e, uint32_t k, bool write, eng_visit_fn fn, void *ctx,
		void *bounce, struct zinf_stream *cs)
{
	return e->ot->visit(e, k, write, fn, ctx, bounce, cs ? cs : e->cs);
}
