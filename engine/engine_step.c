/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine_step.c: the optimizer step of the engine. The fp32 master and the optimizer's
 * parts live over the flat partition: tier none in device memory, tier cpu in the pinned
 * pool's CPU region (both stepped here, sub-group by sub-group, cut every ZINF_STEP_CHUNK
 * elements with index0 the piece's flat index, as zinf_step cuts), tier nvme in a swap space
 * stepped by zinf_step with the engine's sub-group ends, a copy callback and a before callback
 * (the speculative step's reserve keeps the state as read). The new 16-bit
 * values go home through eng_param_home_write; stages 1-2 all-gather them after the step and
 * stage 3 refreshes its persistent parameters. Also zinf_engine_step() (end of a micro-batch;
 * with clipping or fp16 the boundary asks engine_clip.c for the grad_scale, or skips the step
 * on an fp16 overflow, and engine_spec.c keeps, redoes or restores the sub-groups stepped
 * speculatively during backward) and zinf_engine_read_master(). Gradient reduction is
 * engine_grad.c's.
 */
#include <errno.h>
#include <string.h>

#include "engine/engine_internal.h"

/* zinf_step's before_fn: sub-group k's state as read, before the optimizer runs on it. */
static int
before_cb(void *ctx, uint32_t k, const void *const parts[], uint64_t len)
{
	struct zinf_engine *e = ctx;
	if (e->cb == &e->w.x && e->sp.sg_slot && e->sp.sg_slot[k] >= 0) {
		/* speculated on the worker: keep its previous state in its slot of the reserve */
		return eng_spec_save_nvme(e, k, parts, len);
	}
	return 0;
}

static int
copy_cb(void *ctx, uint32_t k, const void *copy, uint64_t n)
{
	struct zinf_engine *e = ctx;
	return eng_param_home_write(e, e->cb, eng_sg_start(e, k), copy, false, n);
}

static uint64_t
bucket_cap(const struct zinf_engine *e)
{
	uint64_t total = 0, maxp = 0;
	for (uint32_t i = 0; i < e->n_params; i++) {
		total += e->params[i].part.padded;
		maxp = ZINF_MAX(maxp, e->params[i].part.padded);
	}
	uint64_t cap = ZINF_MAX(ZINF_MIN(e->o.reduce_bucket_size, total), maxp);
	return ZINF_ALIGN_UP(cap, (uint64_t)e->world);
}

static int
nvme_step(struct zinf_engine *e, uint64_t cpu_bytes)
{
	int ret = eng_open_swap(e, &e->o.offload_optimizer, "optim", &e->oswap);
	if (ret) {
		return ret;
	}
	struct zinf_step_opts so;
	zinf_step_opts_init(&so);
	so.n = e->flat_n;
	so.sub_group_size = e->o.sub_group_size;
	so.tier = ZINF_TIER_NVME;
	so.swap = e->oswap;
	so.optimizer = e->opt;
	so.copy_dtype = e->o.dtype;
	so.rank = e->rank;
	so.sub_group_ends = e->sg_end;
	so.n_sub_groups = e->n_sg;
	so.copy_fn = copy_cb;
	so.copy_ctx = e;
	so.before_fn = before_cb;
	so.before_ctx = e;
	so.schedule = (enum zinf_step_schedule)e->o.optimizer_schedule;
	uint32_t align = zinf_swap_align(e->oswap);
	struct zinf_pool_opts po;
	zinf_pool_opts_init(&po);
	po.buffer_bytes = zinf_step_buffer_bytes(&so, align);
	po.buffer_count = e->o.offload_optimizer.buffer_count;
	po.cpu_bytes = cpu_bytes + eng_gwin_bytes(e, align) + eng_spec_bytes(e, align);
	po.align = align;
	po.pin_memory = e->o.offload_optimizer.pin_memory;
	po.pin_fallback = true;
	po.io = e->io;
	po.device = e->dev;
	po.what = "offload_optimizer";
	if (po.buffer_bytes == 0) {
		return ENG_FAIL(e, -EINVAL, "init: optimizer sub-groups too large for a buffer");
	}
	if ((ret = zinf_pool_create(&po, &e->opool))) {
		return ENG_FAIL(e, ret, "init: pinned pool for offload_optimizer");
	}
	so.pool = e->opool;
	if ((ret = zinf_step_create(&so, &e->step))) {
		return ENG_FAIL(e, ret, "init: optimizer step over NVMe");
	}
	if ((ret = eng_gwin_declare(e))) {
		return ret;
	}
	if ((ret = zinf_swap_reserve(e->oswap))) {
		return ENG_FAIL(e, ret, "init: reserving the optimizer's swap files");
	}
	if ((ret = eng_gwin_alloc(e, align))) {
		return ret;
	}
	return eng_spec_setup(e, align);
}

int
eng_step_setup(struct zinf_engine *e)
{
	int r0 = e->o.step_during_backward ? eng_worker_start(e) : 0;
	if (r0 || (r0 = eng_clip_setup(e))) {
		return r0;
	}
	size_t ds = eng_dsize(e);
	uint64_t chunk = ZINF_MIN((uint64_t)ZINF_STEP_CHUNK, e->max_sg);
	int ret;
	e->bucket_cap = bucket_cap(e);
	if (e->otier == ZINF_OFFLOAD_NONE) {
		for (uint32_t i = 0; i < e->nparts; i++) {
			uint32_t pb = zinf_optimizer_part_bytes(e->opt, i);
			if ((ret = zinf_device_alloc(e->dev, e->flat_n * pb, &e->state[i])) ||
			    (ret = zinf_device_fill(e->cs, e->state[i],
						    pb == 4 ? ZINF_F32 : ZINF_BF16, 0.0f,
						    e->flat_n))) {
				return ENG_FAIL(e, ret, "init: device memory for optimizer part %s",
						zinf_optimizer_part_name(e->opt, i));
			}
		}
		if ((ret = zinf_device_alloc(e->dev, e->flat_n * 4, (void **)&e->grad_part)) ||
		    (ret = zinf_device_fill(e->cs, e->grad_part, ZINF_F32, 0.0f, e->flat_n)) ||
		    (ret = zinf_device_alloc(e->dev, chunk * ds, &e->dev_copy))) {
			return ENG_FAIL(e, ret, "init: device memory for the gradient partition");
		}
		if ((ret = eng_spec_setup(e, 0))) {
			return ret;
		}
		return zinf_stream_sync(e->cs);
	}
	/* pinned: the bucket staging (this rank's piece of a bucket), the copy chunk; cpu: the
	   gradient partition and the state; nvme: the gradient window (nvme_step) */
	uint64_t stage = e->bucket_cap / (uint64_t)e->W;
	uint64_t cpu = ZINF_ALIGN_UP(stage * 4, 4096) + ZINF_ALIGN_UP(chunk * ds, 4096);
	if (e->otier == ZINF_OFFLOAD_CPU) {
		cpu += ZINF_ALIGN_UP(e->flat_n * 4, 4096) + eng_spec_bytes(e, 4096);
		for (uint32_t i = 0; i < e->nparts; i++) {
			cpu += ZINF_ALIGN_UP(e->flat_n * zinf_optimizer_part_bytes(e->opt, i),
					     4096);
		}
		struct zinf_pool_opts po;
		zinf_pool_opts_init(&po);
		po.cpu_bytes = cpu;
		po.pin_memory = e->o.offload_optimizer.pin_memory;
		po.pin_fallback = true;
		po.device = e->dev;
		po.what = "offload_optimizer";
		if ((ret = zinf_pool_create(&po, &e->opool))) {
			return ENG_FAIL(e, ret, "init: pinned pool for offload_optimizer");
		}
		for (uint32_t i = 0; i < e->nparts; i++) {
			uint64_t b = e->flat_n * zinf_optimizer_part_bytes(e->opt, i);
			if ((ret = zinf_pool_cpu_alloc(e->opool, b, &e->state[i]))) {
				return ENG_FAIL(e, ret, "init: optimizer part %s",
						zinf_optimizer_part_name(e->opt, i));
			}
			memset(e->state[i], 0, b);
		}
	} else if ((ret = nvme_step(e, cpu))) {
		return ret;
	}
	if (e->otier == ZINF_OFFLOAD_CPU) {
		if ((ret = zinf_pool_cpu_alloc(e->opool, e->flat_n * 4, (void **)&e->grad_part))) {
			return ENG_FAIL(e, ret, "init: pinned gradient partition");
		}
		memset(e->grad_part, 0, e->flat_n * 4);
	}
	if ((ret = zinf_pool_cpu_alloc(e->opool, stage * 4, (void **)&e->host_stage)) ||
	    (ret = zinf_pool_cpu_alloc(e->opool, chunk * ds, &e->host_copy))) {
		return ENG_FAIL(e, ret, "init: pinned gradient staging");
	}
	return e->otier == ZINF_OFFLOAD_CPU ? eng_spec_setup(e, 4096) : 0;
}

void
eng_step_free(struct zinf_engine *e)
{
	eng_worker_stop(e);
	eng_spec_free(e);
	eng_clip_free(e);
	zinf_step_destroy(e->step);
	e->step = NULL;
	if (e->otier == ZINF_OFFLOAD_NONE) {
		for (uint32_t i = 0; i < ZINF_OPTIM_MAX_PARTS; i++) {
			zinf_device_free(e->dev, e->state[i]);
		}
		zinf_device_free(e->dev, e->grad_part);
		zinf_device_free(e->dev, e->dev_copy);
	}
	memset(e->state, 0, sizeof(e->state));
	e->grad_part = NULL;
	e->dev_copy = e->host_copy = NULL;
	e->host_stage = NULL;
	zinf_pool_destroy(e->opool);
	e->opool = NULL;
	zinf_swap_destroy(e->oswap);
	e->oswap = NULL;
	eng_gwin_free(e);
}

int
eng_step_load_master(struct zinf_engine *e, uint32_t k, const float *master)
{
	uint64_t start = eng_sg_start(e, k), len = e->sg_end[k] - start;
	int ret;
	if (e->otier == ZINF_OFFLOAD_NONE) {
		ret = zinf_device_copy(e->cs, (float *)e->state[0] + start, master, len * 4,
				       ZINF_COPY_H2D);
		if (!ret) {
			ret = zinf_stream_sync(e->cs);
		}
	} else if (e->otier == ZINF_OFFLOAD_CPU) {
		memcpy((float *)e->state[0] + start, master, len * 4);
		ret = 0;
	} else {
		const void *st[ZINF_OPTIM_MAX_PARTS] = {master};
		ret = zinf_step_load(e->step, k, st);
	}
	return ret ? ENG_FAIL(e, ret, "init: sub-group %u: writing the master weights", k) : 0;
}

/* The optimizer on sub-group k, tiers none and cpu, its copies on x->s; the gradient of k is
 * final in grad_part as seen from the host (host tiers) or from x->s (tier none). */
int
eng_step_sub_group(struct zinf_engine *e, const struct ectx *x, uint32_t k)
{
	int64_t step = e->steps + 1;
	uint64_t start = eng_sg_start(e, k), end = e->sg_end[k];
	bool on_dev = e->otier == ZINF_OFFLOAD_NONE;
	bool host_dev = e->host_comm; /* the host device: device memory is host memory */
	void *copy = on_dev ? e->dev_copy : e->host_copy;
	int ret = 0;
	for (uint64_t off = start; off < end && !ret; off += ZINF_STEP_CHUNK) {
		size_t n = (size_t)ZINF_MIN((uint64_t)ZINF_STEP_CHUNK, end - off);
		void *parts[ZINF_OPTIM_MAX_PARTS] = {0};
		for (uint32_t i = 0; i < e->nparts; i++) {
			parts[i] = (char *)e->state[i] + off * zinf_optimizer_part_bytes(e->opt, i);
		}
		double t0 = zinf_now_s();
		if (on_dev && !host_dev) {
			struct zinf_adam_opts a;
			zinf_adam_opts_init(&a);
			a.lr = e->step_lr, a.beta1 = e->step_beta1, a.beta2 = e->step_beta2;
			a.eps = e->o.optimizer.eps, a.weight_decay = e->o.optimizer.weight_decay;
			a.adamw_mode = e->o.optimizer.kind == ZINF_OPTIM_ADAMW;
			a.bias_correction = e->o.optimizer.bias_correction;
			ret = zinf_device_adam(x->s, &a, step, e->step_scale, parts[0],
					       e->grad_part + off, ZINF_F32, parts[1], parts[2], n,
					       copy, e->o.dtype);
		} else {
			ret = zinf_optimizer_step(e->opt, step, e->step_scale, parts,
						  e->grad_part + off, ZINF_F32, off, n, copy,
						  e->o.dtype);
		}
		x->st->optimizer_s += zinf_now_s() - t0;
		if (!ret) {
			ret = eng_param_home_write(e, x, off, copy, on_dev, n);
		}
		if (!ret && on_dev && host_dev) {
			ret = zinf_stream_sync(x->s); /* the copy buffer is reused on this thread */
		}
	}
	return ret ? ENG_FAIL(e, ret, "step %" PRId64 ": sub-group %u", step, k) : 0;
}

/* Sub-group k on the calling thread's context x (the worker's or the caller's). */
int
eng_step_one(struct zinf_engine *e, struct ectx *x, uint32_t k)
{
	if (!e->step) {
		return eng_step_sub_group(e, x, k);
	}
	e->cb = x;
	int ret = zinf_step_ready(e->step, k, eng_grad_of(e, k), ZINF_F32);
	return ret ? ENG_FAIL(e, ret, "step %" PRId64 ": sub-group %u", e->steps + 1, k) : 0;
}

/* The end of the step: every sub-group stepped (the worker's, then the rest here). */
static int
step_all(struct zinf_engine *e)
{
	struct eworker *w = &e->w;
	int ret = e->sp.err; /* the speculative step's resolution failed (engine_spec.c) */
	e->sp.err = 0;
	if (w->started && (!e->gate || w->tail > 0)) {
		/* every sub-group went to the worker (with clipping or fp16: the speculation held,
		   and the others followed) */
		int r2 = eng_worker_end(e, false);
		return ret ? ret : r2;
	}
	if (ret) {
		return ret;
	}
	if (e->step) {
		/* the gradient window's resident sub-groups first: no I/O for them */
		ret = zinf_step_begin(e->step, e->steps + 1, e->step_scale, NULL, false);
		for (int pass = e->gw.n ? 0 : 1; pass < 2 && !ret; pass++) {
			for (uint32_t k = 0; k < e->n_sg && !ret; k++) {
				if (e->gw.n && (e->gw.sg_has[k] == GW_STEPPED ||
						(pass == 0 && e->gw.sg_slot[k] < 0))) {
					continue;
				}
				if (e->gw.n && (ret = eng_gwin_load(e, k))) {
					break;
				}
				ret = eng_step_one(e, &e->main, k);
				if (e->gw.n) {
					eng_gwin_drop(e, k);
				}
			}
		}
		int r2 = zinf_step_finish(e->step);
		return ret ? ret : r2;
	}
	for (uint32_t k = 0; k < e->n_sg && !ret; k++) {
		ret = eng_step_one(e, &e->main, k);
	}
	return ret;
}

/* The boundary's step skipped (fp16 overflow): no sub-group stepped, nothing to gather; the
 * gradient window starts empty again, and the trainer's next work follows the engine's. */
static int
step_skip(struct zinf_engine *e)
{
	int ret = zinf_stream_sync(e->cs);
	if (e->gw.n) {
		eng_gwin_reset(e);
	}
	if (!ret) {
		ret = eng_order(e, e->cs, e->compute);
	}
	return ret;
}

/* The whole step at the accumulation boundary: every sub-group, then the all-gathers. */
int
eng_step_run(struct zinf_engine *e)
{
	int ret = zinf_stream_sync(e->cs); /* every accumulation is in grad_part */
	if (ret) {
		ret = ENG_FAIL(e, ret, "step: the engine stream failed");
		return eng_agree(e, ret, "step"); /* the others stop too */
	}
	ret = step_all(e);
	if (e->gw.n) {
		eng_gwin_reset(e); /* every gradient was stepped: the next window starts empty */
	}
	if (e->step) {
		struct zinf_step_stats st = {.size = sizeof(st)};
		if (!zinf_step_get_stats(e->step, &st)) {
			e->win.nvme_read_bytes += st.read_bytes;
			e->win.nvme_write_bytes += st.write_bytes;
			e->win.optimizer_s += st.optim_s;
		}
	}
	/* before the all-gathers: no rank waits for a failed one */
	ret = eng_agree(e, ret, "step");
	if (ret) {
		return ret;
	}
	if ((ret = eng_gather_after_step(e)) || (ret = eng_order(e, e->cs, e->compute))) {
		return ret;
	}
	e->steps++;
	return 0;
}

static int
step_call(struct zinf_engine *e)
{
	int ret = 0;
	for (uint32_t i = 0; i < e->n_layers; i++) {
		if (e->layers[i].fetched) {
			return ENG_FAIL(e, -EINVAL,
					"step: layer %d is still fetched (release it "
					"first)",
					e->layers[i].layer);
		}
	}
	for (uint32_t i = 0; i < e->n_params; i++) {
		if (!e->params[i].grad_done) {
			return ENG_FAIL(e, -EINVAL,
					"step: no gradient for parameter \"%s\" in "
					"micro-batch %u",
					e->params[i].name, e->micro);
		}
	}
	(void)eng_job_finish(e); /* a background save not yet published (no gradient came first) */
	double t0 = zinf_now_s();
	if (e->window_t0 < 0) {
		e->window_t0 = t0;
	}
	/* the window is being closed: from here a failure leaves it half done (any errno) */
	eng_commit(e);
	uint32_t early = e->w.tail; /* handed to the worker before this call */
	e->sp.closed = true;	    /* what becomes final now waits for the norm */
	if ((ret = eng_order(e, e->compute, e->cs)) || (ret = eng_grad_flush(e))) {
		return ret;
	}
	for (uint32_t i = 0; i < e->n_params; i++) {
		e->params[i].grad_done = false;
	}
	e->grads_seen = 0;
	e->micro_steps++;
	if (e->o.stage == 3) {
		eng_trace_micro_end(e);
	}
	if (e->micro + 1 < e->o.gradient_accumulation_steps) {
		e->micro++;
		return 0;
	}
	/* clipping or fp16: the global norm decides the grad_scale, or skips the step; what was
	   stepped during backward on the assumption of no clipping is kept, redone or restored */
	float gs = 1.0f;
	int skip = e->gate ? eng_clip_decide(e, &gs) : 0;
	if (skip < 0) {
		if (eng_spec_on(e)) {
			eng_worker_end(e, true); /* nothing in flight for the failed engine */
		}
		return skip;
	}
	if (e->gate && eng_spec_on(e)) {
		if ((ret = eng_spec_resolve(e, skip, gs))) {
			return ret;
		}
	} else if (e->gate) {
		e->step_scale = gs;
		/* a skip: the speculating ranks agree on their roll-back (eng_spec_resolve); a rank
		   not speculating (its device had no room for the reserve) joins that collective */
		if (skip && (ret = eng_agree(e, 0, "step (skipped)"))) {
			return ret;
		}
	}
	if ((ret = skip ? step_skip(e) : eng_step_run(e))) {
		return ret;
	}
	if (e->o.stage == 3 && (ret = eng_fetch_drop_all(e))) {
		return ret;
	}
	e->micro = 0;
	for (uint32_t k = 0; k < e->n_sg; k++) {
		e->sg_pending[k] = e->sg_params[k];
		if (e->sg_handed) {
			e->sg_handed[k] = 0;
		}
		if (e->sp.sg_slot) {
			e->sp.sg_slot[k] = -1;
		}
	}
	double t1 = zinf_now_s();
	e->win.exposed_step_s = t1 - t0;
	e->win.step_s = t1 - e->window_t0;
	e->win.sub_groups = e->n_sg;
	e->win.stepped_during_backward = early;
	eng_param_io_stats(e);
	e->last = e->win;
	memset(&e->win, 0, sizeof(e->win));
	e->window_t0 = -1;
	return skip ? 2 : 1;
}

int
zinf_engine_step(struct zinf_engine *e)
{
	int ret = eng_begin(e, "step", ENG_FAILS, true);
	return ret ? ret : eng_return(e, step_call(e));
}

/* All-gather part floats per rank (mine is inside full, host memory) into full. */
static int
gather_master(struct zinf_engine *e, float *mine, float *full, uint64_t part, uint64_t padded)
{
	if (e->host_comm) {
		return zinf_comm_all_gather(e->comm, mine, full, part, ZINF_F32, NULL);
	}
	/* nccl: device buffers, ordered on cs (the communicator's stream) */
	float *dev = NULL;
	int ret = zinf_device_alloc(e->dev, padded * 4, (void **)&dev);
	if (!ret) {
		ret = zinf_device_copy(e->cs, dev + (mine - full), mine, part * 4, ZINF_COPY_H2D);
	}
	if (ret) { /* the others wait for this rank in the all-gather: they are told */
		ret = ENG_FAIL(e, ret, "read_master: this rank's part on the device");
	} else {
		ret = zinf_comm_all_gather(e->comm, dev + (mine - full), dev, part, ZINF_F32, NULL);
	}
	if (!ret) {
		ret = zinf_device_copy(e->cs, full, dev, padded * 4, ZINF_COPY_D2H);
	}
	if (!ret) {
		ret = zinf_stream_sync(e->cs);
	}
	zinf_device_free(e->dev, dev);
	return ret;
}

/*
 * read_master's host buffer, which the all-gather of the parts writes on "mpi": left to MPI
 * (zinf_leave) once the communicator failed: an all-gather given up on a notice or a timeout
 * may still be written by a rank that joined it.
 */
static float *
master_buf_alloc(uint64_t n)
{
	return zinf_calloc(n, sizeof(float));
}

static int
read_master(struct zinf_engine *e, uint32_t id, float *out)
{
	int ret = 0;
	if (id >= e->n_params || !out) {
		return ENG_FAIL(e, -EINVAL, "read_master: %s",
				out ? "unknown parameter id" : "NULL out");
	}
	if (e->micro != 0 || e->grads_seen != 0) {
		return ENG_FAIL(e, -EINVAL, "read_master: inside an accumulation window");
	}
	(void)eng_job_finish(e); /* a background save reads the state: published first */
	if (e->W > 1) {
		/* the ranks all-gather the parts: a rank that fails from here leaves that
		   collective out (any errno), and the others are told */
		eng_commit(e);
	}
	struct eparam *p = &e->params[id];
	uint64_t part = p->part.part, k0 = eng_sg_start(e, p->sg);
	uint64_t sglen = e->sg_end[p->sg] - k0;
	float *full = master_buf_alloc(p->part.padded);
	float *sg = e->step ? zinf_calloc(sglen, sizeof(float)) : NULL;
	float *mine = full ? full + (size_t)(e->W == 1 ? 0 : e->rank) * part : NULL;
	bool gave = false; /* the all-gather into full was given up: MPI may still write it */
	if (!full || (e->step && !sg)) {
		ret = ENG_FAIL(e, -ENOMEM, "read_master \"%s\": out of memory", p->name);
	} else if (e->otier == ZINF_OFFLOAD_NONE) {
		ret = zinf_device_copy(e->cs, mine, (float *)e->state[0] + p->flat_off, part * 4,
				       ZINF_COPY_D2H);
		if (!ret) {
			ret = zinf_stream_sync(e->cs);
		}
	} else if (e->otier == ZINF_OFFLOAD_CPU) {
		memcpy(mine, (float *)e->state[0] + p->flat_off, part * 4);
	} else {
		void *st[ZINF_OPTIM_MAX_PARTS] = {sg};
		ret = zinf_step_save(e->step, p->sg, st);
		if (!ret) {
			memcpy(mine, sg + (p->flat_off - k0), part * 4);
		}
	}
	if (ret && e->W > 1) {
		/* the others wait for this rank in the all-gather of the parts: they are told (any
		   errno: this rank leaves a collective out, its communicator is of no more use) */
		ret = ENG_FAIL(e, ret, "read_master: parameter \"%s\": %s", p->name, eng_cause(e));
		goto out;
	}
	if (!ret && e->W > 1) {
		bool was_failed = zinf_comm_failed(e->comm) != 0;
		ret = gather_master(e, mine, full, part, p->part.padded);
		gave = e->host_comm && !was_failed && zinf_comm_failed(e->comm);
	}
	if (ret) {
		ret = ENG_FAIL(e, ret, "read_master: parameter \"%s\": %s", p->name, eng_cause(e));
	} else {
		memcpy(out, full, p->numel * sizeof(float));
	}
out:
	if (!gave) {
		zinf_free(full);
	} else {
		zinf_leave(full); /* MPI's (see master_buf_alloc) */
	}
	zinf_free(sg);
	return ret;
}

int
zinf_engine_read_master(struct zinf_engine *e, uint32_t id, float *out)
{
	int ret = eng_begin(e, "read_master", ENG_KEEPS, true);
	return ret ? ret : eng_return(e, read_master(e, id, out));
}
