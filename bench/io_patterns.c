/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench/io_patterns.c: the I/O engine alone (no swap layer) moving one file through four
 * buffer patterns, interleaved round by round so that the virtual disk's drift hits all alike:
 *   large-reg    one large buffer, registered, one request for the whole file
 *   large        the same buffer, not registered
 *   small-reg    queue_depth x threads buffers of one block, registered, cycled: each block
 *                is its own request, resubmitted as soon as its buffer is free
 *   small        the same, not registered
 * each in memory of three kinds: 4 KiB pages (MADV_NOHUGEPAGE), transparent huge pages
 * (mmap + MADV_HUGEPAGE; THP is "madvise" on this VM) and zinf_alloc_huge(). Prints the median
 * GB/s (10^9 B/s) of each pattern and direction.
 *
 * usage: io_patterns DIR [size_MiB=512] [bs_KiB=1024] [qd=32] [threads=1] [rounds=5]
 *                        [backend=io_uring]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "zinf/blocks/io.h"

enum { NMEM = 3, NPAT = 4 * NMEM };
static const char *const pat_name[4] = {"large-reg", "large", "small-reg", "small"};
static const char *const mem_name[NMEM] = {"4k", "thp", "io_buf"};

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* One pass over the file in direction op with pattern p; returns GB/s or -1. */
static double
run(struct zinf_io *io, struct zinf_io_file *f, int op, int p, char *big, size_t size, size_t bs,
    unsigned nbufs)
{
	struct iovec iov = {big, p < 2 ? size : nbufs * bs};
	if (zinf_io_register_buffers(io, &iov, (p % 2 == 0) ? 1 : 0) < 0) {
		return -1;
	}
	double t0 = zinf_now_s();
	if (p < 2) {
		int rc = op == ZINF_IO_READ ? zinf_io_pread(io, f, big, size, 0)
					    : zinf_io_pwrite(io, f, big, size, 0);
		if (rc < 0) {
			return -1;
		}
	} else {
		struct zinf_io_req *req = calloc(nbufs, sizeof(*req));
		size_t nblk = size / bs, next = 0, done = 0;
		for (unsigned i = 0; i < nbufs && next < nblk; i++, next++) {
			req[i] = (struct zinf_io_req){.op = op,
						      .file = f,
						      .buf = big + i * bs,
						      .len = bs,
						      .offset = next * bs};
			zinf_io_submit(io, &req[i]);
		}
		/* Oldest first, as a swapper reusing its buffers in order would. */
		for (unsigned i = 0; done < nblk; i = (i + 1) % nbufs) {
			if (zinf_io_wait(io, &req[i]) < 0) {
				return -1;
			}
			done++;
			if (next < nblk) {
				req[i].offset = next++ * bs;
				zinf_io_submit(io, &req[i]);
			}
		}
		free(req);
	}
	return (double)size / (zinf_now_s() - t0) / 1e9;
}

int
main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr,
			"usage: %s DIR [size_MiB] [bs_KiB] [qd] [threads] [rounds] "
			"[backend]\n",
			argv[0]);
		return 2;
	}
	size_t size = (argc > 2 ? strtoull(argv[2], NULL, 0) : 512) << 20;
	size_t bs = (argc > 3 ? strtoull(argv[3], NULL, 0) : 1024) << 10;
	unsigned qd = argc > 4 ? (unsigned)atoi(argv[4]) : 32;
	unsigned threads = argc > 5 ? (unsigned)atoi(argv[5]) : 1;
	int rounds = argc > 6 ? atoi(argv[6]) : 5;
	const char *backend = argc > 7 ? argv[7] : "io_uring";
	unsigned nbufs = qd * threads;
	char path[4096];
	struct zinf_io_opts o;
	struct zinf_io *io;
	struct zinf_io_file *f;

	zinf_log_set_callback(zinf_log_to_file, stderr);
	zinf_io_opts_init(&o);
	o.backend = backend;
	o.queue_depth = qd;
	o.block_size = (uint32_t)bs;
	o.threads = threads;
	if (zinf_io_create(&o, &io) < 0) {
		return 1;
	}
	snprintf(path, sizeof(path), "%s/io_patterns.%d", argv[1], (int)getpid());
	if (zinf_io_file_open(io, path, ZINF_IO_RDWR | ZINF_IO_CREATE | ZINF_IO_TRUNC, &f) < 0) {
		return 1;
	}
	char *mem[NMEM];
	for (int m = 0; m < 2; m++) {
		mem[m] = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
			      0);
		madvise(mem[m], size, m ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
	}
	mem[2] = zinf_alloc_huge(size);
	for (int m = 0; m < NMEM; m++) {
		memset(mem[m], 0x5a, size);
	}
	double *gbps = calloc((size_t)rounds * NPAT * 2, sizeof(double));
	for (int r = 0; r < rounds; r++) {
		for (int k = 0; k < NPAT; k++) {
			int p = (k + r) % NPAT; /* rotate the order */
			for (int op = ZINF_IO_WRITE; op >= ZINF_IO_READ; op--) {
				double v = run(io, f, op, p % 4, mem[p / 4], size, bs, nbufs);
				if (v < 0) {
					fprintf(stderr, "%s/%s failed\n", pat_name[p % 4],
						mem_name[p / 4]);
					return 1;
				}
				gbps[(p * 2 + op) * rounds + r] = v;
			}
		}
	}
	printf("backend %s size %zu MiB bs %zu KiB qd %u threads %u rounds %d\n", backend,
	       size >> 20, bs >> 10, qd, threads, rounds);
	printf("%-10s %-6s %10s %10s\n", "pattern", "memory", "read GB/s", "write GB/s");
	for (int p = 0; p < NPAT; p++) {
		double med[2];
		for (int op = 0; op < 2; op++) {
			double *v = &gbps[(p * 2 + op) * rounds];
			qsort(v, (size_t)rounds, sizeof(double), cmp_double);
			med[op] = v[rounds / 2];
		}
		printf("%-10s %-6s %10.3f %10.3f\n", pat_name[p % 4], mem_name[p / 4], med[0],
		       med[1]);
	}
	zinf_io_file_close(io, f);
	unlink(path);
	zinf_io_destroy(io);
	munmap(mem[0], size);
	munmap(mem[1], size);
	zinf_free_huge(mem[2], size);
	free(gbps);
	return 0;
}
