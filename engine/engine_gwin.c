/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine_gwin.c: the gradient window (optimizer on NVMe): a store of gradient tensors.
 * Each sub-group's fp32 gradient is a "grad" tensor of a zinf_store (offload/store.c) over the
 * optimizer's swap space, with its own pinned pool of `buffer_count` buffers of max_sg elements:
 * the window's slots. A sub-group being accumulated holds a slot; when a slot is needed for
 * another sub-group, the least recently used one not held by the step worker is written (if
 * it changed) and released, and read back when the sub-group accumulates again or is
 * stepped. A stepped gradient is released unwritten. A slot handed to the step worker comes
 * back when the worker has finished its queue position. Writes are waited for at once, so an
 * I/O error fails the call that caused it, naming the sub-group. Also where a sub-group's
 * gradient is, for every tier (eng_grad_of: the gradient partition, or its slot). Used by
 * engine_grad.c, the step and the worker; on the caller's thread only.
 */
#include <errno.h>
#include <string.h>

#include "engine/engine_internal.h"

/* ---- the gradient window (optimizer on NVMe) ---------------------------------------------- */

static uint32_t
gwin_slots(const struct zinf_engine *e)
{
	uint32_t n = ZINF_MAX(e->o.offload_optimizer.buffer_count, 1u);
	return ZINF_MIN(n, e->n_sg);
}

static uint64_t
sg_bytes(const struct zinf_engine *e, uint32_t k)
{
	return (e->sg_end[k] - eng_sg_start(e, k)) * 4;
}

int
eng_gwin_pool(const struct zinf_engine *e, uint32_t align, struct zinf_pool_opts *po)
{
	zinf_pool_opts_init(po);
	if (!e->ot->window) {
		return 0;
	}
	po->buffer_bytes = e->max_sg * 4;
	po->buffer_count = gwin_slots(e);
	po->align = align;
	po->pin_memory = e->o.offload_optimizer.pin_memory;
	po->pin_fallback = true;
	po->what = "offload_optimizer";
	return 1;
}

int
eng_gwin_declare(struct zinf_engine *e)
{
	struct gwin *g = &e->gr.gw;
	g->n = gwin_slots(e);
	g->slot = zc_calloc(g->n, sizeof(*g->slot));
	g->sg_slot = zc_calloc(e->n_sg, sizeof(*g->sg_slot));
	g->sg_has = zc_calloc(e->n_sg, 1);
	g->sg_id = zc_calloc(e->n_sg, sizeof(*g->sg_id));
	if (!g->slot || !g->sg_slot || !g->sg_has || !g->sg_id) {
		return ENG_FAIL(e, -ENOMEM, "init: out of memory for the gradient window");
	}
	for (uint32_t s = 0; s < g->n; s++) {
		g->slot[s].sg = -1;
	}
	struct zinf_pool_opts po;
	eng_gwin_pool(e, zinf_swap_align(e->os.oswap), &po);
	po.device = e->dev; /* the destination of the gradients' copies from the device */
	/* no io: registering would replace the optimizer pool's registration (one per context) */
	int ret = zinf_pool_create(&po, &g->pool);
	if (ret) {
		return ENG_FAIL(e, ret, "init: pinned gradient window of %u sub-groups", g->n);
	}
	struct zinf_store_opts so;
	zinf_store_opts_init(&so);
	so.pool = g->pool;
	so.swap = e->os.oswap;
	if ((ret = zinf_store_create(&so, &g->store))) {
		return ENG_FAIL(e, ret, "init: the gradient window's store");
	}
	for (uint32_t k = 0; k < e->n_sg; k++) {
		g->sg_slot[k] = -1;
		g->sg_id[k] =
			zinf_store_add(g->store, "grad", k, sg_bytes(e, k) / 4, 4, ZINF_TIER_NVME);
		if (g->sg_id[k] < 0) {
			return ENG_FAIL(e, g->sg_id[k],
					"init: sub-group %u: declaring its gradient in the "
					"optimizer's swap space",
					k);
		}
	}
	return 0;
}

