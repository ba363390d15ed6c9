/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli/bench/bench_io.c: `zinf bench io`, the write and read bandwidth of the I/O engine through
 * swap files (zinf_swap over zinf_io), on one directory or striped over several.
 *
 * Two buffer patterns. "large" (default): the data set is one tensor per 1 GiB in one large
 * registered buffer, each moved by a single request that the engine splits into blocks kept
 * queue_depth deep. "small": tensors of one block each, queue_depth buffers of one block
 * cycled as fio does (submit queue_depth, wait for the oldest, reuse its buffer).
 *
 * Writes run before reads (the reads need the data). With O_DIRECT the page cache plays no
 * part, so it is not dropped. --sweep runs a grid of block size x queue depth x threads and
 * prints the best setting as DeepSpeed's "aio" section. Files are removed at the end, also on
 * SIGINT/SIGTERM (exit 130).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/bench/bench.h"
#include "common/util.h"
#include "nvme/crc32c.h"
#include "zinf/blocks/io.h"
#include "zinf/blocks/swap.h"

#define PROG	     "zinf bench io"
#define LARGE_CHUNK  (1ull << 30) /* bytes per tensor in the "large" pattern */
#define DEFAULT_DIR  "./zinf-bench-io"
#define SCRATCH_STEM "zinf-bench-io"
/* Host memory per tensor besides its buffer: the swap's table entry, extents, hash slot, id. */
#define TENSOR_HOST_BYTES 128

enum pattern { PAT_LARGE = 0, PAT_SMALL = 1 };
enum mode { MODE_BOTH = 0, MODE_READ = 1, MODE_WRITE = 2 };

static const char *const backends[] = {"auto", "io_uring", "libaio", "psync", NULL};
static const char *const modes[] = {"both", "read", "write", NULL};
static const char *const patterns[] = {"large", "small", NULL};

struct bench_cfg {
	struct cli_list paths;
	uint64_t size;	      /* bytes */
	uint64_t block_size;  /* bytes */
	uint32_t queue_depth; /* blocks per worker */
	uint32_t threads;
	int backend; /* index into backends; 0: best */
	int mode;
	bool json, sweep, crc, sqpoll, buffered, size_given;
	uint32_t rounds; /* --sweep: rounds over the grid */
	int pattern;
	uint64_t stripe_unit; /* bytes */
};

struct bench_res {
	char backend[16];
	double write_s, read_s; /* < 0: not run */
	uint64_t bytes;
	double crc_GBps, crc_table_GBps; /* zinf_crc32c and the table fallback; < 0: not run */
	uint64_t max_inflight;		 /* blocks in flight at most (the engine's stats) */
	uint64_t wakeups;		 /* workers woken from a wait by a new request */
	bool registered;		 /* the buffers are registered with the backend */
	bool direct;			 /* every directory did O_DIRECT */
};

static const char synopsis[] = "[options]";
static const char description[] =
	"Write, then read back, --size bytes through the I/O engine (O_DIRECT swap files)\n"
	"and report the bandwidth in GB/s (10^9 bytes/s). The report says what ran: the backend,\n"
	"whether the buffers were registered, buffered or direct I/O. Memory for the buffers is\n"
	"checked against physical memory first. Files are removed at the end, also on SIGINT,\n"
	"SIGTERM, SIGHUP and SIGPIPE (exit 128 + signal); files left by a killed run in the same\n"
	"directory are removed by the next run on the same host.\n";

static struct bench_cfg cfg;

