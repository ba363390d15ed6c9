/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/config_keys.c: every key of ds_config.json that zinf knows, per section, with where its
 * value goes, its type and range, and DeepSpeed's older spellings (runtime/config.py,
 * runtime/zero/config.py, runtime/zero/offload_config.py, the aio and fp16 blocks,
 * runtime/lr_schedules.py). The defaults are set in config.c (zinf_config_init), not here. Keys
 * of DeepSpeed features zinf does not implement are listed so that they are accepted with a
 * warning instead of being taken for misspellings.
 */
#include <math.h>
#include <string.h>

#include "config/config_internal.h"

#define TC(f)  offsetof(struct zinf_train_config, f)
#define EO(f)  offsetof(struct zinf_train_config, engine.f)
#define OF(f)  offsetof(struct zinf_offload_opts, f)
#define AIO(f) offsetof(struct zinf_aio_opts, f)
#define FP(f)  offsetof(struct zinf_fp16_opts, f)
#define OP(f)  offsetof(struct zinf_optimizer_opts, f)
#define SC(f)  offsetof(struct zinf_schedule_opts, f)

#define BIG  1.8446744073709552e19
#define I64M 9.2233720368547758e18
#define U32M 4294967295.0
#define I32M 2147483647.0
#define TINY 1e-300 /* "> 0" */

#define KEY(nm, st, o, ...)                                                                        \
	{                                                                                          \
		.name = (nm), .store = (st), .off = (o), __VA_ARGS__                               \
	}
#define BOOL(nm, o, ...)	    KEY(nm, ST_BOOL, o, ##__VA_ARGS__)
#define NUM(nm, st, o, lo, hi, ...) KEY(nm, st, o, .min = (lo), .max = (hi), ##__VA_ARGS__)
#define SECT(nm, o, s, ...)	    KEY(nm, ST_SECTION, o, .sub = &(s), ##__VA_ARGS__)
#define WARN(nm)		    KEY(nm, ST_NONE, 0, .flags = F_WARN)
#define WARN_OFF(nm, off)	    KEY(nm, ST_NONE, 0, .flags = F_WARN, .min = (off)) /* off: silent */
#define IGN(nm, ...)		    KEY(nm, ST_NONE, 0, .flags = F_IGNORED, ##__VA_ARGS__)
#define ALIAS(nm, st, o, to, ...)   KEY(nm, st, o, .flags = F_ALIAS, .alias = (to), ##__VA_ARGS__)
#define OLD(nm, st, o, to, ...)	    KEY(nm, st, o, .flags = F_DEPRECATED, .alias = (to), ##__VA_ARGS__)

#define SECTION(var, p, arr) const struct cfg_section var = {(p), (arr), ZINF_ARRAY_SIZE(arr)}

/* optimizer.params masks: 1 << enum zinf_optim_kind */
#define M_ADAM	  ((1u << ZINF_OPTIM_ADAM) | (1u << ZINF_OPTIM_ADAMW))
#define M_ADAGRAD (1u << ZINF_OPTIM_ADAGRAD)
#define M_LION	  (1u << ZINF_OPTIM_LION)
/* scheduler.params masks: 1 << enum zinf_sched_type */
#define M_WARM	((1u << ZINF_SCHED_WARMUP_LR) | (1u << ZINF_SCHED_WARMUP_DECAY))
#define M_DECAY (1u << ZINF_SCHED_WARMUP_DECAY)
#define M_COS	(1u << ZINF_SCHED_WARMUP_COSINE)
#define M_CYCLE (1u << ZINF_SCHED_ONE_CYCLE)
#define M_RANGE (1u << ZINF_SCHED_LR_RANGE_TEST)

static const struct cfg_key offload_param_keys[] = {
	KEY("device", ST_DEVICE, OF(device)),
	KEY("nvme_path", ST_PATHS, 0),
	NUM("buffer_count", ST_U32, OF(buffer_count), 0, U32M),
	NUM("buffer_size", ST_U64, OF(buffer_size), 0, BIG),
	NUM("max_in_cpu", ST_U64, OF(max_in_cpu), 0, BIG),
	BOOL("pin_memory", OF(pin_memory)),
};
SECTION(cfg_offload_param, "zero_optimization.offload_param", offload_param_keys);

