/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine_gather.c: putting 16-bit parameters together on the device. Each parameter's
 * partition goes from its home (engine_ptier.c) to its place in a gathered device buffer, then
 * an all-gather in place fills the rest: whole tensors at init and after each step (stages 1-2,
 * and stage 3's persistent parameters, on NVMe with the store's buffers' worth of reads in
 * flight), and stage 3's layers at their fetch or prefetch (eng_gather_start, left in flight).
 * Stage 3's gathered buffers come from a size-keyed free list (no device free on the hot path)
 * within what stage3_max_live_parameters allows, and a buffer given back is reused after the
 * compute stream's event recorded at its release. Used by engine_fetch.c and engine_trace.c.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine/engine_internal.h"

/* All-gather p->dev_full in place (this rank's partition is in place on cs). */
static int
gather(struct zinf_engine *e, struct eparam *p, struct zinf_comm_req **req)
{
	size_t ds = eng_dsize(e);
	e->win.gathered_bytes += p->part.padded * ds;
	return zinf_comm_all_gather(e->comm, (char *)p->dev_full + p->part.offset * ds, p->dev_full,
				    p->part.part, e->o.dtype, req);
}

int
eng_gather_full(struct zinf_engine *e, struct eparam *p)
{
	/* this rank's partition at its place (stages 0-2: in place already) */
	int ret = e->pt->read_begin(e, p);
	if (!ret) {
		ret = e->pt->put(e, p);
	}
	if (e->host_comm || e->pt->reads) {
		/* host collectives read from this thread; the store's buffer is handed back
		   (and may be overwritten by the next swap-in) only once the H2D copy from it
		   is done, even after an error (a copy may be queued) */
		int r2 = zinf_stream_sync(e->cs);
		ret = ret ? ret : r2;
	}
	if (e->pt->reads) {
		int r2 = e->pt->read_end(e, p);
		ret = ret ? ret : r2;
	}
	if (!ret && e->W > 1) {
		ret = gather(e, p, NULL);
	}
	return ret ? ENG_FAIL(e, ret, "gathering parameter \"%s\"", p->name) : 0;
}

/*
 * After the step: stages 1-2 all-gather every tensor in place (this rank's partition was
 * written on cs), non-blocking, at most allgather_bucket_size elements in flight (at least one
 * call); stage 3 re-gathers its persistent parameters.
 */
int
eng_gather_after_step(struct zinf_engine *e)
{
	int ret = 0;
	if (e->o.stage == 3) {
		return eng_refresh_persistent(e);
	}
	if (e->o.stage == 0 || e->W == 1) {
		return 0;
	}
	struct zinf_comm_req **reqs = zc_calloc(e->n_params, sizeof(*reqs));
	if (!reqs) {
		return ENG_FAIL(e, -ENOMEM, "step: out of memory for the all-gathers");
	}
	if (e->host_comm) {
		ret = zinf_stream_sync(e->cs);
	}
	uint32_t head = 0;
	uint64_t inflight = 0;
	for (uint32_t i = 0; i < e->n_params && !ret; i++) {
		struct eparam *p = &e->params[i];
		while (head < i && inflight + p->part.padded > e->o.allgather_bucket_size) {
			ret = zinf_comm_wait(e->comm, reqs[head]);
			reqs[head] = NULL;
			inflight -= e->params[head++].part.padded;
			if (ret) {
				break;
			}
		}
		if (!ret) {
			ret = gather(e, p, &reqs[i]);
			inflight += p->part.padded;
		}
	}
	for (uint32_t i = head; i < e->n_params; i++) {
		if (reqs[i]) {
			int r2 = zinf_comm_wait(e->comm, reqs[i]);
			ret = ret ? ret : r2;
		}
	}
	zc_free(reqs);
	return ret ? ENG_FAIL(e, ret, "step: all-gathering the new parameters") : 0;
}

/* Bytes the gathered buffers may hold on the device, in use and cached together: what
 * stage3_max_live_parameters leaves after the persistent parameters (always gathered). */
static uint64_t
gbuf_budget(const struct zinf_engine *e)
{
	uint64_t live = e->o.stage3_max_live_parameters;
	uint64_t pers = ZINF_MIN(e->fx.persistent_elems, live);
	return (live - pers) * eng_dsize(e);
}

static void
gbuf_free(struct zinf_engine *e, struct gbuf *g)
{
	zinf_event_sync(g->released);
	zinf_event_destroy(g->released);
	eng_comm_buf_free(e, g->dev);
	e->fx.gbuf_bytes -= g->bytes;
	zc_free(g);
}

/* Free cached buffers, least recently used first, until in use + cached + `need` fits the
 * budget (or none is left). A device free may synchronise the device: only under pressure in
 * the hot path, else after the step (eng_fetch_trim). */