static const struct cli_opt opts[] = {
	{"path", CLI_LIST, &cfg.paths, DEFAULT_DIR, "DIR",
	 "directory for the files; several are striped (the default\nis created and removed)",
	 .max = CLI_LIST_MAX},
	{"size", CLI_SIZE, &cfg.size, "1G", "N",
	 "bytes to write and read (--sweep: 128M unless given)", .min = 1,
	 .given = &cfg.size_given},
	{"block-size", CLI_SIZE, &cfg.block_size, "1M", "N", "bytes per block request", .min = 4096,
	 .max = 1 << 30, .flags = CLI_POW2},
	{"queue-depth", CLI_U32, &cfg.queue_depth, "32", "N", "blocks in flight per thread",
	 .min = 1, .max = 4096},
	{"threads", CLI_U32, &cfg.threads, "1", "N", "submitting threads, one ring each", .min = 1,
	 .max = 64},
	{"backend", CLI_ENUM, &cfg.backend, "auto", NULL, "I/O backend (auto: the best that works)",
	 .choices = backends},
	{"mode", CLI_ENUM, &cfg.mode, "both", NULL, "what to time (read writes the data first)",
	 .choices = modes},
	{"buffer-pattern", CLI_ENUM, &cfg.pattern, "large", NULL,
	 "large: one large buffer, one request per GiB;\n"
	 "small: queue-depth x threads buffers of one block, cycled",
	 .choices = patterns},
	{"stripe-unit", CLI_SIZE, &cfg.stripe_unit, "1M", "N",
	 "bytes per stripe unit over several --path", .min = 4096, .max = 1 << 30},
	{"buffered", CLI_FLAG, &cfg.buffered, NULL, NULL,
	 "buffered I/O where the file system has no O_DIRECT (tmpfs);\n"
	 "the page cache is then part of the numbers"},
	{"crc", CLI_FLAG, &cfg.crc, NULL, NULL,
	 "per-extent CRC32C on (its cost is in the numbers)"},
	{"sqpoll", CLI_FLAG, &cfg.sqpoll, NULL, NULL, "io_uring kernel submission thread"},
	{"sweep", CLI_FLAG, &cfg.sweep, NULL, NULL,
	 "grid of block size x queue depth x threads; prints the best\n"
	 "as a DeepSpeed \"aio\" config section"},
	{"rounds", CLI_U32, &cfg.rounds, "3", "N", "--sweep: rounds over the grid, medians",
	 .min = 1, .max = 100},
	{"json", CLI_FLAG, &cfg.json, NULL, NULL,
	 "one JSON object on stdout instead of the report"},
	{NULL},
};

/* ---- one run ------------------------------------------------------------------------------ */

struct run_state {
	const struct bench_cfg *c;
	struct zinf_io *io;
	struct zinf_swap *swap;
	int *ids;
	uint64_t ntens;
	void **bufs; /* [nbufs], carved from slab */
	unsigned nbufs;
	void *slab; /* zinf_alloc_huge(): huge pages where THP allows */
	size_t slab_bytes;
	uint64_t buf_bytes; /* capacity of each buffer */
	struct cli_progress prog;
};

/* Wait for op while keeping the progress bar and the interrupt flag served. */
static int
wait_op(struct run_state *st, struct zinf_swap_op *op, bool large)
{
	if (!large) {
		return zinf_swap_wait(st->swap, op);
	}
	struct zinf_io_stats s0 = {.size = sizeof(s0)}, s1 = {.size = sizeof(s1)};
	zinf_io_get_stats(st->io, &s0);
	while (!zinf_swap_poll(st->swap, op)) {
		usleep(200);
		if (st->prog.tty) {
			zinf_io_get_stats(st->io, &s1);
			uint64_t d = (s1.bytes_read + s1.bytes_written) -
				     (s0.bytes_read + s0.bytes_written);
			cli_progress_add(&st->prog, d);
			s0 = s1;
		}
	}
	return (int)op->result;
}

/* Move every tensor one way; returns seconds, or a negative errno, or -EINTR. */
static double
run_phase(struct run_state *st, bool write)
{
	const struct bench_cfg *c = st->c;
	bool large = c->pattern == PAT_LARGE;
	unsigned depth = large ? 1 : st->nbufs;
	struct zinf_swap_op *ops = calloc(depth, sizeof(*ops));
	bool *busy = calloc(depth, sizeof(*busy));
	if (!ops || !busy) {
		free(ops);
		free(busy);
		return -ENOMEM;
	}
	int err = 0;
	double t0 = zinf_now_s();
	uint64_t next = 0;
	for (uint64_t done = 0; done < st->ntens;) {
		/* Keep every buffer busy: the "small" pattern's queue. */
		while (next < st->ntens && !err && !cli_interrupted) {
			unsigned slot = (unsigned)(next % depth);
			if (busy[slot]) {
				break;
			}
			void *b = st->bufs[large ? 0 : slot];
			int ret = write ? zinf_swap_write_async(st->swap, st->ids[next], b,
								&ops[slot])
					: zinf_swap_read_async(st->swap, st->ids[next], b,
							       &ops[slot]);
			if (ret < 0) {
				err = ret;
				break;
			}
			busy[slot] = true;
			next++;
		}
		unsigned slot = (unsigned)(done % depth);
		if (!busy[slot]) {
			break; /* stopped submitting (error or interrupt) and all have completed */
		}
		int ret = wait_op(st, &ops[slot], large);
		busy[slot] = false;
		if (ret < 0 && !err) {
			err = ret;
		}
		if (!large) {
			cli_progress_add(&st->prog, zinf_swap_bytes(st->swap, st->ids[done]));
		}
		done++;
	}
	double t = zinf_now_s() - t0;
	free(ops);
	free(busy);
	if (err) {
		return err;
	}
	return cli_interrupted ? -EINTR : t;
}

