/* SPDX-License-Identifier: Apache-2.0 */
/* cli/bench/bench.c: the table of `zinf bench`'s subcommands. */
#include "cli/bench/bench.h"

const struct cli_cmd cli_bench_cmds[] = {
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
