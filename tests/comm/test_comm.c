/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/comm/test_comm.c: the collectives of one process: the single backend's contract, the
 * partition helper worked by hand, options (versioning, bad values, unknown backends) and the
 * argument checks every backend shares. Several ranks: test_comm_ranks.c under mpirun.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/test_util.h"
#include "comm/comm_internal.h"
#include "zinf/blocks/comm.h"
#include "zinf/engine.h"

static struct zinf_comm *
open_single(bool check)
{
	struct zinf_comm_opts o;
	struct zinf_comm *c = NULL;
	zinf_comm_opts_init(&o);
	o.backend = "single";
	o.check = check;
	cr_assert_eq(zinf_comm_create(&o, &c), 0, "%s", zinf_last_error());
	return c;
}

Test(comm, partition_worked_by_hand)
{
	struct zinf_comm_part p;
	/* 10 elements over 4 ranks: partitions of 3, padded to 12; rank 3 holds 1 element */
	cr_assert_eq(zinf_comm_partition(10, 4, 3, &p), 0);
	cr_assert_eq(p.part, 3);
	cr_assert_eq(p.padded, 12);
	cr_assert_eq(p.offset, 9);
	cr_assert_eq(p.count, 1);
	cr_assert_eq(zinf_comm_partition(10, 4, 1, &p), 0);
	cr_assert(p.offset == 3 && p.count == 3);
	/* 2 elements over 4 ranks: ranks 2 and 3 hold only padding */
	cr_assert_eq(zinf_comm_partition(2, 4, 2, &p), 0);
	cr_assert(p.part == 1 && p.padded == 4 && p.offset == 2 && p.count == 0);
	cr_assert_eq(zinf_comm_partition(8, 4, 3, &p), 0);
	cr_assert(p.part == 2 && p.padded == 8 && p.count == 2);
	cr_assert_eq(zinf_comm_partition(0, 3, 0, &p), 0);
	cr_assert(p.part == 0 && p.padded == 0 && p.count == 0);
	cr_assert_eq(zinf_comm_partition(10, 4, 4, &p), -EINVAL);
	cr_assert_eq(zinf_comm_partition(10, 0, 0, &p), -EINVAL);
	cr_assert_eq(zinf_comm_partition(10, 2, 0, NULL), -EINVAL);
	cr_assert_eq(zinf_comm_partition(SIZE_MAX, 2, 0, &p), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "wraps") != NULL, "%s", zinf_last_error());
}

Test(comm, single_contract)
{
	struct zinf_comm *c = open_single(true);
	cr_assert_str_eq(zinf_comm_backend(c), "single");
	cr_assert(zinf_comm_rank(c) == 0 && zinf_comm_world(c) == 1 &&
		  zinf_comm_local_rank(c) == 0);
	cr_assert_eq(zinf_comm_get_opts(c)->timeout_s, 1800.0);
	cr_assert_null(zinf_comm_native(c), "single has no backend communicator");
	cr_assert_null(zinf_comm_native(NULL));

	float part[5] = {1, 2, 3, 4, 5}, full[5] = {0};
	cr_assert_eq(zinf_comm_all_gather(c, part, full, 5, ZINF_F32, NULL), 0);
	cr_assert_arr_eq(full, part, sizeof(part));
	/* in place: the partition is the whole buffer */
	cr_assert_eq(zinf_comm_all_gather(c, full, full, 5, ZINF_F32, NULL), 0);
	cr_assert_arr_eq(full, part, sizeof(part));

	uint16_t h[3] = {dt_f32_to_bf16_rne(1.5f), dt_f32_to_bf16_rne(-3.0f),
			 dt_f32_to_bf16_rne(0.1f)},
		 out[3] = {0};
	struct zinf_comm_req *r = NULL;
	cr_assert_eq(zinf_comm_reduce_scatter(c, h, out, 3, ZINF_BF16, ZINF_COMM_AVG, &r), 0);
	cr_assert_eq(zinf_comm_test(c, r), 1);
	cr_assert_arr_eq(out, h, sizeof(h), "one rank's average is its value, bit for bit");

	float v[2] = {2.5f, -1.0f};
	cr_assert_eq(zinf_comm_all_reduce(c, v, 2, ZINF_F32, ZINF_COMM_MAX, NULL), 0);
	cr_assert(v[0] == 2.5f && v[1] == -1.0f);
	cr_assert_eq(zinf_comm_broadcast(c, v, 2, ZINF_F32, 0, &r), 0);
	cr_assert_eq(zinf_comm_wait(c, r), 0);
	cr_assert_eq(zinf_comm_broadcast(c, v, 2, ZINF_F32, 1, NULL), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "root 1 outside the world of 1") != NULL, "%s",
		  zinf_last_error());
	cr_assert_eq(zinf_comm_barrier(c, NULL), 0);

	struct zinf_comm_stats st = {.size = sizeof(st)};
	cr_assert_eq(zinf_comm_get_stats(c, &st), 0);
	cr_assert_eq(st.size, sizeof(st));
	cr_assert_eq(st.calls, 6, "refused calls are not counted: %llu",
		     (unsigned long long)st.calls);
	cr_assert_eq(st.bytes, 20 + 20 + 6 + 8 + 8 + 0);
	cr_assert_eq(st.timeouts, 0);
	cr_assert_null(zinf_comm_native(c));
	zinf_comm_destroy(c);
}