/* Bandwidth of zinf_crc32c (and of the table fallback) over the benchmark's own buffer. */
static void
crc_speed(const void *buf, uint64_t bytes, struct bench_res *res)
{
	uint64_t n = bytes < (256ull << 20) ? bytes : (256ull << 20);
	volatile uint32_t sink = 0;
	double best = 1e30;
	for (int i = 0; i < 5; i++) {
		double t0 = zinf_now_s();
		sink ^= zinf_crc32c(0, buf, n);
		double t = zinf_now_s() - t0;
		best = t < best ? t : best;
	}
	res->crc_GBps = (double)n / best / 1e9;
	uint64_t m = n < (32ull << 20) ? n : (32ull << 20);
	double t0 = zinf_now_s();
	sink ^= crc32c_sw(0, buf, m);
	res->crc_table_GBps = (double)m / (zinf_now_s() - t0) / 1e9;
	(void)sink;
}

static void
run_free(struct run_state *st)
{
	zinf_swap_destroy(st->swap); /* removes the files */
	zinf_io_destroy(st->io);
	zinf_free_huge(st->slab, st->slab_bytes);
	free(st->bufs);
	free(st->ids);
}

/*
 * Host memory a run allocates, checked before anything is: the buffers (queue depth x threads
 * blocks, or one of up to 1 GiB) and the per-tensor tables. Returns 0 or -ENOMEM (printed).
 */
static int
check_memory(const struct bench_cfg *c, uint64_t ntens, uint64_t tens_bytes, uint64_t nbufs)
{
	uint64_t buf = ZINF_ALIGN_UP(tens_bytes, 4096);
	double bufs = (double)buf * (double)nbufs, tables = (double)ntens * TENSOR_HOST_BYTES;
	double total = bufs + tables;
	const char *lower = c->pattern == PAT_LARGE ? "--size (its 1 GiB buffer)"
						    : "--queue-depth, --threads or --block-size";
	if (tables > bufs) {
		lower = "--size, or raise --block-size (fewer, larger tensors)";
	}
	return cli_check_memory(PROG, "the run's buffers and tensor tables", total, lower);
}

/* Register the buffers; a failure is reported once, here, and the run goes on without. */
static bool
register_bufs(struct run_state *st, const struct iovec *iov)
{
	if (strcmp(zinf_io_backend(st->io), "io_uring") != 0) {
		return false; /* only io_uring registers buffers; the others accept and ignore */
	}
	/* An error is printed below, once; a refusal over RLIMIT_MEMLOCK is the library's warning
	 * (it names `ulimit -l`), which passes, and registers nothing though it returns 0. */
	cli_quiet_errors(true);
	int ret = zinf_io_register_buffers(st->io, iov, st->nbufs);
	cli_quiet_errors(false);
	if (ret < 0) {
		fprintf(stderr, PROG ": %s; running with unregistered buffers\n",
			zinf_last_error());
	}
	return ret == 0 && zinf_io_buffers_registered(st->io) > 0;
}

/*
 * The run's shape: tensors of tens_bytes, buffers (more than tensors would never be used), and
 * the checks made before anything is allocated. Returns 0, or a negative errno (printed).
 */
