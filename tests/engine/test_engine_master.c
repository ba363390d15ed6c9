/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/test_engine_master.c: the bf16 master shared with the 16-bit parameters' home
 * (eng_master_shared: the optimizer on NVMe, a bf16 master, bf16 parameters). One process (comm
 * "single", device "host"), spec_model.h's model: five parameters in three layers, 20 steps of
 * two micro-batches with gradient clipping, plain and clipped steps mixed, the step during
 * backward (speculating: a clipped step rolls back and redoes the speculated sub-groups).
 *
 * - The engine with the optimizer on NVMe (master shared) and the one with it on the CPU (master
 *   in memory, where it never touched a file) give the same bits after every step: the 16-bit
 *   values the trainer reads, a loss from them, the masters (read_master), the norm; stage 3
 *   with the parameters on NVMe (no cache, and the whole model cached), on the CPU and on the
 *   device, and stages 1 and 2 (the home: the gathered tensor); bf16 and q8 moments. With the
 *   parameters on NVMe and no cache the master is not shared (it stays in the optimizer's
 *   files, eng_master_shared): the same bits, and its 2 bytes in the optimizer's counts.
 * - The optimizer's NVMe bytes on a plain step are m's and v's alone, worked by hand: 667
 *   elements of bf16 m and v, 2 x 2 x 667 = 2668 each way (4002 with the master in the files);
 *   q8: 2 x (124 + 11 + 204 + 44 + 308) = 1382 (each sub-group a q8 array: its elements plus 4
 *   bytes a started block of 256); the parameters written once (2 x 667). With the whole model
 *   in the parameter cache the parameters read no byte (the fill is a memcpy from the cache).
 * - A checkpoint saved with the shared master loads into the cpu tier's engine and one saved by
 *   that engine loads into the shared one (the checkpoint's master is f32 either way): the
 *   masters read back are the saved ones and the two engines then train on in the same bits.
 * - A save's parameter store reads are not the next step's; the speculation's reserve holds a
 *   shared master once (with the 16-bit values), by hand, and the engine's pool is the plan's.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "zinf/checkpoint.h"
#include "zinf/engine.h"
#include "engine/test_model.h"

#include "engine/spec_model.h"

#define FLAT 667u /* 300 + 40 + 200 + 7 + 120: the flat partition of one rank */

struct cfg {
	enum zinf_offload_device opt, param;
	bool q8;
	uint64_t max_in_cpu; /* offload_param.max_in_cpu (parameters on NVMe) */
	int stage;	     /* 0: 3 */
};

static void
make_opts(struct zinf_engine_opts *o, const struct cfg *c, const char *dir)
{
	/* two buffers: the speculation's reserve holds two sub-groups */
	spec_model_opts(o, c->stage ? c->stage : 3, c->opt, c->param, 2, dir, ZINF_OPTIM_ADAMW);
	o->offload_param.max_in_cpu = c->max_in_cpu;
	o->optimizer.state_format = c->q8 ? ZINF_STATE_Q8 : ZINF_STATE_PLAIN;
	o->optimizer.state_dtype = c->q8 ? ZINF_F32 : ZINF_BF16;
	o->optimizer.rounding = ZINF_ROUND_STOCHASTIC;
	o->optimizer.master_dtype = ZINF_BF16;
	o->dtype = ZINF_BF16;
	o->gradient_clipping = CLIP;
	o->step_during_backward = true;
	o->swap_prefix = c->opt == ZINF_OFFLOAD_NVME ? "emaster-n" : "emaster-c";
}

static void
model_open(struct model *m, const struct cfg *c, char *dir)
{
	memset(m, 0, sizeof(*m));
	struct zinf_engine_opts o;
	make_opts(&o, c, dir);
	spec_model_create(m, &o);
}

/* Step s of spec_model's schedule (overflow steps are plain here: no fp16). */
static enum kind
kind_bf16(int s)
{
	return kind_of(s) == OVERFLOW ? PLAIN : kind_of(s);
}

static void
train_step(struct model *m, int s, struct seen *out)
{
	enum kind k = kind_bf16(s);
	double factor = k == CLIPPED ? 4.0 : 1.0;
	for (int mi = 0; mi < 2; mi++) {
		spec_passes(m->e, m->gdev, out->p16, s, mi, factor, false);
		out->rc = zinf_engine_step(m->e);
		cr_assert_eq(out->rc, mi, "step %d micro %d: %d %s", s, mi, out->rc,
			     zinf_last_error());
	}
	spec_record(m, out, true);
}

/* Whether the engine shares the master (eng_master_shared): not with the parameters on NVMe and
 * no parameter cache. */
static bool
shared(const struct cfg *c)
{
	return !(c->param == ZINF_OFFLOAD_NVME && c->max_in_cpu == 0);
}

/* The optimizer's NVMe bytes each way of a plain step, by hand (see the top): m and v, and the
 * master's 2 bytes an element where it is not shared. */
static uint64_t
optim_bytes(const struct cfg *c)
{
	return (c->q8 ? 2u * (124 + 11 + 204 + 44 + 308) : 2u * 2u * FLAT) +
	       (shared(c) ? 0 : 2u * FLAT);
}

static void
shared_equals_cpu_tier(const struct cfg *nv)
{
	static struct seen a, b;
	char *dir = zt_mkdtemp(NULL);
	struct cfg cc = *nv;
	cc.opt = ZINF_OFFLOAD_CPU;
	struct model mn, mc;
	model_open(&mn, nv, dir);
	model_open(&mc, &cc, dir);
	uint32_t rolled = 0, plain = 0;
	for (int s = 0; s < STEPS; s++) {
		train_step(&mn, s, &a);
		train_step(&mc, s, &b);
		spec_expect_same(&a, &b, s, kind_bf16(s));
		cr_assert_gt(a.st.stepped_during_backward, 0, "step %d: nothing speculated", s);
		rolled += a.st.rolled_back;
		if (kind_bf16(s) != PLAIN) {
			continue;
		}
		plain++;
		cr_assert_eq(a.st.optim_nvme_read_bytes, optim_bytes(nv),
			     "step %d: optimizer read %" PRIu64 " bytes, m and v are %" PRIu64, s,
			     a.st.optim_nvme_read_bytes, optim_bytes(nv));
		cr_assert_eq(a.st.optim_nvme_write_bytes, optim_bytes(nv),
			     "step %d: optimizer wrote %" PRIu64 " bytes, m and v are %" PRIu64, s,
			     a.st.optim_nvme_write_bytes, optim_bytes(nv));
		if (nv->param == ZINF_OFFLOAD_NVME && nv->max_in_cpu && s > 0) {
			/* the whole model cached: the fill reads no file either */
			cr_assert_eq(a.st.param_nvme_read_bytes, 0,
				     "step %d: parameters read %" PRIu64 " bytes with every "
				     "partition cached",
				     s, a.st.param_nvme_read_bytes);
		}
		if (nv->param == ZINF_OFFLOAD_NVME) {
			cr_assert_eq(a.st.param_nvme_write_bytes, 2u * FLAT, "step %d", s);
			cr_log_info("step %d: parameters read %" PRIu64 " bytes", s,
				    a.st.param_nvme_read_bytes);
		}
	}
	cr_assert_gt(rolled, 0, "no clipped step rolled back a speculated sub-group");
	cr_assert_gt(plain, 0);
	model_free(&mn);
	model_free(&mc);
	zt_rmtree(dir);
	free(dir);
}

/* No parameter cache: the master stays in the optimizer's files (the same bits, its bytes
 * there) */
Test(engine_master, kept_in_the_optimizer_files_without_a_parameter_cache)
{
	shared_equals_cpu_tier(&(struct cfg){ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, false, 0, 3});
}

Test(engine_master, shared_equals_cpu_tier_params_nvme_cached)
{
	shared_equals_cpu_tier(
		&(struct cfg){ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, false, 100000, 3});
}

Test(engine_master, shared_equals_cpu_tier_params_cpu)
{
	shared_equals_cpu_tier(&(struct cfg){ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_CPU, false, 0, 3});
}

Test(engine_master, shared_equals_cpu_tier_q8_params_nvme)
{
	shared_equals_cpu_tier(
		&(struct cfg){ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, true, 100000, 3});
}

Test(engine_master, shared_equals_cpu_tier_params_gpu)
{
	shared_equals_cpu_tier(&(struct cfg){ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NONE, false, 0, 3});
}

/* Stages 1 and 2: the home is this rank's slice of the gathered device tensor. */
Test(engine_master, shared_equals_cpu_tier_stage2)
{
	shared_equals_cpu_tier(&(struct cfg){ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NONE, false, 0, 2});
}

Test(engine_master, shared_equals_cpu_tier_stage1_q8)
{
	shared_equals_cpu_tier(&(struct cfg){ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NONE, true, 0, 1});
}

/* The masters of every parameter (read_master). */
static void
masters(struct model *m, float out[NP][NMAX])
{
	for (int p = 0; p < NP; p++) {
		int r = zinf_engine_read_master(m->e, (uint32_t)p, out[p]);
		cr_assert_eq(r, 0, "read_master: %d %s", r, zinf_last_error());
	}
}

/*
 * Checkpoints cross between the shared master and the master in memory: each engine trains 6
 * steps and saves; a fresh engine of the other kind loads it and must read back the saver's
 * masters bit for bit, then both (the saver and the loader) train steps 6..11 in the same bits.
 */
Test(engine_master, checkpoints_cross_between_shared_and_in_memory_masters)
{
	static struct seen a, b;
	static float ma[NP][NMAX], mb[NP][NMAX];
	const struct cfg kinds[2] = {{ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, false, 100000, 3},
				     {ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NVME, false, 0, 3}};
	for (int from = 0; from < 2; from++) {
		char *dir = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
		struct model saver, loader;
		model_open(&saver, &kinds[from], dir);
		for (int s = 0; s < 6; s++) {
			train_step(&saver, s, &a);
		}
		int rc = zinf_engine_save(saver.e, ck, "t6", NULL);
		cr_assert_eq(rc, 0, "save: %d %s", rc, zinf_last_error());
		model_open(&loader, &kinds[1 - from], dir);
		rc = zinf_engine_load(loader.e, ck, "t6", NULL);
		cr_assert_eq(rc, 0, "load: %d %s", rc, zinf_last_error());
		masters(&saver, ma);
		masters(&loader, mb);
		cr_assert(!memcmp(ma, mb, sizeof(ma)), "from %s: the loaded masters differ",
			  from ? "the cpu tier" : "the shared master");
		cr_assert_eq(zinf_engine_steps(loader.e), 6);
		for (int s = 6; s < 12; s++) {
			train_step(&saver, s, &a);
			train_step(&loader, s, &b);
			spec_expect_same(&a, &b, s, kind_bf16(s));
		}
		model_free(&saver);
		model_free(&loader);
		zt_rmtree(dir);
		zt_rmtree(ck);
		free(dir);
		free(ck);
	}
}

/* spec_model's parameters as zinf_engine_plan takes them. */
static void
model_descs(struct zinf_param_desc d[NP])
{
	for (int p = 0; p < NP; p++) {
		zinf_param_desc_init(&d[p]);
		d[p].name = names[p];
		d[p].numel = numel[p];
		d[p].layer = layer_of[p];
	}
}

/*
 * zinf_engine_plan's optimizer state on NVMe (zinf config check's NVMe line): m and v alone with
 * the shared master, 2 x 2 x 667 = 2668 bytes of bf16 m and v; 4002 with the master's 2 bytes
 * when it is not shared (fp32 parameters, whose copy is not the master's bits; the parameters
 * on NVMe with no cache); 0 on the CPU.
 */
Test(engine_master, plan_counts_the_optimizer_files_without_the_shared_master)
{
	struct zinf_param_desc d[NP];
	model_descs(d);
	static const struct {
		enum zinf_offload_device opt;
		enum zinf_dtype dtype;
		uint64_t max_in_cpu, want;
	} cases[] = {
		{ZINF_OFFLOAD_NVME, ZINF_BF16, 100000, 2u * 2u * FLAT},
		{ZINF_OFFLOAD_NVME, ZINF_BF16, 0, 3u * 2u * FLAT},
		{ZINF_OFFLOAD_NVME, ZINF_F32, 100000, 3u * 2u * FLAT},
		{ZINF_OFFLOAD_CPU, ZINF_BF16, 100000, 0},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct zinf_engine_opts o;
		make_opts(&o,
			  &(struct cfg){cases[i].opt, ZINF_OFFLOAD_NVME, false, cases[i].max_in_cpu,
					3},
			  "/tmp");
		o.dtype = cases[i].dtype;
		struct zinf_engine_plan plan = {.size = sizeof(plan)};
		cr_assert_eq(zinf_engine_plan(&o, 1, 0, d, NP, &plan), 0, "%s", zinf_last_error());
		cr_assert_eq(plan.optim_nvme_state_bytes, cases[i].want,
			     "case %zu: %" PRIu64 " bytes, want %" PRIu64, i,
			     plan.optim_nvme_state_bytes, cases[i].want);
	}
}

/*
 * A checkpoint's save fills the shared master from the parameters' home: the parameter store's
 * reads of the partitions not in its buffers or cache. Those reads are the save's, not the next
 * step's. A parameter cache of one element (the master shared, but no partition fits) and two
 * engines in the same bits, one saving before step 2: the save reads the partitions the store's
 * buffers do not hold (here a, b, c and d: 1094 bytes) and leaves some of them in the buffers,
 * so the step after it reads no more than the same step without the save (6924 and 7524 bytes
 * here; 8018 when the save's reads were counted as the step's). A foreground save, and a
 * background one (published inside the step). With the whole model cached a save reads nothing
 * (its fill is a memcpy from the cache).
 */
Test(engine_master, a_save_reads_no_parameter_bytes_of_the_next_step)
{
	static struct seen a, b;
	const struct cfg c = {ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, false, 1, 3};
	for (int bg = 0; bg < 2; bg++) {
		char *dir = zt_mkdtemp(NULL), *dref = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
		struct model m, ref;
		model_open(&m, &c, dir);
		model_open(&ref, &c, dref);
		struct zinf_ckpt_opts co;
		zinf_ckpt_opts_init(&co);
		co.background = bg;
		for (int s = 0; s < 2; s++) {
			train_step(&m, s, &a);
			train_step(&ref, s, &b);
		}
		int rc = zinf_engine_save(m.e, ck, "t2", &co);
		cr_assert_eq(rc, 0, "save: %d %s", rc, zinf_last_error());
		train_step(&m, 2, &a);
		train_step(&ref, 2, &b);
		const char *how = bg ? "background" : "foreground";
		cr_log_info("%s save: the next step read %" PRIu64 " parameter bytes, %" PRIu64
			    " without the save",
			    how, a.st.param_nvme_read_bytes, b.st.param_nvme_read_bytes);
		cr_assert_gt(b.st.param_nvme_read_bytes, 0, "no partition cached: the step reads");
		cr_assert_leq(a.st.param_nvme_read_bytes, b.st.param_nvme_read_bytes,
			      "%s save: the next step read %" PRIu64 " parameter bytes, %" PRIu64
			      " without the save: the save's reads counted as the step's",
			      how, a.st.param_nvme_read_bytes, b.st.param_nvme_read_bytes);
		spec_expect_same(&a, &b, 2, kind_bf16(2));
		cr_assert_eq(zinf_engine_save_wait(m.e), 0, "%s", zinf_last_error());
		model_free(&m);
		model_free(&ref);
		zt_rmtree(dir);
		zt_rmtree(dref);
		zt_rmtree(ck);
		free(dir);
		free(dref);
		free(ck);
	}
}

/*
 * The speculative step's reserve (zinf_engine_plan's speculation_bytes) with the shared master:
 * a slot holds m, v and the 16-bit values, not the master apart (the master is the 16-bit values
 * bit for bit: one region). spec_model's longest sub-group is 300 elements: each region (bf16
 * master, m, v, 16-bit values: 600 bytes) aligned to 4096, two slots (buffer_count 2): 2 x 3 x
 * 4096 = 24576 bytes shared, 2 x 4 x 4096 = 32768 with the master apart (the parameters on NVMe
 * without a cache; the optimizer on the CPU). A real engine's host pool equals the plan's.
 */
Test(engine_master, reserve_holds_the_shared_master_once)
{
	struct zinf_param_desc d[NP];
	model_descs(d);
	static const struct {
		struct cfg c;
		uint64_t want;
	} cases[] = {
		{{ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, false, 100000, 3}, 2u * 3u * 4096u},
		{{ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_CPU, false, 0, 3}, 2u * 3u * 4096u},
		{{ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, false, 0, 3}, 2u * 4u * 4096u},
		{{ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NVME, false, 100000, 3}, 2u * 4u * 4096u},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char *dir = zt_mkdtemp(NULL);
		struct zinf_engine_opts o;
		make_opts(&o, &cases[i].c, dir);
		struct zinf_engine_plan plan = {.size = sizeof(plan)};
		cr_assert_eq(zinf_engine_plan(&o, 1, 0, d, NP, &plan), 0, "%s", zinf_last_error());
		cr_expect_eq(plan.speculation_bytes, cases[i].want,
			     "case %zu: a reserve of %" PRIu64 " bytes, want %" PRIu64, i,
			     plan.speculation_bytes, cases[i].want);
		struct model m;
		model_open(&m, &cases[i].c, dir);
		struct zinf_engine_stats st = {.size = sizeof(st)};
		cr_assert_eq(zinf_engine_get_stats(m.e, &st), 0, "%s", zinf_last_error());
		cr_expect_eq(st.host_pool_bytes, plan.host_pool_bytes,
			     "case %zu: the engine's host pool %" PRIu64 ", the plan's %" PRIu64, i,
			     st.host_pool_bytes, plan.host_pool_bytes);
		model_free(&m);
		zt_rmtree(dir);
		free(dir);
	}
}
