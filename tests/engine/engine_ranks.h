/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/engine_ranks.h: what the engine's multi-rank programs share
 * (tests/engine/test_engine_ranks.c, tests/ckpt/test_ckpt_ranks.c): this rank, the world and
 * the rank's NVMe directory; the log, kept so that a case can look for what a worker thread
 * said; the test model (engine_ref.h) made through engine_drive.h, its master weights compared
 * with the single-process reference; the "fault" I/O backend armed; and the runner
 * (ranks_main): every case, or the one named, on every rank in the same order, each case's
 * failures summed over the ranks. Plain programs under mpirun: Criterion forks every test,
 * which MPI does not survive. The including file defines nothing before it.
 */
#ifndef ZINF_TESTS_ENGINE_RANKS_H
#define ZINF_TESTS_ENGINE_RANKS_H

#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "engine/engine_drive.h"
#include "engine/engine_ref.h"
#include "engine/rank_check.h"
#include "zinf/device.h"
#include "zinf/engine.h"
#include "zinf/blocks/io.h"

static int rank, world;
static char *scratch; /* this rank's NVMe directory */

/* ---- the log, kept so that a case can look for what a worker thread said ------------------- */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_text[1 << 16];
static size_t log_len;

static inline void
log_keep(void *ctx, enum zinf_log_level level, const char *file, int line, const char *func,
	 const char *msg)
{
	(void)ctx;
	(void)file;
	(void)line;
	(void)func;
	pthread_mutex_lock(&log_lock);
	fprintf(stderr, "rank %d: zinf: %s: %s\n", rank, level == ZINF_LOG_ERROR ? "error" : "warn",
		msg);
	int n = snprintf(log_text + log_len, sizeof(log_text) - log_len, "%s\n", msg);
	if (n > 0) {
		log_len += (size_t)n;
		if (log_len >= sizeof(log_text)) {
			log_len = 0; /* wrap: only the latest messages matter */
		}
	}
	pthread_mutex_unlock(&log_lock);
}

/* ---- the test model ------------------------------------------------------------------------ */

static inline struct zinf_engine *
make_model(struct zinf_engine_opts *o, int *fails_out)
{
	struct zinf_engine *e = NULL;
	int fails = 0;
	int rc = zinf_engine_create(o, &e);
	CHECK(rc == 0, "zinf_engine_create: %d %s", rc, zinf_last_error());
	if (rc == 0) {
		rc = edrive_add_params(e);
		CHECK(rc == 0, "add_params: %d %s", rc, zinf_last_error());
	}
	if (rc == 0) {
		rc = zinf_engine_init(e);
		CHECK(rc == 0, "zinf_engine_init: %d %s", rc, zinf_last_error());
	}
	if (rc < 0) {
		zinf_engine_destroy(e);
		e = NULL;
	}
	*fails_out += fails;
	return e;
}

struct master {
	float *p[EREF_NPARAMS];
};

static inline int
master_alloc(struct master *m)
{
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		m->p[id] = calloc(eref_numel(id), sizeof(float));
		if (!m->p[id]) {
			return -ENOMEM;
		}
	}
	return 0;
}

static inline void
master_free(struct master *m)
{
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		free(m->p[id]);
		m->p[id] = NULL;
	}
}

/* Failures of |a - b| > tol (tol 0: bit for bit), the largest difference in *maxdiff. */
static inline int
compare(const char *what, float *const a[EREF_NPARAMS], float *const b[EREF_NPARAMS], double tol,
	double *maxdiff)
{
	int fails = 0;
	double md = 0;
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		for (uint64_t i = 0; i < eref_numel(id); i++) {
			double d = fabs((double)a[id][i] - b[id][i]);
			md = fmax(md, d);
			bool ok = tol == 0 ? memcmp(&a[id][i], &b[id][i], 4) == 0 : d <= tol;
			if (!ok && fails < 5) {
				CHECK(ok,
				      "%s: %s[%llu] = %.9g, reference %.9g (diff %.3g, tol %.3g)",
				      what, eref_params[id].name, (unsigned long long)i, a[id][i],
				      b[id][i], d, tol);
			} else if (!ok) {
				fails++;
			}
		}
	}
	if (maxdiff) {
		*maxdiff = md;
	}
	return fails;
}

static inline int
reference(struct eref_result *ref, enum zinf_dtype dtype, float quantum, int steps, uint32_t gas)
{
	struct eref_opts ro = {
		.world = world, .steps = steps, .gas = gas, .dtype = dtype, .quantum = quantum};
	edrive_optimizer(&ro.opt);
	int rc = eref_train(&ro, ref);
	if (rc < 0) {
		fprintf(stderr, "rank %d: eref_train: %d %s\n", rank, rc, zinf_last_error());
	}
	return rc;
}

struct config {
	int stage;
	enum zinf_offload_device opt, param;
	bool sdb;
};

