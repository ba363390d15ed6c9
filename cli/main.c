/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli/main.c: the `zinf` command: the table of subcommands, ZINF_LOG_LEVEL, and the library's
 * messages sent to stderr through the log callback. Each subcommand lives in its own file.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "zinf/common.h"

static const struct cli_cmd bench_cmds[] = {
	{"io", "NVMe/file bandwidth of the I/O engine (default: ./zinf-bench-io)", cli_bench_io},
	{"adam", "CPU-Adam throughput against the machine's memory bandwidth", cli_bench_adam},
	{"step", "the pipelined optimizer step over state on NVMe", cli_bench_step},
	{"comm", "collective bandwidth against the raw MPI/NCCL call (under mpirun)",
	 cli_bench_comm},
	{"pcie", "host-device copy bandwidth against cudaMemcpyAsync (on a GPU)", cli_bench_pcie},
	{"engine", "the ZeRO engine on a synthetic transformer (alone or under mpirun)",
	 cli_bench_engine},
	{"all", "the machine profile for `zinf estimate --from-bench` (io, adam, pcie, comm)",
	 cli_bench_all},
	{NULL},
};

static const struct cli_cmd config_cmds[] = {
	{"check", "read a ds_config.json, print it resolved and the memory plan per rank",
	 cli_config_check},
	{NULL},
};

static const struct cli_cmd checkpoint_cmds[] = {
	{"inspect", "print a checkpoint's manifest and check every file's CRC32C",
	 cli_checkpoint_inspect},
	{"export", "write a checkpoint's weights as (sharded) safetensors", cli_checkpoint_export},
	{NULL},
};

static int
cmd_version(int argc, char **argv)
{
	printf("zinf %s\n", zinf_version());
	return 0;
}

static const struct cli_cmd top_cmds[] = {
	{"bench", "benchmarks", NULL, bench_cmds},
	{"checkpoint", "checkpoints: inspect, export to safetensors", NULL, checkpoint_cmds},
	{"config", "DeepSpeed configuration files", NULL, config_cmds},
	{"estimate", "model-state memory per GPU, CPU and NVMe for every ZeRO stage and offload",
	 cli_estimate},
	{"version", "print the library version", cmd_version},
	{NULL},
};

/* ZINF_LOG_LEVEL: a name (error, warn, info, debug) or its number (0-3). */
static int
log_level(const char *s, enum zinf_log_level *out)
{
	static const char *const names[] = {"error", "warn", "info", "debug", NULL};
	for (int i = 0; names[i]; i++) {
		char num[2] = {(char)('0' + i), '\0'};
		if (strcasecmp(s, names[i]) == 0 || strcmp(s, num) == 0) {
			*out = (enum zinf_log_level)i;
			return 0;
		}
	}
	if (strcasecmp(s, "warning") == 0) {
		*out = ZINF_LOG_WARN;
		return 0;
	}
	return -1;
}

int
main(int argc, char **argv)
{
	zinf_log_set_callback(zinf_log_to_file, stderr);
	enum zinf_log_level lvl = ZINF_LOG_WARN;
	const char *env = getenv("ZINF_LOG_LEVEL");
	if (env && env[0] && log_level(env, &lvl) < 0) {
		fprintf(stderr,
			"zinf: ZINF_LOG_LEVEL=%s: expected error, warn, info or debug (or "
			"0-3)\n",
			env);
		return 2;
	}
	zinf_log_set_level(lvl);
	if (argc >= 2 && strcmp(argv[1], "--version") == 0) {
		return cmd_version(argc - 1, argv + 1);
	}
	return cli_dispatch("zinf", top_cmds, argc, argv);
}