static void
gbuf_shrink(struct zinf_engine *e, uint64_t need)
{
	while (e->fx.free_list && e->fx.gbuf_bytes + need > gbuf_budget(e)) {
		struct gbuf **pp = &e->fx.free_list;
		while ((*pp)->next) {
			pp = &(*pp)->next;
		}
		struct gbuf *old = *pp;
		*pp = NULL;
		e->fx.free_bytes -= old->bytes;
		gbuf_free(e, old);
	}
}

/*
 * A gathered buffer of at least `bytes`: a cached one of that size class (up to a quarter
 * larger; the smallest that fits) if any, else a new allocation (after shrinking the cache so
 * that in use + cached stays within the budget).
 */
static int
gbuf_get(struct zinf_engine *e, size_t bytes, struct gbuf **out)
{
	struct gbuf **best = NULL;
	for (struct gbuf **pp = &e->fx.free_list; *pp; pp = &(*pp)->next) {
		size_t b = (*pp)->bytes;
		if (b >= bytes && b - bytes <= bytes / 4 && (!best || b < (*best)->bytes)) {
			best = pp;
		}
	}
	if (best) {
		struct gbuf *g = *best;
		*best = g->next;
		g->next = NULL;
		e->fx.free_bytes -= g->bytes;
		*out = g;
		/* after the compute stream's last use of it: host collectives write from
		   this thread, nccl and the copies from cs */
		return e->host_comm ? zinf_event_sync(g->released)
				    : zinf_stream_wait_event(e->cs, g->released);
	}
	gbuf_shrink(e, bytes);
	struct gbuf *g = zc_calloc(1, sizeof(*g));
	if (!g) {
		return -ENOMEM;
	}
	int ret = eng_comm_buf_alloc(e, bytes, &g->dev);
	if (!ret && (ret = zinf_event_create(e->dev, &g->released))) {
		zinf_device_free(e->dev, g->dev);
	}
	if (ret) {
		zc_free(g);
		return ret;
	}
	g->bytes = bytes;
	e->fx.gbuf_bytes += bytes;
	*out = g;
	return 0;
}

/* Back to the cache (most recent first); nothing is freed here (see gbuf_shrink). */
static void
gbuf_put(struct zinf_engine *e, struct gbuf *g)
{
	g->next = e->fx.free_list;
	e->fx.free_list = g;
	e->fx.free_bytes += g->bytes;
}

/* Outside the hot path (after the step): the cache back within the budget. */
void
eng_gather_trim(struct zinf_engine *e)
{
	gbuf_shrink(e, 0);
}

void
eng_gather_free(struct zinf_engine *e)
{
	for (uint32_t i = 0; i < e->n_layers; i++) {
		struct elayer *l = &e->layers[i];
		for (uint32_t j = 0; l->reqs && j < l->n; j++) {
			if (l->reqs[j] && !zinf_comm_failed(e->comm)) {
				zinf_comm_wait(e->comm, l->reqs[j]);
			}
		}
		zc_free(l->reqs);
		l->reqs = NULL;
	}
	zc_free(e->fx.trace);
	e->fx.trace = NULL;
	for (uint32_t i = 0; i < e->n_params; i++) {
		struct eparam *p = &e->params[i];
		if (p->gathered) {
			gbuf_put(e, p->gathered);
			p->gathered = NULL;
			p->dev_full = NULL;
		}
	}
	while (e->fx.free_list) {
		struct gbuf *g = e->fx.free_list;
		e->fx.free_list = g->next;
		gbuf_free(e, g);
	}
	e->fx.free_bytes = 0;
}

/*
 * Start gathering layer l: its partitions into gathered buffers (NVMe reads first, so that
 * they overlap each other), then the all-gathers, left in flight in l->reqs. Every rank makes
 * the same calls (the decisions depend only on the calls the trainer made).
 */
int
eng_gather_start(struct zinf_engine *e, struct elayer *l)
{
	size_t ds = eng_dsize(e);
	int ret = 0;
	bool reads = e->pt->reads;
	if (reads) {
		/* the step worker writes new values into the store during backward */
		eng_store_lock(e);
	}
	for (uint32_t i = 0; i < l->n && !ret && reads; i++) {
		struct eparam *p = &e->params[l->params[i]];
		if (!p->persistent) {
			ret = e->pt->read_begin(e, p);
		}
	}
	for (uint32_t i = 0; i < l->n && !ret; i++) {
		struct eparam *p = &e->params[l->params[i]];
		if (p->persistent) {
			continue;
		}
		if ((ret = gbuf_get(e, p->part.padded * ds, &p->gathered))) {
			ret = ENG_FAIL(e, ret, "fetch: parameter \"%s\": gathered buffer", p->name);
			break;
		}
		p->dev_full = p->gathered->dev;
		ret = e->pt->put(e, p);
	}
	if (e->host_comm || reads) {
		/* as in eng_gather_full: the H2D copies from the store's buffers are done before
		   the buffers go back (on "cuda" the copy is asynchronous) */
		int r2 = zinf_stream_sync(e->cs);
		ret = ret ? ret : r2;
	}
	for (uint32_t i = 0; i < l->n && reads; i++) {
		struct eparam *p = &e->params[l->params[i]];
		if (!p->persistent) {
			int r2 = e->pt->read_end(e, p);
			ret = ret ? ret : r2;
		}
	}
	if (reads) {
		eng_store_unlock(e);
	}
	for (uint32_t i = 0; i < l->n && !ret && e->W > 1; i++) {
		struct eparam *p = &e->params[l->params[i]];
		if (!p->persistent) {
			ret = gather(e, p, &l->reqs[i]);
		}
	}
	l->gathered = true;
	e->fx.live_elems += l->gather_elems;
	e->fx.peak_live = ZINF_MAX(e->fx.peak_live, e->fx.live_elems);
	return ret;
}

