/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench/io_segments.c: why huge-page buffers are faster on a virtio disk. Reads one 512 MiB
 * file with 1 MiB blocks into 4 KiB-page memory and into zinf_alloc_huge() memory, twice
 * each, and prints the requests the block device completed (field 1 of /sys/block/DEV/stat)
 * per pass: about two per block with 4 KiB pages (256 segments > max_segments 254), about
 * one with huge pages. Other traffic on the device adds to the counts.
 *
 * usage: io_segments DIR [DEV=vda]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "zinf/blocks/io.h"

static long
dev_reads(const char *dev)
{
	char p[256];
	long n = -1;
	snprintf(p, sizeof(p), "/sys/block/%s/stat", dev);
	FILE *f = fopen(p, "r");
	if (f) {
		if (fscanf(f, "%ld", &n) != 1) {
			n = -1;
		}
		fclose(f);
	}
	return n;
}

int
main(int argc, char **argv)
{
	const char *dev = argc > 2 ? argv[2] : "vda";
	size_t n = 512u << 20;
	struct zinf_io_opts o;
	struct zinf_io *io;
	struct zinf_io_file *f;
	char path[4096];

	if (argc < 2) {
		fprintf(stderr, "usage: %s DIR [DEV]\n", argv[0]);
		return 2;
	}
	zinf_log_set_callback(zinf_log_to_file, stderr);
	zinf_io_opts_init(&o);
	if (zinf_io_create(&o, &io) < 0) {
		return 1;
	}
	snprintf(path, sizeof(path), "%s/io_segments.%d", argv[1], (int)getpid());
	if (zinf_io_file_open(io, path, ZINF_IO_RDWR | ZINF_IO_CREATE, &f) < 0) {
		return 1;
	}
	char *small = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	madvise(small, n, MADV_NOHUGEPAGE);
	memset(small, 1, n);
	char *huge = zinf_alloc_huge(n);
	memset(huge, 1, n);
	if (zinf_io_pwrite(io, f, huge, n, 0) < 0) {
		return 1;
	}
	for (int r = 0; r < 2; r++) {
		for (int k = 0; k < 2; k++) {
			long a = dev_reads(dev);
			double t = zinf_now_s();
			if (zinf_io_pread(io, f, k ? huge : small, n, 0) < 0) {
				return 1;
			}
			t = zinf_now_s() - t;
			printf("%-7s %5ld device reads for %zu blocks, %.2f GB/s\n",
			       k ? "io_buf" : "4k", dev_reads(dev) - a, n >> 20,
			       (double)n / t / 1e9);
		}
	}
	zinf_io_file_close(io, f);
	unlink(path);
	zinf_io_destroy(io);
	munmap(small, n);
	zinf_free_huge(huge, n);
	return 0;
}
