/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine_grad.c: gradients. zinf_engine_grad() casts a parameter's gradient (after the
 * compute stream's work so far) into the fp32 bucket being filled; a full bucket is reduced
 * across ranks (averaged): all-reduce of whole tensors at stages 0-1, reduce-scatter at stages
 * 2-3 with the bucket laid out as W segments, parameter p's partition r in segment r at p's
 * offset, so that this rank's pieces come back contiguous. Two buckets: backward fills one
 * while the other reduces; a bucket is refilled only after its reduction was accumulated.
 * Accumulation into the fp32 gradient partition: the first micro-batch of a window copies,
 * later ones add once in fp32 (on the device for tier none, on the host after one D2H into
 * the pinned staging for cpu/nvme): the same additions in the same order either way. The step
 * itself is engine_step.c's.
 */
#include <errno.h>
#include <string.h>

#include "engine/engine_internal.h"

int
eng_grad_setup(struct zinf_engine *e)
{
	for (int b = 0; b < 2; b++) {
		struct bucket *k = &e->bk[b];
		int ret = zinf_device_alloc(e->dev, e->bucket_cap * 4, (void **)&k->dev);
		if (!ret && e->o.stage >= 2) {
			ret = zinf_device_alloc(e->dev, e->bucket_cap / e->world * 4,
						(void **)&k->dev_recv);
		}
		if (ret) {
			return ENG_FAIL(e, ret,
					"init: device memory for a gradient bucket of %" PRIu64
					" elements (reduce_bucket_size)",
					e->bucket_cap);
		}
		k->params = zinf_calloc(e->n_params, sizeof(uint32_t));
		k->offs = zinf_calloc(e->n_params, sizeof(uint64_t));
		if (!k->params || !k->offs) {
			return ENG_FAIL(e, -ENOMEM, "init: out of memory for bucket lists");
		}
	}
	return 0;
}

void
eng_grad_free(struct zinf_engine *e)
{
	for (int b = 0; b < 2; b++) {
		struct bucket *k = &e->bk[b];
		if (k->posted && k->req && !zinf_comm_failed(e->comm)) {
			zinf_comm_wait(e->comm, k->req);
		}
		zinf_device_free(e->dev, k->dev);
		zinf_device_free(e->dev, k->dev_recv);
		zinf_free(k->params);
		zinf_free(k->offs);
		memset(k, 0, sizeof(*k));
	}
}

static bool
rs_mode(const struct zinf_engine *e)
{
	return e->o.stage >= 2;
}

/* Post bucket b's collective. */
static int
post(struct zinf_engine *e, struct bucket *b)
{
	int ret = 0;
	if (b->n == 0 || b->posted) {
		return 0;
	}
	if (e->host_comm && (ret = zinf_stream_sync(e->cs))) {
		return ENG_FAIL(e, ret, "gradients: the engine stream failed");
	}
	if (rs_mode(e)) {
		uint64_t seg = e->bucket_cap / e->world;
		ret = zinf_comm_reduce_scatter(e->comm, b->dev, b->dev_recv, seg, ZINF_F32,
					       ZINF_COMM_AVG, &b->req);
		e->win.reduced_bytes += e->bucket_cap * 4;
	} else {
		ret = zinf_comm_all_reduce(e->comm, b->dev, b->used, ZINF_F32, ZINF_COMM_AVG,
					   &b->req);
		e->win.reduced_bytes += b->used * 4;
	}
	if (ret) {
		return ENG_FAIL(e, ret,
				"gradients: reducing a bucket of %u parameters (first \"%s\")",
				b->n, e->params[b->params[0]].name);
	}
	b->posted = true;
	return 0;
}

/* The reduced values of bucket b into the gradient partition. */
static int
accumulate(struct zinf_engine *e, struct bucket *b)
{
	bool first = e->micro == 0, rs = rs_mode(e);
	bool host = e->otier != ZINF_OFFLOAD_NONE;
	uint64_t staged = 0;
	int ret = 0;
	for (uint32_t i = 0; i < b->n && !ret; i++) {
		struct eparam *p = &e->params[b->params[i]];
		const float *src =
			rs ? b->dev_recv + b->offs[i] : b->dev + b->offs[i] + p->part.offset;
		size_t n = rs ? p->part.part : p->part.count;
		float *dst = e->grad_part + p->flat_off;
		if (n == 0) {
			continue;
		}
		if (!host) {
			ret = first ? zinf_device_copy(e->cs, dst, src, n * 4, ZINF_COPY_D2D)
				    : zinf_device_accumulate(e->cs, dst, src, ZINF_F32, n);
		} else {
			ret = zinf_device_copy(e->cs, first ? dst : e->host_stage + staged, src,
					       n * 4, ZINF_COPY_D2H);
			staged += first ? 0 : n;
			e->win.d2h_bytes += n * 4;
		}
	}
	if (!ret && host) {
		ret = zinf_stream_sync(e->cs);
	}
	staged = 0;
	for (uint32_t i = 0; i < b->n && !ret; i++) {
		struct eparam *p = &e->params[b->params[i]];
		size_t n = rs ? p->part.part : p->part.count;
		if (host && !first) {
			float *dst = e->grad_part + p->flat_off;
			const float *s = e->host_stage + staged;
			for (size_t j = 0; j < n; j++) {
				dst[j] += s[j];
			}
			staged += n;
		}
		if (e->micro + 1 == e->o.gradient_accumulation_steps &&
		    --e->sg_pending[p->sg] == 0) {
			eng_step_final(e, p->sg); /* after its accumulations were queued on cs */
		}
	}
	if (ret) {
		return ENG_FAIL(e, ret, "gradients: accumulating a bucket (first \"%s\")",
				e->params[b->params[0]].name);
	}
	b->n = 0;
	b->used = 0;
	b->posted = false;
	b->req = NULL;
	return 0;
}