static const struct cfg_key offload_optimizer_keys[] = {
	KEY("device", ST_DEVICE, OF(device)),
	KEY("nvme_path", ST_PATHS, 0),
	NUM("buffer_count", ST_U32, OF(buffer_count), 0, U32M),
	BOOL("pin_memory", OF(pin_memory)),
	BOOL("pipeline_read", OF(pipeline_read)),
	BOOL("pipeline_write", OF(pipeline_write)),
	BOOL("fast_init", OF(fast_init)),
	NUM("ratio", ST_F64, OF(ratio), 0, 1),
	IGN("pipeline"),
	IGN("cpuadam_cores_perc"),
	WARN("super_offload"),
};
SECTION(cfg_offload_optimizer, "zero_optimization.offload_optimizer", offload_optimizer_keys);

static const struct cfg_key zero_keys[] = {
	NUM("stage", ST_I32, EO(stage), 0, 3),
	SECT("offload_param", EO(offload_param), cfg_offload_param),
	SECT("offload_optimizer", EO(offload_optimizer), cfg_offload_optimizer),
	/* DeepSpeed's sizes are ge=0 (runtime/zero/config.py); 0 means what it means there: a
	   sub-group and a reduce bucket per parameter, one all-gather in flight, no prefetch */
	NUM("sub_group_size", ST_U64, EO(sub_group_size), 0, BIG),
	NUM("reduce_bucket_size", ST_U64, EO(reduce_bucket_size), 0, BIG, .flags = F_AUTO,
	    .auto_id = A_REDUCE_BUCKET),
	NUM("allgather_bucket_size", ST_U64, EO(allgather_bucket_size), 0, BIG),
	BOOL("overlap_comm", EO(overlap_comm)),
	BOOL("contiguous_gradients", EO(contiguous_gradients)),
	BOOL("reduce_scatter", TC(reduce_scatter)),
	BOOL("allgather_partitions", TC(allgather_partitions)),
	BOOL("round_robin_gradients", TC(round_robin_gradients)),
	BOOL("load_from_fp32_weights", TC(load_from_fp32_weights)),
	BOOL("elastic_checkpoint", TC(elastic_checkpoint)),
	BOOL("ignore_unused_parameters", TC(ignore_unused_parameters)),
	NUM("stage3_prefetch_bucket_size", ST_U64, EO(stage3_prefetch_bucket_size), 0, BIG,
	    .flags = F_AUTO, .auto_id = A_PREFETCH),
	NUM("stage3_param_persistence_threshold", ST_U64, EO(stage3_param_persistence_threshold), 0,
	    BIG, .flags = F_AUTO, .auto_id = A_PERSIST),
	NUM("stage3_model_persistence_threshold", ST_U64, EO(stage3_model_persistence_threshold), 0,
	    BIG),
	NUM("stage3_max_live_parameters", ST_U64, EO(stage3_max_live_parameters), 0, BIG),
	NUM("stage3_max_reuse_distance", ST_U64, EO(stage3_max_reuse_distance), 0, BIG),
	BOOL("stage3_gather_16bit_weights_on_model_save",
	     TC(stage3_gather_16bit_weights_on_model_save)),
	/* pydantic aliases: DeepSpeed accepts the names without the stage3_ prefix too */
	ALIAS("prefetch_bucket_size", ST_U64, EO(stage3_prefetch_bucket_size),
	      "stage3_prefetch_bucket_size", .min = 0, .max = BIG),
	ALIAS("param_persistence_threshold", ST_U64, EO(stage3_param_persistence_threshold),
	      "stage3_param_persistence_threshold", .min = 0, .max = BIG),
	ALIAS("model_persistence_threshold", ST_U64, EO(stage3_model_persistence_threshold),
	      "stage3_model_persistence_threshold", .min = 0, .max = BIG),
	ALIAS("max_live_parameters", ST_U64, EO(stage3_max_live_parameters),
	      "stage3_max_live_parameters", .min = 0, .max = BIG),
	ALIAS("max_reuse_distance", ST_U64, EO(stage3_max_reuse_distance),
	      "stage3_max_reuse_distance", .min = 0, .max = BIG),
	ALIAS("gather_16bit_weights_on_model_save", ST_BOOL,
	      TC(stage3_gather_16bit_weights_on_model_save),
	      "stage3_gather_16bit_weights_on_model_save"),
	/* DeepSpeed's deprecated spellings */
	OLD("stage3_gather_fp16_weights_on_model_save", ST_BOOL,
	    TC(stage3_gather_16bit_weights_on_model_save),
	    "stage3_gather_16bit_weights_on_model_save"),
	OLD("cpu_offload", ST_SPECIAL, 0, "offload_optimizer"),
	OLD("cpu_offload_param", ST_SPECIAL, 0, "offload_param"),
	OLD("cpu_offload_params", ST_SPECIAL, 0, "offload_param"),
	OLD("cpu_offload_use_pin_memory", ST_SPECIAL, 0, "offload_param"),
	/* no effect on what zinf computes */
	IGN("use_multi_rank_bucket_allreduce"),
	IGN("memory_efficient_linear"),
	IGN("pipeline_loading_checkpoint"),
	IGN("override_module_apply"),
	IGN("log_trace_cache_warnings"),
	IGN("stage3_module_granularity_threshold"),
	IGN("module_granularity_threshold"),
	IGN("use_all_reduce_for_fetch_params"),
	IGN("stage3_use_all_reduce_for_fetch_params"),
	/* ZeRO++, MiCS and the legacy stage 1: not implemented */
	WARN("legacy_stage1"),
	WARN_OFF("zero_hpz_partition_size", 1),
	WARN("zero_quantized_weights"),
	WARN("zero_quantized_nontrainable_weights"),
	WARN("zero_quantized_gradients"),
	WARN("zeropp_loco_param"),
	WARN_OFF("mics_shard_size", -1),
	WARN("mics_hierarchical_params_gather"),
	WARN("zenflow"),
};
SECTION(cfg_zero, "zero_optimization", zero_keys);

