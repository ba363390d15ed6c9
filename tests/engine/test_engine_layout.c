/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/test_engine_layout.c: the public option and statistics structs keep the offsets
 * and sizes they had (STYLE's size rule: a struct grows only at its end, and a struct embedded in
 * another never grows, or every later field of the outer one moves and a caller built against
 * the older header passes fields the library reads at other offsets). The numbers are those of
 * the headers at commit a97cc3a (x86-64, LP64), before the q8 optimizer state and the parameter
 * cache; the fields added since then are pinned at where the old struct ended (or, for
 * zinf_optimizer_opts, in its first reserved bytes). A change that moves one fails to compile.
 */
#include <criterion/criterion.h>
#include <stddef.h>
#include <string.h>

#include "zinf/blocks/offload.h"
#include "zinf/blocks/optimizer.h"
#include "zinf/config.h"
#include "zinf/engine.h"

#define PIN(type, field, off) _Static_assert(offsetof(type, field) == (off), #type "." #field)
#define PIN_SIZE(type, bytes) _Static_assert(sizeof(type) == (bytes), "sizeof " #type)

/* embedded in struct zinf_engine_opts: never grows */
PIN_SIZE(struct zinf_optimizer_opts, 72);
PIN(struct zinf_optimizer_opts, seed, 24);
PIN(struct zinf_optimizer_opts, bias_correction, 56);
PIN(struct zinf_optimizer_opts, state_format, 57); /* was reserved[0] */
PIN(struct zinf_optimizer_opts, master_dtype, 58); /* was reserved[1] */
PIN(struct zinf_optimizer_opts, reserved, 59);
PIN(struct zinf_optimizer_opts, simd, 64);

/* embedded in struct zinf_train_config: never grows */
PIN_SIZE(struct zinf_engine_opts, 536);
PIN(struct zinf_engine_opts, offload_param, 16);
PIN(struct zinf_engine_opts, offload_optimizer, 120);
PIN(struct zinf_engine_opts, sub_group_size, 224);
PIN(struct zinf_engine_opts, gradient_accumulation_steps, 296);
PIN(struct zinf_engine_opts, optimizer, 304);
PIN(struct zinf_engine_opts, dtype, 376);
PIN(struct zinf_engine_opts, aio, 384);
PIN(struct zinf_engine_opts, device_backend, 400);
PIN(struct zinf_engine_opts, comm_backend, 416);
PIN(struct zinf_engine_opts, io_backend, 456);
PIN(struct zinf_engine_opts, swap_prefix, 464);
PIN(struct zinf_engine_opts, gradient_clipping, 480);
PIN(struct zinf_engine_opts, fp16, 488);
PIN(struct zinf_engine_opts, optimizer_schedule, 529);
PIN_SIZE(struct zinf_offload_opts, 104);
PIN_SIZE(struct zinf_aio_opts, 16);
PIN_SIZE(struct zinf_fp16_opts, 40);
PIN_SIZE(struct zinf_schedule_opts, 192);

/* top-level: the old fields stay, the new ones start where the old struct ended */
PIN(struct zinf_train_config, engine, 8);
PIN(struct zinf_train_config, train_batch_size, 544);
PIN(struct zinf_train_config, fp16, 608);
PIN(struct zinf_train_config, scheduler, 648);
PIN(struct zinf_train_config, n_resolved, 840);
PIN(struct zinf_train_config, unresolved, 6480);
PIN(struct zinf_train_config, bf16_optimizer_states, 9296); /* a97cc3a: 9296 bytes */
PIN(struct zinf_engine_stats, param_nvme_read_bytes, 224);  /* a97cc3a: 224 bytes */
PIN(struct zinf_pool_opts, cpu_key, 72);		    /* a97cc3a: 72 bytes */
PIN(struct zinf_store_opts, cache_bytes, 48);		    /* a97cc3a: 48 bytes */
PIN(struct zinf_store_stats, cache_bytes, 80);		    /* a97cc3a: 80 bytes */
/* the shared bf16 master: the plan's and the step's new fields at the old ends (7a224a2: 104,
   136 and 29 bytes used of 32), the step's old reserved bytes at 100 holding external_parts */
PIN(struct zinf_engine_plan, speculation_bytes, 96);
PIN(struct zinf_engine_plan, optim_nvme_state_bytes, 104);
PIN_SIZE(struct zinf_engine_plan, 112);
PIN(struct zinf_step_opts, schedule, 28);
PIN(struct zinf_step_opts, external_parts, 100);
PIN(struct zinf_step_opts, copy_fn, 104);
PIN(struct zinf_step_opts, before_fn, 120);
PIN(struct zinf_step_opts, before_ctx, 128);
PIN(struct zinf_step_opts, fill_fn, 136);
PIN(struct zinf_step_opts, fill_ctx, 144);
PIN_SIZE(struct zinf_step_opts, 152);
PIN(struct zinf_step_part_info, external, 29);
PIN_SIZE(struct zinf_step_part_info, 32);

/* The same at run time, so that the suite names it: an engine option read at the offset an
 * older caller wrote it. */
Test(engine_layout, engine_options_after_the_optimizer_keep_their_offsets)
{
	struct zinf_engine_opts o;
	zinf_engine_opts_init(&o);
	unsigned char *b = (unsigned char *)&o;
	o.dtype = ZINF_BF16;
	o.aio.queue_depth = 77;
	enum zinf_dtype d;
	uint32_t qd;
	memcpy(&d, b + 376, sizeof(d));
	memcpy(&qd, b + 384 + 4, sizeof(qd));
	cr_assert_eq(d, ZINF_BF16);
	cr_assert_eq(qd, 77u);
	cr_assert_eq(sizeof(struct zinf_optimizer_opts), 72u);
}
