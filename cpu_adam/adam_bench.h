/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpu_adam/adam_bench.h: the passes `zinf bench adam --three-pass` times against the fused step
 * (the unfused way: unscale the gradient, step, convert the copy) and the step's tile, declared
 * for that benchmark and the tests: a declared internal interface, not installed (adam.c).
 */
#ifndef ZINF_CPU_ADAM_BENCH_H
#define ZINF_CPU_ADAM_BENCH_H

#include <stddef.h>

#include "zinf/blocks/adam.h"

/* Elements per tile: a multiple of every vector width, so that which elements go through the
 * vector body and which through a scalar tail never depends on the tiling or thread count;
 * 8192 floats x 5 arrays stay inside L2 while a tile is worked on.
 * The benchmark first-touches its arrays tile by tile, as the threads will use them. */
#define ZINF_ADAM_TILE 8192

/* Threaded like the step (o: threads and SIMD path, NULL for the defaults): g *= s in place;
 * dst = src as dtype (RNE). Return 0 or -errno. */
int adam_unscale(void *grad, enum zinf_dtype dt, size_t n, float s, const struct zinf_grad_opts *o);
int adam_convert(const float *src, void *dst, enum zinf_dtype dt, size_t n,
		 const struct zinf_grad_opts *o);

#endif