static int
plan(const struct bench_cfg *c, struct run_state *st, uint64_t *tens_bytes)
{
	uint64_t tb = c->pattern == PAT_LARGE ? LARGE_CHUNK : c->block_size;
	tb = tb < c->size ? tb : c->size;
	st->ntens = c->size / tb + (c->size % tb != 0); /* size + tb - 1 wraps near 2^64 */
	uint64_t nbufs = c->pattern == PAT_LARGE ? 1 : (uint64_t)c->queue_depth * c->threads;
	nbufs = nbufs < st->ntens ? nbufs : st->ntens;
	if (st->ntens > INT32_MAX) {
		char sz[32], bs[32];
		cli_size_str(sz, sizeof(sz), c->size);
		cli_size_str(bs, sizeof(bs), tb);
		fprintf(stderr,
			PROG ": --size %s in tensors of %s is %llu tensors, more than a swap space "
			     "holds (2^31 - 1): %s\n",
			sz, bs, (unsigned long long)st->ntens,
			c->pattern == PAT_LARGE ? "lower --size"
						: "lower --size or raise --block-size");
		return -EINVAL;
	}
	st->nbufs = (unsigned)nbufs;
	*tens_bytes = tb;
	return check_memory(c, st->ntens, tb, nbufs);
}

/* The I/O engine and the swap space with every tensor declared and its files reserved. */
static int
open_swap(const struct bench_cfg *c, struct run_state *st, uint64_t tens_bytes,
	  struct bench_res *res)
{
	struct zinf_io_opts o;
	zinf_io_opts_init(&o);
	o.backend = c->backend ? backends[c->backend] : NULL;
	o.block_size = (uint32_t)c->block_size;
	o.queue_depth = c->queue_depth;
	o.threads = c->threads;
	o.sqpoll = c->sqpoll;
	int ret = zinf_io_create(&o, &st->io);
	if (ret < 0) {
		return ret;
	}
	snprintf(res->backend, sizeof(res->backend), "%s", zinf_io_backend(st->io));
	char prefix[CLI_PREFIX_MAX];
	cli_scratch_prefix(prefix, sizeof(prefix), SCRATCH_STEM);
	struct zinf_swap_opts so;
	zinf_swap_opts_init(&so);
	so.dirs = c->paths.v;
	so.n_dirs = c->paths.n;
	so.prefix = prefix;
	so.crc = c->crc;
	so.buffered = c->buffered;
	so.stripe_unit = c->stripe_unit;
	if ((ret = cli_swap_create(PROG, st->io, &so, &st->swap)) < 0) {
		return ret;
	}
	res->direct = true; /* the swap space opens each directory's files as it found best */
	for (unsigned i = 0; i < c->paths.n; i++) {
		res->direct = res->direct && zinf_swap_dir_direct(st->swap, i);
	}
	st->ids = calloc(st->ntens, sizeof(*st->ids));
	if (!st->ids) {
		fprintf(stderr, PROG ": out of memory for %llu tensor ids\n",
			(unsigned long long)st->ntens);
		return -ENOMEM;
	}
	for (uint64_t i = 0; i < st->ntens; i++) {
		uint64_t b = i + 1 < st->ntens ? tens_bytes : c->size - i * tens_bytes;
		ret = st->ids[i] = zinf_swap_add(st->swap, "data", (uint32_t)i, b);
		if (ret < 0) {
			return ret;
		}
	}
	return zinf_swap_reserve(st->swap);
}

/*
 * One slab from the engine's allocator (2 MiB aligned, huge pages advised before the first
 * touch: a 1 MiB block is then one DMA segment, see RESULTS.md), cut into the pattern's
 * buffers, touched (page faults are not timed) and registered each on its own.
 */
static int
make_bufs(struct run_state *st, struct bench_res *res)
{
	st->buf_bytes = zinf_swap_buf_bytes(st->swap, st->ids[0]);
	st->bufs = calloc(st->nbufs, sizeof(*st->bufs));
	struct iovec *iov = calloc(st->nbufs, sizeof(*iov));
	st->slab_bytes = (size_t)st->buf_bytes * st->nbufs;
	st->slab = st->bufs && iov ? zinf_alloc_huge(st->slab_bytes) : NULL;
	if (!st->slab) {
		free(iov);
		/* Fits physical memory (checked), yet refused: a limit (ulimit -v) or overcommit.
		 */
		fprintf(stderr,
			PROG ": cannot allocate %llu bytes of buffers (ulimit -v?); lower %s\n",
			(unsigned long long)st->slab_bytes,
			st->c->pattern == PAT_LARGE ? "--size (its 1 GiB buffer)"
						    : "--queue-depth, --threads or --block-size");
		return -ENOMEM;
	}
	for (unsigned i = 0; i < st->nbufs; i++) {
		st->bufs[i] = (char *)st->slab + (size_t)i * st->buf_bytes;
		memset(st->bufs[i], 0x5a + (int)i, st->buf_bytes);
		iov[i].iov_base = st->bufs[i];
		iov[i].iov_len = st->buf_bytes;
	}
	res->registered = register_bufs(st, iov);
	free(iov);
	return 0;
}

