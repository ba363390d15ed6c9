/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine_init.c: zinf_engine_init and what it sets up, in the order the state needs it:
 * the layout (engine_param.c), the parameters' homes, the step's side (the step worker, the
 * norm, the optimizer tier with its gradient window and the speculation's reserve), the
 * gradient buckets, then every tier's values: the initial values, sub-group by sub-group in
 * pieces (or, in place of them, a checkpoint's: eng_init_with), the ranks' agreement, and the
 * gathers of stages 1-2 and of the persistent parameters. Also the teardown of the step's side
 * and the rewrite of a running engine's whole state (a load).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine/engine_internal.h"

uint64_t
eng_bucket_cap(const struct zinf_engine *e)
{
	uint64_t total = 0, maxp = 0;
	for (uint32_t i = 0; i < e->n_params; i++) {
		total += e->params[i].part.padded;
		maxp = ZINF_MAX(maxp, e->params[i].part.padded);
	}
	uint64_t cap = ZINF_MAX(ZINF_MIN(e->o.reduce_bucket_size, total), maxp);
	return ZINF_ALIGN_UP(cap, (uint64_t)e->world);
}

/* What the optimizer tier's pool holds for the others: the speculation's reserve (host
 * tiers). */
static uint64_t
pinned_for_others(const struct zinf_engine *e, uint32_t align)
{
	return eng_spec_bytes(e, align);
}

const struct eng_tier_needs eng_step_needs = {
	.pinned = pinned_for_others,
	.declare = eng_gwin_declare,
};

/* The step's side: the worker, the norm, the optimizer tier (with the gradient window, which it
 * declares in its swap space), then the speculation's reserve from its pool. */
int
eng_step_setup(struct zinf_engine *e)
{
	int ret = e->o.step_during_backward ? eng_worker_start(e) : 0;
	if (ret || (ret = eng_clip_setup(e))) {
		return ret;
	}
	e->gr.bucket_cap = eng_bucket_cap(e);
	if ((ret = e->ot->setup(e, &eng_step_needs))) {
		return ret;
	}
	return eng_spec_setup(e, e->os.align);
}

void
eng_step_free(struct zinf_engine *e)
{
	eng_worker_stop(e);
	eng_spec_free(e);
	eng_clip_free(e);
	if (e->ot) { /* NULL: create failed before choosing it */
		e->ot->free(e);
	}
	eng_gwin_free(e);
	memset(e->os.state, 0, sizeof(e->os.state));
	e->os.grad_part = NULL;
	e->os.dev_copy = e->os.host_copy = NULL;
	e->gr.host_stage = NULL;
	zinf_pool_destroy(e->os.opool);
	e->os.opool = NULL;
	zinf_swap_destroy(e->os.oswap);
	e->os.oswap = NULL;
}

/* Initial values of partition elements [j0, j0 + n) of p (padding: zeros) into out, fp32. */
static int
init_values(struct zinf_engine *e, struct eparam *p, uint64_t j0, uint64_t n, float *out)
{
	uint64_t count = j0 < p->part.count ? ZINF_MIN(n, p->part.count - j0) : 0;
	memset(out + count, 0, (n - count) * sizeof(float));
	if (count == 0) {
		return 0;
	}
	uint64_t first = p->part.offset + j0;
	int ret = 0;
	if (p->init) {
		size_t isz = zinf_dtype_size(p->init_dtype);
		ret = zinf_dtype_convert(out, ZINF_F32, (const char *)p->init + first * isz,
					 p->init_dtype, count);
	} else if (p->init_fn) {
		ret = p->init_fn(p->init_ctx, p->id, first, count, out);
	} else {
		memset(out, 0, count * sizeof(float));
	}
	return ret ? ENG_FAIL(e, ret, "init: parameter \"%s\": initial values", p->name) : 0;
}

/* Initial fp32 values of flat elements [off, off + n) into out. */
static int
init_range(struct zinf_engine *e, uint64_t off, uint64_t n, float *out)
{
	int ret = 0;
	for (uint32_t i = eng_flat_find(e, off); i < e->n_params && n > 0 && !ret; i++) {
		struct eparam *p = &e->params[e->order[i]];
		uint64_t j0 = off - p->flat_off, len = ZINF_MIN(n, p->part.part - j0);
		ret = init_values(e, p, j0, len, out);
		out += len;
		off += len;
		n -= len;
	}
	return ret;
}

/*
 * The initial values, sub-group by sub-group in pieces of at most ZINF_STEP_CHUNK elements
 * (a fp32 and a 16-bit buffer of that size on the heap: host memory does not grow with the
 * model or the partition). The optimizer on NVMe takes a sub-group's master whole
 * (zinf_step_load): it is built in one of the optimizer pool's pinned buffers, which hold a
 * sub-group's state each, and only when the pool cannot spare one, on the heap.
 */
static int
write_initial(struct zinf_engine *e)
{
	size_t ds = eng_dsize(e);
	uint64_t chunk = ZINF_MAX(ZINF_MIN(e->max_sg, (uint64_t)ZINF_STEP_CHUNK), 1);
	bool whole = e->ot->whole;
	void *pool_buf = NULL;
	float *master = NULL;
	void *copy = zc_calloc(chunk, ds);
	int ret = 0;
	if (whole && zinf_pool_free_count(e->os.opool) >= 2 &&
	    zinf_pool_acquire(e->os.opool, 0, &pool_buf) == 0) {
		master = pool_buf;
	} else {
		master = zc_calloc(whole ? e->max_sg : chunk, sizeof(float));
	}
	if (!master || !copy) {
		ret = ENG_FAIL(e, -ENOMEM,
			       "init: out of memory for the initial values (%" PRIu64 " elements)",
			       whole ? e->max_sg : chunk);
		goto out;
	}
	for (uint32_t k = 0; k < e->n_sg && !ret; k++) {
		uint64_t start = eng_sg_start(e, k), end = e->sg_end[k];
		for (uint64_t off = start, n; !ret && (n = zinf_step_piece(off, end)) > 0;
		     off += n) {
			float *m = whole ? master + (off - start) : master;
			ret = init_range(e, off, n, m);
			if (!ret && !whole && (ret = e->ot->write_master(e, k, off, m, n))) {
				ret = ENG_FAIL(e, ret,
					       "init: writing the master weights at %" PRIu64, off);
			}
			if (!ret) {
				ret = zinf_dtype_convert(copy, e->o.dtype, m, ZINF_F32, n);
			}
			if (!ret) {
				ret = eng_param_home_write(e, &e->main, off, copy, false, n);
			}
		}
		if (!ret && whole &&
		    (ret = e->ot->write_master(e, k, start, master, end - start))) {
			ret = ENG_FAIL(e, ret, "init: sub-group %u: writing the master weights", k);
		}
	}
out:
	if (pool_buf) {
		zinf_pool_release(e->os.opool, pool_buf);
	} else {
		zc_free(master);
	}
	zc_free(copy);
	return ret;
}

/* A failed init: the engine keeps the error for good (committed: -EINVAL included, the layout
 * is half built and cannot be laid out again); zinf_engine_destroy() frees what was set up. */
static int
init_failed(struct zinf_engine *e, int ret)
{
	char why[512];
	snprintf(why, sizeof(why), "%s", zinf_last_error());
	ENG_FAIL(e, ret,
		 "init failed (%s): the engine is unusable, every later call returns this error; "
		 "destroy it",
		 why);
	return ret;
}

/* ---- initial values ------------------------------------------------------------------------ */

static int
write_initial_cb(struct zinf_engine *e, void *ctx)
{
	(void)ctx;
	return write_initial(e);
}

int
zinf_engine_init(struct zinf_engine *e)
{
	int ret = eng_begin(e, "init", ENG_KEEPS, false);
	return ret ? ret : eng_return(e, eng_init_with(e, write_initial_cb, NULL));
}

int
eng_init_with(struct zinf_engine *e, int (*write)(struct zinf_engine *e, void *ctx), void *ctx)
{
	if (e->failed) {
		return e->failed;
	}
	if (e->inited || e->n_params == 0) {
		return ENG_FAIL(e, -EINVAL, "init: %s",
				e->inited ? "called twice" : "no parameter registered");
	}
	/* before any collective whose shape they decide: every rank the same options and model */
	int ret = eng_ranks_match(e);
	if (ret) {
		return ret;
	}
	/* From here on a failure leaves the layout, the tiers and the worker half built: the
	   engine is failed for good (every later call, init included, returns the error) */
	eng_commit(e);
	if ((ret = eng_build_layers(e)) || (ret = eng_build_partitions(e)) ||
	    (ret = eng_param_homes(e)) || (ret = eng_step_setup(e)) || (ret = eng_grad_setup(e)) ||
	    (ret = write(e, ctx))) {
		eng_param_write_abort(e);
	}
	/* before the all-gathers: a rank that failed above joins none of them (load's writes
	   included, which may fail on one rank alone) */
	if ((ret = eng_agree(e, ret, "init"))) {
		return init_failed(e, ret);
	}
	/* stages 1-2: every rank wrote its partition of each tensor; stage 3: persistent ones */
	if (e->o.stage > 0) {
		for (uint32_t i = 0; i < e->n_params && !ret; i++) {
			struct eparam *p = &e->params[i];
			if (e->o.stage < 3 || p->persistent) {
				ret = eng_gather_full(e, p);
			}
		}
		if (ret) {
			return init_failed(e, ret);
		}
	}
	if ((ret = eng_order(e, e->cs, e->compute))) {
		return init_failed(e, ret);
	}
	eng_param_io_stats(e); /* init's NVMe writes are not the first window's */
	eng_win_io_zero(e);
	eng_fetch_start(e); /* the persistent parameters live, the trace recording */
	e->inited = true;
	return 0;
}

int
eng_rewrite_with(struct zinf_engine *e, const char *what,
		 int (*write)(struct zinf_engine *e, void *ctx), void *ctx)
{
	char agree[64];
	snprintf(agree, sizeof(agree), "%s: writing the state", what);
	/* the gathered copies go (stage 3), the new values are written and gathered again */
	int ret = e->o.stage == 3 ? eng_fetch_drop_all(e) : 0;
	if (!ret) {
		ret = write(e, ctx);
	}
	if (ret) {
		eng_param_write_abort(e); /* a partition left open in the parameter store */
	}
	/* before the all-gathers: a rank whose writes failed joins none of them */
	ret = eng_agree(e, ret, agree);
	for (uint32_t i = 0; i < e->n_params && !ret && e->o.stage > 0; i++) {
		struct eparam *p = &e->params[i];
		if (e->o.stage < 3 || p->persistent) {
			ret = eng_gather_full(e, p);
		}
	}
	if (!ret) {
		ret = eng_order(e, e->cs, e->compute);
	}
	eng_param_io_stats(e); /* not the window's NVMe bytes */
	eng_win_io_zero(e);
	return ret;
}
