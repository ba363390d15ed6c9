/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/test_engine_smoke.c: the engine author's smoke test, a plain program run alone
 * or under mpirun (label mpi). Five parameters in three layers, trained a few steps with
 * gradients chosen so that every sum is exact in fp32 (k/64); the fp32 master read back and
 * the 16-bit parameters fetched are compared bit for bit with a reference that averages over
 * ranks and accumulates over micro-batches in the engine's order and runs zinf_optimizer_step
 * on whole tensors. Also: wrong-order calls are -EINVAL and leave the engine usable.
 *
 *   test_engine_smoke STAGE OPTIM_TIER PARAM_TIER GAS [NVME_DIR] [FLAGS]
 * tiers: none | cpu | nvme; FLAGS letters: a: step after backward (no worker); s: one parameter
 * per sub-group, where the first sub-group of backward is final before the last bucket is
 * reduced whatever the timing, so that at least one is stepped during backward; l: stage 3
 * with stage3_max_live_parameters 1100 (every layer alone fits: the peak stays under it); v:
 * the forward of step 2 fetches layers 0, 2, 1 (the trace is invalidated, results unchanged);
 * f: an injected NVMe read error fails the engine (run_fault); F, H: fp32 or f16 parameters
 * (default bf16).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinf/engine.h"

#define NP    5
#define STEPS 3

static const struct {
	const char *name;
	uint64_t numel;
	int layer;
} P[NP] = {{"a", 37, 0}, {"b", 5, 0}, {"c", 300, 1}, {"d", 1000, 2}, {"e", 3, 2}};

static int fails;
#define CHECK(c, ...)                                                                              \
	do {                                                                                       \
		if (!(c)) {                                                                        \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                       \
			fprintf(stderr, __VA_ARGS__);                                              \
			fprintf(stderr, "\n");                                                     \
			fails++;                                                                   \
		}                                                                                  \
	} while (0)

static int
init_fn(void *ctx, uint32_t param, uint64_t first, uint64_t count, float *out)
{
	(void)ctx;
	for (uint64_t i = 0; i < count; i++) {
		out[i] = 0.5f * sinf((float)(param * 100 + first + i));
	}
	return 0;
}

static float
gval(int id, uint64_t i, int rank, int micro, int step)
{
	return (float)((int)((i * 7 + id * 3 + rank * 5 + micro + step * 11) % 17) - 8) / 64.0f;
}

static enum zinf_offload_device
tier(const char *s)
{
	return !strcmp(s, "cpu")    ? ZINF_OFFLOAD_CPU
	       : !strcmp(s, "nvme") ? ZINF_OFFLOAD_NVME
				    : ZINF_OFFLOAD_NONE;
}

static bool saw_file, saw_named; /* error messages naming a swap file; a parameter or sub-group */

static void
logcb(void *ctx, enum zinf_log_level l, const char *f, int line, const char *fn, const char *m)
{
	(void)ctx, (void)f, (void)line, (void)fn;
	if (l == ZINF_LOG_ERROR) {
		saw_file |= strstr(m, ".swp") != NULL;
		saw_named |= strstr(m, "parameter \"") != NULL || strstr(m, "sub-group") != NULL;
	}
	fprintf(stderr, "zinf %s: %s\n", l == ZINF_LOG_ERROR ? "error" : "warn", m);
}

/*
 * Flag f: the first NVMe read after init fails with EIO. Some call of the first steps returns
 * -EIO with a message naming a swap file; every later call returns it too; destroy works.
 */
static int
run_fault(struct zinf_engine *e, uint16_t *g16[])
{
	struct zinf_io_fault f = {
		.kind = ZINF_IO_FAULT_FAIL, .op = ZINF_IO_READ, .nth = 1, .err = EIO};
	CHECK(zinf_io_fault_add(zinf_engine_io(e), &f) == 0, "fault_add");
	int ret = 0;
	for (int step = 0; step < 2 && ret == 0; step++) {
		for (int l = 0; l <= 2 && ret == 0; l++) {
			if ((ret = zinf_engine_fetch(e, l)) == 0) {
				ret = zinf_engine_release(e, l);
			}
		}
		for (int l = 2; l >= 0 && ret == 0; l--) {
			ret = zinf_engine_fetch(e, l);
			for (int i = 0; i < NP && ret == 0; i++) {
				if (P[i].layer == l) {
					ret = zinf_engine_grad(e, (uint32_t)i, g16[i], ZINF_BF16);
				}
			}
			if (ret == 0) {
				ret = zinf_engine_release(e, l);
			}
		}
		if (ret == 0) {
			ret = zinf_engine_step(e);
			ret = ret < 0 ? ret : 0;
		}
	}
	CHECK(ret == -EIO, "no -EIO from an injected read error (%d)", ret);
	CHECK(saw_file && saw_named,
	      "no message named the swap file (%d) and the parameter or "
	      "sub-group (%d)",
	      saw_file, saw_named);
	CHECK(zinf_engine_fetch(e, 0) == ret && zinf_engine_step(e) == ret &&
		      zinf_engine_grad(e, 0, g16[0], ZINF_BF16) == ret,
	      "the engine did not stay failed");
	return fails ? 1 : 0;
}

