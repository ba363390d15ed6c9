/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/cli/test_estimate.c: `zinf estimate` against figures computed by hand from the formulas
 * its help states (ZeRO paper for the GPU: 2 + 2 + 12 bytes per parameter partitioned by the
 * stage, + 4 x the largest layer at stage 3; DeepSpeed's CPU bytes 16 (optimizer), 18 (+
 * parameters), 4 (optimizer on NVMe) per parameter per node x 1.5; NVMe 12 and 2), for a 70B
 * model on 8 GPUs of 80e9 bytes with 1e12 bytes of CPU, a 1.3B model on one 24e9 GPU, and a
 * 10B model on 2 nodes of 4 GPUs; the largest model of a choice; the recommendation; the
 * step-time bound; errors.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "cli_run.h"

static struct zc_scratch sc;

static void
setup(void)
{
	zc_scratch_init(&sc);
}

static void
teardown(void)
{
	zc_scratch_fini(&sc);
}

TestSuite(estimate, .init = setup, .fini = teardown);

/* The row of (stage, param, optim). */
static json_t *
row(json_t *o, int stage, const char *param, const char *optim)
{
	size_t i;
	json_t *r;
	json_array_foreach(json_object_get(o, "rows"), i, r)
	{
		if (json_integer_value(json_object_get(r, "stage")) == stage &&
		    strcmp(json_string_value(json_object_get(r, "offload_param")), param) == 0 &&
		    strcmp(json_string_value(json_object_get(r, "offload_optimizer")), optim) ==
			    0) {
			return r;
		}
	}
	cr_assert_fail("no row stage %d param %s optim %s", stage, param, optim);
	return NULL;
}

static void
expect(json_t *r, double gpu, double cpu, double nvme, bool fits)
{
	cr_expect_eq(zc_num(r, "gpu_bytes"), gpu, "gpu %.0f, expected %.0f", zc_num(r, "gpu_bytes"),
		     gpu);
	cr_expect_eq(zc_num(r, "cpu_bytes_per_node"), cpu, "cpu %.0f, expected %.0f",
		     zc_num(r, "cpu_bytes_per_node"), cpu);
	cr_expect_eq(zc_num(r, "nvme_bytes_per_node"), nvme, "nvme %.0f, expected %.0f",
		     zc_num(r, "nvme_bytes_per_node"), nvme);
	cr_expect_eq(json_is_true(json_object_get(r, "fits")), fits);
}

Test(estimate, llama70b_on_8_gpus)
{
	cr_assert_eq(zc_run_sh(&sc, "", "",
			       "estimate --params 70e9 --hidden 8192 --gpus-per-node 8 --nodes 1 "
			       "--gpu-mem 80e9 --cpu-mem 1e12 --nvme 1e13 --json"),
		     0);
	json_t *o = zc_json(sc.out);
	cr_assert_eq(zc_num(o, "params"), 70e9);
	cr_assert_eq(zc_num(o, "gpus_per_node"), 8);
	cr_assert_eq(zc_num(o, "nodes"), 1);
	/* L = 12 x 8192^2 = 805306368; 4L = 3221225472. */
	cr_assert_eq(zc_num(o, "largest_layer_params"), 805306368.0);
	/* stage 0: 16 x 70e9. */
	expect(row(o, 0, "none", "none"), 1120e9, 0, 0, false);
	/* stage 1: 2P + 2P + 12P / 8 = 280e9 + 105e9. */
	expect(row(o, 1, "none", "none"), 385e9, 0, 0, false);
	/* stage 2: 2P + 14P / 8 = 140e9 + 122.5e9. */
	expect(row(o, 2, "none", "none"), 262.5e9, 0, 0, false);
	/* stage 3: 4L + 16P / 8. */
	expect(row(o, 3, "none", "none"), 3221225472.0 + 140e9, 0, 0, false);
	/* stage 3, optimizer on CPU: 4L + 2P / 8 on the GPU, 16P x 1.5 on the CPU (1.68e12). */
	expect(row(o, 3, "none", "cpu"), 3221225472.0 + 17.5e9, 1680e9, 0, false);
	/* + parameters on CPU: 4L; 18P x 1.5 = 1.89e12. */
	expect(row(o, 3, "cpu", "cpu"), 3221225472.0, 1890e9, 0, false);
	/* optimizer on NVMe: 4P x 1.5 = 420e9 CPU, 12P = 840e9 NVMe: fits. */
	expect(row(o, 3, "none", "nvme"), 3221225472.0 + 17.5e9, 420e9, 840e9, true);
	/* both on NVMe: + 2P on NVMe, and each GPU's parameter cache on the CPU (max_in_cpu, the
	   engine's default 1e9 elements of its 8.75e9: 2e9 bytes x 8 GPUs). */
	expect(row(o, 3, "nvme", "nvme"), 3221225472.0, 436e9, 980e9, true);
	/* Largest model of stage 0: 80e9 / 16 = 5e9. Of stage 3 with the optimizer on NVMe: the
	   CPU binds, 1e12 / 6 = 166666666666.67. */
	cr_expect_eq(zc_num(row(o, 0, "none", "none"), "largest_params"), 5e9);
	cr_expect_eq(zc_num(row(o, 3, "none", "nvme"), "largest_params"), 166666666666.0);
	/* Without bandwidths the least offload that fits: stage 3, optimizer on NVMe. */
	json_t *z = json_object_get(json_object_get(o, "recommended"), "zero_optimization");
	cr_assert_not_null(z);
	cr_expect_eq(json_integer_value(json_object_get(z, "stage")), 3);
	cr_expect_str_eq(json_string_value(json_object_get(json_object_get(z, "offload_optimizer"),
							   "device")),
			 "nvme");
	cr_expect_null(json_object_get(z, "offload_param"));
	json_decref(o);
}

