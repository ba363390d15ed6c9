/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine_call.c: what every public call of the engine shares, and what the trainer and the
 * modules over the core read of it: the error boundary (eng_begin .. eng_return), the agreement
 * of an outcome across ranks, the small collectives' helpers, the getters, the learning rate and
 * betas and the optimizer window's opening, the statistics, and engine_module.h's view, counters
 * and background job. Creating and destroying an engine: engine.c.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/opts.h"
#include "comm/comm_internal.h"
#include "engine/engine_internal.h"

/* ---- shared helpers ------------------------------------------------------------------------ */

const char *
eng_cause(const struct zinf_engine *e)
{
	char prefix[32];
	const char *s = zinf_last_error();
	int n = snprintf(prefix, sizeof(prefix), "engine rank %d: ", e->rank);
	return n > 0 && strncmp(s, prefix, (size_t)n) == 0 ? s + n : s;
}

int
eng_comm_buf_alloc(struct zinf_engine *e, size_t bytes, void **out)
{
	return zinf_device_alloc(e->dev, bytes, out);
}

void
eng_comm_buf_free(struct zinf_engine *e, void *p)
{
	if (p && !(e->comm && zinf_comm_failed(e->comm))) {
		zinf_device_free(e->dev, p);
	} else if (p) {
		zc_leave(p); /* an abandoned collective may still write it (host device: heap) */
	}
}

/* ---- the error boundary (engine_internal.h) ---------------------------------------------- */

int
eng_begin(struct zinf_engine *e, const char *what, enum eng_rule rule, bool inited)
{
	if (!e) {
		return ZINF_FAIL(-EINVAL, "engine: %s with a NULL engine", what);
	}
	e->call.what = what;
	e->call.rule = rule;
	e->call.committed = false;
	e->call.known = 0;
	if (e->failed) {
		return e->failed;
	}
	if (inited && !e->inited) {
		return ENG_FAIL(e, -EINVAL, "%s before zinf_engine_init", what);
	}
	return 0;
}

void
eng_commit(struct zinf_engine *e)
{
	e->call.committed = true;
}

int
eng_known(struct zinf_engine *e, int err)
{
	e->call.known = err;
	return err;
}

int
eng_return(struct zinf_engine *e, int rc)
{
	bool fails = rc < 0 && !e->failed &&
		     (e->call.committed || (e->call.rule == ENG_FAILS && rc != -EINVAL));
	if (fails) {
		e->failed = rc;
		/* tell the others, who may wait for this rank in a collective (a fetch's
		   all-gather, a gradient reduce-scatter), with the message just logged (the
		   failing call's); an error every rank knows, or one that came from another
		   rank's notice (the comm layer knows), tells no one */
		bool known = e->call.known != 0 && e->call.known == rc;
		if (!known && e->world > 1 && e->comm) {
			char why[512];
			snprintf(why, sizeof(why), "%s", zinf_last_error());
			(void)zinf_comm_notify_failure(e->comm, rc, why);
		}
	}
	e->call.known = 0;
	return rc;
}

int
zinf_engine_abort(struct zinf_engine *e, const char *why)
{
	int rc = eng_begin(e, "abort", ENG_KEEPS, false);
	if (rc) {
		return rc;
	}
	eng_commit(e);
	return eng_return(e, ENG_FAIL(e, -ECANCELED, "aborted by the trainer: %s",
				      why ? why : "(no reason given)"));
}

struct elayer *
eng_layer(struct zinf_engine *e, int32_t layer)
{
	uint32_t lo = 0, hi = e->n_layers;
	while (lo < hi) {
		uint32_t mid = (lo + hi) / 2;
		if (e->layers[mid].layer == layer) {
			return &e->layers[mid];
		}
		if (e->layers[mid].layer < layer) {
			lo = mid + 1;
		} else {
			hi = mid;
		}
	}
	return NULL;
}

size_t
eng_dsize(const struct zinf_engine *e)
{
	return zinf_dtype_size(e->o.dtype);
}

int
eng_order(struct zinf_engine *e, struct zinf_stream *from, struct zinf_stream *to)
{
	struct zinf_event *ev = from == e->compute ? e->ev_compute : e->ev_cs;
	int ret = zinf_event_record(ev, from);
	if (!ret) {
		ret = zinf_stream_wait_event(to, ev);
	}
	return ret;
}

/*
 * The element-wise MAX over ranks of n <= ENG_SCRATCH small floats (host memory v), through
 * device memory so that "nccl" can run it; returns with the result in v.
 */
int
eng_all_max(struct zinf_engine *e, float *v, uint32_t n)
{
	int ret = zinf_device_copy(e->cs, e->scratch, v, n * sizeof(float), ZINF_COPY_H2D);
	if (!ret) {
		ret = zinf_stream_sync(e->cs);
	}
	if (!ret) {
		ret = zinf_comm_all_reduce(e->comm, e->scratch, n, ZINF_F32, ZINF_COMM_MAX, NULL);
	}
	if (!ret) {
		ret = zinf_device_copy(e->cs, v, e->scratch, n * sizeof(float), ZINF_COPY_D2H);
	}
	if (!ret) {
		ret = zinf_stream_sync(e->cs);
	}
	return ret;
}

