/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli/bench/bench_step.c: `zinf bench step`, the pipelined optimizer step over the optimizer's
 * state
 * (--optimizer, --state: fp32 master plus its parts, found through zinf_step_part_info) on NVMe.
 * Creates the state of --params elements in swap files under --path, then runs
 * --steps rounds; each round measures three things on the same files (the disk's speed drifts),
 * in an order rotated from round to round so that no measurement always follows the same one:
 *
 *   io:    the step's I/O without Adam: every sub-group read and written back through the same
 *          pool buffers, as many in flight as the step has (min(buffers, sub-groups + 1));
 *   step:  the optimizer step (zinf_step_begin / ready per sub-group / finish);
 *   adam:  the same optimizer work on state in memory, in the chunks the step runs it in
 *          (ZINF_STEP_CHUNK elements), over the same buffers in rotation.
 *
 * efficiency = max(io-bound, adam) / step, per round, and its median over the rounds is
 * reported. io-bound is the round's io time scaled to the bytes the step moved that round. Both
 * references measure the step's own work done one part at a time, so a value above 1 is
 * measurement noise (reported as measured, never clamped). Host memory does not grow with
 * --params beyond the per-sub-group tables: one sub-group's gradient and initial values, and the
 * pool; all of it is checked against physical memory before it is allocated. Peak RSS comes
 * from getrusage. Files are removed at the end, also on SIGINT/SIGTERM/SIGHUP/SIGPIPE; a killed
 * run's files are removed by the next run in the same directory.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/bench/bench.h"
#include "common/dtype.h"
#include "zinf/blocks/offload.h"
#include "zinf/blocks/optimizer.h"

#define PROG	     "zinf bench step"
#define DEFAULT_DIR  "./zinf-bench-step"
#define SCRATCH_STEM "zinf-bench-step"
/* Host memory per sub-group besides the pool: its swap tensors' tables (up to 4 parts with the
 * copy) and the step's arrays. */
#define SUB_GROUP_HOST_BYTES 576

static const char *const backends[] = {"auto", "io_uring", "libaio", "psync", NULL};
static const char *const schedules[] = {"zinf", "deepspeed", NULL};
static const char *const copies[] = {"none", "swap", NULL};
/* In zinf_optim_kind's order. */
static const char *const optimizers[] = {"adam", "adamw", "adagrad", "lion", NULL};
static const char *const states[] = {"f32", "bf16", "q8", NULL};
static const char *const masters[] = {"f32", "bf16", NULL};

struct cfg {
	uint64_t params, sub_group;
	const char *path;
	uint32_t buffers, steps;
	int schedule, copy, backend, optimizer, state;
	int master; /* --master: states[] (f32 or bf16) */
	bool json, buffered;
	uint64_t block_size;
	uint32_t queue_depth, threads;
};

static struct cfg cfg;

static const char synopsis[] = "--params N [options]";
static const char description[] =
	"Create N parameters' optimizer state (fp32 master and the optimizer's parts: m and v\n"
	"for Adam) on NVMe and time the pipelined optimizer step against the same I/O alone and\n"
	"the same optimizer work alone, measured in the same rounds (order rotated per round).\n"
	"--state bf16 keeps Adam's m and v in bfloat16 (stochastic rounding): 8 bytes of state\n"
	"per parameter instead of 12, a third less disk traffic; --state q8 keeps them as 8-bit\n"
	"codes with one fp32 scale per 256 (zinf_adam_step_q8state): 6.03 bytes per parameter.\n"
	"--master bf16 keeps the master weight in bfloat16 (stochastic rounding,\n"
	"zinf_adam_step_bf16master) with any --state: 2 bytes of state per parameter fewer.\n"
	"\n"
	"efficiency = max(io-bound, adam) / step per round, median of rounds: 1.0 means the\n"
	"step takes as long as the slower of its two parts done alone (the step's I/O through\n"
	"the same buffers, its Adam in the same chunks); above 1 only by measurement noise.\n";

static const struct cli_opt opts[] = {
	{"params", CLI_COUNT, &cfg.params, NULL, "N", "fp32 elements of the partition (e.g. 2e8)",
	 .min = 1, .flags = CLI_REQUIRED},
	{"sub-group", CLI_COUNT, &cfg.sub_group, "1e7", "N", "elements per sub-group", .min = 1},
	{"path", CLI_STR, &cfg.path, DEFAULT_DIR, "DIR", "directory for the swap files"},
	{"buffers", CLI_U32, &cfg.buffers, "4", "N", "pool buffers, each one sub-group's state",
	 .min = 1, .max = 1024},
	{"optimizer", CLI_ENUM, &cfg.optimizer, "adamw", NULL, "optimizer and its state parts",
	 .choices = optimizers},
	{"state", CLI_ENUM, &cfg.state, "f32", NULL,
	 "the parts after the master: f32, bf16 or q8 (8-bit blockwise; bf16 and q8: adam and "
	 "adamw only)",
	 .choices = states},
	{"schedule", CLI_ENUM, &cfg.schedule, "zinf", NULL,
	 "deepspeed: one read ahead, one write behind", .choices = schedules},
	{"steps", CLI_U32, &cfg.steps, "3", "N", "rounds of io + step + adam; medians reported",
	 .min = 1, .max = 1000},
	{"copy", CLI_ENUM, &cfg.copy, "none", NULL, "swap: write the 16-bit copy to the files too",
	 .choices = copies},
	{"backend", CLI_ENUM, &cfg.backend, "auto", NULL, "I/O backend (auto: the best that works)",
	 .choices = backends},
	{"block-size", CLI_SIZE, &cfg.block_size, "1M", "N", "I/O block size", .min = 4096,
	 .max = 1 << 30, .flags = CLI_POW2},
	{"queue-depth", CLI_U32, &cfg.queue_depth, "32", "N", "blocks in flight per I/O thread",
	 .min = 1, .max = 4096},
	{"threads", CLI_U32, &cfg.threads, "1", "N", "I/O threads", .min = 1, .max = 64},
	{"buffered", CLI_FLAG, &cfg.buffered, NULL, NULL,
	 "buffered I/O where the file system has no O_DIRECT (tmpfs)"},
	{"json", CLI_FLAG, &cfg.json, NULL, NULL, "one JSON object on stdout"},
	{"master", CLI_ENUM, &cfg.master, "f32", NULL,
	 "the master weight: f32 or bf16 (stochastic rounding; adam and adamw only)",
	 .choices = masters},
	{NULL},
};

struct ctx {
	const struct cfg *c;
	struct zinf_io *io;
	struct zinf_swap *swap;
	struct zinf_pool *pool;
	struct zinf_step *st;
	struct zinf_optimizer *opt;
	struct zinf_step_opts so;
	uint32_t nparts; /* the optimizer's state parts (the step's parts, less the copy) */
	uint32_t nsg;
	uint32_t slots; /* buffers in flight, as the step takes them: min(buffers, nsg + 1) */
	float *init, *grad;
	bool made_dir, reclaimed;
	bool direct; /* the swap files got O_DIRECT (not the page cache) */
	struct cli_progress prog;
};

/* One round's measurements. */
struct round {
	double io_s, step_s, adam_s;
	uint64_t io_bytes, step_bytes;
	double eff; /* max(io-bound, adam) / step */
	struct zinf_step_stats ss;
};

/* ---- the step's I/O alone ------------------------------------------------------------------ */

struct ring_slot {
	char *buf;
	int state; /* 0 free, 1 reading, 2 writing */
	uint32_t k;
	uint64_t seq;
	uint32_t started; /* ops[0..started) were submitted and are to be waited on */
	struct zinf_swap_op ops[ZINF_OPTIM_MAX_PARTS];
};

/* Bytes of part p of a sub-group in a buffer (the largest sub-group's, aligned), and its
 * offset: the parts one after another, as the step lays them out. */
static uint64_t
part_bytes(const struct ctx *x, uint32_t p)
{
	uint64_t a = zinf_swap_align(x->swap);
	uint64_t b = zinf_optimizer_part_size(x->opt, p, zinf_step_sub_group_len(x->st, 0));
	return (b + a - 1) / a * a;
}

static uint64_t
part_off(const struct ctx *x, uint32_t p)
{
	uint64_t off = 0;
	for (uint32_t q = 0; q < p; q++) {
		off += part_bytes(x, q);
	}
	return off;
}

static int
ring_poll(struct ctx *x, struct ring_slot *s, bool block)
{
	int rc = 0;
	for (uint32_t p = 0; p < s->started; p++) {
		if (!block && !zinf_swap_poll(x->swap, &s->ops[p])) {
			return 0;
		}
	}
	for (uint32_t p = 0; p < s->started; p++) {
		int r = zinf_swap_wait(x->swap, &s->ops[p]);
		rc = rc ? rc : r;
	}
	s->started = 0;
	return rc ? rc : 1;
}

/*
 * Start sub-group s->k's parts (read, or write back). A part that cannot be submitted is an
 * error (its message names the file); the parts already submitted stay in flight in s, to be
 * waited on. Returns 0 or that error.
 */
static int
ring_start(struct ctx *x, struct ring_slot *s, bool write, uint64_t *moved)
{
	for (uint32_t p = 0; p < x->nparts; p++) {
		int id = zinf_step_swap_id(x->st, s->k, p);
		void *buf = s->buf + part_off(x, p);
		int rc = write ? zinf_swap_write_async(x->swap, id, buf, &s->ops[p])
			       : zinf_swap_read_async(x->swap, id, buf, &s->ops[p]);
		if (rc < 0) {
			fprintf(stderr,
				PROG ": %s of sub-group %u part %u could not be submitted: %s\n",
				write ? "write" : "read", s->k, p, zinf_last_error());
			return rc;
		}
		s->started = p + 1;
		if (write) {
			*moved += 2 * zinf_swap_bytes(x->swap, id);
		}
	}
	return 0;
}

/*
 * Read every sub-group and write it back unchanged, with as many sub-groups in flight as the
 * step may have: the I/O-bound time of a step. Returns seconds or a negative errno.
 */
static double
run_io(struct ctx *x, uint64_t *bytes)
{
	uint32_t nb = x->slots;
	struct ring_slot *sl = calloc(nb, sizeof(*sl));
	if (!sl) {
		return -ENOMEM;
	}
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
				err = ring_start(x, s, false, &moved);
				if (err) {
					break;
				}
			}
		}
		if (err) {
			break;
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
			err = ring_start(x, s, true, &moved);
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
	int rr = 0;
	for (uint32_t k = 0; k < x->nsg && !cli_interrupted && rr == 0; k++) {
		rr = zinf_step_ready(x->st, k, grad, ZINF_F32);
		cli_progress_add(&x->prog, 1);
	}
	/* A step cut short (an interrupt, or a refused sub-group, whose error is printed): its
	 * finish reports the sub-groups never made ready, which is no news; not printed. */
	bool short_step = rr || cli_interrupted;
	if (short_step) {
		zinf_log_set_callback(NULL, NULL);
	}
	rc = zinf_step_finish(x->st);
	if (short_step) {
		zinf_log_set_callback(zinf_log_to_file, stderr);
	}
	if (cli_interrupted) {
		return -EINTR;
	}
	rc = rr ? rr : rc;
	return rc ? rc : zinf_now_s() - t0;
}

