/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/offload/swap_rig.h: the I/O context and swap space the offload tests' rigs stand on
 * (test_step.c, test_store.c, step_rig.h): a swap space in a fresh scratch directory. The
 * context is the best backend, or fault over it: one always starts (psync at worst), so a failure
 * fails the test (zt_io_open), never skips it.
 */
#ifndef ZINF_TEST_SWAP_RIG_H
#define ZINF_TEST_SWAP_RIG_H

#include <criterion/criterion.h>
#include <stdbool.h>

#include "common/test_util.h"
#include "zinf/blocks/io.h"
#include "zinf/blocks/swap.h"

/* block_size 0: the default; fault: the "fault" backend (zinf_io_fault_add on *io). */
static inline void
swap_rig_open(uint32_t block_size, bool fault, char **dir, struct zinf_io **io,
	      struct zinf_swap **swap)
{
	struct zinf_io_opts o;
	zinf_io_opts_init(&o);
	if (block_size) {
		o.block_size = block_size;
	}
	if (fault) {
		o.backend = "fault";
	}
	*io = zt_io_open(&o);
	*dir = zt_mkdtemp(NULL);
	struct zinf_swap_opts sw;
	zinf_swap_opts_init(&sw);
	const char *dirs[1] = {*dir};
	sw.dirs = dirs;
	sw.n_dirs = 1;
	cr_assert_eq(zinf_swap_create(*io, &sw, swap), 0, "%s", zinf_last_error());
}

#endif
