/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine_param.c: parameter registration (zinf_engine_add_param) and the layout init
 * builds from it: the layers in backward order, the partitions, the persistent parameters, the
 * flat partition and its sub-groups, and the parameters' homes (through the parameter tier,
 * engine_ptier.c). Also the one function that writes new 16-bit values to their homes
 * (eng_param_home_write), for init, load and the step. zinf_engine_init itself and the initial
 * values: engine_init.c; the optimizer state's tiers: engine_otier.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"

int
zinf_engine_add_param(struct zinf_engine *e, const struct zinf_param_desc *d)
{
	if (!e || !d) {
		return ZINF_FAIL(-EINVAL, "engine: add_param with a NULL %s",
				 e ? "desc" : "engine");
	}
	if (e->failed) {
		return e->failed;
	}
	if (e->inited) {
		return ENG_FAIL(e, -EINVAL, "add_param \"%s\" after zinf_engine_init",
				d->name ? d->name : "?");
	}
	if (d->size < offsetof(struct zinf_param_desc, init_ctx) + sizeof(void *) ||
	    d->size > sizeof(*d)) {
		return ENG_FAIL(e, -EINVAL, "add_param: desc size %zu (call zinf_param_desc_init)",
				d->size);
	}
	if (!d->name || !d->name[0] || d->numel == 0 || d->layer < 0) {
		return ENG_FAIL(e, -EINVAL, "add_param \"%s\": %s", d->name ? d->name : "(null)",
				!d->name || !d->name[0] ? "no name"
				: d->numel == 0		? "numel is 0"
							: "layer < 0");
	}
	if (d->numel > ZINF_ENGINE_MAX_ELEMS - e->reg_elems) {
		return ENG_FAIL(e, -EINVAL,
				"add_param \"%s\": numel %" PRIu64 " %s: at most %llu elements "
				"(ZINF_ENGINE_MAX_ELEMS) per engine",
				d->name, d->numel,
				d->numel > ZINF_ENGINE_MAX_ELEMS
					? "is too large"
					: "brings the model past the limit",
				ZINF_ENGINE_MAX_ELEMS);
	}
	uint32_t ndim = 0;
	uint64_t shape[ZINF_PARAM_MAX_DIMS] = {0};
	uint32_t flags = d->size >= offsetof(struct zinf_param_desc, shape) ? d->flags : 0;
	if (flags & ~ZINF_PARAM_NO_DECAY) {
		return ENG_FAIL(e, -EINVAL, "add_param \"%s\": unknown flags 0x%x", d->name,
				flags & ~ZINF_PARAM_NO_DECAY);
	}
	if (d->size >= offsetof(struct zinf_param_desc, shape) + sizeof(d->shape) && d->ndim) {
		uint64_t prod = 1;
		bool wraps = false;
		for (uint32_t i = 0; i < d->ndim && i < ZINF_PARAM_MAX_DIMS; i++) {
			wraps |= d->shape[i] && prod > UINT64_MAX / d->shape[i];
			prod *= d->shape[i];
		}
		if (d->ndim > ZINF_PARAM_MAX_DIMS || wraps || prod != d->numel) {
			return ENG_FAIL(
				e, -EINVAL,
				"add_param \"%s\": shape of %u dimensions %s numel %" PRIu64,
				d->name, d->ndim,
				d->ndim > ZINF_PARAM_MAX_DIMS ? "(at most 8) for"
							      : "does not multiply to",
				d->numel);
		}
		ndim = d->ndim;
		memcpy(shape, d->shape, ndim * sizeof(uint64_t));
	}
	if (d->init && zinf_dtype_size(d->init_dtype) == 0) {
		return ENG_FAIL(e, -EINVAL, "add_param \"%s\": init_dtype %d unknown", d->name,
				(int)d->init_dtype);
	}
	if (zinf_engine_param_find(e, d->name) >= 0) {
		return ENG_FAIL(e, -EINVAL, "add_param: \"%s\" is already registered", d->name);
	}
	if (e->n_params == INT32_MAX) {
		return ENG_FAIL(e, -EINVAL, "add_param \"%s\": too many parameters", d->name);
	}
	if (e->n_params == e->cap_params) {
		uint32_t cap = e->cap_params ? e->cap_params * 2 : 16;
		struct eparam *np = zc_calloc(cap, sizeof(*np));
		if (!np) {
			return ENG_FAIL(e, -ENOMEM, "add_param \"%s\": out of memory", d->name);
		}
		if (e->n_params) {
			memcpy(np, e->params, e->n_params * sizeof(*np));
		}
		zc_free(e->params);
		e->params = np;
		e->cap_params = cap;
	}
	struct eparam *p = &e->params[e->n_params];
	memset(p, 0, sizeof(*p));
	p->name = zc_strdup(d->name);
	if (!p->name) {
		return ENG_FAIL(e, -ENOMEM, "add_param \"%s\": out of memory", d->name);
	}
	p->numel = d->numel;
	p->layer = d->layer;
	p->id = e->n_params;
	p->init_dtype = d->init_dtype;
	p->init = d->init;
	p->init_fn = d->init_fn;
	p->init_ctx = d->init_ctx;
	p->ndim = ndim ? ndim : 1;
	memcpy(p->shape, shape, sizeof(shape));
	if (!ndim) {
		p->shape[0] = d->numel;
	}
	p->store_id = -1;
	p->no_decay = flags & ZINF_PARAM_NO_DECAY;
	e->reg_elems += d->numel;
	return (int)e->n_params++;
}

