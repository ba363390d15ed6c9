/* SPDX-License-Identifier: Apache-2.0 */
/*
 * device/device.c: the public device API over the ops tables: options, the device, stream and
 * event handles, and the checks of every copy and kernel before a backend sees it (so a bad
 * argument is -EINVAL when it is queued, on every backend, never a fault on a stream's thread).
 * It fills the CUDA Adam kernel's scalars from cpu_adam's adam_scalars_get; it runs nothing
 * itself.
 */
#include <stdio.h>
#include <string.h>

#include "common/dtype.h"
#include "common/quant.h"
#include "common/opts.h"
#include "common/util.h"
#include "cpu_adam/adam_scalars_internal.h"
#include "device/dev_internal.h"

ZINF_OPTS_NO_TAIL_PAD(struct zinf_device_opts, reserved);

void
zinf_device_opts_init(struct zinf_device_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
}

int
zinf_device_create(const struct zinf_device_opts *opts, struct zinf_device **out)
{
	struct zinf_device_opts o;
	zinf_device_opts_init(&o);
	int rc = zc_opts_take(&o, sizeof(o), opts, "zinf_device_opts");
	if (rc) {
		return rc;
	}
	if (!out) {
		return ZINF_FAIL(-EINVAL, "device: NULL output");
	}
	if (o.index < 0) {
		return ZINF_FAIL(-EINVAL, "device: index %d < 0", o.index);
	}
	for (size_t i = 0; i < sizeof(o.reserved); i++) {
		if (o.reserved[i]) {
			return ZINF_FAIL(-EINVAL, "device: reserved byte %zu is not zero", i);
		}
	}
	const struct zinf_dev_ops *ops;
	rc = dev_get(o.backend, &ops);
	if (rc) {
		return rc;
	}
	struct zinf_device *d = zc_calloc(1, sizeof(*d));
	if (!d) {
		return ZINF_FAIL(-ENOMEM, "device %s: out of memory", ops->name);
	}
	d->ops = ops;
	atomic_init(&d->refs, 1);
	d->o = o;
	d->o.backend = NULL;
	snprintf(d->name, sizeof(d->name), "%s:%d", ops->name, o.index);
	rc = ops->open(d);
	if (rc) {
		zc_free(d);
		return rc;
	}
	ZINF_DEBUG("device %s opened", d->name);
	*out = d;
	return 0;
}

/* Drop a reference to d; the last one closes it. */
static void
dev_put(struct zinf_device *d)
{
	if (atomic_fetch_sub(&d->refs, 1) == 1) {
		d->ops->close(d);
		zc_free(d);
	}
}

void
zinf_device_destroy(struct zinf_device *d)
{
	if (!d) {
		return;
	}
	/* A stream's thread and an event's marks use the device's state: it stays until the
	 * last of them is destroyed, rather than being freed under them. */
	int ns = atomic_load(&d->streams), ne = atomic_load(&d->events);
	if (ns || ne) {
		ZINF_ERR("device %s: destroyed with %d streams and %d events alive: closed when "
			 "the last of them is destroyed",
			 d->name, ns, ne);
	}
	dev_put(d);
}

const char *
zinf_device_backend(const struct zinf_device *d)
{
	return d ? d->ops->name : "(null)";
}

int
zinf_device_index(const struct zinf_device *d)
{
	return d ? d->o.index : -1;
}

int
zinf_device_count(const char *backend)
{
	const struct zinf_dev_ops *ops;
	int rc = dev_get(backend, &ops);
	return rc ? rc : ops->probe();
}

/* ---- memory --------------------------------------------------------------------------------- */

int
zinf_device_alloc(struct zinf_device *d, size_t bytes, void **out)
{
	if (!d || !out) {
		return ZINF_FAIL(-EINVAL, "device alloc of %zu bytes: NULL %s", bytes,
				 d ? "output" : "device");
	}
	return d->ops->alloc(d, bytes, out);
}

void
zinf_device_free(struct zinf_device *d, void *dev_ptr)
{
	if (d && dev_ptr) {
		d->ops->free(d, dev_ptr);
	}
}

