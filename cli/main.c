/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli/main.c: the `zinf` command: its parts (bench, checkpoint, config, estimate, version),
 * ZINF_LOG_LEVEL, and the library's messages sent to stderr through the log callback. Each part
 * is a table of subcommands in its own file (bench/ holds the benchmarks).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "zinf/common.h"

static int
cmd_version(int argc, char **argv)
{
	printf("zinf %s\n", zinf_version());
	return 0;
}

static const struct cli_cmd top_cmds[] = {
	{"bench", "benchmarks: I/O, optimizer, step, collectives, PCIe, engine", NULL,
	 cli_bench_cmds},
	{"checkpoint", "checkpoints: inspect, export to safetensors", NULL, cli_checkpoint_cmds},
	{"config", "DeepSpeed configuration files", NULL, cli_config_cmds},
	{"estimate", "model-state memory per GPU, CPU and NVMe for every ZeRO stage and offload",
	 cli_estimate},
	{"version", "print the library version", cmd_version},
	{NULL},
};

int
main(int argc, char **argv)
{
	zinf_log_set_callback(zinf_log_to_file, stderr);
	enum zinf_log_level lvl = ZINF_LOG_WARN;
	const char *env = getenv("ZINF_LOG_LEVEL");
	if (env && env[0] && zinf_log_level_parse(env, &lvl) < 0) {
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
