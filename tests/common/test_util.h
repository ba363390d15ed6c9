/* SPDX-License-Identifier: Apache-2.0 */
/* tests/common/test_util.h: seeds, random data, scratch directories, the test variant (and the
 * SIMD path it names). */
#ifndef ZINF_TEST_UTIL_H
#define ZINF_TEST_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct zinf_io;
struct zinf_io_opts;

/*
 * The run's seed: $ZINF_TEST_SEED if set, else derived from the clock. Printed once to
 * stderr ("seed=N") so that a failing run can be repeated.
 */
uint64_t zt_seed(void);
/* xorshift64*: the next value of *state (never 0). */
uint64_t zt_rand(uint64_t *state);
/* A uniform double in [lo, hi). */
double zt_uniform(uint64_t *state, double lo, double hi);
void zt_rand_fill(void *p, size_t n, uint64_t *state);
/*
 * A fresh directory under $ZINF_TEST_SCRATCH (or `base` if not NULL), malloc'ed path; the
 * caller frees it and removes the tree with zt_rmtree().
 */
char *zt_mkdtemp(const char *base);
void zt_rmtree(const char *path);
/* A Criterion suite whose every test gets a fresh temporary directory in `dir` (made before it,
 * removed after it). Use at file scope, in place of TestSuite(name). */
#define ZT_TMPDIR_SUITE(name)                                                                      \
	static char *dir;                                                                          \
	static void zt_tmpdir_setup_##name(void)                                                   \
	{                                                                                          \
		dir = zt_mkdtemp(NULL);                                                            \
	}                                                                                          \
	static void zt_tmpdir_teardown_##name(void)                                                \
	{                                                                                          \
		zt_rmtree(dir);                                                                    \
		free(dir);                                                                         \
	}                                                                                          \
	TestSuite(name, .init = zt_tmpdir_setup_##name, .fini = zt_tmpdir_teardown_##name)
/*
 * Whether the safetensors checkpoints a and b (files, indexes or directories) hold the same
 * tensors: names, stored dtypes, shapes and bytes. 0, or -1 with what differs in why (the first
 * element that differs shown as f32).
 */
int zt_safetensors_diff(const char *a, const char *b, char *why, size_t len);
/* Replace the tree `to` by a copy of `from` (cp -a: modes and times kept). 0, or nonzero. */
int zt_copytree(const char *from, const char *to);
/* $ZINF_TEST_VARIANT, or NULL when the test runs without one. */
const char *zt_variant(void);
/*
 * Stop being privileged for memory locking, as a user without CAP_IPC_LOCK: drop the capability
 * (capset(2); the calling thread and the threads it creates later) and set RLIMIT_MEMLOCK to
 * `memlock` bytes. For Criterion's forked test processes. 0, or a negative errno.
 */
int zt_drop_ipc_lock(uint64_t memlock);
/*
 * The SIMD path the test variant names (NULL without a variant: the default path), for the
 * `simd` field of the optimizer and gradient-helper options. Skips the calling test visibly
 * (cr_skip_test) when this CPU or build cannot run the path; fails it for an unknown name.
 */
const char *zt_simd_variant(void);
/*
 * Whether a test may skip because the I/O backend `backend` (as in zinf_io_opts.backend) is
 * absent: io_uring and libaio may be (not built, or refused by the kernel); psync, the default
 * choice (NULL, which ends at psync) and fault over either of those are always there.
 */
bool zt_io_may_be_absent(const char *backend);
/*
 * zinf_io_create(o): the context, or the test ends. It skips (cr_skip_test, naming the library's
 * reason) only on -ENODEV for a backend that zt_io_may_be_absent() (for "fault": its inner one);
 * any other failure, and every failure of psync, fault over psync or the default choice, fails it.
 */
struct zinf_io *zt_io_open(const struct zinf_io_opts *o);
/* Send zinf's log (all levels up to WARN) to stderr, once per process. */
void zt_log_to_stderr(void);
/*
 * Make `dir` read-only for this process and its children: a mount namespace of its own
 * (unshare(2)), `dir` bind-mounted on itself and remounted read-only, as a read-only file
 * system is. For Criterion's forked test processes (the namespace ends with the process). 0, or
 * a negative errno (no CAP_SYS_ADMIN, as in many containers: the caller skips).
 */
int zt_readonly_bind(const char *dir);
/* Undo zt_readonly_bind (before removing the directory). */
void zt_readonly_unbind(const char *dir);

#endif