/* The check compares (seq, op, count, dtype): its exchange copies the call over one rank. */
Test(comm, single_check_and_stats_versions)
{
	struct zinf_comm *c = open_single(true);
	float v = 1.0f;
	cr_assert_eq(zinf_comm_all_reduce(c, &v, 1, ZINF_F32, ZINF_COMM_SUM, NULL), 0);
	cr_assert_eq(c->descs[0].seq, 1);
	cr_assert_eq(c->descs[0].kind, ZINF_COMM_ALL_REDUCE);
	cr_assert_eq(c->descs[0].count, 1);
	/* an older caller's stats struct, without check_ns and timeouts */
	struct zinf_comm_stats st;
	memset(&st, 0xab, sizeof(st));
	st.size = offsetof(struct zinf_comm_stats, check_ns);
	cr_assert_eq(zinf_comm_get_stats(c, &st), 0);
	cr_assert_eq(st.calls, 1);
	cr_assert_eq(st.timeouts, 0xababababababababull, "past the caller's size: untouched");
	st.size = 2;
	cr_assert_eq(zinf_comm_get_stats(c, &st), -EINVAL);
	cr_assert_eq(zinf_comm_get_stats(NULL, &st), -EINVAL);
	zinf_comm_destroy(c);
}

Test(comm, options)
{
	struct zinf_comm_opts o;
	struct zinf_comm *c = NULL;

	zinf_comm_opts_init(&o);
	cr_assert(o.size == sizeof(o) && o.timeout_s == 1800.0 && o.device == -1 && !o.check);
	o.backend = "gloo";
	cr_assert_eq(zinf_comm_create(&o, &c), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "\"gloo\" unknown") != NULL, "%s", zinf_last_error());
	o.backend = "single";
	o.timeout_s = 0;
	cr_assert_eq(zinf_comm_create(&o, &c), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "comm_timeout_s") != NULL, "%s", zinf_last_error());
	o.timeout_s = 5;
	o.size = sizeof(o) + 8; /* a newer caller */
	cr_assert_eq(zinf_comm_create(&o, &c), -EINVAL);
	cr_assert_null(c);
	/* an older caller that knew only size and backend: timeout keeps its default */
	o.size = offsetof(struct zinf_comm_opts, timeout_s);
	cr_assert_eq(zinf_comm_create(&o, &c), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_comm_get_opts(c)->timeout_s, 1800.0);
	zinf_comm_destroy(c);
	zinf_comm_destroy(NULL);
	cr_assert_eq(zinf_comm_create(&o, NULL), -EINVAL);
}

/* Unset launcher variables: a process started alone is one rank of the single backend. */
Test(comm, alone_is_single)
{
	static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK",
					   "PMIX_RANK"};
	struct zinf_comm *c = NULL;
	for (unsigned i = 0; i < 4; i++) {
		unsetenv(vars[i]);
	}
	cr_assert_eq(zinf_comm_create(NULL, &c), 0, "%s", zinf_last_error());
	cr_assert_str_eq(zinf_comm_backend(c), "single");
	cr_assert_eq(zinf_comm_world(c), 1);
	zinf_comm_destroy(c);
}

