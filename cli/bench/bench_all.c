/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli/bench/bench_all.c: `zinf bench all`: the machine profile that `zinf estimate --from-bench`
 * reads: short runs of bench io (NVMe read and write), bench adam (CPU-Adam parameters per
 * second, every CPU), bench pcie (host-device copies, on a GPU) and, under mpirun with more
 * than one rank, bench comm (all-gather, reduce-scatter, all-reduce bus bandwidth), each run in
 * this process with its JSON captured, and one JSON object holding them all plus the summary
 * numbers estimate uses. Under mpirun, rank 0 measures the disk, the CPU and the GPU link
 * alone (the others wait in the collective benchmark that follows) and prints the profile.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/bench/bench.h"

#define PROG "zinf bench all"

struct cfg {
	const char *path;
	uint64_t io_size, adam_params, comm_size;
	const char *out;
};

static struct cfg cfg;

static const char synopsis[] = "[--path DIR] [--io-size N] [--adam-params N] [--comm-size N] "
			       "[--out FILE]";
static const char description[] =
	"The machine profile for `zinf estimate --from-bench`: bench io, bench adam (every CPU),\n"
	"bench pcie (on a GPU) and, under mpirun with several ranks, bench comm, each short, in\n"
	"one JSON object (printed, or written to --out). Summary keys: nvme_read_GBps,\n"
	"nvme_write_GBps, adam_params_per_s, pcie_GBps (host-to-device from pinned memory),\n"
	"net_busbw_GBps (all-gather, reduce-scatter and all-reduce bus bandwidth, the least),\n"
	"and null for what was not measured.\n";

static const struct cli_opt opts[] = {
	{"path", CLI_STR, &cfg.path, NULL, "DIR",
	 "directory for bench io's files (default: bench io's default)"},
	{"io-size", CLI_SIZE, &cfg.io_size, "1G", "N", "bytes bench io writes and reads", .min = 1,
	 .max = 1ull << 40},
	{"adam-params", CLI_COUNT, &cfg.adam_params, "5e7", "N", "elements per bench adam step",
	 .min = 1, .max = 1e11},
	{"comm-size", CLI_SIZE, &cfg.comm_size, "64M", "N", "bytes per bench comm collective",
	 .min = 1, .max = 1ull << 40},
	{"out", CLI_STR, &cfg.out, NULL, "FILE", "write the profile here instead of stdout"},
	{NULL},
};

/*
 * Run one subcommand in this process with its stdout captured; parse what it printed as JSON.
 * Returns the object (NULL when it failed or printed none: its stderr has said why) and sets
 * *rc to its exit code.
 */
static json_t *
run_captured(int (*fn)(int, char **), int argc, char **argv, int *rc)
{
	FILE *tmp = tmpfile();
	if (!tmp) {
		fprintf(stderr, PROG ": tmpfile: %s\n", strerror(errno));
		*rc = 1;
		return NULL;
	}
	fflush(stdout);
	int saved = dup(STDOUT_FILENO);
	if (saved < 0 || dup2(fileno(tmp), STDOUT_FILENO) < 0) {
		fprintf(stderr, PROG ": dup: %s\n", strerror(errno));
		fclose(tmp);
		if (saved >= 0) {
			close(saved);
		}
		*rc = 1;
		return NULL;
	}
	*rc = fn(argc, argv);
	fflush(stdout);
	dup2(saved, STDOUT_FILENO);
	close(saved);
	rewind(tmp);
	json_error_t jerr;
	json_t *o = json_loadf(tmp, JSON_DISABLE_EOF_CHECK, &jerr);
	fclose(tmp);
	if (*rc != 0) {
		json_decref(o);
		return NULL;
	}
	return o;
}

