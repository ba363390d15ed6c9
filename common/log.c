/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common/log.c: the level-filtered logger, the per-thread last error, status strings.
 * The sink and level are the one piece of process state zinf keeps (as SPDK's log does): a
 * trainer sets them once. It does not format for the sink unless a message will be kept.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "common/util.h"

static _Atomic(zinf_log_fn) log_fn;
static _Atomic(void *) log_ctx;
static atomic_int log_level = ZINF_LOG_WARN;
static _Thread_local char last_error[1024];

const char *
zinf_version(void)
{
	return ZINF_VERSION;
}

const char *
zinf_strerror(int status)
{
	if (status >= 0) {
		return "success";
	}
	const char *s = strerrordesc_np(-status);
	return s ? s : "unknown error";
}

void
zinf_log_set_callback(zinf_log_fn fn, void *ctx)
{
	atomic_store(&log_ctx, ctx);
	atomic_store(&log_fn, fn);
}

void
zinf_log_set_level(enum zinf_log_level level)
{
	atomic_store(&log_level, (int)level);
}

enum zinf_log_level
zinf_log_get_level(void)
{
	return (enum zinf_log_level)atomic_load(&log_level);
}

const char *
zinf_last_error(void)
{
	return last_error;
}

void
zinf_log_to_file(void *ctx, enum zinf_log_level level, const char *file, int line, const char *func,
		 const char *msg)
{
	static const char *const names[] = {"error", "warning", "info", "debug"};
	FILE *f = ctx ? ctx : stderr;
	if (level == ZINF_LOG_DEBUG) {
		fprintf(f, "zinf: %s: %s (%s:%d %s)\n", names[level], msg, file, line, func);
	} else {
		fprintf(f, "zinf: %s: %s\n", names[level], msg);
	}
}

int
zc_log_vemit(int ret, enum zinf_log_level level, const char *file, int line, const char *func,
	     const char *fmt, va_list ap)
{
	zinf_log_fn fn = atomic_load(&log_fn);
	bool to_sink = fn && (int)level <= atomic_load(&log_level);
	if (level != ZINF_LOG_ERROR && !to_sink) {
		return ret;
	}
	char buf[sizeof(last_error)];
	vsnprintf(buf, sizeof(buf), fmt, ap);
	if (level == ZINF_LOG_ERROR) {
		memcpy(last_error, buf, sizeof(buf));
	}
	if (to_sink) {
		fn(atomic_load(&log_ctx), level, file, line, func, buf);
	}
	return ret;
}

int
zc_log_emit(int ret, enum zinf_log_level level, const char *file, int line, const char *func,
	    const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	ret = zc_log_vemit(ret, level, file, line, func, fmt, ap);
	va_end(ap);
	return ret;
}
