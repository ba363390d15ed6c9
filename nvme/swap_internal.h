/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvme/swap_internal.h: what the swap files share privately with crc32c.c, the tests and the
 * benchmarks: the two CRC32C implementations (so that a test can compare them, and a bench can
 * time each) and the test hook that fakes the free space a directory reports; then what the
 * swap space's own files share: its structs, its logging macros and their helpers.
 */
#ifndef ZINF_SWAP_INTERNAL_H
#define ZINF_SWAP_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/util.h"
#include "nvme/crc32c.h"
#include "zinf/blocks/swap.h"

/*
 * Test hook: make zinf_swap_reserve() believe every directory has `bytes` bytes free (as
 * statvfs f_bavail * f_frsize would say); UINT64_MAX restores the real figure. Process-wide;
 * only tests call it.
 */
void swap_test_set_free_bytes(uint64_t bytes);

/* ---- shared by the swap space's files (swap.c, swap_owner.c, swap_reserve.c, swap_op.c) ---- */

#define SWAP_KIND_MAX	 48
#define SWAP_DEFAULT_SU	 (1u << 20)
#define SWAP_MIN_ALIGN	 4096u	   /* layout unit when a file reports less (buffered I/O) */
#define SWAP_MAX_TENSORS (1 << 28) /* keeps the hash table's capacity within an unsigned */

/* Messages about a swap space name it: "swap <prefix>-r<rank> in <dir>[,<dir>...]". */
#define SWAP_FAIL(s, err, ...)	ZINF_OBJ_FAIL(swap_name(s), err, __VA_ARGS__)
#define SWAP_LOG(s, level, ...) ZINF_OBJ_LOG(level, swap_name(s), __VA_ARGS__)

enum swap_state { SWAP_UNWRITTEN = 0, SWAP_WRITING, SWAP_VALID, SWAP_READING };

struct swap_kind {
	char name[SWAP_KIND_MAX + 1];
	uint64_t *file_bytes;	     /* [n_dirs]: size of the kind's file in each directory */
	struct zinf_io_file **files; /* [n_dirs]; NULL where the kind has no bytes */
	char **paths;		     /* [n_dirs] */
};

struct swap_tensor {
	int kind; /* index into kinds */
	uint32_t index;
	uint64_t bytes;	    /* as declared */
	uint64_t buf_bytes; /* bytes rounded up to the alignment */
	uint32_t npieces;   /* requests per operation */
	unsigned dir0;	    /* directory of stripe unit 0 (striped) */
	enum swap_state state;
	uint32_t *crc;	   /* [npieces] of the last completed write (opts.crc) */
	uint32_t *crc_new; /* [npieces] of the write in flight */
};

struct zinf_swap {
	struct zinf_io *io;
	char *name;	    /* swap_name() */
	char **dirs;	    /* [n_dirs], copied */
	int *lock_fd;	    /* [n_dirs]: flock held on lock_path[d], -1: none */
	char **lock_path;   /* [n_dirs] */
	bool *dir_buffered; /* [n_dirs]: O_DIRECT refused there, opts.buffered allowed it */
	unsigned n_dirs;
	uint64_t stripe_unit; /* bytes */
	int rank;
	char *prefix;
	bool crc, keep_files, reserved;
	uint32_t align; /* bytes; the largest of the directories' */

	struct swap_kind *kinds;
	int nkinds, kinds_cap;
	struct swap_tensor *t;
	int nt, t_cap;
	uint64_t *ext_off; /* [nt * n_dirs]: file offset of tensor i's extent in directory d */
	int *hash;	   /* open addressing over (kind, index) -> id + 1; 0 empty */
	unsigned hash_cap; /* power of two */
	uint64_t total_bytes;
};

static inline const char *
swap_name(const struct zinf_swap *s)
{
	return s && s->name ? s->name : "swap";
}

/*
 * Piece p of tensor t: its bytes in the caller's buffer and in which file, where. With one
 * directory and CRC off the whole tensor is one piece; else piece u is stripe unit u.
 */
struct swap_piece {
	unsigned dir;
	uint64_t buf_off, file_off, len;
};

/* swap.c */
bool swap_kind_name_ok(const char *kind);
/* Close (and unless kept, remove) kind k's files. */
void swap_kind_fini(struct zinf_swap *s, struct swap_kind *k);

/* swap_owner.c: the names a swap space owns, and the leftovers of those that are gone. */
/*
 * An exclusive flock(2) on `path` (created 0600 if missing), which must still be the file at
 * that path once locked (its previous owner unlinks it before letting go), with this pid written
 * inside for the next one who tries. A lock found held is tried again SWAP_LOCK_BUSY_TRIES times,
 * SWAP_LOCK_BUSY_US apart: another process may hold it for a moment without owning it
 * (zinf_scratch_reclaim looking whether its owner is gone, or removing a dead owner's entries
 * under it). 0 and *fd; -EWOULDBLOCK when another holds it still (*holder: the pid written
 * inside, 0 if none: a reclaim writes nothing); -EAGAIN when the file keeps being replaced;
 * -errno of open or flock. No message: the caller names its object. Also nvme/scratch.c's.
 */
#define SWAP_LOCK_BUSY_TRIES 20
#define SWAP_LOCK_BUSY_US    10000
int swap_lock_file(const char *path, int *fd, long *holder);
int swap_lock_dir(struct zinf_swap *s, unsigned d);
void swap_unlock_dirs(struct zinf_swap *s);
struct swap_leftovers {
	char **paths;
	uint64_t *bytes; /* [n]: allocated on disk (st_blocks), what removing them gives back */
	unsigned n, cap;
	uint64_t *dir_bytes; /* [n_dirs] */
};
int swap_leftovers_find(struct zinf_swap *s, struct swap_leftovers *lo);
void swap_leftovers_reclaim(struct zinf_swap *s, const struct swap_leftovers *lo);
void swap_leftovers_free(struct swap_leftovers *lo);

#endif
