/* SPDX-License-Identifier: Apache-2.0 */
/*
 * comm/comm_quant.c: ZeRO++'s quantized collectives over any backend: the all-gather of qwZ
 * (quantize this rank's partition, all-gather codes and scales, dequantize every rank's) and the
 * hierarchical reduce-scatter of qgZ (quantize, all_to_all within a group, dequantize and sum,
 * quantize again, all_to_all across groups, dequantize and sum), with optional error feedback
 * (LoCo). Made of comm.c's collectives (comm_all_gather_u8, comm_all_to_all_u8), so deadlines,
 * the call check and failure notices are theirs; the codec and scratch are the backend's ops
 * (nccl: kernels on its stream) or common/quant.c on host memory. Not here: overlapping the
 * phases with each other (each call waits), 4-bit codes' packing of an odd partition with the
 * next one (each segment starts on a byte and a block).
 */
#include <stdio.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "common/opts.h"
#include "common/quant.h"

ZINF_OPTS_NO_TAIL_PAD(struct zinf_comm_quant_opts, reserved);

struct zinf_comm_qerr {
	struct zinf_comm *c;
	size_t count;	/* elements per rank */
	float beta;	/* err_beta */
	uint32_t reset; /* reset_T */
	uint64_t calls;
	float *err1; /* world x count: this rank's gradient's error, segment by segment */
	float *err2; /* world x count (groups x count used): its group's partial sums' */
};

void
zinf_comm_quant_opts_init(struct zinf_comm_quant_opts *o)
{
	if (!o) {
		return;
	}
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	o->block = QZ_BLOCK_DEFAULT;
	o->bits = 8;
}

/* ---- the backend's memory and codec, or the host's ---------------------------------------- */

static int
q_alloc(struct zinf_comm *c, size_t bytes, void **out)
{
	if (c->ops->qalloc) {
		return c->ops->qalloc(c, bytes, out);
	}
	*out = zc_malloc(bytes ? bytes : 1);
	return *out ? 0
		    : ZINF_FAIL(-ENOMEM, "comm %s rank %d: out of memory for %zu bytes of codes",
				c->ops->name, c->rank, bytes);
}

static void
q_free(struct zinf_comm *c, void *p)
{
	if (!p) {
		return;
	}
	if (c->ops->qfree) {
		c->ops->qfree(c, p);
	} else {
		zc_free(p);
	}
}

/* One call's scratch: the backend's cached one (nccl), or host/qalloc memory of its own. */
static int
q_scratch(struct zinf_comm *c, size_t bytes, void **out)
{
	if (c->ops->qscratch) {
		return c->ops->qscratch(c, bytes, out);
	}
	return q_alloc(c, bytes, out);
}

/*
 * The end of a call's scratch. A request of the call given up on failure (c->abandoned moved
 * past abandoned0: a deadline or a notice) may still be in MPI's hands, posted (Iallgather,
 * Ialltoallv) or blocked on the progress thread, and MPI writes the codes it receives into this
 * buffer whenever the peers arrive: it is left (zc_leave), never freed, as comm.c leaves the
 * buffers of every abandoned call. A backend's cached scratch stays the backend's.
 */
static void
q_scratch_done(struct zinf_comm *c, void *p, unsigned abandoned0)
{
	if (!p || c->ops->qscratch) {
		return;
	}
	if (c->abandoned != abandoned0 && !c->ops->qfree) {
		zc_leave(p);
	} else {
		q_free(c, p); /* nccl (qfree): an abandoned call aborted the communicator first */
	}
}

/*
 * A failure of this rank alone after the arguments were accepted (memory, a codec launch, a
 * zero): tell the other ranks, which would otherwise wait for this one's next all_to_all or
 * all_gather until their deadline; rc is returned. A failure of the communicator itself (a
 * deadline, a notice, a mismatch) was told or seen already (zinf_comm_notify_failure does
 * nothing then).
 */
static int
q_local_fail(struct zinf_comm *c, int rc, const char *what)
{
	if (rc < 0 && !c->failed) {
		char why[160];
		snprintf(why, sizeof(why), "%s on rank %d failed here: %s (%s)", what, c->rank,
			 zinf_strerror(rc), zinf_last_error());
		(void)zinf_comm_notify_failure(c, rc, why);
	}
	return rc;
}

static int
q_zero(struct zinf_comm *c, void *p, size_t bytes)
{
	if (c->ops->qzero) {
		return c->ops->qzero(c, p, bytes);
	}
	memset(p, 0, bytes);
	return 0;
}

