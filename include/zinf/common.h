/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zinf/common.h: status codes, logging, aligned allocation, CPU features, topology, timers.
 * The trainer's API (zinf/zinf.h includes it).
 *
 * Every zinf function returns 0 (or a count) on success and a negative errno on failure. The
 * message that explains a failure goes to the log callback and is also kept, per thread, for
 * zinf_last_error(). The library never prints: with no callback installed, messages are only
 * kept for zinf_last_error().
 */
#ifndef ZINF_COMMON_H
#define ZINF_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZINF_API __attribute__((visibility("default")))

/** Version string of the library, "MAJOR.MINOR.PATCH". */
ZINF_API const char *zinf_version(void);

/** Text for a zinf status (a negative errno); never NULL. */
ZINF_API const char *zinf_strerror(int status);

/* ---- element types ------------------------------------------------------------------------ */

/** Element types of tensors, gradients and optimizer state. */
enum zinf_dtype { ZINF_F32 = 0, ZINF_F16 = 1, ZINF_BF16 = 2 };

/** Bytes per element of `dtype` (4 or 2); 0 for a value that is not a zinf_dtype. */
ZINF_API size_t zinf_dtype_size(enum zinf_dtype dtype);
/** "f32", "f16" or "bf16"; "?" for a value that is not a zinf_dtype. */
ZINF_API const char *zinf_dtype_name(enum zinf_dtype dtype);
/**
 * Parse a dtype name: "f32", "fp32", "float32", "float"; "f16", "fp16", "float16", "half";
 * "bf16", "bfloat16" (any case). Returns 0 and sets *out, or -EINVAL (nothing logged: the
 * caller names the option that held the text).
 */
ZINF_API int zinf_dtype_parse(const char *name, enum zinf_dtype *out);
/**
 * dst[i] = src[i] converted, for n elements: to f16 and bf16 by round to nearest even (NaN
 * stays NaN, infinities and subnormals exact where representable, f16 overflow to infinity);
 * widening is exact. src and dst may be the same array only when the types have the same size.
 * Returns 0; -EINVAL (NULL array with n > 0, unknown dtype) with a message.
 */
ZINF_API int zinf_dtype_convert(void *dst, enum zinf_dtype dst_dtype, const void *src,
				enum zinf_dtype src_dtype, size_t n);

/* ---- logging ------------------------------------------------------------------------------ */

enum zinf_log_level {
	ZINF_LOG_ERROR = 0,
	ZINF_LOG_WARN = 1,
	ZINF_LOG_INFO = 2,
	ZINF_LOG_DEBUG = 3,
};

/** A log sink. msg is a complete line without a trailing newline; valid during the call only. */
typedef void (*zinf_log_fn)(void *ctx, enum zinf_log_level level, const char *file, int line,
			    const char *func, const char *msg);

/**
 * Install the process's log sink (NULL: none) and the most verbose level passed to it
 * (messages above it are dropped). The level's default is $ZINF_LOG_LEVEL (read once, at the
 * first message or zinf_log_get_level(); see zinf_log_level_parse()), else ZINF_LOG_WARN; a
 * value it cannot read leaves ZINF_LOG_WARN and is reported once, as a warning to the sink.
 * zinf_log_set_level() overrides the environment. The callback may be called from any zinf
 * thread, concurrently; it must be thread-safe.
 */
ZINF_API void zinf_log_set_callback(zinf_log_fn fn, void *ctx);
ZINF_API void zinf_log_set_level(enum zinf_log_level level);
ZINF_API enum zinf_log_level zinf_log_get_level(void);
/**
 * A level as $ZINF_LOG_LEVEL spells it: error, warn (or warning), info, debug (any case), or
 * 0-3. Returns 0 and sets *out; -EINVAL for anything else (NULL included).
 */
ZINF_API int zinf_log_level_parse(const char *s, enum zinf_log_level *out);

/** A ready-made sink that writes "zinf: <level>: <msg>\n" to the FILE * passed as ctx. */
ZINF_API void zinf_log_to_file(void *ctx, enum zinf_log_level level, const char *file, int line,
			       const char *func, const char *msg);

/**
 * The last error message logged by the calling thread ("" if none). Valid until the thread's
 * next zinf call.
 */
ZINF_API const char *zinf_last_error(void);

/* ---- aligned memory ----------------------------------------------------------------------- */

/**
 * Allocate len bytes aligned to align (a power of two, at least sizeof(void *)); free with
 * zinf_free_aligned(). Returns NULL when out of memory or on a bad alignment.
 */
ZINF_API void *zinf_alloc_aligned(size_t align, size_t len);
ZINF_API void zinf_free_aligned(void *p); /* NULL is a no-op */

/**
 * Allocate len bytes for I/O or pinned buffers: anonymous memory aligned to 2 MiB and advised to
 * use transparent huge pages (MADV_HUGEPAGE) before it is touched. With huge pages a 1 MiB
 * block is one DMA segment instead of 256, which doubled read and write bandwidth on the
 * virtual disk measured in bench/RESULTS.md; where THP is off it is ordinary page-aligned
 * memory. Zero-filled. Returns NULL on failure (len 0 included). Free with zinf_free_huge().
 */
ZINF_API void *zinf_alloc_huge(size_t len);
/** Free memory from zinf_alloc_huge(); len as allocated. NULL is a no-op. */
ZINF_API void zinf_free_huge(void *p, size_t len);

/* ---- CPU features ------------------------------------------------------------------------- */

struct zinf_cpu_features {
	bool sse42; /* crc32 instruction */
	bool avx2;
	bool fma;
	bool f16c;
	bool avx512f; /* with the OS saving the zmm state */
	bool avx512bw;
	bool avx512vl;
	bool avx512bf16; /* vcvtne2ps2bf16 */
};

/** Fill *out with what this CPU and OS can run. */
ZINF_API void zinf_cpu_features_get(struct zinf_cpu_features *out);

/* ---- topology ----------------------------------------------------------------------------- */

struct zinf_topo; /* opaque: an hwloc topology, or a sysconf fallback */

/**
 * Probe the machine. Returns 0 and sets *out; -ENOMEM. Without hwloc the probe reports one
 * NUMA node and sysconf's processor count. Free with zinf_topo_destroy().
 */
ZINF_API int zinf_topo_create(struct zinf_topo **out);
ZINF_API void zinf_topo_destroy(struct zinf_topo *t); /* NULL is a no-op */
ZINF_API int zinf_topo_numa_nodes(const struct zinf_topo *t);
ZINF_API int zinf_topo_cores(const struct zinf_topo *t); /* physical cores */
ZINF_API int zinf_topo_pus(const struct zinf_topo *t);	 /* hardware threads */
/** Physical memory of the machine, bytes. */
ZINF_API uint64_t zinf_topo_memory(const struct zinf_topo *t);
/**
 * Bind the pages of [p, p + len) to NUMA node `node` (0-based, as numbered by
 * zinf_topo_numa_nodes). Returns 0; -EINVAL node out of range; -ENODEV built without hwloc;
 * -errno from the kernel.
 */
ZINF_API int zinf_topo_bind_area(struct zinf_topo *t, void *p, size_t len, int node);

/* ---- time --------------------------------------------------------------------------------- */

/** Monotonic clock, nanoseconds. */
ZINF_API uint64_t zinf_now_ns(void);
/** Monotonic clock, seconds. */
ZINF_API double zinf_now_s(void);

#ifdef __cplusplus
}
#endif
#endif