/*
 * The same optimizer work on state in memory, as the step runs it: every sub-group's elements
 * in chunks of ZINF_STEP_CHUNK, with the state in the pool's buffers in rotation over as many
 * buffers as the step uses (so it comes from DRAM, not a cache-resident scratch array).
 * Returns seconds or a negative errno.
 */
static double
run_adam(struct ctx *x, int64_t t, const float *grad)
{
	uint32_t nb = x->slots;
	char **bufs = calloc(nb, sizeof(*bufs));
	if (!bufs) {
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < nb; i++) {
		zinf_pool_acquire(x->pool, -1, (void **)&bufs[i]);
	}
	int rc = 0;
	double t0 = zinf_now_s();
	for (uint32_t k = 0; k < x->nsg && !cli_interrupted && !rc; k++) {
		uint64_t len = zinf_step_sub_group_len(x->st, k);
		uint64_t start = zinf_step_sub_group_start(x->st, k);
		for (uint64_t i = 0, n; (n = zinf_step_piece(i, len)) > 0 && !rc; i += n) {
			void *parts[ZINF_OPTIM_MAX_PARTS];
			for (uint32_t p = 0; p < x->nparts; p++) {
				parts[p] = bufs[k % nb] + part_off(x, p) +
					   zinf_optimizer_part_size(x->opt, p, i);
			}
			rc = zinf_optimizer_step(x->opt, t, 1.0f, parts, grad + i, ZINF_F32,
						 start + i, n, NULL, ZINF_F16);
		}
		cli_progress_add(&x->prog, 1);
	}
	double s = zinf_now_s() - t0;
	for (uint32_t i = 0; i < nb; i++) {
		zinf_pool_release(x->pool, bufs[i]);
	}
	free(bufs);
	if (cli_interrupted) {
		return -EINTR;
	}
	return rc ? rc : s;
}

