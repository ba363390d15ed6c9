// SPDX-License-Identifier: Apache-2.0
/*
 * cli/bench_io.c: `zinf bench io`, the write and read bandwidth of the I/O engine through swap
 * files (zinf_swap over zinf_io), on one directory or striped over several.
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
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "nvme/io_internal.h" /* stats_wakeups */
#include "nvme/swap_internal.h"
#include "zinf/io.h"
#include "zinf/swap.h"

#define MAX_PATHS   16
#define LARGE_CHUNK (1ull << 30) /* bytes per tensor in the "large" pattern */
#define DEFAULT_DIR "./zinf-bench-io"

enum pattern { PAT_LARGE = 0, PAT_SMALL = 1 };

struct bench_cfg {
	const char *paths[MAX_PATHS];
	unsigned n_paths;
	uint64_t size;	      /* bytes */
	uint32_t block_size;  /* bytes */
	uint32_t queue_depth; /* blocks per worker */
	uint32_t threads;
	const char *backend; /* NULL: best */
	bool do_read, do_write;
	bool json, sweep, crc, sqpoll;
	unsigned rounds; /* --sweep: rounds over the grid */
	enum pattern pattern;
	uint64_t stripe_unit; /* bytes; 0: the swap default (1 MiB) */
};

struct bench_res {
	char backend[16];
	double write_s, read_s; /* < 0: not run */
	uint64_t bytes;
	double crc_GBps, crc_table_GBps; /* zinf_crc32c and the table fallback; < 0: not run */
	uint64_t max_inflight;		 /* blocks in flight at most (the engine's stats) */
	uint64_t wakeups;		 /* workers woken from a wait by a new request */
};

static void
usage(FILE *f)
{
	fprintf(f,
		"usage: zinf bench io [options]\n"
		"\n"
		"Write, then read back, --size bytes through the I/O engine (O_DIRECT swap files)\n"
		"and report the bandwidth in GB/s (10^9 bytes/s).\n"
		"\n"
		"  --path DIR          directory for the files (repeat to stripe over several;\n"
		"                      default " DEFAULT_DIR ", created and removed)\n"
		"  --size N            bytes to write and read (default 1G; K/M/G/T suffixes)\n"
		"  --block-size N      bytes per block request (default 1M; power of two >= 4K)\n"
		"  --queue-depth N     blocks in flight per thread (default 32)\n"
		"  --threads N         submitting threads, one ring each (default 1)\n"
		"  --backend NAME      io_uring | libaio | psync (default: best that works)\n"
		"  --mode M            read | write | both (default both; read writes first)\n"
		"  --buffer-pattern P  large: one large registered buffer, one request per GiB\n"
		"                      (default); small: queue-depth buffers of one block, cycled\n"
		"  --stripe-unit N     bytes per stripe unit over several --path (default 1M)\n"
		"  --crc               per-extent CRC32C on (its cost is in the numbers)\n"
		"  --sqpoll            io_uring kernel submission thread\n"
		"  --sweep             grid of block size x queue depth x threads; prints the "
		"best\n"
		"                      as a DeepSpeed \"aio\" config section (--size default "
		"128M)\n"
		"  --rounds N          --sweep: rounds over the grid, medians (default 3)\n"
		"  --json              one JSON object on stdout instead of the report\n"
		"  -h, --help          this text\n");
}

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
	sink ^= zinf_crc32c_sw(0, buf, m);
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

