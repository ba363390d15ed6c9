/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli/bench/bench_adam.c: `zinf bench adam`: throughput of the fused CPU-Adam step against the
 * memory bandwidth of the same machine in the same run (a STREAM triad with the same thread count),
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

#include "cli/bench/bench.h"
#include "common/dtype.h"
#include "common/util.h"
#include "cpu_adam/adam_bench.h"
#include "zinf/blocks/adam.h"

#define PROG "zinf bench adam"

static const char *const grad_dtypes[] = {"f32", "f16", "bf16", NULL};
static const char *const copy_dtypes[] = {"none", "f32", "f16", "bf16", NULL};
static const char *const simds[] = {"auto", "scalar", "avx2", "avx512", NULL};
static const char *const states[] = {"f32", "bf16", "bf16-sr", "q8", NULL};
static const char *const masters[] = {"f32", "bf16", NULL};
enum { ST_F32, ST_BF16, ST_BF16_SR, ST_Q8 };

struct cfg {
	uint64_t params, steps;
	int threads, reps, grad, copy, simd, state, master;
	bool json, three, accuracy, params_given;
};

static struct cfg cfg;

/* The SIMD path option for the library: NULL (auto) lets it pick the best. */
static const char *
simd_name(const struct cfg *c)
{
	return c->simd ? simds[c->simd] : NULL;
}

static const char synopsis[] = "[options]\n       zinf bench adam --accuracy [--params N] "
			       "[--steps S] [--json]";
static const char description[] =
	"Time the fused CPU-Adam step against a STREAM triad (the machine's memory bandwidth)\n"
	"measured in the same run with the same threads, repetitions interleaved, medians.\n"
	"The arrays are checked against physical memory before they are allocated.\n"
	"--master bf16: the bf16-master step (zinf_adam_step_bf16master) with --state's m and v,\n"
	"timed against the plain step with the same m and v (f32 master) in the same run.\n"
	"--accuracy: bf16 vs f32 optimizer state on a noisy quadratic (default 4096 params).\n";

static const struct cli_opt opts[] = {
	{"params", CLI_COUNT, &cfg.params, "1e8", "N",
	 "elements per step (far larger than the caches)", .min = 1, .given = &cfg.params_given},
	{"threads", CLI_INT, &cfg.threads, "1", "T", "OpenMP threads for the step and the triad",
	 .min = 1, .max = 4096},
	{"grad-dtype", CLI_ENUM, &cfg.grad, "f32", NULL, "gradient element type",
	 .choices = grad_dtypes},
	{"copy-dtype", CLI_ENUM, &cfg.copy, "bf16", NULL,
	 "16-bit parameter copy written by the step", .choices = copy_dtypes},
	{"simd", CLI_ENUM, &cfg.simd, "auto", NULL, "kernel (auto: the best this CPU runs)",
	 .choices = simds},
	{"three-pass", CLI_FLAG, &cfg.three, NULL, NULL,
	 "time unscale + Adam + copy as three passes instead of one"},
	{"state", CLI_ENUM, &cfg.state, "f32", NULL,
	 "optimizer state: f32, bf16 (RNE), bf16-sr (stochastic), q8 (8-bit blockwise, stochastic)",
	 .choices = states},
	{"master", CLI_ENUM, &cfg.master, "f32", NULL,
	 "master weight: f32, or bf16 (stochastic rounding; timed against the f32 master's step)",
	 .choices = masters},
	{"reps", CLI_INT, &cfg.reps, "7", "R", "interleaved repetitions of step and triad; medians",
	 .min = 1, .max = 10000},
	{"accuracy", CLI_FLAG, &cfg.accuracy, NULL, NULL, "bf16 vs f32 state on a noisy quadratic"},
	{"steps", CLI_COUNT, &cfg.steps, "10000", "S", "--accuracy: steps", .min = 1, .max = 1e9},
	{"json", CLI_FLAG, &cfg.json, NULL, NULL, "one JSON object on stdout"},
	{NULL},
};

/* The zinf_dtype of a --grad-dtype / --copy-dtype choice; -1 for "none". */
static int
dtype_of(const char *name)
{
	enum zinf_dtype d;
	if (strcmp(name, "none") == 0 || zinf_dtype_parse(name, &d) < 0) {
		return -1;
	}
	return (int)d;
}

