/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/engine_drive.c: the tests' trainer (see engine_drive.h): options for the test
 * model, registration, and micro-batches driven through the engine's public API only. The
 * parameters are read and the gradients written through copies on the compute stream
 * (zinf_device_copy, then zinf_stream_sync before the host looks), as a trainer on a GPU would,
 * so that the same driver runs on the "host" and the "cuda" device. Not here: assertions.
 */
#include "engine/engine_drive.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "zinf/device.h"

#define EDRIVE_MAX_PASS 8 /* edrive_vertical's micro-batches in a pass */

void
edrive_optimizer(struct zinf_optimizer_opts *o)
{
	zinf_optimizer_opts_init(o, ZINF_OPTIM_ADAMW);
	o->lr = 0.01f;
	o->eps = 0.05f;
	o->weight_decay = 0.01f;
}

const char *
edrive_device(void)
{
	const char *d = getenv("ZINF_TEST_DEVICE");
	return d && *d ? d : "host";
}

void
edrive_opts(struct zinf_engine_opts *o, const char *comm_backend, int stage,
	    enum zinf_offload_device opt_tier, enum zinf_offload_device param_tier,
	    const char *nvme_dir, enum zinf_dtype dtype, uint32_t gas)
{
	zinf_engine_opts_init(o);
	o->stage = stage;
	o->offload_optimizer.device = opt_tier;
	if (opt_tier == ZINF_OFFLOAD_NVME) {
		o->offload_optimizer.n_paths = 1;
		o->offload_optimizer.nvme_path[0] = nvme_dir;
	}
	o->offload_param.device = param_tier;
	if (param_tier == ZINF_OFFLOAD_NVME) {
		o->offload_param.n_paths = 1;
		o->offload_param.nvme_path[0] = nvme_dir;
	}
	o->offload_param.buffer_size = 2048; /* elements; the largest partition is 240 */
	o->offload_param.max_in_cpu = 0;     /* every fetch reads the NVMe tier */
	o->sub_group_size = 64;
	o->reduce_bucket_size = 100;
	o->allgather_bucket_size = 100;
	o->stage3_prefetch_bucket_size = 300;
	o->stage3_max_reuse_distance = 0;
	o->stage3_param_persistence_threshold = 0;
	o->gradient_accumulation_steps = gas;
	edrive_optimizer(&o->optimizer);
	o->dtype = dtype;
	o->device_backend = edrive_device();
	o->host_sync = false;
	o->comm_backend = comm_backend;
	if (strcmp(o->device_backend, "cuda") == 0 && comm_backend &&
	    strcmp(comm_backend, "mpi") == 0) {
		o->comm_backend = "nccl";
	}
	o->comm_timeout_s = 60;
	o->swap_prefix = "etest";
}

int
edrive_add_params(struct zinf_engine *e)
{
	static float bias_init[EREF_NPARAMS][16];
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		struct zinf_param_desc pd;
		zinf_param_desc_init(&pd);
		pd.name = eref_params[id].name;
		pd.numel = eref_numel(id);
		pd.layer = eref_params[id].layer;
		if (eref_params[id].cols >
		    1) { /* weights: their matrix shape (checkpoints keep it) */
			pd.ndim = 2;
			pd.shape[0] = eref_params[id].rows;
			pd.shape[1] = eref_params[id].cols;
		}
		if (id % 2) {
			/* biases: the whole tensor on the host (a test-local constant table) */
			for (uint64_t i = 0; i < pd.numel; i++) {
				bias_init[id][i] = eref_init_value(id, i);
			}
			pd.init_dtype = ZINF_F32;
			pd.init = bias_init[id];
		} else {
			pd.init_fn = eref_init_fn;
		}
		int rc = zinf_engine_add_param(e, &pd);
		if (rc != (int)id) {
			return rc < 0 ? rc : -EPROTO;
		}
	}
	return 0;
}

