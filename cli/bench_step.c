// SPDX-License-Identifier: Apache-2.0
/*
 * cli/bench_step.c: `zinf bench step`, the pipelined optimizer step over fp32 master, m and v
 * on NVMe. Creates the state of --params elements in swap files under --path, then runs
 * --steps rounds; each round measures, interleaved on the same files (the disk's speed drifts):
 *
 *   io:    the step's I/O without Adam: every sub-group read and written back through the same
 *          pool buffers, as many in flight as the step may have (io_GBps);
 *   step:  the optimizer step (zinf_step_begin / ready per sub-group / finish) (step_s);
 *   adam:  the same Adam work (every sub-group's elements) on state already in memory (adam_s).
 *
 * efficiency = max(io_s, adam_s) / step_s: 1.0 means the step takes as long as the slower of
 * its two resources alone; computed per round (io, step and adam back to back) and the median
 * of rounds reported (also the ratio of medians). Times are medians over the rounds. Host memory
 * does not grow with
 * --params: one sub-group's gradient (reused for every sub-group) and the pool's buffers; the
 * 16-bit copy goes nowhere by default (--copy swap writes it to the files). Peak RSS comes
 * from getrusage. Files are removed at the end, also on SIGINT/SIGTERM (exit 130).
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "zinf/adam.h"
#include "zinf/offload.h"

#define DEFAULT_DIR "./zinf-bench-step"
#define MAX_STEPS   64

struct cfg {
	uint64_t params, sub_group;
	const char *path;
	uint32_t buffers, steps;
	enum zinf_step_schedule schedule;
	bool json, copy_swap;
	const char *backend;
	uint32_t block_size, queue_depth, threads;
};

static void
usage(FILE *f)
{
	fprintf(f, "usage: zinf bench step --params N [options]\n"
		   "\n"
		   "Create N parameters' fp32 master, m and v on NVMe and time the pipelined "
		   "optimizer\n"
		   "step against the same I/O alone and the same Adam alone, measured in the same "
		   "run.\n"
		   "\n"
		   "  --params N        fp32 elements of the partition (e.g. 2e8)\n"
		   "  --sub-group S     elements per sub-group (default 1e7)\n"
		   "  --path DIR        directory for the swap files (default " DEFAULT_DIR ")\n"
		   "  --buffers B       pool buffers, each one sub-group's master+m+v (default 4)\n"
		   "  --schedule S      zinf (default) | deepspeed (one read ahead, one write "
		   "behind)\n"
		   "  --steps K         rounds of io + step + adam (default 3; medians reported)\n"
		   "  --copy C          none (default) | swap: write the 16-bit copy to the files "
		   "too\n"
		   "  --backend NAME    I/O backend (default: best that works)\n"
		   "  --block-size N    I/O block size (default 1M)\n"
		   "  --queue-depth N   blocks in flight per I/O thread (default 32)\n"
		   "  --threads N       I/O threads (default 1)\n"
		   "  --json            one JSON object on stdout\n"
		   "  -h, --help        this text\n");
}

static int
parse(int argc, char **argv, struct cfg *c)
{
	static const struct option lo[] = {
		{"params", required_argument, NULL, 'n'},
		{"sub-group", required_argument, NULL, 's'},
		{"path", required_argument, NULL, 'p'},
		{"buffers", required_argument, NULL, 'b'},
		{"schedule", required_argument, NULL, 'S'},
		{"steps", required_argument, NULL, 'k'},
		{"copy", required_argument, NULL, 'c'},
		{"backend", required_argument, NULL, 'B'},
		{"block-size", required_argument, NULL, 'z'},
		{"queue-depth", required_argument, NULL, 'q'},
		{"threads", required_argument, NULL, 't'},
		{"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	memset(c, 0, sizeof(*c));
	c->sub_group = 10000000;
	c->path = DEFAULT_DIR;
	c->buffers = 4;
	c->steps = 3;
	c->block_size = 1 << 20;
	c->queue_depth = 32;
	c->threads = 1;
	optind = 1;
	int ch;
	uint64_t v;
	while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (ch) {
		case 'n':
		case 's':
		case 'b':
		case 'k':
		case 'z':
		case 'q':
		case 't':
			if (cli_parse_size(optarg, &v) || v == 0) {
				fprintf(stderr, "zinf bench step: bad number \"%s\"\n", optarg);
				return 2;
			}
			if (ch == 'n') {
				c->params = v;
			} else if (ch == 's') {
				c->sub_group = v;
			} else if (ch == 'b') {
				c->buffers = (uint32_t)v;
			} else if (ch == 'k') {
				c->steps = (uint32_t)(v < MAX_STEPS ? v : MAX_STEPS);
			} else if (ch == 'z') {
				c->block_size = (uint32_t)v;
			} else if (ch == 'q') {
				c->queue_depth = (uint32_t)v;
			} else {
				c->threads = (uint32_t)v;
			}
			break;
		case 'p':
			c->path = optarg;
			break;
		case 'S':
			if (strcmp(optarg, "zinf") == 0) {
				c->schedule = ZINF_SCHEDULE_PIPELINED;
			} else if (strcmp(optarg, "deepspeed") == 0) {
				c->schedule = ZINF_SCHEDULE_DEEPSPEED;
			} else {
				fprintf(stderr, "zinf bench step: --schedule zinf|deepspeed\n");
				return 2;
			}
			break;
		case 'c':
			if (strcmp(optarg, "none") && strcmp(optarg, "swap")) {
				fprintf(stderr, "zinf bench step: --copy none|swap\n");
				return 2;
			}
			c->copy_swap = strcmp(optarg, "swap") == 0;
			break;
		case 'B':
			c->backend = optarg;
			break;
		case 'j':
			c->json = true;
			break;
		case 'h':
			usage(stdout);
			return 1;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (c->params == 0) {
		fprintf(stderr, "zinf bench step: --params is required\n");
		usage(stderr);
		return 2;
	}
	return 0;
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double
median(const double *v, uint32_t n)
{
	double s[MAX_STEPS];
	memcpy(s, v, n * sizeof(*v));
	qsort(s, n, sizeof(*s), cmp_double);
	return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

struct ctx {
	const struct cfg *c;
	struct zinf_io *io;
	struct zinf_swap *swap;
	struct zinf_pool *pool;
	struct zinf_step *st;
	uint32_t nsg;
	struct cli_progress prog;
};

/* ---- the step's I/O alone ------------------------------------------------------------------ */