static const struct cfg_key aio_keys[] = {
	NUM("block_size", ST_U32, AIO(block_size), 1, U32M),
	NUM("queue_depth", ST_U32, AIO(queue_depth), 1, U32M),
	NUM("intra_op_parallelism", ST_U32, AIO(intra_op_parallelism), 1, U32M),
	OLD("thread_count", ST_U32, AIO(intra_op_parallelism), "intra_op_parallelism", .min = 1,
	    .max = U32M),
	BOOL("single_submit", AIO(single_submit)),
	BOOL("overlap_events", AIO(overlap_events)),
	BOOL("use_gds", AIO(use_gds), .flags = F_NOT_TRUE,
	     .note = "GPUDirect Storage is not supported by zinf"),
};
SECTION(cfg_aio, "aio", aio_keys);

static const struct cfg_key fp16_keys[] = {
	BOOL("enabled", FP(enabled), .flags = F_AUTO, .auto_id = A_FP16),
	BOOL("auto_cast", FP(auto_cast)),
	NUM("loss_scale", ST_F64, FP(loss_scale), 0, INFINITY),
	NUM("initial_scale_power", ST_U32, FP(initial_scale_power), 0, 1023),
	NUM("loss_scale_window", ST_U32, FP(loss_scale_window), 1, U32M),
	NUM("hysteresis", ST_U32, FP(hysteresis), 1, U32M),
	BOOL("consecutive_hysteresis", FP(consecutive_hysteresis)),
	NUM("min_loss_scale", ST_F64, FP(min_loss_scale), TINY, INFINITY),
	BOOL("fp16_master_weights_and_grads", 0, .flags = F_NOT_TRUE | F_IGNORED,
	     .note = "zinf keeps fp32 master weights and gradients"),
};
SECTION(cfg_fp16, "fp16", fp16_keys);

static const struct cfg_key bf16_keys[] = {
	BOOL("enabled", TC(bf16_enabled), .flags = F_AUTO, .auto_id = A_BF16),
	IGN("immediate_grad_update"),
	IGN("check_grad_overflow"),
	KEY("bf16_master_weights_and_grads", ST_FLAG, TC(bf16_master_weights_and_grads)),
	KEY("bf16_optimizer_states", ST_FLAG, TC(bf16_optimizer_states)),
};
SECTION(cfg_bf16, "bf16", bf16_keys);

static const struct cfg_key optimizer_params_keys[] = {
	NUM("lr", ST_F32, OP(lr), 0, INFINITY, .flags = F_AUTO, .auto_id = A_LR),
	KEY("betas", ST_BETAS, 0, .flags = F_AUTO, .auto_id = A_BETAS, .mask = M_ADAM | M_LION),
	NUM("eps", ST_F32, OP(eps), 0, INFINITY, .flags = F_AUTO, .auto_id = A_EPS,
	    .mask = M_ADAM | M_ADAGRAD),
	NUM("weight_decay", ST_F32, OP(weight_decay), 0, INFINITY, .flags = F_AUTO,
	    .auto_id = A_WD),
	BOOL("bias_correction", OP(bias_correction), .mask = M_ADAM),
	KEY("adam_w_mode", ST_SPECIAL, 0, .mask = M_ADAM), /* read with the type */
	NUM("lr_decay", ST_F32, OP(lr_decay), 0, INFINITY, .mask = M_ADAGRAD),
	BOOL("amsgrad", 0, .flags = F_NOT_TRUE | F_IGNORED, .mask = M_ADAM,
	     .note = "AMSGrad is not implemented by zinf"),
	IGN("torch_adam", .mask = M_ADAM),
	IGN("set_grad_none"),
	IGN("fp32_optimizer_states"),
	/* a zinf extension (DeepSpeed has no 8-bit optimizer state): "fp32", "bf16" or "q8" */
	KEY("zinf_optimizer_states", ST_STATES, 0, .mask = M_ADAM),
	/* a zinf extension: the master weight "fp32" or "bf16" (stochastic rounding) */
	KEY("zinf_master_weights", ST_MASTER, OP(master_dtype), .mask = M_ADAM),
};
SECTION(cfg_optimizer_params, "optimizer.params", optimizer_params_keys);