Test(comm, argument_checks)
{
	struct zinf_comm *c = open_single(false);
	float a[8] = {0}, b[8] = {0};
	cr_assert_eq(zinf_comm_all_gather(NULL, a, b, 1, ZINF_F32, NULL), -EINVAL);
	cr_assert_eq(zinf_comm_all_gather(c, NULL, b, 1, ZINF_F32, NULL), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "all_gather of 1 f32: a buffer is NULL") != NULL, "%s",
		  zinf_last_error());
	cr_assert_eq(zinf_comm_all_gather(c, a, b, 1, (enum zinf_dtype)7, NULL), -EINVAL);
	cr_assert_eq(zinf_comm_all_reduce(c, a, 1, ZINF_F32, (enum zinf_comm_red)9, NULL), -EINVAL);
	/* -1 means "no reduction" inside the library only: a reducing call refuses it */
	cr_assert_eq(zinf_comm_all_reduce(c, a, 1, ZINF_F32, (enum zinf_comm_red) - 1, NULL),
		     -EINVAL);
	cr_assert(strstr(zinf_last_error(), "all_reduce: reduction -1 unknown") != NULL, "%s",
		  zinf_last_error());
	cr_assert_eq(zinf_comm_reduce_scatter(c, a, b, 1, ZINF_F32, (enum zinf_comm_red) - 1, NULL),
		     -EINVAL);
	cr_assert(strstr(zinf_last_error(), "reduce_scatter: reduction -1 unknown") != NULL, "%s",
		  zinf_last_error());
	cr_assert_eq(zinf_comm_all_reduce(c, a, SIZE_MAX / 2, ZINF_F32, ZINF_COMM_SUM, NULL),
		     -EINVAL);
	cr_assert(strstr(zinf_last_error(), "wraps") != NULL, "%s", zinf_last_error());
	/* reduce-scatter's input and output may not overlap */
	cr_assert_eq(zinf_comm_reduce_scatter(c, a, a + 2, 4, ZINF_F32, ZINF_COMM_SUM, NULL),
		     -EINVAL);
	cr_assert_eq(zinf_comm_all_gather(c, a, a + 1, 4, ZINF_F32, NULL), -EINVAL);
	cr_assert_eq(zinf_comm_wait(c, NULL), -EINVAL);
	cr_assert_eq(zinf_comm_test(NULL, NULL), -EINVAL);
	/* count 0 with NULL buffers is a valid (empty) collective */
	cr_assert_eq(zinf_comm_all_gather(c, NULL, NULL, 0, ZINF_F32, NULL), 0);
	cr_assert_eq(zinf_comm_failed(c), 0, "refused calls do not fail the communicator");
	struct zinf_comm_stats st = {.size = sizeof(st)};
	zinf_comm_get_stats(c, &st);
	cr_assert_eq(st.calls, 1);
	zinf_comm_destroy(c);
}

/* A backend that was not built answers -ENODEV; one that was built but cannot run (nccl with
 * no device, mpi ...) is covered by test_comm_ranks. */
Test(comm, backends_listed)
{
	cr_assert_not_null(comm_ops_find("mpi"));
	cr_assert_not_null(comm_ops_find("nccl"));
	cr_assert_not_null(comm_ops_find("single"));
	cr_assert_null(comm_ops_find("gloo"));
#if !ZINF_HAVE_MPI
	struct zinf_comm_opts o;
	struct zinf_comm *c = NULL;
	zinf_comm_opts_init(&o);
	o.backend = "mpi";
	cr_assert_eq(zinf_comm_create(&o, &c), -ENODEV);
	cr_assert(strstr(zinf_last_error(), "not built") != NULL, "%s", zinf_last_error());
#endif
}

/* Out of memory: at create (nothing to free after), and for a request, which fails c: the
 * other ranks would go on with a call this rank could not post. */
Test(comm, out_of_memory)
{
	struct zinf_comm_opts o;
	struct zinf_comm *c = NULL;
	zinf_comm_opts_init(&o);
	o.backend = "single";
	zc_test_alloc_fail_nth(2); /* the communicator, then its descriptors */
	cr_assert_eq(zinf_comm_create(&o, &c), -ENOMEM);
	cr_assert_null(c);
	zc_test_alloc_fail_nth(0);
	c = open_single(false);
	float v = 1.0f;
	zc_test_alloc_fail_nth(1);
	cr_assert_eq(zinf_comm_all_reduce(c, &v, 1, ZINF_F32, ZINF_COMM_SUM, NULL), -ENOMEM);
	zc_test_alloc_fail_nth(0);
	cr_assert(strstr(zinf_last_error(), "seq 1 all_reduce 1 f32 sum: out of memory") != NULL,
		  "%s", zinf_last_error());
	cr_assert_eq(zinf_comm_failed(c), -ENOMEM);
	cr_assert_eq(zinf_comm_barrier(c, NULL), -ENOMEM);
	cr_assert(strstr(zinf_last_error(), "failed earlier") != NULL, "%s", zinf_last_error());
	zinf_comm_destroy(c);
}