Test(estimate, one_gpu_layers_and_step_time)
{
	/* L = P / 24; stage 2 with the optimizer on the CPU: 2P + 2P on the GPU, 16P x 1.5. */
	cr_assert_eq(
		zc_run_sh(&sc, "", "",
			  "estimate --params 1.2e9 --layers 24 --gpus-per-node 1 --gpu-mem 24e9 "
			  "--cpu-mem 64e9 --nvme 1e12 --nvme-read-bw 2 --nvme-write-bw 1 "
			  "--pcie-bw 10 --adam-rate 1e9 --max-in-cpu 0 --json"),
		0);
	json_t *o = zc_json(sc.out);
	cr_assert_eq(zc_num(o, "largest_layer_params"), 50e6);
	expect(row(o, 0, "none", "none"), 19.2e9, 0, 0, true);
	expect(row(o, 2, "none", "cpu"), 4.8e9, 28.8e9, 0, true);
	/* stage 0's largest: 24e9 / 16 = 1.5e9. Stage 3 with both on NVMe: the GPU holds 4L = 4P /
	   24, the CPU 6P (64e9 / 6 = 10666666666.67), the NVMe 14P (1e12 / 14 = 71428571428.57):
	   GPU bound 24e9 x 6 = 144e9, so the CPU binds. */
	cr_expect_eq(zc_num(row(o, 0, "none", "none"), "largest_params"), 1.5e9);
	cr_expect_eq(zc_num(row(o, 3, "nvme", "nvme"), "largest_params"), 10666666666.0);
	/* Step bound of stage 3, both on NVMe, one micro-batch: NVMe reads 12P + 4P = 19.2e9 B at
	   2 GB/s = 9.6 s, writes 12P + 2P = 16.8e9 B at 1 GB/s = 16.8 s: 26.4 s; PCIe max(4P + 2P,
	   4P) / 10e9 = 0.72 s; Adam 1.2 s. The slowest: 26.4 s. */
	json_t *r = row(o, 3, "nvme", "nvme");
	cr_expect(fabs(zc_num(r, "nvme_s") - 26.4) < 1e-9, "nvme_s %g", zc_num(r, "nvme_s"));
	cr_expect(fabs(zc_num(r, "pcie_s") - 0.72) < 1e-12, "pcie_s %g", zc_num(r, "pcie_s"));
	cr_expect(fabs(zc_num(r, "adam_s") - 1.2) < 1e-12, "adam_s %g", zc_num(r, "adam_s"));
	cr_expect(fabs(zc_num(r, "step_s") - 26.4) < 1e-9, "step_s %g", zc_num(r, "step_s"));
	/* Stage 0 fits and moves nothing: it is the fastest. */
	cr_expect_eq(zc_num(row(o, 0, "none", "none"), "step_s"), 0);
	json_t *z = json_object_get(json_object_get(o, "recommended"), "zero_optimization");
	cr_expect_eq(json_integer_value(json_object_get(z, "stage")), 0);
	json_decref(o);
}

