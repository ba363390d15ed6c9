/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/config/test_config.c: ds_config.json reading (zinf/config.h). The seed configurations
 * (configs/: ZeRO-1, ZeRO-2, ZeRO-Infinity as DeepSpeed's docs write them, ZeRO-2 and ZeRO-3 as
 * Hugging Face's tests write them, "auto" included) read and resolved to the values worked out
 * in each test; every error class produces its message (the log is captured and searched),
 * with the key's full path and line; the first 20 errors of a file are reported and the rest
 * counted (a million unknown keys in linear time); the dump reads back to the same
 * configuration.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "zinf/config.h"

static char logbuf[1 << 16];
static int n_errors, n_warnings;

static void
capture(void *ctx, enum zinf_log_level level, const char *file, int line, const char *func,
	const char *msg)
{
	(void)ctx, (void)file, (void)line, (void)func;
	size_t len = strlen(logbuf);
	snprintf(logbuf + len, sizeof(logbuf) - len, "%c %s\n", "EWID"[level], msg);
	n_errors += level == ZINF_LOG_ERROR;
	n_warnings += level == ZINF_LOG_WARN;
}

static void
setup(void)
{
	logbuf[0] = '\0';
	n_errors = n_warnings = 0;
	zinf_log_set_callback(capture, NULL);
	zinf_log_set_level(ZINF_LOG_INFO);
}

TestSuite(config, .init = setup);

#define expect_log(needle)                                                                         \
	cr_expect(strstr(logbuf, (needle)) != NULL, "log lacks <%s>; log:\n%s", (needle), logbuf)

static const char *
resolved(const struct zinf_train_config *c, const char *path)
{
	for (uint32_t i = 0; i < c->n_resolved; i++) {
		if (strcmp(c->resolved[i].path, path) == 0) {
			return c->resolved[i].value;
		}
	}
	return "(not resolved)";
}

/* Read `text`; expect failure (-EINVAL) and the config left at its defaults. */
static void
read_bad(const char *text, const struct zinf_config_inputs *in)
{
	struct zinf_train_config c;
	zinf_config_init(&c);
	int rc = zinf_config_read_string(text, "t.json", in, &c);
	cr_expect_eq(rc, -EINVAL, "rc %d for:\n%s\nlog:\n%s", rc, text, logbuf);
	cr_expect_eq(c.engine.stage, 0, "left at the defaults");
	zinf_config_fini(&c);
}

static int
read_ok(const char *text, const struct zinf_config_inputs *in, struct zinf_train_config *c)
{
	zinf_config_init(c);
	int rc = zinf_config_read_string(text, "t.json", in, c);
	cr_assert_eq(rc, 0, "rc %d; log:\n%s", rc, logbuf);
	return rc;
}

static void
hf_inputs(struct zinf_config_inputs *in)
{
	zinf_config_inputs_init(in);
	in->world_size = 4;
	in->micro_batch = 8;
	in->grad_accum = 2;
	in->lr = 3e-5;
	in->beta1 = 0.9;
	in->beta2 = 0.98;
	in->eps = 1e-6;
	in->weight_decay = 0.01;
	in->max_grad_norm = 1.0;
	in->fp16 = 0;
	in->bf16 = 1;
	in->warmup_num_steps = 100;
	in->total_num_steps = 1000;
}

Test(config, defaults)
{
	struct zinf_train_config c;
	read_ok("{\"train_batch_size\": 1}", NULL, &c);
	cr_expect_eq(c.engine.stage, 0);
	cr_expect_eq(c.engine.reduce_bucket_size, 500000000);
	cr_expect_eq(c.engine.allgather_bucket_size, 500000000);
	cr_expect_eq(c.engine.sub_group_size, 1000000000);
	cr_expect_eq(c.engine.stage3_prefetch_bucket_size, 50000000);
	cr_expect_eq(c.engine.stage3_param_persistence_threshold, 100000);
	cr_expect_eq(c.engine.offload_param.buffer_count, 5);
	cr_expect_eq(c.engine.offload_optimizer.buffer_count, 4);
	cr_expect_eq(c.engine.aio.block_size, 1048576);
	cr_expect_eq(c.engine.aio.queue_depth, 8);
	cr_expect_eq(c.engine.dtype, ZINF_F32, "fp32 without fp16/bf16");
	cr_expect(!c.engine.overlap_comm);
	cr_expect(c.reduce_scatter && c.allgather_partitions && c.load_from_fp32_weights);
	cr_expect_eq(c.steps_per_print, 10);
	cr_expect_eq(c.fp16.initial_scale_power, 16);
	cr_expect_eq(c.scheduler.type, ZINF_SCHED_NONE);
	cr_expect(!c.optimizer_given);
	cr_expect_eq(c.n_resolved, 0);
	cr_expect_eq(n_errors + n_warnings, 0, "%s", logbuf);
	zinf_config_fini(&c);
}

Test(config, hf_zero2_auto)
{
	struct zinf_config_inputs in;
	struct zinf_train_config c;
	hf_inputs(&in);
	zinf_config_init(&c);
	cr_assert_eq(zinf_config_read_file(ZINF_TEST_CONFIGS "/hf_zero2.json", &in, &c), 0, "%s",
		     logbuf);
	cr_expect_eq(c.train_batch_size, 64, "4 ranks x 8 x 2");
	cr_expect_eq(c.train_micro_batch_size_per_gpu, 8);
	cr_expect_eq(c.engine.gradient_accumulation_steps, 2);
	cr_expect_eq(c.gradient_clipping, 1.0);
	cr_expect(!c.fp16.enabled);
	cr_expect(c.bf16_enabled);
	cr_expect_eq(c.engine.dtype, ZINF_BF16);
	cr_expect_eq(c.engine.optimizer.kind, ZINF_OPTIM_ADAMW);
	cr_expect_eq(c.engine.optimizer.lr, 3e-5f);
	cr_expect_eq(c.engine.optimizer.beta1, 0.9f);
	cr_expect_eq(c.engine.optimizer.beta2, 0.98f);
	cr_expect_eq(c.engine.optimizer.eps, 1e-6f);
	cr_expect_eq(c.engine.optimizer.weight_decay, 0.01f);
	cr_expect_eq(c.scheduler.type, ZINF_SCHED_WARMUP_LR);
	cr_expect_eq(c.scheduler.warmup_min_lr, 0.0);
	cr_expect_eq(c.scheduler.warmup_max_lr, 3e-5);
	cr_expect_eq(c.scheduler.warmup_num_steps, 100);
	cr_expect_eq(c.engine.stage, 2);
	cr_expect_eq(c.engine.offload_optimizer.device, ZINF_OFFLOAD_CPU);
	cr_expect(c.engine.offload_optimizer.pin_memory);
	cr_expect_eq(c.engine.allgather_bucket_size, 200000000, "2e8 as an integer");
	cr_expect_eq(c.engine.reduce_bucket_size, 200000000);
	cr_expect(c.engine.overlap_comm);
	cr_expect_eq(c.steps_per_print, 2000);
	/* every "auto" reported, with its value */
	cr_expect_eq(c.n_resolved, 13);
	cr_expect_str_eq(resolved(&c, "train_batch_size"), "64");
	cr_expect_str_eq(resolved(&c, "optimizer.params.betas"), "[0.9,0.98]");
	cr_expect_str_eq(resolved(&c, "bf16.enabled"), "true");
	cr_expect_str_eq(resolved(&c, "scheduler.params.warmup_num_steps"), "100");
	expect_log("hf_zero2.json: train_batch_size: \"auto\" resolved to 64");
	cr_expect_eq(n_errors + n_warnings, 0, "%s", logbuf);
	zinf_config_fini(&c);
}

Test(config, hf_zero3_auto_from_hidden_size)
{
	struct zinf_config_inputs in;
	struct zinf_train_config c;
	hf_inputs(&in);
	in.hidden_size = 4096;
	zinf_config_init(&c);
	cr_assert_eq(zinf_config_read_file(ZINF_TEST_CONFIGS "/hf_zero3.json", &in, &c), 0, "%s",
		     logbuf);
	cr_expect_eq(c.engine.stage, 3);
	cr_expect_eq(c.engine.reduce_bucket_size, 16777216, "hidden^2");
	cr_expect_eq(c.engine.stage3_prefetch_bucket_size, 15099494, "int(0.9 x 16777216)");
	cr_expect_eq(c.engine.stage3_param_persistence_threshold, 40960, "10 x hidden");
	cr_expect_str_eq(resolved(&c, "zero_optimization.stage3_prefetch_bucket_size"), "15099494");
	cr_expect_eq(c.engine.offload_param.device, ZINF_OFFLOAD_CPU);
	cr_expect_eq(c.engine.offload_optimizer.device, ZINF_OFFLOAD_CPU);
	cr_expect(c.stage3_gather_16bit_weights_on_model_save);
	cr_expect_eq(c.engine.sub_group_size, 1000000000);
	cr_expect_eq(c.engine.stage3_max_live_parameters, 1000000000);
	cr_expect(c.engine.overlap_comm);
	cr_expect_eq(c.n_resolved, 16);
	zinf_config_fini(&c);
}

Test(config, hf_zero3_auto_needs_inputs)
{
	struct zinf_config_inputs in;
	struct zinf_train_config c;
	hf_inputs(&in); /* no hidden size, which has no default */
	zinf_config_init(&c);
	cr_expect_eq(zinf_config_read_file(ZINF_TEST_CONFIGS "/hf_zero3.json", &in, &c), -EINVAL);
	/* every one reported, each with its line in the file, naming what it needs, never a C
	   struct */
	expect_log("hf_zero3.json:47: zero_optimization.reduce_bucket_size: is \"auto\", resolved "
		   "from the model's hidden size (Hugging Face: model.config.hidden_size), which "
		   "has no default and was not given");
	expect_log("hf_zero3.json:48: zero_optimization.stage3_prefetch_bucket_size: is \"auto\"");
	expect_log("hf_zero3.json:49: zero_optimization.stage3_param_persistence_threshold");
	expect_log("hf_zero3.json: 3 errors");
	cr_expect(strstr(logbuf, "struct") == NULL, "%s", logbuf);
	cr_expect_eq(c.engine.stage, 0, "defaults after a failure");
	zinf_config_fini(&c);
}

/*
 * Nothing given but the hidden size: every other "auto" takes TrainingArguments' default, as the
 * Hugging Face Trainer of a user who gave nothing resolves it (per_device_train_batch_size 8,
 * gradient_accumulation_steps 1, learning_rate 5e-5, adam_beta1 0.9, adam_beta2 0.999,
 * adam_epsilon 1e-8, weight_decay 0, max_grad_norm 1, warmup_steps 0, fp16 and bf16 off), each
 * listed with its input and marked as a default; a value given is not.
 */
Test(config, hf_auto_takes_trainingarguments_defaults)
{
	struct zinf_config_inputs in;
	struct zinf_train_config c;
	zinf_config_inputs_init(&in);
	in.hidden_size = 64;
	in.weight_decay = 0.125; /* given */
	zinf_config_init(&c);
	cr_assert_eq(zinf_config_read_file(ZINF_TEST_CONFIGS "/hf_zero3.json", &in, &c), 0, "%s",
		     logbuf);
	cr_expect_eq(c.train_micro_batch_size_per_gpu, 8);
	cr_expect_eq(c.engine.gradient_accumulation_steps, 1);
	cr_expect_eq(c.train_batch_size, 8, "world 1 x 8 x 1");
	cr_expect_eq(c.engine.optimizer.lr, 5e-5f);
	cr_expect_eq(c.engine.optimizer.beta1, 0.9f);
	cr_expect_eq(c.engine.optimizer.beta2, 0.999f);
	cr_expect_eq(c.engine.optimizer.eps, 1e-8f);
	cr_expect_eq(c.engine.optimizer.weight_decay, 0.125f);
	cr_expect_eq(c.gradient_clipping, 1.0);
	cr_expect_eq(c.engine.gradient_clipping, 1.0, "the engine clips");
	cr_expect(!c.fp16.enabled && !c.bf16_enabled);
	cr_expect_eq(c.engine.dtype, ZINF_F32);
	cr_expect_eq(c.scheduler.warmup_num_steps, 0);
	cr_expect_eq(c.scheduler.warmup_max_lr, (double)5e-5);
	cr_expect_eq(c.n_unresolved, 0);
	bool seen_betas = false, seen_wd = false;
	for (uint32_t i = 0; i < c.n_resolved; i++) {
		const struct zinf_config_resolved *r = &c.resolved[i];
		if (strcmp(r->path, "optimizer.params.betas") == 0) {
			seen_betas = true;
			cr_expect_str_eq(r->input, "adam_beta1+adam_beta2");
			cr_expect(r->defaulted);
		} else if (strcmp(r->path, "optimizer.params.weight_decay") == 0) {
			seen_wd = true;
			cr_expect_str_eq(r->input, "weight_decay");
			cr_expect(!r->defaulted, "given");
		} else if (strncmp(r->path, "zero_optimization.", 18) == 0) {
			cr_expect_str_eq(r->input, "hidden_size");
			cr_expect(!r->defaulted);
		}
	}
	cr_expect(seen_betas && seen_wd);
	expect_log("optimizer.params.eps: \"auto\" resolved to 1e-8 (adam_epsilon: Hugging "
		   "Face's default)");
	cr_expect_eq(n_errors + n_warnings, 0, "%s", logbuf);
	zinf_config_fini(&c);
}

/*
 * ZINF_CONFIG_UNRESOLVED_OK (zinf config check): an "auto" whose input has no default and was
 * not given (steps, hidden size, a world size given as 0) is listed, not an error; its key keeps
 * DeepSpeed's default and the dump prints it as "auto"; the checks that need it are left out
 * (WarmupCosineLR's total_num_steps). A world size of 0 is derived from three batch keys that
 * fix it, and refused when they fit no world size.
 */
Test(config, unresolved_listed_with_the_flag)
{
	const char *text =
		"{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": 4,\n"
		" \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\n"
		"   \"total_num_steps\": \"auto\", \"warmup_num_steps\": \"auto\"}},\n"
		" \"zero_optimization\": {\"stage\": 3, \"reduce_bucket_size\": \"auto\"}}";
	struct zinf_config_inputs in;
	struct zinf_train_config c;
	zinf_config_inputs_init(&in);
	in.world_size = 0;
	read_bad(text, &in); /* without the flag: three errors */
	expect_log("t.json:1: train_batch_size: is \"auto\", resolved from the world size");
	expect_log("t.json:3: scheduler.params.total_num_steps: is \"auto\", resolved from the "
		   "trainer's number of training steps");
	expect_log("t.json:4: zero_optimization.reduce_bucket_size: is \"auto\", resolved from "
		   "the model's hidden size");
	expect_log("t.json: 3 errors");
	logbuf[0] = 0;
	n_errors = 0;
	in.flags = ZINF_CONFIG_UNRESOLVED_OK;
	read_ok(text, &in, &c);
	cr_expect_eq(n_errors, 0, "%s", logbuf);
	cr_assert_eq(c.n_unresolved, 3);
	cr_expect_str_eq(c.unresolved[0].path, "train_batch_size");
	cr_expect_eq(c.unresolved[0].input, ZINF_CONFIG_IN_WORLD_SIZE);
	cr_expect_str_eq(c.unresolved[1].path, "scheduler.params.total_num_steps");
	cr_expect_eq(c.unresolved[1].input, ZINF_CONFIG_IN_TOTAL_STEPS);
	cr_expect_str_eq(c.unresolved[2].path, "zero_optimization.reduce_bucket_size");
	cr_expect_eq(c.unresolved[2].input, ZINF_CONFIG_IN_HIDDEN_SIZE);
	cr_expect_eq(c.engine.reduce_bucket_size, 500000000, "DeepSpeed's default kept");
	cr_expect_eq(c.world_size, 0, "not known");
	char *dump = NULL;
	cr_assert_eq(zinf_config_dump(&c, &dump), 0);
	cr_expect(strstr(dump, "\"total_num_steps\": \"auto\"") != NULL, "%s", dump);
	cr_expect(strstr(dump, "\"reduce_bucket_size\": \"auto\"") != NULL, "%s", dump);
	cr_expect(strstr(dump, "\"train_batch_size\": \"auto\"") != NULL, "%s", dump);
	free(dump);
	zinf_config_fini(&c);

	/* the three batch keys fix the world size: 32 = 16 x 1 x 2 */
	read_ok("{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 16,\n"
		" \"gradient_accumulation_steps\": 1}",
		&in, &c);
	cr_expect_eq(c.world_size, 2);
	cr_expect(c.world_derived);
	cr_expect_eq(c.n_unresolved, 0);
	zinf_config_fini(&c);
	read_bad("{\"train_batch_size\": 30, \"train_micro_batch_size_per_gpu\": 16,\n"
		 " \"gradient_accumulation_steps\": 1}",
		 &in);
	expect_log("train_batch_size 30 is not train_micro_batch_size_per_gpu 16 x "
		   "gradient_accumulation_steps 1 x any world size");

	/* two numbers given, the third key absent: the absent one is the world size's to derive;
	   the given ones keep their values in the dump, never "auto" */
	read_ok("{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 2}", &in,
		&c);
	cr_assert_eq(c.n_unresolved, 1);
	cr_expect_str_eq(c.unresolved[0].path, "train_batch_size");
	cr_assert_eq(zinf_config_dump(&c, &dump), 0);
	cr_expect(strstr(dump, "\"train_micro_batch_size_per_gpu\": 4") != NULL, "%s", dump);
	free(dump);
	zinf_config_fini(&c);
	read_ok("{\"train_batch_size\": 16, \"train_micro_batch_size_per_gpu\": 4}", &in, &c);
	cr_assert_eq(c.n_unresolved, 1);
	cr_expect_str_eq(c.unresolved[0].path, "gradient_accumulation_steps");
	cr_assert_eq(zinf_config_dump(&c, &dump), 0);
	cr_expect(strstr(dump, "\"train_micro_batch_size_per_gpu\": 4") != NULL, "%s", dump);
	free(dump);
	zinf_config_fini(&c);
	in.flags = 0;
	read_bad("{\"train_batch_size\": 16, \"train_micro_batch_size_per_gpu\": 4}", &in);
	expect_log(
		"gradient_accumulation_steps: not given: DeepSpeed derives it from the world size");
}

Test(config, ds_zero1)
{
	struct zinf_config_inputs in;
	struct zinf_train_config c;
	zinf_config_inputs_init(&in);
	in.world_size = 4;
	zinf_config_init(&c);
	cr_assert_eq(zinf_config_read_file(ZINF_TEST_CONFIGS "/ds_zero1.json", &in, &c), 0, "%s",
		     logbuf);
	cr_expect_eq(c.train_micro_batch_size_per_gpu, 8, "derived: 64 / 4 ranks / 2");
	cr_expect_eq(c.engine.optimizer.kind, ZINF_OPTIM_ADAMW,
		     "DeepSpeed's \"Adam\" is AdamW unless adam_w_mode is false");
	cr_expect_eq(c.engine.optimizer.lr, 0.00015f);
	cr_expect_eq(c.engine.optimizer.beta1, 0.9f, "AdamW's default");
	cr_expect_eq(c.engine.dtype, ZINF_F16);
	cr_expect(c.fp16.enabled);
	cr_expect_eq(c.fp16.loss_scale, 0.0);
	cr_expect_eq(c.fp16.hysteresis, 2);
	cr_expect_eq(c.gradient_clipping, 1.0);
	cr_expect_eq(c.engine.stage, 1);
	cr_expect(!c.engine.overlap_comm, "DeepSpeed: false below stage 3");
	zinf_config_fini(&c);
}

Test(config, ds_zero2_deprecated_cpu_offload)
{
	struct zinf_config_inputs in;
	struct zinf_train_config c;
	zinf_config_inputs_init(&in);
	in.world_size = 2;
	zinf_config_init(&c);
	cr_assert_eq(zinf_config_read_file(ZINF_TEST_CONFIGS "/ds_zero2.json", &in, &c), 0, "%s",
		     logbuf);
	cr_expect_eq(c.train_batch_size, 64, "8 x 4 x 2 ranks");
	cr_expect_eq(c.engine.offload_optimizer.device, ZINF_OFFLOAD_CPU, "cpu_offload: true");
	expect_log("ds_zero2.json:37: zero_optimization.cpu_offload: deprecated by DeepSpeed: "
		   "read as \"offload_optimizer\"");
	cr_expect_eq(c.fp16.initial_scale_power, 32);
	cr_expect_eq(c.engine.optimizer.beta1, 0.8f);
	cr_expect_eq(c.engine.optimizer.weight_decay, 3e-7f);
	cr_expect_eq(c.scheduler.warmup_max_lr, 0.001);
	cr_expect_eq(c.scheduler.base_lr, (double)0.001f);
	zinf_config_fini(&c);
}

static void
check_infinity(const struct zinf_train_config *c)
{
	const struct zinf_engine_opts *e = &c->engine;
	cr_expect_eq(c->engine.gradient_accumulation_steps, 1, "derived: 16 / 2 / 8 ranks");
	cr_expect_eq(e->optimizer.kind, ZINF_OPTIM_ADAM, "adam_w_mode false");
	cr_expect_eq(e->optimizer.lr, 1e-4f);
	cr_expect_eq(e->optimizer.beta2, 0.95f);
	cr_expect_eq(e->dtype, ZINF_BF16);
	cr_expect_eq(e->stage, 3);
	cr_expect_eq(e->offload_optimizer.device, ZINF_OFFLOAD_NVME);
	cr_assert_eq(e->offload_optimizer.n_paths, 1);
	cr_expect_str_eq(e->offload_optimizer.nvme_path[0], "/local_nvme");
	cr_assert_eq(e->offload_param.n_paths, 2);
	cr_expect_str_eq(e->offload_param.nvme_path[1], "/local_nvme2");
	cr_expect_eq(e->offload_param.buffer_size, 100000000);
	cr_expect_eq(e->offload_param.max_in_cpu, 1000000000);
	cr_expect_eq(e->stage3_prefetch_bucket_size, 10000000);
	cr_expect_eq(e->reduce_bucket_size, 10000000);
	cr_expect_eq(e->aio.intra_op_parallelism, 1);
	cr_expect(e->aio.overlap_events);
	cr_expect(e->overlap_comm, "DeepSpeed: true at stage 3");
}

Test(config, ds_infinity_and_dump_round_trip)
{
	struct zinf_config_inputs in;
	struct zinf_train_config c, back;
	char *text = NULL;
	zinf_config_inputs_init(&in);
	in.world_size = 8;
	zinf_config_init(&c);
	cr_assert_eq(zinf_config_read_file(ZINF_TEST_CONFIGS "/ds_infinity.json", &in, &c), 0, "%s",
		     logbuf);
	check_infinity(&c);
	expect_log("ds_infinity.json:43: aio.thread_count: deprecated by DeepSpeed: read as "
		   "\"intra_op_parallelism\"");
	expect_log("ds_infinity.json:47: activation_checkpointing: a DeepSpeed feature zinf does "
		   "not implement; ignored");
	cr_expect_eq(n_warnings, 2, "%s", logbuf);

	cr_assert_eq(zinf_config_dump(&c, &text), 0);
	cr_expect(strstr(text, "\"intra_op_parallelism\": 1") != NULL, "%s", text);
	cr_expect(strstr(text, "\"type\": \"Adam\"") != NULL, "%s", text);
	cr_expect(strstr(text, "\"lr\": 0.0001") != NULL, "%s", text);
	cr_expect(strstr(text, "thread_count") == NULL, "older spellings are not printed");
	zinf_config_init(&back);
	cr_assert_eq(zinf_config_read_string(text, "dump", &in, &back), 0, "%s\n%s", logbuf, text);
	check_infinity(&back);
	cr_expect_eq(back.train_batch_size, c.train_batch_size);
	cr_expect_eq(back.engine.sub_group_size, c.engine.sub_group_size);
	cr_expect_eq(back.engine.stage3_model_persistence_threshold, INT64_MAX);
	free(text);
	zinf_config_fini(&back);
	zinf_config_fini(&c);
}

Test(config, hf_dump_has_resolved_values)
{
	struct zinf_config_inputs in;
	struct zinf_train_config c, back;
	char *text = NULL;
	hf_inputs(&in);
	in.hidden_size = 1024;
	zinf_config_init(&c);
	cr_assert_eq(zinf_config_read_file(ZINF_TEST_CONFIGS "/hf_zero3.json", &in, &c), 0);
	cr_assert_eq(zinf_config_dump(&c, &text), 0);
	cr_expect(strstr(text, "\"auto\"") == NULL, "no \"auto\" left:\n%s", text);
	cr_expect(strstr(text, "\"reduce_bucket_size\": 1048576") != NULL, "%s", text);
	cr_expect(strstr(text, "\"warmup_max_lr\": 3e-5") != NULL, "%s", text);
	zinf_config_inputs_init(&in);
	in.world_size = 4;
	zinf_config_init(&back);
	cr_assert_eq(zinf_config_read_string(text, "dump", &in, &back), 0, "%s", logbuf);
	cr_expect_eq(back.engine.stage3_prefetch_bucket_size, 943718, "int(0.9 x 1024^2)");
	cr_expect_eq(back.train_batch_size, 64);
	cr_expect_eq(back.engine.optimizer.eps, 1e-6f);
	free(text);
	zinf_config_fini(&back);
	zinf_config_fini(&c);
}

/* ---- errors -------------------------------------------------------------------------------- */

Test(config, misspelt_key_nearest)
{
	read_bad("{\n"
		 "  \"train_batch_size\": 8,\n"
		 "  \"zero_optimization\": {\n"
		 "    \"stgae\": 3,\n"
		 "    \"offload_optimiser\": {\"device\": \"cpu\"},\n"
		 "    \"reduce_bucket_szie\": 5e8\n"
		 "  },\n"
		 "  \"gradient_acumulation_steps\": 1\n"
		 "}\n",
		 NULL);
	expect_log("t.json:4: zero_optimization.stgae: unknown key; did you mean \"stage\"?");
	expect_log("t.json:5: zero_optimization.offload_optimiser: unknown key; did you mean "
		   "\"offload_optimizer\"?");
	expect_log("t.json:6: zero_optimization.reduce_bucket_szie: unknown key; did you mean "
		   "\"reduce_bucket_size\"?");
	expect_log("t.json:8: gradient_acumulation_steps: unknown key; did you mean "
		   "\"gradient_accumulation_steps\"?");
	expect_log("t.json: 4 errors");
}

Test(config, key_in_wrong_section)
{
	read_bad("{\"train_batch_size\": 8,\n"
		 " \"zero_optimization\": {\"stage\": 3,\n"
		 "   \"aio\": {\"block_size\": 1048576},\n"
		 "   \"offload_param\": {\"device\": \"cpu\", \"ratio\": 1}},\n"
		 " \"stage\": 2}\n",
		 NULL);
	expect_log("t.json:3: zero_optimization.aio: \"aio\" does not belong in zero_optimization: "
		   "it belongs in the top level");
	expect_log("t.json:4: zero_optimization.offload_param.ratio: \"ratio\" does not belong in "
		   "zero_optimization.offload_param: it belongs in "
		   "zero_optimization.offload_optimizer");
	expect_log("t.json:5: stage: \"stage\" does not belong in the top level: it belongs in "
		   "zero_optimization");
}

Test(config, wrong_type_and_range)
{
	read_bad("{\"train_batch_size\": 8,\n"
		 " \"zero_optimization\": {\"stage\": \"3\",\n"
		 "   \"sub_group_size\": 1.5,\n"
		 "   \"overlap_comm\": \"yes\",\n"
		 "   \"offload_optimizer\": {\"device\": \"gpu\"}},\n"
		 " \"fp16\": {\"hysteresis\": 0, \"min_loss_scale\": 0},\n"
		 " \"aio\": {\"queue_depth\": -1}\n"
		 "}\n",
		 NULL);
	expect_log("t.json:2: zero_optimization.stage: expected an integer in [0, 3], not \"3\" (a "
		   "string)");
	expect_log("t.json:3: zero_optimization.sub_group_size: expected an integer >= 0, not 1.5 "
		   "(a number)");
	expect_log("t.json:4: zero_optimization.overlap_comm: expected true or false, not \"yes\"");
	expect_log("t.json:5: zero_optimization.offload_optimizer.device: expected \"none\", "
		   "\"cpu\" or \"nvme\", not \"gpu\"");
	expect_log("t.json:6: fp16.hysteresis: 0 (an integer) is out of range: expected an integer "
		   "in [1, 4294967295]");
	expect_log("t.json:6: fp16.min_loss_scale: 0 (an integer) is out of range: expected a "
		   "number > 0");
	expect_log("t.json:7: aio.queue_depth: -1 (an integer) is out of range");
	expect_log("t.json: 7 errors");
	read_bad("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 4}}", NULL);
	expect_log("zero_optimization.stage: 4 (an integer) is out of range: expected an integer "
		   "in [0, 3]");
}

/* DeepSpeed's ge=0 sizes (runtime/zero/config.py, offload_config.py) read at 0, as DeepSpeed's
 * schema takes them (the engine gives them DeepSpeed's meaning: zinf/engine.h). */
Test(config, deepspeed_sizes_at_zero)
{
	struct zinf_train_config c;
	read_ok("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3,\n"
		" \"sub_group_size\": 0, \"reduce_bucket_size\": 0, \"allgather_bucket_size\": 0,\n"
		" \"stage3_prefetch_bucket_size\": 0, \"stage3_param_persistence_threshold\": 0,\n"
		" \"stage3_max_live_parameters\": 0, \"stage3_max_reuse_distance\": 0,\n"
		" \"offload_param\": {\"device\": \"cpu\", \"buffer_count\": 0,\n"
		"   \"buffer_size\": 0, \"max_in_cpu\": 0},\n"
		" \"offload_optimizer\": {\"device\": \"cpu\", \"buffer_count\": 0}}}",
		NULL, &c);
	const struct zinf_engine_opts *e = &c.engine;
	cr_expect_eq(e->sub_group_size, 0);
	cr_expect_eq(e->reduce_bucket_size, 0);
	cr_expect_eq(e->allgather_bucket_size, 0);
	cr_expect_eq(e->stage3_prefetch_bucket_size, 0);
	cr_expect_eq(e->stage3_max_live_parameters, 0);
	cr_expect_eq(e->offload_param.buffer_count, 0);
	cr_expect_eq(e->offload_param.buffer_size, 0);
	cr_expect_eq(e->offload_optimizer.buffer_count, 0);
	cr_expect_eq(n_errors + n_warnings, 0, "%s", logbuf);
	zinf_config_fini(&c);
}

Test(config, integers_written_as_floats)
{
	struct zinf_train_config c;
	read_ok("{\"train_batch_size\": 8.0, \"zero_optimization\": {\"stage\": 3.0, "
		"\"stage3_max_live_parameters\": 3e9, \"reduce_bucket_size\": 5e8}}",
		NULL, &c);
	cr_expect_eq(c.train_batch_size, 8);
	cr_expect_eq(c.engine.stage, 3);
	cr_expect_eq(c.engine.stage3_max_live_parameters, 3000000000ull);
	cr_expect_eq(c.engine.reduce_bucket_size, 500000000);
	zinf_config_fini(&c);
}

/* An integer wider than its field is an error naming the key, the value and the range, never a
 * truncated or wrapped value: the reals the key tables' widest bounds round to (2^63 for int64
 * fields, 2^64 for uint64 ones), a batch product past 2^63 - 1 (it once wrapped to a batch the
 * check then accepted), "auto" products of the inputs past it. */
Test(config, integers_past_their_field)
{
	struct zinf_train_config c;
	struct zinf_config_inputs in;
	read_bad("{\"train_batch_size\": 8,\n"
		 " \"zero_optimization\": {\"sub_group_size\": 1.8446744073709552e19}}",
		 NULL);
	expect_log("t.json:2: zero_optimization.sub_group_size: 1.8446744073709552e19 (a number) "
		   "is out of range: expected an integer in [0, 18446744073709551615]");
	read_bad("{\"train_micro_batch_size_per_gpu\": 9.2233720368547758e18}", NULL);
	expect_log("train_micro_batch_size_per_gpu: 9.2233720368547758e18 (a number) is out of "
		   "range: expected an integer in [1, 9223372036854775807]");
	/* the largest double below 2^64 fits */
	read_ok("{\"train_batch_size\": 8, \"zero_optimization\": {\"sub_group_size\": "
		"1.8446744073709550e19}}",
		NULL, &c);
	cr_expect_eq(c.engine.sub_group_size, 18446744073709549568ull);
	zinf_config_fini(&c);
	/* 2^62 x 4 wraps to 0; (2^62 + 1) x 4 to 4, which matched train_batch_size 4 */
	read_bad("{\"train_micro_batch_size_per_gpu\": 4611686018427387904,\n"
		 " \"gradient_accumulation_steps\": 4}",
		 NULL);
	expect_log("train_micro_batch_size_per_gpu: train_micro_batch_size_per_gpu "
		   "4611686018427387904 x gradient_accumulation_steps 4 x world size 1 is past "
		   "9223372036854775807");
	read_bad("{\"train_batch_size\": 4, \"train_micro_batch_size_per_gpu\": "
		 "4611686018427387905, \"gradient_accumulation_steps\": 4}",
		 NULL);
	expect_log("train_batch_size: train_micro_batch_size_per_gpu 4611686018427387905 x "
		   "gradient_accumulation_steps 4 x world size 1 is past 9223372036854775807");
	/* "auto" from inputs whose product is past int64 */
	zinf_config_inputs_init(&in);
	in.micro_batch = 1ll << 62;
	in.grad_accum = 4;
	in.hidden_size = 1ull << 32;
	read_bad("{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": 1,\n"
		 " \"zero_optimization\": {\"reduce_bucket_size\": \"auto\",\n"
		 "   \"stage3_prefetch_bucket_size\": \"auto\"}}",
		 &in);
	expect_log("t.json:1: train_batch_size: is \"auto\": micro_batch 4611686018427387904 x "
		   "grad_accum 4 x world size 1 is past 2^63 - 1");
	expect_log("t.json:2: zero_optimization.reduce_bucket_size: is \"auto\": the hidden size "
		   "4294967296 makes it 1.845e+19, past 2^63 - 1");
	expect_log("t.json:3: zero_optimization.stage3_prefetch_bucket_size: is \"auto\": the "
		   "hidden size 4294967296 makes it 1.66e+19, past 2^63 - 1");
}

Test(config, batch_inconsistent)
{
	struct zinf_config_inputs in;
	zinf_config_inputs_init(&in);
	in.world_size = 2;
	read_bad("{\"train_batch_size\": 32,\n \"train_micro_batch_size_per_gpu\": 4,\n"
		 " \"gradient_accumulation_steps\": 2}",
		 &in);
	expect_log(
		"t.json:1: train_batch_size: train_batch_size 32 != "
		"train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 2 x world size 2 "
		"(= 16)");
	in.world_size = 1;
	read_bad("{\"train_batch_size\": 10, \"train_micro_batch_size_per_gpu\": 4}", &in);
	expect_log(
		"train_batch_size 10 != train_micro_batch_size_per_gpu 4 x "
		"gradient_accumulation_steps 2 x world size 1 (= 8); gradient_accumulation_steps "
		"derived as 10 / 4 / 1 = 2");
	read_bad("{\"gradient_accumulation_steps\": 4}", &in);
	expect_log("neither train_batch_size nor train_micro_batch_size_per_gpu is given");
}

Test(config, batch_derived_as_deepspeed)
{
	struct zinf_config_inputs in;
	struct zinf_train_config c;
	zinf_config_inputs_init(&in);
	in.world_size = 4;
	read_ok("{\"train_batch_size\": 32, \"gradient_accumulation_steps\": 2}", &in, &c);
	cr_expect_eq(c.train_micro_batch_size_per_gpu, 4, "32 / 4 / 2");
	read_ok("{\"train_micro_batch_size_per_gpu\": 3}", &in, &c);
	cr_expect_eq(c.train_batch_size, 12, "3 x 4 ranks, accumulation 1");
	cr_expect_eq(c.engine.gradient_accumulation_steps, 1);
	read_ok("{\"train_batch_size\": 12}", &in, &c);
	cr_expect_eq(c.train_micro_batch_size_per_gpu, 3);
	read_ok("{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 5}", &in,
		&c);
	cr_expect_eq(c.train_batch_size, 40);
	zinf_config_fini(&c);
}

Test(config, nvme_without_path_and_offload_below_stage3)
{
	read_bad("{\"train_batch_size\": 8,\n"
		 " \"zero_optimization\": {\n"
		 "   \"stage\": 2,\n"
		 "   \"offload_param\": {\"device\": \"cpu\"},\n"
		 "   \"offload_optimizer\": {\n"
		 "      \"device\": \"nvme\"}}}\n",
		 NULL);
	expect_log(
		"t.json:5: zero_optimization.offload_optimizer.nvme_path: device is \"nvme\" but "
		"nvme_path is not given");
	expect_log("t.json:4: zero_optimization.offload_param.device: parameter offload (device "
		   "\"cpu\") needs zero_optimization.stage 3; the stage is 2");
	read_bad("{\"train_batch_size\": 8, \"zero_optimization\": {\"offload_optimizer\": "
		 "{\"device\": \"cpu\"}}}",
		 NULL);
	expect_log("optimizer offload (device \"cpu\") needs zero_optimization.stage 1, 2 or 3");
}

Test(config, fp16_and_bf16)
{
	read_bad("{\"train_batch_size\": 8,\n \"fp16\": {\"enabled\": true},\n"
		 " \"bf16\": {\"enabled\": true}}",
		 NULL);
	expect_log("t.json:3: bf16.enabled: fp16.enabled and bf16.enabled are both true");
}

Test(config, malformed_json_line_and_column)
{
	read_bad("{\n  \"train_batch_size\": 8\n  \"fp16\": {}\n}\n", NULL);
	expect_log("t.json:3:8: malformed JSON: '}' expected near '\"fp16\"'");
	read_bad("{\"train_batch_size\": 8, \"train_batch_size\": 8}", NULL);
	expect_log("t.json:1:42: malformed JSON: duplicate object key near '\"train_batch_size\"'");
	read_bad("[1, 2]", NULL);
	expect_log("t.json: the top level must be an object");
}

Test(config, non_breaking_space_named)
{
	/* line 3: two spaces, a NO-BREAK SPACE (column 3), then the key; line 4 quotes from a
	   word processor. A NO-BREAK SPACE inside a string is data and is left alone. */
	read_bad(
		"{\n"
		"  \"train_batch_size\": 8,\n"
		"  \xc2\xa0\"steps_per_print\": 10,\n"
		"  \xe2\x80\x9cwall_clock_breakdown\xe2\x80\x9d: false,\n"
		"  \"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\", "
		"\"nvme_path\": \"/mnt/a\xc2\xa0"
		"b\"}}\n"
		"}\n",
		NULL);
	expect_log("t.json:3:3: U+00A0 NO-BREAK SPACE outside a string");
	expect_log("t.json:4:3: U+201C LEFT DOUBLE QUOTATION MARK");
	expect_log("t.json:4:24: U+201D RIGHT DOUBLE QUOTATION MARK");
	cr_expect_eq(n_errors, 3, "only the three outside strings; log:\n%s", logbuf);
}

/* A million unknown keys, one per line (made here, not committed): read in linear time (it took
 * minutes when every message looked its line up in the whole file), the first CFG_SHOWN (20)
 * named with their lines, the rest counted. */
Test(config, a_million_unknown_keys)
{
	enum { N = 1000000 };
	size_t cap = (size_t)N * 16 + 64, len = 0;
	char *text = malloc(cap);
	cr_assert_not_null(text);
	len += (size_t)snprintf(text + len, cap - len, "{\"train_batch_size\": 1");
	for (int i = 0; i < N; i++) {
		len += (size_t)snprintf(text + len, cap - len, ",\n\"k%07d\": 0", i);
	}
	snprintf(text + len, cap - len, "}\n");
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	read_bad(text, NULL);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
	free(text);
	expect_log("t.json:2: k0000000: unknown key (not a DeepSpeed setting");
	expect_log("t.json:21: k0000019: unknown key");
	cr_expect(strstr(logbuf, "k0000020") == NULL, "the 21st is only counted:\n%s", logbuf);
	expect_log("t.json: 1000000 errors (the first 20 shown)");
	cr_expect_eq(n_errors, 21, "20 keys and the count; log:\n%s", logbuf);
	/* about 1 s here (jansson's parse is most of it); quadratic work would take hours */
	cr_expect_lt(s, 60.0, "%.1f s", s);
}

/* The same bound for the non-ASCII characters the scan before jansson names. */
Test(config, many_non_ascii_characters)
{
	char text[4096] = "{";
	for (int i = 0; i < 30; i++) {
		strcat(text, "\xc2\xa0\n");
	}
	strcat(text, "\"train_batch_size\": 1}");
	read_bad(text, NULL);
	expect_log("t.json:20:1: U+00A0 NO-BREAK SPACE");
	cr_expect(strstr(logbuf, "t.json:21:1:") == NULL, "%s", logbuf);
	expect_log("t.json: 30 non-ASCII characters outside strings (the first 20 named)");
	cr_expect_eq(n_errors, 21, "%s", logbuf);
}

Test(config, non_ascii_inside_strings)
{
	/* inside strings they are legal JSON, so jansson accepts them: the key and the value are
	   what is wrong, and the messages show the character */
	read_bad("{\"train_batch_size\": 8,\n"
		 " \"zero_optimization\": {\"stage\xc2\xa0\": 3,\n"
		 "  \"offload_optimizer\": {\"device\": \"cpu\xc2\xa0\"}}}",
		 NULL);
	expect_log(
		"t.json:2: zero_optimization.stage\xc2\xa0: unknown key: character 6 of the name "
		"is U+00A0 NO-BREAK SPACE");
	expect_log("t.json:3: zero_optimization.offload_optimizer.device: expected \"none\", "
		   "\"cpu\" or \"nvme\", not \"cpu\\u00A0\" (a string)");
}

Test(config, optimizers)
{
	struct zinf_train_config c;
	read_bad("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"OneBitAdam\", \"params\": "
		 "{\"lr\": 1e-3}}}",
		 NULL);
	expect_log("optimizer.type: optimizer \"OneBitAdam\" is not implemented by zinf");
	read_bad("{\"train_batch_size\": 8, \"optimizer\": \"Adam\"}", NULL);
	expect_log("t.json:1: optimizer: expected an object ({\"type\": ..., \"params\": {...}}), "
		   "not \"Adam\" (a string)");
	read_bad("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Adamm\"}}", NULL);
	expect_log("unknown optimizer \"Adamm\"; did you mean \"Adam\"?");
	read_bad("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Lion\", \"params\": "
		 "{\"lr\": 1e-4, \"eps\": 1e-8}}}",
		 NULL);
	expect_log("optimizer.params.eps: \"eps\" is not a parameter of Lion");
	read_ok("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Lion\", \"params\": "
		"{\"lr\": "
		"2e-4, \"betas\": [0.95, 0.98], \"weight_decay\": 0.1}}}",
		NULL, &c);
	cr_expect_eq(c.engine.optimizer.kind, ZINF_OPTIM_LION);
	cr_expect_eq(c.engine.optimizer.beta1, 0.95f);
	cr_expect_eq(c.engine.optimizer.weight_decay, 0.1f);
	read_ok("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"adamw\", \"params\": "
		"{\"adam_w_mode\": false}}}",
		NULL, &c);
	cr_expect_eq(c.engine.optimizer.kind, ZINF_OPTIM_ADAMW, "adamw is always decoupled");
	read_ok("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Adagrad\", \"params\": "
		"{\"lr\": 0.05}}}",
		NULL, &c);
	cr_expect_eq(c.engine.optimizer.kind, ZINF_OPTIM_ADAGRAD);
	cr_expect_eq(c.engine.optimizer.lr, 0.05f);
	cr_expect_eq(c.engine.optimizer.eps, 1e-10f, "Adagrad's default");
	zinf_config_fini(&c);
}

Test(config, schedulers)
{
	struct zinf_train_config c;
	read_bad("{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"warmuplr\"}}", NULL);
	expect_log("scheduler.type: \"warmuplr\" (a string) is not a schedule; did you mean "
		   "\"WarmupLR\"?");
	read_bad("{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"WarmupDecayLR\", "
		 "\"params\": {\"warmup_num_steps\": 10, \"cycle_min_lr\": 0.1}}}",
		 NULL);
	expect_log("scheduler.params.total_num_steps: required by WarmupDecayLR");
	expect_log("scheduler.params.cycle_min_lr: \"cycle_min_lr\" is not a parameter of "
		   "WarmupDecayLR");
	read_ok("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
		"{\"lr\": "
		"0.01}}, \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": "
		"{\"total_num_steps\": 1e3, \"warmup_num_steps\": 100, \"warmup_type\": "
		"\"linear\"}}}",
		NULL, &c);
	cr_expect_eq(c.scheduler.type, ZINF_SCHED_WARMUP_COSINE);
	cr_expect_eq(c.scheduler.total_num_steps, 1000);
	cr_expect_eq(c.scheduler.warmup_type, ZINF_WARMUP_LINEAR);
	cr_expect_eq(c.scheduler.base_lr, (double)0.01f, "the optimizer's lr");
	cr_expect_eq(zinf_schedule_lr(&c.scheduler, 50), (double)0.01f * 0.5);
	read_ok("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
		"{\"lr\": "
		"0.02}}, \"scheduler\": {\"type\": \"WarmupLR\"}}",
		NULL, &c);
	cr_expect_eq(c.scheduler.warmup_max_lr, (double)0.02f,
		     "WarmupLR: max is the optimizer's lr");
	zinf_config_fini(&c);
}

Test(config, auto_where_not_resolvable)
{
	read_bad("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": \"auto\"}}", NULL);
	expect_log("zero_optimization.stage: \"auto\" is not accepted here");
}

Test(config, unimplemented_features_warn_once)
{
	struct zinf_train_config c;
	read_ok("{\"train_batch_size\": 8,\n \"flops_profiler\": {\"enabled\": true},\n"
		" \"tensorboard\": {\"enabled\": false},\n \"comms_logger\": {\"enabled\": true},\n"
		" \"zero_optimization\": {\"stage\": 2, \"zero_quantized_weights\": true,\n"
		" \"zero_hpz_partition_size\": 1, \"mics_shard_size\": -1, \"legacy_stage1\": "
		"false}}",
		NULL, &c);
	expect_log("W t.json:2: flops_profiler: a DeepSpeed feature zinf does not implement; "
		   "ignored");
	expect_log("W t.json:4: comms_logger: a DeepSpeed feature");
	expect_log("W t.json:5: zero_optimization.zero_quantized_weights: a DeepSpeed feature");
	cr_expect_eq(n_warnings, 3,
		     "tensorboard, hpZ, MiCS, legacy stage 1 off: no warning; log:\n%s", logbuf);
	zinf_config_fini(&c);
}

Test(config, deprecated_and_new_together)
{
	read_bad("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3,\n"
		 " \"stage3_gather_fp16_weights_on_model_save\": true,\n"
		 " \"stage3_gather_16bit_weights_on_model_save\": false}}",
		 NULL);
	expect_log("t.json:2: zero_optimization.stage3_gather_fp16_weights_on_model_save: given "
		   "together with \"stage3_gather_16bit_weights_on_model_save\", which it is the "
		   "older name of: keep one");
}

Test(config, unsupported_values)
{
	read_bad("{\"train_batch_size\": 8, \"aio\": {\"use_gds\": true},\n"
		 " \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": "
		 "\"cpu\", \"ratio\": 0.5}}}",
		 NULL);
	expect_log("t.json:1: aio.use_gds: true is not supported: GPUDirect Storage");
	expect_log("t.json:2: zero_optimization.offload_optimizer.ratio: 0.5: zinf offloads all");
}

Test(config, argument_checks)
{
	struct zinf_train_config c;
	memset(&c, 0, sizeof(c));
	cr_expect_eq(zinf_config_read_string("{}", NULL, NULL, &c), -EINVAL, "not initialised");
	zinf_config_init(&c);
	cr_expect_eq(zinf_config_read_file("/nonexistent/ds_config.json", NULL, &c), -ENOENT);
	expect_log("/nonexistent/ds_config.json: cannot open");
	struct zinf_config_inputs in;
	zinf_config_inputs_init(&in);
	in.world_size = -1;
	cr_expect_eq(zinf_config_read_string("{}", NULL, &in, &c), -EINVAL);
	in.world_size = 1;
	in.flags = 2;
	cr_expect_eq(zinf_config_read_string("{}", NULL, &in, &c), -EINVAL, "unknown flag");
	zinf_config_fini(&c);
	zinf_config_fini(NULL);
}

/* An engine from a file in one call: the file's options take effect (a stage 3 config trains
 * with parameters fetched per layer); a file with errors creates nothing. */
Test(config, engine_from_file)
{
	char path[] = "/tmp/zinf-cfg-XXXXXX";
	int fd = mkstemp(path);
	cr_assert(fd >= 0);
	const char *text = "{\"train_micro_batch_size_per_gpu\": 1,\n"
			   " \"zero_optimization\": {\"stage\": 3,\n"
			   "   \"offload_optimizer\": {\"device\": \"cpu\"},\n"
			   "   \"stage3_param_persistence_threshold\": 0}}\n";
	cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	struct zinf_config_inputs in;
	zinf_config_inputs_init(&in);
	struct zinf_engine *e = NULL;
	cr_assert_eq(zinf_engine_create_from_file(path, &in, &e), 0, "%s", logbuf);
	cr_assert_not_null(e);
	cr_expect_eq(zinf_engine_world(e), 1);
	struct zinf_param_desc d;
	zinf_param_desc_init(&d);
	d.name = "w";
	d.numel = 10;
	d.layer = 0;
	cr_assert_eq(zinf_engine_add_param(e, &d), 0);
	cr_assert_eq(zinf_engine_init(e), 0, "%s", logbuf);
	/* stage 3 (from the file): the parameter has no device pointer until its layer is
	   fetched */
	void *p = NULL;
	cr_expect_eq(zinf_engine_param(e, 0, &p), -EINVAL);
	cr_assert_eq(zinf_engine_fetch(e, 0), 0);
	cr_expect_eq(zinf_engine_param(e, 0, &p), 0);
	cr_expect_not_null(p);
	cr_expect_eq(zinf_engine_release(e, 0), 0);
	zinf_engine_destroy(e);

	/* a misspelt key: the reader's error, no engine */
	fd = open(path, O_WRONLY | O_TRUNC);
	cr_assert(fd >= 0);
	text = "{\"zero_optimization\": {\"stgae\": 3}}\n";
	cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	struct zinf_engine *sentinel = (struct zinf_engine *)&in;
	e = sentinel;
	cr_expect_eq(zinf_engine_create_from_file(path, NULL, &e), -EINVAL);
	cr_expect_eq(e, sentinel, "*out untouched");
	cr_expect(strstr(logbuf, "zero_optimization.stgae") != NULL, "%s", logbuf);
	cr_expect_eq(zinf_engine_create_from_file(NULL, NULL, &e), -EINVAL);
	unlink(path);
}

/*
 * Optimizer states: zinf's extension optimizer.params.zinf_optimizer_states ("fp32", "bf16",
 * "q8": DeepSpeed has no 8-bit state) and DeepSpeed's bf16.bf16_optimizer_states (Adam's moments
 * in bf16), read into the optimizer options and dumped back (only when not fp32); a bad value,
 * a non-Adam optimizer, and both asking for different formats are refused naming the key.
 */
Test(config, optimizer_states_q8_and_bf16)
{
	struct zinf_train_config c, back;
	char *text = NULL;
	read_ok("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
		"{\"lr\": 0.001, \"zinf_optimizer_states\": \"q8\"}}}",
		NULL, &c);
	cr_assert_eq(c.engine.optimizer.state_format, ZINF_STATE_Q8);
	cr_assert_eq(c.engine.optimizer.state_dtype, ZINF_F32);
	cr_assert_eq(zinf_config_dump(&c, &text), 0);
	cr_assert(strstr(text, "\"zinf_optimizer_states\": \"q8\""), "%s", text);
	zinf_config_init(&back);
	cr_assert_eq(zinf_config_read_string(text, "dump", NULL, &back), 0, "%s", logbuf);
	cr_assert_eq(back.engine.optimizer.state_format, ZINF_STATE_Q8);
	free(text);
	zinf_config_fini(&back);
	zinf_config_fini(&c);
	read_ok("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 1}, \"bf16\": "
		"{\"enabled\": true, \"bf16_master_weights_and_grads\": true, "
		"\"bf16_optimizer_states\": true}}",
		NULL, &c);
	cr_assert_eq(c.engine.optimizer.state_dtype, ZINF_BF16);
	cr_assert_eq(c.engine.optimizer.state_format, ZINF_STATE_PLAIN);
	cr_assert_eq(zinf_config_dump(&c, &text), 0);
	cr_assert(strstr(text, "\"bf16_optimizer_states\": true"), "%s", text);
	free(text);
	zinf_config_fini(&c);
	read_ok("{\"train_batch_size\": 8}", NULL, &c);
	cr_assert_eq(c.engine.optimizer.state_dtype, ZINF_F32);
	cr_assert_eq(zinf_config_dump(&c, &text), 0);
	cr_assert(!strstr(text, "optimizer_states"), "the defaults are not spelt out: %s", text);
	free(text);
	zinf_config_fini(&c);
	read_bad("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
		 "{\"zinf_optimizer_states\": \"int8\"}}}",
		 NULL);
	expect_log("optimizer.params.zinf_optimizer_states: expected \"fp32\", \"bf16\" or \"q8\"");
	read_bad("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 1}, \"bf16\": "
		 "{\"enabled\": true, \"bf16_master_weights_and_grads\": true, "
		 "\"bf16_optimizer_states\": true}, \"optimizer\": {\"type\": \"AdamW\", "
		 "\"params\": {\"zinf_optimizer_states\": \"q8\"}}}",
		 NULL);
	expect_log("bf16.bf16_optimizer_states: true with optimizer.params.zinf_optimizer_states");
	read_bad("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Lion\", \"params\": "
		 "{\"zinf_optimizer_states\": \"q8\"}}}",
		 NULL);
	expect_log("zinf_optimizer_states");
}

/*
 * bf16.bf16_optimizer_states is taken where DeepSpeed takes it (bf16 training, ZeRO stage 1-3,
 * bf16_master_weights_and_grads true) for Adam/AdamW with no other format asked for; everywhere
 * else it is refused at config time, each refusal naming the key and what says what was wrong.
 */
Test(config, bf16_optimizer_states_only_where_deepspeed_takes_it)
{
	static const char *const bad[][2] = {
		{"\"bf16\": {\"enabled\": false, \"bf16_master_weights_and_grads\": true, "
		 "\"bf16_optimizer_states\": true}, \"zero_optimization\": {\"stage\": 2}",
		 "true without bf16.enabled"},
		{"\"fp16\": {\"enabled\": true}, \"bf16\": {\"bf16_master_weights_and_grads\": "
		 "true, \"bf16_optimizer_states\": true}, \"zero_optimization\": {\"stage\": 2}",
		 "true without bf16.enabled"},
		{"\"bf16\": {\"enabled\": true, \"bf16_master_weights_and_grads\": true, "
		 "\"bf16_optimizer_states\": true}",
		 "true at zero_optimization.stage 0"},
		{"\"bf16\": {\"enabled\": true, \"bf16_optimizer_states\": true}, "
		 "\"zero_optimization\": {\"stage\": 3}",
		 "true without bf16.bf16_master_weights_and_grads true"},
		{"\"bf16\": {\"enabled\": true, \"bf16_master_weights_and_grads\": true, "
		 "\"bf16_optimizer_states\": true}, \"zero_optimization\": {\"stage\": 2}, "
		 "\"optimizer\": {\"type\": \"Lion\", \"params\": {\"lr\": 0.001}}",
		 "true with optimizer Lion"},
		{"\"bf16\": {\"enabled\": true, \"bf16_master_weights_and_grads\": true, "
		 "\"bf16_optimizer_states\": true}, \"zero_optimization\": {\"stage\": 2}, "
		 "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"zinf_optimizer_states\": "
		 "\"fp32\"}}",
		 "true with optimizer.params.zinf_optimizer_states \"fp32\""},
	};
	char text[1024];
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		snprintf(text, sizeof(text), "{\"train_batch_size\": 8, %s}", bad[i][0]);
		logbuf[0] = 0;
		read_bad(text, NULL);
		char want[256];
		snprintf(want, sizeof(want), "bf16.bf16_optimizer_states: %s", bad[i][1]);
		expect_log(want);
	}
	/* where DeepSpeed takes it: the moments in bf16, the explicit "bf16" agreeing */
	struct zinf_train_config c;
	for (int explicit = 0; explicit < 2; explicit ++) {
		snprintf(text, sizeof(text),
			 "{\"train_batch_size\": 8, \"bf16\": {\"enabled\": true, "
			 "\"bf16_master_weights_and_grads\": true, \"bf16_optimizer_states\": "
			 "true}, "
			 "\"zero_optimization\": {\"stage\": 3}, \"optimizer\": {\"type\": "
			 "\"Adam\", "
			 "\"params\": {%s}}}",
			 explicit ? "\"zinf_optimizer_states\": \"bf16\"" : "\"lr\": 0.001");
		read_ok(text, NULL, &c);
		cr_assert_eq(c.engine.optimizer.state_dtype, ZINF_BF16, "explicit %d", explicit);
		cr_assert_eq(c.engine.optimizer.state_format, ZINF_STATE_PLAIN);
		zinf_config_fini(&c);
	}
}