static const struct cfg_key optimizer_keys[] = {
	KEY("type", ST_SPECIAL, 0),
	KEY("params", ST_SPECIAL, 0, .sub = &cfg_optimizer_params),
	IGN("legacy_fusion"),
};
SECTION(cfg_optimizer, "optimizer", optimizer_keys);

static const struct cfg_key scheduler_params_keys[] = {
	NUM("warmup_min_lr", ST_F64, SC(warmup_min_lr), 0, INFINITY, .flags = F_AUTO,
	    .auto_id = A_WARMUP_MIN_LR, .mask = M_WARM),
	NUM("warmup_max_lr", ST_F64, SC(warmup_max_lr), 0, INFINITY, .flags = F_AUTO,
	    .auto_id = A_WARMUP_MAX_LR, .mask = M_WARM),
	NUM("warmup_num_steps", ST_I64, SC(warmup_num_steps), 0, I64M, .flags = F_AUTO,
	    .auto_id = A_WARMUP_STEPS, .mask = M_WARM | M_COS),
	KEY("warmup_type", ST_WARMUP_TYPE, SC(warmup_type), .mask = M_WARM | M_COS),
	NUM("total_num_steps", ST_I64, SC(total_num_steps), 1, I64M, .flags = F_AUTO,
	    .auto_id = A_TOTAL_STEPS, .mask = M_DECAY | M_COS),
	NUM("warmup_min_ratio", ST_F64, SC(warmup_min_ratio), 0, 1, .mask = M_COS),
	NUM("cos_min_ratio", ST_F64, SC(cos_min_ratio), 0, 1, .mask = M_COS),
	NUM("cycle_min_lr", ST_F64, SC(cycle_min_lr), 0, INFINITY, .mask = M_CYCLE),
	NUM("cycle_max_lr", ST_F64, SC(cycle_max_lr), 0, INFINITY, .mask = M_CYCLE),
	NUM("decay_lr_rate", ST_F64, SC(decay_lr_rate), 0, INFINITY, .mask = M_CYCLE),
	NUM("cycle_first_step_size", ST_F64, SC(cycle_first_step_size), 1, INFINITY,
	    .mask = M_CYCLE),
	NUM("cycle_second_step_size", ST_F64, SC(cycle_second_step_size), 1, INFINITY,
	    .mask = M_CYCLE),
	NUM("cycle_first_stair_count", ST_I64, SC(cycle_first_stair_count), 0, I64M,
	    .mask = M_CYCLE),
	NUM("cycle_second_stair_count", ST_I64, SC(cycle_second_stair_count), 0, I64M,
	    .mask = M_CYCLE),
	NUM("decay_step_size", ST_F64, SC(decay_step_size), 0, INFINITY, .mask = M_CYCLE),
	BOOL("cycle_momentum", SC(cycle_momentum), .mask = M_CYCLE),
	NUM("cycle_min_mom", ST_F64, SC(cycle_min_mom), 0, 1, .mask = M_CYCLE),
	NUM("cycle_max_mom", ST_F64, SC(cycle_max_mom), 0, 1, .mask = M_CYCLE),
	NUM("decay_mom_rate", ST_F64, SC(decay_mom_rate), 0, INFINITY, .mask = M_CYCLE),
	NUM("lr_range_test_min_lr", ST_F64, SC(lr_range_test_min_lr), 0, INFINITY, .mask = M_RANGE),
	NUM("lr_range_test_step_size", ST_F64, SC(lr_range_test_step_size), 1, INFINITY,
	    .mask = M_RANGE),
	NUM("lr_range_test_step_rate", ST_F64, SC(lr_range_test_step_rate), 0, INFINITY,
	    .mask = M_RANGE),
	BOOL("lr_range_test_staircase", SC(lr_range_test_staircase), .mask = M_RANGE),
	IGN("last_batch_iteration"),
};
SECTION(cfg_scheduler_params, "scheduler.params", scheduler_params_keys);