static double
peak_rss_mib(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_maxrss / 1024.0;
}

/* ---- set-up ------------------------------------------------------------------------------- */

/*
 * Open the I/O engine and the swap space, check the memory the run will take (pool, the
 * per-sub-group tables, one sub-group's gradient and initial values) against physical memory,
 * then make the pool and the step and reserve the files. Library errors were logged by the
 * library; the CLI prints only its own. Returns 0 or a negative errno.
 */
static int
setup(struct ctx *x)
{
	const struct cfg *c = x->c;
	struct zinf_io_opts io_o;
	zinf_io_opts_init(&io_o);
	io_o.backend = c->backend ? backends[c->backend] : NULL;
	io_o.block_size = (uint32_t)c->block_size;
	io_o.queue_depth = c->queue_depth;
	io_o.threads = c->threads;
	int rc = zinf_io_create(&io_o, &x->io);
	if (rc) {
		return rc;
	}
	char prefix[CLI_PREFIX_MAX];
	cli_scratch_prefix(prefix, sizeof(prefix), SCRATCH_STEM);
	struct zinf_swap_opts sw;
	zinf_swap_opts_init(&sw);
	const char *dirs[1] = {c->path};
	sw.dirs = dirs;
	sw.n_dirs = 1;
	sw.prefix = prefix;
	sw.buffered = c->buffered;
	if ((rc = cli_swap_create(PROG, x->io, &sw, &x->swap))) {
		return rc;
	}
	x->direct = zinf_swap_dir_direct(x->swap, 0);
	struct zinf_optimizer_opts oo;
	zinf_optimizer_opts_init(&oo, (enum zinf_optim_kind)c->optimizer);
	oo.state_dtype = c->state == 1 ? ZINF_BF16 : ZINF_F32;
	oo.state_format = c->state == 2 ? ZINF_STATE_Q8 : ZINF_STATE_PLAIN;
	oo.master_dtype = c->master == 1 ? ZINF_BF16 : ZINF_F32;
	if ((rc = zinf_optimizer_create(&oo, &x->opt))) {
		return rc; /* the library's message names the optimizer and the state dtype */
	}
	x->nparts = zinf_optimizer_part_count(x->opt);
	struct zinf_step_opts *so = &x->so;
	zinf_step_opts_init(so);
	so->optimizer = x->opt;
	so->n = c->params;
	so->sub_group_size = c->sub_group;
	so->swap = x->swap;
	so->schedule = c->schedule ? ZINF_SCHEDULE_DEEPSPEED : ZINF_SCHEDULE_PIPELINED;
	so->param_swap = c->copy ? x->swap : NULL;
	struct zinf_pool_opts po;
	zinf_pool_opts_init(&po);
	po.buffer_count = c->buffers;
	po.buffer_bytes = zinf_step_buffer_bytes(so, zinf_swap_align(x->swap));
	po.io = x->io;
	po.pin_fallback = true;
	struct zinf_pool_budget bud = {0};
	zinf_pool_check(&po, &bud); /* fills the budget in every case; its verdict comes below */
	uint64_t sg = c->sub_group < c->params ? c->sub_group : c->params;
	uint64_t nsg = c->params / sg + (c->params % sg != 0); /* params + sg - 1 wraps */
	double need = (double)bud.bytes + 2.0 * (double)sg * 4 + (double)nsg * SUB_GROUP_HOST_BYTES;
	if (cli_check_memory(PROG, "the pool, one sub-group's arrays and the sub-group tables",
			     need,
			     "--buffers or --sub-group (or raise --sub-group: fewer tables)") < 0) {
		return -ENOMEM;
	}
	if ((rc = zinf_pool_create(&po, &x->pool))) {
		if (rc == -ENOMEM) { /* fits physical memory (checked): a limit, as ulimit -v */
			fprintf(stderr, PROG ": lower --buffers or --sub-group\n");
		}
		return rc;
	}
	so->pool = x->pool;
	if ((rc = zinf_step_create(so, &x->st)) || (rc = zinf_swap_reserve(x->swap))) {
		return rc;
	}
	x->nsg = zinf_step_sub_groups(x->st);
	x->slots = c->buffers < x->nsg + 1 ? c->buffers : x->nsg + 1;
	x->init = zinf_alloc_aligned(64, sg * 4);
	x->grad = zinf_alloc_aligned(64, sg * 4);
	if (!x->init || !x->grad) {
		fprintf(stderr, PROG ": out of memory for a sub-group of %llu elements\n",
			(unsigned long long)sg);
		return -ENOMEM;
	}
	return 0;
}