static int
run_one(const struct bench_cfg *c, struct bench_res *res, const char *label)
{
	struct run_state st = {.c = c};
	memset(res, 0, sizeof(*res));
	res->write_s = res->read_s = res->crc_GBps = res->crc_table_GBps = -1;
	struct zinf_io_opts o;
	zinf_io_opts_init(&o);
	o.backend = c->backend;
	o.block_size = c->block_size;
	o.queue_depth = c->queue_depth;
	o.threads = c->threads;
	o.sqpoll = c->sqpoll;
	int ret = zinf_io_create(&o, &st.io);
	if (ret < 0) {
		fprintf(stderr, "zinf bench io: cannot open the I/O engine: %s\n", strerror(-ret));
		return ret;
	}
	snprintf(res->backend, sizeof(res->backend), "%s", zinf_io_backend(st.io));
	struct zinf_swap_opts so;
	zinf_swap_opts_init(&so);
	so.dirs = c->paths;
	so.n_dirs = c->n_paths;
	so.prefix = "bench";
	so.crc = c->crc;
	if (c->stripe_unit) {
		so.stripe_unit = c->stripe_unit;
	}
	ret = zinf_swap_create(st.io, &so, &st.swap);
	if (ret < 0) {
		goto out;
	}
	uint64_t tens_bytes = c->pattern == PAT_LARGE ? LARGE_CHUNK : c->block_size;
	if (tens_bytes > c->size) {
		tens_bytes = c->size;
	}
	st.ntens = (c->size + tens_bytes - 1) / tens_bytes;
	st.ids = calloc(st.ntens, sizeof(*st.ids));
	if (!st.ids) {
		ret = -ENOMEM;
		goto out;
	}
	for (uint64_t i = 0; i < st.ntens; i++) {
		uint64_t b = i + 1 < st.ntens ? tens_bytes : c->size - i * tens_bytes;
		ret = st.ids[i] = zinf_swap_add(st.swap, "data", (uint32_t)i, b);
		if (ret < 0) {
			goto out;
		}
	}
	ret = zinf_swap_reserve(st.swap);
	if (ret < 0) {
		goto out;
	}
	st.nbufs = c->pattern == PAT_LARGE ? 1 : c->queue_depth * c->threads;
	st.buf_bytes = zinf_swap_buf_bytes(st.swap, st.ids[0]);
	st.bufs = calloc(st.nbufs, sizeof(*st.bufs));
	struct iovec *iov = calloc(st.nbufs, sizeof(*iov));
	if (!st.bufs || !iov) {
		free(iov);
		ret = -ENOMEM;
		goto out;
	}
	/*
	 * One slab from the engine's allocator (2 MiB aligned, huge pages advised before the
	 * first touch: a 1 MiB block is then one DMA segment, see RESULTS.md), cut into the
	 * pattern's buffers; each is registered on its own.
	 */
	st.slab_bytes = (size_t)st.buf_bytes * st.nbufs;
	st.slab = zinf_alloc_huge(st.slab_bytes);
	if (!st.slab) {
		free(iov);
		ret = -ENOMEM;
		goto out;
	}
	for (unsigned i = 0; i < st.nbufs; i++) {
		st.bufs[i] = (char *)st.slab + (size_t)i * st.buf_bytes;
		/* Touch every page now, so that page faults are not timed. */
		memset(st.bufs[i], 0x5a + (int)i, st.buf_bytes);
		iov[i].iov_base = st.bufs[i];
		iov[i].iov_len = st.buf_bytes;
	}
	ret = zinf_io_register_buffers(st.io, iov, st.nbufs);
	free(iov);
	if (ret < 0) {
		fprintf(stderr,
			"zinf bench io: registering buffers failed (%s); continuing without\n",
			strerror(-ret));
	}
	if (c->crc) {
		crc_speed(st.bufs[0], st.buf_bytes, res);
	}
	res->bytes = c->size;
	bool rd = c->do_read, wr = c->do_write || c->do_read;
	cli_progress_init(&st.prog, label, (wr ? c->size : 0) + (rd ? c->size : 0));
	if (wr) {
		double t = run_phase(&st, true);
		if (t < 0) {
			ret = (int)t;
			goto out_prog;
		}
		if (c->do_write) {
			res->write_s = t;
		}
	}
	if (rd) {
		double t = run_phase(&st, false);
		if (t < 0) {
			ret = (int)t;
			goto out_prog;
		}
		res->read_s = t;
	}
	struct zinf_io_stats ios = {.size = sizeof(ios)};
	zinf_io_get_stats(st.io, &ios);
	res->max_inflight = ios.max_inflight;
	res->wakeups = __atomic_load_n(&st.io->stats_wakeups, __ATOMIC_RELAXED);
	ret = 0;
out_prog:
	cli_progress_done(&st.prog);
out:
	if (ret < 0 && ret != -EINTR) {
		fprintf(stderr, "zinf bench io: %s\n",
			zinf_last_error()[0] ? zinf_last_error() : strerror(-ret));
	}
	run_free(&st);
	return ret;
}

