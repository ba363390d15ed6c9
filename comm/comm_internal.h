/* SPDX-License-Identifier: Apache-2.0 */
/*
 * comm/comm_internal.h: the collective backends' ops table, the generic communicator and
 * request they share, and the registry. Not installed. A backend embeds nothing: it keeps its
 * state behind c->be and its per-request state in the request's tail (ops->req_size bytes).
 */
#ifndef ZINF_COMM_INTERNAL_H
#define ZINF_COMM_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/util.h"
#include "zinf/blocks/comm.h"

enum zinf_comm_kind {
	ZINF_COMM_ALL_GATHER = 0,
	ZINF_COMM_REDUCE_SCATTER = 1,
	ZINF_COMM_ALL_REDUCE = 2,
	ZINF_COMM_BROADCAST = 3,
	ZINF_COMM_BARRIER = 4,
	ZINF_COMM_ALL_TO_ALL = 5, /* internal (comm_quant.c): within a group of ranks, bytes */
};

/* The internal dtype of bytes moved, never reduced (all_gather, all_to_all): MPI_BYTE,
 * ncclUint8. Only comm_quant.c posts it. */
#define COMM_U8 16

/* Bytes per element of a descriptor's dtype: zinf_dtype_size, or 1 for COMM_U8. */
size_t comm_elem_size(int dtype);

/*
 * The group of an all_to_all (desc.a2a_n, desc.a2a_stride): rank r exchanges with the n ranks
 * base + i x stride, base = r - r mod n for stride 1 (n consecutive ranks), else r mod stride
 * (the ranks of r's place in each group of `stride`). Chunk i of send goes to peer i, chunk i of
 * recv comes from it; each chunk is desc.count bytes.
 */
static inline int
comm_a2a_peer(int rank, int n, int stride, int i)
{
	int base = stride == 1 ? rank - rank % n : rank % stride;
	return base + i * stride;
}

/* What a call is; compared across ranks when opts.check is on (fixed size, 32 bytes). */
struct zinf_comm_desc {
	uint64_t seq;	/* this rank's collective number, from 1 */
	uint64_t count; /* elements (per rank for all-gather and reduce-scatter) */
	int32_t kind;	/* enum zinf_comm_kind */
	int32_t dtype;	/* enum zinf_dtype */
	int32_t red;	/* enum zinf_comm_red, or -1 */
	union {
		int32_t root; /* broadcast root, or -1 */
		struct {      /* all_to_all: its group (comm_a2a_peer) */
			int16_t a2a_n;
			uint16_t a2a_stride;
		};
	};
};
_Static_assert(sizeof(struct zinf_comm_desc) == 32, "the call check sends 32 bytes");

/*
 * A failure notice (zinf_comm_notify_failure): the failing rank, its error and why, sent as
 * 512 bytes on a channel of its own (mpi and nccl: a duplicate of MPI_COMM_WORLD).
 */
struct zinf_comm_notice {
	int32_t rank;
	int32_t err;   /* negative errno */
	uint64_t upto; /* the sender completed every collective numbered 1..upto, and none after */
	uint64_t comm_id; /* the backend's: which communicator (a freed one's context id is reused)
			   */
	char why[488];
};

struct zinf_comm_req {
	struct zinf_comm_desc d;
	const void *send;
	void *recv;
	uint64_t bytes;			   /* the full tensor, as the message and stats count it */
	uint64_t deadline_ns;		   /* zinf_now_ns() at the call + timeout */
	struct zinf_comm_req *next, *prev; /* c->inflight list */
	_Alignas(16) unsigned char priv[]; /* ops->req_size bytes for the backend */
};

struct zinf_comm;

