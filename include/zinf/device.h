/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zinf/device.h: the device a trainer computes on, as a handle: memory, page-locked host
 * registration, streams, events, asynchronous copies and the kernels the ZeRO engine runs on
 * device memory (casts, scale, accumulate, sum of squares, non-finite check, fill, fused Adam).
 * The trainer's API (zinf/zinf.h includes it).
 *
 * Backends: "cuda" (the CUDA runtime; kernels in kernels/ (*.cu)) and "host" (device memory is
 * host memory, copies are memcpy, kernels are the C references; every stream runs on its own
 * thread, ordered only by events, so that a missing event wait gives a wrong result in a CPU
 * test as it would on a GPU). A backend that was not built answers -ENODEV.
 *
 * Ordering. Work queued on one stream runs in order. Work on two streams is unordered unless
 * the later stream waits on an event recorded on the earlier one:
 *     zinf_device_copy(copy_stream, dev_x, pinned_x, bytes, ZINF_COPY_H2D);
 *     zinf_event_record(ev, copy_stream);
 *     zinf_stream_wait_event(compute_stream, ev);
 *     zinf_device_scale(compute_stream, dev_x, ZINF_F32, 0.5f, n);
 * Every copy and kernel takes the stream it runs on; there is no implicit ordering with the host
 * either: the host sees results after zinf_stream_sync() or zinf_event_sync().
 *
 * Errors are checked when work is queued (-EINVAL with a message naming the stream and the
 * argument); a failure while queued work runs is kept by its stream and returned by the next
 * zinf_stream_sync() of that stream.
 */
#ifndef ZINF_DEVICE_H
#define ZINF_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zinf/blocks/adam.h"
#include "zinf/common.h"