uint64_t
eng_gwin_pool_bytes(const struct zinf_engine *e)
{
	return zinf_pool_bytes(e->gr.gw.pool);
}

void
eng_gwin_free(struct zinf_engine *e)
{
	struct gwin *g = &e->gr.gw;
	zinf_store_destroy(g->store); /* every slot's buffer back to the pool */
	zinf_pool_destroy(g->pool);
	zc_free(g->slot);
	zc_free(g->sg_slot);
	zc_free(g->sg_has);
	zc_free(g->sg_id);
	memset(g, 0, sizeof(*g));
}

/* Slot s free: its sub-group's tensor released as it is (clean: unwritten, its buffer back). */
static void
gwin_clear(struct gwin *g, uint32_t s)
{
	int32_t k = g->slot[s].sg;
	if (k >= 0) {
		g->sg_slot[k] = -1;
		(void)zinf_store_release(g->store, g->sg_id[k]); /* resident and clean: no I/O */
	}
	g->slot[s] = (struct gslot){.sg = -1};
}

/* Free the slots of the sub-groups the step worker has finished (its gradient was read). */
static void
gwin_reclaim(struct zinf_engine *e)
{
	struct gwin *g = &e->gr.gw;
	if (!e->w.started) {
		return;
	}
	pthread_mutex_lock(&e->w.mu);
	uint32_t fin = e->w.finished;
	pthread_mutex_unlock(&e->w.mu);
	for (uint32_t s = 0; s < g->n; s++) {
		if (g->slot[s].handed && g->slot[s].qpos < fin) {
			uint32_t k = (uint32_t)g->slot[s].sg;
			if (e->sp.sg_slot && e->sp.sg_slot[k] >= 0) {
				/* stepped speculatively: its gradient stays (this slot, or its file
				   once evicted) until the step is validated or redone */
				g->slot[s].handed = false;
				g->sg_has[k] = GW_SPEC;
			} else {
				g->sg_has[k] = GW_STEPPED;
				gwin_clear(g, s);
			}
		}
	}
}

void
eng_gwin_reclaim(struct zinf_engine *e)
{
	gwin_reclaim(e);
}

/* Write slot s's gradient to its sub-group's grad tensor (if changed) and free the slot. */
static int
gwin_evict(struct zinf_engine *e, uint32_t s)
{
	struct gwin *g = &e->gr.gw;
	uint32_t k = (uint32_t)g->slot[s].sg;
	if (g->slot[s].dirty) {
		/* the copies accumulate queued into it, first */
		int ret = zinf_stream_sync(e->cs);
		if (ret) {
			return ENG_FAIL(e, ret, "gradients: the engine stream failed");
		}
		int id = g->sg_id[k];
		if ((ret = zinf_store_mark_dirty(g->store, id)) == 0 &&
		    (ret = zinf_store_release(g->store, id)) == 0) {
			ret = zinf_store_wait(g->store, id, NULL);
		}
		if (ret) {
			return ENG_FAIL(e, ret, "gradients: sub-group %u: writing its gradient: %s",
					k, zinf_last_error());
		}
		uint64_t bytes = sg_bytes(e, k);
		e->win.nvme_write_bytes += bytes;
		e->win.grad_nvme_write_bytes += bytes;
		g->sg_slot[k] = -1;
		g->slot[s] = (struct gslot){.sg = -1};
		return 0;
	}
	gwin_clear(g, s);
	return 0;
}

/* A free slot: a free one; else, while the step worker holds some, wait for it to finish one
 * (it needs nothing from this thread); else the least recently used one (written out). Waiting
 * first keeps a partly accumulated gradient off the disk: writing it and reading it back costs
 * 8 bytes per element of the disk time the worker's own reads and writes are waiting for, and
 * the worker frees a slot after one sub-group's step however far backward runs ahead. */
