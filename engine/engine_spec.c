/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine_spec.c: the speculative step during backward, with roll-back. With
 * gradient clipping or fp16 (e->cl.gate) the step's grad_scale is known only once every rank's
 * gradient norm is (engine_clip.c). With the step worker on (step_during_backward), the
 * boundary micro-batch's sub-groups are nevertheless handed to the worker as they become
 * final, stepped with the assumed grad_scale 1/S (no clipping, no overflow: the common case),
 * each keeping its previous state in a slot of a bounded reserve until zinf_engine_step has
 * the norm (engine_step.c, spec_resolve):
 *
 *   - the assumption held (not skipped, the decided grad_scale has the same bits): nothing to
 *     undo; the sub-groups not speculated go to the worker as without clipping;
 *   - clipping applies: the speculated sub-groups get their previous state back and every
 *     sub-group is stepped after backward with the decided grad_scale (their gradients were
 *     kept: grad_part, or the gradient window's slot or file, engine_gwin.c's GW_SPEC);
 *   - fp16 overflow (skip): the speculated sub-groups get their previous state and 16-bit
 *     values back.
 *
 * The stepping itself is the optimizer tier's (engine_otier.c; the same function either way), so
 * that the results are the bits of the step after backward. A slot holds every optimizer part of
 * one sub-group and its 16-bit values: device memory for tier none (without it, a warning and no
 * speculation), the optimizer pool's CPU region for cpu and nvme; slots =
 * offload_optimizer.buffer_count, at most one per sub-group but the last (which becomes final in
 * the final call, when the norm is close); when they are all taken the remaining sub-groups wait
 * for the norm. The previous state is copied before the step: tiers none and cpu from the state
 * arrays; nvme from the step's pool buffer in zinf_step's before_fn (engine_otier.c's before_cb,
 * through the keep_read hook), once the sub-group's reads completed and before the optimizer runs
 * over it, so that keeping it costs no read of its own. The 16-bit values come from their home
 * (eng_param_home_read); with a bf16 master that shares that home (eng_master_shared) they are
 * the master keep_read keeps (the step filled it from the home; one region of the slot for both),
 * and every roll-back puts them back with the state (the redo's fill reads the master from
 * there). With the optimizer on NVMe the step of the speculated sub-groups is a zinf_step pass of
 * its own: the sub-groups not stepped in it are left out with zinf_step_skip (before_fn never sees
 * them), and a redo is a second pass after zinf_step_load put the previous states back (on the
 * calling thread: before_fn keeps nothing there, only the worker's speculated sub-groups are
 * kept). Not here: the norm and the decision (engine_clip.c), the worker (engine_worker.c).
 */
#include <errno.h>
#include <string.h>

#include "engine/engine_internal.h"

static uint32_t
spec_slots(const struct zinf_engine *e)
{
	if (!e->cl.gate || !e->o.step_during_backward) {
		return 0;
	}
	/* the last sub-group to become final is never speculated (it becomes final in the final
	   zinf_engine_step call, once the norm is close): one sub-group, no reserve */
	uint32_t n = ZINF_MAX(e->o.offload_optimizer.buffer_count, 1u);
	return ZINF_MIN(n, e->n_sg - 1);
}

/* The slot layout: each part aligned to `align`, then the 16-bit values (off[nparts]). A master
 * shared with the 16-bit values (eng_master_shared: both bf16) is one region with them, at 0:
 * keep_read keeps part 0 there and eng_spec_restore puts it home from there. Returns the
 * stride. */
static uint64_t
layout(const struct zinf_engine *e, uint32_t align, uint64_t off[ZINF_OPTIM_MAX_PARTS + 1])
{
	uint64_t at = 0;
	uint32_t i = 0;
	if (eng_master_shared(e)) {
		off[0] = off[e->nparts] = 0;
		at = ZINF_ALIGN_UP(e->max_sg * eng_dsize(e), (uint64_t)align);
		i = 1;
	}
	for (; i < e->nparts; i++) {
		off[i] = at;
		at = ZINF_ALIGN_UP(at + zinf_optimizer_part_size(e->opt, i, e->max_sg),
				   (uint64_t)align);
	}
	if (eng_master_shared(e)) {
		return at;
	}
	off[e->nparts] = at;
	return ZINF_ALIGN_UP(at + e->max_sg * eng_dsize(e), (uint64_t)align);
}

uint64_t
eng_spec_bytes(const struct zinf_engine *e, uint32_t align)
{
	uint64_t off[ZINF_OPTIM_MAX_PARTS + 1];
	uint32_t n = spec_slots(e);
	align = ZINF_MAX(align, 4096u);
	return n ? ZINF_ALIGN_UP(n * layout(e, align, off), (uint64_t)align) : 0;
}

static int keep_read(struct zinf_engine *e, uint32_t k, const void *const parts[], uint64_t len);