Test(estimate, two_nodes)
{
	/* N = 8, M = 2: stage 2, optimizer on the CPU: 2P + 2P / 8 per GPU; 16P / 2 x 1.5 per node;
	   on NVMe: 4P / 2 x 1.5 CPU and 12P / 2 NVMe per node. */
	cr_assert_eq(zc_run_sh(&sc, "", "",
			       "estimate --params 10e9 --gpus-per-node 4 --nodes 2 --gpu-mem 80e9 "
			       "--cpu-mem 512e9 --nvme 4e12 --json"),
		     0);
	json_t *o = zc_json(sc.out);
	cr_assert_eq(zc_num(o, "largest_layer_params"), 0);
	expect(row(o, 2, "none", "cpu"), 22.5e9, 120e9, 0, true);
	expect(row(o, 2, "none", "nvme"), 22.5e9, 30e9, 60e9, true);
	expect(row(o, 1, "none", "none"), 40e9 + 15e9, 0, 0, true);
	json_decref(o);
}

/*
 * --hf-config: Llama-2-7B's config.json gives 6738415616 parameters and a largest layer of one
 * decoder block (202383360, more than its 32000 x 4096 embedding), which the stage-3 GPU column
 * adds 4 x of; --params beside it is a usage error, as is a file of another model_type.
 */
Test(estimate, from_a_hugging_face_config)
{
	char path[4300];
	snprintf(path, sizeof(path), "%s/config.json", sc.dir);
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs("{\"model_type\": \"llama\", \"hidden_size\": 4096, \"intermediate_size\": 11008,\n"
	      " \"num_attention_heads\": 32, \"num_hidden_layers\": 32,\n"
	      " \"num_key_value_heads\": 32, \"vocab_size\": 32000}\n",
	      f);
	fclose(f);
	cr_assert_eq(
		zc_run_sh(&sc, "", "", "estimate --hf-config %s --gpus-per-node 8 --json", sc.dir),
		0, "%s", zc_text(sc.err));
	json_t *o = zc_json(sc.out);
	cr_assert_eq(zc_num(o, "params"), 6738415616.0);
	cr_assert_eq(zc_num(o, "largest_layer_params"), 202383360.0);
	/* stage 3, nothing offloaded: 16 bytes per parameter over 8 GPUs + 4 x the largest layer */
	cr_expect_eq(zc_num(row(o, 3, "none", "none"), "gpu_bytes"),
		     ceil(16.0 * 6738415616.0 / 8 + 4.0 * 202383360.0));
	json_decref(o);
	cr_assert_eq(zc_run_sh(&sc, "", "", "estimate --hf-config %s --params 1e9", path), 2);
	char *t = zc_text(sc.err);
	cr_expect(strstr(t, "--params and --hf-config: give one"), "%s", t);
	free(t);
	f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs("{\"model_type\": \"t5\"}\n", f);
	fclose(f);
	cr_assert_eq(zc_run_sh(&sc, "", "", "estimate --hf-config %s", path), 2);
	t = zc_text(sc.err);
	cr_expect(strstr(t, "model_type t5: zinf knows gpt2, llama, mistral and qwen2"), "%s", t);
	free(t);
}