/* One run; the library has logged any error it returns (the CLI does not repeat it). */
static int
run_one(const struct bench_cfg *c, struct bench_res *res, const char *label)
{
	struct run_state st = {.c = c};
	memset(res, 0, sizeof(*res));
	res->write_s = res->read_s = res->crc_GBps = res->crc_table_GBps = -1;
	uint64_t tens_bytes = 0;
	int ret = plan(c, &st, &tens_bytes);
	if (ret < 0) {
		return ret;
	}
	if ((ret = open_swap(c, &st, tens_bytes, res)) < 0 || (ret = make_bufs(&st, res)) < 0) {
		goto out;
	}
	if (c->crc) {
		crc_speed(st.bufs[0], st.buf_bytes, res);
	}
	res->bytes = c->size;
	bool rd = c->mode != MODE_WRITE; /* a read needs the data written first: always write */
	cli_progress_init(&st.prog, label, c->size + (rd ? c->size : 0));
	double t = run_phase(&st, true);
	if (t < 0) {
		ret = (int)t;
		goto out_prog;
	}
	if (c->mode != MODE_READ) {
		res->write_s = t;
	}
	if (rd) {
		t = run_phase(&st, false);
		if (t < 0) {
			ret = (int)t;
			goto out_prog;
		}
		res->read_s = t;
	}
	struct zinf_io_stats ios = {.size = sizeof(ios)};
	zinf_io_get_stats(st.io, &ios);
	res->max_inflight = ios.max_inflight;
	res->wakeups = ios.wakeups;
	ret = 0;
out_prog:
	cli_progress_done(&st.prog);
out:
	run_free(&st);
	return ret;
}

/* ---- reports ------------------------------------------------------------------------------ */

static double
gbps(uint64_t bytes, double s)
{
	return s > 0 ? (double)bytes / s / 1e9 : NAN;
}

static double
secs(double s)
{
	return s >= 0 ? s : NAN;
}

static json_t *
res_json(const struct bench_cfg *c, const struct bench_res *r)
{
	json_t *paths = json_array();
	for (unsigned i = 0; i < c->paths.n; i++) {
		json_array_append_new(paths, json_string(c->paths.v[i]));
	}
	json_t *o = json_object();
	json_object_set_new(o, "backend", json_string(r->backend));
	json_object_set_new(o, "block_size", json_integer((json_int_t)c->block_size));
	json_object_set_new(o, "queue_depth", json_integer(c->queue_depth));
	json_object_set_new(o, "threads", json_integer(c->threads));
	json_object_set_new(o, "bytes", json_integer((json_int_t)r->bytes));
	json_object_set_new(o, "read_GBps", cli_json_real(gbps(r->bytes, r->read_s)));
	json_object_set_new(o, "write_GBps", cli_json_real(gbps(r->bytes, r->write_s)));
	json_object_set_new(o, "read_s", cli_json_real(secs(r->read_s)));
	json_object_set_new(o, "write_s", cli_json_real(secs(r->write_s)));
	json_object_set_new(o, "buffer_pattern", json_string(patterns[c->pattern]));
	json_object_set_new(o, "registered", json_boolean(r->registered));
	json_object_set_new(o, "buffered", json_boolean(c->buffered));
	json_object_set_new(o, "direct", json_boolean(r->direct));
	json_object_set_new(o, "crc", json_boolean(c->crc));
	json_object_set_new(o, "max_inflight", json_integer((json_int_t)r->max_inflight));
	json_object_set_new(o, "wakeups", json_integer((json_int_t)r->wakeups));
	if (c->crc) {
		json_object_set_new(o, "crc32c_GBps", cli_json_real(secs(r->crc_GBps)));
		json_object_set_new(o, "crc32c_table_GBps", cli_json_real(secs(r->crc_table_GBps)));
		json_object_set_new(o, "crc32c_instruction", json_boolean(crc32c_hw_available()));
	}
	json_object_set_new(o, "paths", paths);
	return o;
}

