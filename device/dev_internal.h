/* SPDX-License-Identifier: Apache-2.0 */
/*
 * device/dev_internal.h: the device ops table and the objects behind the public handles
 * (private to device/; nothing above includes it). device.c checks every argument and turns
 * each kernel call into one `struct zinf_kop`; a backend only runs what it is given.
 */
#ifndef ZINF_DEVICE_DEV_INTERNAL_H
#define ZINF_DEVICE_DEV_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>

#include "kernels/kernels.h"
#include "zinf/device.h"
#include "zinf_config.h"

struct zinf_device {
	const struct zinf_dev_ops *ops;
	struct zinf_device_opts o;  /* o.backend not kept (points at the caller's string) */
	char name[32];		    /* "cuda:0", "host:0": for messages */
	void *priv;		    /* the backend's */
	atomic_int streams, events; /* alive, for the check at destroy */
	atomic_int refs;	    /* the caller's (until destroy), one per stream and event */
};

struct zinf_stream {
	struct zinf_device *dev;
	char name[48];
	bool wrapped; /* native belongs to the trainer */
	void *native; /* cudaStream_t */
	void *priv;   /* the backend's */
};

struct zinf_event {
	struct zinf_device *dev;
	void *priv;
};

/* One kernel call, checked by device.c. */
enum zinf_kop_kind {
	ZINF_KOP_CAST,
	ZINF_KOP_SCALE,
	ZINF_KOP_ACCUMULATE,
	ZINF_KOP_SUMSQ,
	ZINF_KOP_NONFINITE,
	ZINF_KOP_FILL,
	ZINF_KOP_ADAM,
	ZINF_KOP_QUANTIZE,
	ZINF_KOP_DEQUANTIZE,
};

struct zinf_kop {
	enum zinf_kop_kind kind;
	size_t n;
	void *dst;		    /* cast, scale (in place), accumulate (float), fill */
	const void *src;	    /* cast, accumulate, sumsq, nonfinite */
	enum zinf_dtype dst_dtype;  /* cast, scale, fill */
	enum zinf_dtype src_dtype;  /* cast, accumulate, sumsq, nonfinite */
	float value;		    /* scale, fill */
	double *out;		    /* sumsq */
	uint32_t *flag;		    /* nonfinite */
	struct zinf_adam_opts adam; /* adam: the caller's options and arguments */
	int64_t step;
	float grad_scale;
	float *param, *m, *v;
	const void *grad;
	void *copy;
	enum zinf_dtype grad_dtype, copy_dtype;
	struct zinf_k_adam adam_k; /* the step's scalars, computed once in float64 */
	void *codes;		   /* quantize: written; dequantize: read (common/quant.h) */
	float *scales;		   /* quantize: written; dequantize: read */
	float *err;		   /* quantize: error feedback, or NULL (value: its beta) */
	size_t block;		   /* quantize, dequantize: elements per scale */
	unsigned bits;		   /* 8 or 4 */
	bool acc;		   /* dequantize: dst (f32) += instead of = */
};

struct zinf_dev_ops {
	const char *name;
	/* Devices present (>= 1), or a negative errno (-ENODEV: none, not built, driver failed). */
	int (*probe)(void);
	int (*open)(struct zinf_device *d); /* sets d->priv; index checked against probe */
	void (*close)(struct zinf_device *d);
	int (*host_register)(struct zinf_device *d, void *p, size_t len);
	void (*host_unregister)(struct zinf_device *d, void *p);
	int (*alloc)(struct zinf_device *d, size_t len, void **out);
	void (*free)(struct zinf_device *d, void *p);
	/* s->dev, name, wrapped, native set; sets s->priv (and s->native when it creates one) */
	int (*stream_open)(struct zinf_stream *s);
	void (*stream_close)(struct zinf_stream *s); /* after stream_sync */
	int (*stream_sync)(struct zinf_stream *s);
	int (*event_open)(struct zinf_event *e);
	void (*event_close)(struct zinf_event *e);
	int (*event_record)(struct zinf_event *e, struct zinf_stream *s);
	int (*stream_wait)(struct zinf_stream *s, struct zinf_event *e);
	int (*event_query)(struct zinf_event *e); /* 1 done, 0 not yet, -errno */
	int (*event_sync)(struct zinf_event *e);
	int (*copy)(struct zinf_stream *s, void *dst, const void *src, size_t len,
		    enum zinf_copy_dir dir);
	int (*kernel)(struct zinf_stream *s, const struct zinf_kop *k);
};

extern const struct zinf_dev_ops zinf_dev_host_ops;
extern const struct zinf_dev_ops zinf_dev_cuda_ops; /* an -ENODEV stub when not built */

/*
 * The table named `name` ("cuda", "host"), or with NULL the best that probes at least one
 * device. Returns 0 and sets *out; -EINVAL unknown name; -ENODEV the named table was not built
 * or finds no device (message says which).
 */
int dev_get(const char *name, const struct zinf_dev_ops **out);

/*
 * Test hook (host backend only; never exported): while `closed`, stream s starts no further
 * work (what it is running finishes), so a test can make one stream "slow" deterministically.
 * Returns 0; -ENOTSUP on another backend; -EINVAL for a NULL stream.
 */
int dev_test_gate(struct zinf_stream *s, bool closed);
/*
 * Test hook (host backend only): every copy and kernel stream s runs starts `usec`
 * microseconds late (0: off), so that a reader that does not wait for the stream sees the
 * buffer before the work landed, every time rather than by chance. Returns 0; -EINVAL (NULL
 * stream, another backend); -ENOTSUP (a host_sync device: its work runs when queued).
 */
int dev_test_lag(struct zinf_stream *s, unsigned usec);
/*
 * Test hook (host backend only): the next operation stream s runs fails with `err` (< 0)
 * instead of running, as a kernel failing at run time would (events still complete).
 * Returns 0; -EINVAL (NULL stream, another backend, err >= 0).
 */
int dev_test_fail_next(struct zinf_stream *s, int err);

#endif