static const char *const tier_names[] = {"none", "cpu", "nvme"};

/* Arm the "fault" I/O backend: `op` fails with EIO from its nth occurrence on (1000 times). */
static inline int
arm_eio(struct zinf_io *io, enum zinf_io_op op, int nth)
{
	struct zinf_io_fault f = {.kind = ZINF_IO_FAULT_FAIL,
				  .op = op,
				  .nth = (uint32_t)nth,
				  .count = 1000,
				  .err = EIO};
	return zinf_io_fault_add(io, &f);
}

/* ---- the runner ---------------------------------------------------------------------------- */

/* A case: its name, its function (failures, or SKIP), and whether it runs only when named. */
struct ranks_case {
	const char *name;
	int (*fn)(void);
	bool named_only; /* run only when named on the command line */
};

/*
 * Whether the command line names a case of `cases` (or none: every case); if not, rank 0 says
 * so on stderr and lists the known names. A misspelt or renamed case is the caller's mistake,
 * never a case that skipped: ctest would show it as skipped, and a failure it should catch
 * would pass unseen.
 */
static inline bool
ranks_args_ok(int argc, char **argv, const char *what, const struct ranks_case *cases, size_t n)
{
	if (argc > 2) {
		if (rank == 0) {
			fprintf(stderr, "%s: too many arguments (usage: %s [CASE])\n", what,
				argv[0]);
		}
		return false;
	}
	if (argc < 2) {
		return true;
	}
	for (size_t i = 0; i < n; i++) {
		if (strcmp(argv[1], cases[i].name) == 0) {
			return true;
		}
	}
	if (rank == 0) {
		fprintf(stderr, "%s: no case named \"%s\"; the cases are:", what, argv[1]);
		for (size_t i = 0; i < n; i++) {
			fprintf(stderr, " %s", cases[i].name);
		}
		fprintf(stderr, "\n");
	}
	return false;
}

/*
 * The program's main: MPI (SERIALIZED), the command line checked (an unknown case is an error,
 * exit 1), the log kept, the device of ZINF_TEST_DEVICE checked (77, a visible skip, without
 * one), a scratch directory per rank, then every case (or the one named by argv[1]) in order;
 * rank 0 prints each case's result and "WHAT, N ranks: P passed, F failed, S skipped". Exit
 * status 1 when a case failed, 77 when every case that ran skipped (itself, by returning SKIP).
 */
static inline int
ranks_main(int argc, char **argv, const char *what, const struct ranks_case *cases, size_t n)
{
	int provided, passed = 0, failed = 0, skipped = 0, ran = 0;
	const char *only = argc > 1 ? argv[1] : NULL;

	MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &world);
	if (!ranks_args_ok(argc, argv, what, cases, n)) {
		MPI_Finalize();
		return 1;
	}
	zinf_log_set_callback(log_keep, NULL);
	if (strcmp(edrive_device(), "host") != 0) {
		/* ZINF_TEST_DEVICE=cuda (label gpu): the same cases on the GPU with nccl, or a
		   visible skip without one */
		struct zinf_device_opts dopts;
		struct zinf_device *dev = NULL;
		zinf_device_opts_init(&dopts);
		dopts.backend = edrive_device();
		if (zinf_device_create(&dopts, &dev) != 0) {
			if (rank == 0) {
				printf("%s on %s: no device (%s): skipped\n", what, edrive_device(),
				       zinf_last_error());
			}
			MPI_Finalize();
			return 77;
		}
		zinf_device_destroy(dev);
	}
	scratch = zt_mkdtemp(NULL);
	if (!scratch) {
		fprintf(stderr, "rank %d: no scratch directory\n", rank);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	for (size_t i = 0; i < n; i++) {
		if ((only && strcmp(only, cases[i].name) != 0) || (!only && cases[i].named_only)) {
			continue;
		}
		double t0 = zinf_now_s();
		int f = cases[i].fn();
		int mine = f == SKIP ? 0 : f, all = 0;
		MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
		if (rank == 0) {
			printf("%-22s %s (%d ranks, %.1f s)\n", cases[i].name,
			       f == SKIP ? "skipped"
			       : all	 ? "FAILED"
					 : "ok",
			       world, zinf_now_s() - t0);
			fflush(stdout);
		}
		skipped += f == SKIP;
		ran += f != SKIP;
		passed += f != SKIP && all == 0;
		failed += f != SKIP && all != 0;
	}
	if (rank == 0) {
		printf("%s, %d ranks: %d passed, %d failed, %d skipped\n", what, world, passed,
		       failed, skipped);
		fflush(stdout);
	}
	zt_rmtree(scratch);
	free(scratch);
	zinf_log_set_callback(NULL, NULL);
	MPI_Finalize();
	/* a named case is known (ranks_args_ok), so nothing ran only when every case skipped */
	return failed ? 1 : ran ? 0 : skipped ? 77 : 1;
}

#endif