static const char *
dtype_name(int dt)
{
	return dt < 0 ? "none" : zinf_dtype_name((enum zinf_dtype)dt);
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
				((uint16_t *)x)[i] = dt_f32_to_f16_rne(f);
			} else {
				((uint16_t *)x)[i] = dt_f32_to_bf16_rne(f);
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
	int r = 0;
	if (!a || !xs || !g || !m || !v || !mb || !vb || !x[0] || !x[1] || !x[2]) {
		fprintf(stderr,
			PROG ": out of memory for the --accuracy arrays of %zu params; lower "
			     "--params\n",
			n);
		r = -ENOMEM;
		goto out;
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
	for (int k = 0; k < 3 && r == 0; k++) {
		uint64_t noise = 777;
		memset(x[k], 0, n * 4);
		memset(m, 0, n * 4);
		memset(v, 0, n * 4);
		memset(mb, 0, n * 2);
		memset(vb, 0, n * 2);
		for (int t = 1; t <= steps && r == 0; t++) {
			if (cli_interrupted) {
				r = -EINTR;
				break;
			}
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
	for (size_t i = 0; i < n && r == 0; i++) {
		loss0 += 0.5 * a[i] * xs[i] * xs[i];
	}
	loss0 /= (double)n;
	if (r == 0 && json) {
		json_t *o = json_object(), *arr = json_array();
		json_object_set_new(o, "bench", json_string("adam-accuracy"));
		json_object_set_new(o, "params", json_integer((json_int_t)n));
		json_object_set_new(o, "steps", json_integer(steps));
		json_object_set_new(o, "noise_sigma", cli_json_real(sigma));
		json_object_set_new(o, "initial_loss", cli_json_real(loss0));
		for (int k = 0; k < 3; k++) {
			json_t *e = json_object();
			json_object_set_new(e, "state", json_string(runs[k].name));
			json_object_set_new(e, "final_loss", cli_json_real(runs[k].loss));
			json_object_set_new(e, "rms_dist_to_opt", cli_json_real(runs[k].dist));
			json_object_set_new(e, "param_rel_diff_vs_f32",
					    cli_json_real(runs[k].rel_to_f32));
			json_array_append_new(arr, e);
		}
		json_object_set_new(o, "runs", arr);
		r = cli_json_print(o, 0);
	} else if (r == 0) {
		printf("quadratic, gradient noise sigma %g, %zu params, %d steps, initial loss "
		       "%.6g\n",
		       sigma, n, steps, loss0);
		for (int k = 0; k < 3; k++) {
			printf("  %-9s final loss %.6g  rms dist to optimum %.6g  "
			       "|x - x_f32| / |x_f32| %.3g\n",
			       runs[k].name, runs[k].loss, runs[k].dist, runs[k].rel_to_f32);
		}
	}
out:
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
	return r == -EINTR ? cli_interrupt_status() : r ? 1 : 0;
}

/* ---- throughput ----------------------------------------------------------------------------- */

struct tp {
	size_t n, ns; /* step elements; triad elements */
	size_t gsz, csz;
	size_t sbytes; /* bytes of one moment array (m or v) */
	float *p;      /* the f32 master: the step's, or --master bf16's plain reference's */
	uint16_t *w;   /* --master bf16: the bf16 master */
	void *g, *m, *v, *c;
	void *rm, *rv; /* --master bf16: the plain reference's m and v */
	double *sa, *sb, *sc;
	double *t_adam, *t_plain, *t_triad;
};

static void
tp_free(struct tp *t)
{
	zinf_free_aligned(t->p);
	zinf_free_aligned(t->w);
	zinf_free_aligned(t->g);
	zinf_free_aligned(t->m);
	zinf_free_aligned(t->v);
	zinf_free_aligned(t->rm);
	zinf_free_aligned(t->rv);
	zinf_free_aligned(t->c);
	zinf_free_aligned(t->sa);
	zinf_free_aligned(t->sb);
	zinf_free_aligned(t->sc);
	free(t->t_adam);
	free(t->t_plain);
	free(t->t_triad);
}

/* Bytes of one moment array of n elements in state format s. */
static size_t
moment_bytes(int s, size_t n)
{
	return s == ST_Q8 ? (size_t)zinf_q8_bytes(n) : n * (s == ST_F32 ? 4 : 2);
}

/* Check the arrays against physical memory, then allocate and first-touch them (m and v all
 * zero bytes: zeros in every format). */
static int
tp_alloc(const struct cfg *c, int gdt, int cdt, struct tp *t)
{
	size_t n = c->params;
	bool bm = c->master == 1;
	t->n = n;
	t->gsz = zinf_dtype_size((enum zinf_dtype)gdt);
	t->sbytes = moment_bytes(c->state, n);
	t->csz = cdt < 0 ? 0 : zinf_dtype_size((enum zinf_dtype)cdt);
	/* The triad runs over 3 x 8 bytes x ns, at least 4x the step's largest array. */
	t->ns = ZINF_MAX(n / 2, (size_t)1 << 24);
	/* in double: n * 4 may pass 2^64 (the check must see the true size) */
	double sb = c->state == ST_Q8 ? (double)zinf_q8_bytes(n)
				      : (double)n * (c->state == ST_F32 ? 4 : 2);
	double need = (double)n * (double)(4 + t->gsz + t->csz) + 2.0 * sb +
		      (bm ? 2.0 * (double)n + 2.0 * sb : 0) + 24.0 * (double)t->ns;
	if (cli_check_memory(PROG, "the step's arrays and the triad's", need, "--params") < 0) {
		return -ENOMEM;
	}
	t->p = zinf_alloc_aligned(64, n * 4);
	t->g = zinf_alloc_aligned(64, n * t->gsz);
	t->m = zinf_alloc_aligned(64, t->sbytes);
	t->v = zinf_alloc_aligned(64, t->sbytes);
	t->c = t->csz ? zinf_alloc_aligned(64, n * t->csz) : NULL;
	if (bm) {
		t->w = zinf_alloc_aligned(64, n * 2);
		t->rm = zinf_alloc_aligned(64, t->sbytes);
		t->rv = zinf_alloc_aligned(64, t->sbytes);
	}
	t->sa = zinf_alloc_aligned(64, t->ns * 8);
	t->sb = zinf_alloc_aligned(64, t->ns * 8);
	t->sc = zinf_alloc_aligned(64, t->ns * 8);
	t->t_adam = calloc(c->reps, sizeof(double));
	t->t_plain = calloc(c->reps, sizeof(double));
	t->t_triad = calloc(c->reps, sizeof(double));
	if (!t->p || !t->g || !t->m || !t->v || (t->csz && !t->c) ||
	    (bm && (!t->w || !t->rm || !t->rv)) || !t->sa || !t->sb || !t->sc || !t->t_adam ||
	    !t->t_plain || !t->t_triad) {
		fprintf(stderr, PROG ": out of memory for %zu params\n", n);
		return -ENOMEM;
	}
	int th = c->threads;
	fill_values(t->p, ZINF_F32, n, th, 0.1f);
	fill_values(t->g, gdt, n, th, 1e-2f * 1024); /* times grad_scale 1/1024 below */
	touch(t->m, t->sbytes, 1, th, 0);
	touch(t->v, t->sbytes, 1, th, 0);
	if (bm) {
		fill_values(t->w, ZINF_BF16, n, th, 0.1f);
		touch(t->rm, t->sbytes, 1, th, 0);
		touch(t->rv, t->sbytes, 1, th, 0);
	}
	if (t->c) {
		touch(t->c, n * t->csz, t->csz, th, 0);
	}
	touch(t->sa, t->ns * 8, 8, th, 0);
	touch(t->sb, t->ns * 8, 8, th, 0x3f);
	touch(t->sc, t->ns * 8, 8, th, 0x3f);
	return 0;
}

/* One step with an f32 master p and m, v in --state's format. */
static int
plain_step(const struct cfg *c, const struct zinf_adam_opts *o, const struct tp *t, int64_t step,
	   enum zinf_dtype gd, enum zinf_dtype cd, void *m, void *v)
{
	const float scale = 1.0f / 1024;
	switch (c->state) {
	case ST_BF16:
	case ST_BF16_SR:
		return zinf_adam_step_bf16state(
			o, step, scale, t->p, t->g, gd, m, v, t->n, t->c, cd,
			c->state == ST_BF16_SR ? ZINF_ROUND_STOCHASTIC : ZINF_ROUND_NEAREST_EVEN,
			1);
	case ST_Q8: {
		struct zinf_q8_opts q;
		zinf_q8_opts_init(&q);
		q.rounding = ZINF_ROUND_STOCHASTIC;
		q.seed = 1;
		return zinf_adam_step_q8state(o, step, scale, t->p, t->g, gd, m, v, t->n, t->c, cd,
					      &q);
	}
	default:
		return zinf_adam_step(o, step, scale, t->p, t->g, gd, m, v, t->n, t->c, cd);
	}
}

/* One step of the configured kind (plain: --master bf16's reference, the f32 master's step). */
static int
tp_step(const struct cfg *c, const struct zinf_adam_opts *o, struct tp *t, int64_t step, int gdt,
	int cdt, bool plain)
{
	const float scale = 1.0f / 1024;
	enum zinf_dtype cd = cdt < 0 ? ZINF_F32 : (enum zinf_dtype)cdt;
	enum zinf_dtype gd = (enum zinf_dtype)gdt;
	if (c->three) {
		struct zinf_grad_opts go;
		zinf_grad_opts_init(&go);
		go.threads = c->threads;
		go.simd = simd_name(c);
		int e = adam_unscale(t->g, gd, t->n, scale, &go);
		e = e ? e
		      : zinf_adam_step(o, step, 1.0f, t->p, t->g, gd, t->m, t->v, t->n, NULL, 0);
		return e ? e : (t->c ? adam_convert(t->p, t->c, cd, t->n, &go) : 0);
	}
	if (c->master == 0) {
		return plain_step(c, o, t, step, gd, cd, t->m, t->v);
	}
	if (plain) {
		return plain_step(c, o, t, step, gd, cd, t->rm, t->rv);
	}
	struct zinf_bf16master_opts b;
	zinf_bf16master_opts_init(&b);
	b.moments = c->state == ST_Q8	 ? ZINF_MOMENTS_Q8
		    : c->state == ST_F32 ? ZINF_MOMENTS_F32
					 : ZINF_MOMENTS_BF16;
	b.state_rounding = c->state == ST_BF16 ? ZINF_ROUND_NEAREST_EVEN : ZINF_ROUND_STOCHASTIC;
	b.seed = 1;
	return zinf_adam_step_bf16master(o, step, scale, t->w, t->g, gd, t->m, t->v, t->n, t->c, cd,
					 &b);
}

static int
tp_report(const struct cfg *c, const char *path, const struct tp *t, int done, int gdt, int cdt)
{
	double ta = cli_median(t->t_adam, done), tt = cli_median(t->t_triad, done);
	bool bm = c->master == 1;
	double tpl = bm ? cli_median(t->t_plain, done) : ta;
	/* master r+w, g, m r+w, v r+w, copy */
	double bytes_per =
		(bm ? 4.0 : 8.0) + t->gsz + 4.0 * (double)t->sbytes / (double)t->n + t->csz;
	double pps = (double)t->n / ta, gbps = (double)t->n * bytes_per / ta / 1e9;
	double sgbps = (double)t->ns * 32 / tt / 1e9;
	if (c->json) {
		json_t *o = json_object();
		json_object_set_new(o, "bench", json_string("adam"));
		json_object_set_new(o, "simd", json_string(path));
		json_object_set_new(o, "params", json_integer((json_int_t)t->n));
		json_object_set_new(o, "threads", json_integer(c->threads));
		json_object_set_new(o, "grad_dtype", json_string(dtype_name(gdt)));
		json_object_set_new(o, "copy_dtype", json_string(dtype_name(cdt)));
		json_object_set_new(o, "state", json_string(states[c->state]));
		json_object_set_new(o, "master", json_string(masters[c->master]));
		json_object_set_new(o, "passes", json_integer(c->three ? 3 : 1));
		json_object_set_new(o, "reps", json_integer(done));
		json_object_set_new(o, "bytes_per_param", cli_json_real(bytes_per));
		json_object_set_new(o, "step_s", cli_json_real(ta));
		json_object_set_new(o, "params_per_s", cli_json_real(pps));
		json_object_set_new(o, "GBps", cli_json_real(gbps));
		json_object_set_new(o, "stream_elems", json_integer((json_int_t)t->ns));
		json_object_set_new(o, "stream_GBps", cli_json_real(sgbps));
		json_object_set_new(o, "ratio", cli_json_real(gbps / sgbps));
		if (bm) {
			json_object_set_new(o, "plain_step_s", cli_json_real(tpl));
			json_object_set_new(o, "plain_params_per_s",
					    cli_json_real((double)t->n / tpl));
			json_object_set_new(o, "speed_vs_plain", cli_json_real(tpl / ta));
		}
		double l = loadavg1();
		json_object_set_new(o, "loadavg", l >= 0 ? cli_json_real(l) : json_null());
		return cli_json_print(o, 0);
	}
	printf("adam %s: %zu params, %d thread(s), grad %s, copy %s, state %s, master %s, %s\n",
	       path, t->n, c->threads, dtype_name(gdt), dtype_name(cdt), states[c->state],
	       masters[c->master], c->three ? "three passes" : "fused");
	printf("  step %.4f s (median of %d)  %.4g params/s  %.2f GB/s (%.4g B/param)\n", ta, done,
	       pps, gbps, bytes_per);
	if (bm) {
		printf("  plain step (f32 master, same m and v) %.4f s  %.4g params/s  bf16 master "
		       "at %.3f of its speed\n",
		       tpl, (double)t->n / tpl, tpl / ta);
	}
	printf("  STREAM triad %.2f GB/s (same run, same threads)  ratio %.3f  load %.2f\n", sgbps,
	       gbps / sgbps, loadavg1());
	return 0;
}

static int
throughput(const struct cfg *c, const char *path)
{
	int gdt = dtype_of(grad_dtypes[c->grad]), cdt = dtype_of(copy_dtypes[c->copy]);
	struct tp t = {0};
	int rc = 1;
	bool bm = c->master == 1;
	if (tp_alloc(c, gdt, cdt, &t) < 0) {
		goto out;
	}
	struct zinf_adam_opts o;
	zinf_adam_opts_init(&o);
	o.threads = c->threads;
	o.simd = simd_name(c);
	o.weight_decay = 0.01f;
	triad(t.sa, t.sb, t.sc, t.ns, c->threads); /* warm-up: page tables, frequency */
	/* warm-up steps (and the steps the repetitions continue from) */
	if (tp_step(c, &o, &t, 1, gdt, cdt, false) ||
	    (bm && tp_step(c, &o, &t, 1, gdt, cdt, true))) {
		goto out;
	}
	int done = 0;
	for (int r = 0; r < c->reps && !cli_interrupted; r++, done++) {
		/* --master bf16: the two steps alternate which goes first */
		for (int k = 0; k < (bm ? 2 : 1); k++) {
			bool plain = bm && (k ^ (r & 1));
			double t0 = zinf_now_s();
			if (tp_step(c, &o, &t, r + 2, gdt, cdt, plain)) {
				goto out;
			}
			(plain ? t.t_plain : t.t_adam)[r] = zinf_now_s() - t0;
		}
		t.t_triad[r] = triad(t.sa, t.sb, t.sc, t.ns, c->threads);
	}
	if (cli_interrupted) {
		rc = cli_interrupt_status();
		goto out;
	}
	rc = tp_report(c, path, &t, done, gdt, cdt) ? 1 : 0;
out:
	tp_free(&t);
	return rc;
}

int
cli_bench_adam(int argc, char **argv)
{
	int rc = cli_opts_main(PROG, synopsis, description, opts, argc, argv);
	if (rc >= 0) {
		return rc;
	}
	struct cfg c = cfg;
	const char *path;
	if (zinf_simd_resolve(simd_name(&c), &path)) {
		return 1;
	}
	cli_catch_signals();
	if (c.accuracy) {
		size_t n = c.params_given ? c.params : 4096;
		/* a, x*: doubles; three x, g, m, v: floats; bf16 m, v */
		if (cli_check_memory(PROG, "the --accuracy arrays", (double)n * 44, "--params")) {
			return 1;
		}
		int r = accuracy(n, (int)c.steps, 0.1, c.json, simd_name(&c));
		return r ? r : accuracy(n, (int)c.steps, 0.0, c.json, simd_name(&c));
	}
	if (c.three && (c.state || c.master)) {
		fprintf(stderr,
			PROG ": --three-pass times f32 state only (not --state %s --master %s)\n",
			states[c.state], masters[c.master]);
		return 2;
	}
	return throughput(&c, path);
}
