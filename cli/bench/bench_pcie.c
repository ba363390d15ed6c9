/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli/bench/bench_pcie.c: `zinf bench pcie`: host-device copy bandwidth through the device handle
 * (zinf_device_copy on zinf streams) against plain cudaMemcpyAsync on the same buffers and
 * the same streams, in the same run: host-to-device, device-to-host, and both at once (one
 * stream each), from pinned memory (a zinf pool's buffers, registered through the device
 * handle) and from pageable memory (plain allocations). zinf and raw copies alternate per
 * iteration; medians; ratio = raw time / zinf time (the target is >= 0.95). Where the pool
 * cannot be pinned (RLIMIT_MEMLOCK without CAP_IPC_LOCK) it runs unpinned and says so: "pinned":
 * false in the JSON, and its rows are named "pool-unpinned", never "pinned".
 * Without a GPU, or without CUDA in this build, it says so in one line and exits 0.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli/bench/bench.h"
#include "zinf/device.h"
#include "zinf/blocks/offload.h"
#include "zinf_config.h"

#if ZINF_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define PROG "zinf bench pcie"

struct cfg {
	uint64_t size;
	int iters;
	bool json;
};

static struct cfg cfg;

static const char synopsis[] = "[--size N] [--iters N] [--json]";
static const char description[] =
	"Host-to-device, device-to-host and both at once (two streams), from pinned (a zinf\n"
	"pool's buffers) and pageable memory, through zinf_device_copy, against cudaMemcpyAsync\n"
	"on the same buffers and streams in the same run (interleaved, medians). GB/s = bytes\n"
	"moved / time (both directions: twice --size). Where the pool cannot be pinned\n"
	"(RLIMIT_MEMLOCK) it says pinned: false and names those rows pool-unpinned.\n"
	"Without a GPU it says so and exits 0.\n";

static const struct cli_opt opts[] = {
	{"size", CLI_SIZE, &cfg.size, "256M", "N", "bytes per copy", .min = 1, .max = 1ull << 40},
	{"iters", CLI_INT, &cfg.iters, "10", "N", "timed iterations (each: zinf and raw copies)",
	 .min = 1, .max = 100000},
	{"json", CLI_FLAG, &cfg.json, NULL, NULL, "one JSON object on stdout"},
	{NULL},
};

/* Nothing to measure: one line (or the JSON object) and exit 0. */
static int
no_gpu(const struct cfg *c, const char *reason)
{
	if (c->json) {
		return cli_json_print(json_pack("{s:s, s:b, s:s}", "bench", "pcie", "gpu", 0,
						"reason", reason),
				      0)
			       ? 1
			       : 0;
	}
	printf(PROG ": no GPU: %s; nothing measured\n", reason);
	return 0;
}

#if ZINF_HAVE_CUDA

enum { MEM_PINNED, MEM_PAGEABLE };
enum { DIR_H2D, DIR_D2H, DIR_BOTH };
static const char *const mem_names[] = {"pinned", "pageable"};
/* the pool's rows when it could not be pinned: pageable memory too, never called pinned */
static const char unpinned_name[] = "pool-unpinned";
static const char *const dir_names[] = {"h2d", "d2h", "both"};

struct pcie {
	const struct cfg *c;
	struct zinf_device *dev;
	struct zinf_pool *pool;
	bool pinned; /* the pool is locked and registered (else pageable, pin_fallback) */
	struct zinf_stream *s[2];
	void *host[2][2]; /* [memory][buffer] */
	void *devbuf[2];
	double *tz, *tr;
};

/* Open the cuda device with the library's log silenced: its failure is our one line. */
static int
open_gpu(struct zinf_device **dev, char *why, size_t n)
{
	struct zinf_device_opts o;
	zinf_device_opts_init(&o);
	o.backend = "cuda";
	zinf_log_set_callback(NULL, NULL);
	int rc = zinf_device_create(&o, dev);
	const char *e = zinf_last_error();
	snprintf(why, n, "%s", e && *e ? e : zinf_strerror(rc));
	zinf_log_set_callback(zinf_log_to_file, stderr); /* as main.c installed it */
	return rc;
}

