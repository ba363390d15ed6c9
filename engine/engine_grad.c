/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine_grad.c: gradients. zinf_engine_grad() casts a parameter's gradient (after the
 * compute stream's work so far) into the fp32 bucket being filled and zeroes its padding only;
 * a full bucket is reduced across ranks (averaged): all-reduce of whole tensors at stages 0-1,
 * reduce-scatter at stages 2-3 with the bucket laid out as W segments, parameter p's partition
 * r in segment r at p's offset, so that this rank's pieces come back contiguous. Only the
 * filled part is reduced: a reduce-scatter of a bucket filled to `used` elements per segment
 * first packs the segments to that stride. Two buckets: backward fills one while the other
 * reduces; a bucket is refilled only after its reduction was accumulated.
 * Accumulation: the first micro-batch of a window copies, later ones add once in fp32 (on the
 * device for tier none, on the host after one D2H into the pinned staging for cpu/nvme): the
 * same additions in the same order either way. Tiers none and cpu accumulate into the whole
 * fp32 gradient partition (grad_part); the optimizer on NVMe into the gradient window
 * (engine_gwin.c), so that host memory does not grow with the model. A sub-group whose
 * gradient is final is told to the norm (engine_clip.c) and to the step worker. The step itself
 * is engine_step.c's. zinf_engine_vertical: a pass of several micro-batches, each parameter's
 * gradients handed in micro-batch order (each bucket entry carries its micro-batch, so the
 * accumulation makes the additions of the horizontal order).
 */
#include <errno.h>
#include <string.h>

#include "engine/engine_internal.h"

int
eng_grad_setup(struct zinf_engine *e)
{
	for (int b = 0; b < 2; b++) {
		struct bucket *k = &e->gr.bk[b];
		int ret = eng_comm_buf_alloc(e, e->gr.bucket_cap * 4, (void **)&k->dev);
		if (!ret && e->o.stage >= 2 && e->world > 1) { /* one rank reduces nothing */
			ret = eng_comm_buf_alloc(e, e->gr.bucket_cap / e->world * 4,
						 (void **)&k->dev_recv);
		}
		if (ret) {
			return ENG_FAIL(e, ret,
					"init: device memory for a gradient bucket of %" PRIu64
					" elements (reduce_bucket_size)",
					e->gr.bucket_cap);
		}
		k->params = zc_calloc(e->n_params, sizeof(uint32_t));
		k->offs = zc_calloc(e->n_params, sizeof(uint64_t));
		k->mb = zc_calloc(e->n_params, sizeof(uint32_t));
		if (!k->params || !k->offs || !k->mb) {
			return ENG_FAIL(e, -ENOMEM, "init: out of memory for bucket lists");
		}
	}
	return 0;
}

void
eng_grad_free(struct zinf_engine *e)
{
	for (int b = 0; b < 2; b++) {
		struct bucket *k = &e->gr.bk[b];
		if (k->posted && k->req && !zinf_comm_failed(e->comm)) {
			zinf_comm_wait(e->comm, k->req);
		}
		eng_comm_buf_free(e, k->dev);
		eng_comm_buf_free(e, k->dev_recv);
		zc_free(k->params);
		zc_free(k->offs);
		zc_free(k->mb);
		memset(k, 0, sizeof(*k));
	}
}