/* ---- layout -------------------------------------------------------------------------------- */

/* Backward order: layers last to first, within a layer ids descending. */
static bool
before(const struct zinf_engine *e, uint32_t a, uint32_t b)
{
	const struct eparam *pa = &e->params[a], *pb = &e->params[b];
	if (pa->layer != pb->layer) {
		return pa->layer > pb->layer;
	}
	return pa->id > pb->id;
}

static void
sort_backward(const struct zinf_engine *e, uint32_t *v, uint32_t *tmp, uint32_t n)
{
	if (n < 2) {
		return;
	}
	uint32_t h = n / 2;
	sort_backward(e, v, tmp, h);
	sort_backward(e, v + h, tmp, n - h);
	uint32_t i = 0, j = h, k = 0;
	while (i < h || j < n) {
		tmp[k++] = (j >= n || (i < h && !before(e, v[j], v[i]))) ? v[i++] : v[j++];
	}
	memcpy(v, tmp, n * sizeof(*v));
}

int
eng_build_layers(struct zinf_engine *e)
{
	/* parameters in backward order, then layers ascending from the reversed list */
	e->order = zc_calloc(e->n_params, sizeof(uint32_t));
	e->layers = zc_calloc(e->n_params, sizeof(struct elayer));
	if (!e->order || !e->layers) {
		return ENG_FAIL(e, -ENOMEM, "init: out of memory for %u parameters", e->n_params);
	}
	for (uint32_t i = 0; i < e->n_params; i++) {
		e->order[i] = i;
	}
	uint32_t *tmp = zc_calloc(e->n_params, sizeof(uint32_t));
	if (!tmp) {
		return ENG_FAIL(e, -ENOMEM, "init: out of memory for %u parameters", e->n_params);
	}
	sort_backward(e, e->order, tmp, e->n_params);
	zc_free(tmp);
	for (uint32_t i = e->n_params; i-- > 0;) {
		struct eparam *p = &e->params[e->order[i]];
		struct elayer *l = e->n_layers ? &e->layers[e->n_layers - 1] : NULL;
		if (!l || l->layer != p->layer) {
			l = &e->layers[e->n_layers++];
			l->layer = p->layer;
		}
		l->n++;
	}
	for (uint32_t i = 0; i < e->n_layers; i++) {
		e->layers[i].params = zc_calloc(e->layers[i].n, sizeof(uint32_t));
		e->layers[i].reqs = zc_calloc(e->layers[i].n, sizeof(struct zinf_comm_req *));
		if (!e->layers[i].params || !e->layers[i].reqs) {
			return ENG_FAIL(e, -ENOMEM, "init: out of memory for layer lists");
		}
		e->layers[i].n = 0;
	}
	for (uint32_t i = 0; i < e->n_params; i++) { /* registration order within a layer */
		struct elayer *l = eng_layer(e, e->params[i].layer);
		l->params[l->n++] = i;
	}
	return 0;
}

/*
 * The parameters registered with ZINF_PARAM_NO_DECAY as ranges of this rank's flat partition
 * (neighbours merged), to the optimizer, whose every step (all tiers: index0 is the flat index)
 * then runs them with weight decay 0; the device Adam cuts its calls the same way
 * (zinf_optimizer_decay_run, engine_otier.c).
 */
