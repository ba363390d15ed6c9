/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine.c: the ZeRO engine's handle: option defaults and checks, create/destroy (the
 * device, the communicator, the streams and the optimizer), getters, statistics and the
 * learning rate. The layout and tiers are engine_param.c's; the data paths are in
 * engine_fetch.c, engine_grad.c and engine_step.c. It does not read ds_config.json (config*.c
 * fills struct zinf_engine_opts).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/opts.h"
#include "comm/comm_internal.h"
#include "engine/engine_internal.h"

ZINF_OPTS_NO_TAIL_PAD(struct zinf_engine_opts, reserved6);
ZINF_OPTS_NO_TAIL_PAD(struct zinf_param_desc, shape);

static void
offload_defaults(struct zinf_offload_opts *o, uint32_t buffers)
{
	memset(o, 0, sizeof(*o));
	o->device = ZINF_OFFLOAD_NONE;
	o->buffer_count = buffers;
	o->buffer_size = 100000000ull;
	o->max_in_cpu = 1000000000ull;
	o->ratio = 1.0;
}

void
zinf_engine_opts_init(struct zinf_engine_opts *o)
{
	if (!o) {
		return;
	}
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	offload_defaults(&o->offload_param, 5);
	offload_defaults(&o->offload_optimizer, 4);
	o->sub_group_size = 1000000000ull;
	o->reduce_bucket_size = 500000000ull;
	o->allgather_bucket_size = 500000000ull;
	o->contiguous_gradients = true;
	o->stage3_prefetch_bucket_size = 50000000ull;
	o->stage3_max_live_parameters = 1000000000ull;
	o->stage3_max_reuse_distance = 1000000000ull;
	o->stage3_param_persistence_threshold = 100000ull;
	o->stage3_model_persistence_threshold = UINT64_MAX;
	o->gradient_accumulation_steps = 1;
	zinf_optimizer_opts_init(&o->optimizer, ZINF_OPTIM_ADAMW);
	o->dtype = ZINF_BF16;
	o->aio.block_size = 1048576;
	o->aio.queue_depth = 8;
	o->aio.intra_op_parallelism = 1;
	o->aio.overlap_events = true;
	o->device_index = -1;
	o->comm_timeout_s = 1800.0;
	o->step_during_backward = true;
	o->record_trace = true;
	zinf_fp16_opts_init(&o->fp16);
}

