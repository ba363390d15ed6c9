/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine_fetch.c: making parameters available on the device. Stages 0-2 keep every
 * tensor gathered, so fetch and release only record the order. Stage 3: zinf_engine_fetch()
 * puts this rank's 16-bit partition of each parameter of the layer (device partition, pinned
 * CPU partition, or NVMe through the store) at its place in a gathered device buffer (from a
 * size-keyed free list: no device free on the hot path) and all-gathers in place; release
 * gives the buffers back after an event on the compute stream, which the next user waits for.
 * Persistent parameters stay gathered and are refreshed after each step (eng_gather_full).
 * Not here (yet): the fetch trace and prefetch along it.
 */
#include <errno.h>
#include <string.h>

#include "engine/engine_internal.h"

/* This rank's 16-bit partition of p into p->dev_full at its place (stage 3), on cs. */
static int
put_partition(struct zinf_engine *e, struct eparam *p)
{
	size_t ds = eng_dsize(e);
	size_t bytes = p->part.part * ds;
	char *dst = (char *)p->dev_full + p->part.offset * ds;
	int ret;
	void *buf = NULL;
	switch (e->ptier) {
	case ZINF_OFFLOAD_NONE:
		return zinf_device_copy(e->cs, dst, p->dev_part, bytes, ZINF_COPY_D2D);
	case ZINF_OFFLOAD_CPU:
		e->win.h2d_bytes += bytes;
		return zinf_device_copy(e->cs, dst, p->cpu_part, bytes, ZINF_COPY_H2D);
	default:
		ret = zinf_store_wait(e->store, p->store_id, &buf);
		if (ret) {
			return ENG_FAIL(e, ret,
					"fetch: parameter \"%s\": reading its NVMe partition",
					p->name);
		}
		e->win.h2d_bytes += bytes;
		e->win.nvme_read_bytes += bytes;
		return zinf_device_copy(e->cs, dst, buf, bytes, ZINF_COPY_H2D);
	}
}

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
	int ret = 0;
	if (e->o.stage == 3) {
		if (e->ptier == ZINF_OFFLOAD_NVME) {
			ret = zinf_store_swap_in(e->store, p->store_id, 0);
		}
		if (!ret) {
			ret = put_partition(e, p);
		}
	}
	if (!ret && e->host_comm) {
		ret = zinf_stream_sync(e->cs);
	}
	if (e->o.stage == 3 && e->ptier == ZINF_OFFLOAD_NVME) {
		int r2 = zinf_store_release(e->store, p->store_id);
		ret = ret ? ret : r2;
	}
	if (!ret && e->W > 1) {
		ret = gather(e, p, NULL);
	}
	return ret ? eng_fail(e, ENG_FAIL(e, ret, "gathering parameter \"%s\"", p->name)) : 0;
}

static int
gbuf_get(struct zinf_engine *e, size_t bytes, struct gbuf **out)
{
	struct gbuf **pp = &e->free_list;
	for (; *pp; pp = &(*pp)->next) {
		if ((*pp)->bytes == bytes) {
			struct gbuf *g = *pp;
			*pp = g->next;
			g->next = NULL;
			*out = g;
			/* the compute stream's last use of it, before the host collective writes */
			return zinf_event_sync(g->released);
		}
	}
	struct gbuf *g = zinf_calloc(1, sizeof(*g));
	if (!g) {
		return -ENOMEM;
	}
	int ret = zinf_device_alloc(e->dev, bytes, &g->dev);
	if (!ret && (ret = zinf_event_create(e->dev, &g->released))) {
		zinf_device_free(e->dev, g->dev);
	}
	if (ret) {
		zinf_free(g);
		return ret;
	}
	g->bytes = bytes;
	*out = g;
	return 0;
}

static void
gbuf_put(struct zinf_engine *e, struct gbuf *g)
{
	g->next = e->free_list;
	e->free_list = g;
}

void
eng_fetch_free(struct zinf_engine *e)
{
	for (uint32_t i = 0; i < e->n_params; i++) {
		struct eparam *p = &e->params[i];
		if (p->gathered) {
			gbuf_put(e, p->gathered);
			p->gathered = NULL;
			p->dev_full = NULL;
		}
	}
	while (e->free_list) {
		struct gbuf *g = e->free_list;
		e->free_list = g->next;
		zinf_event_sync(g->released);
		zinf_event_destroy(g->released);
		zinf_device_free(e->dev, g->dev);
		zinf_free(g);
	}
}

static int fetch_layer(struct zinf_engine *e, struct elayer *l, struct zinf_comm_req **reqs);

/* comm_check: every rank fetches the same layer, or every rank fails naming it. */
static int
check_layer(struct zinf_engine *e, int32_t layer)
{
	float v[2] = {(float)layer, -(float)layer};
	int ret = zinf_comm_all_reduce(e->comm, v, 2, ZINF_F32, ZINF_COMM_MAX, NULL);
	if (ret) {
		return eng_fail(
			e, ENG_FAIL(e, ret, "fetch: layer %d, step %" PRId64, layer, e->steps + 1));
	}
	if (v[0] != (float)layer || -v[1] != (float)layer) {
		return eng_fail(e, ENG_FAIL(e, -EPROTO,
					    "fetch: ranks fetched different layers at step %" PRId64
					    ": this rank layer %d, others between %g and %g",
					    e->steps + 1, layer, (double)-v[1], (double)v[0]));
	}
	return 0;
}