/*
 * A backend whose collectives never complete until abandoned, and then report complete (as an
 * NCCL event may once ncclCommAbort ended its kernels), counting the polls that follow an
 * abandon: after one call timed out and failed the communicator, waiting on a second call must
 * give it up without asking the backend (nccl's poll would query the aborted, freed
 * communicator) and must not report it complete.
 */
static bool stuck_abandoned;
static int stuck_polls_after_abandon;

static int
stuck_start(struct zinf_comm *c, struct zinf_comm_req *r)
{
	return 0;
}

static int
stuck_poll(struct zinf_comm *c, struct zinf_comm_req *r)
{
	if (stuck_abandoned) {
		stuck_polls_after_abandon++;
		return 1;
	}
	return 0;
}

static void
stuck_abandon(struct zinf_comm *c, struct zinf_comm_req *r)
{
	stuck_abandoned = true;
}

Test(comm, a_failed_communicator_polls_nothing_after_abandoning)
{
	struct zinf_comm_opts o;
	struct zinf_comm *c = NULL;
	zinf_comm_opts_init(&o);
	o.backend = "single";
	o.timeout_s = 0.05;
	cr_assert_eq(zinf_comm_create(&o, &c), 0, "%s", zinf_last_error());
	struct zinf_comm_ops stuck = *c->ops;
	stuck.start = stuck_start;
	stuck.poll = stuck_poll;
	stuck.abandon = stuck_abandon;
	c->ops = &stuck;
	float a = 1.0f, b = 2.0f;
	struct zinf_comm_req *ra = NULL, *rb = NULL;
	cr_assert_eq(zinf_comm_all_reduce(c, &a, 1, ZINF_F32, ZINF_COMM_SUM, &ra), 0);
	cr_assert_eq(zinf_comm_all_reduce(c, &b, 1, ZINF_F32, ZINF_COMM_SUM, &rb), 0);
	cr_assert_eq(zinf_comm_wait(c, ra), -ETIMEDOUT);
	cr_assert(strstr(zinf_last_error(), "seq 1 all_reduce 1 f32 sum") != NULL, "%s",
		  zinf_last_error());
	cr_assert(stuck_abandoned);
	cr_assert_eq(zinf_comm_wait(c, rb), -ETIMEDOUT, "the second call is given up, not done");
	cr_assert(strstr(zinf_last_error(), "seq 2 all_reduce") != NULL, "%s", zinf_last_error());
	cr_assert(strstr(zinf_last_error(), "failed earlier") != NULL, "%s", zinf_last_error());
	cr_assert_eq(stuck_polls_after_abandon, 0, "the backend was polled after the abandon");
	zinf_comm_destroy(c);
}

/*
 * A call check that times out leaves its exchange posted (MPI cannot cancel it): both the
 * buffer it receives into and the one it sends from stay with the backend after
 * zinf_comm_destroy, which must not free either (the send buffer was a field of the
 * communicator itself).
 */
static const struct zinf_comm_desc *late_mine;

static int
late_exchange(struct zinf_comm *c, const struct zinf_comm_desc *mine, struct zinf_comm_desc *all,
	      uint64_t deadline_ns)
{
	late_mine = mine;
	return -ETIMEDOUT;
}

Test(comm, a_timed_out_check_keeps_both_of_its_buffers)
{
	struct zinf_comm *c = open_single(true);
	struct zinf_comm_ops late = *c->ops;
	late.exchange = late_exchange;
	c->ops = &late;
	float v = 1.0f;
	cr_assert_eq(zinf_comm_all_reduce(c, &v, 1, ZINF_F32, ZINF_COMM_SUM, NULL), -ETIMEDOUT);
	cr_assert(strstr(zinf_last_error(), "seq 1 all_reduce 1 f32 sum (4 bytes): the call check "
					    "timed out"),
		  "%s", zinf_last_error());
	cr_assert_not_null(late_mine);
	struct zinf_comm_desc *descs = c->descs;
	cr_assert((const char *)late_mine < (const char *)c ||
			  (const char *)late_mine >= (const char *)(c + 1),
		  "the check sends from inside the communicator, which destroy frees");
	zinf_comm_destroy(c);
	/* still the backend's (under ASan a freed buffer fails here) */
	cr_assert_eq(late_mine->seq, 1);
	cr_assert_eq(late_mine->kind, ZINF_COMM_ALL_REDUCE);
	zc_free(descs); /* the test plays MPI finishing with them */
}