static const struct cfg_key scheduler_keys[] = {
	KEY("type", ST_SPECIAL, 0),
	KEY("params", ST_SPECIAL, 0, .sub = &cfg_scheduler_params),
};
SECTION(cfg_scheduler, "scheduler", scheduler_keys);

static const struct cfg_key top_keys[] = {
	NUM("train_batch_size", ST_I64, TC(train_batch_size), 1, I64M, .flags = F_AUTO,
	    .auto_id = A_TRAIN_BATCH),
	NUM("train_micro_batch_size_per_gpu", ST_I64, TC(train_micro_batch_size_per_gpu), 1, I64M,
	    .flags = F_AUTO, .auto_id = A_MICRO),
	NUM("gradient_accumulation_steps", ST_U32, EO(gradient_accumulation_steps), 1, U32M,
	    .flags = F_AUTO, .auto_id = A_GAS),
	NUM("gradient_clipping", ST_F64, TC(gradient_clipping), 0, INFINITY, .flags = F_AUTO,
	    .auto_id = A_CLIP),
	NUM("steps_per_print", ST_I64, TC(steps_per_print), 1, I64M),
	BOOL("wall_clock_breakdown", TC(wall_clock_breakdown)),
	BOOL("prescale_gradients", TC(prescale_gradients)),
	NUM("gradient_predivide_factor", ST_F64, TC(gradient_predivide_factor), TINY, INFINITY),
	SECT("zero_optimization", 0, cfg_zero),
	SECT("aio", EO(aio), cfg_aio),
	SECT("fp16", TC(fp16), cfg_fp16),
	SECT("bf16", 0, cfg_bf16),
	SECT("bfloat16", 0, cfg_bf16, .flags = F_DEPRECATED, .alias = "bf16"),
	KEY("optimizer", ST_SPECIAL, 0, .sub = &cfg_optimizer),
	KEY("scheduler", ST_SPECIAL, 0, .sub = &cfg_scheduler),
	/* no effect on what zinf computes */
	IGN("zero_allow_untested_optimizer"),
	IGN("zero_force_ds_cpu_optimizer"),
	IGN("dataloader_drop_last"),
	IGN("vocabulary_size"),
	IGN("timers"),
	IGN("use_data_before_expert_parallelism_"),
	/* DeepSpeed features zinf does not implement */
	WARN("activation_checkpointing"),
	WARN("flops_profiler"),
	WARN("tensorboard"),
	WARN("wandb"),
	WARN("csv_monitor"),
	WARN("comet"),
	WARN("comms_logger"),
	WARN("monitor_config"),
	WARN("autotuning"),
	WARN("elasticity"),
	WARN("pipeline"),
	WARN("curriculum_learning"),
	WARN("data_efficiency"),
	WARN("compression_training"),
	WARN("sparse_attention"),
	WARN("amp"),
	WARN("sparse_gradients"),
	WARN("communication_data_type"),
	WARN("seq_parallel_communication_data_type"),
	WARN("sequence_parallel_size"),
	WARN("disable_allgather"),
	WARN("dump_state"),
	WARN("memory_breakdown"),
	WARN("fp32_allreduce"),
	WARN("checkpoint"),
	WARN("data_types"),
	WARN("nebula"),
	WARN("eigenvalue"),
	WARN("progressive_layer_drop"),
	WARN("quantize_training"),
	WARN("weight_quantization"),
	WARN("hybrid_engine"),
	WARN("graph_harvesting"),
	WARN("compile"),
	WARN("tensor_parallel"),
	WARN("torch_autocast"),
};
SECTION(cfg_top, "", top_keys);

const struct cfg_section *const cfg_all_sections[] = {
	&cfg_top,
	&cfg_zero,
	&cfg_offload_param,
	&cfg_offload_optimizer,
	&cfg_aio,
	&cfg_fp16,
	&cfg_bf16,
	&cfg_optimizer,
	&cfg_optimizer_params,
	&cfg_scheduler,
	&cfg_scheduler_params,
};
const size_t cfg_n_sections = ZINF_ARRAY_SIZE(cfg_all_sections);

const struct cfg_key *
cfg_find_key(const struct cfg_section *sec, const char *name)
{
	for (size_t i = 0; i < sec->n; i++) {
		if (strcmp(sec->keys[i].name, name) == 0) {
			return &sec->keys[i];
		}
	}
	return NULL;
}