static int
q_quantize(struct zinf_comm *c, const struct zinf_comm_quant_opts *q, void *chunk, const void *x,
	   enum zinf_dtype t, size_t n, float *err, float beta)
{
	float *scales = (float *)((char *)chunk + ZINF_ALIGN_UP(qz_code_bytes(n, q->bits), 4));
	if (n == 0) {
		return 0; /* no block: nothing to launch (a CUDA grid of none is an error) */
	}
	if (c->ops->quantize) {
		return c->ops->quantize(c, chunk, scales, x, t, n, q->block, q->bits, err, beta);
	}
	qz_quantize(chunk, scales, x, t, n, q->block, q->bits, err, beta);
	return 0;
}

static int
q_dequantize(struct zinf_comm *c, const struct zinf_comm_quant_opts *q, void *y, enum zinf_dtype t,
	     const void *chunk, size_t n, int acc)
{
	const float *scales =
		(const float *)((const char *)chunk + ZINF_ALIGN_UP(qz_code_bytes(n, q->bits), 4));
	if (n == 0) {
		return 0;
	}
	if (c->ops->dequantize) {
		return c->ops->dequantize(c, y, t, chunk, scales, n, q->block, q->bits, acc);
	}
	if (acc) {
		qz_dequantize_add(y, chunk, scales, n, q->block, q->bits);
	} else {
		qz_dequantize(y, t, chunk, scales, n, q->block, q->bits);
	}
	return 0;
}

static int
q_narrow(struct zinf_comm *c, void *out, enum zinf_dtype t, float *y, size_t n, float mul)
{
	if (n == 0) {
		return 0;
	}
	if (c->ops->narrow) {
		return c->ops->narrow(c, out, t, y, n, mul);
	}
	for (size_t i = 0; i < n; i++) {
		dt_store(out, t, i, mul != 1.0f ? QZ_MUL(y[i], mul) : y[i]);
	}
	return 0;
}

/* Bytes of one segment of n elements on the wire: codes (padded to 4 bytes), then scales. */
static size_t
q_chunk(const struct zinf_comm_quant_opts *q, size_t n)
{
	return ZINF_ALIGN_UP(qz_code_bytes(n, q->bits), 4) + 4 * qz_blocks(n, q->block);
}

/* The options (defaults for NULL) and the arguments every quantized call shares. */
static int
q_args(struct zinf_comm *c, const char *what, const struct zinf_comm_quant_opts *in,
       struct zinf_comm_quant_opts *q, const void *send, void *recv, size_t count,
       enum zinf_dtype dtype)
{
	if (!c) {
		return ZINF_FAIL(-EINVAL, "%s: communicator is NULL", what);
	}
	zinf_comm_quant_opts_init(q);
	int rc = zc_opts_take(q, sizeof(*q), in, "zinf_comm_quant_opts");
	if (rc < 0) {
		return rc;
	}
	if (q->reserved) {
		return ZINF_FAIL(-EINVAL,
				 "%s: zinf_comm_quant_opts.reserved is %u: it must be zero "
				 "(zinf_comm_quant_opts_init)",
				 what, (unsigned)q->reserved);
	}
	if ((rc = qz_check(q->block, q->bits, what)) < 0) {
		return rc;
	}
	if (!zinf_dtype_size(dtype)) {
		return ZINF_FAIL(-EINVAL, "%s: dtype %d unknown", what, (int)dtype);
	}
	if (count && (!send || !recv)) {
		return ZINF_FAIL(-EINVAL, "%s of %zu %s: a buffer is NULL", what, count,
				 zinf_dtype_name(dtype));
	}
	if (count > ((size_t)1 << 40) / (size_t)c->world) {
		return ZINF_FAIL(-EINVAL, "%s: %zu elements x %d ranks is too many", what, count,
				 c->world);
	}
	return 0;
}

/*
 * The backend's limit on one byte move (ops->max_u8), checked before anything is numbered,
 * quantized or posted: `bytes` is what the largest move of the call asks for (qall_gather: one
 * rank's codes; qreduce_scatter: every rank's, world x chunk, the first all_to_all's span).
 */
static int
q_limit(struct zinf_comm *c, const char *what, size_t count, uint64_t bytes, const char *of)
{
	uint64_t max = c->ops->max_u8;
	if (max && bytes > max) {
		return ZINF_FAIL(
			-EINVAL,
			"%s of %zu elements per rank on %d ranks: %s is %llu bytes of codes "
			"and scales, above the %s backend's limit of %llu bytes per call "
			"(MPI counts and displacements are int): split the call",
			what, count, c->world, of, (unsigned long long)bytes, c->ops->name,
			(unsigned long long)max);
	}
	return 0;
}