/*
 * The master weight: zinf's extension optimizer.params.zinf_master_weights ("fp32" | "bf16")
 * and DeepSpeed's bf16.bf16_master_weights_and_grads (a bf16 master; was ignored), read into the
 * optimizer's master_dtype with the moments' format beside it, dumped back (only when bf16) and
 * read again; a bad value and a non-Adam optimizer are refused naming the key.
 */
Test(config, master_weights_bf16)
{
	struct zinf_train_config c, back;
	char *text = NULL;
	read_ok("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
		"{\"lr\": 0.001, \"zinf_master_weights\": \"bf16\", "
		"\"zinf_optimizer_states\": \"q8\"}}}",
		NULL, &c);
	cr_assert_eq(c.engine.optimizer.master_dtype, ZINF_BF16);
	cr_assert_eq(c.engine.optimizer.state_format, ZINF_STATE_Q8);
	cr_assert_eq(zinf_config_dump(&c, &text), 0);
	cr_assert(strstr(text, "\"zinf_master_weights\": \"bf16\""), "%s", text);
	zinf_config_init(&back);
	cr_assert_eq(zinf_config_read_string(text, "dump", NULL, &back), 0, "%s", logbuf);
	cr_assert_eq(back.engine.optimizer.master_dtype, ZINF_BF16);
	free(text);
	zinf_config_fini(&back);
	zinf_config_fini(&c);
	read_ok("{\"train_batch_size\": 8, \"bf16\": {\"enabled\": true, "
		"\"bf16_master_weights_and_grads\": true}}",
		NULL, &c);
	cr_assert_eq(c.engine.optimizer.master_dtype, ZINF_BF16);
	cr_assert_eq(c.engine.optimizer.state_dtype, ZINF_F32);
	cr_assert(c.bf16_master_weights_and_grads);
	zinf_config_fini(&c);
	read_ok("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
		"{\"zinf_master_weights\": \"fp32\"}}}",
		NULL, &c);
	cr_assert_eq(c.engine.optimizer.master_dtype, ZINF_F32);
	cr_assert_eq(zinf_config_dump(&c, &text), 0);
	cr_assert(!strstr(text, "master_weights"), "the default is not spelt out: %s", text);
	free(text);
	zinf_config_fini(&c);
	read_bad("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
		 "{\"zinf_master_weights\": \"fp16\"}}}",
		 NULL);
	expect_log("optimizer.params.zinf_master_weights: expected \"fp32\" or \"bf16\"");
	read_bad("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Lion\", \"params\": "
		 "{\"zinf_master_weights\": \"bf16\"}}}",
		 NULL);
	expect_log("zinf_master_weights");
	/* DeepSpeed's key where it does not mean zinf's bf16 master: refused by its name */
	static const char *const bad[][2] = {
		{"\"bf16\": {\"enabled\": false, \"bf16_master_weights_and_grads\": true}",
		 "true without bf16.enabled"},
		{"\"bf16\": {\"enabled\": true, \"bf16_master_weights_and_grads\": true}, "
		 "\"optimizer\": {\"type\": \"Lion\", \"params\": {\"lr\": 0.001}}",
		 "true with optimizer Lion"},
		{"\"bf16\": {\"enabled\": true, \"bf16_master_weights_and_grads\": true}, "
		 "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"zinf_master_weights\": "
		 "\"fp32\"}}",
		 "true with optimizer.params.zinf_master_weights \"fp32\""},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char text2[512];
		snprintf(text2, sizeof(text2), "{\"train_batch_size\": 8, %s}", bad[i][0]);
		read_bad(text2, NULL);
		char want[160];
		snprintf(want, sizeof(want), "bf16.bf16_master_weights_and_grads: %s", bad[i][1]);
		expect_log(want);
	}
}