struct zinf_comm_ops {
	const char *name;
	size_t req_size; /* bytes of backend state per request */
	/* Set c->rank, world, local_rank and c->be. -ENODEV when not built. */
	int (*open)(struct zinf_comm *c);
	/* Free c->be. c->failed set: call nothing that can wait on another rank (destroy clears
	 * it when c failed by a notice or a mismatch with nothing of its left posted). */
	void (*close)(struct zinf_comm *c);
	/* Post the collective r->d (buffers r->send, r->recv); 0 or -errno (nothing posted). */
	int (*start)(struct zinf_comm *c, struct zinf_comm_req *r);
	/* Without blocking: 1 complete (backend state of r released), 0 in flight, -errno. */
	int (*poll)(struct zinf_comm *c, struct zinf_comm_req *r);
	/*
	 * Optional: wait between two polls of r in zinf_comm_wait, at most until deadline_ns
	 * (returns early when r may have completed). NULL: comm_backoff(spins).
	 */
	void (*block)(struct zinf_comm *c, struct zinf_comm_req *r, uint64_t deadline_ns,
		      unsigned *spins);
	/* r is abandoned (deadline passed, c failed): keep whatever the backend still uses. */
	void (*abandon)(struct zinf_comm *c, struct zinf_comm_req *r);
	/* Gather every rank's descriptor into all[world] by deadline_ns; 0, -ETIMEDOUT, -EIO. */
	int (*exchange)(struct zinf_comm *c, const struct zinf_comm_desc *mine,
			struct zinf_comm_desc *all, uint64_t deadline_ns);
	/* The native communicator: MPI_Comm * or ncclComm_t; NULL for single. */
	void *(*native)(struct zinf_comm *c);
	/* nccl: the cudaStream_t its collectives are ordered on (given or created); NULL: none */
	void *(*stream)(struct zinf_comm *c);
	/*
	 * Optional (NULL: no other rank to tell): post the failure notice n to every other rank
	 * without waiting for it to be received; 0 or -errno.
	 */
	int (*notify)(struct zinf_comm *c, const struct zinf_comm_notice *n);
	/* Optional: take one notice another rank posted: 1 (*n filled), 0 none, -errno. */
	int (*notice)(struct zinf_comm *c, struct zinf_comm_notice *n);
	/*
	 * Optional: c has just failed (any cause: a deadline, an error, a notice sent or heeded,
	 * a mismatch); no later call of c's will be posted or trusted. nccl aborts here, so that
	 * the kernels of collectives a failed rank never joins end (a notice taken is not yet a
	 * failure: collectives up to its `upto` run on).
	 */
	void (*failed)(struct zinf_comm *c);
	/*
	 * The most bytes one all_gather (per rank) or all_to_all (per peer x peers) of COMM_U8 may
	 * move (mpi: INT_MAX, counts and displacements are int); 0: no limit. comm_quant.c refuses
	 * a larger call before it numbers or posts anything.
	 */
	uint64_t max_u8;
	/*
	 * Optional: the quantized collectives' memory and codec where this backend's buffers live
	 * (nccl: device memory, kernels/quant.cu on its stream, ordered before its next
	 * collective); NULL: host memory and common/quant.c on the calling thread.
	 */
	int (*qalloc)(struct zinf_comm *c, size_t bytes, void **out);
	void (*qfree)(struct zinf_comm *c, void *p);
	/* Optional: one call's scratch of `bytes`, the backend's to keep (cached, grown when too
	 * small, freed at close); NULL: qalloc or host memory per call, freed after it */
	int (*qscratch)(struct zinf_comm *c, size_t bytes, void **out);
	int (*qzero)(struct zinf_comm *c, void *p, size_t bytes);
	int (*quantize)(struct zinf_comm *c, void *codes, float *scales, const void *x,
			enum zinf_dtype t, size_t n, size_t block, unsigned bits, float *err,
			float beta);
	/* y = deq (acc 0, y of dtype t) or y (f32) += deq (acc 1) */
	int (*dequantize)(struct zinf_comm *c, void *y, enum zinf_dtype t, const void *codes,
			  const float *scales, size_t n, size_t block, unsigned bits, int acc);
	/* out (dtype t, n) = y (f32) x mul (one fp32 product when mul != 1; y may be scaled in
	 * place), 16-bit rounded to nearest even */
	int (*narrow)(struct zinf_comm *c, void *out, enum zinf_dtype t, const float *y, size_t n,
		      float mul);
};

struct zinf_comm {
	const struct zinf_comm_ops *ops;
	struct zinf_comm_opts opts; /* backend copied (c->backend_name) */
	char backend_name[16];
	int rank, world, local_rank;
	int local_world; /* ranks on this node (MPI_COMM_TYPE_SHARED) */
	int node_group;	 /* the quantized calls' default group, the same on every rank: local_world
			    when every node holds that many consecutive ranks, else world
			    (comm_node_group) */
	void *be;	 /* backend state */
	uint64_t seq;	 /* collectives called so far */
	int failed;	 /* 0, or the error every later call returns */
	char fail_msg[640];
	bool known;	    /* every rank knows why c failed: another rank's notice (its sender told
			       every rank) or a mismatch (every rank compared the same calls) */
	unsigned abandoned; /* requests given up that the backend may still use */
	uint64_t lost;	    /* the first collective that did not complete here (UINT64_MAX: none) */
	bool heard;	    /* a notice came: collectives after heard_upto fail */
	uint64_t heard_upto;	 /* the lowest upto of the notices that came */
	char heard_msg[640];	 /* "rank N failed (...): why" of that notice */
	bool told;		 /* this rank's notice was posted */
	uint64_t notice_next_ns; /* zinf_now_ns() from which the next look for a notice is due */
	struct zinf_comm_desc *descs; /* world descriptors, as the check receives them, then
					 this rank's, as it sends it (descs[world]) */
	bool descs_abandoned;	      /* a timed-out check may still use descs: leak them */
	struct zinf_comm_req *inflight;
	struct zinf_comm_stats stats;
};