/* The outcome's exchange; with `hyper`, also the step's lr and betas (their MAX and -MIN). */
static int
agree(struct zinf_engine *e, int err, const char *what, bool hyper)
{
	e->call.known = 0;
	if (e->world == 1) {
		return err;
	}
	int cf = zinf_comm_failed(e->comm);
	if (cf) { /* nothing more can be exchanged; the others' collectives fail too */
		return err ? err : cf;
	}
	float v[8] = {err ? (float)(e->rank + 1) : 0.0f,
		      err ? (float)-err : 0.0f,
		      e->step_lr,
		      -e->step_lr,
		      e->step_beta1,
		      -e->step_beta1,
		      e->step_beta2,
		      -e->step_beta2};
	_Static_assert(8 <= ENG_SCRATCH, "the scratch holds the exchange");
	/* always all 8, so that a rank whose step failed early (eng_agree) and one that reached
	   eng_agree_step post the same collective */
	int ret = eng_all_max(e, v, 8);
	if (err) {
		e->call.known = ret ? 0 : err; /* exchanged: the others return an error too */
		return err;
	}
	if (ret) {
		return ENG_FAIL(e, ret, "%s: agreeing on the outcome across ranks", what);
	}
	if (v[0] > 0) {
		int other = (int)v[0] - 1, code = -(int)v[1];
		e->call.known = code;
		return ENG_FAIL(e, code, "%s failed on rank %d (%s): this rank stops too", what,
				other, zinf_strerror(code));
	}
	/* every rank sees the same extremes: the same error everywhere, no notice */
	static const char *const name[] = {"learning rate (zinf_engine_set_lr)",
					   "beta1 (zinf_engine_set_betas)",
					   "beta2 (zinf_engine_set_betas)"};
	for (int i = 0; hyper && i < 3; i++) {
		float hi = v[2 + 2 * i], lo = -v[3 + 2 * i];
		if (hi != lo) {
			return eng_known(
				e, ENG_FAIL(e, -EINVAL,
					    "%s: step %" PRId64 " ran with different %s on "
					    "different ranks: from %.9g to %.9g (every rank "
					    "must set the same values)",
					    what, e->steps + 1, name[i], (double)lo, (double)hi));
		}
	}
	return 0;
}

int
eng_agree(struct zinf_engine *e, int err, const char *what)
{
	return agree(e, err, what, false);
}

int
eng_agree_step(struct zinf_engine *e, int err, const char *what)
{
	return agree(e, err, what, true);
}

/* ---- getters ------------------------------------------------------------------------------- */

int
zinf_engine_rank(const struct zinf_engine *e)
{
	return e ? e->rank : -EINVAL;
}

int
zinf_engine_world(const struct zinf_engine *e)
{
	return e ? e->world : -EINVAL;
}

struct zinf_device *
zinf_engine_device(const struct zinf_engine *e)
{
	return e ? e->dev : NULL;
}

struct zinf_stream *
zinf_engine_compute_stream(const struct zinf_engine *e)
{
	return e ? e->compute : NULL;
}

struct zinf_io *
zinf_engine_io(const struct zinf_engine *e)
{
	return e ? e->io : NULL;
}

int
zinf_engine_param_count(const struct zinf_engine *e)
{
	return e ? (int)e->n_params : -EINVAL;
}

int
zinf_engine_param_find(const struct zinf_engine *e, const char *name)
{
	if (!e || !name) {
		return -EINVAL;
	}
	for (uint32_t i = 0; i < e->n_params; i++) {
		if (strcmp(e->params[i].name, name) == 0) {
			return (int)i;
		}
	}
	return -ENOENT;
}

int
zinf_engine_set_lr(struct zinf_engine *e, float lr)
{
	if (!e) {
		return ZINF_FAIL(-EINVAL, "engine: set_lr with a NULL engine");
	}
	if (!(lr >= 0) || isinf(lr)) {
		return ENG_FAIL(e, -EINVAL, "set_lr: lr %g is not a finite value >= 0", (double)lr);
	}
	/* taken by the step at the first gradient of its boundary micro-batch (eng_latch_lr) */
	e->lr = lr;
	return 0;
}

int
zinf_engine_set_betas(struct zinf_engine *e, float beta1, float beta2)
{
	if (!e) {
		return ZINF_FAIL(-EINVAL, "engine: set_betas with a NULL engine");
	}
	if (e->o.optimizer.kind == ZINF_OPTIM_ADAGRAD) {
		return -EOPNOTSUPP;
	}
	if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1)) {
		return ENG_FAIL(e, -EINVAL, "set_betas: betas (%g, %g) outside [0, 1)",
				(double)beta1, (double)beta2);
	}
	/* taken with the lr (eng_latch_lr) */
	e->beta1 = beta1;
	e->beta2 = beta2;
	return 0;
}