struct ring_slot {
	char *buf;
	int state; /* 0 free, 1 reading, 2 writing */
	uint32_t k;
	uint64_t seq;
	struct zinf_swap_op ops[3];
};

static const char *const kinds[3] = {"fp32", "exp_avg", "exp_avg_sq"};

static int
ring_poll(struct ctx *x, struct ring_slot *s, bool block)
{
	int rc = 0;
	for (int p = 0; p < 3; p++) {
		if (!block && !zinf_swap_poll(x->swap, &s->ops[p])) {
			return 0;
		}
	}
	for (int p = 0; p < 3; p++) {
		int r = zinf_swap_wait(x->swap, &s->ops[p]);
		rc = rc ? rc : r;
	}
	return rc ? rc : 1;
}

/*
 * Read every sub-group and write it back unchanged, with as many sub-groups in flight as the
 * step may have: the I/O-bound time of a step. Returns seconds or a negative errno.
 */
static double
run_io(struct ctx *x, uint64_t *bytes)
{
	uint32_t nb = zinf_pool_buffer_count(x->pool);
	struct ring_slot *sl = calloc(nb, sizeof(*sl));
	uint64_t a = zinf_swap_align(x->swap);
	uint64_t part = (zinf_step_sub_group_len(x->st, 0) * 4 + a - 1) / a * a;
	uint64_t seq = 0, moved = 0;
	uint32_t next = 0, done = 0;
	int err = 0;
	for (uint32_t i = 0; i < nb; i++) {
		zinf_pool_acquire(x->pool, -1, (void **)&sl[i].buf);
	}
	double t0 = zinf_now_s();
	/* Every buffer busy all the time: a buffer is refilled as soon as its operation
	 * completes. */
	while (done < x->nsg && !err && !cli_interrupted) {
		for (uint32_t i = 0; i < nb; i++) {
			struct ring_slot *s = &sl[i];
			if (s->state == 0 && next < x->nsg) {
				s->k = next++;
				s->state = 1;
				s->seq = seq++;
				for (int p = 0; p < 3; p++) {
					int id = zinf_swap_find(x->swap, kinds[p], s->k);
					zinf_swap_read_async(x->swap, id, s->buf + p * part,
							     &s->ops[p]);
				}
			}
		}
		/* Whichever operation completes first; a short sleep, not a spin, between looks. */
		struct ring_slot *s = NULL;
		int r = 0;
		while (!s) {
			for (uint32_t i = 0; i < nb && !s; i++) {
				if (sl[i].state && (r = ring_poll(x, &sl[i], false)) != 0) {
					s = &sl[i];
				}
			}
			if (!s) {
				usleep(50);
			}
		}
		if (r < 0) {
			err = r;
		} else if (s->state == 1) {
			s->state = 2;
			s->seq = seq++;
			for (int p = 0; p < 3; p++) {
				int id = zinf_swap_find(x->swap, kinds[p], s->k);
				zinf_swap_write_async(x->swap, id, s->buf + p * part, &s->ops[p]);
				moved += 2 * zinf_swap_bytes(x->swap, id);
			}
		} else {
			s->state = 0;
			done++;
			cli_progress_add(&x->prog, 1);
		}
	}
	for (uint32_t i = 0; i < nb; i++) {
		if (sl[i].state) {
			ring_poll(x, &sl[i], true);
		}
	}
	double t = zinf_now_s() - t0;
	for (uint32_t i = 0; i < nb; i++) {
		zinf_pool_release(x->pool, sl[i].buf);
	}
	free(sl);
	*bytes = moved;
	if (cli_interrupted) {
		return -EINTR;
	}
	return err ? err : t;
}

