/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common/log.c: the level-filtered logger, the per-thread last error, status strings.
 * The sink and level are process state (as SPDK's log's): a trainer sets them once; the level
 * defaults to $ZINF_LOG_LEVEL, read at the first message. It does not format for the sink unless a
 * message will be kept.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/util.h"

static _Atomic(zinf_log_fn) log_fn;
static _Atomic(void *) log_ctx;
/* -1 until set: then $ZINF_LOG_LEVEL decides, once (level_init) */
static atomic_int log_level = -1;
static pthread_once_t level_once = PTHREAD_ONCE_INIT;
static char level_bad[64]; /* $ZINF_LOG_LEVEL when it could not be read, reported once */
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

int
zinf_log_level_parse(const char *s, enum zinf_log_level *out)
{
	static const char *const names[] = {"error", "warn", "info", "debug"};
	for (int i = 0; s && i < 4; i++) {
		char num[2] = {(char)('0' + i), '\0'};
		if (strcasecmp(s, names[i]) == 0 || strcmp(s, num) == 0 ||
		    (i == ZINF_LOG_WARN && strcasecmp(s, "warning") == 0)) {
			*out = (enum zinf_log_level)i;
			return 0;
		}
	}
	return -EINVAL;
}

/* The default level from the environment, unless a level was set first. getenv runs once,
 * before any thread of zinf's could be calling setenv for it. */
static void
level_init(void)
{
	enum zinf_log_level lvl = ZINF_LOG_WARN;
	const char *s = getenv("ZINF_LOG_LEVEL");
	if (s && s[0] && zinf_log_level_parse(s, &lvl) < 0) {
		snprintf(level_bad, sizeof(level_bad), "%s", s);
	}
	int unset = -1;
	atomic_compare_exchange_strong(&log_level, &unset, (int)lvl);
}

static int
level_now(void)
{
	int l = atomic_load(&log_level);
	if (l < 0) {
		pthread_once(&level_once, level_init);
		l = atomic_load(&log_level);
	}
	return l;
}

void
zinf_log_set_level(enum zinf_log_level level)
{
	atomic_store(&log_level, (int)level);
}

enum zinf_log_level
zinf_log_get_level(void)
{
	return (enum zinf_log_level)level_now();
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
	bool to_sink = fn && (int)level <= level_now();
	static atomic_bool bad_told;
	if (fn && level_bad[0] && !atomic_exchange(&bad_told, true)) {
		char m[160];
		snprintf(m, sizeof(m),
			 "ZINF_LOG_LEVEL=%s: expected error, warn, info or debug (or 0-3): level "
			 "warn",
			 level_bad);
		fn(atomic_load(&log_ctx), ZINF_LOG_WARN, __FILE__, __LINE__, __func__, m);
	}
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