/* Initial state, one sub-group at a time: host memory stays one sub-group. Returns seconds. */
static double
load_state(struct ctx *x)
{
	uint64_t sg = zinf_step_sub_group_len(x->st, 0);
	uint64_t r = 0x9e3779b97f4a7c15ull;
	for (uint64_t i = 0; i < sg; i++) {
		r ^= r << 13;
		r ^= r >> 7;
		r ^= r << 17;
		x->init[i] = (float)((int64_t)(r >> 11) - (1LL << 52)) * 0x1p-52f;
		x->grad[i] = (float)((int64_t)(r & 0xfffff) - 0x80000) * 0x1p-20f;
	}
	if (zinf_optimizer_part_dtype(x->opt, 0) == ZINF_BF16) {
		/* a bf16 master: rounded to nearest, in place (front to back) */
		for (uint64_t i = 0; i < sg; i++) {
			uint16_t h = dt_f32_to_bf16_rne(x->init[i]);
			memcpy((char *)x->init + 2 * i, &h, sizeof(h));
		}
	}
	double t0 = zinf_now_s();
	cli_progress_init(&x->prog, "creating state", x->nsg);
	for (uint32_t k = 0; k < x->nsg && !cli_interrupted; k++) {
		const void *state[ZINF_OPTIM_MAX_PARTS] = {x->init}; /* the other parts: zeros */
		int rc = zinf_step_load(x->st, k, state);
		if (rc) {
			cli_progress_done(&x->prog);
			return rc;
		}
		cli_progress_add(&x->prog, 1);
	}
	cli_progress_done(&x->prog);
	return cli_interrupted ? -EINTR : zinf_now_s() - t0;
}