Test(estimate, text_and_errors)
{
	cr_assert_eq(zc_run_sh(&sc, "", "",
			       "estimate --params 1e9 --gpu-mem 1e9 --cpu-mem 1e9 "
			       "--nvme 1e9"),
		     1, "nothing fits: exit 1, as config check's plan that does not fit");
	char *t = zc_text(sc.out);
	cr_expect(strstr(t, "nothing fits") != NULL, "%s", t);
	cr_expect(strstr(t, "note: no --layers, --hidden or --largest-layer") != NULL, "%s", t);
	free(t);
	cr_assert_eq(
		zc_run_sh(&sc, "", "",
			  "estimate --params 1e9 --gpu-mem 1e9 --cpu-mem 1e9 --nvme 1e9 --json"),
		1);
	t = zc_text(sc.out);
	cr_expect(strstr(t, "\"recommended\": null") && strstr(t, "\"largest_layer_known\": false"),
		  "%s", t);
	free(t);
	cr_assert_eq(zc_run_sh(&sc, "", "", "estimate --params 1e9 --layers 10"), 0);
	t = zc_text(sc.out);
	cr_expect(strstr(t, "note:") == NULL, "the largest layer is known: %s", t);
	free(t);
	cr_assert_eq(zc_run_sh(&sc, "", "", "estimate --gpus-per-node 8"), 2);
	t = zc_text(sc.err);
	cr_expect(strstr(t, "--params") != NULL, "%s", t);
	free(t);
	cr_assert_eq(zc_run_sh(&sc, "", "", "estimate --params 1e9 --nodes 0"), 2);
	t = zc_text(sc.err);
	cr_expect(strstr(t, "--nodes") != NULL, "%s", t);
	free(t);
}

/* bench all writes a profile; estimate --from-bench takes its bandwidths (flags win). */
Test(estimate, from_bench_profile)
{
	cr_assert_eq(
		zc_run_sh(&sc, "", "",
			  "bench all --path %s --io-size 16M --adam-params 1e6 --out %s/prof.json",
			  sc.dir, sc.dir),
		0);
	char prof[4300];
	snprintf(prof, sizeof(prof), "%s/prof.json", sc.dir);
	json_t *p = zc_json(prof);
	double rd = zc_num(p, "nvme_read_GBps"), wr = zc_num(p, "nvme_write_GBps");
	double adam = zc_num(p, "adam_params_per_s");
	cr_assert(rd > 0 && wr > 0 && adam > 0, "read %g write %g adam %g", rd, wr, adam);
	cr_expect(json_is_null(json_object_get(p, "net_busbw_GBps")), "one rank: no network");
	cr_expect_not_null(json_object_get(json_object_get(p, "io"), "backend"));
	json_decref(p);
	/* 1e9 parameters on one GPU, both on NVMe, adam from the profile, NVMe write from a flag:
	   reads 12P + 4P at rd, writes 14P at 3 GB/s. */
	cr_assert_eq(zc_run_sh(&sc, "", "",
			       "estimate --params 1e9 --gpu-mem 80e9 --cpu-mem 1e12 --nvme 1e13 "
			       "--from-bench %s --nvme-write-bw 3 --max-in-cpu 0 --json",
			       prof),
		     0);
	json_t *o = zc_json(sc.out);
	json_t *r = row(o, 3, "nvme", "nvme");
	double nvme_s = 16e9 / (rd * 1e9) + 14e9 / 3e9;
	cr_expect(fabs(zc_num(r, "nvme_s") - nvme_s) <= 1e-9 * nvme_s, "nvme_s %g, expected %g",
		  zc_num(r, "nvme_s"), nvme_s);
	cr_expect(fabs(zc_num(r, "adam_s") - 1e9 / adam) <= 1e-9 * (1e9 / adam), "adam_s %g",
		  zc_num(r, "adam_s"));
	json_decref(o);
	/* A file that is not a profile. */
	cr_assert_eq(zc_run_sh(&sc, "", "", "estimate --params 1e9 --from-bench %s/nothing.json",
			       sc.dir),
		     1);
	char *t = zc_text(sc.err);
	cr_expect(strstr(t, "nothing.json") != NULL, "%s", t);
	free(t);
}

/* Row r's NVMe bytes per parameter per step of `kind` ("total", "param", "optim", "grad"). */
static void
expect_bytes(json_t *r, const char *kind, double rd, double wr, const char *what)
{
	json_t *k = json_object_get(json_object_get(r, "nvme_bytes_per_param"), kind);
	cr_assert_not_null(k, "%s: no nvme_bytes_per_param.%s", what, kind);
	cr_expect(fabs(zc_num(k, "read") - rd) < 1e-9, "%s: %s read %.6f, expected %.6f", what,
		  kind, zc_num(k, "read"), rd);
	cr_expect(fabs(zc_num(k, "written") - wr) < 1e-9, "%s: %s written %.6f, expected %.6f",
		  what, kind, zc_num(k, "written"), wr);
}