/* Wait for bucket b's collective (if posted) and accumulate it. */
static int
complete(struct zinf_engine *e, struct bucket *b)
{
	if (!b->posted) {
		return 0;
	}
	int ret = zinf_comm_wait(e->comm, b->req);
	b->req = NULL;
	if (ret) {
		b->posted = false;
		return eng_fail(e, ENG_FAIL(e, ret, "gradients: bucket reduction (first \"%s\")",
					    e->params[b->params[0]].name));
	}
	return eng_fail(e, accumulate(e, b));
}

int
eng_grad_flush(struct zinf_engine *e)
{
	struct bucket *cur = &e->bk[e->cur], *other = &e->bk[1 - e->cur];
	int ret;
	if ((ret = complete(e, other)) || (ret = eng_fail(e, post(e, cur))) ||
	    (ret = complete(e, cur))) {
		return ret;
	}
	return 0;
}

int
zinf_engine_grad(struct zinf_engine *e, uint32_t id, const void *dev_grad, enum zinf_dtype dtype)
{
	int ret = eng_ready(e, "grad");
	if (ret) {
		return ret;
	}
	if (id >= e->n_params) {
		return ENG_FAIL(e, -EINVAL, "grad: unknown parameter id %u (%u registered)", id,
				e->n_params);
	}
	struct eparam *p = &e->params[id];
	if (p->grad_done) {
		return ENG_FAIL(e, -EINVAL,
				"grad: parameter \"%s\": a second gradient in "
				"micro-batch %u",
				p->name, e->micro);
	}
	if (!dev_grad || zinf_dtype_size(dtype) == 0) {
		return ENG_FAIL(e, -EINVAL, "grad: parameter \"%s\": %s", p->name,
				dev_grad ? "unknown dtype" : "NULL gradient");
	}
	if (e->window_t0 < 0) {
		e->window_t0 = eng_now();
	}
	if (e->grads_seen == 0 && e->micro + 1 == e->o.gradient_accumulation_steps &&
	    (ret = eng_latch_lr(e))) {
		return ret;
	}
	bool rs = rs_mode(e);
	uint64_t need = rs ? p->part.part : p->part.padded;
	uint64_t room = rs ? e->bucket_cap / e->world : e->bucket_cap;
	struct bucket *b = &e->bk[e->cur];
	if (b->n > 0 && b->used + need > room) {
		/* close b; the other bucket must be free (its reduction accumulated) first */
		if ((ret = eng_fail(e, post(e, b)))) {
			return ret;
		}
		e->cur = 1 - e->cur;
		b = &e->bk[e->cur];
		if ((ret = complete(e, b))) {
			return ret;
		}
	}
	if (b->n == 0 && (ret = zinf_device_fill(e->cs, b->dev, ZINF_F32, 0.0f, e->bucket_cap))) {
		return eng_fail(e, ret);
	}
	if ((ret = eng_order(e, e->compute, e->cs))) {
		return eng_fail(e, ret);
	}
	size_t gsz = zinf_dtype_size(dtype);
	if (rs) {
		uint64_t seg = e->bucket_cap / e->world;
		for (int r = 0; r < e->world && !ret; r++) {
			uint64_t first = (uint64_t)r * p->part.part;
			uint64_t cnt =
				first >= p->numel ? 0 : ZINF_MIN(p->part.part, p->numel - first);
			ret = zinf_device_cast(e->cs, b->dev + (uint64_t)r * seg + b->used,
					       ZINF_F32, (const char *)dev_grad + first * gsz,
					       dtype, cnt);
		}
	} else {
		ret = zinf_device_cast(e->cs, b->dev + b->used, ZINF_F32, dev_grad, dtype,
				       p->numel);
	}
	if (ret || (ret = eng_order(e, e->cs, e->compute))) {
		return eng_fail(e, ret);
	}
	b->params[b->n] = id;
	b->offs[b->n] = b->used;
	b->n++;
	b->used += need;
	p->grad_done = true;
	e->grads_seen++;
	/* progress the other bucket without blocking */
	struct bucket *o = &e->bk[1 - e->cur];
	if (o->posted) {
		ret = zinf_comm_test(e->comm, o->req);
		if (ret < 0) {
			o->req = NULL;
			o->posted = false;
			return eng_fail(e, ENG_FAIL(e, ret, "gradients: bucket reduction"));
		}
		if (ret == 1) {
			o->req = NULL;
			if ((ret = eng_fail(e, accumulate(e, o)))) {
				return ret;
			}
		}
	}
	return 0;
}