/* ---- rounds ------------------------------------------------------------------------------- */

/*
 * Round i: io, step and adam, starting with measurement i % 3 so that each follows each other
 * one equally often. Returns 0 or a negative errno.
 */
static int
run_round(struct ctx *x, uint32_t i, struct round *r)
{
	int64_t t = (int64_t)i + 1;
	for (int j = 0; j < 3; j++) {
		double v;
		switch ((i + j) % 3) {
		case 0:
			v = r->io_s = run_io(x, &r->io_bytes);
			break;
		case 1:
			v = r->step_s = run_step(x, t, x->grad);
			r->ss.size = sizeof(r->ss);
			zinf_step_get_stats(x->st, &r->ss);
			break;
		default:
			v = r->adam_s = run_adam(x, t, x->grad);
			break;
		}
		if (v < 0) {
			return (int)v;
		}
	}
	r->step_bytes = r->ss.read_bytes + r->ss.write_bytes;
	double io_bound = r->io_s * (double)r->step_bytes / (double)r->io_bytes;
	r->eff = fmax(io_bound, r->adam_s) / r->step_s;
	return 0;
}

/* ---- report ------------------------------------------------------------------------------- */

struct summary {
	double step_s, io_s, adam_s, io_GBps, io_bound_s, eff, eff_of_medians;
	double wait_read_s, wait_write_s, load_s;
	uint64_t step_bytes;
	const char *bound; /* "io" or "adam": the slower part alone */
};