int
zinf_engine_fetch(struct zinf_engine *e, int32_t layer)
{
	int ret = eng_ready(e, "fetch");
	if (ret) {
		return ret;
	}
	struct elayer *l = eng_layer(e, layer);
	if (!l || l->fetched) {
		return ENG_FAIL(e, -EINVAL, "fetch: layer %d %s", layer,
				l ? "is already fetched" : "is unknown");
	}
	double t0 = eng_now();
	if (e->window_t0 < 0) {
		e->window_t0 = t0;
	}
	if (e->o.stage < 3 || l->gather_elems == 0) {
		l->fetched = true;
		return 0;
	}
	if (e->o.comm_check && e->host_comm && (ret = check_layer(e, layer))) {
		return ret;
	}
	if (e->live_elems + l->gather_elems > e->o.stage3_max_live_parameters && !e->warned_live) {
		e->warned_live = true;
		ENG_WARN(e,
			 "fetch: layer %d (%" PRIu64 " elements) with %" PRIu64 " live passes "
			 "stage3_max_live_parameters (%" PRIu64 "); fetched anyway (warned once)",
			 layer, l->gather_elems, e->live_elems, e->o.stage3_max_live_parameters);
	}
	struct zinf_comm_req **reqs = zinf_calloc(l->n, sizeof(*reqs));
	if (!reqs) {
		return ENG_FAIL(e, -ENOMEM, "fetch: layer %d: out of memory", layer);
	}
	bool locked = e->ptier == ZINF_OFFLOAD_NVME;
	if (locked) {
		/* the step worker writes new values into the store during backward */
		pthread_mutex_lock(&e->store_mu);
	}
	ret = fetch_layer(e, l, reqs);
	if (locked) {
		pthread_mutex_unlock(&e->store_mu);
	}
	zinf_free(reqs);
	if (ret) {
		return eng_fail(e, ENG_FAIL(e, ret, "fetch: layer %d", layer));
	}
	e->live_elems += l->gather_elems;
	e->peak_live = ZINF_MAX(e->peak_live, e->live_elems);
	l->fetched = true;
	e->win.exposed_fetch_s += eng_now() - t0;
	return 0;
}

/* The partitions of l's parameters into gathered buffers, then the all-gathers. */
static int
fetch_layer(struct zinf_engine *e, struct elayer *l, struct zinf_comm_req **reqs)
{
	size_t ds = eng_dsize(e);
	int ret = 0;
	/* reads first (NVMe), so that they overlap each other */
	for (uint32_t i = 0; i < l->n && !ret; i++) {
		struct eparam *p = &e->params[l->params[i]];
		if (!p->persistent && e->ptier == ZINF_OFFLOAD_NVME) {
			ret = zinf_store_swap_in(e->store, p->store_id, 0);
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
		ret = put_partition(e, p);
	}
	if (!ret && e->host_comm) {
		ret = zinf_stream_sync(e->cs);
	}
	for (uint32_t i = 0; i < l->n && e->ptier == ZINF_OFFLOAD_NVME; i++) {
		struct eparam *p = &e->params[l->params[i]];
		if (!p->persistent) {
			int r2 = zinf_store_release(e->store, p->store_id);
			ret = ret ? ret : r2;
		}
	}
	for (uint32_t i = 0; i < l->n && !ret && e->W > 1; i++) {
		struct eparam *p = &e->params[l->params[i]];
		if (!p->persistent) {
			ret = gather(e, p, &reqs[i]);
		}
	}
	for (uint32_t i = 0; i < l->n; i++) {
		if (reqs[i]) {
			int r2 = zinf_comm_wait(e->comm, reqs[i]);
			ret = ret ? ret : r2;
		}
	}
	if (!ret) {
		ret = eng_order(e, e->cs, e->compute);
	}
	if (ret) {
		for (uint32_t i = 0; i < l->n; i++) {
			struct eparam *p = &e->params[l->params[i]];
			if (p->gathered) {
				gbuf_put(e, p->gathered);
				p->gathered = NULL;
				p->dev_full = NULL;
			}
		}
	}
	return ret;
}

int
zinf_engine_release(struct zinf_engine *e, int32_t layer)
{
	int ret = eng_ready(e, "release");
	if (ret) {
		return ret;
	}
	struct elayer *l = eng_layer(e, layer);
	if (!l || !l->fetched) {
		return ENG_FAIL(e, -EINVAL, "release: layer %d %s", layer,
				l ? "is not fetched" : "is unknown");
	}
	if (e->o.stage == 3) {
		for (uint32_t i = 0; i < l->n; i++) {
			struct eparam *p = &e->params[l->params[i]];
			if (!p->gathered) {
				continue;
			}
			if ((ret = zinf_event_record(p->gathered->released, e->compute))) {
				return eng_fail(e, ret);
			}
			gbuf_put(e, p->gathered);
			p->gathered = NULL;
			p->dev_full = NULL;
		}
		e->live_elems -= l->gather_elems;
	}
	l->fetched = false;
	return 0;
}

int
zinf_engine_param(struct zinf_engine *e, uint32_t id, void **dev)
{
	int ret = eng_ready(e, "param");
	if (ret) {
		return ret;
	}
	if (id >= e->n_params || !dev) {
		return ENG_FAIL(e, -EINVAL, "param: %s", dev ? "unknown parameter id" : "NULL dev");
	}
	struct eparam *p = &e->params[id];
	if (!p->dev_full) {
		return ENG_FAIL(e, -EINVAL, "param: parameter \"%s\": layer %d is not fetched",
				p->name, p->layer);
	}
	*dev = p->dev_full;
	return 0;
}

int
eng_refresh_persistent(struct zinf_engine *e)
{
	int ret = 0;
	for (uint32_t i = 0; i < e->n_params && !ret; i++) {
		if (e->params[i].persistent) {
			ret = eng_gather_full(e, &e->params[i]);
		}
	}
	return ret;
}