int
cli_bench_all(int argc, char **argv)
{
	int rc = cli_opts_main(PROG, synopsis, description, opts, argc, argv);
	if (rc >= 0) {
		return rc;
	}
	struct cfg c = cfg;
	int rank = cli_launcher_rank(), world = cli_launcher_size();
	char io_size[32], adam_params[32], threads[24], comm_size[32];
	snprintf(io_size, sizeof(io_size), "%" PRIu64, c.io_size);
	snprintf(adam_params, sizeof(adam_params), "%" PRIu64, c.adam_params);
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	snprintf(threads, sizeof(threads), "%ld", ncpu > 0 ? ncpu : 1);
	snprintf(comm_size, sizeof(comm_size), "%" PRIu64, c.comm_size);

	json_t *io = NULL, *adam = NULL, *pcie = NULL, *comm = NULL;
	int failed = 0, r;
	if (rank == 0) {
		char *io_argv[] = {"io", "--size", io_size, "--json", NULL, NULL, NULL};
		if (c.path) {
			io_argv[4] = "--path";
			io_argv[5] = (char *)c.path;
		}
		io = run_captured(cli_bench_io, c.path ? 6 : 4, io_argv, &r);
		failed |= r != 0;
		char *adam_argv[] = {"adam",   "--params", adam_params, "--threads", threads,
				     "--reps", "3",	   "--json",	NULL};
		adam = run_captured(cli_bench_adam, 8, adam_argv, &r);
		failed |= r != 0;
		char *pcie_argv[] = {"pcie", "--size", "64M", "--json", NULL};
		pcie = run_captured(cli_bench_pcie, 4, pcie_argv, &r);
		failed |= r != 0;
	}
	if (world > 1) {
		char *comm_argv[] = {"comm", "--op", "all", "--size", comm_size, "--json", NULL};
		comm = run_captured(cli_bench_comm, 6, comm_argv, &r);
		failed |= r != 0;
	}
	if (rank != 0) {
		json_decref(comm);
		return failed ? 1 : 0;
	}

	double pcie_bw = NAN;
	json_t *p;
	size_t i;
	json_array_foreach(pcie ? json_object_get(pcie, "results") : NULL, i, p)
	{
		const char *dir = json_string_value(json_object_get(p, "direction"));
		const char *mem = json_string_value(json_object_get(p, "memory"));
		if (dir && mem && strcmp(dir, "h2d") == 0 && strcmp(mem, "pinned") == 0) {
			pcie_bw = cli_json_num(p, "GBps");
		}
	}
	double net = NAN;
	json_array_foreach(comm ? json_object_get(comm, "results") : NULL, i, p)
	{
		double b = cli_json_num(p, "busbw_GBps");
		net = isnan(net) || b < net ? b : net;
	}
	if (comm && isnan(net)) {
		net = cli_json_num(comm, "busbw_GBps");
	}
	json_t *o = json_object();
	json_object_set_new(o, "bench", json_string("all"));
	json_object_set_new(o, "ranks", json_integer(world));
	json_object_set_new(o, "nvme_read_GBps", cli_json_real(cli_json_num(io, "read_GBps")));
	json_object_set_new(o, "nvme_write_GBps", cli_json_real(cli_json_num(io, "write_GBps")));
	json_object_set_new(o, "adam_params_per_s",
			    cli_json_real(cli_json_num(adam, "params_per_s")));
	json_object_set_new(o, "pcie_GBps", cli_json_real(pcie_bw));
	json_object_set_new(o, "net_busbw_GBps", cli_json_real(net));
	json_object_set_new(o, "io", io ? io : json_null());
	json_object_set_new(o, "adam", adam ? adam : json_null());
	json_object_set_new(o, "pcie", pcie ? pcie : json_null());
	json_object_set_new(o, "comm", comm ? comm : json_null());
	if (c.out) {
		if (json_dump_file(o, c.out, JSON_INDENT(2)) != 0) {
			fprintf(stderr, PROG ": cannot write %s\n", c.out);
			json_decref(o);
			return 1;
		}
		json_decref(o);
		printf(PROG ": profile written to %s\n", c.out);
	} else if (cli_json_print(o, 2) != 0) {
		return 1;
	}
	return failed ? 1 : 0;
}
