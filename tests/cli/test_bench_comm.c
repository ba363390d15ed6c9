/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/cli/test_bench_comm.c: `zinf bench comm` and `zinf bench pcie` run as commands with
 * sizes of a few MiB. Variant "alone": one rank (single and, when built, mpi started alone):
 * the JSON's fields, ranks 1, bytes as asked, a one-rank reduction's ratio null; a bad --op
 * names the choices; bench pcie without a GPU exits 0 with "gpu": false. Variant "mpi": under
 * `mpirun -np 2` ($ZINF_MPIRUN): one JSON object (rank 0 only), ranks 2, busbw = algbw x the
 * factor nccl-tests defines, recomputed here; a bad --op reported once.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_run.h"
#include "common/test_util.h"

static const char *
str(json_t *j, const char *key)
{
	json_t *v = json_object_get(j, key);
	cr_assert(json_is_string(v), "%s is not a string", key);
	return json_string_value(v);
}

/* The fields every result has, busbw recomputed from algbw, and the ratio from the times. */
static void
check_result(json_t *j, const char *op, double bytes, int ranks, const char *backend)
{
	static const char *const keys[] = {
		"op",	      "bytes",	    "ranks",	      "backend",    "dtype",
		"algbw_GBps", "busbw_GBps", "raw_busbw_GBps", "ratio",	    "time_s",
		"raw_time_s", "raw_call",   "raw_bytes",      "bus_factor", "raw_algbw_GBps"};
	for (unsigned i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		cr_assert(json_object_get(j, keys[i]), "JSON lacks %s", keys[i]);
	}
	cr_assert_str_eq(str(j, "op"), op);
	cr_assert_str_eq(str(j, "backend"), backend);
	cr_assert_eq(zc_num(j, "bytes"), bytes);
	cr_assert_eq(zc_num(j, "ranks"), ranks);
	double n = ranks, f = strcmp(op, "all_reduce") == 0 ? 2 * (n - 1) / n : (n - 1) / n;
	cr_assert_eq(zc_num(j, "bus_factor"), f);
	double t = zc_num(j, "time_s"), algbw = zc_num(j, "algbw_GBps");
	cr_assert(t > 0);
	cr_assert_float_eq(algbw, bytes / t / 1e9, 1e-12 * algbw);
	cr_assert_float_eq(zc_num(j, "busbw_GBps"), algbw * f, 1e-12 * algbw);
	if (json_is_null(json_object_get(j, "raw_call"))) {
		cr_assert(json_is_null(json_object_get(j, "ratio")));
		return;
	}
	double rt = zc_num(j, "raw_time_s"), rb = zc_num(j, "raw_bytes");
	cr_assert(rt > 0);
	cr_assert_float_eq(zc_num(j, "raw_busbw_GBps"), rb / rt / 1e9 * f, 1e-12 * rb / rt / 1e9);
	cr_assert_float_eq(zc_num(j, "ratio"), rt / t, 1e-12 * rt / t);
}

Test(bench_comm, single_json)
{
	zc_need_variant("alone");
	struct zc_scratch r;
	char *argv[] = {"zinf", "bench",    "comm", "--backend", "single", "--op",
			"all",	"--size",   "3M",   "--size",	 "1M",	   "--iters",
			"3",	"--warmup", "1",    "--json",	 NULL};
	cr_assert_eq((zc_scratch_init(&r), zc_run(NULL, argv, r.out, r.err)), 0, "%s",
		     zc_text(r.err));
	json_t *j = zc_json(r.out);
	cr_assert_str_eq(str(j, "bench"), "comm");
	json_t *res = json_object_get(j, "results");
	cr_assert_eq(json_array_size(res), 10); /* 5 ops x 2 sizes, in that order */
	static const char *const ops[] = {"all_gather", "reduce_scatter", "all_reduce",
					  "qall_gather", "qreduce_scatter"};
	for (int i = 0; i < 10; i++) {
		json_t *e = json_array_get(res, i);
		check_result(e, ops[i / 2], i % 2 ? 1 << 20 : 3 << 20, 1, "single");
		cr_assert_str_eq(str(e, "dtype"), "f32");
		cr_assert_eq(zc_num(e, "iters"), 3);
	}
	/* one rank: an all_reduce is nothing to compare; an all_gather is a copy */
	cr_assert(json_is_null(json_object_get(json_array_get(res, 4), "raw_call")));
	cr_assert_str_eq(str(json_array_get(res, 0), "raw_call"), "memcpy");
	/* the quantized calls are timed against zinf's unquantized ones */
	cr_assert_str_eq(str(json_array_get(res, 6), "raw_call"), "zinf all_gather");
	cr_assert_str_eq(str(json_array_get(res, 8), "raw_call"), "zinf reduce_scatter");
	json_decref(j);
	zc_scratch_fini(&r);
}

