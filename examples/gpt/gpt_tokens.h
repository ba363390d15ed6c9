/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/gpt/gpt_tokens.h: training data from a token file (--data FILE): llm.c's .bin (a
 * header of 256 little-endian int32: magic, version, token count; then the tokens: gpt-2's
 * magic 20240520 version 1 with uint16 tokens, llama-3's 20240801 version 7 with uint32), or a
 * raw little-endian uint16 or uint32 file (--data-dtype). The file is read with pread, never
 * into memory as a whole: once when opened, in pieces of 1 MiB, to check it (header, size,
 * every token below the vocabulary), then a window at a time (no mapping: a file cut short
 * while training is an error of the read, not a SIGBUS).
 *
 * The order is a function of the step and the row's place in the global batch alone, so that
 * one rank with micro-batch N x B, N ranks with B each and one rank accumulating N micro-batches
 * of B train on the same rows (as the Markov source's samples, gpt_data.h): row b of micro-batch
 * m of optimizer step s (from 1) on rank r is global row G = (((s - 1) gas + m) world + r) B + b,
 * and its window is the T + 1 tokens from S = G T mod n (n: the file's tokens): token j of the
 * window (j = 0..T) is token (S + j) mod n of the file. So the windows tile the stream by T,
 * each sharing its last token with the next one's first (llm.c's loader reads B T + 1 tokens
 * for B rows alike), and the stream is a cycle: past the end it goes on from token 0 (a window
 * may straddle the end), and a second pass starts where the first left off mod n. The inputs
 * are the window's first T tokens, the targets its last T.
 */
#ifndef ZINF_EXAMPLE_GPT_TOKENS_H
#define ZINF_EXAMPLE_GPT_TOKENS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* --data-dtype: llm.c's .bin (the default), or raw tokens of 2 or 4 bytes. */
enum gpt_tokens_format {
	GPT_TOKENS_LLMC = 0,
	GPT_TOKENS_U16 = 1,
	GPT_TOKENS_U32 = 2,
};

/* llm.c's header: 256 int32 before the tokens; its magics (dev/data/data_common.py). */
#define GPT_LLMC_HEADER_INTS 256
#define GPT_LLMC_MAGIC_U16   20240520 /* gpt-2: version 1, uint16 tokens */
#define GPT_LLMC_MAGIC_U32   20240801 /* llama-3: version 7, uint32 tokens */

struct gpt_tokens {
	bool opened;	    /* fd is open (a zeroed struct is a closed one) */
	int fd;		    /* the file, read-only */
	const char *path;   /* for messages (the caller's string) */
	uint64_t bytes;	    /* its size when opened */
	uint64_t off;	    /* byte offset of the first token: 1024 (llm.c) or 0 (raw) */
	uint64_t n;	    /* tokens */
	int width;	    /* bytes a token: 2 or 4 (little-endian) */
	int T;		    /* the context it was opened for: windows of T + 1 */
	uint32_t max_token; /* the largest token of the file */
	const char *what;   /* the format, for messages: "llm.c gpt-2 (uint16)", ... */
	unsigned char *buf; /* (T + 1) x width bytes: one window as read */
};

/* --data-dtype's value: "llmc", "uint16" or "uint32". 0, or -1 (unknown). */
int gpt_tokens_format_parse(const char *s, enum gpt_tokens_format *out);

/*
 * Open and check path as format f for a model of vocabulary V and context T: llm.c's header
 * (magic, version, a token count that the file's size matches exactly), a raw file a whole number
 * of tokens and without llm.c's header (a raw dtype over an llm.c file would train on its header),
 * at least T + 1 tokens (one window), every token below V. Returns 0, or -1 with the reason in
 * err (naming the file, and for a token past the vocabulary its position and value and the
 * file's largest token) and *t closed. vocab_from names where V came from in that message
 * ("config.json's vocab_size"); NULL: --vocab, and the message says which --vocab would do.
 */
int gpt_tokens_open(struct gpt_tokens *t, const char *path, enum gpt_tokens_format f, int V,
		    const char *vocab_from, int T, char *err, size_t errlen);
/* Close; a closed one (open failed, or closed already) is a no-op. */
void gpt_tokens_close(struct gpt_tokens *t);

/* S = G T mod n for row b of micro-batch m of step s (from 1) on rank r (the header's G). */
uint64_t gpt_tokens_start(const struct gpt_tokens *t, int64_t step, int gas, int micro, int world,
			  int rank, int B, int b, int T);
/* The window of T + 1 tokens (the T of open) from token `start` (< n), wrapping at n, into out.
   0, or -1 with the reason in err (a read error, or the file cut short since it was opened). */
int gpt_tokens_window(struct gpt_tokens *t, uint64_t start, int *out, char *err, size_t errlen);

#endif