/* ---- reports ------------------------------------------------------------------------------ */

static double
gbps(uint64_t bytes, double s)
{
	return s > 0 ? (double)bytes / s / 1e9 : -1;
}

static json_t *
num_or_null(double v)
{
	return v >= 0 ? json_real(v) : json_null();
}

static json_t *
res_json(const struct bench_cfg *c, const struct bench_res *r)
{
	json_t *paths = json_array();
	for (unsigned i = 0; i < c->n_paths; i++) {
		json_array_append_new(paths, json_string(c->paths[i]));
	}
	json_t *o = json_object();
	json_object_set_new(o, "backend", json_string(r->backend));
	json_object_set_new(o, "block_size", json_integer(c->block_size));
	json_object_set_new(o, "queue_depth", json_integer(c->queue_depth));
	json_object_set_new(o, "threads", json_integer(c->threads));
	json_object_set_new(o, "bytes", json_integer((json_int_t)r->bytes));
	json_object_set_new(o, "read_GBps", num_or_null(gbps(r->bytes, r->read_s)));
	json_object_set_new(o, "write_GBps", num_or_null(gbps(r->bytes, r->write_s)));
	json_object_set_new(o, "read_s", num_or_null(r->read_s));
	json_object_set_new(o, "write_s", num_or_null(r->write_s));
	json_object_set_new(o, "buffer_pattern",
			    json_string(c->pattern == PAT_LARGE ? "large" : "small"));
	json_object_set_new(o, "crc", json_boolean(c->crc));
	json_object_set_new(o, "max_inflight", json_integer((json_int_t)r->max_inflight));
	json_object_set_new(o, "wakeups", json_integer((json_int_t)r->wakeups));
	if (c->crc) {
		json_object_set_new(o, "crc32c_GBps", num_or_null(r->crc_GBps));
		json_object_set_new(o, "crc32c_table_GBps", num_or_null(r->crc_table_GBps));
		json_object_set_new(o, "crc32c_instruction",
				    json_boolean(zinf_crc32c_hw_available()));
	}
	json_object_set_new(o, "paths", paths);
	return o;
}

static void
print_size(char *out, size_t n, uint64_t b)
{
	if (b >= (1ull << 30) && b % (1ull << 30) == 0) {
		snprintf(out, n, "%llu GiB", (unsigned long long)(b >> 30));
	} else if (b >= (1ull << 20) && b % (1ull << 20) == 0) {
		snprintf(out, n, "%llu MiB", (unsigned long long)(b >> 20));
	} else if (b >= 1024 && b % 1024 == 0) {
		snprintf(out, n, "%llu KiB", (unsigned long long)(b >> 10));
	} else {
		snprintf(out, n, "%llu B", (unsigned long long)b);
	}
}

static void
report_human(const struct bench_cfg *c, const struct bench_res *r)
{
	char sz[32], bs[32];
	print_size(sz, sizeof(sz), c->size);
	print_size(bs, sizeof(bs), c->block_size);
	printf("zinf bench io: %s, %u director%s:", r->backend, c->n_paths,
	       c->n_paths == 1 ? "y" : "ies");
	for (unsigned i = 0; i < c->n_paths; i++) {
		printf(" %s", c->paths[i]);
	}
	printf("\n  %s, block %s, queue depth %u, threads %u, buffers: %s%s\n", sz, bs,
	       c->queue_depth, c->threads,
	       c->pattern == PAT_LARGE ? "one large registered" : "small, cycled",
	       c->crc ? ", CRC32C on" : "");
	if (r->write_s >= 0) {
		printf("  write %7.2f GB/s  (%.2f s)\n", gbps(r->bytes, r->write_s), r->write_s);
	}
	if (r->read_s >= 0) {
		printf("  read  %7.2f GB/s  (%.2f s)\n", gbps(r->bytes, r->read_s), r->read_s);
	}
	if (r->crc_GBps >= 0) {
		printf("  CRC32C %6.2f GB/s (%s), table %.2f GB/s\n", r->crc_GBps,
		       zinf_crc32c_hw_available() ? "SSE4.2 instruction" : "table",
		       r->crc_table_GBps);
	}
}