Test(bench_comm, mpi_alone_one_rank)
{
	zc_need_variant("alone");
	if (!getenv("ZINF_MPIRUN") || !*getenv("ZINF_MPIRUN")) {
		cr_skip_test("MPI not built");
	}
	struct zc_scratch r;
	char *argv[] = {"zinf", "bench",      "comm",	 "--backend", "mpi",
			"--op", "all_gather", "--dtype", "bf16",      "--size",
			"2M",	"--iters",    "2",	 "--json",    NULL};
	cr_assert_eq((zc_scratch_init(&r), zc_run(NULL, argv, r.out, r.err)), 0, "%s",
		     zc_text(r.err));
	json_t *j = zc_json(r.out);
	check_result(j, "all_gather", 2 << 20, 1, "mpi");
	cr_assert_str_eq(str(j, "dtype"), "bf16");
	cr_assert_str_eq(str(j, "raw_call"), "MPI_Allgather");
	cr_assert_str_eq(str(j, "raw_dtype"), "bf16"); /* the same bytes, as MPI_UINT16_T */
	json_decref(j);
	zc_scratch_fini(&r);
}

Test(bench_comm, bad_op_names_choices)
{
	zc_need_variant("alone");
	struct zc_scratch r;
	char *argv[] = {"zinf", "bench", "comm", "--op", "allgather", NULL};
	cr_assert_eq((zc_scratch_init(&r), zc_run(NULL, argv, r.out, r.err)), 2);
	char *e = zc_text(r.err);
	cr_assert(strstr(e, "--op allgather: expected all_gather, reduce_scatter, all_reduce, "
			    "qall_gather, qreduce_scatter or all"),
		  "%s", e);
	free(e);
	zc_scratch_fini(&r);
}

Test(bench_comm, size_too_small)
{
	zc_need_variant("alone");
	struct zc_scratch r;
	char *argv[] = {"zinf", "bench", "comm", "--backend", "single", "--size", "2", NULL};
	cr_assert_eq((zc_scratch_init(&r), zc_run(NULL, argv, r.out, r.err)), 1);
	char *e = zc_text(r.err);
	cr_assert(strstr(e, "--size 2: less than 4 bytes (1 ranks x 4)"), "%s", e);
	free(e);
	zc_scratch_fini(&r);
}

Test(bench_pcie, no_gpu_exits_zero)
{
	zc_need_variant("alone");
	struct zc_scratch r;
	char *argv[] = {"zinf", "bench", "pcie", "--size", "1M", "--iters", "2", "--json", NULL};
	cr_assert_eq((zc_scratch_init(&r), zc_run(NULL, argv, r.out, r.err)), 0, "%s",
		     zc_text(r.err));
	json_t *j = zc_json(r.out);
	cr_assert_str_eq(str(j, "bench"), "pcie");
	if (json_is_true(json_object_get(j, "gpu"))) {
		/* a GPU: six cases, each with both bandwidths and their ratio */
		json_t *res = json_object_get(j, "results");
		cr_assert_eq(json_array_size(res), 6);
		for (int i = 0; i < 6; i++) {
			json_t *e = json_array_get(res, i);
			cr_assert_float_eq(zc_num(e, "ratio"),
					   zc_num(e, "raw_time_s") / zc_num(e, "time_s"), 1e-9);
		}
	} else {
		cr_assert(json_is_false(json_object_get(j, "gpu")));
		cr_assert(strlen(str(j, "reason")) > 0);
		char *e = zc_text(r.err);
		cr_assert_str_eq(e, ""); /* the one line is the JSON: nothing on stderr */
		free(e);
	}
	json_decref(j);
	zc_scratch_fini(&r);
}