static void
summarise(const struct ctx *x, const struct round *r, uint32_t n, double load_s, struct summary *s)
{
	double *v = calloc(n, sizeof(*v));
	double med[4] = {NAN, NAN, NAN, NAN};
	for (int q = 0; q < 4 && v; q++) {
		for (uint32_t i = 0; i < n; i++) {
			v[i] = q == 0	? r[i].step_s
			       : q == 1 ? r[i].io_s
			       : q == 2 ? r[i].adam_s
					: r[i].eff;
		}
		med[q] = cli_median(v, n);
	}
	free(v);
	memset(s, 0, sizeof(*s));
	s->step_s = med[0];
	s->io_s = med[1];
	s->adam_s = med[2];
	s->eff = med[3];
	s->step_bytes = r[n - 1].step_bytes;
	s->io_GBps = (double)r[n - 1].io_bytes / s->io_s / 1e9;
	s->io_bound_s = (double)s->step_bytes / (s->io_GBps * 1e9);
	s->eff_of_medians = fmax(s->io_bound_s, s->adam_s) / s->step_s;
	s->bound = s->io_bound_s >= s->adam_s ? "io" : "adam";
	for (uint32_t i = 0; i < n; i++) {
		s->wait_read_s += r[i].ss.wait_read_s / n;
		s->wait_write_s += r[i].ss.wait_write_s / n;
	}
	s->load_s = load_s;
}

static json_t *
per_round(const struct round *r, uint32_t n, size_t off)
{
	json_t *a = json_array();
	for (uint32_t i = 0; i < n; i++) {
		json_array_append_new(a,
				      cli_json_real(*(const double *)((const char *)&r[i] + off)));
	}
	return a;
}

