/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli/cli.h: the subcommands of `zinf` and the helpers they share: reports (JSON, medians,
 * sizes, the progress bar; report.c) and guards (signals, the memory check, scratch files of
 * runs that were killed; guard.c). Options: cli/opts.h.
 */
#ifndef ZINF_CLI_H
#define ZINF_CLI_H

#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "cli/opts.h"
#include "zinf/blocks/swap.h"

/*
 * The command's parts, each a table of subcommands (ended by {NULL}) in its own file or folder:
 * main.c lists them. A subcommand gets argv[0] = its name ("io" for `zinf bench io`) and returns
 * an exit code.
 */
extern const struct cli_cmd cli_bench_cmds[];	   /* bench/bench.c: the benchmarks */
extern const struct cli_cmd cli_checkpoint_cmds[]; /* checkpoint.c: inspect, export */
extern const struct cli_cmd cli_config_cmds[];	   /* config_check.c: check */
int cli_estimate(int argc, char **argv);	   /* estimate.c */

/* ---- reports (report.c) ------------------------------------------------------------------- */

/* A JSON number; NaN and infinities (not JSON) become null. */
json_t *cli_json_real(double v);
/* o[key] as a number; NaN when o is NULL or the value is missing, null or not a number. */
double cli_json_num(const json_t *o, const char *key);
/* Print o as one line (indent 0) or indented, on stdout, then free it. Returns 0 or -EIO. */
int cli_json_print(json_t *o, int indent);
/* Median of n values (n >= 1); v is left unchanged. */
double cli_median(const double *v, size_t n);
/* "1 GiB", "256 KiB", "1.5 GiB", "123 B": bytes as a person reads them. */
void cli_size_str(char *out, size_t n, uint64_t bytes);

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

/* ---- guards (guard.c) --------------------------------------------------------------------- */

/*
 * SIGINT, SIGTERM, SIGHUP and SIGPIPE set cli_interrupted (the signal's number) instead of
 * killing the process, so that a benchmark stops, removes its files and exits 128 + signal.
 * SIGXFSZ is ignored: a write past `ulimit -f` then fails with EFBIG and is reported.
 */
extern volatile sig_atomic_t cli_interrupted;
void cli_catch_signals(void);
/* The exit code for an interrupted run: 128 + the signal. */
int cli_interrupt_status(void);

/*
 * The launcher's rank and size before MPI is joined (Open MPI, PMIx, PMI, Slurm), or 0 of 1 when
 * the process was started alone: options are parsed (and errors printed by rank 0 only) before
 * the job is joined.
 */
int cli_launcher_rank(void);
int cli_launcher_size(void);

/* Physical memory of the machine, bytes (zinf_topo_memory, else sysconf). */
uint64_t cli_phys_memory(void);

/*
 * Before allocating: `bytes` of host memory must leave 10% of physical memory free (the
 * pool's rule). Otherwise print "<prog>: <what>: X needed, more than 90% of the machine's Y
 * of physical memory; lower <lower>" and return -ENOMEM. bytes is a double so that a caller's
 * product (elements x bytes) cannot wrap past 2^64 on its way here.
 */
int cli_check_memory(const char *prog, const char *what, double bytes, const char *lower);

/*
 * The scratch-file prefix of this run: "<stem>-<host>-<pid>" (zinf_scratch_prefix: the host and
 * the pid name the owner, so that a later run on the same host can tell a killed run's files from
 * a running one's, and one on another host leaves them alone). out: CLI_PREFIX_MAX bytes.
 */
#define CLI_PREFIX_MAX (ZINF_SCRATCH_HOST_MAX + 88)
void cli_scratch_prefix(char *out, size_t n, const char *stem);

/*
 * Remove the files a killed run of the same command on this host left in dir
 * (zinf_scratch_reclaim, zinf/blocks/swap.h): the swap files, probes and locks of a prefix
 * "<stem>-<host>-<pid>" whose pid no longer runs, each removed under its own lock
 * (<prefix>-r<rank>.<d>.lock), which must exist and be free: a pid from another pid namespace
 * (a container sharing the directory) is not taken for dead. Prints one line for the files
 * removed, one naming the files of a run that is still going, one for files named so whose lock
 * is missing and one for other hosts' files (all left alone). Returns the number of files
 * removed.
 */
int cli_reclaim_scratch(const char *prog, const char *dir, const char *stem);

/* Hold the library's errors back (the caller prints the one that matters) or not; warnings
 * and the rest always reach stderr. */
void cli_quiet_errors(bool quiet);

/*
 * zinf_swap_create() with its refusal printed once: the library logs each layer's refusal (the
 * directory's O_DIRECT probe, with the library's own options, then the swap space); only the
 * last, which names the swap space and its directory, is printed, then "add --buffered" when
 * O_DIRECT was refused. Warnings pass through. Returns what zinf_swap_create() returned.
 */
struct zinf_swap;
struct zinf_swap_opts;
int cli_swap_create(const char *prog, struct zinf_io *io, const struct zinf_swap_opts *opts,
		    struct zinf_swap **out);

#endif
