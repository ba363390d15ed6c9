/* SPDX-License-Identifier: Apache-2.0 */
/* cli/cli.h: the subcommands of `zinf` and the helpers they share (sizes, progress, signals). */
#ifndef ZINF_CLI_H
#define ZINF_CLI_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

/* Subcommands: argv[0] is the subcommand's name ("io" for `zinf bench io`). Return an exit code. */
int cli_bench_io(int argc, char **argv);
int cli_bench_adam(int argc, char **argv);
int cli_bench_step(int argc, char **argv);

/*
 * Parse "4096", "64K", "1M", "1.5G", "2GiB", "1e9" (K/M/G/T are powers of 1024; a plain number
 * with an exponent is a count). Returns 0 or -EINVAL.
 */
int cli_parse_size(const char *s, uint64_t *out);

/* A one-line progress bar on stderr when stderr is a terminal; silent otherwise. */
struct cli_progress {
	bool tty;
	const char *label;
	uint64_t total, done;
	int last_pct;
};
void cli_progress_init(struct cli_progress *p, const char *label, uint64_t total);
void cli_progress_add(struct cli_progress *p, uint64_t n);
void cli_progress_done(struct cli_progress *p);

/*
 * SIGINT/SIGTERM set cli_interrupted instead of killing the process, so a benchmark can stop,
 * remove its files and exit 130.
 */
extern volatile sig_atomic_t cli_interrupted;
void cli_catch_signals(void);

#endif