static int
pcie_alloc(struct pcie *p)
{
	uint64_t size = p->c->size;
	if (cli_check_memory(PROG, "two pinned and two pageable buffers", 4 * size, "--size")) {
		return -ENOMEM;
	}
	struct zinf_pool_opts po;
	zinf_pool_opts_init(&po);
	po.buffer_bytes = size;
	po.buffer_count = 2;
	po.device = p->dev;
	po.what = "bench pcie";
	po.pin_fallback = true; /* measured and reported as unpinned, not refused */
	int rc = zinf_pool_create(&po, &p->pool);
	p->pinned = !rc && zinf_pool_pinned(p->pool);
	for (int i = 0; !rc && i < 2; i++) {
		rc = zinf_pool_acquire(p->pool, 0, &p->host[MEM_PINNED][i]);
		rc = rc < 0 ? rc : 0;
	}
	for (int i = 0; !rc && i < 2; i++) {
		p->host[MEM_PAGEABLE][i] = zinf_alloc_aligned(4096, size);
		rc = p->host[MEM_PAGEABLE][i] ? 0 : -ENOMEM;
		rc = rc ? rc : zinf_device_alloc(p->dev, size, &p->devbuf[i]);
		rc = rc ? rc : zinf_stream_create(p->dev, i ? "pcie d2h" : "pcie h2d", &p->s[i]);
	}
	p->tz = calloc(p->c->iters, sizeof(double));
	p->tr = calloc(p->c->iters, sizeof(double));
	if (!rc && (!p->tz || !p->tr)) {
		rc = -ENOMEM;
	}
	for (int m = 0; !rc && m < 2; m++) {
		for (int i = 0; i < 2; i++) {
			memset(p->host[m][i], 0x5a, size); /* first touch, untimed */
		}
	}
	if (rc == -ENOMEM) {
		fprintf(stderr, PROG ": out of memory for the buffers of %llu bytes\n",
			(unsigned long long)size);
	}
	return rc;
}

static void
pcie_free(struct pcie *p)
{
	for (int i = 0; i < 2; i++) {
		zinf_stream_destroy(p->s[i]);
		zinf_device_free(p->dev, p->devbuf[i]);
		zinf_free_aligned(p->host[MEM_PAGEABLE][i]);
		if (p->host[MEM_PINNED][i]) {
			zinf_pool_release(p->pool, p->host[MEM_PINNED][i]);
		}
	}
	zinf_pool_destroy(p->pool);
	zinf_device_destroy(p->dev);
	free(p->tz);
	free(p->tr);
}

/* One zinf (raw: cudaMemcpyAsync) copy of each direction asked for, both streams synced. */
static int
copy_once(struct pcie *p, int mem, int dir, bool raw, double *t)
{
	size_t n = p->c->size;
	bool h2d = dir != DIR_D2H, d2h = dir != DIR_H2D;
	double t0 = zinf_now_s();
	int rc = 0;
	if (raw) {
		cudaStream_t s0 = zinf_stream_native(p->s[0]), s1 = zinf_stream_native(p->s[1]);
		cudaError_t e = cudaSuccess;
		if (h2d) {
			e = cudaMemcpyAsync(p->devbuf[0], p->host[mem][0], n,
					    cudaMemcpyHostToDevice, s0);
		}
		if (d2h && e == cudaSuccess) {
			e = cudaMemcpyAsync(p->host[mem][1], p->devbuf[1], n,
					    cudaMemcpyDeviceToHost, s1);
		}
		e = e == cudaSuccess && h2d ? cudaStreamSynchronize(s0) : e;
		e = e == cudaSuccess && d2h ? cudaStreamSynchronize(s1) : e;
		if (e != cudaSuccess) {
			fprintf(stderr, PROG ": cudaMemcpyAsync: %s\n", cudaGetErrorString(e));
			rc = -EIO;
		}
	} else {
		if (h2d) {
			rc = zinf_device_copy(p->s[0], p->devbuf[0], p->host[mem][0], n,
					      ZINF_COPY_H2D);
		}
		if (d2h && !rc) {
			rc = zinf_device_copy(p->s[1], p->host[mem][1], p->devbuf[1], n,
					      ZINF_COPY_D2H);
		}
		rc = !rc && h2d ? zinf_stream_sync(p->s[0]) : rc;
		rc = !rc && d2h ? zinf_stream_sync(p->s[1]) : rc;
	}
	*t = zinf_now_s() - t0;
	return rc;
}