/* Complete layer l's all-gathers; the compute stream's later work is ordered after them. */
int
eng_gather_finish(struct zinf_engine *e, struct elayer *l)
{
	int ret = 0;
	for (uint32_t i = 0; i < l->n; i++) {
		if (l->reqs[i]) {
			int r2 = zinf_comm_wait(e->comm, l->reqs[i]);
			l->reqs[i] = NULL;
			ret = ret ? ret : r2;
		}
	}
	if (!ret) {
		ret = eng_order(e, e->cs, e->compute);
	}
	return ret;
}

/* The next persistent parameter from index i (e->n_params: none). */
static uint32_t
next_persistent(const struct zinf_engine *e, uint32_t i)
{
	while (i < e->n_params && !e->params[i].persistent) {
		i++;
	}
	return i;
}

/*
 * Stage 3, parameters read into buffers (NVMe): the persistent parameters' new partitions back,
 * offload_param.buffer_count reads in flight (each read waited for in turn, not one after the
 * other), then their all-gathers. The store's buffers go back once the copies out of them are
 * done; on an error every claimed partition is given back.
 */
static int
refresh_reads(struct zinf_engine *e)
{
	uint32_t depth = ZINF_MAX(e->o.offload_param.buffer_count, 1u), n = 0;
	uint32_t head = next_persistent(e, 0), tail = head;
	struct eparam *bad = NULL;
	int ret = 0;
	eng_store_lock(e);
	while (!ret && (head < e->n_params || n > 0)) {
		if (head < e->n_params && n < depth) {
			struct eparam *p = &e->params[head];
			if ((ret = e->pt->read_begin(e, p))) {
				bad = p;
				break;
			}
			head = next_persistent(e, head + 1);
			n++;
			continue;
		}
		struct eparam *p = &e->params[tail];
		ret = e->pt->put(e, p);
		int r2 = zinf_stream_sync(e->cs); /* the copy out of the buffer is done */
		ret = ret ? ret : r2;
		r2 = e->pt->read_end(e, p);
		ret = ret ? ret : r2;
		bad = ret ? p : NULL;
		tail = next_persistent(e, tail + 1);
		n--;
	}
	if (ret) {
		(void)zinf_stream_sync(e->cs); /* a copy may be queued */
		for (; n > 0; n--, tail = next_persistent(e, tail + 1)) {
			(void)e->pt->read_end(e, &e->params[tail]);
		}
	}
	eng_store_unlock(e);
	for (uint32_t i = next_persistent(e, 0); !ret && e->W > 1 && i < e->n_params;
	     i = next_persistent(e, i + 1)) {
		ret = gather(e, bad = &e->params[i], NULL);
	}
	return ret ? ENG_FAIL(e, ret, "gathering parameter \"%s\"", bad->name) : 0;
}

int
eng_refresh_persistent(struct zinf_engine *e)
{
	if (e->pt->reads) {
		return refresh_reads(e);
	}
	int ret = 0;
	for (uint32_t i = 0; i < e->n_params && !ret; i++) {
		if (e->params[i].persistent) {
			ret = eng_gather_full(e, &e->params[i]);
		}
	}
	return ret;
}

/* Give layer l's gathered buffers back (after the compute stream's work queued so far). */
int
eng_gather_drop(struct zinf_engine *e, struct elayer *l)
{
	int ret = eng_gather_finish(e, l); /* a collective cannot be cancelled */
	for (uint32_t i = 0; i < l->n; i++) {
		struct eparam *p = &e->params[l->params[i]];
		if (!p->gathered) {
			continue;
		}
		int r2 = zinf_event_record(p->gathered->released, e->compute);
		ret = ret ? ret : r2;
		gbuf_put(e, p->gathered);
		p->gathered = NULL;
		p->dev_full = NULL;
	}
	if (l->gathered) {
		e->fx.live_elems -= l->gather_elems;
		l->gathered = false;
	}
	if (l->prefetched) {
		e->fx.pf_inflight -= l->gather_elems;
		l->prefetched = false;
	}
	return ret;
}