int
zinf_comm_qall_gather(struct zinf_comm *c, const struct zinf_comm_quant_opts *opts,
		      const void *send, void *recv, size_t count, enum zinf_dtype dtype)
{
	struct zinf_comm_quant_opts q;
	int rc = q_args(c, "qall_gather", opts, &q, send, recv, count, dtype);
	if (rc < 0) {
		return rc;
	}
	size_t es = zinf_dtype_size(dtype), w = (size_t)c->world, s = q_chunk(&q, count);
	const char *sp = send, *rp = recv, *mine = rp + (size_t)c->rank * count * es;
	if (count && sp != mine && sp < rp + w * count * es && rp < sp + count * es) {
		return ZINF_FAIL(-EINVAL,
				 "qall_gather: send overlaps recv other than at rank %d's "
				 "partition (in place)",
				 c->rank);
	}
	if ((rc = q_limit(c, "qall_gather", count, s, "one rank's share")) < 0) {
		return rc;
	}
	unsigned abandoned0 = c->abandoned;
	void *buf = NULL;
	if ((rc = q_scratch(c, s * (w + 1), &buf)) < 0) {
		return q_local_fail(c, rc, "qall_gather");
	}
	char *out = (char *)buf + s;
	rc = q_quantize(c, &q, buf, send, dtype, count, NULL, 0.0f);
	if (rc == 0) {
		rc = comm_all_gather_u8(c, buf, out, s);
	}
	for (size_t r = 0; rc == 0 && r < w; r++) {
		rc = q_dequantize(c, &q, (char *)recv + r * count * es, dtype, out + r * s, count,
				  0);
	}
	q_scratch_done(c, buf, abandoned0);
	return q_local_fail(c, rc, "qall_gather");
}

int
zinf_comm_qerr_create(struct zinf_comm *c, size_t count, float err_beta, uint32_t reset_T,
		      struct zinf_comm_qerr **out)
{
	if (!c || !out || count == 0 || !(err_beta >= 0.0f && err_beta <= 1.0f)) {
		return ZINF_FAIL(-EINVAL,
				 "zinf_comm_qerr_create: communicator %p, out %p, count %zu, "
				 "err_beta %g (in [0, 1])",
				 (void *)c, (void *)out, count, err_beta);
	}
	struct zinf_comm_qerr *e = zc_calloc(1, sizeof(*e));
	if (!e) {
		return ZINF_FAIL(-ENOMEM, "zinf_comm_qerr_create: out of memory");
	}
	e->c = c;
	e->count = count;
	e->beta = err_beta;
	e->reset = reset_T;
	size_t bytes = count * (size_t)c->world * sizeof(float);
	int rc = q_alloc(c, bytes, (void **)&e->err1);
	if (rc == 0) {
		rc = q_alloc(c, bytes, (void **)&e->err2);
	}
	if (rc == 0) {
		rc = q_zero(c, e->err1, bytes);
	}
	if (rc == 0) {
		rc = q_zero(c, e->err2, bytes);
	}
	if (rc < 0) {
		zinf_comm_qerr_destroy(e);
		return rc;
	}
	*out = e;
	return 0;
}

/* err1 and err2 never reach a collective (only the codec reads and writes them, on the calling
 * thread or, nccl, on the stream, which qfree waits for): freed even after a failure. */
void
zinf_comm_qerr_destroy(struct zinf_comm_qerr *e)
{
	if (!e) {
		return;
	}
	q_free(e->c, e->err1);
	q_free(e->c, e->err2);
	zc_free(e);
}

/* Ranks per group: q->group, or 0: c->node_group (the node's ranks when every node holds as
 * many, consecutive, and they divide the world; else the world), the same on every rank. */
static int
q_group(struct zinf_comm *c, const struct zinf_comm_quant_opts *q, int *k)
{
	int g = q->group ? (int)q->group : c->node_group;
	if (g < 1 || c->world % g != 0) {
		return ZINF_FAIL(-EINVAL,
				 "qreduce_scatter: group of %d ranks does not divide the world of "
				 "%d ranks",
				 g, c->world);
	}
	if (g > 0x7fff || c->world / g > 0x7fff) {
		return ZINF_FAIL(-EINVAL,
				 "qreduce_scatter: group of %d ranks in a world of %d: %d groups; "
				 "at most 32767 ranks per group and 32767 groups",
				 g, c->world, c->world / g);
	}
	*k = g;
	return 0;
}