static int
report_json(const struct ctx *x, const struct round *r, const struct summary *s)
{
	const struct cfg *c = x->c;
	struct zinf_io_opts eo;
	zinf_io_get_opts(x->io, &eo);
	const struct zinf_step_stats *ss = &r[c->steps - 1].ss;
	json_t *o = json_object();
	json_object_set_new(o, "params", json_integer((json_int_t)c->params));
	json_object_set_new(o, "sub_group",
			    json_integer((json_int_t)zinf_step_sub_group_len(x->st, 0)));
	json_object_set_new(o, "sub_groups", json_integer(x->nsg));
	json_object_set_new(o, "buffers", json_integer(c->buffers));
	json_object_set_new(o, "buffers_in_flight", json_integer(ss->buffers));
	json_object_set_new(o, "buffer_bytes",
			    json_integer((json_int_t)zinf_pool_buffer_bytes(x->pool)));
	json_object_set_new(o, "pinned", json_boolean(zinf_pool_pinned(x->pool)));
	json_object_set_new(o, "schedule", json_string(schedules[c->schedule]));
	json_object_set_new(o, "optimizer", json_string(zinf_optimizer_name(x->opt)));
	json_object_set_new(o, "state", json_string(states[c->state]));
	json_object_set_new(o, "master", json_string(masters[c->master]));
	json_object_set_new(o, "state_bytes_per_param",
			    json_integer(zinf_optimizer_state_bytes(x->opt)));
	json_object_set_new(o, "copy", json_string(copies[c->copy]));
	json_object_set_new(o, "state_size_per_param",
			    cli_json_real((double)zinf_optimizer_state_size(x->opt, c->params) /
					  (double)c->params));
	json_object_set_new(
		o, "io_bytes_per_param",
		cli_json_real((double)(ss->read_bytes + ss->write_bytes) / (double)c->params));
	json_object_set_new(o, "backend", json_string(zinf_io_backend(x->io)));
	json_object_set_new(o, "buffered", json_boolean(c->buffered));
	json_object_set_new(o, "direct", json_boolean(x->direct));
	json_object_set_new(o, "block_size", json_integer(eo.block_size));
	json_object_set_new(o, "queue_depth", json_integer(eo.queue_depth));
	json_object_set_new(o, "threads", json_integer(eo.threads));
	json_object_set_new(o, "steps", json_integer(c->steps));
	json_object_set_new(o, "step_s", cli_json_real(s->step_s));
	json_object_set_new(o, "step_s_all",
			    per_round(r, c->steps, offsetof(struct round, step_s)));
	json_object_set_new(o, "read_bytes", json_integer((json_int_t)ss->read_bytes));
	json_object_set_new(o, "write_bytes", json_integer((json_int_t)ss->write_bytes));
	json_object_set_new(o, "adam_s", cli_json_real(s->adam_s));
	json_object_set_new(o, "adam_s_all",
			    per_round(r, c->steps, offsetof(struct round, adam_s)));
	json_object_set_new(o, "adam_in_step_s_all",
			    per_round(r, c->steps, offsetof(struct round, ss.optim_s)));
	json_object_set_new(o, "io_s", cli_json_real(s->io_s));
	json_object_set_new(o, "io_bytes", json_integer((json_int_t)r[c->steps - 1].io_bytes));
	json_object_set_new(o, "io_s_all", per_round(r, c->steps, offsetof(struct round, io_s)));
	json_object_set_new(o, "io_GBps", cli_json_real(s->io_GBps));
	json_object_set_new(o, "io_bound_s", cli_json_real(s->io_bound_s));
	json_object_set_new(o, "step_GBps", cli_json_real((double)s->step_bytes / s->step_s / 1e9));
	json_object_set_new(o, "bound", json_string(s->bound));
	json_object_set_new(o, "efficiency", cli_json_real(s->eff));
	json_object_set_new(o, "efficiency_of_medians", cli_json_real(s->eff_of_medians));
	json_object_set_new(o, "efficiency_all",
			    per_round(r, c->steps, offsetof(struct round, eff)));
	json_object_set_new(o, "wait_read_s", cli_json_real(s->wait_read_s));
	json_object_set_new(o, "wait_write_s", cli_json_real(s->wait_write_s));
	json_object_set_new(o, "max_reads_in_flight", json_integer(ss->max_reads_in_flight));
	json_object_set_new(o, "load_s", cli_json_real(s->load_s));
	json_object_set_new(o, "peak_rss_MiB", cli_json_real(peak_rss_mib()));
	return cli_json_print(o, 2);
}

