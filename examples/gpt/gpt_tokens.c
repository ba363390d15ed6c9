/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/gpt/gpt_tokens.c: the token file of gpt_tokens.h: its header and size checked, one
 * pass over the tokens in 1 MiB preads for the largest (every token below the vocabulary), the
 * global row's window start, and a window read with the wrap at the end (one pread, two across
 * the end). Not here: batching and the copy to the device (gpt.c).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* endian.h's le16toh */
#endif
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpt_tokens.h"

#define SCAN_BYTES (1u << 20) /* a pread of the check's pass */

int
gpt_tokens_format_parse(const char *s, enum gpt_tokens_format *out)
{
	static const char *const names[] = {"llmc", "uint16", "uint32"};
	for (int i = 0; i < 3; i++) {
		if (!strcmp(s, names[i])) {
			*out = (enum gpt_tokens_format)i;
			return 0;
		}
	}
	return -1;
}

static int
fail(struct gpt_tokens *t, char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	gpt_tokens_close(t);
	return -1;
}

/* n bytes at off into buf: 0, or -1 with the reason in err (a short read: the file is shorter
   than it was). */
static int
read_at(struct gpt_tokens *t, void *buf, size_t n, uint64_t off, char *err, size_t errlen)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = pread(t->fd, (char *)buf + got, n - got, (off_t)(off + got));
		if (r < 0 && errno == EINTR) {
			continue;
		}
		if (r <= 0) {
			snprintf(err, errlen, "%s: reading %zu bytes at %" PRIu64 ": %s", t->path,
				 n, off,
				 r < 0 ? strerror(errno) : "the file is shorter than it was");
			return -1;
		}
		got += (size_t)r;
	}
	return 0;
}

static uint32_t
token_at(const unsigned char *p, int width, size_t i)
{
	if (width == 2) {
		uint16_t v;
		memcpy(&v, p + 2 * i, 2);
		return le16toh(v);
	}
	uint32_t v;
	memcpy(&v, p + 4 * i, 4);
	return le32toh(v);
}

/* The largest of n tokens: a loop per width that the compiler vectorises (buf is malloc'ed,
   aligned for both). */
static uint32_t
max_of(const void *buf, int width, size_t n)
{
	uint32_t max = 0;
	if (width == 2) {
		const uint16_t *p = buf;
		for (size_t i = 0; i < n; i++) {
			uint32_t v = le16toh(p[i]);
			max = v > max ? v : max;
		}
	} else {
		const uint32_t *p = buf;
		for (size_t i = 0; i < n; i++) {
			uint32_t v = le32toh(p[i]);
			max = v > max ? v : max;
		}
	}
	return max;
}

/* llm.c's header: magic, version and count, little-endian, of the file's first 12 bytes. */
static void
header(const unsigned char *b, int32_t h[3])
{
	for (int i = 0; i < 3; i++) {
		h[i] = (int32_t)token_at(b, 4, (size_t)i);
	}
}

/* The token width a valid llm.c header says (its magic, version, and a count the size matches
   exactly), or 0. */
static int
llmc_width(const int32_t h[3], uint64_t bytes)
{
	int w = h[0] == GPT_LLMC_MAGIC_U16 && h[1] == 1	  ? 2
		: h[0] == GPT_LLMC_MAGIC_U32 && h[1] == 7 ? 4
							  : 0;
	return w && h[2] > 0 && bytes == 4 * GPT_LLMC_HEADER_INTS + (uint64_t)h[2] * w ? w : 0;
}