int
main(int argc, char **argv)
{
	if (argc < 5) {
		fprintf(stderr, "usage: %s STAGE OPTIM_TIER PARAM_TIER GAS [DIR] [sdb]\n", argv[0]);
		return 2;
	}
	zinf_log_set_callback(logcb, NULL);
	struct zinf_engine_opts o;
	zinf_engine_opts_init(&o);
	o.stage = atoi(argv[1]);
	o.offload_optimizer.device = tier(argv[2]);
	o.offload_param.device = tier(argv[3]);
	int gas = atoi(argv[4]);
	o.gradient_accumulation_steps = (uint32_t)gas;
	const char *dir = argc > 5 ? argv[5] : "/tmp";
	if (o.offload_optimizer.device == ZINF_OFFLOAD_NVME) {
		o.offload_optimizer.n_paths = 1;
		o.offload_optimizer.nvme_path[0] = dir;
	}
	if (o.offload_param.device == ZINF_OFFLOAD_NVME) {
		o.offload_param.n_paths = 1;
		o.offload_param.nvme_path[0] = dir;
	}
	const char *flags = argc > 6 ? argv[6] : "";
	o.step_during_backward = !strchr(flags, 'a');
	if (strchr(flags, 'f')) {
		o.io_backend = "fault";
		/* no CPU cache of the parameters: the values written at init are read back (a
		   cached partition is read from no file) */
		o.offload_param.max_in_cpu = 0;
	}
	/* tests run in parallel over one directory: a swap prefix per configuration */
	char prefix[128];
	snprintf(prefix, sizeof(prefix), "smoke-%s-%s-%s-%s-%s", argv[1], argv[2], argv[3], argv[4],
		 flags[0] ? flags : "x");
	o.swap_prefix = prefix;
	o.device_backend = "host";
	o.comm_check = true;
	o.sub_group_size = strchr(flags, 's') ? 1 : 400;
	o.reduce_bucket_size = 512;
	o.allgather_bucket_size = 300; /* several all-gathers in flight, waited in order */
	o.stage3_param_persistence_threshold = 20;
	o.dtype = strchr(flags, 'F') ? ZINF_F32 : strchr(flags, 'H') ? ZINF_F16 : ZINF_BF16;
	o.optimizer.lr = 1e-2f;
	if (strchr(flags, 'l')) {
		o.stage3_max_live_parameters = 1100;
	}
	o.optimizer.weight_decay = 0.01f;
	struct zinf_engine *e;
	int ret = zinf_engine_create(&o, &e);
	if (ret) {
		fprintf(stderr, "create: %d\n", ret);
		return 1;
	}
	int rank = zinf_engine_rank(e), world = zinf_engine_world(e);
	for (int i = 0; i < NP; i++) {
		struct zinf_param_desc d;
		zinf_param_desc_init(&d);
		d.name = P[i].name;
		d.numel = P[i].numel;
		d.layer = P[i].layer;
		d.init_fn = init_fn;
		CHECK(zinf_engine_add_param(e, &d) == i, "add_param %d", i);
	}
	CHECK((ret = zinf_engine_init(e)) == 0, "init %d", ret);
	if (strchr(flags, 'f')) {
		uint16_t *g[NP];
		for (int i = 0; i < NP; i++) {
			zinf_device_alloc(zinf_engine_device(e), P[i].numel * 2, (void **)&g[i]);
			memset(g[i], 0, P[i].numel * 2);
		}
		ret = run_fault(e, g);
		for (int i = 0; i < NP; i++) {
			zinf_device_free(zinf_engine_device(e), g[i]);
		}
		zinf_engine_destroy(e);
		if (!ret && rank == 0) {
			printf("ok fault\n");
		}
		return ret;
	}

	/* the reference */
	struct zinf_optimizer *opt;
	zinf_optimizer_create(&o.optimizer, &opt);
	float *ref[NP][3], *acc[NP];
	for (int i = 0; i < NP; i++) {
		for (int k = 0; k < 3; k++) {
			ref[i][k] = calloc(P[i].numel, sizeof(float));
		}
		acc[i] = calloc(P[i].numel, sizeof(float));
		init_fn(NULL, (uint32_t)i, 0, P[i].numel, ref[i][0]);
	}
	struct zinf_device *dev = zinf_engine_device(e);
	struct zinf_stream *cs = zinf_engine_compute_stream(e);
	uint16_t *g16[NP];
	for (int i = 0; i < NP; i++) {
		zinf_device_alloc(dev, P[i].numel * 2, (void **)&g16[i]);
	}
	for (int step = 1; step <= STEPS && !fails; step++) {
		/* a schedule; the value set inside the boundary micro-batch below is the next
		   step's (and is overwritten here first) */
		float lr = 1e-2f / (float)step;
		CHECK(zinf_engine_set_lr(e, lr) == 0, "set_lr");
		CHECK(zinf_engine_set_lr(e, -1.0f) == -EINVAL, "set_lr -1");
		zinf_optimizer_set_lr(opt, lr);
		for (int micro = 0; micro < gas; micro++) {
			for (int f = 0; f <= 2; f++) {
				int l = strchr(flags, 'v') && step == 2 && micro == 0 && f ? 3 - f
											   : f;
				CHECK(zinf_engine_fetch(e, l) == 0, "fetch %d", l);
				CHECK(zinf_engine_release(e, l) == 0, "release %d", l);
			}
			for (int l = 2; l >= 0; l--) {
				CHECK(zinf_engine_fetch(e, l) == 0, "fetch %d", l);
				for (int i = NP - 1; i >= 0; i--) {
					if (P[i].layer != l ||
					    (step == 1 && micro == 0 && i == 4)) {
						continue;
					}
					zinf_stream_sync(cs);
					float *g = malloc(P[i].numel * sizeof(float));
					for (uint64_t j = 0; j < P[i].numel; j++) {
						g[j] = gval(i, j, rank, micro, step);
					}
					zinf_dtype_convert(g16[i], ZINF_BF16, g, ZINF_F32,
							   P[i].numel);
					free(g);
					ret = zinf_engine_grad(e, (uint32_t)i, g16[i], ZINF_BF16);
					CHECK(ret == 0, "grad %d: %d", i, ret);
				}
				CHECK(l != 2 ||
					      zinf_engine_grad(e, 3, g16[3], ZINF_BF16) == -EINVAL,
				      "second gradient accepted");
				CHECK(zinf_engine_release(e, l) == 0, "release %d", l);
				if (micro == gas - 1) {
					CHECK(zinf_engine_set_lr(e, 0.5f) == 0, "set_lr late");
				}
			}
			if (step == 1 && micro == 0) {
				/* "e" missing: -EINVAL, then hand it and go on */
				CHECK(zinf_engine_step(e) == -EINVAL, "step without gradient e");
				zinf_stream_sync(cs);
				float g[3];
				for (int j = 0; j < 3; j++) {
					g[j] = gval(4, (uint64_t)j, rank, micro, step);
				}
				zinf_dtype_convert(g16[4], ZINF_BF16, g, ZINF_F32, 3);
				CHECK(zinf_engine_grad(e, 4, g16[4], ZINF_BF16) == 0,
				      "grad e late");
			}
			ret = zinf_engine_step(e);
			CHECK(ret == (micro == gas - 1), "step returned %d", ret);
			/* reference: mean over ranks (fp32 sum, one division), then accumulate */
			for (int i = 0; i < NP; i++) {
				for (uint64_t j = 0; j < P[i].numel; j++) {
					float s = 0;
					for (int r = 0; r < world; r++) {
						s += gval(i, j, r, micro, step);
					}
					s /= (float)world;
					acc[i][j] = micro == 0 ? s : acc[i][j] + s;
				}
			}
		}
		for (int i = 0; i < NP; i++) {
			void *parts[3] = {ref[i][0], ref[i][1], ref[i][2]};
			zinf_optimizer_step(opt, step, 1.0f, parts, acc[i], ZINF_F32, 0, P[i].numel,
					    NULL, ZINF_F32);
		}
	}
	CHECK(zinf_engine_steps(e) == STEPS, "steps %lld", (long long)zinf_engine_steps(e));
	for (int i = 0; i < NP && !fails; i++) {
		float *m = calloc(P[i].numel, sizeof(float));
		CHECK(zinf_engine_read_master(e, (uint32_t)i, m) == 0, "read_master %d", i);
		for (uint64_t j = 0; j < P[i].numel; j++) {
			if (memcmp(&m[j], &ref[i][0][j], 4)) {
				CHECK(0, "param %s[%llu]: master %.9g, reference %.9g", P[i].name,
				      (unsigned long long)j, (double)m[j], (double)ref[i][0][j]);
				break;
			}
		}
		free(m);
	}
	for (int l = 0; l <= 2 && !fails; l++) {
		CHECK(zinf_engine_fetch(e, l) == 0, "fetch %d", l);
		for (int i = 0; i < NP; i++) {
			void *d;
			if (P[i].layer != l) {
				continue;
			}
			CHECK(zinf_engine_param(e, (uint32_t)i, &d) == 0, "param %d", i);
			zinf_stream_sync(cs);
			size_t dsz = zinf_dtype_size(o.dtype);
			void *want = malloc(P[i].numel * dsz);
			zinf_dtype_convert(want, o.dtype, ref[i][0], ZINF_F32, P[i].numel);
			CHECK(memcmp(d, want, P[i].numel * dsz) == 0, "param %s (%s) differs",
			      P[i].name, zinf_dtype_name(o.dtype));
			free(want);
		}
		CHECK(zinf_engine_release(e, l) == 0, "release %d", l);
	}
	struct zinf_engine_stats st = {.size = sizeof(st)};
	CHECK(zinf_engine_get_stats(e, &st) == 0, "stats");
	CHECK(st.steps == STEPS && st.micro_steps == (uint64_t)(STEPS * gas), "stats steps");
	CHECK(st.sub_groups >= 2, "sub_groups %u", st.sub_groups);
	if (o.step_during_backward) {
		CHECK(st.stepped_during_backward <= st.sub_groups &&
			      (st.stepped_during_backward >= 1 || !strchr(flags, 's')),
		      "stepped_during_backward %u of %u", st.stepped_during_backward,
		      st.sub_groups);
	} else {
		CHECK(st.stepped_during_backward == 0, "stepped_during_backward %u without it",
		      st.stepped_during_backward);
	}
	if (o.stage == 3) {
		/* prefetch along the trace and reuse may leave layers gathered after release */
		uint64_t all = st.persistent_elems;
		for (int i = 0; i < NP; i++) {
			all += P[i].numel <= 20 ? 0 : (P[i].numel + world - 1) / world * world;
		}
		CHECK(st.live_elems >= st.persistent_elems && st.live_elems <= all,
		      "live %llu persistent %llu all %llu", (unsigned long long)st.live_elems,
		      (unsigned long long)st.persistent_elems, (unsigned long long)all);
		bool v = strchr(flags, 'v') != NULL;
		CHECK(st.trace_hits > 0 && (st.trace_invalidations >= 1) == v &&
			      (st.trace_misses >= 1) == v,
		      "trace hits %llu misses %llu", (unsigned long long)st.trace_hits,
		      (unsigned long long)st.trace_misses);
		CHECK(st.peak_live_elems > st.persistent_elems, "peak");
		CHECK(!strchr(flags, 'l') || st.peak_live_elems <= 1100, "peak %llu over 1100",
		      (unsigned long long)st.peak_live_elems);
	}
	for (int i = 0; i < NP; i++) {
		zinf_device_free(dev, g16[i]);
		for (int k = 0; k < 3; k++) {
			free(ref[i][k]);
		}
		free(acc[i]);
	}
	zinf_optimizer_destroy(opt);
	zinf_engine_destroy(e);
	if (fails) {
		fprintf(stderr, "rank %d: %d failures\n", rank, fails);
		return 1;
	}
	if (rank == 0) {
		printf("ok stage %s optim %s param %s gas %d world %d\n", argv[1], argv[2], argv[3],
		       gas, world);
	}
	return 0;
}