static void
report_human(const struct bench_cfg *c, const struct bench_res *r)
{
	char sz[32], bs[32];
	cli_size_str(sz, sizeof(sz), c->size);
	cli_size_str(bs, sizeof(bs), c->block_size);
	printf(PROG ": %s, %u director%s:", r->backend, c->paths.n, c->paths.n == 1 ? "y" : "ies");
	for (unsigned i = 0; i < c->paths.n; i++) {
		printf(" %s", c->paths.v[i]);
	}
	printf("\n  %s, block %s, queue depth %u, threads %u, buffers: %s, %s%s%s\n", sz, bs,
	       c->queue_depth, c->threads, c->pattern == PAT_LARGE ? "one large" : "small, cycled",
	       r->registered ? "registered" : "not registered",
	       !r->direct    ? ", buffered I/O (page cache)"
	       : c->buffered ? ", O_DIRECT"
			     : "",
	       c->crc ? ", CRC32C on" : "");
	if (r->write_s >= 0) {
		printf("  write %7.2f GB/s  (%.2f s)\n", gbps(r->bytes, r->write_s), r->write_s);
	}
	if (r->read_s >= 0) {
		printf("  read  %7.2f GB/s  (%.2f s)\n", gbps(r->bytes, r->read_s), r->read_s);
	}
	if (r->crc_GBps >= 0) {
		printf("  CRC32C %6.2f GB/s (%s), table %.2f GB/s\n", r->crc_GBps,
		       crc32c_hw_available() ? "SSE4.2 instruction" : "table", r->crc_table_GBps);
	}
}

/* ---- sweep -------------------------------------------------------------------------------- */

/* The sweep's grid: block size x queue depth x threads. */
static const uint32_t sweep_bs[] = {256u << 10, 1u << 20, 4u << 20};
static const uint32_t sweep_qd[] = {8, 32, 64};
static const uint32_t sweep_th[] = {1, 2};
#define SWEEP_N 18