/* ---- sweep -------------------------------------------------------------------------------- */

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Median of n values (sorted in place). */
static double
median(double *v, unsigned n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int
sweep(struct bench_cfg *c)
{
	static const uint32_t bss[] = {256u << 10, 1u << 20, 4u << 20};
	static const uint32_t qds[] = {8, 32, 64};
	static const uint32_t ths[] = {1, 2};
	const unsigned n = 3 * 3 * 2;
	struct bench_res *res = calloc(n, sizeof(*res));
	struct bench_cfg *cfgs = calloc(n, sizeof(*cfgs));
	if (!res || !cfgs) {
		free(res);
		free(cfgs);
		return 1;
	}
	unsigned k = 0;
	for (unsigned a = 0; a < 3; a++) {
		for (unsigned b = 0; b < 3; b++) {
			for (unsigned t = 0; t < 2; t++, k++) {
				cfgs[k] = *c;
				cfgs[k].block_size = bss[a];
				cfgs[k].queue_depth = qds[b];
				cfgs[k].threads = ths[t];
			}
		}
	}
	/*
	 * Rounds over the whole grid, so that drift of a virtual disk spreads over all settings;
	 * each setting's time is the median of its rounds.
	 */
	unsigned rounds = c->rounds;
	double *wt = calloc((size_t)n * rounds, sizeof(*wt));
	double *rt = calloc((size_t)n * rounds, sizeof(*rt));
	int ret = (wt && rt) ? 0 : -ENOMEM;
	for (unsigned r = 0; r < rounds && ret == 0; r++) {
		for (k = 0; k < n && ret == 0; k++) {
			char label[64];
			snprintf(label, sizeof(label), "%u/%u bs %uK qd %u t %u", r + 1, rounds,
				 cfgs[k].block_size >> 10, cfgs[k].queue_depth, cfgs[k].threads);
			ret = run_one(&cfgs[k], &res[k], label);
			wt[k * rounds + r] = res[k].write_s;
			rt[k * rounds + r] = res[k].read_s;
		}
	}
	if (ret < 0) {
		free(wt);
		free(rt);
		free(res);
		free(cfgs);
		return ret == -EINTR ? 130 : 1;
	}
	int best = -1;
	double best_t = 0;
	if (!c->json) {
		printf("%-10s %6s %8s %11s %11s   (medians of %u rounds)\n", "block", "qd",
		       "threads", "write GB/s", "read GB/s", rounds);
	}
	for (k = 0; k < n; k++) {
		res[k].write_s = median(&wt[k * rounds], rounds);
		res[k].read_s = median(&rt[k * rounds], rounds);
		/* Best: least time to write and read the same bytes. */
		double tt = res[k].write_s + res[k].read_s;
		if (best < 0 || tt < best_t) {
			best = (int)k;
			best_t = tt;
		}
		if (!c->json) {
			char bs[32];
			print_size(bs, sizeof(bs), cfgs[k].block_size);
			printf("%-10s %6u %8u %11.2f %11.2f\n", bs, cfgs[k].queue_depth,
			       cfgs[k].threads, gbps(res[k].bytes, res[k].write_s),
			       gbps(res[k].bytes, res[k].read_s));
		}
	}
	free(wt);
	free(rt);
	const struct bench_cfg *bc = &cfgs[best];
	json_t *aio = json_object();
	json_object_set_new(aio, "block_size", json_integer(bc->block_size));
	json_object_set_new(aio, "queue_depth", json_integer(bc->queue_depth));
	json_object_set_new(aio, "intra_op_parallelism", json_integer(bc->threads));
	json_object_set_new(aio, "single_submit", json_false());
	json_object_set_new(aio, "overlap_events", json_true());
	json_object_set_new(aio, "use_gds", json_false());
	if (c->json) {
		json_t *o = json_object();
		json_t *all = json_array();
		for (unsigned i = 0; i < k; i++) {
			json_array_append_new(all, res_json(&cfgs[i], &res[i]));
		}
		json_object_set_new(o, "results", all);
		json_object_set_new(o, "best", res_json(bc, &res[best]));
		json_object_set_new(o, "aio", aio);
		char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
		printf("%s\n", s);
		free(s);
		json_decref(o);
	} else {
		json_t *wrap = json_object();
		json_object_set_new(wrap, "aio", aio);
		char *s = json_dumps(wrap, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
		printf("\nbest: block %u, queue depth %u, threads %u (write %.2f GB/s, read %.2f "
		       "GB/s)\n",
		       bc->block_size, bc->queue_depth, bc->threads,
		       gbps(res[best].bytes, res[best].write_s),
		       gbps(res[best].bytes, res[best].read_s));
		printf("DeepSpeed config section (DeepSpeed < 0.15 calls intra_op_parallelism "
		       "\"thread_count\"):\n");
		/* Strip the outer braces: a section to paste into ds_config.json. */
		size_t len = strlen(s);
		printf("%.*s\n", (int)(len - 4), s + 2);
		free(s);
		json_decref(wrap);
	}
	free(res);
	free(cfgs);
	return 0;
}

/* ---- entry -------------------------------------------------------------------------------- */

static int
parse_u32(const char *opt, const char *arg, uint32_t *out, bool size)
{
	uint64_t v;
	char *end = NULL;
	if (size) {
		if (cli_parse_size(arg, &v) < 0) {
			goto bad;
		}
	} else {
		errno = 0;
		v = strtoull(arg, &end, 10);
		if (errno || end == arg || *end) {
			goto bad;
		}
	}
	if (v == 0 || v > UINT32_MAX) {
		goto bad;
	}
	*out = (uint32_t)v;
	return 0;
bad:
	fprintf(stderr, "zinf bench io: bad value '%s' for %s\n", arg, opt);
	return -EINVAL;
}

int
cli_bench_io(int argc, char **argv)
{
	struct bench_cfg c = {
		.size = 1ull << 30,
		.block_size = 1u << 20,
		.queue_depth = 32,
		.threads = 1,
		.do_read = true,
		.do_write = true,
		.rounds = 3,
	};
	bool size_given = false;
	enum {
		O_PATH = 256,
		O_SIZE,
		O_BS,
		O_QD,
		O_TH,
		O_BE,
		O_MODE,
		O_SWEEP,
		O_JSON,
		O_CRC,
		O_PAT,
		O_SU,
		O_SQPOLL,
		O_ROUNDS
	};
	static const struct option lopts[] = {
		{"path", required_argument, NULL, O_PATH},
		{"size", required_argument, NULL, O_SIZE},
		{"block-size", required_argument, NULL, O_BS},
		{"queue-depth", required_argument, NULL, O_QD},
		{"threads", required_argument, NULL, O_TH},
		{"backend", required_argument, NULL, O_BE},
		{"mode", required_argument, NULL, O_MODE},
		{"sweep", no_argument, NULL, O_SWEEP},
		{"json", no_argument, NULL, O_JSON},
		{"crc", no_argument, NULL, O_CRC},
		{"buffer-pattern", required_argument, NULL, O_PAT},
		{"stripe-unit", required_argument, NULL, O_SU},
		{"sqpoll", no_argument, NULL, O_SQPOLL},
		{"rounds", required_argument, NULL, O_ROUNDS},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	optind = 1;
	opterr = 1;
	int ch;
	while ((ch = getopt_long(argc, argv, "h", lopts, NULL)) != -1) {
		switch (ch) {
		case O_PATH:
			if (c.n_paths == MAX_PATHS) {
				fprintf(stderr, "zinf bench io: at most %d --path\n", MAX_PATHS);
				return 2;
			}
			c.paths[c.n_paths++] = optarg;
			break;
		case O_SIZE:
			if (cli_parse_size(optarg, &c.size) < 0 || c.size == 0) {
				fprintf(stderr, "zinf bench io: bad --size '%s'\n", optarg);
				return 2;
			}
			size_given = true;
			break;
		case O_BS:
			if (parse_u32("--block-size", optarg, &c.block_size, true) < 0) {
				return 2;
			}
			if (c.block_size < 4096 || (c.block_size & (c.block_size - 1))) {
				fprintf(stderr,
					"zinf bench io: --block-size must be a power of two "
					">= 4096\n");
				return 2;
			}
			break;
		case O_QD:
			if (parse_u32("--queue-depth", optarg, &c.queue_depth, false) < 0) {
				return 2;
			}
			break;
		case O_TH:
			if (parse_u32("--threads", optarg, &c.threads, false) < 0) {
				return 2;
			}
			break;
		case O_BE:
			c.backend = optarg;
			break;
		case O_MODE:
			if (strcmp(optarg, "read") == 0) {
				c.do_write = false;
			} else if (strcmp(optarg, "write") == 0) {
				c.do_read = false;
			} else if (strcmp(optarg, "both") != 0) {
				fprintf(stderr, "zinf bench io: --mode read|write|both\n");
				return 2;
			}
			break;
		case O_PAT:
			if (strcmp(optarg, "large") == 0) {
				c.pattern = PAT_LARGE;
			} else if (strcmp(optarg, "small") == 0) {
				c.pattern = PAT_SMALL;
			} else {
				fprintf(stderr, "zinf bench io: --buffer-pattern large|small\n");
				return 2;
			}
			break;
		case O_SU:
			if (cli_parse_size(optarg, &c.stripe_unit) < 0 || c.stripe_unit == 0) {
				fprintf(stderr, "zinf bench io: bad --stripe-unit '%s'\n", optarg);
				return 2;
			}
			break;
		case O_SWEEP:
			c.sweep = true;
			break;
		case O_JSON:
			c.json = true;
			break;
		case O_CRC:
			c.crc = true;
			break;
		case O_SQPOLL:
			c.sqpoll = true;
			break;
		case O_ROUNDS:
			if (parse_u32("--rounds", optarg, &c.rounds, false) < 0) {
				return 2;
			}
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "zinf bench io: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (c.sweep && !size_given) {
		c.size = 128ull << 20; /* 18 settings x 2 directions x rounds: keep it short */
	}
	bool made_dir = false;
	if (c.n_paths == 0) {
		c.paths[c.n_paths++] = DEFAULT_DIR;
		if (mkdir(DEFAULT_DIR, 0700) == 0) {
			made_dir = true;
		} else if (errno != EEXIST) {
			fprintf(stderr, "zinf bench io: cannot create %s: %s\n", DEFAULT_DIR,
				strerror(errno));
			return 1;
		}
	}
	cli_catch_signals();
	int rc;
	if (c.sweep) {
		rc = sweep(&c);
	} else {
		struct bench_res r;
		int ret = run_one(&c, &r, c.do_write ? "zinf bench io" : "zinf bench io");
		if (ret == 0) {
			if (c.json) {
				json_t *o = res_json(&c, &r);
				char *s = json_dumps(o, JSON_PRESERVE_ORDER);
				printf("%s\n", s);
				free(s);
				json_decref(o);
			} else {
				report_human(&c, &r);
			}
		}
		rc = ret == 0 ? 0 : (ret == -EINTR ? 130 : 1);
	}
	if (made_dir) {
		rmdir(DEFAULT_DIR);
	}
	if (cli_interrupted) {
		fprintf(stderr, "zinf bench io: interrupted; files removed\n");
		rc = 130;
	}
	return rc;
}