int
zinf_device_host_register(struct zinf_device *d, void *p, size_t bytes)
{
	if (!d || !p || bytes == 0) {
		return ZINF_FAIL(-EINVAL, "device %s: host registration of %p, %zu bytes refused",
				 d ? d->name : "(null)", p, bytes);
	}
	return d->ops->host_register(d, p, bytes);
}

void
zinf_device_host_unregister(struct zinf_device *d, void *p)
{
	if (d && p) {
		d->ops->host_unregister(d, p);
	}
}

/* ---- streams and events --------------------------------------------------------------------- */

static int
stream_new(struct zinf_device *d, bool wrapped, void *native, const char *name,
	   struct zinf_stream **out)
{
	if (!d || !out) {
		return ZINF_FAIL(-EINVAL, "stream \"%s\": NULL %s", name ? name : "stream",
				 d ? "output" : "device");
	}
	struct zinf_stream *s = zc_calloc(1, sizeof(*s));
	if (!s) {
		return ZINF_FAIL(-ENOMEM, "device %s: out of memory for a stream", d->name);
	}
	s->dev = d;
	s->wrapped = wrapped;
	s->native = native;
	snprintf(s->name, sizeof(s->name), "%s", name ? name : "stream");
	int rc = d->ops->stream_open(s);
	if (rc) {
		zc_free(s);
		return rc;
	}
	atomic_fetch_add(&d->streams, 1);
	atomic_fetch_add(&d->refs, 1);
	*out = s;
	return 0;
}

int
zinf_stream_create(struct zinf_device *d, const char *name, struct zinf_stream **out)
{
	return stream_new(d, false, NULL, name, out);
}

int
zinf_stream_wrap(struct zinf_device *d, void *native, const char *name, struct zinf_stream **out)
{
	return stream_new(d, true, native, name, out);
}

void
zinf_stream_destroy(struct zinf_stream *s)
{
	if (!s) {
		return;
	}
	struct zinf_device *d = s->dev;
	(void)d->ops->stream_sync(s);
	d->ops->stream_close(s);
	atomic_fetch_sub(&d->streams, 1);
	zc_free(s);
	dev_put(d);
}

void *
zinf_stream_native(const struct zinf_stream *s)
{
	return s ? s->native : NULL;
}

int
zinf_stream_sync(struct zinf_stream *s)
{
	if (!s) {
		return ZINF_FAIL(-EINVAL, "stream sync: NULL stream");
	}
	return s->dev->ops->stream_sync(s);
}

int
zinf_event_create(struct zinf_device *d, struct zinf_event **out)
{
	if (!d || !out) {
		return ZINF_FAIL(-EINVAL, "event create: NULL %s", d ? "output" : "device");
	}
	struct zinf_event *e = zc_calloc(1, sizeof(*e));
	if (!e) {
		return ZINF_FAIL(-ENOMEM, "device %s: out of memory for an event", d->name);
	}
	e->dev = d;
	int rc = d->ops->event_open(e);
	if (rc) {
		zc_free(e);
		return rc;
	}
	atomic_fetch_add(&d->events, 1);
	atomic_fetch_add(&d->refs, 1);
	*out = e;
	return 0;
}

void
zinf_event_destroy(struct zinf_event *e)
{
	if (!e) {
		return;
	}
	struct zinf_device *d = e->dev;
	d->ops->event_close(e);
	atomic_fetch_sub(&d->events, 1);
	zc_free(e);
	dev_put(d);
}

static int
check_pair(const char *what, struct zinf_event *e, struct zinf_stream *s)
{
	if (!e || !s) {
		return ZINF_FAIL(-EINVAL, "%s: NULL %s", what, e ? "stream" : "event");
	}
	if (e->dev != s->dev) {
		return ZINF_FAIL(-EINVAL, "%s: the event is on device %s, stream \"%s\" on %s",
				 what, e->dev->name, s->name, s->dev->name);
	}
	return 0;
}

int
zinf_event_record(struct zinf_event *e, struct zinf_stream *s)
{
	int rc = check_pair("event record", e, s);
	return rc ? rc : s->dev->ops->event_record(e, s);
}