/* ---- the step, and Adam alone ------------------------------------------------------------- */

static double
run_step(struct ctx *x, int64_t t, const float *grad)
{
	double t0 = zinf_now_s();
	int rc = zinf_step_begin(x->st, t, 1.0f, NULL, false);
	if (rc) {
		return rc;
	}
	for (uint32_t k = 0; k < x->nsg && !cli_interrupted; k++) {
		if (zinf_step_ready(x->st, k, grad, ZINF_F32)) {
			break;
		}
		cli_progress_add(&x->prog, 1);
	}
	rc = zinf_step_finish(x->st);
	if (cli_interrupted) {
		return -EINTR;
	}
	return rc ? rc : zinf_now_s() - t0;
}

/*
 * The same Adam work on state in memory: every sub-group's elements, with the state in the
 * pool's buffers in rotation (as in the step, so it comes from DRAM, not a cache-resident
 * scratch array). Returns seconds.
 */
static double
run_adam(struct ctx *x, const struct zinf_adam_opts *ao, int64_t t, const float *grad)
{
	uint32_t nb = zinf_pool_buffer_count(x->pool);
	char **bufs = calloc(nb, sizeof(*bufs));
	uint64_t a = zinf_swap_align(x->swap);
	uint64_t part = (zinf_step_sub_group_len(x->st, 0) * 4 + a - 1) / a * a;
	for (uint32_t i = 0; i < nb; i++) {
		zinf_pool_acquire(x->pool, -1, (void **)&bufs[i]);
	}
	double t0 = zinf_now_s();
	for (uint32_t k = 0; k < x->nsg && !cli_interrupted; k++) {
		uint64_t len = zinf_step_sub_group_len(x->st, k);
		char *b = bufs[k % nb];
		zinf_adam_step(ao, t, 1.0f, (float *)b, grad, ZINF_F32, (float *)(b + part),
			       (float *)(b + 2 * part), len, NULL, ZINF_F16);
		cli_progress_add(&x->prog, 1);
	}
	double s = zinf_now_s() - t0;
	for (uint32_t i = 0; i < nb; i++) {
		zinf_pool_release(x->pool, bufs[i]);
	}
	free(bufs);
	return s;
}