static int
no_decay_ranges(struct zinf_engine *e)
{
	uint64_t *r = NULL;
	uint32_t n = 0;
	for (uint32_t i = 0; i < e->n_params; i++) {
		const struct eparam *p = &e->params[e->order[i]];
		if (!p->no_decay) {
			continue;
		}
		if (!r && !(r = zc_calloc(2 * (size_t)e->n_params, sizeof(uint64_t)))) {
			return ENG_FAIL(e, -ENOMEM, "init: out of memory for the no-decay ranges");
		}
		if (n > 0 && r[2 * n - 1] == p->flat_off) {
			r[2 * n - 1] += p->part.part; /* continues the one before */
		} else {
			r[2 * n] = p->flat_off;
			r[2 * n + 1] = p->flat_off + p->part.part;
			n++;
		}
	}
	int ret = n ? zinf_optimizer_set_no_decay(e->opt, r, n) : 0;
	zc_free(r);
	return ret ? ENG_FAIL(e, ret, "init: the no-decay parameters' ranges") : 0;
}

int
eng_build_partitions(struct zinf_engine *e)
{
	uint64_t persist = 0;
	for (uint32_t i = 0; i < e->n_params; i++) {
		struct eparam *p = &e->params[i];
		int ret = zinf_comm_partition(p->numel, e->W, e->W == 1 ? 0 : e->rank, &p->part);
		if (ret) {
			return ENG_FAIL(e, ret,
					"init: parameter \"%s\": cannot partition %" PRIu64
					" elements",
					p->name, p->numel);
		}
		if (e->o.stage == 3 && p->numel <= e->o.stage3_param_persistence_threshold &&
		    persist + p->numel <= e->o.stage3_model_persistence_threshold) {
			p->persistent = true;
			persist += p->numel;
		}
		if (e->o.stage == 3 && !p->persistent) {
			eng_layer(e, p->layer)->gather_elems += p->part.padded;
		}
	}
	/* flat partition and sub-groups of whole parameters */
	e->sg_end = zc_calloc(e->n_params, sizeof(uint64_t));
	e->sg_params = zc_calloc(e->n_params, sizeof(uint32_t));
	e->gr.sg_pending = zc_calloc(e->n_params, sizeof(uint32_t));
	e->sg_first = zc_calloc(e->n_params, sizeof(uint32_t));
	if (!e->sg_end || !e->sg_params || !e->gr.sg_pending || !e->sg_first) {
		return ENG_FAIL(e, -ENOMEM, "init: out of memory for sub-groups");
	}
	uint64_t off = 0, sg_start = 0;
	for (uint32_t i = 0; i < e->n_params; i++) {
		struct eparam *p = &e->params[e->order[i]];
		uint64_t len = p->part.part;
		if (e->n_sg > 0 && off > sg_start && off - sg_start + len > e->o.sub_group_size) {
			sg_start = off; /* close the sub-group before p */
		}
		if (off == sg_start) {
			e->sg_first[e->n_sg++] = i;
		}
		p->flat_off = off;
		p->sg = e->n_sg - 1;
		e->sg_params[p->sg]++;
		off += len;
		e->sg_end[p->sg] = off;
	}
	e->flat_n = off;
	for (uint32_t k = 0; k < e->n_sg; k++) {
		uint64_t len = e->sg_end[k] - (k ? e->sg_end[k - 1] : 0);
		e->max_sg = ZINF_MAX(e->max_sg, len);
		e->gr.sg_pending[k] = e->sg_params[k];
	}
	return no_decay_ranges(e);
}

/* The 16-bit parameters' places: the gathered device copy of stages 0-2 and of the persistent
 * parameters, then the home of the tier (engine_ptier.c). */
int
eng_param_homes(struct zinf_engine *e)
{
	size_t ds = eng_dsize(e);
	int ret = eng_param_fit(e);
	for (uint32_t i = 0; i < e->n_params && !ret; i++) {
		struct eparam *p = &e->params[i];
		if (e->o.stage < 3 || p->persistent) {
			ret = zinf_device_alloc(e->dev, p->part.padded * ds, &p->dev_full);
			if (ret) {
				return ENG_FAIL(e, ret,
						"init: parameter \"%s\": device memory for "
						"%zu elements",
						p->name, p->part.padded);
			}
		}
	}
	return ret ? ret : e->pt->setup(e);
}

int
eng_param_fit(const struct zinf_engine *e)
{
	for (uint32_t i = 0; i < e->n_params && e->pt->reads; i++) {
		const struct eparam *p = &e->params[i];
		if (p->part.part > e->o.offload_param.buffer_size) {
			return ENG_FAIL(
				e, -EINVAL,
				"init: parameter \"%s\": partition of %zu elements is larger "
				"than zero_optimization.offload_param.buffer_size (%" PRIu64 ")",
				p->name, p->part.part, e->o.offload_param.buffer_size);
		}
	}
	return 0;
}

