/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine_step.c: the optimizer step of the engine: every sub-group stepped (by the step
 * worker during backward, or here after it) through the optimizer tier's table (e->ot->step:
 * engine_otier.c, which holds where the state lives and how each tier steps it), the new 16-bit
 * values home through the parameter tier (eng_param_home_write), then the ranks' agreement on
 * the outcome; stages 1-2 all-gather the new values after the step and stage 3 refreshes its
 * persistent parameters. Also zinf_engine_step() (end of a micro-batch;
 * with clipping or fp16 the boundary asks engine_clip.c for the grad_scale, or skips the step
 * on an fp16 overflow, and engine_spec.c keeps, redoes or restores the sub-groups stepped
 * speculatively during backward) and zinf_engine_read_master(). Gradient reduction is
 * engine_grad.c's.
 */
#include <errno.h>
#include <string.h>

#include "engine/engine_internal.h"

/* The end of the step: every sub-group stepped (the worker's, then the rest here). */
static int
step_all(struct zinf_engine *e)
{
	struct eworker *w = &e->w;
	int ret = e->sp.err; /* the speculative step's resolution failed (engine_spec.c) */
	e->sp.err = 0;
	if (w->started && (!e->cl.gate || w->tail > 0)) {
		/* every sub-group went to the worker (with clipping or fp16: the speculation held,
		   and the others followed) */
		int r2 = eng_worker_end(e, false);
		return ret ? ret : r2;
	}
	if (ret) {
		return ret;
	}
	/* with the gradient window, its resident sub-groups first: no I/O for them */
	ret = e->ot->begin(e);
	for (int pass = e->gr.gw.n ? 0 : 1; pass < 2 && !ret; pass++) {
		for (uint32_t k = 0; k < e->n_sg && !ret; k++) {
			if (e->gr.gw.n && (e->gr.gw.sg_has[k] == GW_STEPPED ||
					   (pass == 0 && e->gr.gw.sg_slot[k] < 0))) {
				continue;
			}
			if (e->gr.gw.n && (ret = eng_gwin_load(e, k))) {
				break;
			}
			ret = e->ot->step(e, &e->main, k, eng_grad_of(e, k));
			if (e->gr.gw.n) {
				eng_gwin_drop(e, k);
			}
		}
	}
	int r2 = e->ot->finish(e, false);
	return ret ? ret : r2;
}

/* The boundary's step skipped (fp16 overflow): no sub-group stepped, nothing to gather; the
 * gradient window starts empty again, and the trainer's next work follows the engine's. */
static int
step_skip(struct zinf_engine *e)
{
	int ret = zinf_stream_sync(e->cs);
	if (e->gr.gw.n) {
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
		return eng_agree_step(e, ret, "step"); /* the others stop too */
	}
	ret = step_all(e);
	if (e->gr.gw.n) {
		eng_gwin_reset(e); /* every gradient was stepped: the next window starts empty */
	}
	/* before the all-gathers: no rank waits for a failed one */
	ret = eng_agree_step(e, ret, "step");
	if (ret) {
		return ret;
	}
	if ((ret = eng_gather_after_step(e)) || (ret = eng_order(e, e->cs, e->compute))) {
		return ret;
	}
	e->steps++;
	return 0;
}

/*
 * At the boundary, after eng_clip_decide (skip: 1; else grad_scale gs): keep, redo or restore
 * the speculated sub-groups. The decision is the same on every rank (the global norm), so the
 * ranks take the same branch. Errors of the right and redo cases reach eng_step_run's
 * agreement through e->sp.err; a skip agrees here.
 */