/* The checks of an llm.c file's header (gpt_tokens_open): 0 and t->off, n, width, what set. */
static int
open_llmc(struct gpt_tokens *t, const int32_t h[3], char *err, size_t errlen)
{
	const char *path = t->path;
	uint64_t hb = 4 * GPT_LLMC_HEADER_INTS;
	if (t->bytes < hb) {
		return fail(
			t, err, errlen,
			"%s: %" PRIu64 " bytes, shorter than llm.c's header (%" PRIu64
			" bytes): not an llm.c token file (a raw one needs --data-dtype uint16 or "
			"uint32)",
			path, t->bytes, hb);
	}
	if (h[0] != GPT_LLMC_MAGIC_U16 && h[0] != GPT_LLMC_MAGIC_U32) {
		return fail(t, err, errlen,
			    "%s: not an llm.c token file: magic %" PRId32
			    ", llm.c's are %d (gpt-2, "
			    "uint16 tokens) and %d (llama-3, uint32); a raw token file needs "
			    "--data-dtype uint16 or uint32",
			    path, h[0], GPT_LLMC_MAGIC_U16, GPT_LLMC_MAGIC_U32);
	}
	bool u16 = h[0] == GPT_LLMC_MAGIC_U16;
	int want = u16 ? 1 : 7;
	if (h[1] != want) {
		return fail(t, err, errlen,
			    "%s: llm.c magic %" PRId32 " with version %" PRId32
			    ": only version %d (%s tokens) is known",
			    path, h[0], h[1], want, u16 ? "uint16" : "uint32");
	}
	t->width = u16 ? 2 : 4;
	t->what = u16 ? "llm.c gpt-2 (uint16)" : "llm.c llama-3 (uint32)";
	if (h[2] <= 0 || t->bytes != hb + (uint64_t)h[2] * (uint64_t)t->width) {
		return fail(t, err, errlen,
			    "%s: the header says %" PRId32 " tokens (%s), but the file has %" PRIu64
			    " bytes: %s",
			    path, h[2], u16 ? "uint16" : "uint32", t->bytes,
			    h[2] <= 0 ? "a count must be at least 1"
				      : "not the header's 1024 plus the tokens' bytes (cut short, "
					"or written by another tool?)");
	}
	t->off = hb;
	t->n = (uint64_t)h[2];
	return 0;
}

void
gpt_tokens_close(struct gpt_tokens *t)
{
	if (t->opened) {
		close(t->fd);
	}
	free(t->buf);
	memset(t, 0, sizeof(*t));
	t->fd = -1;
}

/* One pass over the tokens: t->max_token, and the position of the first token >= V in *bad
   (n when none). 0, or -1 (err set; t closed). */