static int
gwin_take(struct zinf_engine *e)
{
	struct gwin *g = &e->gr.gw;
	for (;;) {
		gwin_reclaim(e);
		int best = -1;
		uint32_t minq = UINT32_MAX;
		for (uint32_t s = 0; s < g->n; s++) {
			struct gslot *t = &g->slot[s];
			if (t->sg < 0) {
				return (int)s;
			}
			if (t->handed) {
				minq = ZINF_MIN(minq, t->qpos);
			} else if (best < 0 || t->tick < g->slot[best].tick) {
				best = (int)s;
			}
		}
		if (best >= 0 && minq == UINT32_MAX) {
			int ret = gwin_evict(e, (uint32_t)best);
			return ret ? ret : best;
		}
		struct eworker *w = &e->w;
		pthread_mutex_lock(&w->mu);
		while (w->finished <= minq) {
			pthread_cond_wait(&w->done, &w->mu);
		}
		pthread_mutex_unlock(&w->mu);
	}
}

int
eng_gwin_load(struct zinf_engine *e, uint32_t k)
{
	return eng_gwin_load_fill(e, k, false);
}

int
eng_gwin_load_fill(struct zinf_engine *e, uint32_t k, bool fill)
{
	struct gwin *g = &e->gr.gw;
	int s = g->sg_slot[k];
	if (s < 0) {
		if ((s = gwin_take(e)) < 0) {
			return s;
		}
		int id = g->sg_id[k];
		bool back = g->sg_has[k] == GW_HAS || g->sg_has[k] == GW_SPEC;
		/* new: zeroed (padding never handed stays 0), or not even that when the caller
		   writes every element first */
		unsigned flags = back ? 0 : fill ? ZINF_STORE_OVERWRITE : ZINF_STORE_NEW;
		void *mem = NULL;
		int ret = zinf_store_swap_in(g->store, id, flags);
		if (ret == 0) {
			ret = zinf_store_wait(g->store, id, &mem);
		}
		if (ret) {
			if (!back) {
				return ENG_FAIL(e, ret, "gradients: sub-group %u: a slot: %s", k,
						zinf_last_error());
			}
			return ENG_FAIL(e, ret,
					"gradients: sub-group %u: reading its gradient back: %s", k,
					zinf_last_error());
		}
		if (back) {
			uint64_t bytes = sg_bytes(e, k);
			e->win.nvme_read_bytes += bytes;
			e->win.grad_nvme_read_bytes += bytes;
		} else {
			g->sg_has[k] = GW_HAS;
		}
		g->slot[s] = (struct gslot){.sg = (int32_t)k, .dirty = !back, .mem = mem};
		g->sg_slot[k] = s;
	}
	g->slot[s].tick = ++g->tick;
	return 0;
}

float *
eng_gwin_write(struct zinf_engine *e, uint32_t k, bool fill, int *ret)
{
	if ((*ret = eng_gwin_load_fill(e, k, fill))) {
		return NULL;
	}
	struct gslot *t = &e->gr.gw.slot[e->gr.gw.sg_slot[k]];
	t->dirty = true;
	return t->mem;
}

void
eng_gwin_hand(struct zinf_engine *e, uint32_t k, uint32_t qpos)
{
	struct gslot *t = &e->gr.gw.slot[e->gr.gw.sg_slot[k]];
	t->handed = true;
	t->qpos = qpos;
}

void
eng_gwin_drop(struct zinf_engine *e, uint32_t k)
{
	struct gwin *g = &e->gr.gw;
	if (g->sg_slot[k] >= 0) {
		gwin_clear(g, (uint32_t)g->sg_slot[k]);
	}
	g->sg_has[k] = GW_STEPPED;
}

void
eng_gwin_reset(struct zinf_engine *e)
{
	struct gwin *g = &e->gr.gw;
	for (uint32_t s = 0; s < g->n; s++) {
		gwin_clear(g, s);
	}
	if (g->sg_has) {
		memset(g->sg_has, 0, e->n_sg);
	}
}

float *
eng_grad_of(struct zinf_engine *e, uint32_t k)
{
	if (e->gr.gw.n) {
		return e->gr.gw.slot[e->gr.gw.sg_slot[k]].mem;
	}
	return e->os.grad_part + eng_sg_start(e, k);
}