/*
 * The NVMe bytes per parameter per step of each option (issue 23), 2e9 parameters on one GPU,
 * worked by hand from the formulas: the optimizer's state read and written once (12 bytes
 * each way with fp32 m and v, 8 with bf16, 4 + 2 x (1 + 4/256) = 6.03125 with 8-bit blocks of
 * 256 and a 4-byte scale); the parameters written once (2) and read twice per pass (4) less
 * the cache (max_in_cpu 1e9 of the 2e9: half, so 2); a micro-batch before the boundary spills
 * the fp32 gradients (4 each way per micro-batch after the first), the boundary's too without
 * the step during backward; a vertical pass reads the parameters once for every micro-batch and
 * spills nothing. The step bound follows: reads at 2 GB/s + writes at 1 GB/s.
 */
Test(estimate, nvme_bytes_per_param_by_option)
{
	static const struct {
		const char *flags;
		double param_rd, optim, grad, step_s;
		double optim_gpu_params; /* the optimizer's bytes with the parameters on the GPU */
	} cases[] = {
		{"--max-in-cpu 0", 4, 12, 0, (16 * 2e9) / 2e9 + (14 * 2e9) / 1e9, 12},
		{"", 2, 12, 0, (14 * 2e9) / 2e9 + (14 * 2e9) / 1e9, 12},
		{"--max-in-cpu 0 --micro-batches 4", 16, 12, 12,
		 (40 * 2e9) / 2e9 + (26 * 2e9) / 1e9, 12},
		{"--max-in-cpu 0 --micro-batches 4 --vertical", 4, 12, 0,
		 (16 * 2e9) / 2e9 + (14 * 2e9) / 1e9, 12},
		{"--max-in-cpu 0 --no-step-during-backward", 4, 12, 4,
		 (20 * 2e9) / 2e9 + (18 * 2e9) / 1e9, 12},
		{"--max-in-cpu 0 --optimizer-state bf16", 4, 8, 0,
		 (12 * 2e9) / 2e9 + (10 * 2e9) / 1e9, 8},
		{"--max-in-cpu 0 --optimizer-state q8", 4, 6.03125, 0,
		 (10.03125 * 2e9) / 2e9 + (8.03125 * 2e9) / 1e9, 6.03125},
		{"--optimizer-state q8 --micro-batches 2 --vertical", 2, 6.03125, 0,
		 (8.03125 * 2e9) / 2e9 + (8.03125 * 2e9) / 1e9, 6.03125},
		/* a bf16 master on NVMe shares the parameters' home (the optimizer's files hold m
		   and v alone: 4 bytes fewer each way than an fp32 master's), but not with the
		   parameters on NVMe and no cache: there it stays in the optimizer's files (2
		   fewer than fp32's); with the parameters on the GPU it is shared */
		{"--max-in-cpu 0 --master bf16", 4, 10, 0, (14 * 2e9) / 2e9 + (12 * 2e9) / 1e9, 8},
		{"--max-in-cpu 0 --optimizer-state bf16 --master bf16", 4, 6, 0,
		 (10 * 2e9) / 2e9 + (8 * 2e9) / 1e9, 4},
		{"--max-in-cpu 0 --optimizer-state q8 --master bf16", 4, 4.03125, 0,
		 (8.03125 * 2e9) / 2e9 + (6.03125 * 2e9) / 1e9, 2.03125},
		/* with a cache the master comes from it (backward just fetched its sub-group) */
		{"--optimizer-state q8 --master bf16", 2, 2.03125, 0,
		 (4.03125 * 2e9) / 2e9 + (4.03125 * 2e9) / 1e9, 2.03125},
		/* after backward the fill goes in backward's order: LRU misses (half cached) */
		{"--optimizer-state q8 --master bf16 --no-step-during-backward", 4, 2.03125, 4,
		 (10.03125 * 2e9) / 2e9 + (8.03125 * 2e9) / 1e9, 2.03125},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		cr_assert_eq(
			zc_run_sh(&sc, "", "",
				  "estimate --params 2e9 --gpu-mem 80e9 --cpu-mem 1e12 --nvme 1e13 "
				  "--nvme-read-bw 2 --nvme-write-bw 1 %s --json",
				  cases[i].flags),
			0, "%s", cases[i].flags);
		json_t *o = zc_json(sc.out);
		json_t *r = row(o, 3, "nvme", "nvme");
		const char *w = cases[i].flags;
		expect_bytes(r, "param", cases[i].param_rd, 2, w);
		expect_bytes(r, "optim", cases[i].optim, cases[i].optim, w);
		expect_bytes(r, "grad", cases[i].grad, cases[i].grad, w);
		expect_bytes(r, "total", cases[i].param_rd + cases[i].optim + cases[i].grad,
			     2 + cases[i].optim + cases[i].grad, w);
		cr_expect(fabs(zc_num(r, "nvme_s") - cases[i].step_s) < 1e-9 * cases[i].step_s,
			  "%s: nvme_s %g, expected %g", w, zc_num(r, "nvme_s"), cases[i].step_s);
		/* the parameters on the GPU: only the optimizer's and the gradients' bytes (a
		   shared master: read from the GPU) */
		double og = cases[i].optim_gpu_params;
		expect_bytes(row(o, 3, "none", "nvme"), "param", 0, 0, w);
		expect_bytes(row(o, 3, "none", "nvme"), "optim", og, og, w);
		json_decref(o);
	}
	/* the state's bytes on NVMe and in the CPU's optimizer: q8's 6.03125 instead of 12 */
	cr_assert_eq(zc_run_sh(&sc, "", "",
			       "estimate --params 2e9 --gpu-mem 80e9 --cpu-mem 1e13 --nvme 1e13 "
			       "--optimizer-state q8 --max-in-cpu 0 --json"),
		     0);
	json_t *o = zc_json(sc.out);
	expect(row(o, 3, "none", "nvme"), 0 + 2 * 2e9 + 0, 4 * 2e9 * 1.5, 6.03125 * 2e9, true);
	cr_expect_eq(zc_num(row(o, 3, "none", "cpu"), "cpu_bytes_per_node"), 10.03125 * 2e9 * 1.5);
	json_decref(o);
	/* with a bf16 master: 2.03125 bytes on NVMe (the master shares the 16-bit parameters'
	 * home), 8.03125 in the CPU's optimizer (with the fp32 gradient) */
	cr_assert_eq(zc_run_sh(&sc, "", "",
			       "estimate --params 2e9 --gpu-mem 80e9 --cpu-mem 1e13 --nvme 1e13 "
			       "--optimizer-state q8 --master bf16 --max-in-cpu 0 --json"),
		     0);
	o = zc_json(sc.out);
	expect(row(o, 3, "none", "nvme"), 0 + 2 * 2e9 + 0, 4 * 2e9 * 1.5, 2.03125 * 2e9, true);
	cr_expect_eq(zc_num(row(o, 3, "none", "cpu"), "cpu_bytes_per_node"), 8.03125 * 2e9 * 1.5);
	json_decref(o);
	cr_assert_eq(zc_run_sh(&sc, "", "", "estimate --params 2e9 --master f16"), 2);
	cr_assert_eq(zc_run_sh(&sc, "", "", "estimate --params 2e9 --optimizer-state q4"), 2);
	char *t = zc_text(sc.err);
	cr_expect(strstr(t, "--optimizer-state q4") != NULL, "%s", t);
	free(t);
}