static double
peak_rss_mib(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_maxrss / 1024.0;
}

int
cli_bench_step(int argc, char **argv)
{
	struct cfg c;
	int prc = parse(argc, argv, &c);
	if (prc) {
		return prc == 1 ? 0 : prc;
	}
	cli_catch_signals();
	int ret = 1;
	struct ctx x = {.c = &c};
	bool made_dir = mkdir(c.path, 0700) == 0;
	float *sg_buf = NULL, *am = NULL, *av = NULL, *grad = NULL;

	struct zinf_io_opts io_o;
	zinf_io_opts_init(&io_o);
	io_o.backend = c.backend;
	io_o.block_size = c.block_size;
	io_o.queue_depth = c.queue_depth;
	io_o.threads = c.threads;
	if (zinf_io_create(&io_o, &x.io)) {
		goto out;
	}
	struct zinf_swap_opts sw;
	zinf_swap_opts_init(&sw);
	const char *dirs[1] = {c.path};
	sw.dirs = dirs;
	sw.n_dirs = 1;
	sw.prefix = "zinf-bench-step";
	if (zinf_swap_create(x.io, &sw, &x.swap)) {
		goto out;
	}
	struct zinf_step_opts so;
	zinf_step_opts_init(&so);
	so.n = c.params;
	so.sub_group_size = c.sub_group;
	so.swap = x.swap;
	so.schedule = c.schedule;
	so.param_swap = c.copy_swap ? x.swap : NULL;
	struct zinf_pool_opts po;
	zinf_pool_opts_init(&po);
	po.buffer_count = c.buffers;
	po.buffer_bytes = zinf_step_buffer_bytes(&so, zinf_swap_align(x.swap));
	po.io = x.io;
	po.pin_fallback = true;
	if (zinf_pool_create(&po, &x.pool)) {
		goto out;
	}
	so.pool = x.pool;
	if (zinf_step_create(&so, &x.st) || zinf_swap_reserve(x.swap)) {
		goto out;
	}
	x.nsg = zinf_step_sub_groups(x.st);
	uint64_t sg = zinf_step_sub_group_len(x.st, 0);

	/* Initial state, one sub-group at a time: host memory stays one sub-group. */
	sg_buf = zinf_alloc_aligned(64, sg * 4);
	grad = zinf_alloc_aligned(64, sg * 4);
	am = zinf_alloc_aligned(64, sg * 4);
	av = zinf_alloc_aligned(64, sg * 4);
	if (!sg_buf || !grad || !am || !av) {
		fprintf(stderr, "zinf bench step: out of memory\n");
		goto out;
	}
	uint64_t r = 0x9e3779b97f4a7c15ull;
	for (uint64_t i = 0; i < sg; i++) {
		r ^= r << 13;
		r ^= r >> 7;
		r ^= r << 17;
		sg_buf[i] = (float)((int64_t)(r >> 11) - (1LL << 52)) * 0x1p-52f;
		grad[i] = (float)((int64_t)(r & 0xfffff) - 0x80000) * 0x1p-20f;
	}
	memset(am, 0, sg * 4);
	memset(av, 0, sg * 4);
	double t_load = zinf_now_s();
	cli_progress_init(&x.prog, "creating state", x.nsg);
	for (uint32_t k = 0; k < x.nsg && !cli_interrupted; k++) {
		const void *init[ZINF_OPTIM_MAX_PARTS] = {sg_buf};
		if (zinf_step_load(x.st, k, init)) {
			goto out;
		}
		cli_progress_add(&x.prog, 1);
	}
	cli_progress_done(&x.prog);
	t_load = zinf_now_s() - t_load;
	if (cli_interrupted) {
		goto out;
	}

	double step_s[MAX_STEPS], io_s[MAX_STEPS], adam_s[MAX_STEPS];
	uint64_t io_bytes = 0;
	struct zinf_step_stats ss = {.size = sizeof(ss)};
	struct zinf_adam_opts ao; /* the step's default optimizer: AdamW, these defaults */
	zinf_adam_opts_init(&ao);
	double wait_read = 0, wait_write = 0;
	cli_progress_init(&x.prog, "io / step / adam", (uint64_t)x.nsg * 3 * c.steps);
	for (uint32_t i = 0; i < c.steps; i++) {
		io_s[i] = run_io(&x, &io_bytes);
		step_s[i] = run_step(&x, (int64_t)i + 1, grad);
		adam_s[i] = run_adam(&x, &ao, (int64_t)i + 1, grad);
		if (io_s[i] < 0 || step_s[i] < 0) {
			cli_progress_done(&x.prog);
			if (!cli_interrupted) {
				fprintf(stderr, "zinf bench step: round %u failed: %s\n", i,
					zinf_strerror((int)(io_s[i] < 0 ? io_s[i] : step_s[i])));
			}
			goto out;
		}
		zinf_step_get_stats(x.st, &ss);
		wait_read += ss.wait_read_s;
		wait_write += ss.wait_write_s;
	}
	cli_progress_done(&x.prog);
	double step_m = median(step_s, c.steps), io_m = median(io_s, c.steps),
	       adam_m = median(adam_s, c.steps);
	uint64_t step_bytes = ss.read_bytes + ss.write_bytes;
	/* The I/O-bound time of the step: its bytes at the bandwidth the same files gave. */
	double io_gbps = io_bytes / io_m / 1e9;
	double io_bound = step_bytes / (io_gbps * 1e9);
	double eff_of_medians = fmax(io_bound, adam_m) / step_m;
	/* Each round's io, step and adam ran back to back: their ratio sees the same disk, so
	 * the median of per-round ratios is the figure that the disk's drift disturbs least. */
	double effs[MAX_STEPS];
	for (uint32_t i = 0; i < c.steps; i++) {
		double iob = step_bytes / ((double)io_bytes / io_s[i]);
		effs[i] = fmax(iob, adam_s[i]) / step_s[i];
	}
	double eff = median(effs, c.steps);
	struct zinf_io_opts eff_o;
	zinf_io_get_opts(x.io, &eff_o);

	if (c.json) {
		json_t *o = json_object();
		json_object_set_new(o, "params", json_integer((json_int_t)c.params));
		json_object_set_new(o, "sub_group", json_integer((json_int_t)c.sub_group));
		json_object_set_new(o, "sub_groups", json_integer(x.nsg));
		json_object_set_new(o, "buffers", json_integer(c.buffers));
		json_object_set_new(o, "buffer_bytes",
				    json_integer((json_int_t)zinf_pool_buffer_bytes(x.pool)));
		json_object_set_new(o, "pinned", json_boolean(zinf_pool_pinned(x.pool)));
		json_object_set_new(
			o, "schedule",
			json_string(c.schedule == ZINF_SCHEDULE_DEEPSPEED ? "deepspeed" : "zinf"));
		json_object_set_new(o, "copy", json_string(c.copy_swap ? "swap" : "none"));
		json_object_set_new(o, "backend", json_string(zinf_io_backend(x.io)));
		json_object_set_new(o, "block_size", json_integer(eff_o.block_size));
		json_object_set_new(o, "queue_depth", json_integer(eff_o.queue_depth));
		json_object_set_new(o, "threads", json_integer(eff_o.threads));
		json_object_set_new(o, "steps", json_integer(c.steps));
		json_object_set_new(o, "step_s", json_real(step_m));
		json_t *all = json_array();
		for (uint32_t i = 0; i < c.steps; i++) {
			json_array_append_new(all, json_real(step_s[i]));
		}
		json_object_set_new(o, "step_s_all", all);
		json_object_set_new(o, "read_bytes", json_integer((json_int_t)ss.read_bytes));
		json_object_set_new(o, "write_bytes", json_integer((json_int_t)ss.write_bytes));
		json_object_set_new(o, "adam_s", json_real(adam_m));
		json_object_set_new(o, "io_s", json_real(io_m));
		json_object_set_new(o, "io_GBps", json_real(io_gbps));
		json_object_set_new(o, "io_bound_s", json_real(io_bound));
		json_object_set_new(o, "step_GBps", json_real(step_bytes / step_m / 1e9));
		json_object_set_new(o, "efficiency", json_real(eff));
		json_object_set_new(o, "efficiency_of_medians", json_real(eff_of_medians));
		json_t *ea = json_array();
		for (uint32_t i = 0; i < c.steps; i++) {
			json_array_append_new(ea, json_real(effs[i]));
		}
		json_object_set_new(o, "efficiency_all", ea);
		json_object_set_new(o, "wait_read_s", json_real(wait_read / c.steps));
		json_object_set_new(o, "wait_write_s", json_real(wait_write / c.steps));
		json_object_set_new(o, "max_reads_in_flight", json_integer(ss.max_reads_in_flight));
		json_object_set_new(o, "load_s", json_real(t_load));
		json_object_set_new(o, "peak_rss_MiB", json_real(peak_rss_mib()));
		char *s = json_dumps(o, JSON_INDENT(2));
		printf("%s\n", s);
		free(s);
		json_decref(o);
	} else {
		printf("zinf bench step: %llu params, %u sub-groups of %llu, %u buffers of %.1f "
		       "MiB, "
		       "schedule %s, backend %s\n",
		       (unsigned long long)c.params, x.nsg, (unsigned long long)c.sub_group,
		       c.buffers, zinf_pool_buffer_bytes(x.pool) / 1048576.0,
		       c.schedule == ZINF_SCHEDULE_DEEPSPEED ? "deepspeed" : "zinf",
		       zinf_io_backend(x.io));
		printf("  step      %8.3f s (median of %u)   %.2f GB/s of state moved\n", step_m,
		       c.steps, step_bytes / step_m / 1e9);
		printf("  io alone  %8.3f s   %.2f GB/s (read+write, same files, same depth)\n",
		       io_m, io_gbps);
		printf("  adam      %8.3f s   (same Adam work in memory)\n", adam_m);
		printf("  efficiency %.3f (median of rounds); of medians: max(io-bound %.3f s, "
		       "adam "
		       "%.3f s) / step %.3f s = %.3f\n",
		       eff, io_bound, adam_m, step_m, eff_of_medians);
		printf("  read %llu bytes, write %llu bytes per step; peak RSS %.1f MiB\n",
		       (unsigned long long)ss.read_bytes, (unsigned long long)ss.write_bytes,
		       peak_rss_mib());
	}
	ret = 0;
out:
	zinf_free_aligned(sg_buf);
	zinf_free_aligned(grad);
	zinf_free_aligned(am);
	zinf_free_aligned(av);
	zinf_step_destroy(x.st);
	zinf_pool_destroy(x.pool);
	zinf_swap_destroy(x.swap);
	zinf_io_destroy(x.io);
	if (made_dir) {
		rmdir(c.path);
	}
	if (cli_interrupted) {
		return 130;
	}
	return ret;
}
