/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench/ckpt_manifest.c: a checkpoint with a very large manifest, to measure what opening it
 * costs (zinf_ckpt_open's time and peak memory; bench/RESULTS.md, issue 19). It
 * writes DIR/big/ in format version 1 (docs/CHECKPOINT.md) as the engine's save lays it out:
 * N parameters of W elements each (one element per stored rank, the least a parameter can
 * cost), W stored ranks whose partitions tile their files, the three Adam parts as sparse files
 * of zeros, manifest.json indented as the save indents it, its CRC32C in manifest.crc32c and
 * DIR/latest.
 *
 * usage: ckpt_manifest DIR N [W=2] [--name-bytes B=24]   write DIR/big and DIR/latest
 *        ckpt_manifest --open DIR                        zinf_ckpt_open(DIR): its result, wall
 *                                                        time and the process's peak RSS
 * build: cc -O2 -Iinclude bench/ckpt_manifest.c -LBUILD -lzinf -Wl,-rpath,BUILD -o ckpt_manifest
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "zinf/blocks/swap.h"
#include "zinf/checkpoint.h"

static const char *const parts[] = {"fp32", "exp_avg", "exp_avg_sq"};

/* CRC32C of `bytes` zero bytes. */
static uint32_t
zeros_crc(uint64_t bytes)
{
	static char z[1 << 20];
	uint32_t crc = 0;
	while (bytes > 0) {
		size_t n = bytes < sizeof(z) ? (size_t)bytes : sizeof(z);
		crc = zinf_crc32c(crc, z, n);
		bytes -= n;
	}
	return crc;
}

static int
open_only(const char *dir)
{
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	struct zinf_ckpt *c = NULL;
	int rc = zinf_ckpt_open(dir, NULL, &c);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	struct zinf_ckpt_info in = {.size = sizeof(in)};
	if (!rc) {
		zinf_ckpt_get_info(c, &in);
	}
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	printf("open %s: %d (%s), %u parameters, %.2f s, peak RSS %ld MiB\n", dir, rc,
	       rc ? zinf_last_error() : "ok", in.n_params,
	       (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9,
	       ru.ru_maxrss / 1024);
	zinf_ckpt_close(c);
	return rc ? 1 : 0;
}

int
main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--open") == 0) {
		return open_only(argv[2]);
	}
	if (argc < 3) {
		fprintf(stderr, "usage: %s DIR N [W=2] [--name-bytes B]\n", argv[0]);
		return 2;
	}
	const char *dir = argv[1];
	uint64_t n = strtoull(argv[2], NULL, 10);
	int w = 2, name_bytes = 24;
	for (int i = 3; i < argc; i++) {
		if (strcmp(argv[i], "--name-bytes") == 0 && i + 1 < argc) {
			name_bytes = atoi(argv[++i]);
		} else {
			w = atoi(argv[i]);
		}
	}
	if (n == 0 || w < 1 || name_bytes < 12 || name_bytes > 4000) {
		fprintf(stderr, "%s: bad arguments\n", argv[0]);
		return 2;
	}
	char p[8192];
	mkdir(dir, 0755);
	snprintf(p, sizeof(p), "%s/big", dir);
	if (mkdir(p, 0755) != 0 && errno != EEXIST) {
		perror(p);
		return 1;
	}
	uint64_t flat = n, bytes = flat * 4;
	uint32_t crc = zeros_crc(bytes);
	for (int r = 0; r < w; r++) {
		for (int k = 0; k < 3; k++) {
			snprintf(p, sizeof(p), "%s/big/r%05d.%s", dir, r, parts[k]);
			int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
			if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) {
				perror(p);
				return 1;
			}
			close(fd);
		}
	}
	snprintf(p, sizeof(p), "%s/big/manifest.json", dir);
	FILE *f = fopen(p, "w");
	if (!f) {
		perror(p);
		return 1;
	}
	fprintf(f,
		"{\n \"format\": \"zinf-checkpoint\",\n \"version\": 1,\n \"tag\": \"big\",\n"
		" \"world\": %d,\n \"files_world\": %d,\n \"stage\": 3,\n \"dtype\": \"bf16\",\n"
		" \"steps\": 1,\n \"micro_steps\": 1,\n \"skipped_steps\": 0,\n \"lr\": 0.001,\n"
		" \"loss_scaler\": {\n  \"scale\": 0.0,\n  \"good_steps\": 0,\n"
		"  \"hysteresis_left\": 2,\n  \"overflows\": 0\n },\n"
		" \"optimizer\": {\n  \"kind\": \"adamw\",\n  \"state_dtype\": \"f32\"\n },\n"
		" \"parts\": [\n  {\"name\": \"fp32\", \"dtype\": \"f32\"},\n"
		"  {\"name\": \"exp_avg\", \"dtype\": \"f32\"},\n"
		"  {\"name\": \"exp_avg_sq\", \"dtype\": \"f32\"}\n ],\n \"params\": [\n",
		w, w);
	char name[4096];
	for (uint64_t i = 0; i < n; i++) {
		int l = snprintf(name, sizeof(name), "layers.%" PRIu64 ".w", i);
		while (l < name_bytes) {
			name[l++] = 'x';
		}
		name[l] = '\0';
		fprintf(f,
			"  {\n   \"name\": \"%s\",\n   \"numel\": %d,\n   \"layer\": %" PRIu64
			",\n   \"shape\": [\n    %d\n   ],\n   \"part\": 1,\n   \"flat_off\": [\n",
			name, w, i / 8, w);
		for (int r = 0; r < w; r++) {
			fprintf(f, "    %" PRIu64 "%s\n", i, r + 1 < w ? "," : "");
		}
		fprintf(f, "   ]\n  }%s\n", i + 1 < n ? "," : "");
	}
	fprintf(f, " ],\n \"ranks\": [\n");
	for (int r = 0; r < w; r++) {
		fprintf(f, "  {\"rank\": %d, \"flat\": %" PRIu64 "}%s\n", r, flat,
			r + 1 < w ? "," : "");
	}
	fprintf(f, " ],\n \"files\": [\n");
	for (int r = 0; r < w; r++) {
		for (int k = 0; k < 3; k++) {
			fprintf(f,
				"  {\"name\": \"r%05d.%s\", \"bytes\": %" PRIu64
				", \"crc32c\": %" PRIu32 "}%s\n",
				r, parts[k], bytes, crc, r + 1 < w || k < 2 ? "," : "");
		}
	}
	fprintf(f, " ],\n \"client_bytes\": 0\n}");
	if (fclose(f) != 0) {
		perror(p);
		return 1;
	}
	/* manifest.crc32c */
	f = fopen(p, "rb");
	static char buf[1 << 20];
	size_t got;
	uint32_t mcrc = 0;
	uint64_t mbytes = 0;
	while ((got = fread(buf, 1, sizeof(buf), f)) > 0) {
		mcrc = zinf_crc32c(mcrc, buf, got);
		mbytes += got;
	}
	fclose(f);
	snprintf(p, sizeof(p), "%s/big/manifest.crc32c", dir);
	f = fopen(p, "w");
	fprintf(f, "%08x\n", mcrc);
	fclose(f);
	snprintf(p, sizeof(p), "%s/latest", dir);
	f = fopen(p, "w");
	fprintf(f, "big\n");
	fclose(f);
	printf("%s/big: %" PRIu64 " parameters, %d ranks, manifest %" PRIu64
	       " bytes, rank files %" PRIu64 " bytes each (sparse)\n",
	       dir, n, w, mbytes, bytes);
	return 0;
}