static void
report_human(const struct ctx *x, const struct round *r, const struct summary *s)
{
	const struct cfg *c = x->c;
	const struct zinf_step_stats *ss = &r[c->steps - 1].ss;
	char bb[32];
	cli_size_str(bb, sizeof(bb), zinf_pool_buffer_bytes(x->pool));
	printf(PROG
	       ": %llu params, %s with %s master, %s state (%.3f bytes/param), %u sub-groups of "
	       "%llu, %u buffers of %s (%s), schedule %s, backend %s%s\n",
	       (unsigned long long)c->params, zinf_optimizer_name(x->opt), masters[c->master],
	       states[c->state],
	       (double)zinf_optimizer_state_size(x->opt, c->params) / (double)c->params, x->nsg,
	       (unsigned long long)zinf_step_sub_group_len(x->st, 0), c->buffers, bb,
	       zinf_pool_pinned(x->pool) ? "pinned" : "not pinned", schedules[c->schedule],
	       zinf_io_backend(x->io), x->direct ? "" : ", buffered I/O (page cache)");
	printf("  step      %8.3f s (median of %u)   %.2f GB/s of state moved\n", s->step_s,
	       c->steps, (double)s->step_bytes / s->step_s / 1e9);
	printf("  io alone  %8.3f s   %.2f GB/s (read+write, same files, %u buffers in flight)\n",
	       s->io_s, s->io_GBps, x->slots);
	printf("  %-9s %8.3f s   (same optimizer work in memory, same chunks)\n",
	       zinf_optimizer_name(x->opt), s->adam_s);
	printf("  efficiency %.3f (median of rounds; %s-bound); of medians: max(io-bound %.3f s, "
	       "adam %.3f s) / step %.3f s = %.3f\n",
	       s->eff, s->bound, s->io_bound_s, s->adam_s, s->step_s, s->eff_of_medians);
	printf("  read %llu bytes, write %llu bytes per step (%.3f + %.3f bytes per param); peak "
	       "RSS "
	       "%.1f MiB\n",
	       (unsigned long long)ss->read_bytes, (unsigned long long)ss->write_bytes,
	       (double)ss->read_bytes / (double)c->params,
	       (double)ss->write_bytes / (double)c->params, peak_rss_mib());
}

/* ---- entry -------------------------------------------------------------------------------- */

static void
teardown(struct ctx *x)
{
	zinf_free_aligned(x->init);
	zinf_free_aligned(x->grad);
	zinf_step_destroy(x->st);
	zinf_optimizer_destroy(x->opt);
	zinf_pool_destroy(x->pool);
	zinf_swap_destroy(x->swap); /* removes the files */
	zinf_io_destroy(x->io);
	/* Made by this run, or the default one a killed run left: an empty directory goes. */
	if (x->made_dir || (x->reclaimed && strcmp(x->c->path, DEFAULT_DIR) == 0)) {
		rmdir(x->c->path);
	}
}

/* Set up, load, run the rounds. Returns 0 or a negative errno (printed by whoever failed). */
static int
bench(struct ctx *x, struct round *r, double *load_s)
{
	int rc = setup(x);
	if (rc) {
		return rc;
	}
	double t = load_state(x);
	if (t < 0) {
		return (int)t;
	}
	*load_s = t;
	cli_progress_init(&x->prog, "io / step / adam", (uint64_t)x->nsg * 3 * x->c->steps);
	for (uint32_t i = 0; i < x->c->steps && rc == 0; i++) {
		rc = run_round(x, i, &r[i]);
	}
	cli_progress_done(&x->prog);
	return rc;
}

int
cli_bench_step(int argc, char **argv)
{
	int rc = cli_opts_main(PROG, synopsis, description, opts, argc, argv);
	if (rc >= 0) {
		return rc;
	}
	struct cfg c = cfg;
	struct ctx x = {.c = &c};
	struct round *r = calloc(c.steps, sizeof(*r));
	if (!r) {
		return 1;
	}
	x.made_dir = mkdir(c.path, 0700) == 0;
	cli_catch_signals();
	x.reclaimed = cli_reclaim_scratch(PROG, c.path, SCRATCH_STEM) > 0;
	double load_s = 0;
	rc = bench(&x, r, &load_s);
	if (rc == 0) {
		struct summary s;
		summarise(&x, r, c.steps, load_s, &s);
		if (c.json) {
			rc = report_json(&x, r, &s);
		} else {
			report_human(&x, r, &s);
		}
	}
	teardown(&x);
	free(r);
	if (cli_interrupted) {
		fprintf(stderr, PROG ": interrupted (signal %d); files removed\n",
			(int)cli_interrupted);
		return cli_interrupt_status();
	}
	return rc == 0 ? 0 : 1;
}