int
edrive_init(struct edrive *d, struct zinf_engine *e, enum zinf_dtype dtype, float quantum)
{
	memset(d, 0, sizeof(*d));
	d->e = e;
	d->rank = zinf_engine_rank(e);
	d->dtype = dtype;
	d->quantum = quantum;
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		size_t n = eref_numel(id);
		void *p = NULL;
		if (zinf_device_alloc(zinf_engine_device(e), n * sizeof(float), &p) < 0) {
			edrive_fini(d);
			return -ENOMEM;
		}
		d->grad_dev[id] = p;
		d->stage[id] = malloc(n * sizeof(float));
		d->host[id] = malloc(n * sizeof(float));
		d->g[id] = malloc(n * sizeof(float));
		if (!d->stage[id] || !d->host[id] || !d->g[id]) {
			edrive_fini(d);
			return -ENOMEM;
		}
	}
	d->rd = malloc(240 * sizeof(float)); /* the largest parameter */
	if (!d->rd) {
		edrive_fini(d);
		return -ENOMEM;
	}
	return 0;
}

void
edrive_fini(struct edrive *d)
{
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		if (d->grad_dev[id]) {
			zinf_stream_sync(zinf_engine_compute_stream(d->e));
			zinf_device_free(zinf_engine_device(d->e), d->grad_dev[id]);
		}
		free(d->stage[id]);
		free(d->host[id]);
		free(d->g[id]);
		d->grad_dev[id] = NULL;
		d->stage[id] = NULL;
		d->host[id] = d->g[id] = NULL;
	}
	free(d->rd);
	d->rd = NULL;
}

#define FAIL(rc, ...)                                                                              \
	do {                                                                                       \
		snprintf(d->why, sizeof(d->why), __VA_ARGS__);                                     \
		return (rc);                                                                       \
	} while (0)

int
edrive_read_param(struct edrive *d, uint32_t id, float *dst)
{
	void *p = NULL;
	int rc = zinf_engine_param(d->e, id, &p);
	if (rc < 0) {
		FAIL(rc, "zinf_engine_param(%u): %d %s", id, rc, zinf_last_error());
	}
	struct zinf_stream *cs = zinf_engine_compute_stream(d->e);
	size_t bytes = eref_numel(id) * zinf_dtype_size(d->dtype);
	rc = zinf_device_copy(cs, d->rd, p, bytes, ZINF_COPY_D2H);
	if (rc == 0) {
		rc = zinf_stream_sync(cs);
	}
	if (rc < 0) {
		FAIL(rc, "copy of %s to the host: %d", eref_params[id].name, rc);
	}
	for (uint64_t i = 0; i < eref_numel(id); i++) {
		dst[i] = dt_load(d->rd, d->dtype, i);
	}
	return 0;
}

static int
fetch(struct edrive *d, int32_t layer)
{
	int rc = zinf_engine_fetch(d->e, layer);
	if (rc < 0) {
		FAIL(rc, "fetch(%d): %d %s", layer, rc, zinf_last_error());
	}
	return 0;
}

static int
release(struct edrive *d, int32_t layer)
{
	int rc = zinf_engine_release(d->e, layer);
	if (rc < 0) {
		FAIL(rc, "release(%d): %d %s", layer, rc, zinf_last_error());
	}
	return 0;
}

static int
read_layer(struct edrive *d, int32_t layer)
{
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		int rc = eref_params[id].layer == layer ? edrive_read_param(d, id, d->host[id]) : 0;
		if (rc < 0) {
			return rc;
		}
	}
	return 0;
}

/* d->inf_step1's overflow, in micro-batch (step, micro)'s gradients g */
static void
poison(const struct edrive *d, int64_t step, uint32_t micro, float *const g[EREF_NPARAMS])
{
	if (d->inf_step1 == step + 1 && d->inf_micro == micro) {
		g[0][0] = INFINITY;
	}
}

/* Parameter id's gradient g into its device buffer on the compute stream, then handed. */
static int
hand(struct edrive *d, uint32_t id, const float *g, int64_t step, uint32_t micro)
{
	for (uint64_t i = 0; i < eref_numel(id); i++) {
		dt_store(d->stage[id], d->dtype, i, g[i]);
	}
	int rc = zinf_device_copy(zinf_engine_compute_stream(d->e), d->grad_dev[id], d->stage[id],
				  eref_numel(id) * zinf_dtype_size(d->dtype), ZINF_COPY_H2D);
	if (rc == 0) {
		rc = zinf_engine_grad(d->e, id, d->grad_dev[id], d->dtype);
	}
	if (rc < 0) {
		FAIL(rc, "grad(%s) step %lld micro %u: %d %s", eref_params[id].name,
		     (long long)step, micro, rc, zinf_last_error());
	}
	return 0;
}

