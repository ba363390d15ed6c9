/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine_clip.c: gradient clipping by the global norm and fp16 dynamic loss scaling.
 * When a sub-group's fp32 gradient is final at the boundary
 * micro-batch (engine_grad.c's accumulate, before the gradient window may spill it), its sum
 * of squares is taken in float64 (tier none: zinf_device_sumsq on the engine stream; cpu and
 * nvme: zinf_grad_sumsq on the pinned gradient); a non-finite sum marks an infinity or a NaN
 * in the gradient (a finite fp32 square cannot overflow float64). At the step the sums are
 * added over the sub-groups, exchanged across the ranks (an all-gather of each rank's float64
 * bits and flag, summed in rank order on every rank, so that every rank gets the same bits;
 * the collectives have no float64 reduction), and the step's grad_scale is derived as
 * DeepSpeed's unscale_and_clip_grads does; an fp16 overflow skips the step and updates the
 * loss scaler (engine/loss_scale.c). Not here: the step itself (engine_step.c), the
 * speculative step during backward with its roll-back (engine_spec.c: it assumes the
 * grad_scale this file gives without clipping or overflow, 1/S).
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "zinf/blocks/adam.h"

int
eng_clip_init(struct zinf_engine *e)
{
	const struct zinf_engine_opts *o = &e->o;
	e->step_scale = 1.0f;
	if (!(o->gradient_clipping >= 0) || isinf(o->gradient_clipping)) {
		return ZINF_FAIL(-EINVAL, "engine: gradient_clipping %g: must be finite and >= 0",
				 o->gradient_clipping);
	}
	if (o->fp16.enabled && o->dtype != ZINF_F16) {
		return ZINF_FAIL(-EINVAL,
				 "engine: fp16.enabled needs dtype f16 (the parameters are %s)",
				 zinf_dtype_name(o->dtype));
	}
	if (o->fp16.reserved2 || !eng_all_zero(o->fp16.reserved, sizeof(o->fp16.reserved))) {
		return ZINF_FAIL(-EINVAL, "engine: fp16: reserved fields are not zero");
	}
	if (o->fp16.enabled) {
		int ret = zinf_loss_scaler_init(&e->cl.ls, &o->fp16);
		if (ret) {
			return ret; /* named the key */
		}
	}
	e->cl.gate = o->gradient_clipping > 0 || o->fp16.enabled;
	return 0;
}

int
eng_clip_setup(struct zinf_engine *e)
{
	if (!e->cl.gate) {
		return 0;
	}
	e->cl.sg_sumsq = zc_calloc(e->n_sg, sizeof(double));
	if (!e->cl.sg_sumsq) {
		return ENG_FAIL(e, -ENOMEM, "init: out of memory for the gradient norms");
	}
	if (e->ot->dev) {
		int ret = zinf_device_alloc(e->dev, e->n_sg * sizeof(double),
					    (void **)&e->cl.dev_sumsq);
		if (ret) {
			return ENG_FAIL(e, ret, "init: device memory for the gradient norms");
		}
	}
	if (!e->host_comm && e->W > 1) {
		/* nccl: the per-step exchange of every rank's (sum, flag), allocated once (not
		   a cudaMalloc and a device-wide cudaFree per step) */
		int ret = eng_comm_buf_alloc(e, (size_t)e->world * 4 * sizeof(float),
					     (void **)&e->cl.clip_dev);
		if (ret) {
			return ENG_FAIL(e, ret, "init: device memory for the norms' exchange");
		}
	}
	return 0;
}

void
eng_clip_free(struct zinf_engine *e)
{
	zc_free(e->cl.sg_sumsq);
	e->cl.sg_sumsq = NULL;
	zinf_device_free(e->dev, e->cl.dev_sumsq);
	e->cl.dev_sumsq = NULL;
	if (e->cl.clip_dev) {
		eng_comm_buf_free(e, e->cl.clip_dev); /* left to a failed communicator */
		e->cl.clip_dev = NULL;
	}
}

int
eng_clip_sg(struct zinf_engine *e, uint32_t k)
{
	uint64_t len = e->sg_end[k] - eng_sg_start(e, k);
	int ret;
	if (e->ot->dev) {
		/* after k's accumulations, queued on cs before this */
		ret = zinf_device_sumsq(e->cs, e->os.grad_part + eng_sg_start(e, k), ZINF_F32, len,
					e->cl.dev_sumsq + k);
	} else {
		/* the caller synchronised cs (engine_grad.c's settle): cpu: grad_part is final
		   on the host; nvme: k's gradient in its window slot (read back if spilled) */
		ret = e->gr.gw.n ? eng_gwin_load(e, k) : 0;
		if (!ret) {
			ret = zinf_grad_sumsq(eng_grad_of(e, k), ZINF_F32, len, NULL,
					      &e->cl.sg_sumsq[k]);
		}
	}
	return ret ? ENG_FAIL(e, ret, "step %" PRId64 ": sub-group %u: gradient norm", e->steps + 1,
			      k)
		   : 0;
}

/* Every rank's (sum, flag) into all[4 * r ..]: the float64's bits travel as two floats. */
static int
exchange(struct zinf_engine *e, const float mine[4], float *all)
{
	int ret;
	if (e->host_comm) {
		memcpy(all + 4 * e->rank, mine, 4 * sizeof(float));
		return zinf_comm_all_gather(e->comm, all + 4 * e->rank, all, 4, ZINF_F32, NULL);
	}
	float *dev = e->cl.clip_dev; /* nccl: device buffers ordered on cs */
	size_t bytes = (size_t)e->world * 4 * sizeof(float);
	ret = zinf_device_copy(e->cs, dev + 4 * e->rank, mine, 4 * sizeof(float), ZINF_COPY_H2D);
	if (!ret) {
		ret = zinf_comm_all_gather(e->comm, dev + 4 * e->rank, dev, 4, ZINF_F32, NULL);
	}
	if (!ret) {
		ret = zinf_device_copy(e->cs, all, dev, bytes, ZINF_COPY_D2H);
	}
	if (!ret) {
		ret = zinf_stream_sync(e->cs);
	}
	return ret;
}

int
eng_clip_decide(struct zinf_engine *e, float *gs)
{
	int ret = 0;
	if (e->ot->dev) {
		ret = zinf_device_copy(e->cs, e->cl.sg_sumsq, e->cl.dev_sumsq,
				       e->n_sg * sizeof(double), ZINF_COPY_D2H);
	}
	if (ret || (ret = zinf_stream_sync(e->cs))) {
		return ENG_FAIL(e, ret, "step %" PRId64 ": reading the gradient norms",
				e->steps + 1);
	}
	double sum = 0.0;
	bool bad = false;
	for (uint32_t k = 0; k < e->n_sg; k++) {
		if (isfinite(e->cl.sg_sumsq[k])) {
			sum += e->cl.sg_sumsq[k];
		} else {
			bad = true;
		}
	}
	if (e->W > 1) {
		/* stages 1-3: each rank holds its partitions only (stage 0: all of it) */
		float mine[4] = {0, 0, bad ? 1.0f : 0.0f, 0};
		memcpy(mine, &sum, sizeof(sum));
		float *all = zc_calloc((size_t)e->world * 4, sizeof(float));
		if (!all) {
			return ENG_FAIL(e, -ENOMEM, "step: out of memory for the gradient norms");
		}
		ret = exchange(e, mine, all);
		sum = 0.0;
		for (int r = 0; r < e->world && !ret; r++) {
			double v;
			memcpy(&v, all + 4 * r, sizeof(v));
			sum += v;
			bad = bad || all[4 * r + 2] != 0.0f;
		}
		zc_free(all);
		if (ret) {
			return ENG_FAIL(e, ret, "step %" PRId64 ": exchanging the gradient norms",
					e->steps + 1);
		}
	}
	double S = e->o.fp16.enabled ? zinf_loss_scaler_scale(&e->cl.ls) : 1.0;
	double norm = bad ? INFINITY : sqrt(sum) / S;
	double combined = S;
	double clip = e->o.gradient_clipping;
	if (clip > 0 && !bad) {
		double c = (norm + 1e-6) / clip;
		if (c > 1.0) {
			combined = c * S;
		}
	}
	e->win.grad_norm = norm;
	e->win.overflow = bad;
	*gs = (float)(1.0 / combined);
	if (!e->o.fp16.enabled) {
		return 0;
	}
	ret = zinf_loss_scaler_update(&e->cl.ls, bad);
	if (ret < 0) { /* from the exchanged overflow flag: every rank fails here, no notice */
		return eng_known(e, ENG_FAIL(e, ret,
					     "step %" PRId64
					     ": fp16 gradient overflow with the loss scale "
					     "already at min_loss_scale %g: the run cannot go on",
					     e->steps + 1, e->o.fp16.min_loss_scale));
	}
	if (ret == 1) {
		e->cl.skipped++;
		ENG_WARN(e,
			 "step %" PRId64
			 ": fp16 gradient overflow: step skipped, loss scale %g -> %g",
			 e->steps + 1, S, zinf_loss_scaler_scale(&e->cl.ls));
	}
	return ret;
}

void
eng_clip_stats(const struct zinf_engine *e, struct zinf_engine_stats *s)
{
	s->loss_scale = zinf_engine_loss_scale(e);
	s->skipped_steps = e->cl.skipped;
}

double
zinf_engine_loss_scale(const struct zinf_engine *e)
{
	if (!e) {
		return NAN;
	}
	return e->o.fp16.enabled ? zinf_loss_scaler_scale(&e->cl.ls) : 1.0;
}
