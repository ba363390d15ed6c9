/* SPDX-License-Identifier: Apache-2.0 */
/*
 * device/dev_cuda.c: the "cuda" device through the CUDA runtime: cudaMalloc, cudaHostRegister,
 * non-blocking streams (or the trainer's, wrapped), events without timing, cudaMemcpyAsync, and
 * the kernels of kernels/ (*.cu) through their plain-C launchers. Compiled only with
 * ZINF_HAVE_CUDA; with kernels/ (*.cu) the only code that includes CUDA headers. Every CUDA status
 * goes through cuda_check, which logs the call, file and line and returns a negative errno
 * (never exits); every launcher returns the status of its own launch, checked the same way;
 * a query's cudaErrorNotReady is consumed where it is taken. Calls that touch the device make d's
 * device current first (the current device is per host thread).
 */
#include <cuda_runtime.h>

#include "common/dtype.h"
#include "common/util.h"
#include "device/dev_internal.h"

static int
cuda_errno(cudaError_t e)
{
	switch (e) {
	case cudaErrorMemoryAllocation:
		return -ENOMEM;
	case cudaErrorInvalidValue:
	case cudaErrorInvalidDevicePointer:
	case cudaErrorInvalidResourceHandle:
		return -EINVAL;
	case cudaErrorNoDevice:
	case cudaErrorInvalidDevice:
	case cudaErrorInsufficientDriver:
		return -ENODEV;
	case cudaErrorHostMemoryAlreadyRegistered:
		return -EEXIST;
	case cudaErrorNotSupported:
		return -ENOTSUP;
	default:
		return -EIO;
	}
}

static int
cuda_check_at(cudaError_t e, const char *call, const char *what, const char *file, int line)
{
	if (e == cudaSuccess) {
		return 0;
	}
	(void)cudaGetLastError(); /* clear a non-sticky error so the next call starts clean */
	return zc_log_emit(cuda_errno(e), ZINF_LOG_ERROR, file, line, __func__, "%s: %s: %s (%s)",
			   what, call, cudaGetErrorString(e), cudaGetErrorName(e));
}
/* what: the object the call was for (device or stream name) */
#define cuda_check(call, what) cuda_check_at((call), #call, (what), __FILE__, __LINE__)

static int
cuda_probe(void)
{
	int n = 0;
	/* No GPU, no driver, a driver too old: every error means "no device" here. */
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess) {
		(void)cudaGetLastError();
		ZINF_DEBUG("cuda: no device: %s", cudaGetErrorString(e));
		return -ENODEV;
	}
	return n > 0 ? n : -ENODEV;
}

static int
on(const struct zinf_device *d)
{
	return cuda_check(cudaSetDevice(d->o.index), d->name);
}

static int
cuda_open(struct zinf_device *d)
{
	int n = cuda_probe();
	if (d->o.index >= n) {
		return ZINF_FAIL(-ENODEV, "device \"cuda\": no device %d (%d present)", d->o.index,
				 n > 0 ? n : 0);
	}
	return on(d);
}

static void
cuda_close(struct zinf_device *d)
{
}

static int
cuda_host_register(struct zinf_device *d, void *p, size_t len)
{
	int rc = on(d);
	return rc ? rc : cuda_check(cudaHostRegister(p, len, cudaHostRegisterDefault), d->name);
}

static void
cuda_host_unregister(struct zinf_device *d, void *p)
{
	if (on(d) == 0) {
		(void)cuda_check(cudaHostUnregister(p), d->name);
	}
}

static int
cuda_alloc(struct zinf_device *d, size_t len, void **out)
{
	int rc = on(d);
	return rc ? rc : cuda_check(cudaMalloc(out, len ? len : 1), d->name);
}

static void
cuda_free(struct zinf_device *d, void *p)
{
	if (on(d) == 0) {
		(void)cuda_check(cudaFree(p), d->name);
	}
}

/* ---- streams and events --------------------------------------------------------------------- */