Test(bench_comm, mpirun_two_ranks)
{
	zc_need_variant("mpi");
	struct zc_scratch r;
	const char *args[] = {"bench",	 "comm", "--op",     "all", "--size", "2M",
			      "--iters", "3",	 "--warmup", "1",   "--json", NULL};
	zc_scratch_init(&r);
	int st = zc_mpirun(2, args, r.out, r.err);
	cr_assert_eq(st, 0, "%s", zc_text(r.err));
	char *out = zc_text(r.out);
	cr_assert_eq(zc_count_substr(out, "\"bench\": \"comm\", \"results\""), 1,
		     "one object, from rank 0 only: %s", out);
	free(out);
	json_t *j = zc_json(r.out);
	json_t *res = json_object_get(j, "results");
	cr_assert_eq(json_array_size(res), 5);
	static const char *const ops[] = {"all_gather", "reduce_scatter", "all_reduce",
					  "qall_gather", "qreduce_scatter"};
	for (int i = 0; i < 5; i++) {
		json_t *e = json_array_get(res, i);
		check_result(e, ops[i], 2 << 20, 2, "mpi");
		cr_assert_str_eq(str(e, "raw_dtype"), "f32");
		cr_assert_eq(zc_num(e, "raw_bytes"), 2 << 20);
	}
	/* bytes one rank sends, worked by hand: 2 MiB of f32 over 2 ranks is 262144 elements per
	   rank; unquantized it sends the other rank 1 MiB; 8-bit codes are 262144 bytes plus a
	   float per 256 elements (4096 bytes); qgZ with both ranks in one group (one node) sends
	   the one chunk in its single all_to_all */
	for (int i = 3; i < 5; i++) {
		json_t *e = json_array_get(res, i);
		cr_assert_eq(zc_num(e, "wire_bytes"), 262144 + 4096, "%s", ops[i]);
		cr_assert_eq(zc_num(e, "raw_wire_bytes"), 1 << 20, "%s", ops[i]);
	}
	json_decref(j);
	zc_scratch_fini(&r);
}

Test(bench_comm, mpirun_bf16_reduction)
{
	zc_need_variant("mpi");
	struct zc_scratch r;
	const char *args[] = {"bench",	 "comm", "--op",   "reduce_scatter",
			      "--dtype", "bf16", "--size", "1000006",
			      "--iters", "2",	 "--json", NULL};
	zc_scratch_init(&r);
	cr_assert_eq(zc_mpirun(2, args, r.out, r.err), 0, "%s", zc_text(r.err));
	json_t *j = zc_json(r.out);
	/* rounded down to whole elements per rank: 2 ranks x 2 bytes */
	check_result(j, "reduce_scatter", 1000004, 2, "mpi");
	cr_assert_eq(zc_num(j, "count"), 250001);
	/* MPI has no bf16 reduction: the reference is the fp32 call zinf makes after widening */
	cr_assert_str_eq(str(j, "raw_dtype"), "f32");
	cr_assert_eq(zc_num(j, "raw_bytes"), 2 * 1000004);
	json_decref(j);
	zc_scratch_fini(&r);
}

Test(bench_comm, mpirun_bad_op_once)
{
	zc_need_variant("mpi");
	struct zc_scratch r;
	const char *args[] = {"bench", "comm", "--op", "gather", NULL};
	zc_scratch_init(&r);
	cr_assert_neq(zc_mpirun(2, args, r.out, r.err), 0);
	char *e = zc_text(r.err);
	cr_assert_eq(zc_count_substr(e, "--op gather: expected all_gather, reduce_scatter, "
					"all_reduce, qall_gather, qreduce_scatter or all"),
		     1, "%s", e);
	free(e);
	zc_scratch_fini(&r);
}

/*
 * bf16 qreduce_scatter on MPI: the unquantized reference zinf runs widens to fp32, so its bytes
 * on the wire are 4 per element, not 2. 2 ranks x 262144 elements per rank (1 MiB of bf16):
 * the raw call sends the other rank its 262144 fp32 (1 MiB); the 8-bit codes 262144 bytes and a
 * float per 256 elements. Worked by hand.
 */
Test(bench_comm, mpirun_bf16_qreduce_scatter_wire_bytes_count_the_fp32_widening)
{
	zc_need_variant("mpi");
	struct zc_scratch r;
	const char *args[] = {"bench",	 "comm", "--op",   "qreduce_scatter",
			      "--dtype", "bf16", "--size", "1M",
			      "--iters", "2",	 "--json", NULL};
	zc_scratch_init(&r);
	cr_assert_eq(zc_mpirun(2, args, r.out, r.err), 0, "%s", zc_text(r.err));
	json_t *j = zc_json(r.out);
	cr_assert_eq(zc_num(j, "count"), 262144);
	cr_assert_eq(zc_num(j, "wire_bytes"), 262144 + 4096);
	cr_assert_eq(zc_num(j, "raw_wire_bytes"), 262144 * 4);
	json_decref(j);
	zc_scratch_fini(&r);
}