/* One case: a warm-up pair, then iterations alternating which copy goes first. */
static int
pcie_case(struct pcie *p, int mem, int dir, json_t *results)
{
	double t;
	int it = p->c->iters;
	int rc = copy_once(p, mem, dir, false, &t);
	rc = rc ? rc : copy_once(p, mem, dir, true, &t);
	for (int i = 0; !rc && i < it && !cli_interrupted; i++) {
		rc = copy_once(p, mem, dir, i % 2, i % 2 ? &p->tr[i] : &p->tz[i]);
		rc = rc ? rc : copy_once(p, mem, dir, !(i % 2), i % 2 ? &p->tz[i] : &p->tr[i]);
	}
	if (rc || cli_interrupted) {
		return rc ? rc : -EINTR;
	}
	double bytes = (double)p->c->size * (dir == DIR_BOTH ? 2 : 1);
	double tz = cli_median(p->tz, it), tr = cli_median(p->tr, it);
	const char *name = mem == MEM_PINNED && !p->pinned ? unpinned_name : mem_names[mem];
	if (p->c->json) {
		json_array_append_new(results,
				      json_pack("{s:s, s:s, s:o, s:o, s:o, s:o, s:o}", "memory",
						name, "direction", dir_names[dir], "GBps",
						cli_json_real(bytes / tz / 1e9), "raw_GBps",
						cli_json_real(bytes / tr / 1e9), "time_s",
						cli_json_real(tz), "raw_time_s", cli_json_real(tr),
						"ratio", cli_json_real(tr / tz)));
	} else {
		printf("%-13s %-5s %10.2f %10.2f %7.3f\n", name, dir_names[dir], bytes / tz / 1e9,
		       bytes / tr / 1e9, tr / tz);
		fflush(stdout);
	}
	return 0;
}

static int
pcie_run(const struct cfg *c)
{
	struct pcie p = {.c = c};
	char why[256];
	int rc = open_gpu(&p.dev, why, sizeof(why));
	if (rc == -ENODEV) {
		return no_gpu(c, why);
	}
	if (rc) {
		fprintf(stderr, PROG ": %s\n", why);
		return 1;
	}
	cli_catch_signals();
	rc = pcie_alloc(&p);
	json_t *results = json_array();
	if (!rc && !c->json) {
		char sz[32];
		cli_size_str(sz, sizeof(sz), c->size);
		printf("# zinf bench pcie: device %d, %s per copy, %d iterations, medians; "
		       "ratio = raw time / zinf time; pinned: %s\n",
		       zinf_device_index(p.dev), sz, c->iters, p.pinned ? "true" : "false");
		if (!p.pinned) {
			printf("# the pool could not be pinned (RLIMIT_MEMLOCK): its rows are "
			       "pageable memory (pool-unpinned)\n");
		}
		printf("%-13s %-5s %10s %10s %7s\n", "# memory", "dir", "GBps", "raw_GBps",
		       "ratio");
	}
	for (int m = 0; !rc && m < 2; m++) {
		for (int d = 0; !rc && d < 3; d++) {
			rc = pcie_case(&p, m, d, results);
		}
	}
	if (!rc && c->json) {
		rc = cli_json_print(json_pack("{s:s, s:b, s:i, s:b, s:I, s:i, s:O}", "bench",
					      "pcie", "gpu", 1, "device", zinf_device_index(p.dev),
					      "pinned", p.pinned, "bytes", (json_int_t)c->size,
					      "iters", c->iters, "results", results),
				    0);
	}
	json_decref(results);
	pcie_free(&p);
	if (rc == -EINTR) {
		return cli_interrupt_status();
	}
	return rc ? 1 : 0;
}
#endif

int
cli_bench_pcie(int argc, char **argv)
{
	int rc = cli_opts_main(PROG, synopsis, description, opts, argc, argv);
	if (rc >= 0) {
		return rc;
	}
	struct cfg c = cfg;
#if ZINF_HAVE_CUDA
	return pcie_run(&c);
#else
	return no_gpu(&c, "CUDA is not built into this zinf");
#endif
}
