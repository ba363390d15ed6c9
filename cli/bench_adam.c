// SPDX-License-Identifier: Apache-2.0
/*
 * cli/bench_adam.c: `zinf bench adam`: throughput of the fused CPU-Adam step against the memory
 * bandwidth of the same machine in the same run (a STREAM triad with the same thread count),
 * optionally the same work in three passes (unscale, Adam, copy) as DeepSpeed does it; and
 * `--accuracy`: bf16 optimizer state against float32 state on a long noisy-quadratic run.
 * Adam and triad repetitions are interleaved; medians are reported.
 */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/util.h"
#include "cpu_adam/adam_internal.h"
#include "zinf/adam.h"

static void
usage(FILE *f)
{
	fprintf(f,
		"usage: zinf bench adam [--params N] [--threads T] [--grad-dtype f32|f16|bf16]\n"
		"                       [--copy-dtype none|f32|f16|bf16] [--simd "
		"scalar|avx2|avx512]\n"
		"                       [--three-pass] [--state f32|bf16|bf16-sr] [--reps R] "
		"[--json]\n"
		"       zinf bench adam --accuracy [--params N] [--steps S] [--json]\n"
		"\n"
		"  --params N      elements per step (default 1e8; far larger than the caches)\n"
		"  --threads T     OpenMP threads for the step and the triad (default 1)\n"
		"  --three-pass    time unscale + Adam + copy as three passes instead of one\n"
		"  --state         optimizer state: f32 (default), bf16 (RNE), bf16-sr "
		"(stochastic)\n"
		"  --reps R        interleaved repetitions of step and triad (default 7); medians\n"
		"  --accuracy      bf16 vs f32 optimizer state on a noisy quadratic (default 4096\n"
		"                  params, 10000 steps)\n");
}

static int
parse_dtype(const char *s, int *out, bool allow_none)
{
	if (allow_none && strcmp(s, "none") == 0) {
		*out = -1;
	} else if (strcmp(s, "f32") == 0) {
		*out = ZINF_F32;
	} else if (strcmp(s, "f16") == 0) {
		*out = ZINF_F16;
	} else if (strcmp(s, "bf16") == 0) {
		*out = ZINF_BF16;
	} else {
		return -EINVAL;
	}
	return 0;
}