int
zinf_comm_qreduce_scatter(struct zinf_comm *c, const struct zinf_comm_quant_opts *opts,
			  const void *send, void *recv, size_t count, enum zinf_dtype dtype,
			  enum zinf_comm_red red, struct zinf_comm_qerr *e)
{
	struct zinf_comm_quant_opts q;
	int k = 1, rc = q_args(c, "qreduce_scatter", opts, &q, send, recv, count, dtype);
	if (rc < 0 || (rc = q_group(c, &q, &k)) < 0) {
		return rc;
	}
	if (red != ZINF_COMM_SUM && red != ZINF_COMM_AVG) {
		return ZINF_FAIL(-EINVAL, "qreduce_scatter: reduction %d: SUM or AVG", (int)red);
	}
	if (e && (e->c != c || e->count != count)) {
		return ZINF_FAIL(
			-EINVAL,
			"qreduce_scatter: error feedback made for %zu elements per rank on "
			"another call (%zu here, or another communicator)",
			e->count, count);
	}
	const char *sp = send, *rp = recv;
	size_t es = zinf_dtype_size(dtype), w = (size_t)c->world, s = q_chunk(&q, count);
	if (count && sp < rp + count * es && rp < sp + w * count * es) {
		return ZINF_FAIL(-EINVAL, "qreduce_scatter: send and recv overlap");
	}
	if ((rc = q_limit(c, "qreduce_scatter", count, (uint64_t)w * s,
			  "the first all_to_all's span (world x one segment's codes)")) < 0) {
		return rc;
	}
	int groups = c->world / k;
	bool intra = k > 1 || groups == 1, inter = groups > 1;
	float beta = e ? e->beta : 0.0f;
	/* scratch: codes out, codes in (w chunks each), partial sums (groups x count floats);
	   taken before anything is numbered, and any failure of this rank's alone from here on is
	   told to the others (q_local_fail) */
	unsigned abandoned0 = c->abandoned;
	char *buf = NULL;
	if ((rc = q_scratch(c, 2 * w * s + (size_t)groups * count * 4, (void **)&buf)) < 0) {
		return q_local_fail(c, rc, "qreduce_scatter");
	}
	if (e && e->reset && e->calls % e->reset == 0 && e->calls) {
		size_t bytes = w * count * sizeof(float);
		if ((rc = q_zero(c, e->err1, bytes)) == 0) {
			rc = q_zero(c, e->err2, bytes);
		}
	}
	char *out = buf, *in = buf + w * s;
	float *part = (float *)(buf + 2 * w * s);
	if (rc == 0 && intra) {
		/* chunk (l, g) for peer l of the group: the segment of rank g x k + l */
		for (int l = 0; rc == 0 && l < k; l++) {
			for (int g = 0; rc == 0 && g < groups; g++) {
				size_t j = (size_t)g * k + l;
				rc = q_quantize(c, &q, out + ((size_t)l * groups + g) * s,
						sp + j * count * es, dtype, count,
						e ? e->err1 + j * count : NULL, beta);
			}
		}
		if (rc == 0) {
			rc = comm_all_to_all_u8(c, out, in, (size_t)groups * s, k, 1);
		}
		if (rc == 0) {
			rc = q_zero(c, part, (size_t)groups * count * 4);
		}
		for (int l = 0; rc == 0 && l < k; l++) { /* peers in rank order */
			for (int g = 0; rc == 0 && g < groups; g++) {
				rc = q_dequantize(c, &q, part + (size_t)g * count, ZINF_F32,
						  in + ((size_t)l * groups + g) * s, count, 1);
			}
		}
	}
	float *sum = part;
	if (rc == 0 && inter) {
		/* chunk g for the rank of this place in group g: the partial sums, or (groups of
		   one rank) the segments of send themselves */
		for (int g = 0; rc == 0 && g < groups; g++) {
			const void *x = intra ? (const void *)(part + (size_t)g * count)
					      : (const void *)(sp + (size_t)g * count * es);
			rc = q_quantize(c, &q, out + (size_t)g * s, x, intra ? ZINF_F32 : dtype,
					count, e ? e->err2 + (size_t)g * count : NULL, beta);
		}
		if (rc == 0) {
			rc = comm_all_to_all_u8(c, out, in, s, groups, k);
		}
		if (rc == 0) {
			rc = q_zero(c, part, count * 4);
		}
		for (int g = 0; rc == 0 && g < groups; g++) { /* groups in order */
			rc = q_dequantize(c, &q, sum, ZINF_F32, in + (size_t)g * s, count, 1);
		}
	}
	if (rc == 0) {
		rc = q_narrow(c, recv, dtype, sum, count,
			      red == ZINF_COMM_AVG ? 1.0f / (float)c->world : 1.0f);
	}
	if (e && rc == 0) {
		e->calls++;
	}
	q_scratch_done(c, buf, abandoned0);
	return q_local_fail(c, rc, "qreduce_scatter");
}
