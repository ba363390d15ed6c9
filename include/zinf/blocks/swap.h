/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zinf/blocks/swap.h: swap files. Named tensors (a state kind and an index) mapped to extents of
 * files under one or more directories. Several directories are striped RAID-0 style with a
 * stripe unit, so several drives add their bandwidth. File names are stable, derived from the
 * rank and the state kind (never from addresses), so a later run can find them.
 * A building block (zinf/blocks/): for tools and engines made of zinf's parts; a trainer
 * needs none of it beyond the option types zinf/engine.h takes from it.
 *
 * Tensors are declared first (zinf_swap_add); zinf_swap_reserve() then lays them out, checks
 * free space (statvfs) and preallocates (fallocate) before the first write. Every extent starts
 * aligned to the direct-I/O alignment and is padded up to it; the padding is accounted for,
 * and reading back returns exactly the bytes written.
 *
 * Optional CRC32C per extent (off by default): when on, a read whose data does not match the
 * checksum of the last write fails with -EBADMSG, never returns data.
 */
#ifndef ZINF_SWAP_H
#define ZINF_SWAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zinf/blocks/io.h"

#ifdef __cplusplus
extern "C" {
#endif

struct zinf_swap; /* opaque */

struct zinf_swap_opts {
	size_t size;		 /* sizeof(struct zinf_swap_opts); set by zinf_swap_opts_init() */
	const char *const *dirs; /* directories (copied); several are striped */
	unsigned n_dirs;
	uint64_t stripe_unit; /* bytes per stripe unit; multiple of the alignment; default 1 MiB */
	int rank;	      /* part of every file name */
	const char *prefix;   /* file name prefix; default "zinf" */
	bool crc;	      /* per-extent CRC32C; default false */
	bool buffered;	      /* allow file systems without O_DIRECT (buffered I/O) */
	bool keep_files;      /* do not unlink the files on destroy; default false (a later
			       * swap space of the same names reclaims them, with a warning) */
	uint8_t reserved[5];  /* zero: no tail padding (common/opts.h) */
};

ZINF_API void zinf_swap_opts_init(struct zinf_swap_opts *o);

/**
 * Create a swap space over `io` (which must outlive it). Checks that each directory exists and
 * is writable, and takes the names it will use: in each directory d it holds a lock on
 * `<prefix>-r<rank>.<d>.lock`, which guards its files `<prefix>-r<rank>-<kind>.<d>.swp`, until
 * zinf_swap_destroy(). Returns 0 and sets *out; -ENOENT/-EACCES/-ENOTDIR naming the directory;
 * -EBUSY when another swap space (of this or another process) holds those names, naming its
 * files and its pid; -EINVAL bad option (NULL argument, opts.size unknown, O_DIRECT refused
 * and buffered not allowed, stripe unit not a multiple of the alignment); -ENOMEM. Free with
 * zinf_swap_destroy().
 */
ZINF_API int zinf_swap_create(struct zinf_io *io, const struct zinf_swap_opts *opts,
			      struct zinf_swap **out);
/** Close (and unless keep_files, remove) the files; release the names. NULL is a no-op. */
ZINF_API void zinf_swap_destroy(struct zinf_swap *s);

/**
 * Check `dir` as zinf_swap_create() checks each of its directories, without taking its names:
 * it exists, is a directory this process may write in (a read-only mount is -EROFS), and a file
 * opens there through `io` as swap files are opened (O_DIRECT unless buffered_ok: tmpfs is
 * -EINVAL naming the directory). It creates and removes a probe file of this process's own
 * name. Returns 0; -ENOENT/-ENOTDIR/-EACCES/-EROFS/-EINVAL naming the directory; -errno of the
 * probe's open.
 */
ZINF_API int zinf_swap_check_dir(struct zinf_io *io, const char *dir, bool buffered_ok);

/**
 * Declare a tensor of `bytes` bytes, named by a state kind ("fp32", "exp_avg", "exp_avg_sq",
 * "param16"...; letters, digits and '_') and an index. Returns its id (>= 0), or -EEXIST for a
 * name already declared, -EINVAL for a bad name or NULL argument, -EBUSY after
 * zinf_swap_reserve(), -EOVERFLOW for a size past the largest file offset once padded (a
 * caller's elements x element size that wrapped, typically), -ENOSPC past 2^28 tensors.
 */
ZINF_API int zinf_swap_add(struct zinf_swap *s, const char *kind, uint32_t index, uint64_t bytes);
/** Id of a declared tensor, or -ENOENT. */
ZINF_API int zinf_swap_find(const struct zinf_swap *s, const char *kind, uint32_t index);

/**
 * Lay out every declared tensor, create the files, check free space and preallocate. Files of
 * this swap space's names left by a process that is gone (or by keep_files) are reclaimed: the
 * space they give back counts as free, and they are removed with one warning naming each and
 * its size. Fails at once with -ENOSPC naming the directory, the bytes needed and the bytes
 * free; -EOVERFLOW when a file would pass the largest file offset; -errno naming the file on
 * any other failure. Nothing has been written when it fails.
 */
ZINF_API int zinf_swap_reserve(struct zinf_swap *s);

/* Getters answer 0 for a NULL swap space or an unknown id. */
/** Direct-I/O alignment of the swap space (the largest of its files', at least 4096), bytes. */
ZINF_API uint32_t zinf_swap_align(const struct zinf_swap *s);
/** Whether directory d's files are opened with O_DIRECT (false: buffered, which opts.buffered
 * allowed there; or a NULL swap space, or d out of range). */
ZINF_API bool zinf_swap_dir_direct(const struct zinf_swap *s, unsigned d);
/** Bytes of the tensor as declared. */
ZINF_API uint64_t zinf_swap_bytes(const struct zinf_swap *s, int id);
/**
 * Capacity a caller's buffer for this tensor must have: bytes rounded up to the alignment.
 * Buffers must also start at a multiple of zinf_swap_align().
 */
ZINF_API uint64_t zinf_swap_buf_bytes(const struct zinf_swap *s, int id);
/** Bytes on disk in all files, padding included (what zinf_swap_reserve() needs free). */
ZINF_API uint64_t zinf_swap_total_bytes(const struct zinf_swap *s);

/*
 * An asynchronous swap operation, owned by the caller. A tensor may span several stripes and
 * files, so one operation holds several I/O requests; the array is allocated when the
 * operation starts and freed when zinf_swap_wait()/zinf_swap_poll() reports it complete.
 */
struct zinf_swap_op {
	int id;
	int nreq;
	int64_t result;		  /* once complete: 0 or a negative errno */
	struct zinf_io_req *reqs; /* the engine's; do not touch */
	void *buf;
	bool write;
	int ndone; /* requests completed and checked so far; do not touch */
};

/**
 * Start writing tensor `id` from buf (aligned, zinf_swap_buf_bytes() capacity; the pad bytes
 * past zinf_swap_bytes() are zeroed by this call). With CRC on, the checksum is computed here,
 * before submission. Returns 0 when started; -EINVAL misaligned buffer; -EBUSY before reserve,
 * or while another operation on the same tensor is in flight (operations on different tensors
 * may be started and waited on from different threads).
 */
ZINF_API int zinf_swap_write_async(struct zinf_swap *s, int id, void *buf, struct zinf_swap_op *op);
/**
 * Start reading tensor `id` into buf (aligned, zinf_swap_buf_bytes() capacity). Errors as for
 * writing, and -ENODATA for a tensor never written or whose last write failed.
 */
ZINF_API int zinf_swap_read_async(struct zinf_swap *s, int id, void *buf, struct zinf_swap_op *op);
/**
 * Wait for an operation. Returns 0, or a negative errno whose message names the file, offset
 * and length; -EBADMSG on a CRC mismatch (naming tensor and file). A failed write leaves the
 * tensor marked unwritten: a later read of it fails with -ENODATA rather than return stale data.
 */
ZINF_API int zinf_swap_wait(struct zinf_swap *s, struct zinf_swap_op *op);
/** 1 if complete (result set, CRC checked), 0 if still in flight. */
ZINF_API int zinf_swap_poll(struct zinf_swap *s, struct zinf_swap_op *op);
/** Synchronous helpers. */
ZINF_API int zinf_swap_write(struct zinf_swap *s, int id, void *buf);
ZINF_API int zinf_swap_read(struct zinf_swap *s, int id, void *buf);

/** CRC32C (Castagnoli) of len bytes, continuing from crc (start with 0). */
ZINF_API uint32_t zinf_crc32c(uint32_t crc, const void *buf, size_t len);

/*
 * Scratch that names its owner (nvme/scratch.c). A program that puts scratch (swap files, a
 * directory of them) in a directory other programs share names each entry after its owner,
 * `<stem>-<host>-<pid>-...` (zinf_scratch_prefix), and holds an exclusive flock(2) on the entry's
 * lock file there from before the entry is made until after it is removed: a swap space whose
 * prefix starts with `<stem>-<host>-<pid>` does (its files `<prefix>-r<rank>-<kind>.<d>.swp` and
 * probe `.<prefix>-r<rank>.<d>.probe` under its lock `<prefix>-r<rank>.<d>.lock`), and so does a
 * scratch directory (zinf_scratch_dir_create). When the program dies without cleaning up (kill
 * -9, the OOM killer, an MPI abort), the next one of the same stem on the same host removes what
 * it left (zinf_scratch_reclaim).
 */
struct zinf_scratch_dir; /* opaque */

/** The longest host part of scratch names (zinf_scratch_host), bytes without the NUL. */
#define ZINF_SCRATCH_HOST_MAX 64

/**
 * This host's part of scratch names: gethostname(2) ("localhost" when it fails or is empty),
 * every byte other than a letter, a digit or '.' replaced by '_' ('-' included: it separates the
 * names' parts, so the host never holds one); a name longer than ZINF_SCRATCH_HOST_MAX: its first
 * 55 bytes, '_' and 8 hex digits of a hash of the whole. Written into buf (len bytes) with its
 * NUL. Returns its length; -EINVAL (NULL buf); -ENAMETOOLONG (len too small).
 */
ZINF_API int zinf_scratch_host(char *buf, size_t len);

/**
 * The prefix of this process's scratch names, `<stem>-<host>-<pid>` (zinf_scratch_host,
 * getpid), written into buf (len bytes; ZINF_SCRATCH_HOST_MAX + 88 always suffice) with its
 * NUL: a swap space of this prefix (or of this prefix, '-' and more) is reclaimed after this
 * process is gone. stem: 1-64 letters, digits, '-', '_' and '.'. Returns its length; -EINVAL
 * (bad stem, NULL buf); -ENAMETOOLONG (len too small; buf then holds "").
 */
ZINF_API int zinf_scratch_prefix(const char *stem, char *buf, size_t len);

/**
 * Make a scratch directory `<parent>/<stem>-<host>-<pid>-<tag>-XXXXXX` (mkdtemp, mode 0700)
 * owned by this process: first an exclusive flock on `<parent>/<stem>-<host>-<pid>-<tag>.lock`
 * (this pid written inside), held until zinf_scratch_dir_destroy(). stem and tag are 1-64
 * letters, digits, '-', '_' and '.' ("zinf-gpt", "r0"). A lock found held is tried again for
 * 200 ms (another process may hold it for a moment: zinf_scratch_reclaim looking at it). Returns
 * 0 and sets *out; -EINVAL bad argument; -EBUSY this process holds that tag's lock already, or
 * another process held it throughout (the message says which); -errno naming the path (parent
 * missing, not a directory, not writable); -ENOMEM. Free with zinf_scratch_dir_destroy().
 */
ZINF_API int zinf_scratch_dir_create(const char *parent, const char *stem, const char *tag,
				     struct zinf_scratch_dir **out);
/** The directory's path ("" for NULL). */
ZINF_API const char *zinf_scratch_dir_path(const struct zinf_scratch_dir *d);
/** Remove the directory and everything in it, then the lock file. NULL is a no-op. */
ZINF_API void zinf_scratch_dir_destroy(struct zinf_scratch_dir *d);

/** What zinf_scratch_reclaim did with an entry (zinf_scratch_cb's status, or a negative errno:
 * its owner is gone but it could not be removed). */
enum zinf_scratch_fate {
	ZINF_SCRATCH_REMOVED = 0,	  /* a directory with everything it held */
	ZINF_SCRATCH_KEPT_LIVE = 1,	  /* its owner runs, or its lock is held (or in doubt) */
	ZINF_SCRATCH_KEPT_NO_LOCK = 2,	  /* its owner is gone but its lock file is missing: not
					     known to be the library's, so left alone */
	ZINF_SCRATCH_KEPT_OTHER_HOST = 3, /* made on another host: not looked at further */
};

/* What zinf_scratch_reclaim did with one entry of another owner: `path`, its owner's `pid`, and
 * its fate (enum zinf_scratch_fate, or a negative errno). */
typedef void (*zinf_scratch_cb)(void *ctx, const char *path, int64_t pid, int status);

/**
 * Remove what owners on this host that are gone left in `dir`. Only the shapes the library
 * makes are looked at, `<stem>-<host>-<pid>-` followed by:
 *   a directory `<tag>-XXXXXX` (XXXXXX: 6 letters and digits), guarded by `...-<tag>.lock`;
 *   a file `[<sub>-]r<rank>-<kind>.<d>.swp`, guarded by `...-[<sub>-]r<rank>.<d>.lock`;
 *   a file `.<stem>-<host>-<pid>-[<sub>-]r<rank>.<d>.probe` (hidden), guarded by the same;
 *   a lock file `....lock` itself.
 * Other names, symbolic links and other kinds of file are not touched. An entry of another host
 * (its host part is not zinf_scratch_host's) is left alone: flock is local to a node on many
 * shared file systems (NFS with nolock or local_lock=flock, Lustre's localflock, BeeGFS), so a
 * lock there says nothing of another node's owner, and its pid nothing either. An entry of this
 * host is removed when its pid is not this process's, does not run (kill(pid, 0) says ESRCH), and
 * its own lock file exists and is taken (flock) by this call, which holds it while the entry
 * goes (so that an owner in another pid namespace, a container sharing the directory, keeps its
 * entries) and then removes it too, still held, once nothing it guards is left. An entry whose
 * lock file is missing is not known to be the library's (a user's directory of a look-alike
 * name) and is left alone. The locks are looked at after every entry was seen: an owner that
 * locks before making entries never loses one, whatever the timing. A lock that cannot be opened
 * or locked for another reason than being held (permissions) counts as held. Directories go with
 * everything in them, symbolic links in them removed, never followed. cb (may be NULL) hears of
 * every entry of another owner found, with its fate. Returns the number of entries removed;
 * -EINVAL (NULL dir, bad stem); -ENOMEM; -errno naming dir when it cannot be listed (-ENOENT:
 * missing).
 */
ZINF_API int zinf_scratch_reclaim(const char *dir, const char *stem, zinf_scratch_cb cb, void *ctx);

#ifdef __cplusplus
}
#endif
#endif