/*
 * The learning rate and betas of the coming step are the ones set before the first gradient
 * of its boundary micro-batch: from then on sub-groups may be stepped during backward, and
 * stepping after backward must use the same values to give the same bits.
 */
int
eng_latch_lr(struct zinf_engine *e)
{
	int ret = 0;
	if (e->lr != e->step_lr && !(ret = zinf_optimizer_set_lr(e->opt, e->lr))) {
		e->step_lr = e->lr;
	}
	if (!ret && (e->beta1 != e->step_beta1 || e->beta2 != e->step_beta2) &&
	    !(ret = zinf_optimizer_set_betas(e->opt, e->beta1, e->beta2))) {
		e->step_beta1 = e->beta1;
		e->step_beta2 = e->beta2;
	}
	return ret;
}

/* ---- what the modules over the core see (engine_module.h) ---------------------------------- */

void
eng_job_start(struct zinf_engine *e, const struct eng_job_ops *ops, void *ctx)
{
	e->job.ops = ops;
	e->job.ctx = ctx;
}

bool
eng_job_pending(const struct zinf_engine *e)
{
	return e->job.ops != NULL;
}

int
eng_job_finish(struct zinf_engine *e)
{
	if (!e->job.ops) {
		return 0;
	}
	const struct eng_job_ops *ops = e->job.ops;
	e->job.ops = NULL; /* finished once, whatever it returns */
	e->job.last = ops->finish(e, e->job.ctx);
	return e->job.last;
}

int
eng_job_take_result(struct zinf_engine *e)
{
	int r = e->job.last;
	e->job.last = 0;
	return r;
}

void
eng_view(const struct zinf_engine *e, struct eng_view *v)
{
	*v = (struct eng_view){
		.o = &e->o,
		.opt = e->opt,
		.nparts = e->nparts,
		.n_params = e->n_params,
		.n_layers = e->n_layers,
		.n_sg = e->n_sg,
		.sg_end = e->sg_end,
		.flat_n = e->flat_n,
		.rank = e->rank,
		.world = e->world,
		.W = e->W,
		.dev = e->dev,
		.io = e->io,
		.cs = e->cs,
		.compute = e->compute,
		.inited = e->inited,
		.in_window = e->micro != 0 || e->grads_seen != 0,
		.micro = e->micro,
		.state_on_device = e->ot->dev,
		.fetched_layer = INT32_MIN,
	};
	for (uint32_t i = 0; e->inited && i < e->n_layers; i++) {
		if (e->layers[i].fetched) {
			v->fetched_layer = e->layers[i].layer;
			break;
		}
	}
}

void
eng_param_get(const struct zinf_engine *e, uint32_t id, struct eng_param *out)
{
	const struct eparam *p = &e->params[id];
	*out = (struct eng_param){
		.id = p->id,
		.name = p->name,
		.numel = p->numel,
		.layer = p->layer,
		.ndim = p->ndim,
		.shape = p->shape,
		.part = p->part,
		.flat_off = p->flat_off,
		.sg = p->sg,
		.persistent = p->persistent,
		.no_decay = p->no_decay,
	};
}

uint32_t
eng_flat_param(const struct zinf_engine *e, uint32_t i)
{
	return e->order[i];
}

void
eng_counters_get(const struct zinf_engine *e, struct eng_counters *out)
{
	*out = (struct eng_counters){
		.steps = e->steps,
		.micro_steps = e->micro_steps,
		.skipped = e->cl.skipped,
		.lr = e->lr,
		.beta1 = e->beta1,
		.beta2 = e->beta2,
		.ls = e->cl.ls,
	};
}

void
eng_counters_set(struct zinf_engine *e, const struct eng_counters *c, bool betas, bool ls)
{
	e->steps = c->steps;
	e->micro_steps = c->micro_steps;
	e->cl.skipped = c->skipped;
	e->lr = c->lr;
	if (betas && e->o.optimizer.kind != ZINF_OPTIM_ADAGRAD) {
		e->beta1 = c->beta1;
		e->beta2 = c->beta2;
	}
	if (ls && e->o.fp16.enabled) { /* its state; its settings stay the options' */
		e->cl.ls.scale = c->ls.scale;
		e->cl.ls.cur_hysteresis = c->ls.cur_hysteresis;
		e->cl.ls.iter = c->ls.iter;
		e->cl.ls.last_overflow = c->ls.last_overflow;
		e->cl.ls.overflows = c->ls.overflows;
	}
}

/* The window's NVMe byte counters to 0: what init or a rewrite moved is not a window's. */
void
eng_win_io_zero(struct zinf_engine *e)
{
	e->win.nvme_read_bytes = e->win.nvme_write_bytes = 0;
	e->win.param_nvme_read_bytes = e->win.param_nvme_write_bytes = 0;
	e->win.grad_nvme_read_bytes = e->win.grad_nvme_write_bytes = 0;
}

bool
eng_all_zero(const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++) {
		if (b[i]) {
			return false;
		}
	}
	return true;
}
