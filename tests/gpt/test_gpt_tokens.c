/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/gpt/test_gpt_tokens.c: zinf_gpt's token files (examples/gpt/gpt_tokens.c) on files built
 * here byte by byte: llm.c's header read (gpt-2's uint16 and llama-3's uint32 formats) and raw
 * little-endian uint16/uint32 files giving the same tokens; the global row's window start
 * ((((s - 1) gas + m) world + r) B + b) T mod n worked by hand, including a product past 2^64;
 * windows read across the end of the stream (continuing from token 0); and every refusal with
 * its message: bad magic, bad version, a token count that the size does not match, a file
 * shorter than the header, fewer than T + 1 tokens, a token past the vocabulary (its position,
 * its value, the largest), a raw dtype over an llm.c file, a raw size not a whole number of
 * tokens, an empty or missing file, a directory, an unknown --data-dtype; and a file cut short
 * after it was opened (the window's read fails, naming it). Criterion, label gpt.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/test_util.h"
#include "gpt_tokens.h"

ZT_TMPDIR_SUITE(gpt_tokens);
static char errbuf[512];

/* dir/name; the caller's buffer */
static const char *
path_of(const char *name)
{
	static char p[4][4096];
	static int k;
	k = (k + 1) % 4;
	snprintf(p[k], sizeof(p[k]), "%s/%s", dir, name);
	return p[k];
}

static void
put_le(FILE *f, uint32_t v, int width)
{
	for (int i = 0; i < width; i++) {
		fputc((int)((v >> (8 * i)) & 0xff), f);
	}
}

/* An llm.c file: header (magic, version, count, the rest 0), then n tokens of `width` bytes. */
static const char *
write_llmc(const char *name, int32_t magic, int32_t version, int32_t count, const uint32_t *tok,
	   size_t n, int width)
{
	const char *p = path_of(name);
	FILE *f = fopen(p, "wb");
	cr_assert_not_null(f, "%s", p);
	int32_t h[256] = {magic, version, count};
	for (int i = 0; i < 256; i++) {
		put_le(f, (uint32_t)h[i], 4);
	}
	for (size_t i = 0; i < n; i++) {
		put_le(f, tok[i], width);
	}
	cr_assert_eq(fclose(f), 0);
	return p;
}

static const char *
write_raw(const char *name, const uint32_t *tok, size_t n, int width, size_t extra_bytes)
{
	const char *p = path_of(name);
	FILE *f = fopen(p, "wb");
	cr_assert_not_null(f, "%s", p);
	for (size_t i = 0; i < n; i++) {
		put_le(f, tok[i], width);
	}
	for (size_t i = 0; i < extra_bytes; i++) {
		fputc(0, f);
	}
	cr_assert_eq(fclose(f), 0);
	return p;
}

static void
open_ok(struct gpt_tokens *t, const char *p, enum gpt_tokens_format f, int V, int T)
{
	int r = gpt_tokens_open(t, p, f, V, NULL, T, errbuf, sizeof(errbuf));
	cr_assert_eq(r, 0, "%s: %s", p, errbuf);
}

/* Refused, with a message naming the file and containing `want`; nothing left mapped. */
static void
refused(const char *p, enum gpt_tokens_format f, int V, int T, const char *want)
{
	struct gpt_tokens t;
	errbuf[0] = '\0';
	cr_assert_eq(gpt_tokens_open(&t, p, f, V, NULL, T, errbuf, sizeof(errbuf)), -1, "%s opened",
		     p);
	cr_assert(!t.opened && t.buf == NULL, "%s: left open", p);
	cr_assert(strstr(errbuf, p), "the message does not name %s: %s", p, errbuf);
	cr_assert(strstr(errbuf, want), "want \"%s\" in: %s", want, errbuf);
}

static void
expect_window(struct gpt_tokens *t, uint64_t start, int T, const int *want)
{
	int got[16];
	cr_assert_eq(t->T, T);
	cr_assert_eq(gpt_tokens_window(t, start, got, errbuf, sizeof(errbuf)), 0, "%s", errbuf);
	for (int j = 0; j <= T; j++) {
		cr_assert_eq(got[j], want[j], "window at %llu, token %d: %d, want %d",
			     (unsigned long long)start, j, got[j], want[j]);
	}
}

/* Ten tokens 100..109, T = 4, B = 2, one rank: row G starts at 4 G mod 10; the windows overlap
 * by one token and run on past the end from token 0. */
Test(gpt_tokens, llmc_windows_worked_by_hand)
{
	uint32_t tok[10];
	for (int i = 0; i < 10; i++) {
		tok[i] = 100u + (uint32_t)i;
	}
	const char *p = write_llmc("a.bin", GPT_LLMC_MAGIC_U16, 1, 10, tok, 10, 2);
	struct gpt_tokens t;
	open_ok(&t, p, GPT_TOKENS_LLMC, 200, 4);
	cr_assert_eq(t.n, 10);
	cr_assert_eq(t.width, 2);
	cr_assert_eq(t.max_token, 109);
	cr_assert_str_eq(t.what, "llm.c gpt-2 (uint16)");
	/* step, b -> start: G = (s - 1) 2 + b, start = 4 G mod 10 */
	static const struct {
		int step, b;
		uint64_t start;
		int win[5];
	} rows[] = {
		{1, 0, 0, {100, 101, 102, 103, 104}}, {1, 1, 4, {104, 105, 106, 107, 108}},
		{2, 0, 8, {108, 109, 100, 101, 102}}, {2, 1, 2, {102, 103, 104, 105, 106}},
		{3, 0, 6, {106, 107, 108, 109, 100}}, {3, 1, 0, {100, 101, 102, 103, 104}},
	};
	for (size_t k = 0; k < sizeof(rows) / sizeof(rows[0]); k++) {
		uint64_t s = gpt_tokens_start(&t, rows[k].step, 1, 0, 1, 0, 2, rows[k].b, 4);
		cr_assert_eq(s, rows[k].start, "step %d row %d: start %llu, want %llu",
			     rows[k].step, rows[k].b, (unsigned long long)s,
			     (unsigned long long)rows[k].start);
		expect_window(&t, s, 4, rows[k].win);
	}
	/* the last window that fits and one straddling the end */
	expect_window(&t, 5, 4, (int[]){105, 106, 107, 108, 109});
	expect_window(&t, 9, 4, (int[]){109, 100, 101, 102, 103});
	gpt_tokens_close(&t);
	cr_assert(!t.opened);
	gpt_tokens_close(&t); /* closed twice: a no-op */
}

/* A file cut short after it was opened: the window's read fails with a message naming it (no
 * mapping to fault on), the windows still within it read. */
Test(gpt_tokens, file_cut_short_while_training)
{
	uint32_t tok[40];
	for (int i = 0; i < 40; i++) {
		tok[i] = (uint32_t)i;
	}
	const char *p = write_llmc("cut.bin", GPT_LLMC_MAGIC_U16, 1, 40, tok, 40, 2);
	struct gpt_tokens t;
	open_ok(&t, p, GPT_TOKENS_LLMC, 64, 4);
	cr_assert_eq(truncate(p, 1024 + 2 * 20), 0);
	expect_window(&t, 10, 4, (int[]){10, 11, 12, 13, 14});
	int got[5];
	cr_assert_eq(gpt_tokens_window(&t, 30, got, errbuf, sizeof(errbuf)), -1);
	cr_assert(strstr(errbuf, p) && strstr(errbuf, "shorter than it was"), "%s", errbuf);
	/* the window across the end reads the start again: its first part fails here too */
	cr_assert_eq(gpt_tokens_window(&t, 38, got, errbuf, sizeof(errbuf)), -1);
	gpt_tokens_close(&t);
}

/* The start's formula with every factor, and past 2^64 before the modulo. */
Test(gpt_tokens, start_formula_every_factor)
{
	static uint32_t tok[40009];
	const char *p = write_raw("big.u16", tok, 40009, 2, 0);
	struct gpt_tokens t;
	open_ok(&t, p, GPT_TOKENS_U16, 2, 32768);
	/* G = (((3 - 1) 2 + 1) 3 + 2) 4 + 3 = 71; 71 x 5 = 355; mod 40009 */
	cr_assert_eq(gpt_tokens_start(&t, 3, 2, 1, 3, 2, 4, 3, 5), 355);
	/* G = ((99999999 x 32768 + 32767) x 1 + 0) x 65535 + 65534 = 214745087999999999 (58
	   bits); G x 32768 has 73 bits; mod 40009 = 4482 (worked in Python's integers) */
	cr_assert_eq(gpt_tokens_start(&t, 100000000, 32768, 32767, 1, 0, 65535, 65534, 32768),
		     4482);
	gpt_tokens_close(&t);
	/* rank and micro-batch splits of one global batch: the same starts */
	static uint32_t small[97];
	p = write_raw("small.u16", small, 97, 2, 0);
	open_ok(&t, p, GPT_TOKENS_U16, 2, 5);
	for (int b = 0; b < 6; b++) {
		uint64_t one = gpt_tokens_start(&t, 4, 1, 0, 1, 0, 6, b, 5);
		uint64_t ranks = gpt_tokens_start(&t, 4, 1, 0, 2, b / 3, 3, b % 3, 5);
		uint64_t gas = gpt_tokens_start(&t, 4, 2, b / 3, 1, 0, 3, b % 3, 5);
		cr_assert(one == ranks && one == gas, "row %d: %llu, ranks %llu, gas %llu", b,
			  (unsigned long long)one, (unsigned long long)ranks,
			  (unsigned long long)gas);
		cr_assert_eq(one, (uint64_t)(18 + b) * 5 % 97);
	}
	gpt_tokens_close(&t);
}

/* The same tokens as llm.c gpt-2, llm.c llama-3, raw uint16 and raw uint32: the same windows;
 * uint32 tokens past 65535 read whole. */
Test(gpt_tokens, formats_agree)
{
	uint32_t tok[23];
	for (int i = 0; i < 23; i++) {
		tok[i] = (uint32_t)(i * 2741 % 60000);
	}
	struct {
		const char *p;
		enum gpt_tokens_format f;
		const char *what;
	} fs[] = {
		{write_llmc("g.bin", GPT_LLMC_MAGIC_U16, 1, 23, tok, 23, 2), GPT_TOKENS_LLMC,
		 "llm.c gpt-2 (uint16)"},
		{write_llmc("l.bin", GPT_LLMC_MAGIC_U32, 7, 23, tok, 23, 4), GPT_TOKENS_LLMC,
		 "llm.c llama-3 (uint32)"},
		{write_raw("r.u16", tok, 23, 2, 0), GPT_TOKENS_U16, "raw uint16"},
		{write_raw("r.u32", tok, 23, 4, 0), GPT_TOKENS_U32, "raw uint32"},
	};
	int want[8];
	for (int j = 0; j <= 7; j++) {
		want[j] = (int)tok[(20 + j) % 23];
	}
	for (int k = 0; k < 4; k++) {
		struct gpt_tokens t;
		open_ok(&t, fs[k].p, fs[k].f, 60000, 7);
		cr_assert_eq(t.n, 23, "%s", fs[k].what);
		cr_assert_str_eq(t.what, fs[k].what);
		expect_window(&t, 20, 7, want);
		gpt_tokens_close(&t);
	}
	uint32_t wide[6] = {70000, 1, 16777215, 3, 65536, 5};
	struct gpt_tokens t;
	open_ok(&t, write_raw("w.u32", wide, 6, 4, 0), GPT_TOKENS_U32, 1 << 24, 4);
	cr_assert_eq(t.max_token, 16777215);
	expect_window(&t, 4, 4, (int[]){65536, 5, 70000, 1, 16777215});
	gpt_tokens_close(&t);
}

Test(gpt_tokens, vocabulary_bound)
{
	uint32_t tok[10] = {1, 2, 3, 4, 5, 6, 7, 250, 8, 300};
	const char *p = write_llmc("v.bin", GPT_LLMC_MAGIC_U16, 1, 10, tok, 10, 2);
	refused(p, GPT_TOKENS_LLMC, 200, 4,
		"token 7 (of 10) is 250, not below --vocab 200; the file's largest token is 300: "
		"give --vocab 301 or more");
	struct gpt_tokens t;
	open_ok(&t, p, GPT_TOKENS_LLMC, 301, 4); /* the largest is V - 1 */
	gpt_tokens_close(&t);
	refused(p, GPT_TOKENS_LLMC, 300, 4, "token 9 (of 10) is 300");
}

Test(gpt_tokens, header_refusals)
{
	uint32_t tok[10] = {0};
	refused(write_llmc("m.bin", 12345, 1, 10, tok, 10, 2), GPT_TOKENS_LLMC, 64, 4,
		"not an llm.c token file: magic 12345");
	refused(write_llmc("v2.bin", GPT_LLMC_MAGIC_U16, 2, 10, tok, 10, 2), GPT_TOKENS_LLMC, 64, 4,
		"version 2: only version 1 (uint16 tokens)");
	refused(write_llmc("v1.bin", GPT_LLMC_MAGIC_U32, 1, 10, tok, 10, 4), GPT_TOKENS_LLMC, 64, 4,
		"version 1: only version 7 (uint32 tokens)");
	refused(write_llmc("short.bin", GPT_LLMC_MAGIC_U16, 1, 10, tok, 9, 2), GPT_TOKENS_LLMC, 64,
		4, "the header says 10 tokens (uint16), but the file has 1042 bytes");
	refused(write_llmc("long.bin", GPT_LLMC_MAGIC_U16, 1, 9, tok, 10, 2), GPT_TOKENS_LLMC, 64,
		4, "the header says 9 tokens");
	refused(write_llmc("zero.bin", GPT_LLMC_MAGIC_U16, 1, 0, tok, 0, 2), GPT_TOKENS_LLMC, 64, 4,
		"the header says 0 tokens");
	refused(write_llmc("neg.bin", GPT_LLMC_MAGIC_U16, 1, -5, tok, 10, 2), GPT_TOKENS_LLMC, 64,
		4, "the header says -5 tokens");
	refused(write_raw("tiny.bin", tok, 10, 2, 0), GPT_TOKENS_LLMC, 64, 4,
		"20 bytes, shorter than llm.c's header (1024 bytes)");
	refused(write_llmc("few.bin", GPT_LLMC_MAGIC_U16, 1, 4, tok, 4, 2), GPT_TOKENS_LLMC, 64, 4,
		"4 tokens, fewer than one window of --context 4 + 1 = 5");
	struct gpt_tokens t;
	open_ok(&t, write_llmc("five.bin", GPT_LLMC_MAGIC_U16, 1, 5, tok, 5, 2), GPT_TOKENS_LLMC,
		64, 4);
	gpt_tokens_close(&t);
}

Test(gpt_tokens, raw_refusals)
{
	uint32_t tok[10] = {0};
	const char *llmc = write_llmc("h.bin", GPT_LLMC_MAGIC_U16, 1, 10, tok, 10, 2);
	refused(llmc, GPT_TOKENS_U16, 64, 4, "has llm.c's header");
	refused(llmc, GPT_TOKENS_U32, 64, 4, "--data-dtype uint32 would train on the header");
	refused(write_raw("odd.u16", tok, 3, 2, 1), GPT_TOKENS_U16, 64, 4,
		"7 bytes: not a whole number of uint16 tokens");
	refused(write_raw("odd.u32", tok, 2, 4, 2), GPT_TOKENS_U32, 64, 1,
		"10 bytes: not a whole number of uint32 tokens");
	refused(write_raw("few.u32", tok, 4, 4, 0), GPT_TOKENS_U32, 64, 4, "4 tokens, fewer than");
	refused(write_raw("empty", tok, 0, 2, 0), GPT_TOKENS_U16, 64, 4, "empty: no tokens");
	refused(path_of("missing"), GPT_TOKENS_U16, 64, 4, "No such file or directory");
	refused(dir, GPT_TOKENS_LLMC, 64, 4, "not a regular file");
	/* a raw uint16 file whose first bytes read as llm.c's magic, version 1 and a count of 1000,
	   but whose size (1200 bytes) is not that header's 3024: raw tokens, taken */
	static uint32_t look[600] = {0xd888, 0x0134, 1, 0, 1000, 0};
	cr_assert_eq(0x0134d888, GPT_LLMC_MAGIC_U16);
	struct gpt_tokens t;
	open_ok(&t, write_raw("look.u16", look, 600, 2, 0), GPT_TOKENS_U16, 0xd888 + 1, 4);
	cr_assert_eq(t.n, 600);
	cr_assert_eq(t.max_token, 0xd888);
	gpt_tokens_close(&t);
}

Test(gpt_tokens, data_dtype_names)
{
	enum gpt_tokens_format f = GPT_TOKENS_U32;
	cr_assert_eq(gpt_tokens_format_parse("llmc", &f), 0);
	cr_assert_eq(f, GPT_TOKENS_LLMC);
	cr_assert_eq(gpt_tokens_format_parse("uint16", &f), 0);
	cr_assert_eq(f, GPT_TOKENS_U16);
	cr_assert_eq(gpt_tokens_format_parse("uint32", &f), 0);
	cr_assert_eq(f, GPT_TOKENS_U32);
	cr_assert_eq(gpt_tokens_format_parse("int16", &f), -1);
	cr_assert_eq(gpt_tokens_format_parse("", &f), -1);
	cr_assert_eq(f, GPT_TOKENS_U32, "a refused name changed the format");
}