static void
sweep_print(const struct bench_cfg *c, const struct bench_cfg *cfgs, const struct bench_res *res,
	    unsigned best, unsigned rounds)
{
	const struct bench_cfg *bc = &cfgs[best];
	json_t *aio = json_object();
	json_object_set_new(aio, "block_size", json_integer((json_int_t)bc->block_size));
	json_object_set_new(aio, "queue_depth", json_integer(bc->queue_depth));
	json_object_set_new(aio, "intra_op_parallelism", json_integer(bc->threads));
	json_object_set_new(aio, "single_submit", json_false());
	json_object_set_new(aio, "overlap_events", json_true());
	json_object_set_new(aio, "use_gds", json_false());
	if (c->json) {
		json_t *o = json_object();
		json_t *all = json_array();
		for (unsigned i = 0; i < SWEEP_N; i++) {
			json_array_append_new(all, res_json(&cfgs[i], &res[i]));
		}
		json_object_set_new(o, "rounds", json_integer(rounds));
		json_object_set_new(o, "results", all);
		json_object_set_new(o, "best", res_json(bc, &res[best]));
		json_object_set_new(o, "aio", aio);
		cli_json_print(o, 2);
		return;
	}
	printf("%-10s %6s %8s %11s %11s   (medians of %u rounds)\n", "block", "qd", "threads",
	       "write GB/s", "read GB/s", rounds);
	for (unsigned k = 0; k < SWEEP_N; k++) {
		char bs[32];
		cli_size_str(bs, sizeof(bs), cfgs[k].block_size);
		printf("%-10s %6u %8u %11.2f %11.2f\n", bs, cfgs[k].queue_depth, cfgs[k].threads,
		       gbps(res[k].bytes, res[k].write_s), gbps(res[k].bytes, res[k].read_s));
	}
	json_t *wrap = json_object();
	json_object_set_new(wrap, "aio", aio);
	char *s = json_dumps(wrap, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	printf("\nbest: block %llu, queue depth %u, threads %u (write %.2f GB/s, read %.2f GB/s)\n",
	       (unsigned long long)bc->block_size, bc->queue_depth, bc->threads,
	       gbps(res[best].bytes, res[best].write_s), gbps(res[best].bytes, res[best].read_s));
	printf("DeepSpeed config section (DeepSpeed < 0.15 calls intra_op_parallelism "
	       "\"thread_count\"):\n");
	/* Strip the outer braces: a section to paste into ds_config.json. */
	size_t len = s ? strlen(s) : 0;
	if (len > 4) {
		printf("%.*s\n", (int)(len - 4), s + 2);
	}
	free(s);
	json_decref(wrap);
}

static int
sweep(const struct bench_cfg *c)
{
	const unsigned n = SWEEP_N, rounds = c->rounds;
	struct bench_res res[SWEEP_N];
	struct bench_cfg cfgs[SWEEP_N];
	unsigned k = 0;
	for (unsigned a = 0; a < 3; a++) {
		for (unsigned b = 0; b < 3; b++) {
			for (unsigned t = 0; t < 2; t++, k++) {
				cfgs[k] = *c;
				cfgs[k].block_size = sweep_bs[a];
				cfgs[k].queue_depth = sweep_qd[b];
				cfgs[k].threads = sweep_th[t];
			}
		}
	}
	/*
	 * Rounds over the whole grid, so that drift of a virtual disk spreads over all settings;
	 * each setting's time is the median of its rounds.
	 */
	double *wt = calloc((size_t)n * rounds, sizeof(*wt));
	double *rt = calloc((size_t)n * rounds, sizeof(*rt));
	int ret = (wt && rt) ? 0 : -ENOMEM;
	for (unsigned r = 0; r < rounds && ret == 0; r++) {
		for (k = 0; k < n && ret == 0; k++) {
			char label[64];
			snprintf(label, sizeof(label), "%u/%u bs %lluK qd %u t %u", r + 1, rounds,
				 (unsigned long long)cfgs[k].block_size >> 10, cfgs[k].queue_depth,
				 cfgs[k].threads);
			ret = run_one(&cfgs[k], &res[k], label);
			wt[k * rounds + r] = res[k].write_s;
			rt[k * rounds + r] = res[k].read_s;
		}
	}
	unsigned best = 0;
	double best_t = 0;
	for (k = 0; k < n && ret == 0; k++) {
		res[k].write_s = cli_median(&wt[k * rounds], rounds);
		res[k].read_s = cli_median(&rt[k * rounds], rounds);
		/* Best: least time to write and read the same bytes. */
		double tt = res[k].write_s + res[k].read_s;
		if (k == 0 || tt < best_t) {
			best = k;
			best_t = tt;
		}
	}
	free(wt);
	free(rt);
	if (ret == 0) {
		sweep_print(c, cfgs, res, best, rounds);
	}
	return ret;
}

/* ---- entry -------------------------------------------------------------------------------- */

/* The default directory: created if missing; removed at the end when empty. */
static int
default_dir(bool *made)
{
	*made = false;
	if (mkdir(DEFAULT_DIR, 0700) == 0) {
		*made = true;
	} else if (errno != EEXIST) {
		fprintf(stderr, PROG ": cannot create %s: %s\n", DEFAULT_DIR, strerror(errno));
		return -errno;
	}
	return 0;
}

int
cli_bench_io(int argc, char **argv)
{
	int rc = cli_opts_main(PROG, synopsis, description, opts, argc, argv);
	if (rc >= 0) {
		return rc;
	}
	struct bench_cfg c = cfg;
	if (c.sweep && !c.size_given) {
		c.size = 128ull << 20; /* 18 settings x 2 directions x rounds: keep it short */
	}
	bool is_default = c.paths.n == 1 && strcmp(c.paths.v[0], DEFAULT_DIR) == 0, made = false;
	if (is_default && default_dir(&made) < 0) {
		return 1;
	}
	cli_catch_signals();
	int reclaimed = 0;
	for (unsigned i = 0; i < c.paths.n; i++) {
		reclaimed += cli_reclaim_scratch(PROG, c.paths.v[i], SCRATCH_STEM);
	}
	int ret;
	if (c.sweep) {
		ret = sweep(&c);
	} else {
		struct bench_res r;
		ret = run_one(&c, &r, PROG);
		if (ret == 0 && c.json) {
			ret = cli_json_print(res_json(&c, &r), 0);
		} else if (ret == 0) {
			report_human(&c, &r);
		}
	}
	/* Ours, or a killed run's that was just cleaned: an empty default directory goes. */
	if (is_default && (made || reclaimed)) {
		rmdir(DEFAULT_DIR);
	}
	if (cli_interrupted) {
		fprintf(stderr, PROG ": interrupted (signal %d); files removed\n",
			(int)cli_interrupted);
		return cli_interrupt_status();
	}
	return ret == 0 ? 0 : 1;
}