static const char *
dtype_name(int dt)
{
	return dt == ZINF_F32 ? "f32" : dt == ZINF_F16 ? "f16" : dt == ZINF_BF16 ? "bf16" : "none";
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double
median(double *v, int n)
{
	qsort(v, n, sizeof(double), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double
loadavg1(void)
{
	double l = -1;
	FILE *f = fopen("/proc/loadavg", "r");
	if (f) {
		if (fscanf(f, "%lf", &l) != 1) {
			l = -1;
		}
		fclose(f);
	}
	return l;
}

/* First touch with the step's partition, so pages land where the threads that use them run. */
static void
touch(void *p, size_t bytes, size_t elem, int threads, unsigned char byte)
{
	size_t n = bytes / elem, tiles = ZINF_DIV_ROUND_UP(n, (size_t)ZINF_ADAM_TILE);
#pragma omp parallel for schedule(static) num_threads(threads)
	for (size_t t = 0; t < tiles; t++) {
		size_t i0 = t * ZINF_ADAM_TILE, i1 = ZINF_MIN(n, i0 + ZINF_ADAM_TILE);
		memset((char *)p + i0 * elem, byte, (i1 - i0) * elem);
	}
}

/*
 * First touch with values of a realistic range, |x| <= amp, varied per element: constant or tiny
 * inputs would time the denormal paths of the FPU (g * g underflowing) instead of the memory.
 */
static void
fill_values(void *x, int dt, size_t n, int threads, float amp)
{
	size_t tiles = ZINF_DIV_ROUND_UP(n, (size_t)ZINF_ADAM_TILE);
#pragma omp parallel for schedule(static) num_threads(threads)
	for (size_t t = 0; t < tiles; t++) {
		size_t i1 = ZINF_MIN(n, (t + 1) * ZINF_ADAM_TILE);
		for (size_t i = t * ZINF_ADAM_TILE; i < i1; i++) {
			uint32_t h = (uint32_t)i * 2654435761u;
			float f = amp * ((float)(h >> 8) * 0x1p-23f - 1.0f);
			if (dt == ZINF_F32) {
				((float *)x)[i] = f;
			} else if (dt == ZINF_F16) {
				((uint16_t *)x)[i] = zinf_f32_to_f16_rne(f);
			} else {
				((uint16_t *)x)[i] = zinf_f32_to_bf16_rne(f);
			}
		}
	}
}

/* STREAM triad a = b + s * c over doubles; 32 bytes per element counting write-allocate. */
static double
triad(double *a, const double *b, const double *c, size_t n, int threads)
{
	const double s = 3.0;
	double t0 = zinf_now_s();
#pragma omp parallel for simd schedule(static) num_threads(threads)
	for (size_t i = 0; i < n; i++) {
		a[i] = b[i] + s * c[i];
	}
	return zinf_now_s() - t0;
}

/* ---- bf16 state accuracy: noisy quadratic ------------------------------------------------- */

struct acc_run {
	const char *name;
	double loss, dist, rel_to_f32;
};

/* Loss 0.5 sum a_i (x_i - x*_i)^2, gradient a_i (x_i - x*_i) + uniform noise of standard
 * deviation sigma, curvatures a_i log-uniform in 1..1e3, x from 0, lr 1e-3, the same noise
 * sequence for every state type. */
static int
accuracy(size_t n, int steps, double sigma, bool json, const char *simd)
{
	double *a = malloc(n * sizeof(double)), *xs = malloc(n * sizeof(double));
	float *x[3], *g = malloc(n * 4), *m = malloc(n * 4), *v = malloc(n * 4);
	uint16_t *mb = malloc(n * 2), *vb = malloc(n * 2);
	struct acc_run runs[3] = {{.name = "f32"}, {.name = "bf16-rne"}, {.name = "bf16-sr"}};
	uint64_t rng = 12345;
	for (int k = 0; k < 3; k++) {
		x[k] = malloc(n * 4);
	}
	for (size_t i = 0; i < n; i++) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		a[i] = pow(10.0, 3.0 * (double)(rng >> 11) * 0x1p-53);
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		xs[i] = (double)(rng >> 11) * 0x1p-53 * 2 - 1;
	}
	struct zinf_adam_opts o;
	zinf_adam_opts_init(&o);
	o.lr = 1e-3f;
	o.threads = 1;
	o.simd = simd;
	int r = 0;
	for (int k = 0; k < 3 && r == 0; k++) {
		uint64_t noise = 777;
		memset(x[k], 0, n * 4);
		memset(m, 0, n * 4);
		memset(v, 0, n * 4);
		memset(mb, 0, n * 2);
		memset(vb, 0, n * 2);
		for (int t = 1; t <= steps && r == 0; t++) {
			for (size_t i = 0; i < n; i++) {
				noise = noise * 6364136223846793005ull + 1442695040888963407ull;
				double u = (double)(noise >> 11) * 0x1p-53 - 0.5;
				g[i] = (float)(a[i] * (x[k][i] - xs[i]) + sigma * 3.4641 * u);
			}
			if (k == 0) {
				r = zinf_adam_step(&o, t, 1.0f, x[k], g, ZINF_F32, m, v, n, NULL,
						   0);
			} else {
				r = zinf_adam_step_bf16state(
					&o, t, 1.0f, x[k], g, ZINF_F32, mb, vb, n, NULL, 0,
					k == 1 ? ZINF_ROUND_NEAREST_EVEN : ZINF_ROUND_STOCHASTIC,
					99);
			}
		}
		double loss = 0, dist = 0, d32 = 0, n32 = 0;
		for (size_t i = 0; i < n; i++) {
			double e = x[k][i] - xs[i];
			loss += 0.5 * a[i] * e * e;
			dist += e * e;
			d32 += (x[k][i] - x[0][i]) * (x[k][i] - x[0][i]);
			n32 += (double)x[0][i] * x[0][i];
		}
		runs[k].loss = loss / (double)n;
		runs[k].dist = sqrt(dist / (double)n);
		runs[k].rel_to_f32 = sqrt(d32 / n32);
	}
	double loss0 = 0;
	for (size_t i = 0; i < n; i++) {
		loss0 += 0.5 * a[i] * xs[i] * xs[i];
	}
	loss0 /= (double)n;
	if (r == 0) {
		if (json) {
			printf("{\"bench\": \"adam-accuracy\", \"params\": %zu, \"steps\": %d, "
			       "\"noise_sigma\": %g, \"initial_loss\": %.6g, \"runs\": [",
			       n, steps, sigma, loss0);
			for (int k = 0; k < 3; k++) {
				printf("%s{\"state\": \"%s\", \"final_loss\": %.6g, "
				       "\"rms_dist_to_opt\": "
				       "%.6g, \"param_rel_diff_vs_f32\": %.6g}",
				       k ? ", " : "", runs[k].name, runs[k].loss, runs[k].dist,
				       runs[k].rel_to_f32);
			}
			printf("]}\n");
		} else {
			printf("quadratic, gradient noise sigma %g, %zu params, %d steps, initial "
			       "loss %.6g\n",
			       sigma, n, steps, loss0);
			for (int k = 0; k < 3; k++) {
				printf("  %-9s final loss %.6g  rms dist to optimum %.6g  "
				       "|x - x_f32| / |x_f32| %.3g\n",
				       runs[k].name, runs[k].loss, runs[k].dist,
				       runs[k].rel_to_f32);
			}
		}
	}
	for (int k = 0; k < 3; k++) {
		free(x[k]);
	}
	free(a);
	free(xs);
	free(g);
	free(m);
	free(v);
	free(mb);
	free(vb);
	return r ? 1 : 0;
}

/* ---- throughput ----------------------------------------------------------------------------- */

int
cli_bench_adam(int argc, char **argv)
{
	uint64_t params = 100000000, steps_acc = 10000;
	int threads = 1, gdt = ZINF_F32, cdt = ZINF_BF16, reps = 7;
	bool json = false, three = false, acc = false, params_set = false;
	const char *simd = NULL, *state = "f32";
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
		uint64_t u;
		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			usage(stdout);
			return 0;
		} else if (strcmp(a, "--json") == 0) {
			json = true;
		} else if (strcmp(a, "--three-pass") == 0) {
			three = true;
		} else if (strcmp(a, "--accuracy") == 0) {
			acc = true;
		} else if (!val) {
			fprintf(stderr, "zinf bench adam: %s needs a value\n", a);
			return 2;
		} else if (strcmp(a, "--params") == 0 && cli_parse_size(val, &u) == 0 && u > 0) {
			params = u, params_set = true, i++;
		} else if (strcmp(a, "--steps") == 0 && cli_parse_size(val, &u) == 0 && u > 0) {
			steps_acc = u, i++;
		} else if (strcmp(a, "--threads") == 0 && atoi(val) > 0) {
			threads = atoi(val), i++;
		} else if (strcmp(a, "--reps") == 0 && atoi(val) > 0) {
			reps = atoi(val), i++;
		} else if (strcmp(a, "--grad-dtype") == 0 && parse_dtype(val, &gdt, false) == 0) {
			i++;
		} else if (strcmp(a, "--copy-dtype") == 0 && parse_dtype(val, &cdt, true) == 0) {
			i++;
		} else if (strcmp(a, "--simd") == 0) {
			simd = val, i++;
		} else if (strcmp(a, "--state") == 0 &&
			   (!strcmp(val, "f32") || !strcmp(val, "bf16") ||
			    !strcmp(val, "bf16-sr"))) {
			state = val, i++;
		} else {
			fprintf(stderr, "zinf bench adam: bad option %s %s\n", a, val);
			usage(stderr);
			return 2;
		}
	}
	const struct zinf_adam_ops *ops;
	if (zinf_adam_select(simd, "zinf bench adam", &ops)) {
		return 1;
	}
	if (acc) {
		int r = accuracy(params_set ? params : 4096, (int)steps_acc, 0.1, json, simd);
		return r ? r
			 : accuracy(params_set ? params : 4096, (int)steps_acc, 0.0, json, simd);
	}
	bool bf16_state = strcmp(state, "f32") != 0;
	if (three && bf16_state) {
		fprintf(stderr, "zinf bench adam: --three-pass times f32 state only\n");
		return 2;
	}
	size_t n = params, gsz = gdt == ZINF_F32 ? 4 : 2, ssz = bf16_state ? 2 : 4;
	size_t csz = cdt < 0 ? 0 : cdt == ZINF_F32 ? 4 : 2;
	/* The triad runs over 3 x 8 bytes x ns, at least 4x the step's largest array. */
	size_t ns = ZINF_MAX(n / 2, (size_t)1 << 24);
	float *p = zinf_alloc_aligned(64, n * 4);
	void *g = zinf_alloc_aligned(64, n * gsz), *m = zinf_alloc_aligned(64, n * ssz);
	void *v = zinf_alloc_aligned(64, n * ssz);
	void *c = csz ? zinf_alloc_aligned(64, n * csz) : NULL;
	double *sa = zinf_alloc_aligned(64, ns * 8), *sb = zinf_alloc_aligned(64, ns * 8);
	double *sc = zinf_alloc_aligned(64, ns * 8);
	double *t_adam = calloc(reps, sizeof(double)), *t_triad = calloc(reps, sizeof(double));
	int rc = 1;
	if (!p || !g || !m || !v || (csz && !c) || !sa || !sb || !sc || !t_adam || !t_triad) {
		fprintf(stderr, "zinf bench adam: out of memory for %zu params\n", n);
		goto out;
	}
	cli_catch_signals();
	fill_values(p, ZINF_F32, n, threads, 0.1f);
	fill_values(g, gdt, n, threads, 1e-2f * 1024); /* times grad_scale 1/1024 below */
	touch(m, n * ssz, ssz, threads, 0);
	touch(v, n * ssz, ssz, threads, 0);
	if (c) {
		touch(c, n * csz, csz, threads, 0);
	}
	touch(sa, ns * 8, 8, threads, 0);
	touch(sb, ns * 8, 8, threads, 0x3f);
	touch(sc, ns * 8, 8, threads, 0x3f);
	struct zinf_adam_opts o;
	zinf_adam_opts_init(&o);
	o.threads = threads;
	o.weight_decay = 0.01f;
	o.simd = simd;
	struct zinf_grad_opts go;
	zinf_grad_opts_init(&go);
	go.threads = threads;
	go.simd = simd;
	const float scale = 1.0f / 1024;
	triad(sa, sb, sc, ns, threads); /* warm-up: page tables, frequency */
	/* warm-up step (and the step the repetitions continue from) */
	int warm = bf16_state
			   ? zinf_adam_step_bf16state(&o, 1, scale, p, g, gdt, m, v, n, c,
						      cdt < 0 ? 0 : cdt, ZINF_ROUND_NEAREST_EVEN, 1)
			   : zinf_adam_step(&o, 1, scale, p, g, gdt, m, v, n, c, cdt < 0 ? 0 : cdt);
	if (warm) {
		goto out;
	}
	int done = 0;
	for (int r = 0; r < reps && !cli_interrupted; r++, done++) {
		int64_t step = r + 2;
		double t0 = zinf_now_s();
		int e = 0;
		if (three) {
			e = zinf_adam_unscale(g, gdt, n, scale, &go);
			e = e ? e : zinf_adam_step(&o, step, 1.0f, p, g, gdt, m, v, n, NULL, 0);
			e = e ? e : (c ? zinf_adam_convert(p, c, cdt, n, &go) : 0);
		} else if (bf16_state) {
			e = zinf_adam_step_bf16state(
				&o, step, scale, p, g, gdt, m, v, n, c, cdt < 0 ? 0 : cdt,
				strcmp(state, "bf16-sr") == 0 ? ZINF_ROUND_STOCHASTIC
							      : ZINF_ROUND_NEAREST_EVEN,
				1);
		} else {
			e = zinf_adam_step(&o, step, scale, p, g, gdt, m, v, n, c,
					   cdt < 0 ? 0 : cdt);
		}
		if (e) {
			goto out;
		}
		t_adam[r] = zinf_now_s() - t0;
		t_triad[r] = triad(sa, sb, sc, ns, threads);
	}
	if (done == 0) {
		rc = 130;
		goto out;
	}
	double ta = median(t_adam, done), tt = median(t_triad, done);
	double bytes_per =
		4 + 4 + gsz + 2.0 * ssz + 2.0 * ssz + csz; /* p r+w, g, m r+w, v r+w, copy */
	double pps = (double)n / ta, gbps = (double)n * bytes_per / ta / 1e9;
	double sgbps = (double)ns * 32 / tt / 1e9;
	if (json) {
		printf("{\"bench\": \"adam\", \"simd\": \"%s\", \"params\": %zu, \"threads\": %d, "
		       "\"grad_dtype\": \"%s\", \"copy_dtype\": \"%s\", \"state\": \"%s\", "
		       "\"passes\": %d, \"reps\": %d, \"bytes_per_param\": %.0f, "
		       "\"step_s\": %.6f, \"params_per_s\": %.4g, \"GBps\": %.3f, "
		       "\"stream_elems\": %zu, \"stream_GBps\": %.3f, \"ratio\": %.3f, "
		       "\"loadavg\": %.2f}\n",
		       ops->name, n, threads, dtype_name(gdt), dtype_name(cdt), state,
		       three ? 3 : 1, done, bytes_per, ta, pps, gbps, ns, sgbps, gbps / sgbps,
		       loadavg1());
	} else {
		printf("adam %s: %zu params, %d thread(s), grad %s, copy %s, state %s, %s\n",
		       ops->name, n, threads, dtype_name(gdt), dtype_name(cdt), state,
		       three ? "three passes" : "fused");
		printf("  step %.4f s (median of %d)  %.4g params/s  %.2f GB/s (%.0f B/param)\n",
		       ta, done, pps, gbps, bytes_per);
		printf("  STREAM triad %.2f GB/s (same run, same threads)  ratio %.3f  load %.2f\n",
		       sgbps, gbps / sgbps, loadavg1());
	}
	rc = 0;
out:
	zinf_free_aligned(p);
	zinf_free_aligned(g);
	zinf_free_aligned(m);
	zinf_free_aligned(v);
	zinf_free_aligned(c);
	zinf_free_aligned(sa);
	zinf_free_aligned(sb);
	zinf_free_aligned(sc);
	free(t_adam);
	free(t_triad);
	return rc;
}