int
eng_spec_setup(struct zinf_engine *e, uint32_t align)
{
	struct espec *sp = &e->sp;
	uint32_t n = spec_slots(e);
	if (n == 0 || !e->w.started) {
		return 0;
	}
	align = ZINF_MAX(align, 4096u);
	sp->stride = layout(e, align, sp->off);
	sp->sg_slot = zc_calloc(e->n_sg, sizeof(int32_t));
	if (!sp->sg_slot) {
		return ENG_FAIL(e, -ENOMEM, "init: out of memory for the speculative step");
	}
	for (uint32_t k = 0; k < e->n_sg; k++) {
		sp->sg_slot[k] = -1;
	}
	int ret;
	sp->dev = e->ot->dev;
	if (sp->dev) {
		ret = zinf_device_alloc(e->dev, n * sp->stride, (void **)&sp->mem);
		if (ret == -ENOMEM) {
			/* the step after backward needs none of it: go on without speculating */
			ENG_WARN(e,
				 "init: no device memory for the speculative step's reserve (%u "
				 "sub-groups of %" PRIu64
				 " bytes, offload_optimizer.buffer_count): with clipping or fp16 "
				 "the step waits for the gradient norm",
				 n, sp->stride);
			sp->mem = NULL;
			sp->dev = false;
			return 0;
		}
	} else {
		ret = zinf_pool_cpu_alloc(e->os.opool, eng_spec_bytes(e, align), (void **)&sp->mem);
	}
	if (ret) {
		return ENG_FAIL(e, ret,
				"init: the speculative step's reserve: %u sub-groups of %" PRIu64
				" bytes (offload_optimizer.buffer_count)",
				n, sp->stride);
	}
	sp->n = n;
	e->os.keep_read = keep_read; /* nvme: the state as read, from zinf_step's before_fn */
	return 0;
}

void
eng_spec_free(struct zinf_engine *e)
{
	struct espec *sp = &e->sp;
	if (sp->dev) {
		zinf_device_free(e->dev, sp->mem);
	}
	zc_free(sp->sg_slot);
	memset(sp, 0, sizeof(*sp)); /* host tiers: mem is the pool's */
}

bool
eng_spec_on(const struct zinf_engine *e)
{
	return e->cl.gate && e->w.started && e->sp.n > 0;
}

void
eng_spec_begin(struct zinf_engine *e)
{
	struct espec *sp = &e->sp;
	if (!eng_spec_on(e)) {
		return;
	}
	sp->used = 0;
	sp->closed = false;
	for (uint32_t k = 0; k < e->n_sg; k++) {
		sp->sg_slot[k] = -1;
	}
	/* the grad_scale eng_clip_decide gives without clipping or overflow, to the bit */
	double S = e->o.fp16.enabled ? zinf_loss_scaler_scale(&e->cl.ls) : 1.0;
	sp->scale0 = (float)(1.0 / S);
	e->step_scale = sp->scale0;
}

bool
eng_spec_claim(struct zinf_engine *e, uint32_t k)
{
	struct espec *sp = &e->sp;
	if (!eng_spec_on(e) || sp->closed || sp->used == sp->n) {
		return false;
	}
	sp->sg_slot[k] = (int32_t)sp->used++;
	return true;
}

static char *
slot_of(const struct zinf_engine *e, uint32_t k)
{
	return e->sp.mem + (uint64_t)e->sp.sg_slot[k] * e->sp.stride;
}

/* On the worker, before stepping speculated sub-group k: its previous state into its slot. */
int
eng_spec_save(struct zinf_engine *e, const struct ectx *x, uint32_t k)
{
	char *slot = slot_of(e, k);
	int ret = e->ot->keep(e, x, k, slot); /* nvme: keep_read, from zinf_step's before_fn */
	if (ret) {
		return ENG_FAIL(e, ret,
				"step %" PRId64 ": sub-group %u: keeping its optimizer state",
				e->steps + 1, k);
	}
	if (eng_master_shared(e)) {
		return 0; /* the 16-bit values are the master keep_read keeps: no read of the home
			   */
	}
	ret = eng_param_home_read(e, x, k, slot + e->sp.off[e->nparts], e->sp.dev);
	return ret ? ENG_FAIL(e, ret,
			      "step %" PRId64 ": sub-group %u: keeping its 16-bit values for the "
			      "speculative step",
			      e->steps + 1, k)
		   : 0;
}

/*
 * The optimizer on NVMe, from zinf_step's before_fn for speculated sub-group k (on the worker):
 * parts hold its previous state, just read into the step's buffer, which the optimizer is about
 * to update in place: copy it into the slot (no read of the files).
 */
static int
keep_read(struct zinf_engine *e, uint32_t k, const void *const parts[], uint64_t len)
{
	if (e->cb != &e->w.x || e->sp.sg_slot[k] < 0) {
		return 0; /* stepped by the caller's thread, or not speculated: nothing to keep */
	}
	char *slot = slot_of(e, k);
	if (len != e->sg_end[k] - eng_sg_start(e, k)) {
		return ENG_FAIL(e, -EPROTO,
				"step %" PRId64 ": sub-group %u: the optimizer step gave %" PRIu64
				" elements to keep, not %" PRIu64,
				e->steps + 1, k, len, e->sg_end[k] - eng_sg_start(e, k));
	}
	/* a shared master, filled from the home, is the 16-bit values bit for bit: part 0's region
	   is theirs (layout), so it is kept once, as both */
	for (uint32_t i = 0; i < e->nparts; i++) {
		memcpy(slot + e->sp.off[i], parts[i], zinf_optimizer_part_size(e->opt, i, len));
	}
	return 0;
}

/* Speculated sub-group k's previous state back (and its 16-bit values: params16), on cs. */
int
eng_spec_restore(struct zinf_engine *e, uint32_t k, bool params16)
{
	char *slot = slot_of(e, k);
	uint64_t start = eng_sg_start(e, k), len = e->sg_end[k] - start;
	int ret = e->ot->restore(e, k, slot);
	/* a master shared with the 16-bit values (eng_master_shared) is restored with them */
	if (!ret && (params16 || eng_master_shared(e))) {
		ret = eng_param_home_write(e, &e->main, start, slot + e->sp.off[e->nparts],
					   e->sp.dev, len);
	}
	if (!ret) {
		ret = zinf_stream_sync(e->cs);
	}
	return ret ? ENG_FAIL(e, ret, "step %" PRId64 ": sub-group %u: rolling back", e->steps + 1,
			      k)
		   : 0;
}