int
zinf_stream_wait_event(struct zinf_stream *s, struct zinf_event *e)
{
	int rc = check_pair("stream wait", e, s);
	return rc ? rc : s->dev->ops->stream_wait(s, e);
}

int
zinf_event_query(struct zinf_event *e)
{
	if (!e) {
		return ZINF_FAIL(-EINVAL, "event query: NULL event");
	}
	return e->dev->ops->event_query(e);
}

int
zinf_event_sync(struct zinf_event *e)
{
	if (!e) {
		return ZINF_FAIL(-EINVAL, "event sync: NULL event");
	}
	return e->dev->ops->event_sync(e);
}

/* ---- copies and kernels --------------------------------------------------------------------- */

int
zinf_device_copy(struct zinf_stream *s, void *dst, const void *src, size_t bytes,
		 enum zinf_copy_dir dir)
{
	if (!s) {
		return ZINF_FAIL(-EINVAL, "copy of %zu bytes: NULL stream", bytes);
	}
	if (dir != ZINF_COPY_H2D && dir != ZINF_COPY_D2H && dir != ZINF_COPY_D2D) {
		return ZINF_FAIL(-EINVAL, "stream \"%s\": copy direction %d unknown", s->name,
				 (int)dir);
	}
	if (bytes == 0) {
		return 0;
	}
	if (!dst || !src) {
		return ZINF_FAIL(-EINVAL, "stream \"%s\": copy of %zu bytes with NULL %s", s->name,
				 bytes, dst ? "source" : "destination");
	}
	return s->dev->ops->copy(s, dst, src, bytes, dir);
}

static bool
dtype_ok(enum zinf_dtype t)
{
	return t == ZINF_F32 || t == ZINF_F16 || t == ZINF_BF16;
}

/* The checks every kernel shares: a stream, known dtypes, non-NULL arrays when n > 0. */
static int
kernel_check(const char *fn, struct zinf_stream *s, size_t n, enum zinf_dtype t1,
	     enum zinf_dtype t2, const void *p1, const void *p2)
{
	if (!s) {
		return ZINF_FAIL(-EINVAL, "%s: NULL stream", fn);
	}
	if (!dtype_ok(t1) || !dtype_ok(t2)) {
		return ZINF_FAIL(-EINVAL, "%s on stream \"%s\": unknown dtype %d", fn, s->name,
				 !dtype_ok(t1) ? (int)t1 : (int)t2);
	}
	if (n > 0 && (!p1 || !p2)) {
		return ZINF_FAIL(-EINVAL, "%s on stream \"%s\": NULL array with n = %zu", fn,
				 s->name, n);
	}
	return 0;
}

static int
queue(struct zinf_stream *s, const struct zinf_kop *k)
{
	return k->n ? s->dev->ops->kernel(s, k) : 0;
}

int
zinf_device_cast(struct zinf_stream *s, void *dst, enum zinf_dtype dst_dtype, const void *src,
		 enum zinf_dtype src_dtype, size_t n)
{
	int rc = kernel_check(__func__, s, n, dst_dtype, src_dtype, dst, src);
	if (rc) {
		return rc;
	}
	if (dst_dtype != ZINF_F32 && src_dtype != ZINF_F32) {
		return ZINF_FAIL(-EINVAL, "%s on stream \"%s\": %s -> %s: one side must be f32",
				 __func__, s->name, zinf_dtype_name(src_dtype),
				 zinf_dtype_name(dst_dtype));
	}
	struct zinf_kop k = {.kind = ZINF_KOP_CAST,
			     .n = n,
			     .dst = dst,
			     .src = src,
			     .dst_dtype = dst_dtype,
			     .src_dtype = src_dtype};
	return queue(s, &k);
}

int
zinf_device_scale(struct zinf_stream *s, void *x, enum zinf_dtype dtype, float scale, size_t n)
{
	int rc = kernel_check(__func__, s, n, dtype, dtype, x, x);
	if (rc) {
		return rc;
	}
	struct zinf_kop k = {
		.kind = ZINF_KOP_SCALE, .n = n, .dst = x, .dst_dtype = dtype, .value = scale};
	return queue(s, &k);
}

