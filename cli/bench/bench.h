/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli/bench/bench.h: the benchmarks of `zinf bench`, one file each; bench.c holds their table.
 * Each measures a part of zinf against a reference in the same run (the raw call, the memory
 * bandwidth, fio's pattern) and reads the library through its public API
 * (include/zinf/blocks/) and the declared benchmark interfaces (nvme/crc32c.h,
 * cpu_adam/adam_bench.h) only.
 */
#ifndef ZINF_CLI_BENCH_H
#define ZINF_CLI_BENCH_H

#include "cli/cli.h"

int cli_bench_io(int argc, char **argv);
int cli_bench_adam(int argc, char **argv);
int cli_bench_step(int argc, char **argv);
int cli_bench_comm(int argc, char **argv);
int cli_bench_pcie(int argc, char **argv);
int cli_bench_engine(int argc, char **argv);
int cli_bench_all(int argc, char **argv);

#endif