/*
 * The engine steps a bf16 master and q8 m and v on the CPU only (zinf_engine_create refuses them
 * with offload_optimizer.device none), so with --master bf16 or --optimizer-state q8 the rows with
 * the optimizer on the GPU are left out, the JSON says why, and the recommendation is one the
 * engine takes. The 1.2e9 model of one_gpu_layers_and_step_time: stage 0 (all on the GPU) fits
 * and moves nothing, so it is recommended with fp32 and bf16 state; with a bf16 master or q8 the
 * fastest left are stages 1 to 3 with the optimizer on the CPU (1.2 s of Adam each), and the
 * first of them, stage 1, is recommended. Stage 2 with the optimizer on the CPU: 4.8e9 on the
 * GPU, (state + 4) x P x 1.5 on the CPU (bf16 master 14 x 1.2e9 x 1.5 = 25.2e9).
 */
Test(estimate, optimizer_on_gpu_rows_left_out_where_the_engine_refuses_them)
{
	static const struct {
		const char *flags, *why; /* why: NULL where every row stays */
		double cpu_stage2;
	} cases[] = {
		{"", NULL, 16 * 1.2e9 * 1.5},
		{"--optimizer-state bf16", NULL, 12 * 1.2e9 * 1.5},
		{"--master bf16", "--master bf16 is stepped on the CPU only", 14 * 1.2e9 * 1.5},
		{"--optimizer-state q8", "--optimizer-state q8 is stepped on the CPU only",
		 (4 + 2 * 1.015625 + 4) * 1.2e9 * 1.5},
		{"--optimizer-state q8 --master bf16",
		 "--master bf16 and --optimizer-state q8 are stepped on the CPU only",
		 (2 + 2 * 1.015625 + 4) * 1.2e9 * 1.5},
	};
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		const char *f = cases[k].flags;
		cr_assert_eq(
			zc_run_sh(&sc, "", "",
				  "estimate --params 1.2e9 --layers 24 --gpus-per-node 1 "
				  "--gpu-mem 24e9 --cpu-mem 64e9 --nvme 1e12 --nvme-read-bw 2 "
				  "--nvme-write-bw 1 --pcie-bw 10 --adam-rate 1e9 --max-in-cpu 0 "
				  "%s --json",
				  f),
			0, "%s", f);
		json_t *o = zc_json(sc.out);
		json_t *rows = json_object_get(o, "rows"), *r;
		size_t i, gpu_optim = 0;
		json_array_foreach(rows, i, r)
		{
			gpu_optim += !strcmp(
				json_string_value(json_object_get(r, "offload_optimizer")), "none");
		}
		json_t *why = json_object_get(o, "optimizer_on_gpu_left_out");
		json_t *z = json_object_get(json_object_get(o, "recommended"), "zero_optimization");
		json_t *zo = json_object_get(z, "offload_optimizer");
		if (cases[k].why) {
			/* 13 choices, 4 of them with the optimizer on the GPU (stages 0 to 3) */
			cr_expect_eq(json_array_size(rows), 9, "%s: %zu rows", f,
				     json_array_size(rows));
			cr_expect_eq(gpu_optim, 0, "%s: %zu rows with the optimizer on the GPU", f,
				     gpu_optim);
			cr_expect_str_eq(json_string_value(why), cases[k].why, "%s", f);
			cr_expect_eq(json_integer_value(json_object_get(z, "stage")), 1, "%s", f);
			cr_expect_str_eq(json_string_value(json_object_get(zo, "device")), "cpu",
					 "%s", f);
		} else {
			cr_expect_eq(json_array_size(rows), 13, "%s", f);
			cr_expect_eq(gpu_optim, 4, "%s", f);
			cr_expect(json_is_null(why), "%s", f);
			cr_expect_eq(json_integer_value(json_object_get(z, "stage")), 0, "%s", f);
			cr_expect_null(zo, "%s", f);
		}
		expect(row(o, 2, "none", "cpu"), 4.8e9, cases[k].cpu_stage2, 0, true);
		json_decref(o);
		/* the table says so too */
		cr_assert_eq(zc_run_sh(&sc, "", "",
				       "estimate --params 1.2e9 --layers 24 --gpus-per-node 1 "
				       "--gpu-mem 24e9 --cpu-mem 64e9 --nvme 1e12 %s",
				       f),
			     0, "%s", f);
		char *t = zc_text(sc.out);
		bool note = strstr(t, "note: no rows with the optimizer on the GPU") != NULL;
		cr_expect_eq(note, cases[k].why != NULL, "%s:\n%s", f, t);
		cr_expect_eq(strstr(t, "none   none") != NULL, cases[k].why == NULL, "%s:\n%s", f,
			     t);
		free(t);
	}
}