int
zinf_device_accumulate(struct zinf_stream *s, float *dst, const void *src,
		       enum zinf_dtype src_dtype, size_t n)
{
	int rc = kernel_check(__func__, s, n, ZINF_F32, src_dtype, dst, src);
	if (rc) {
		return rc;
	}
	struct zinf_kop k = {.kind = ZINF_KOP_ACCUMULATE,
			     .n = n,
			     .dst = dst,
			     .src = src,
			     .dst_dtype = ZINF_F32,
			     .src_dtype = src_dtype};
	return queue(s, &k);
}

int
zinf_device_sumsq(struct zinf_stream *s, const void *x, enum zinf_dtype dtype, size_t n,
		  double *dev_out)
{
	int rc = kernel_check(__func__, s, n, dtype, dtype, x, x);
	if (rc) {
		return rc;
	}
	if (!dev_out) {
		return ZINF_FAIL(-EINVAL, "%s on stream \"%s\": NULL output", __func__, s->name);
	}
	/* n = 0 still writes the (zero) sum: the caller reads it. */
	struct zinf_kop k = {
		.kind = ZINF_KOP_SUMSQ, .n = n, .src = x, .src_dtype = dtype, .out = dev_out};
	return s->dev->ops->kernel(s, &k);
}

int
zinf_device_nonfinite(struct zinf_stream *s, const void *x, enum zinf_dtype dtype, size_t n,
		      uint32_t *dev_flag)
{
	int rc = kernel_check(__func__, s, n, dtype, dtype, x, x);
	if (rc) {
		return rc;
	}
	if (!dev_flag) {
		return ZINF_FAIL(-EINVAL, "%s on stream \"%s\": NULL flag", __func__, s->name);
	}
	struct zinf_kop k = {
		.kind = ZINF_KOP_NONFINITE, .n = n, .src = x, .src_dtype = dtype, .flag = dev_flag};
	return queue(s, &k);
}

int
zinf_device_fill(struct zinf_stream *s, void *dst, enum zinf_dtype dtype, float value, size_t n)
{
	int rc = kernel_check(__func__, s, n, dtype, dtype, dst, dst);
	if (rc) {
		return rc;
	}
	struct zinf_kop k = {
		.kind = ZINF_KOP_FILL, .n = n, .dst = dst, .dst_dtype = dtype, .value = value};
	return queue(s, &k);
}

int
zinf_device_quantize(struct zinf_stream *s, void *codes, float *scales, const void *x,
		     enum zinf_dtype dtype, size_t n, size_t block, unsigned bits, float *err,
		     float err_beta)
{
	int rc = kernel_check(__func__, s, n, dtype, dtype, codes, x);
	if (rc) {
		return rc;
	}
	if (n > 0 && !scales) {
		return ZINF_FAIL(-EINVAL, "%s on stream \"%s\": NULL scales with n = %zu", __func__,
				 s->name, n);
	}
	char who[96];
	snprintf(who, sizeof(who), "%s on stream \"%s\"", __func__, s->name);
	if ((rc = qz_check(block, bits, who)) < 0) {
		return rc;
	}
	struct zinf_kop k = {.kind = ZINF_KOP_QUANTIZE,
			     .n = n,
			     .src = x,
			     .src_dtype = dtype,
			     .codes = codes,
			     .scales = scales,
			     .err = err,
			     .value = err_beta,
			     .block = block,
			     .bits = bits};
	return queue(s, &k);
}