/* ---- buckets --------------------------------------------------------------------------- */

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
	if (e->world == 1) {
		/* one rank's average is the gradient itself: no collective, no wait for the casts
		   (accumulate reads the bucket, after them on cs) */
		e->win.reduced_bytes += b->used * 4;
		b->posted = true;
		return 0;
	}
	if (rs_mode(e)) {
		/* pack segment r from r * seg to r * used (through dev_recv where they overlap:
		   it is free until the collective) so that only the filled part is reduced */
		uint64_t seg = e->gr.bucket_cap / e->world, used = b->used;
		for (int r = 1; r < e->world && used < seg && !ret; r++) {
			float *src = b->dev + (uint64_t)r * seg, *dst = b->dev + (uint64_t)r * used;
			if (src < dst + used) {
				ret = zinf_device_copy(e->cs, b->dev_recv, src, used * 4,
						       ZINF_COPY_D2D);
				src = b->dev_recv;
			}
			if (!ret) {
				ret = zinf_device_copy(e->cs, dst, src, used * 4, ZINF_COPY_D2D);
			}
		}
		if (!ret && e->host_comm && (ret = zinf_stream_sync(e->cs))) {
			return ENG_FAIL(e, ret, "gradients: the engine stream failed");
		}
		if (!ret) {
			ret = zinf_comm_reduce_scatter(e->comm, b->dev, b->dev_recv, used, ZINF_F32,
						       ZINF_COMM_AVG, &b->req);
		}
		e->win.reduced_bytes += used * e->world * 4;
	} else {
		if (e->host_comm && (ret = zinf_stream_sync(e->cs))) {
			return ENG_FAIL(e, ret, "gradients: the engine stream failed");
		}
		ret = zinf_comm_all_reduce(e->comm, b->dev, b->used, ZINF_F32, ZINF_COMM_AVG,
					   &b->req);
		e->win.reduced_bytes += b->used * 4;
	}
	if (ret) {
		return ENG_FAIL(e, ret,
				"gradients: reducing a bucket of %u parameters (first \"%s\"): %s",
				b->n, e->params[b->params[0]].name, eng_cause(e));
	}
	b->posted = true;
	return 0;
}

/* Where the reduced piece of parameter p goes on the host: grad_part, or its sub-group's slot
 * in the gradient window (read back or written out as needed; a new slot is zeroed unless the
 * caller writes all of it before anything reads it: `fill`). */
static float *
host_dst(struct zinf_engine *e, const struct eparam *p, bool fill, int *ret)
{
	if (!e->gr.gw.n) {
		return e->os.grad_part + p->flat_off;
	}
	float *slot = eng_gwin_write(e, p->sg, fill, ret);
	return slot ? slot + (p->flat_off - eng_sg_start(e, p->sg)) : NULL;
}

/* Bucket b's entries [from, to), their copies queued on cs: the later micro-batches' sums on
 * the host (cs synchronised; from the staging buffer, whose first `*staged` elements were
 * consumed before), in entry order (a vertical pass puts a parameter's micro-batches in one
 * bucket, in micro-batch order), then each sub-group's count of gradients still to come; a
 * sub-group complete in the window's last micro-batch is final: its norm with clipping or fp16
 * (on the host: after cs), then the step worker (which waits for cs's work so far through the
 * sub-group's event). */
static int
settle(struct zinf_engine *e, struct bucket *b, uint32_t from, uint32_t to, uint64_t *staged)
{
	bool rs = rs_mode(e), host = !e->ot->dev;
	int ret = 0;
	for (uint32_t i = from; i < to && !ret; i++) {
		struct eparam *p = &e->params[b->params[i]];
		size_t n = rs ? p->part.part : p->part.count;
		if (host && b->mb[i] > 0 && n > 0) {
			float *dst = host_dst(e, p, false, &ret);
			const float *s = e->gr.host_stage + *staged;
			if (!dst) {
				return ret; /* named the sub-group and its file */
			}
			for (size_t j = 0; j < n; j++) {
				dst[j] += s[j];
			}
			*staged += n;
		}
		if (b->mb[i] + 1 == e->o.gradient_accumulation_steps &&
		    --e->gr.sg_pending[p->sg] == 0) {
			/* with clipping or fp16 its sum of squares now, before the window may spill
			   it (the step waits for the norm, or speculates: engine_spec.c) */
			if (e->cl.gate) {
				ret = host ? zinf_stream_sync(e->cs) : 0;
				ret = ret ? ret : eng_clip_sg(e, p->sg);
			}
			if (ret) {
				return ENG_FAIL(e, ret,
						"gradients: accumulating a bucket (first \"%s\")",
						e->params[b->params[0]].name);
			}
			eng_step_final(e, p->sg);
		}
	}
	return 0;
}