struct cuda_stream {
	double *scratch; /* ZINF_K_SUMSQ_BLOCKS doubles for the sum of squares' first pass */
};

static cudaStream_t
cs(const struct zinf_stream *s)
{
	return (cudaStream_t)s->native;
}

static int
cuda_stream_open(struct zinf_stream *s)
{
	struct cuda_stream *c = zc_calloc(1, sizeof(*c));
	if (!c) {
		return ZINF_FAIL(-ENOMEM, "stream \"%s\": out of memory", s->name);
	}
	int rc = on(s->dev);
	if (rc) {
		goto err_free;
	}
	if (!s->wrapped) {
		cudaStream_t st;
		rc = cuda_check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), s->name);
		if (rc) {
			goto err_free;
		}
		s->native = st;
	}
	rc = cuda_check(cudaMalloc((void **)&c->scratch, ZINF_K_SUMSQ_BLOCKS * sizeof(double)),
			s->name);
	if (rc) {
		goto err_stream;
	}
	s->priv = c;
	return 0;

err_stream:
	if (!s->wrapped) {
		(void)cuda_check(cudaStreamDestroy(cs(s)), s->name);
	}
err_free:
	zc_free(c);
	return rc;
}

static void
cuda_stream_close(struct zinf_stream *s)
{
	struct cuda_stream *c = s->priv;
	if (on(s->dev) == 0) {
		(void)cuda_check(cudaFree(c->scratch), s->name);
		if (!s->wrapped) {
			(void)cuda_check(cudaStreamDestroy(cs(s)), s->name);
		}
	}
	zc_free(c);
}

/* Sync, record and wait make the stream's device current too: a wrapped NULL stream is the
 * legacy default stream of whatever device is current on the calling thread. */
static int
cuda_stream_sync(struct zinf_stream *s)
{
	int rc = on(s->dev);
	return rc ? rc : cuda_check(cudaStreamSynchronize(cs(s)), s->name);
}

static int
cuda_event_open(struct zinf_event *e)
{
	cudaEvent_t ev;
	int rc = on(e->dev);
	if (rc) {
		return rc;
	}
	rc = cuda_check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), e->dev->name);
	if (rc == 0) {
		e->priv = ev;
	}
	return rc;
}

static void
cuda_event_close(struct zinf_event *e)
{
	(void)cuda_check(cudaEventDestroy((cudaEvent_t)e->priv), e->dev->name);
}

static int
cuda_event_record(struct zinf_event *e, struct zinf_stream *s)
{
	int rc = on(s->dev);
	return rc ? rc : cuda_check(cudaEventRecord((cudaEvent_t)e->priv, cs(s)), s->name);
}

static int
cuda_stream_wait(struct zinf_stream *s, struct zinf_event *e)
{
	int rc = on(s->dev);
	return rc ? rc : cuda_check(cudaStreamWaitEvent(cs(s), (cudaEvent_t)e->priv, 0), s->name);
}

static int
cuda_event_query(struct zinf_event *e)
{
	cudaError_t r = cudaEventQuery((cudaEvent_t)e->priv);
	if (r == cudaErrorNotReady) {
		(void)cudaGetLastError();
		return 0;
	}
	int rc = cuda_check(r, e->dev->name);
	return rc ? rc : 1;
}

static int
cuda_event_sync(struct zinf_event *e)
{
	return cuda_check(cudaEventSynchronize((cudaEvent_t)e->priv), e->dev->name);
}

/* ---- copies and kernels --------------------------------------------------------------------- */

static int
cuda_copy(struct zinf_stream *s, void *dst, const void *src, size_t len, enum zinf_copy_dir dir)
{
	static const enum cudaMemcpyKind kind[] = {
		[ZINF_COPY_H2D] = cudaMemcpyHostToDevice,
		[ZINF_COPY_D2H] = cudaMemcpyDeviceToHost,
		[ZINF_COPY_D2D] = cudaMemcpyDeviceToDevice,
	};
	int rc = on(s->dev);
	return rc ? rc : cuda_check(cudaMemcpyAsync(dst, src, len, kind[dir], cs(s)), s->name);
}