int
zinf_device_dequantize(struct zinf_stream *s, void *y, enum zinf_dtype dtype, const void *codes,
		       const float *scales, size_t n, size_t block, unsigned bits, bool accumulate)
{
	int rc = kernel_check(__func__, s, n, dtype, dtype, y, codes);
	if (rc) {
		return rc;
	}
	if (n > 0 && !scales) {
		return ZINF_FAIL(-EINVAL, "%s on stream \"%s\": NULL scales with n = %zu", __func__,
				 s->name, n);
	}
	if (accumulate && dtype != ZINF_F32) {
		return ZINF_FAIL(-EINVAL, "%s on stream \"%s\": accumulates into f32, not %s",
				 __func__, s->name, zinf_dtype_name(dtype));
	}
	char who[96];
	snprintf(who, sizeof(who), "%s on stream \"%s\"", __func__, s->name);
	if ((rc = qz_check(block, bits, who)) < 0) {
		return rc;
	}
	struct zinf_kop k = {.kind = ZINF_KOP_DEQUANTIZE,
			     .n = n,
			     .dst = y,
			     .dst_dtype = dtype,
			     .codes = (void *)codes,
			     .scales = (float *)scales,
			     .block = block,
			     .bits = bits,
			     .acc = accumulate};
	return queue(s, &k);
}

/*
 * The step's scalars from cpu_adam's own function, so that the cuda kernel, which rounds each
 * operation as cpu_adam's vector paths do, equals them.
 */
static void
adam_scalars(const struct zinf_adam_opts *o, int64_t step, float grad_scale, struct zinf_k_adam *a)
{
	struct zinf_adam_scalars sc;
	adam_scalars_get(o, step, &sc);
	memset(a, 0, sizeof(*a));
	a->grad_scale = grad_scale;
	a->l2 = sc.l2;
	a->wd = sc.wd;
	a->decay = sc.decay;
	a->b1 = sc.b1;
	a->omb1 = sc.omb1;
	a->b2 = sc.b2;
	a->omb2 = sc.omb2;
	a->eps = sc.eps;
	a->nstep = sc.nstep;
	a->inv_bc2_sqrt = sc.inv_bc2_sqrt;
}

int
zinf_device_adam(struct zinf_stream *s, const struct zinf_adam_opts *o, int64_t step,
		 float grad_scale, float *param, const void *grad, enum zinf_dtype grad_dtype,
		 float *exp_avg, float *exp_avg_sq, size_t n, void *param_copy,
		 enum zinf_dtype copy_dtype)
{
	if (!s) {
		return ZINF_FAIL(-EINVAL, "%s: NULL stream", __func__);
	}
	/*
	 * cpu_adam's own checks of the caller's options (its size rule included: a size ending
	 * inside the simd pointer is refused before anything reads it), step, scale and dtypes,
	 * with n = 0 so that no array is touched (the arrays are device memory): one definition
	 * of what is valid. Only then are the options taken.
	 */
	struct zinf_adam_opts ao;
	zinf_adam_opts_init(&ao);
	int rc = zinf_adam_step(o, step, grad_scale, param, grad, grad_dtype, exp_avg, exp_avg_sq,
				0, param_copy, copy_dtype);
	if (rc == 0) {
		rc = zc_opts_take(&ao, sizeof(ao), o, "zinf_adam_opts");
	}
	if (rc == 0) {
		/* a constant name: nothing of the caller's is kept past this call */
		rc = zinf_simd_resolve(ao.simd, &ao.simd);
	}
	if (rc) {
		char why[256];
		snprintf(why, sizeof(why), "%s", zinf_last_error());
		return ZINF_FAIL(rc, "%s on stream \"%s\": refused (%s)", __func__, s->name, why);
	}
	if (n > 0 && (!param || !grad || !exp_avg || !exp_avg_sq)) {
		return ZINF_FAIL(-EINVAL, "%s on stream \"%s\": NULL array with n = %zu", __func__,
				 s->name, n);
	}
	struct zinf_kop k = {.kind = ZINF_KOP_ADAM,
			     .n = n,
			     .adam = ao,
			     .step = step,
			     .grad_scale = grad_scale,
			     .param = param,
			     .m = exp_avg,
			     .v = exp_avg_sq,
			     .grad = grad,
			     .copy = param_copy,
			     .grad_dtype = grad_dtype,
			     .copy_dtype = copy_dtype};
	adam_scalars(&ao, step, grad_scale, &k.adam_k);
	return queue(s, &k);
}