/*
 * The default group of the quantized collectives, agreed by every rank: local_world when every
 * node holds the same number of ranks (lw_min == lw_max, from an all-reduce MIN and MAX), those
 * ranks are consecutive (all_consecutive: each rank's comm_node_consecutive, all-reduced AND)
 * and it divides the world; else the world (one group: the single-stage all_to_all).
 */
int comm_node_group(int world, int lw_min, int lw_max, bool all_consecutive);
/* Whether this rank sits where consecutive nodes of local_world ranks put it: node_first (the
 * lowest world rank on its node) + local_rank, node_first a multiple of local_world. */
bool comm_node_consecutive(int rank, int node_first, int local_rank, int local_world);

/* Backoff for polling loops: spin, then yield the core, then (a long wait) sleep 100 us at a
 * time. *spins starts at 0. */
void comm_backoff(unsigned *spins);
/* "all_gather", ...; "?" for an unknown kind. */
const char *comm_kind_name(int kind);

/* The stream c's collectives are ordered on: "nccl": the cudaStream_t it was given or created;
 * NULL for the host backends or a NULL c. */
void *comm_stream(struct zinf_comm *c);
/* The default deadline: $ZINF_COMM_TIMEOUT_S when set (NaN when unreadable), else 1800 s. */
double comm_timeout_default(void);
/* 0, or -EINVAL naming the value (and $ZINF_COMM_TIMEOUT_S when it gave the NaN); who: prefix */
int comm_timeout_check(double t, const char *who);

/*
 * The movements the quantized collectives (comm_quant.c) are made of, through the same
 * numbering, call check, deadline and notices as every collective; each waits for completion.
 * all_gather of `bytes` per rank; all_to_all of `bytes` per peer of the group (n, stride)
 * (comm_a2a_peer).
 */
int comm_all_gather_u8(struct zinf_comm *c, const void *send, void *recv, size_t bytes);
int comm_all_to_all_u8(struct zinf_comm *c, const void *send, void *recv, size_t bytes, int n,
		       int stride);

extern const struct zinf_comm_ops zinf_comm_single_ops;
extern const struct zinf_comm_ops *const zinf_comm_registry[];
extern const unsigned zinf_comm_registry_len;
const struct zinf_comm_ops *comm_ops_find(const char *name);

/*
 * The MPI side other backends reuse (comm_mpi.c; -ENODEV without MPI): join MPI (initialising
 * it when needed) and set rank, world, local rank; exchange descriptors; leave.
 * An opaque state, so that comm_nccl.c needs no mpi.h of its own.
 */
struct zinf_comm_mpi;
bool comm_mpi_initialized(void); /* MPI_Init done and MPI_Finalize not */
int comm_mpi_join(struct zinf_comm *c, struct zinf_comm_mpi **out);
void comm_mpi_leave(struct zinf_comm_mpi *m, bool failed);
/* Whether c (backend "mpi") runs its collectives on a progress thread; false otherwise. */
bool comm_mpi_progress(const struct zinf_comm *c);
int comm_mpi_exchange(struct zinf_comm_mpi *m, const void *mine, void *all, size_t bytes,
		      const char *what, uint64_t deadline_ns);
int comm_mpi_bcast_bytes(struct zinf_comm_mpi *m, void *buf, size_t bytes, const char *what,
			 uint64_t deadline_ns);
/* The failure notices on m's channel of their own: post n to every rank but `rank` (once per m;
 * 0 or -errno); take one (1, 0 none, -errno). Waits above (exchange, bcast) return
 * -ECONNABORTED when a notice is waiting, left for comm_mpi_notice to take. */
int comm_mpi_notify(struct zinf_comm_mpi *m, int rank, int world, const struct zinf_comm_notice *n);
int comm_mpi_notice(struct zinf_comm_mpi *m, struct zinf_comm_notice *n);

/* 0 when NCCL library version lib_code may run code compiled against headers hdr_code (codes as
 * NCCL_VERSION_CODE and ncclGetVersion give them): same major release, minor at least the
 * headers'; else -ENOTSUP with the reason, both versions named, in why. */
int comm_nccl_version_ok(int lib_code, int hdr_code, char *why, size_t len);

#endif