/* The NCCL version rule (comm_nccl.c refuses at communicator creation): the library's major
   release must be the headers', its minor at least theirs; a patch level is not compared (an
   H200 machine's libnccl 2.28.3 under 2.28.9 headers runs every nccl test). Codes as
   NCCL_VERSION_CODE: X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z after. */
Test(comm, nccl_version_rule)
{
	char why[256] = "";
	cr_assert_eq(comm_nccl_version_ok(22809, 22809, why, sizeof(why)), 0);
	cr_assert_eq(comm_nccl_version_ok(22803, 22809, why, sizeof(why)), 0);
	cr_assert_eq(comm_nccl_version_ok(22901, 22809, why, sizeof(why)), 0);
	cr_assert_eq(comm_nccl_version_ok(22705, 22809, why, sizeof(why)), -ENOTSUP);
	cr_assert(strstr(why, "2.27.5") && strstr(why, "older than the 2.28.9 headers"), "%s", why);
	cr_assert_eq(comm_nccl_version_ok(2804, 22809, why, sizeof(why)), -ENOTSUP);
	cr_assert(strstr(why, "2.8.4"), "the old encoding decoded: %s", why);
	cr_assert_eq(comm_nccl_version_ok(30001, 22809, why, sizeof(why)), -ENOTSUP);
	cr_assert(strstr(why, "3.0.1") && strstr(why, "another major release"), "%s", why);
}

/*
 * The collectives' deadline from the environment (a job-wide setting that needs no flag in
 * every trainer): $ZINF_COMM_TIMEOUT_S is the default of both option structs; a value that is
 * not seconds in (0, 1e9) is refused at create, naming the variable; an explicit option wins.
 */
Test(comm, timeout_from_the_environment)
{
	struct zinf_comm_opts o;
	struct zinf_engine_opts eo;
	setenv("ZINF_COMM_TIMEOUT_S", "42.5", 1);
	zinf_comm_opts_init(&o);
	zinf_engine_opts_init(&eo);
	cr_assert_eq(o.timeout_s, 42.5);
	cr_assert_eq(eo.comm_timeout_s, 42.5);
	o.backend = "single";
	struct zinf_comm *c = NULL;
	cr_assert_eq(zinf_comm_create(&o, &c), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_comm_get_opts(c)->timeout_s, 42.5);
	zinf_comm_destroy(c);

	static const char *const bad[] = {"0", "-5", "ten", "1e12", "30s"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv("ZINF_COMM_TIMEOUT_S", bad[i], 1);
		zinf_comm_opts_init(&o);
		o.backend = "single";
		c = NULL;
		cr_assert_eq(zinf_comm_create(&o, &c), -EINVAL, "ZINF_COMM_TIMEOUT_S=%s", bad[i]);
		cr_assert(strstr(zinf_last_error(), "ZINF_COMM_TIMEOUT_S") &&
				  strstr(zinf_last_error(), bad[i]),
			  "%s", zinf_last_error());
		zinf_engine_opts_init(&eo);
		eo.device_backend = "host";
		eo.comm_backend = "single";
		struct zinf_engine *e = NULL;
		cr_assert_eq(zinf_engine_create(&eo, &e), -EINVAL, "engine, %s", bad[i]);
		cr_assert(strstr(zinf_last_error(), "ZINF_COMM_TIMEOUT_S"), "%s",
			  zinf_last_error());
		o.timeout_s = 5; /* an explicit deadline wins */
		cr_assert_eq(zinf_comm_create(&o, &c), 0, "%s", zinf_last_error());
		zinf_comm_destroy(c);
	}
	unsetenv("ZINF_COMM_TIMEOUT_S");
	zinf_comm_opts_init(&o);
	cr_assert_eq(o.timeout_s, 1800.0);
}