void
zinf_param_desc_init(struct zinf_param_desc *d)
{
	if (!d) {
		return;
	}
	memset(d, 0, sizeof(*d));
	d->size = sizeof(*d);
	d->init_dtype = ZINF_F32;
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

static int
check_offload(const struct zinf_offload_opts *s, const char *key)
{
	if (s->device > ZINF_OFFLOAD_NVME) {
		return ZINF_FAIL(-EINVAL, "engine: %s.device %d is not none, cpu or nvme", key,
				 (int)s->device);
	}
	if (s->n_paths > ZINF_ENGINE_MAX_PATHS) {
		return ZINF_FAIL(-EINVAL, "engine: %s.nvme_path has %u entries (at most %d)", key,
				 s->n_paths, ZINF_ENGINE_MAX_PATHS);
	}
	if (s->device == ZINF_OFFLOAD_NVME) {
		if (s->n_paths == 0) {
			return ZINF_FAIL(-EINVAL,
					 "engine: %s.device is nvme but %s.nvme_path is "
					 "empty",
					 key, key);
		}
		for (uint32_t i = 0; i < s->n_paths; i++) {
			if (!s->nvme_path[i] || !s->nvme_path[i][0]) {
				return ZINF_FAIL(-EINVAL, "engine: %s.nvme_path[%u] is empty", key,
						 i);
			}
		}
		if (s->buffer_count == 0) {
			return ZINF_FAIL(-EINVAL, "engine: %s.buffer_count is 0 with device nvme",
					 key);
		}
	}
	if (s->ratio != 1.0) {
		return ZINF_FAIL(-EINVAL, "engine: %s.ratio %g: only 1.0 is supported", key,
				 s->ratio);
	}
	return 0;
}

static int
check_opts(const struct zinf_engine_opts *o)
{
	int ret;
	if (o->stage < 0 || o->stage > 3) {
		return ZINF_FAIL(-EINVAL, "engine: zero_optimization.stage %d is not 0..3",
				 o->stage);
	}
	if ((ret = check_offload(&o->offload_param, "zero_optimization.offload_param")) ||
	    (ret = check_offload(&o->offload_optimizer, "zero_optimization.offload_optimizer"))) {
		return ret;
	}
	if (o->offload_param.device != ZINF_OFFLOAD_NONE && o->stage < 3) {
		return ZINF_FAIL(-EINVAL,
				 "engine: zero_optimization.offload_param needs stage 3 "
				 "(stage is %d)",
				 o->stage);
	}
	if (o->offload_optimizer.device != ZINF_OFFLOAD_NONE && o->stage == 0) {
		return ZINF_FAIL(-EINVAL, "engine: zero_optimization.offload_optimizer needs "
					  "stage 1, 2 or 3 (stage is 0)");
	}
	if (o->aio.use_gds) {
		return ZINF_FAIL(-EINVAL, "engine: aio.use_gds: GPUDirect Storage is not "
					  "supported");
	}
	if (o->dtype != ZINF_F32 && o->dtype != ZINF_F16 && o->dtype != ZINF_BF16) {
		return ZINF_FAIL(-EINVAL, "engine: dtype %d is not f32, f16 or bf16",
				 (int)o->dtype);
	}
	if (o->sub_group_size == 0 || o->reduce_bucket_size == 0 || o->allgather_bucket_size == 0 ||
	    o->gradient_accumulation_steps == 0) {
		return ZINF_FAIL(-EINVAL, "engine: zero_optimization.%s is 0",
				 o->sub_group_size == 0		 ? "sub_group_size"
				 : o->reduce_bucket_size == 0	 ? "reduce_bucket_size"
				 : o->allgather_bucket_size == 0 ? "allgather_bucket_size"
								 : "gradient_accumulation_steps");
	}
	if (o->reserved0 || o->reserved2 || o->reserved3 || !eng_all_zero(o->reserved1, 6) ||
	    !eng_all_zero(o->reserved4, 2) || !eng_all_zero(o->reserved5, 6) ||
	    !eng_all_zero(o->reserved6, 6) || o->aio.reserved[0]) {
		return ZINF_FAIL(-EINVAL, "engine: reserved option bytes are not zero");
	}
	if (o->optimizer_schedule > ZINF_SCHEDULE_DEEPSPEED) {
		return ZINF_FAIL(-EINVAL,
				 "engine: optimizer_schedule %u: 0 (pipelined) or 1 "
				 "(deepspeed)",
				 o->optimizer_schedule);
	}
	if (!(o->comm_timeout_s > 0)) {
		return ZINF_FAIL(-EINVAL, "engine: comm_timeout_s %g is not positive",
				 o->comm_timeout_s);
	}
	return 0;
}

static int
dup_str(const char *s, char **out)
{
	*out = NULL;
	if (!s) {
		return 0;
	}
	*out = zinf_strdup(s);
	return *out ? 0 : -ENOMEM;
}

static int
copy_strings(struct zinf_engine *e)
{
	struct zinf_engine_opts *o = &e->o;
	if (dup_str(o->device_backend, &e->device_backend) ||
	    dup_str(o->comm_backend, &e->comm_backend) || dup_str(o->io_backend, &e->io_backend) ||
	    dup_str(o->swap_prefix ? o->swap_prefix : "zinf", &e->swap_prefix)) {
		return -ENOMEM;
	}
	o->device_backend = e->device_backend;
	o->comm_backend = e->comm_backend;
	o->io_backend = e->io_backend;
	o->swap_prefix = e->swap_prefix;
	for (uint32_t i = 0; i < o->offload_param.n_paths; i++) {
		if (dup_str(o->offload_param.nvme_path[i], &e->param_paths[i])) {
			return -ENOMEM;
		}
		o->offload_param.nvme_path[i] = e->param_paths[i];
	}
	for (uint32_t i = 0; i < o->offload_optimizer.n_paths; i++) {
		if (dup_str(o->offload_optimizer.nvme_path[i], &e->optim_paths[i])) {
			return -ENOMEM;
		}
		o->offload_optimizer.nvme_path[i] = e->optim_paths[i];
	}
	return 0;
}

/* The node-local rank as the launchers export it (Open MPI, MPICH/Intel MPI's hydra, MVAPICH2,
 * Cray PALS, PMIx, Slurm, torchrun), before any communicator exists: the device is opened first
 * (nccl's communicator needs its stream). *from: the variable, or NULL (none set: 0). */
static int
local_rank_env(const char **from)
{
	static const char *const v[] = {"OMPI_COMM_WORLD_LOCAL_RANK",
					"MPI_LOCALRANKID",
					"MV2_COMM_WORLD_LOCAL_RANK",
					"PALS_LOCAL_RANKID",
					"PMIX_LOCAL_RANK",
					"SLURM_LOCALID",
					"LOCAL_RANK"};
	for (size_t i = 0; i < ZINF_ARRAY_SIZE(v); i++) {
		const char *s = getenv(v[i]);
		if (s && *s) {
			*from = v[i];
			return atoi(s);
		}
	}
	*from = NULL;
	return 0;
}

static int
open_device(struct zinf_engine *e)
{
	if (e->o.device) {
		e->dev = e->o.device;
		return 0;
	}
	struct zinf_device_opts d;
	zinf_device_opts_init(&d);
	d.backend = e->o.device_backend;
	d.host_sync = e->o.host_sync;
	d.index = e->o.device_index;
	if (d.index < 0) {
		/* the local rank modulo the devices present, opened directly (no context on
		   device 0 for every rank first) */
		int n = zinf_device_count(e->o.device_backend);
		if (n < 0) {
			return n;
		}
		d.index = n > 0 ? local_rank_env(&e->dev_from) % n : 0;
		e->dev_count = n;
		e->dev_chosen = true;
	}
	int ret = zinf_device_create(&d, &e->dev);
	if (ret) {
		return ret;
	}
	e->own_dev = true;
	return 0;
}

static int
open_comm(struct zinf_engine *e)
{
	if (e->o.comm) {
		e->comm = e->o.comm;
	} else {
		struct zinf_comm_opts c;
		zinf_comm_opts_init(&c);
		c.backend = e->o.comm_backend;
		if (!c.backend && strcmp(zinf_device_backend(e->dev), "host") != 0) {
			/* a GPU: its collectives are nccl's (one rank too), whatever the launcher
			 */
			c.backend = "nccl";
		}
		c.timeout_s = e->o.comm_timeout_s;
		c.check = e->o.comm_check;
		c.stream = zinf_stream_native(e->cs);
		c.device = zinf_device_index(e->dev);
		int ret = zinf_comm_create(&c, &e->comm);
		if (ret) {
			return ret;
		}
		e->own_comm = true;
	}
	e->rank = zinf_comm_rank(e->comm);
	e->world = zinf_comm_world(e->comm);
	const char *cb = zinf_comm_backend(e->comm);
	bool host_dev = strcmp(zinf_device_backend(e->dev), "host") == 0;
	e->host_comm = strcmp(cb, "nccl") != 0;
	if (e->host_comm != host_dev) {
		return ENG_FAIL(e, -EINVAL,
				"comm_backend \"%s\" with device \"%s\": the engine needs host "
				"collectives (mpi, single) with the host device and nccl with cuda",
				cb, zinf_device_backend(e->dev));
	}
	e->W = e->o.stage == 0 ? 1 : e->world;
	/* A device chosen from the environment must be the one the communicator's local rank
	   (MPI_COMM_TYPE_SHARED) gives: else ranks of a node share a GPU, silently */
	int lr = zinf_comm_local_rank(e->comm);
	if (e->dev_chosen && e->dev_count > 1 && lr >= 0 &&
	    lr % e->dev_count != zinf_device_index(e->dev)) {
		return ENG_FAIL(
			e, -EINVAL,
			"device %d was chosen from %s, but this rank is local rank %d of its "
			"node: set the device index (zinf_engine_opts.device_index) or launch "
			"with a launcher that exports OMPI_COMM_WORLD_LOCAL_RANK, "
			"MPI_LOCALRANKID, SLURM_LOCALID or LOCAL_RANK",
			zinf_device_index(e->dev), e->dev_from ? e->dev_from : "nothing (device 0)",
			lr);
	}
	return 0;
}

int
zinf_engine_create(const struct zinf_engine_opts *opts, struct zinf_engine **out)
{
	if (!out) {
		return ZINF_FAIL(-EINVAL, "engine: create with a NULL out");
	}
	struct zinf_engine *e = zinf_calloc(1, sizeof(*e));
	if (!e) {
		return ZINF_FAIL(-ENOMEM, "engine: out of memory for the handle");
	}
	e->ps.nv_open = -1; /* before any failure: destroy looks at it */
	zinf_engine_opts_init(&e->o);
	int ret = zinf_opts_take(&e->o, sizeof(e->o), opts, "zinf_engine_opts");
	if (ret || (ret = check_opts(&e->o)) || (ret = eng_clip_init(e))) {
		goto fail;
	}
	if ((ret = copy_strings(e))) {
		ret = ZINF_FAIL(-ENOMEM, "engine: out of memory copying the options' strings");
		goto fail;
	}
	e->main.s = NULL; /* set once cs exists */
	e->main.st = &e->win;
	pthread_mutex_init(&e->ps.store_mu, NULL);
	e->ps.store_mu_init = true;
	e->ot = e->o.offload_optimizer.device == ZINF_OFFLOAD_NVME  ? &eng_otier_nvme
		: e->o.offload_optimizer.device == ZINF_OFFLOAD_CPU ? &eng_otier_cpu
								    : &eng_otier_gpu;
	e->pt = e->o.stage < 3					 ? &eng_ptier_full
		: e->o.offload_param.device == ZINF_OFFLOAD_NVME ? &eng_ptier_nvme
		: e->o.offload_param.device == ZINF_OFFLOAD_CPU	 ? &eng_ptier_cpu
								 : &eng_ptier_gpu;
	if ((ret = open_device(e))) {
		goto fail;
	}
	if ((ret = zinf_stream_wrap(e->dev, e->o.compute_stream, "compute", &e->compute))) {
		goto fail;
	}
	if (e->o.comm && zinf_comm_backend(e->o.comm) &&
	    strcmp(zinf_comm_backend(e->o.comm), "nccl") == 0) {
		/* the caller's NCCL communicator orders its collectives on its own stream (the
		   one it was given, or the one it created): the engine's copies and casts go on
		   that stream too */
		ret = zinf_stream_wrap(e->dev, zinf_comm_stream(e->o.comm), "zinf-engine", &e->cs);
	} else {
		ret = zinf_stream_create(e->dev, "zinf-engine", &e->cs);
	}
	if (ret || (ret = zinf_event_create(e->dev, &e->ev_compute)) ||
	    (ret = zinf_event_create(e->dev, &e->ev_cs))) {
		goto fail;
	}
	e->main.s = e->cs;
	if ((ret = open_comm(e))) {
		goto fail;
	}
	if ((ret = eng_comm_buf_alloc(e, sizeof(float) * ENG_SCRATCH, &e->scratch))) {
		ret = ENG_FAIL(e, ret, "create: device memory for the small all-reduces");
		goto fail;
	}
	if ((ret = zinf_optimizer_create(&e->o.optimizer, &e->opt))) {
		goto fail;
	}
	e->lr = e->step_lr = e->o.optimizer.lr;
	e->beta1 = e->step_beta1 = e->o.optimizer.beta1;
	e->beta2 = e->step_beta2 = e->o.optimizer.beta2;
	e->nparts = zinf_optimizer_part_count(e->opt);
	if (e->ot->dev && !e->host_comm &&
	    (e->o.optimizer.kind > ZINF_OPTIM_ADAMW || e->o.optimizer.state_dtype != ZINF_F32)) {
		ret = ENG_FAIL(e, -EINVAL,
			       "zero_optimization.offload_optimizer.device none on \"%s\": the "
			       "device optimizer is Adam/AdamW with fp32 state (optimizer %s)",
			       zinf_device_backend(e->dev), zinf_optimizer_name(e->opt));
		goto fail;
	}
	e->window_t0 = -1;
	*out = e;
	return 0;
fail:
	zinf_engine_destroy(e);
	return ret;
}

void
zinf_engine_destroy(struct zinf_engine *e)
{
	if (!e) {
		return;
	}
	if (e->job.ops) { /* a background job (a save) is joined, not published */
		const struct eng_job_ops *ops = e->job.ops;
		e->job.ops = NULL;
		ops->abandon(e, e->job.ctx);
	}
	if (e->cs) {
		zinf_stream_sync(e->cs);
	}
	if (e->compute) {
		zinf_stream_sync(e->compute);
	}
	eng_grad_free(e);
	eng_fetch_free(e);
	eng_step_free(e);	  /* the worker joined: a partition still open was this thread's */
	eng_param_write_abort(e); /* (a step that failed between its pieces) */
	eng_param_free(e);
	zinf_optimizer_destroy(e->opt);
	if (e->scratch) {
		eng_comm_buf_free(e, e->scratch);
	}
	/* the communicator before the streams: nccl's finalisation flushes what it queued on cs */
	if (e->own_comm) {
		zinf_comm_destroy(e->comm);
	}
	zinf_event_destroy(e->ev_compute);
	zinf_event_destroy(e->ev_cs);
	zinf_stream_destroy(e->cs);
	zinf_stream_destroy(e->compute);
	if (e->own_dev) {
		zinf_device_destroy(e->dev);
	}
	for (uint32_t i = 0; i < e->n_params; i++) {
		zinf_free(e->params[i].name);
	}
	zinf_free(e->params);
	for (uint32_t i = 0; i < e->n_layers; i++) {
		zinf_free(e->layers[i].params);
	}
	zinf_free(e->layers);
	zinf_free(e->order);
	zinf_free(e->sg_end);
	zinf_free(e->sg_params);
	zinf_free(e->gr.sg_pending);
	zinf_free(e->sg_first);
	for (uint32_t i = 0; i < ZINF_ENGINE_MAX_PATHS; i++) {
		zinf_free(e->param_paths[i]);
		zinf_free(e->optim_paths[i]);
	}
	if (e->ps.store_mu_init) {
		pthread_mutex_destroy(&e->ps.store_mu);
	}
	zinf_free(e->device_backend);
	zinf_free(e->comm_backend);
	zinf_free(e->io_backend);
	zinf_free(e->swap_prefix);
	zinf_free(e);
}

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
		zinf_leave(p); /* an abandoned collective may still write it (host device: heap) */
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

ZINF_API int
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

int
eng_agree(struct zinf_engine *e, int err, const char *what)
{
	e->call.known = 0;
	if (e->world == 1) {
		return err;
	}
	int cf = zinf_comm_failed(e->comm);
	if (cf) { /* nothing more can be exchanged; the others' collectives fail too */
		return err ? err : cf;
	}
	float v[2] = {err ? (float)(e->rank + 1) : 0.0f, err ? (float)-err : 0.0f};
	int ret = eng_all_max(e, v, 2);
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
	return 0;
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
static int
latch_lr(struct zinf_engine *e)
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

int
eng_window_open(struct zinf_engine *e)
{
	/* a background save copies the state the step is about to change: it is published first
	   (its errors are zinf_engine_save_wait's) */
	(void)eng_job_finish(e);
	int ret = latch_lr(e);
	if (ret) {
		return ret;
	}
	eng_spec_begin(e); /* with clipping or fp16: the grad_scale assumed */
	/* the window is open from here on (read_master refuses): the worker may begin the step and
	   read ahead (a forward alone, an evaluation, begins nothing) */
	eng_worker_prime(e);
	return 0;
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

int64_t
zinf_engine_steps(const struct zinf_engine *e)
{
	return e ? e->steps : 0;
}

int
zinf_engine_get_stats(const struct zinf_engine *e, struct zinf_engine_stats *out)
{
	if (!e || !out) {
		return ZINF_FAIL(-EINVAL, "engine: get_stats with a NULL %s", e ? "out" : "engine");
	}
	struct zinf_engine_stats s = e->last;
	s.size = sizeof(s);
	s.steps = (uint64_t)e->steps;
	s.micro_steps = e->micro_steps;
	s.peak_live_elems = e->fx.peak_live;
	s.live_elems = e->fx.live_elems;
	s.persistent_elems = e->fx.persistent_elems;
	s.sub_groups = e->n_sg;
	s.trace_hits = e->fx.trace_hits;
	s.trace_misses = e->fx.trace_misses;
	s.trace_invalidations = e->fx.trace_invalidations;
	s.host_pool_bytes = zinf_pool_bytes(e->os.opool) + zinf_pool_bytes(e->ps.ppool);
	eng_clip_stats(e, &s);
	return zinf_stats_give(out, &s, sizeof(s), "zinf_engine_stats");
}
