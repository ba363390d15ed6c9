// SPDX-License-Identifier: Apache-2.0
/*
 * cli/main.c: the `zinf` command: dispatch to subcommands, and the helpers they share.
 * Library messages go to stderr through the log callback installed here.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "zinf/common.h"

volatile sig_atomic_t cli_interrupted;

static void
on_signal(int sig)
{
	cli_interrupted = sig;
}

void
cli_catch_signals(void)
{
	struct sigaction sa = {0};
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

int
cli_parse_size(const char *s, uint64_t *out)
{
	char *end = NULL;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || !(v >= 0) || !isfinite(v)) {
		return -EINVAL;
	}
	double mul = 1;
	switch (toupper((unsigned char)*end)) {
	case 'K':
		mul = 1024.0;
		end++;
		break;
	case 'M':
		mul = 1024.0 * 1024;
		end++;
		break;
	case 'G':
		mul = 1024.0 * 1024 * 1024;
		end++;
		break;
	case 'T':
		mul = 1024.0 * 1024 * 1024 * 1024;
		end++;
		break;
	default:
		break;
	}
	if (mul > 1 && (strcasecmp(end, "iB") == 0 || strcasecmp(end, "B") == 0)) {
		end += strlen(end);
	}
	if (*end != '\0' || v * mul > 1.8e19) {
		return -EINVAL;
	}
	*out = (uint64_t)(v * mul + 0.5);
	return 0;
}

void
cli_progress_init(struct cli_progress *p, const char *label, uint64_t total)
{
	p->tty = isatty(STDERR_FILENO);
	p->label = label;
	p->total = total ? total : 1;
	p->done = 0;
	p->last_pct = -1;
}

void
cli_progress_add(struct cli_progress *p, uint64_t n)
{
	p->done += n;
	if (!p->tty) {
		return;
	}
	int pct = (int)(100.0 * (double)p->done / (double)p->total);
	if (pct > 100) {
		pct = 100;
	}
	if (pct == p->last_pct) {
		return;
	}
	p->last_pct = pct;
	char bar[41];
	int fill = pct * 40 / 100;
	memset(bar, '#', fill);
	memset(bar + fill, '.', 40 - fill);
	bar[40] = '\0';
	fprintf(stderr, "\r%-24s [%s] %3d%%", p->label, bar, pct);
	fflush(stderr);
}

void
cli_progress_done(struct cli_progress *p)
{
	if (p->tty && p->last_pct >= 0) {
		fprintf(stderr, "\r%*s\r", 80, "");
		fflush(stderr);
	}
}

static void
usage(FILE *f)
{
	fprintf(f,
		"usage: zinf <command> [options]\n"
		"\n"
		"commands:\n"
		"  bench io     NVMe/file bandwidth of the I/O engine (default: ./zinf-bench-io)\n"
		"  bench adam   CPU-Adam throughput against the machine's memory bandwidth\n"
		"  bench step   the pipelined optimizer step over state on NVMe\n"
		"  version      print the library version\n"
		"\n"
		"Run `zinf bench <what> --help` for the options of each.\n");
}

int
main(int argc, char **argv)
{
	zinf_log_set_callback(zinf_log_to_file, stderr);
	const char *lvl = getenv("ZINF_LOG_LEVEL");
	zinf_log_set_level(lvl ? (enum zinf_log_level)atoi(lvl) : ZINF_LOG_WARN);
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
	    strcmp(argv[1], "help") == 0) {
		usage(stdout);
		return 0;
	}
	if (strcmp(argv[1], "version") == 0 || strcmp(argv[1], "--version") == 0) {
		printf("zinf %s\n", zinf_version());
		return 0;
	}
	if (strcmp(argv[1], "bench") == 0) {
		int (*fn)(int, char **) = NULL;
		const char *what = argc > 2 ? argv[2] : "io";
		if (strcmp(what, "io") == 0) {
			fn = cli_bench_io;
		} else if (strcmp(what, "adam") == 0) {
			fn = cli_bench_adam;
		} else if (strcmp(what, "step") == 0) {
			fn = cli_bench_step;
		} else {
			fprintf(stderr, "zinf bench: unknown benchmark '%s' (io, adam, step)\n",
				what);
			return 2;
		}
		/* `zinf bench` alone runs `zinf bench io` with its defaults. */
		char *dflt[] = {"io", NULL};
		return argc > 2 ? fn(argc - 2, argv + 2) : fn(1, dflt);
	}
	fprintf(stderr, "zinf: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
