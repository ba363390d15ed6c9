/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine.c: the ZeRO engine's handle: option defaults and checks, create and destroy (the
 * device, the communicator, the streams, the optimizer, the tiers' tables). What every call
 * shares (the error boundary, getters, statistics, the lr): engine_call.c; the layout:
 * engine_param.c; where state lives: engine_otier.c and engine_ptier.c; the data paths:
 * engine_fetch.c, engine_grad.c and engine_step.c. It does not read ds_config.json (config/
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
	o->dtype = ZINF_F32; /* as zinf_config_init and DeepSpeed without fp16 or bf16 */
	o->aio.block_size = 1048576;
	o->aio.queue_depth = 8;
	o->aio.intra_op_parallelism = 1;
	o->aio.overlap_events = true;
	o->device_index = -1;
	o->comm_timeout_s = comm_timeout_default(); /* $ZINF_COMM_TIMEOUT_S, else 1800 s */
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
			/* DeepSpeed's schema takes 0 too; its swapper then fails for want of a
			   buffer */
			return ZINF_FAIL(-EINVAL,
					 "engine: %s.buffer_count is 0 with device nvme: the swap "
					 "needs at least one pinned buffer",
					 key);
		}
		if (s->buffer_size == 0 && strcmp(key, "zero_optimization.offload_param") == 0) {
			/* the parameters' buffers hold a partition each: none would fit */
			return ZINF_FAIL(-EINVAL,
					 "engine: %s.buffer_size is 0 with device nvme: no "
					 "parameter's partition fits a buffer of 0 elements",
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
	if (o->optimizer.master_dtype == ZINF_BF16 && o->dtype == ZINF_F16) {
		/* the step's fp16 copy is the float update rounded, a load's the bf16 master's:
		   a resumed run would not be the uninterrupted one */
		return ZINF_FAIL(
			-EINVAL,
			"engine: optimizer.params.zinf_master_weights (or "
			"bf16.bf16_master_weights_and_grads) bf16 with fp16 parameters: not "
			"supported; a bf16 master goes with bf16 or fp32 parameters");
	}
	/* sub_group_size, reduce_bucket_size, allgather_bucket_size 0: DeepSpeed's meaning
	   (engine.h) */
	if (o->gradient_accumulation_steps == 0) {
		return ZINF_FAIL(-EINVAL, "engine: gradient_accumulation_steps is 0");
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
	return comm_timeout_check(o->comm_timeout_s, "engine");
}

/* Element counts past ZINF_ENGINE_MAX_ELEMS mean "no limit" (or a size no model reaches): read
 * as that bound, so that no product of them with a byte size wraps. */
static void
clamp_elems(struct zinf_engine_opts *o)
{
	uint64_t *const v[] = {
		&o->sub_group_size,
		&o->reduce_bucket_size,
		&o->allgather_bucket_size,
		&o->stage3_prefetch_bucket_size,
		&o->stage3_max_live_parameters,
		&o->stage3_max_reuse_distance,
		&o->stage3_param_persistence_threshold,
		&o->stage3_model_persistence_threshold,
		&o->offload_param.buffer_size,
		&o->offload_param.max_in_cpu,
		&o->offload_optimizer.buffer_size,
		&o->offload_optimizer.max_in_cpu,
	};
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		*v[i] = ZINF_MIN(*v[i], ZINF_ENGINE_MAX_ELEMS);
	}
}

static int
dup_str(const char *s, char **out)
{
	*out = NULL;
	if (!s) {
		return 0;
	}
	*out = zc_strdup(s);
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
	struct zinf_engine *e = zc_calloc(1, sizeof(*e));
	if (!e) {
		return ZINF_FAIL(-ENOMEM, "engine: out of memory for the handle");
	}
	e->ps.nv_open = -1; /* before any failure: destroy looks at it */
	zinf_engine_opts_init(&e->o);
	int ret = zc_opts_take(&e->o, sizeof(e->o), opts, "zinf_engine_opts");
	if (!ret) {
		clamp_elems(&e->o);
	}
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
	eng_choose_tiers(e);
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
		ret = zinf_stream_wrap(e->dev, comm_stream(e->o.comm), "zinf-engine", &e->cs);
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
	/* Stochastic rounding hashes (seed, step, element index in this rank's partition): each
	   rank its own seed, so that elements at the same place of two ranks' partitions round
	   independently (rank 0 keeps the trainer's: one rank's results do not change). */
	struct zinf_optimizer_opts oo = e->o.optimizer;
	oo.seed = e->rank ? zc_mix64(oo.seed ^ zc_mix64((uint64_t)e->rank)) : oo.seed;
	if ((ret = zinf_optimizer_create(&oo, &e->opt))) {
		goto fail;
	}
	e->lr = e->step_lr = e->o.optimizer.lr;
	e->beta1 = e->step_beta1 = e->o.optimizer.beta1;
	e->beta2 = e->step_beta2 = e->o.optimizer.beta2;
	e->nparts = zinf_optimizer_part_count(e->opt);
	if (e->ot->dev && e->o.optimizer.master_dtype != ZINF_F32) {
		ret = ENG_FAIL(e, -EINVAL,
			       "zero_optimization.offload_optimizer.device none: a bf16 master "
			       "weight is stepped on the CPU only: set offload_optimizer.device to "
			       "cpu or nvme, or the master to fp32");
		goto fail;
	}
	if (e->ot->dev && e->o.optimizer.state_format != ZINF_STATE_PLAIN) {
		ret = ENG_FAIL(
			e, -EINVAL,
			"zero_optimization.offload_optimizer.device none: 8-bit (q8) "
			"optimizer state is stepped on the CPU only: set "
			"offload_optimizer.device to cpu or nvme, or the state to fp32/bf16");
		goto fail;
	}
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
	eng_gather_free(e);
	eng_step_free(e);	  /* the worker joined: a partition still open was this thread's */
	eng_param_write_abort(e); /* (a step that failed between its pieces) */
	eng_param_free(e);
	zinf_optimizer_destroy(e->opt);
	if (e->scratch) {
		eng_comm_buf_free(e, e->scratch);
	}
	/* the communicator before the streams: nccl's finalisation flushes what it queued on cs;
	   a rank still training learns at its next collective that this one left, and when */
	if (e->own_comm && e->comm) {
		char why[96];
		snprintf(why, sizeof(why),
			 "zinf_engine_destroy after step %" PRId64 " (%" PRIu64 " micro-batches)",
			 e->steps, e->micro_steps);
		(void)zinf_comm_leave(e->comm, why);
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
		zc_free(e->params[i].name);
	}
	zc_free(e->params);
	for (uint32_t i = 0; i < e->n_layers; i++) {
		zc_free(e->layers[i].params);
	}
	zc_free(e->layers);
	zc_free(e->order);
	zc_free(e->sg_end);
	zc_free(e->sg_params);
	zc_free(e->gr.sg_pending);
	zc_free(e->sg_first);
	for (uint32_t i = 0; i < ZINF_ENGINE_MAX_PATHS; i++) {
		zc_free(e->param_paths[i]);
		zc_free(e->optim_paths[i]);
	}
	if (e->ps.store_mu_init) {
		pthread_mutex_destroy(&e->ps.store_mu);
	}
	zc_free(e->device_backend);
	zc_free(e->comm_backend);
	zc_free(e->io_backend);
	zc_free(e->swap_prefix);
	zc_free(e);
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
	s.host_pool_bytes = zinf_pool_bytes(e->os.opool) + zinf_pool_bytes(e->ps.ppool) +
			    eng_gwin_pool_bytes(e);
	eng_clip_stats(e, &s);
	/* the optimizer's: what is neither the parameters' nor the gradients' */
	s.optim_nvme_read_bytes =
		s.nvme_read_bytes - s.param_nvme_read_bytes - s.grad_nvme_read_bytes;
	s.optim_nvme_write_bytes =
		s.nvme_write_bytes - s.param_nvme_write_bytes - s.grad_nvme_write_bytes;
	return zc_stats_give(out, &s, sizeof(s), "zinf_engine_stats");
}

int
eng_check_opts(const struct zinf_engine_opts *o)
{
	return check_opts(o);
}

int
zinf_engine_opts_check(const struct zinf_engine_opts *opts)
{
	struct zinf_engine_opts o;
	zinf_engine_opts_init(&o);
	int ret = zc_opts_take(&o, sizeof(o), opts, "zinf_engine_opts");
	if (ret || (ret = check_opts(&o))) {
		return ret;
	}
	return eng_check_io(&o);
}