static int
scan(struct gpt_tokens *t, int V, uint64_t *bad, char *err, size_t errlen)
{
	void *buf = malloc(SCAN_BYTES);
	if (!buf) {
		return fail(t, err, errlen, "%s: out of memory", t->path);
	}
	(void)posix_fadvise(t->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	size_t per = SCAN_BYTES / (size_t)t->width;
	uint32_t max = 0;
	*bad = t->n;
	for (uint64_t i = 0; i < t->n; i += per) {
		size_t k = (size_t)(t->n - i < per ? t->n - i : per);
		if (read_at(t, buf, k * (size_t)t->width, t->off + i * (uint64_t)t->width, err,
			    errlen)) {
			free(buf);
			gpt_tokens_close(t);
			return -1;
		}
		uint32_t m = max_of(buf, t->width, k);
		if (m >= (uint32_t)V && *bad == t->n) {
			size_t j = 0;
			while (token_at(buf, t->width, j) < (uint32_t)V) {
				j++;
			}
			*bad = i + j;
		}
		max = m > max ? m : max;
	}
	free(buf);
	(void)posix_fadvise(t->fd, 0, 0, POSIX_FADV_RANDOM);
	t->max_token = max;
	return 0;
}

int
gpt_tokens_open(struct gpt_tokens *t, const char *path, enum gpt_tokens_format f, int V,
		const char *vocab_from, int T, char *err, size_t errlen)
{
	memset(t, 0, sizeof(*t));
	t->path = path;
	t->T = T;
	t->fd = open(path, O_RDONLY | O_CLOEXEC);
	t->opened = t->fd >= 0;
	struct stat st;
	if (t->fd < 0 || fstat(t->fd, &st) != 0) {
		return fail(t, err, errlen, "%s: %s", path, strerror(errno));
	}
	if (!S_ISREG(st.st_mode) || st.st_size == 0) {
		return fail(t, err, errlen, "%s: %s", path,
			    S_ISREG(st.st_mode) ? "empty: no tokens" : "not a regular file");
	}
	t->bytes = (uint64_t)st.st_size;
	unsigned char hb[12] = {0};
	int32_t h[3];
	if (read_at(t, hb, t->bytes < 12 ? (size_t)t->bytes : 12, 0, err, errlen)) {
		gpt_tokens_close(t);
		return -1;
	}
	header(hb, h);
	if (f == GPT_TOKENS_LLMC) {
		if (open_llmc(t, h, err, errlen)) {
			return -1;
		}
	} else {
		t->width = f == GPT_TOKENS_U16 ? 2 : 4;
		t->what = f == GPT_TOKENS_U16 ? "raw uint16" : "raw uint32";
		int w = t->bytes >= 4 * GPT_LLMC_HEADER_INTS ? llmc_width(h, t->bytes) : 0;
		if (w) {
			return fail(
				t, err, errlen,
				"%s: has llm.c's header (%s tokens, the file's size matches it): "
				"--data-dtype %s would train on the header as tokens; drop "
				"--data-dtype (llm.c's format is the default)",
				path, w == 2 ? "uint16" : "uint32",
				f == GPT_TOKENS_U16 ? "uint16" : "uint32");
		}
		if (t->bytes % (uint64_t)t->width) {
			return fail(t, err, errlen,
				    "%s: %" PRIu64 " bytes: not a whole number of %s tokens", path,
				    t->bytes, f == GPT_TOKENS_U16 ? "uint16" : "uint32");
		}
		t->n = t->bytes / (uint64_t)t->width;
	}
	if (t->n < (uint64_t)T + 1) {
		return fail(t, err, errlen,
			    "%s: %" PRIu64
			    " tokens, fewer than one window of --context %d + 1 = %d",
			    path, t->n, T, T + 1);
	}
	if (!(t->buf = malloc(((size_t)T + 1) * (size_t)t->width))) {
		return fail(t, err, errlen, "%s: out of memory", path);
	}
	uint64_t bad = 0;
	if (scan(t, V, &bad, err, errlen)) {
		return -1;
	}
	if (bad < t->n) {
		uint32_t v;
		if (read_at(t, &v, (size_t)t->width, t->off + bad * (uint64_t)t->width, err,
			    errlen)) {
			gpt_tokens_close(t);
			return -1;
		}
		char fix[96];
		if (vocab_from) {
			snprintf(fix, sizeof(fix), "the file's tokens are not this model's");
		} else {
			snprintf(fix, sizeof(fix), "give --vocab %" PRIu64 " or more",
				 (uint64_t)t->max_token + 1);
		}
		return fail(t, err, errlen,
			    "%s: token %" PRIu64 " (of %" PRIu64 ") is %" PRIu32
			    ", not below %s %d; the file's largest token is %" PRIu32 ": %s",
			    path, bad, t->n, token_at((const unsigned char *)&v, t->width, 0),
			    vocab_from ? vocab_from : "--vocab", V, t->max_token, fix);
	}
	return 0;
}

uint64_t
gpt_tokens_start(const struct gpt_tokens *t, int64_t step, int gas, int micro, int world, int rank,
		 int B, int b, int T)
{
	/* G < 2^63 for any run zinf_gpt takes (steps up to 1e8, a global batch up to 2^31), but
	   G T may pass 2^64: the product in 128 bits */
	uint64_t g = (((uint64_t)(step - 1) * (uint64_t)gas + (uint64_t)micro) * (uint64_t)world +
		      (uint64_t)rank) *
			     (uint64_t)B +
		     (uint64_t)b;
	return (uint64_t)(((unsigned __int128)g * (unsigned)T) % t->n);
}

int
gpt_tokens_window(struct gpt_tokens *t, uint64_t start, int *out, char *err, size_t errlen)
{
	size_t w = (size_t)t->width, all = (size_t)t->T + 1;
	size_t first = t->n - start < all ? (size_t)(t->n - start) : all; /* before the end */
	if (read_at(t, t->buf, first * w, t->off + start * w, err, errlen) ||
	    (first < all &&
	     read_at(t, t->buf + first * w, (all - first) * w, t->off, err, errlen))) {
		return -1;
	}
	for (size_t j = 0; j < all; j++) {
		out[j] = (int)token_at(t->buf, t->width, j);
	}
	return 0;
}