/*
 * The reduced values of bucket b into the gradient partition (or window), queued on cs. Device
 * tier: copied or added there. Host tiers: the first micro-batch copies each piece from the
 * device straight to its place (grad_part or its window slot), and nothing waits for the
 * copies here (the step worker waits for cs's event of each sub-group; a slot written out,
 * the norm and the step after backward wait for cs first); later micro-batches copy into the
 * pinned staging buffer, wait, and add on the host. Before a piece takes a new window slot,
 * the sub-groups completed so far are handed on (so that taking the slot does not write out a
 * final sub-group). "First" is per entry: a vertical pass's bucket may hold a parameter's first
 * micro-batch (copied) and its later ones (staged, added by settle in entry order).
 */
static int
accumulate(struct zinf_engine *e, struct bucket *b)
{
	bool rs = rs_mode(e);
	bool host = !e->ot->dev;
	const float *recv = e->world == 1 ? b->dev : b->dev_recv; /* see post() */
	uint64_t staged = 0, settled = 0;
	uint32_t from = 0;
	bool unsynced = false; /* staged pieces queued since cs was last synchronised */
	int ret = 0;
	for (uint32_t i = 0; i < b->n && !ret; i++) {
		bool first = b->mb[i] == 0;
		struct eparam *p = &e->params[b->params[i]];
		const float *src = rs ? recv + b->offs[i] : b->dev + b->offs[i] + p->part.offset;
		size_t n = rs ? p->part.part : p->part.count;
		if (n == 0 && !(host && first && p->part.part > 0)) {
			continue; /* (a first micro-batch zeroes a partition of padding only) */
		}
		if (!host) {
			float *dst = e->os.grad_part + p->flat_off;
			ret = first ? zinf_device_copy(e->cs, dst, src, n * 4, ZINF_COPY_D2D)
				    : zinf_device_accumulate(e->cs, dst, src, ZINF_F32, n);
			continue;
		}
		e->win.d2h_bytes += n * 4;
		if (!first) {
			ret = zinf_device_copy(e->cs, e->gr.host_stage + staged, src, n * 4,
					       ZINF_COPY_D2H);
			staged += n;
			unsynced = true;
			continue;
		}
		if (e->gr.gw.n && e->gr.gw.sg_slot[p->sg] < 0 && i > from) {
			/* (a vertical pass: later micro-batches staged before this entry) */
			if (unsynced && (ret = zinf_stream_sync(e->cs))) {
				break;
			}
			unsynced = false;
			if ((ret = settle(e, b, from, i, &settled))) {
				return ret; /* named */
			}
			from = i;
		}
		float *dst = host_dst(e, p, true, &ret);
		if (!dst) {
			return ret; /* named the sub-group and its file */
		}
		ret = n ? zinf_device_copy(e->cs, dst, src, n * 4, ZINF_COPY_D2H) : 0;
		if (n < p->part.part) {
			/* stages 0-1: the last ranks' padding, never handed (all of it where the
			   rank holds none of the tensor): the slot was not zeroed */
			memset(dst + n, 0, (p->part.part - n) * 4);
		}
	}
	if (!ret && host && unsynced) {
		ret = zinf_stream_sync(e->cs); /* the staged pieces, before the host adds them */
	}
	if (ret) {
		return ENG_FAIL(e, ret, "gradients: accumulating a bucket (first \"%s\")",
				e->params[b->params[0]].name);
	}
	if ((ret = settle(e, b, from, b->n, &settled))) {
		return ret; /* named */
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
	int ret = b->req ? zinf_comm_wait(e->comm, b->req) : 0;
	b->req = NULL;
	if (ret) {
		b->posted = false;
		return ENG_FAIL(e, ret, "gradients: bucket reduction (first \"%s\"): %s",
				e->params[b->params[0]].name, eng_cause(e));
	}
	return accumulate(e, b);
}

int
eng_grad_flush(struct zinf_engine *e)
{
	struct bucket *cur = &e->gr.bk[e->gr.cur], *other = &e->gr.bk[1 - e->gr.cur];
	int ret;
	if ((ret = complete(e, other)) || (ret = post(e, cur)) || (ret = complete(e, cur))) {
		return ret;
	}
	return 0;
}

static int
grad_in(struct zinf_engine *e, uint32_t id, const void *dev_grad, enum zinf_dtype dtype)
{
	int ret = 0;
	if (id >= e->n_params) {
		return ENG_FAIL(e, -EINVAL, "grad: unknown parameter id %u (%u registered)", id,
				e->n_params);
	}
	struct eparam *p = &e->params[id];
	uint32_t npass = eng_pass_n(e), mb = e->micro + p->grads; /* its micro-batch */
	if (p->grads == npass) {
		if (npass == 1) {
			return ENG_FAIL(e, -EINVAL,
					"grad: parameter \"%s\": a second gradient in "
					"micro-batch %u",
					p->name, e->micro);
		}
		return ENG_FAIL(e, -EINVAL,
				"grad: parameter \"%s\": gradient %u in a vertical pass of %u "
				"micro-batches (zinf_engine_vertical)",
				p->name, npass + 1, npass);
	}
	if (!dev_grad || zinf_dtype_size(dtype) == 0) {
		return ENG_FAIL(e, -EINVAL, "grad: parameter \"%s\": %s", p->name,
				dev_grad ? "unknown dtype" : "NULL gradient");
	}
	if (e->window_t0 < 0) {
		e->window_t0 = zinf_now_s();
	}
	if (!e->win_opened && mb + 1 == e->o.gradient_accumulation_steps) {
		if ((ret = eng_window_open(e))) {
			return ret;
		}
		e->win_opened = true;
	}
	bool rs = rs_mode(e);
	uint64_t need = rs ? p->part.part : p->part.padded;
	/* DeepSpeed's rule: a bucket is reduced before a gradient would take it past
	   reduce_bucket_size (0: a bucket per parameter); the buffers hold the largest one (the
	   same room as the buffers' unless reduce_bucket_size is below that) */
	uint64_t limit = rs ? ZINF_DIV_ROUND_UP(e->o.reduce_bucket_size, (uint64_t)e->world)
			    : e->o.reduce_bucket_size;
	uint64_t room = ZINF_MIN(rs ? e->gr.bucket_cap / e->world : e->gr.bucket_cap, limit);
	struct bucket *b = &e->gr.bk[e->gr.cur];
	/* (a vertical pass may hand more gradients than there are parameters: a bucket's lists
	   hold n_params entries) */
	if (b->n > 0 && (b->used + need > room || b->n == e->n_params)) {
		/* close b; the other bucket must be free (its reduction accumulated) first */
		if ((ret = post(e, b))) {
			return ret;
		}
		e->gr.cur = 1 - e->gr.cur;
		b = &e->gr.bk[e->gr.cur];
		if ((ret = complete(e, b))) {
			return ret;
		}
	}
	if ((ret = eng_order(e, e->compute, e->cs))) {
		return ret;
	}
	size_t gsz = zinf_dtype_size(dtype);
	if (rs) {
		uint64_t seg = e->gr.bucket_cap / e->world;
		for (int r = 0; r < e->world && !ret; r++) {
			uint64_t first = (uint64_t)r * p->part.part;
			uint64_t cnt =
				first >= p->numel ? 0 : ZINF_MIN(p->part.part, p->numel - first);
			float *dst = b->dev + (uint64_t)r * seg + b->used;
			ret = zinf_device_cast(e->cs, dst, ZINF_F32,
					       (const char *)dev_grad + first * gsz, dtype, cnt);
			if (!ret && cnt < p->part.part) { /* the padding only */
				ret = zinf_device_fill(e->cs, dst + cnt, ZINF_F32, 0.0f,
						       p->part.part - cnt);
			}
		}
	} else {
		ret = zinf_device_cast(e->cs, b->dev + b->used, ZINF_F32, dev_grad, dtype,
				       p->numel);
		if (!ret && p->numel < p->part.padded) {
			ret = zinf_device_fill(e->cs, b->dev + b->used + p->numel, ZINF_F32, 0.0f,
					       p->part.padded - p->numel);
		}
	}
	if (ret || (ret = eng_order(e, e->cs, e->compute))) {
		return ret;
	}
	b->params[b->n] = id;
	b->offs[b->n] = b->used;
	b->mb[b->n] = mb;
	b->n++;
	b->used += need;
	p->grads++;
	e->grads_seen++;
	/* progress the other bucket without blocking */
	struct bucket *o = &e->gr.bk[1 - e->gr.cur];
	if (o->posted) {
		ret = o->req ? zinf_comm_test(e->comm, o->req) : 1;
		if (ret < 0) {
			o->req = NULL;
			o->posted = false;
			return ENG_FAIL(e, ret, "gradients: bucket reduction: %s", eng_cause(e));
		}
		if (ret == 1) {
			o->req = NULL;
			if ((ret = accumulate(e, o))) {
				return ret;
			}
		}
	}
	return 0;
}

int
zinf_engine_grad(struct zinf_engine *e, uint32_t id, const void *dev_grad, enum zinf_dtype dtype)
{
	int ret = eng_begin(e, "grad", ENG_FAILS, true);
	return ret ? ret : eng_return(e, grad_in(e, id, dev_grad, dtype));
}

/* zinf_engine_vertical: n's checks, every rank's agreement on them and on n (one all-reduce
 * MAX of n's two 16-bit halves and their negations: exact in fp32), then the pass's count. */
static int
vertical_in(struct zinf_engine *e, uint32_t n)
{
	uint32_t gas = e->o.gradient_accumulation_steps, left = gas - e->micro;
	int ret = 0;
	if (n == 0 || n > left) {
		ret = ENG_FAIL(e, -EINVAL,
			       "vertical: a pass of %u micro-batches, but %u left in the window "
			       "(micro-batch %u of gradient_accumulation_steps %u)",
			       n, left, e->micro, gas);
	} else if (e->grads_seen > 0) {
		ret = ENG_FAIL(e, -EINVAL,
			       "vertical: mid-pass: %u gradients handed since the last "
			       "zinf_engine_step",
			       e->grads_seen);
	}
	for (uint32_t i = 0; i < e->n_layers && !ret; i++) {
		if (e->layers[i].fetched) {
			ret = ENG_FAIL(e, -EINVAL,
				       "vertical: mid-pass: layer %d is fetched (call before the "
				       "pass's first fetch)",
				       e->layers[i].layer);
		}
	}
	if ((ret = eng_agree(e, ret, "vertical"))) {
		return ret; /* every rank: this rank's error, or the one naming the failed rank */
	}
	if (e->world > 1) {
		float v[4] = {(float)(n >> 16), (float)(n & 0xffff), -(float)(n >> 16),
			      -(float)(n & 0xffff)};
		if ((ret = eng_all_max(e, v, 4))) {
			return ENG_FAIL(e, ret, "vertical: the ranks' micro-batch counts: %s",
					eng_cause(e));
		}
		if (v[0] != -v[2] || v[1] != -v[3]) {
			return eng_known(e,
					 ENG_FAIL(e, -EINVAL,
						  "vertical: the ranks pass different micro-batch "
						  "counts (this rank %u)",
						  n));
		}
	}
	e->vert_n = n == 1 ? 0 : n;
	return 0;
}

int
zinf_engine_vertical(struct zinf_engine *e, uint32_t n)
{
	int ret = eng_begin(e, "vertical", ENG_FAILS, true);
	return ret ? ret : eng_return(e, vertical_in(e, n));
}

int
eng_window_open(struct zinf_engine *e)
{
	/* a background save copies the state the step is about to change: it is published first
	   (its errors are zinf_engine_save_wait's) */
	(void)eng_job_finish(e);
	int ret = eng_latch_lr(e);
	if (ret) {
		return ret;
	}
	eng_spec_begin(e); /* with clipping or fp16: the grad_scale assumed */
	/* the window is open from here on (read_master refuses): the worker may begin the step and
	   read ahead (a forward alone, an evaluation, begins nothing) */
	eng_worker_prime(e);
	return 0;
}
