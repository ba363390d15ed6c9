/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/offload_step.c: a C program using an installed libzinf, as a trainer would: an
 * I/O context, a swap space on a directory, a pinned pool, an optimizer (AdamW, described by
 * its state parts: fp32 master, exp_avg, exp_avg_sq), and the pipelined optimizer step with that
 * state on "NVMe" and a bf16 copy of the parameters in host memory. It then checks the
 * offloaded result against the same optimizer run in memory.
 *
 * usage: offload_step [DIR]   (default: the current directory; files are removed at the end)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zinf/blocks/offload.h>

#define N  1000000u /* parameters in this rank's partition */
#define SG 300000u  /* sub_group_size */

int
main(int argc, char **argv)
{
	const char *dir = argc > 1 ? argv[1] : ".";
	int rc = 1;
	zinf_log_set_callback(zinf_log_to_file, stderr);

	float *master = malloc(N * sizeof(float)), *grad = malloc(N * sizeof(float));
	float *m = calloc(N, sizeof(float)), *v = calloc(N, sizeof(float));
	uint16_t *copy = malloc(N * 2), *ref_copy = malloc(N * 2);
	for (unsigned i = 0; i < N; i++) {
		master[i] = (float)((i % 1000) - 500) * 1e-3f;
	}

	struct zinf_io_opts io_opts;
	zinf_io_opts_init(&io_opts);
	struct zinf_io *io = NULL;
	struct zinf_swap *swap = NULL;
	struct zinf_pool *pool = NULL;
	struct zinf_step *step = NULL;
	struct zinf_optimizer *opt = NULL;
	struct zinf_optimizer_opts oo;
	zinf_optimizer_opts_init(&oo, ZINF_OPTIM_ADAMW);
	if (zinf_optimizer_create(&oo, &opt) < 0) {
		goto out;
	}
	if (zinf_io_create(&io_opts, &io) < 0) {
		goto out;
	}

	const char *dirs[] = {dir};
	struct zinf_swap_opts so;
	zinf_swap_opts_init(&so);
	so.dirs = dirs;
	so.n_dirs = 1;
	if (zinf_swap_create(io, &so, &swap) < 0) {
		goto out;
	}

	struct zinf_step_opts st;
	zinf_step_opts_init(&st);
	st.n = N;
	st.sub_group_size = SG;
	st.tier = ZINF_TIER_NVME;
	st.swap = swap;
	st.copy_dtype = ZINF_BF16;
	st.optimizer = opt;

	/* Budget first: 3 buffers of one sub-group's state each, checked before allocating. */
	struct zinf_pool_opts po;
	zinf_pool_opts_init(&po);
	po.buffer_bytes = zinf_step_buffer_bytes(&st, zinf_swap_align(swap));
	po.buffer_count = 3;
	po.io = io;
	po.pin_fallback = true; /* run unpinned rather than fail under a small `ulimit -l` */
	if (zinf_pool_create(&po, &pool) < 0) {
		goto out;
	}
	st.pool = pool;
	if (zinf_step_create(&st, &step) < 0 || zinf_swap_reserve(swap) < 0) {
		goto out;
	}
	for (uint32_t k = 0; k < zinf_step_sub_groups(step); k++) {
		uint64_t s0 = zinf_step_sub_group_start(step, k);
		const void *init[ZINF_OPTIM_MAX_PARTS] = {master + s0}; /* m, v: zeros */
		if (zinf_step_load(step, k, init) < 0) {
			goto out;
		}
	}

	for (int64_t t = 1; t <= 3; t++) {
		for (unsigned i = 0; i < N; i++) {
			grad[i] = (float)((i * 7u + (unsigned)t) % 101) * 1e-2f - 0.5f;
		}
		if (zinf_step_run(step, t, 1.0f, grad, ZINF_F32, copy) < 0) {
			goto out;
		}
		/* The same step in memory, sub-group by sub-group. */
		for (uint32_t k = 0; k < zinf_step_sub_groups(step); k++) {
			uint64_t s0 = zinf_step_sub_group_start(step, k);
			void *parts[] = {master + s0, m + s0, v + s0};
			if (zinf_optimizer_step(opt, t, 1.0f, parts, grad + s0, ZINF_F32, s0,
						zinf_step_sub_group_len(step, k), ref_copy + s0,
						ZINF_BF16) < 0) {
				goto out;
			}
		}
		if (memcmp(copy, ref_copy, N * 2) != 0) {
			fprintf(stderr,
				"step %lld: offloaded bf16 copy differs from the optimizer in "
				"memory\n",
				(long long)t);
			goto out;
		}
	}
	printf("offload_step: 3 steps of %u parameters with %s state (%u bytes a parameter) on "
	       "%s, identical to in memory (%s backend, pool %s)\n",
	       N, zinf_optimizer_name(opt), zinf_optimizer_state_bytes(opt), dir,
	       zinf_io_backend(io), zinf_pool_pinned(pool) ? "pinned" : "unpinned");
	rc = 0;
out:
	if (rc) {
		fprintf(stderr, "offload_step failed: %s\n", zinf_last_error());
	}
	zinf_step_destroy(step);
	zinf_pool_destroy(pool);
	zinf_swap_destroy(swap);
	zinf_io_destroy(io);
	zinf_optimizer_destroy(opt);
	free(master), free(grad), free(m), free(v), free(copy), free(ref_copy);
	return rc;
}
