/* SPDX-License-Identifier: Apache-2.0 */
/*
 * offload/offload_internal.h: what the pool, the store and the step share and do not export:
 * the logging macros that name their object (SPDK's URING_ERRLOG(uring, ...) shape), and the
 * pool's configuration name for the store's messages. Not installed.
 *
 * Each macro takes the object first and prefixes its name: the pool's (or the pool options')
 * `what` ("pinned pool (offload_optimizer): ..."), the store's and the step's `name` field,
 * built once at creation ("store (offload_param)", "optimizer step (rank 3, 10 sub-groups)").
 */
#ifndef ZINF_OFFLOAD_INTERNAL_H
#define ZINF_OFFLOAD_INTERNAL_H

#include "common/util.h"
#include "zinf/blocks/offload.h"

#define POOL_FAIL(p, err, fmt, ...)                                                                \
	ZINF_FAIL((err), "pinned pool (%s): " fmt, (p)->what, ##__VA_ARGS__)
#define POOL_LOG(p, level, fmt, ...)                                                               \
	ZINF_LOG((level), "pinned pool (%s): " fmt, (p)->what, ##__VA_ARGS__)
#define POOL_ERR(p, fmt, ...)	POOL_LOG(p, ZINF_LOG_ERROR, fmt, ##__VA_ARGS__)
#define POOL_WARN(p, fmt, ...)	POOL_LOG(p, ZINF_LOG_WARN, fmt, ##__VA_ARGS__)
#define POOL_INFO(p, fmt, ...)	POOL_LOG(p, ZINF_LOG_INFO, fmt, ##__VA_ARGS__)
#define POOL_DEBUG(p, fmt, ...) POOL_LOG(p, ZINF_LOG_DEBUG, fmt, ##__VA_ARGS__)

#define STORE_FAIL(s, err, fmt, ...) ZINF_FAIL((err), "%s: " fmt, (s)->name, ##__VA_ARGS__)
#define STORE_ERR(s, fmt, ...)	     ZINF_ERR("%s: " fmt, (s)->name, ##__VA_ARGS__)

#define STEP_FAIL(st, err, fmt, ...) ZINF_FAIL((err), "%s: " fmt, (st)->name, ##__VA_ARGS__)
#define STEP_ERR(st, fmt, ...)	     ZINF_ERR("%s: " fmt, (st)->name, ##__VA_ARGS__)

/* A NULL handle: -EINVAL naming the function (the object has no name to give). */
#define OFFLOAD_NULL(what) ZINF_FAIL(-EINVAL, "%s: NULL %s", __func__, (what))

/* The configuration name the pool serves ("offload_optimizer"), for the store's name. */
const char *offload_pool_what(const struct zinf_pool *p);

#endif