/* The fill value's bit pattern in dtype, converted as zinf_dtype_convert does. */
static uint32_t
fill_bits(enum zinf_dtype t, float v)
{
	switch (t) {
	case ZINF_F16:
		return dt_f32_to_f16_rne(v);
	case ZINF_BF16:
		return dt_f32_to_bf16_rne(v);
	default:
		return dt_f2u(v);
	}
}

static int
cuda_kernel(struct zinf_stream *s, const struct zinf_kop *k)
{
	int rc = on(s->dev);
	if (rc) {
		return rc;
	}
	void *st = s->native;
	struct cuda_stream *c = s->priv;
	int e = cudaErrorInvalidValue;
	switch (k->kind) {
	case ZINF_KOP_CAST:
		e = kern_cast(st, k->dst, k->dst_dtype, k->src, k->src_dtype, k->n);
		break;
	case ZINF_KOP_SCALE:
		e = kern_scale(st, k->dst, k->dst_dtype, k->value, k->n);
		break;
	case ZINF_KOP_ACCUMULATE:
		e = kern_accumulate(st, k->dst, k->src, k->src_dtype, k->n);
		break;
	case ZINF_KOP_SUMSQ:
		e = kern_sumsq(st, k->src, k->src_dtype, k->n, c->scratch, k->out);
		break;
	case ZINF_KOP_NONFINITE:
		e = kern_nonfinite(st, k->src, k->src_dtype, k->n, k->flag);
		break;
	case ZINF_KOP_FILL:
		e = kern_fill(st, k->dst, k->dst_dtype, fill_bits(k->dst_dtype, k->value), k->n);
		break;
	case ZINF_KOP_QUANTIZE:
		e = kern_quantize(st, k->codes, k->scales, k->src, k->src_dtype, k->n, k->block,
				  k->bits, k->err, k->value);
		break;
	case ZINF_KOP_DEQUANTIZE:
		e = kern_dequantize(st, k->dst, k->dst_dtype, k->codes, k->scales, k->n, k->block,
				    k->bits, k->acc);
		break;
	case ZINF_KOP_ADAM:
		e = kern_adam(st, &k->adam_k, k->param, k->grad, k->grad_dtype, k->m, k->v, k->copy,
			      k->copy_dtype, k->n);
		break;
	}
	static const char *const name[] = {
		[ZINF_KOP_CAST] = "kern_cast",
		[ZINF_KOP_SCALE] = "kern_scale",
		[ZINF_KOP_ACCUMULATE] = "kern_accumulate",
		[ZINF_KOP_SUMSQ] = "kern_sumsq",
		[ZINF_KOP_NONFINITE] = "kern_nonfinite",
		[ZINF_KOP_FILL] = "kern_fill",
		[ZINF_KOP_ADAM] = "kern_adam",
		[ZINF_KOP_QUANTIZE] = "kern_quantize",
		[ZINF_KOP_DEQUANTIZE] = "kern_dequantize",
	};
	return cuda_check_at((cudaError_t)e, name[k->kind], s->name, __FILE__, __LINE__);
}

const struct zinf_dev_ops zinf_dev_cuda_ops = {
	.name = "cuda",
	.probe = cuda_probe,
	.open = cuda_open,
	.close = cuda_close,
	.host_register = cuda_host_register,
	.host_unregister = cuda_host_unregister,
	.alloc = cuda_alloc,
	.free = cuda_free,
	.stream_open = cuda_stream_open,
	.stream_close = cuda_stream_close,
	.stream_sync = cuda_stream_sync,
	.event_open = cuda_event_open,
	.event_close = cuda_event_close,
	.event_record = cuda_event_record,
	.stream_wait = cuda_stream_wait,
	.event_query = cuda_event_query,
	.event_sync = cuda_event_sync,
	.copy = cuda_copy,
	.kernel = cuda_kernel,
};