int
edrive_micro(struct edrive *d, int64_t step, uint32_t micro, enum edrive_order order)
{
	static const int32_t changed[EREF_NLAYERS] = {2, 0, 1};
	float *check = NULL;
	int rc;

	/* forward */
	if (order == EDRIVE_ORDER_NORMAL) {
		for (int32_t l = 0; l < EREF_NLAYERS; l++) {
			if ((rc = fetch(d, l)) < 0 || (rc = read_layer(d, l)) < 0 ||
			    (rc = release(d, l)) < 0) {
				return rc;
			}
		}
	} else {
		for (int32_t k = 0; k < EREF_NLAYERS; k++) {
			if ((rc = fetch(d, changed[k])) < 0) {
				return rc;
			}
		}
		for (int32_t l = 0; l < EREF_NLAYERS; l++) {
			if ((rc = read_layer(d, l)) < 0 || (rc = release(d, l)) < 0) {
				return rc;
			}
		}
	}
	eref_grad((const float *const *)d->host, d->rank, step, micro, d->quantum, d->g);
	poison(d, step, micro, d->g);

	/* backward: layers in reverse, parameters of a layer in reverse */
	check = malloc(240 * sizeof(float));
	if (!check) {
		return -ENOMEM;
	}
	for (int32_t l = EREF_NLAYERS; l-- > 0;) {
		if ((rc = fetch(d, l)) < 0) {
			goto out;
		}
		for (uint32_t id = EREF_NPARAMS; id-- > 0;) {
			if (eref_params[id].layer != l) {
				continue;
			}
			if ((rc = edrive_read_param(d, id, check)) < 0) {
				goto out;
			}
			if (memcmp(check, d->host[id], eref_numel(id) * sizeof(float)) != 0) {
				rc = -EILSEQ;
				snprintf(d->why, sizeof(d->why),
					 "step %lld micro %u: %s fetched in backward differs from "
					 "the forward's",
					 (long long)step, micro, eref_params[id].name);
				goto out;
			}
			/* The staging of id was last copied a micro-batch ago: read_param's sync of
			   the compute stream since has finished that copy. The copy into grad_dev
			   is queued on the compute stream, which the engine made wait for its read
			   of the previous gradient (engine.h). */
			if ((rc = hand(d, id, d->g[id], step, micro)) < 0) {
				goto out;
			}
		}
		if ((rc = release(d, l)) < 0) {
			goto out;
		}
	}
	rc = zinf_engine_step(d->e);
	if (rc < 0) {
		snprintf(d->why, sizeof(d->why), "step() step %lld micro %u: %d %s",
			 (long long)step, micro, rc, zinf_last_error());
	}
out:
	free(check);
	return rc;
}

int
edrive_run(struct edrive *d, int64_t first_step, int steps, uint32_t gas, int change_at)
{
	for (int64_t s = first_step; s < first_step + steps; s++) {
		for (uint32_t m = 0; m < gas; m++) {
			enum edrive_order ord = change_at >= 0 && s >= change_at
							? EDRIVE_ORDER_CHANGED
							: EDRIVE_ORDER_NORMAL;
			int rc = edrive_micro(d, s, m, ord);
			if (rc < 0) {
				return rc;
			}
			int want = m < gas - 1 ? 0 : d->inf_step1 == s + 1 ? 2 : 1;
			if (rc != want) {
				FAIL(-EPROTO,
				     "step index %lld micro %u: zinf_engine_step returned %d",
				     (long long)s, m, rc);
			}
		}
	}
	return 0;
}