void
eng_param_free(struct zinf_engine *e)
{
	for (uint32_t i = 0; i < e->n_params; i++) {
		struct eparam *p = &e->params[i];
		if (!p->gathered) {
			zinf_device_free(e->dev, p->dev_full);
		}
		zinf_device_free(e->dev, p->dev_part);
		p->dev_full = p->dev_part = NULL;
	}
	eng_ptier_destroy(e);
	zinf_io_destroy(
		e->io); /* after both swap spaces (engine_init.c frees the optimizer's first) */
	e->io = NULL;
}

/* The first parameter (in flat order) whose partition ends after flat index x. */
uint32_t
eng_flat_find(const struct zinf_engine *e, uint64_t x)
{
	uint32_t lo = 0, hi = e->n_params;
	while (lo < hi) {
		uint32_t mid = (lo + hi) / 2;
		const struct eparam *p = &e->params[e->order[mid]];
		if (p->flat_off + p->part.part <= x) {
			lo = mid + 1;
		} else {
			hi = mid;
		}
	}
	return lo;
}

/*
 * Write new 16-bit values of flat elements [flat_start, flat_start + n) (src: n elements of
 * opts.dtype, on the device or the host) to each parameter's home (engine_ptier.c). Copies run
 * on x->s; a host source is synchronised before returning (the caller may reuse it).
 */
int
eng_param_home_write(struct zinf_engine *e, const struct ectx *x, uint64_t flat_start,
		     const void *src, bool src_dev, uint64_t n)
{
	size_t ds = eng_dsize(e);
	const char *s = src;
	int ret = 0;
	for (uint32_t i = eng_flat_find(e, flat_start); i < e->n_params && n > 0 && !ret; i++) {
		struct eparam *p = &e->params[e->order[i]];
		uint64_t off = flat_start - p->flat_off;
		uint64_t len = ZINF_MIN(n, p->part.part - off);
		ret = eng_param_write(e, x, p, off, s, src_dev, len);
		s += len * ds;
		flat_start += len;
		n -= len;
	}
	if (ret) {
		return ret;
	}
	if (!src_dev && e->pt->queues && (ret = zinf_stream_sync(x->s))) {
		return ENG_FAIL(e, ret, "copying new parameter values to the device");
	}
	return 0;
}

/*
 * Sub-group k's 16-bit values from their homes into dst (its elements of opts.dtype; device
 * memory when dst_dev): the reverse of eng_param_home_write, for the speculative step's reserve
 * and the master shared with the 16-bit values (engine_otier.c). A sub-group is whole
 * parameters. Copies on x->s, finished before returning; the parameter store's reads take
 * store_mu (the tier's read).
 */
int
eng_param_home_read(struct zinf_engine *e, const struct ectx *x, uint32_t k, char *dst,
		    bool dst_dev)
{
	size_t ds = eng_dsize(e);
	uint64_t start = eng_sg_start(e, k);
	int ret = 0;
	for (uint32_t i = e->sg_first[k]; i < e->n_params && !ret; i++) {
		struct eparam *p = &e->params[e->order[i]];
		if (p->sg != k) {
			break;
		}
		ret = e->pt->read(e, x, p, dst + (p->flat_off - start) * ds, dst_dev);
		if (ret) {
			/* no step number: a step, read_master and a checkpoint's save call it; the
			   caller says which */
			return ENG_FAIL(e, ret,
					"sub-group %u: parameter \"%s\": reading its 16-bit values "
					"from their home (%s)",
					k, p->name, e->pt->name);
		}
	}
	ret = zinf_stream_sync(x->s);
	return ret ? ENG_FAIL(e, ret, "sub-group %u: reading its 16-bit values", k) : 0;
}

int
eng_param_home_from_master(struct zinf_engine *e, uint64_t off, const void *m, enum zinf_dtype mdt,
			   uint64_t n, void *copy)
{
	int ret = 0;
	size_t ms = zinf_dtype_size(mdt);
	for (uint64_t i = 0, c; (c = zinf_step_piece(i, n)) > 0 && !ret; i += c) {
		ret = zinf_dtype_convert(copy, e->o.dtype, (const char *)m + i * ms, mdt, c);
		if (!ret) {
			ret = eng_param_home_write(e, &e->main, off + i, copy, false, c);
		}
	}
	return ret;
}