#ifdef __cplusplus
extern "C" {
#endif

struct zinf_device; /* opaque: a backend and a device index */
struct zinf_stream; /* opaque: an ordered queue of work on one device */
struct zinf_event;  /* opaque: a point in a stream's queue */

struct zinf_device_opts {
	size_t size;	     /* sizeof(struct zinf_device_opts); set by zinf_device_opts_init() */
	const char *backend; /* "cuda", "host", or NULL (default): "cuda" when the CUDA runtime
				reports at least one device (any CUDA error: none), else "host" */
	int index;	     /* device index (CUDA ordinal); default 0; "host" has only 0 */
	bool host_sync;	     /* host backend: run every stream's work on the calling thread
				when it is queued (debugging: hides missing event waits);
				default false */
	uint8_t reserved[3]; /* zero */
};

/** Fill *o with the defaults above (and o->size). */
ZINF_API void zinf_device_opts_init(struct zinf_device_opts *o);

/**
 * Open a device. opts may be NULL (defaults). Returns 0 and sets *out; or
 *   -EINVAL  bad option (unknown backend name, index < 0, reserved bytes not zero)
 *   -ENODEV  the named backend was not built, or has no device `index`
 *   -ENOMEM
 * Free with zinf_device_destroy() after its streams and events.
 */
ZINF_API int zinf_device_create(const struct zinf_device_opts *opts, struct zinf_device **out);
/**
 * Close a device. Streams or events still alive are a caller bug (logged); the device then
 * stays open until the last of them is destroyed. NULL: no-op.
 */
ZINF_API void zinf_device_destroy(struct zinf_device *d);
/** "cuda" or "host". */
ZINF_API const char *zinf_device_backend(const struct zinf_device *d);
/** The device index it was opened with. */
ZINF_API int zinf_device_index(const struct zinf_device *d);
/**
 * Devices of `backend` present (NULL: the backend zinf_device_create() would pick): "host" has
 * 1. Opens nothing (no context on any device). Returns the count (>= 1); -EINVAL unknown name;
 * -ENODEV not built, or no device.
 */
ZINF_API int zinf_device_count(const char *backend);

/* ---- memory ---------------------------------------------------------------------------------- */

/**
 * Allocate `bytes` of device memory (256-byte aligned at least; bytes 0 gives a valid pointer).
 * Returns 0 and sets *out; -EINVAL (NULL argument), -ENOMEM. Free with zinf_device_free().
 */
ZINF_API int zinf_device_alloc(struct zinf_device *d, size_t bytes, void **out);
/** Free device memory. The caller makes sure no queued work still uses it. NULL: no-op. */
ZINF_API void zinf_device_free(struct zinf_device *d, void *dev_ptr);
/**
 * Page-lock host memory [p, p + bytes) for the device's DMA (cudaHostRegister; nothing on
 * "host"). Returns 0; -EINVAL (NULL, bytes 0), -EEXIST (already registered), -ENOMEM, -EIO.
 * Undo with zinf_device_host_unregister() before the memory is freed.
 */
ZINF_API int zinf_device_host_register(struct zinf_device *d, void *p, size_t bytes);
ZINF_API void zinf_device_host_unregister(struct zinf_device *d, void *p);

/* ---- streams and events ---------------------------------------------------------------------- */

/**
 * A stream owned by zinf (copy streams, the collective stream). name is used in messages
 * (copied; NULL: "stream"). Returns 0 and sets *out; -EINVAL, -ENOMEM, or the backend's error
 * (-EAGAIN: no thread). Free with zinf_stream_destroy().
 */
ZINF_API int zinf_stream_create(struct zinf_device *d, const char *name, struct zinf_stream **out);
/**
 * Wrap a stream the trainer owns (its compute stream): on "cuda", native is a cudaStream_t
 * (NULL: the legacy default stream); on "host", native must be NULL and the wrapper is a host
 * stream like any other (it stands for the trainer's stream in CPU tests). zinf_stream_destroy()
 * frees the wrapper only, never the native stream. Errors as zinf_stream_create().
 */
ZINF_API int zinf_stream_wrap(struct zinf_device *d, void *native, const char *name,
			      struct zinf_stream **out);
/** Wait for the stream's queued work, then free it (NULL: no-op). */
ZINF_API void zinf_stream_destroy(struct zinf_stream *s);
/** The native handle (cudaStream_t as void *; NULL on "host"). */
ZINF_API void *zinf_stream_native(const struct zinf_stream *s);
/**
 * Block until everything queued on s has run. Returns 0, or the first error of work that ran
 * on s since the previous sync (negative errno, logged when it happened).
 */
ZINF_API int zinf_stream_sync(struct zinf_stream *s);

/** An event on device d. Returns 0 and sets *out; -EINVAL, -ENOMEM, the backend's error. */
ZINF_API int zinf_event_create(struct zinf_device *d, struct zinf_event **out);
ZINF_API void zinf_event_destroy(struct zinf_event *e); /* NULL: no-op */
/**
 * Record e at the current end of s: e completes when everything queued on s before it has run.
 * Recording again moves the event; waits queued earlier keep the point they were given.
 * Returns 0; -EINVAL (NULL, or e and s on different devices).
 */
ZINF_API int zinf_event_record(struct zinf_event *e, struct zinf_stream *s);
/**
 * Make work queued on s after this call wait until e's latest record completes (without
 * blocking the host). An event never recorded is complete. Returns 0; -EINVAL as above.
 */
ZINF_API int zinf_stream_wait_event(struct zinf_stream *s, struct zinf_event *e);
/** 1 when e's latest record completed (or it was never recorded), 0 when not yet, or -errno. */
ZINF_API int zinf_event_query(struct zinf_event *e);
/** Block the host until e's latest record completed. Returns 0 or -errno. */
ZINF_API int zinf_event_sync(struct zinf_event *e);

/* ---- copies ---------------------------------------------------------------------------------- */

enum zinf_copy_dir { ZINF_COPY_H2D = 0, ZINF_COPY_D2H = 1, ZINF_COPY_D2D = 2 };

/**
 * Queue a copy of `bytes` bytes on s. Host memory should be page-locked (a pool's buffers, or
 * zinf_device_host_register) for the copy to be asynchronous on "cuda". The ranges must not
 * overlap. Returns 0; -EINVAL (NULL pointer with bytes > 0, unknown direction).
 */
ZINF_API int zinf_device_copy(struct zinf_stream *s, void *dst, const void *src, size_t bytes,
			      enum zinf_copy_dir dir);

/* ---- kernels: queued on s, on device memory, n elements ---------------------------------------
 * Every kernel returns 0 when queued, or -EINVAL (NULL pointer with n > 0, a dtype or dtype pair
 * it does not take) with a message naming the stream. Conversions to f16 and bf16 round to
 * nearest even, keep NaN a NaN (quieted, sign and top payload bits kept) and infinities
 * infinite, round subnormals exactly, and overflow f16 to infinity: bit for bit as
 * zinf_dtype_convert(). */

/** dst = src converted: f32 -> f32, f16 or bf16, and f16 or bf16 -> f32 (exact). */
ZINF_API int zinf_device_cast(struct zinf_stream *s, void *dst, enum zinf_dtype dst_dtype,
			      const void *src, enum zinf_dtype src_dtype, size_t n);
/** x *= scale in place (in float; 16-bit types rounded back). */
ZINF_API int zinf_device_scale(struct zinf_stream *s, void *x, enum zinf_dtype dtype, float scale,
			       size_t n);
/** dst += src, dst f32, src f32, f16 or bf16 (widened exactly, one float addition). */
ZINF_API int zinf_device_accumulate(struct zinf_stream *s, float *dst, const void *src,
				    enum zinf_dtype src_dtype, size_t n);
/**
 * *dev_out (one double in device memory) = sum of x[i]^2, each square exact in float64 and
 * summed in float64: relative error at most (n - 1) * 2^-53 (host: zinf_grad_sumsq; cuda:
 * per-thread float64 partials, a float64 tree per block, the block partials summed in a fixed
 * order by one more block, so the result repeats bit for bit for the same n).
 */
ZINF_API int zinf_device_sumsq(struct zinf_stream *s, const void *x, enum zinf_dtype dtype,
			       size_t n, double *dev_out);
/**
 * Set *dev_flag (a uint32_t in device memory) to 1 when any x[i] is an infinity or a NaN; leave
 * it as it was otherwise (zero it first with zinf_device_fill; tensors may share one flag).
 */
ZINF_API int zinf_device_nonfinite(struct zinf_stream *s, const void *x, enum zinf_dtype dtype,
				   size_t n, uint32_t *dev_flag);
/** dst[i] = value converted to dtype. */
ZINF_API int zinf_device_fill(struct zinf_stream *s, void *dst, enum zinf_dtype dtype, float value,
			      size_t n);
/**
 * Blockwise symmetric quantization (ZeRO++'s wire format): n elements of x (dtype) cut into
 * blocks of `block` elements from x[0]; per block scales[b] = max|x| / Q in fp32 (Q = 127 for
 * bits 8, 7 for bits 4), codes = x / scale rounded to nearest even, clamped to [-Q, Q]: one int8
 * per element (bits 8) or two per byte (bits 4: element 2i in the low nibble of byte i; block
 * even). codes holds n (bits 4: (n + 1) / 2) bytes, scales ceil(n / block) floats. Dequantized,
 * |x - code * scale| <= scale / 2 + 2^-22 max|x|: max|x| / 254 (8 bits), / 14 (4 bits). A block
 * whose max is below 2^-126 (zero or subnormal) gets scale 0; one holding a NaN or an infinity
 * gets scale NaN (it dequantizes to NaN: the overflow check sees it). err (optional, n floats
 * of device memory): error feedback: x + err[i] is quantized (one fp32 addition) and err[i]
 * becomes err_beta x (x + err[i] - dequantized) (0 in a NaN block). "host" runs the C
 * reference, "cuda" kernels/quant.cu: the same codes, scales and err bit for bit.
 * Returns 0; -EINVAL (NULL array with n > 0, bits not 8 or 4, block 0 or odd with bits 4).
 */
ZINF_API int zinf_device_quantize(struct zinf_stream *s, void *codes, float *scales, const void *x,
				  enum zinf_dtype dtype, size_t n, size_t block, unsigned bits,
				  float *err, float err_beta);
/**
 * y = codes x scales (the format of zinf_device_quantize), one fp32 product per element, stored
 * as dtype (16-bit: to nearest even); with accumulate, y is f32 and y[i] += the product (one fp32
 * addition). Returns 0; -EINVAL as zinf_device_quantize, or accumulate with dtype not f32.
 */
ZINF_API int zinf_device_dequantize(struct zinf_stream *s, void *y, enum zinf_dtype dtype,
				    const void *codes, const float *scales, size_t n, size_t block,
				    unsigned bits, bool accumulate);
/**
 * zinf_adam_step() on device memory, the same arguments, the same formula and the same scalars
 * (computed in float64 when queued). "host" runs zinf_adam_step() itself (bit for bit the
 * cpu_adam path that o->simd, ZINF_SIMD or the CPU selects); "cuda" rounds as cpu_adam's vector
 * paths (avx2, avx512: the same fused multiply-adds, the multiply by 1 / sqrt(1 - beta2^step)),
 * so it equals them bit for bit (the scalar path, for CPUs without AVX2, differs by rounding).
 * Returns 0; -EINVAL as zinf_adam_step() (checked when queued).
 */
ZINF_API int zinf_device_adam(struct zinf_stream *s, const struct zinf_adam_opts *o, int64_t step,
			      float grad_scale, float *param, const void *grad,
			      enum zinf_dtype grad_dtype, float *exp_avg, float *exp_avg_sq,
			      size_t n, void *param_copy, enum zinf_dtype copy_dtype);

#ifdef __cplusplus
}
#endif
#endif