int
edrive_vertical(struct edrive *d, int64_t step, uint32_t micro, uint32_t n)
{
	float *g[EDRIVE_MAX_PASS][EREF_NPARAMS] = {{0}};
	float *check = malloc(240 * sizeof(float));
	int rc = check ? 0 : -ENOMEM;
	if (n == 0 || n > EDRIVE_MAX_PASS) {
		free(check);
		FAIL(-EINVAL, "edrive_vertical: %u micro-batches (1..%d)", n, EDRIVE_MAX_PASS);
	}
	for (uint32_t k = 0; k < n && rc == 0; k++) {
		for (uint32_t id = 0; id < EREF_NPARAMS && rc == 0; id++) {
			g[k][id] = malloc(eref_numel(id) * sizeof(float));
			rc = g[k][id] ? 0 : -ENOMEM;
		}
	}
	if (rc == 0 && (rc = zinf_engine_vertical(d->e, n)) < 0) {
		snprintf(d->why, sizeof(d->why), "vertical(%u) step %lld micro %u: %d %s", n,
			 (long long)step, micro, rc, zinf_last_error());
	}
	/* forward: each layer fetched once for the n micro-batches */
	for (int32_t l = 0; l < EREF_NLAYERS && rc == 0; l++) {
		if ((rc = fetch(d, l)) == 0 && (rc = read_layer(d, l)) == 0) {
			rc = release(d, l);
		}
	}
	for (uint32_t k = 0; k < n && rc == 0; k++) {
		eref_grad((const float *const *)d->host, d->rank, step, micro + k, d->quantum,
			  g[k]);
		poison(d, step, micro + k, g[k]);
	}
	/* backward: layers in reverse, parameters of a layer in reverse, each its n micro-batches
	   in order */
	for (int32_t l = EREF_NLAYERS; l-- > 0 && rc == 0;) {
		if ((rc = fetch(d, l)) < 0) {
			break;
		}
		for (uint32_t id = EREF_NPARAMS; id-- > 0 && rc == 0;) {
			if (eref_params[id].layer != l) {
				continue;
			}
			if ((rc = edrive_read_param(d, id, check)) < 0) {
				break;
			}
			if (memcmp(check, d->host[id], eref_numel(id) * sizeof(float)) != 0) {
				rc = -EILSEQ;
				snprintf(d->why, sizeof(d->why),
					 "step %lld micro %u: %s fetched in backward differs from "
					 "the forward's",
					 (long long)step, micro, eref_params[id].name);
				break;
			}
			for (uint32_t k = 0; k < n && rc == 0; k++) {
				/* the staging's previous copy (the last micro-batch's) done first
				 */
				rc = zinf_stream_sync(zinf_engine_compute_stream(d->e));
				rc = rc ? rc : hand(d, id, g[k][id], step, micro + k);
			}
		}
		if (rc == 0) {
			rc = release(d, l);
		}
	}
	if (rc == 0 && (rc = zinf_engine_step(d->e)) < 0) {
		snprintf(d->why, sizeof(d->why), "step() step %lld micro %u (pass of %u): %d %s",
			 (long long)step, micro, n, rc, zinf_last_error());
	}
	for (uint32_t k = 0; k < n; k++) {
		for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
			free(g[k][id]);
		}
	}
	free(check);
	return rc;
}

int
edrive_run_vertical(struct edrive *d, int64_t first_step, int steps, uint32_t gas, uint32_t pass)
{
	for (int64_t s = first_step; s < first_step + steps; s++) {
		for (uint32_t m = 0; m < gas;) {
			uint32_t n = gas - m < pass ? gas - m : pass;
			int rc = edrive_vertical(d, s, m, n);
			if (rc < 0) {
				return rc;
			}
			m += n;
			int want = m < gas ? 0 : d->inf_step1 == s + 1 ? 2 : 1;
			if (rc != want) {
				FAIL(-EPROTO,
				     "step index %lld micro %u: zinf_engine_step returned %d, not "
				     "%d",
				     (long long)s, m - n, rc, want);
			}
		}
	}
	return 0;
}

int
edrive_read_master(struct zinf_engine *e, float *const out[EREF_NPARAMS])
{
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		int rc = zinf_engine_read_master(e, id, out[id]);
		if (rc < 0) {
			return rc;
		}
	}
	return 0;
}