static int
spec_resolve(struct zinf_engine *e, int skip, float gs)
{
	struct espec *sp = &e->sp;
	struct eworker *w = &e->w;
	int ret = eng_worker_wait(e); /* the worker is done with the assumed grad_scale */
	e->step_scale = gs;
	bool right = !skip && memcmp(&gs, &sp->scale0, sizeof(gs)) == 0;
	if (right) {
		/* the assumption held: the speculated sub-groups are final; the others to the
		   worker (the gradient window's resident ones first: no read for them) */
		for (uint32_t k = 0; k < e->n_sg && e->gr.gw.n; k++) {
			if (sp->sg_slot[k] >= 0) {
				eng_gwin_drop(e, k);
			}
		}
		for (int pass = e->gr.gw.n ? 0 : 1; pass < 2; pass++) {
			for (uint32_t k = 0; k < e->n_sg; k++) {
				if (!e->w.sg_handed[k] && (pass == 1 || e->gr.gw.sg_slot[k] >= 0)) {
					eng_worker_hand(e, k);
				}
			}
		}
		sp->err = ret;
		e->win.rolled_back = 0;
		return 0;
	}
	/* the worker's pass ends here (the sub-groups not speculated left out of it); the
	   speculated ones get their previous state back */
	bool began = w->began || w->tail > 0;
	int r2 = began ? eng_worker_end(e, true) : 0;
	ret = ret ? ret : r2;
	uint32_t rolled = 0;
	for (uint32_t k = 0; k < e->n_sg && !ret; k++) {
		if (sp->sg_slot[k] >= 0) {
			ret = eng_spec_restore(e, k, skip != 0);
			rolled++;
		}
	}
	e->win.rolled_back = rolled;
	if (!skip) {
		sp->err = ret; /* eng_step_run steps every sub-group with gs, then agrees */
		return 0;
	}
	return eng_agree_step(e, ret, "step (rolling back the speculative step)");
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
	uint32_t npass = eng_pass_n(e); /* micro-batches this call ends */
	for (uint32_t i = 0; i < e->n_params; i++) {
		if (e->params[i].grads < npass) {
			return ENG_FAIL(e, -EINVAL,
					"step: no gradient for parameter \"%s\" in "
					"micro-batch %u%s",
					e->params[i].name, e->micro + e->params[i].grads,
					npass > 1 ? " of the vertical pass" : "");
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
		e->params[i].grads = 0;
	}
	e->grads_seen = 0;
	e->micro_steps += npass;
	e->vert_n = 0; /* the next pass is one micro-batch unless zinf_engine_vertical says */
	if (e->o.stage == 3) {
		eng_trace_micro_end(e); /* a vertical pass fetched as one micro-batch does */
	}
	if (e->micro + npass < e->o.gradient_accumulation_steps) {
		e->micro += npass;
		return 0;
	}
	/* clipping or fp16: the global norm decides the grad_scale, or skips the step; what was
	   stepped during backward on the assumption of no clipping is kept, redone or restored */
	float gs = 1.0f;
	int skip = e->cl.gate ? eng_clip_decide(e, &gs) : 0;
	if (skip < 0) {
		if (eng_spec_on(e)) {
			eng_worker_end(e, true); /* nothing in flight for the failed engine */
		}
		return skip;
	}
	if (e->cl.gate && eng_spec_on(e)) {
		if ((ret = spec_resolve(e, skip, gs))) {
			return ret;
		}
	} else if (e->cl.gate) {
		e->step_scale = gs;
		/* a skip: the speculating ranks agree on their roll-back (spec_resolve); a rank
		   not speculating (its device had no room for the reserve) joins that collective */
		if (skip && (ret = eng_agree_step(e, 0, "step (skipped)"))) {
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
	e->win_opened = false;
	for (uint32_t k = 0; k < e->n_sg; k++) {
		e->gr.sg_pending[k] = e->sg_params[k];
		if (e->w.sg_handed) {
			e->w.sg_handed[k] = 0;
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
 * (zc_leave) once the communicator failed: an all-gather given up on a notice or a timeout
 * may still be written by a rank that joined it.
 */
static float *
master_buf_alloc(uint64_t n)
{
	return zc_calloc(n, sizeof(float));
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
	float *sg = e->ot->whole ? zc_calloc(sglen, sizeof(float)) : NULL;
	float *mine = full ? full + (size_t)(e->W == 1 ? 0 : e->rank) * part : NULL;
	bool gave = false; /* the all-gather into full was given up: MPI may still write it */
	if (!full || (e->ot->whole && !sg)) {
		ret = ENG_FAIL(e, -ENOMEM, "read_master \"%s\": out of memory", p->name);
	} else {
		ret = e->ot->read_master(e, p, mine, sg);
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
		zc_free(full);
	} else {
		zc_leave(full); /* MPI's (see master_buf_alloc) */
	}
	zc_free(sg);
	return ret;
}

int
zinf_engine_read_master(struct zinf_engine *e, uint32_t id, float *out)
{
	int ret = eng_begin(e, "read_master", ENG_KEEPS, true);
	return ret ? ret : eng_return(e, read_master(e, id, out));
}
