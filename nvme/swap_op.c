/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvme/swap_op.c: reads and writes of swap tensors. An operation is one zinf_io request per
 * contiguous piece (the whole tensor with one directory, else one per stripe unit), finished in
 * order by wait/poll. A write marks the tensor unwritten until it completes, so a failed or
 * torn write is never read back as data (-ENODATA). With CRC on, a write checksums each unit
 * just before submitting it and a read checks each unit as it completes (-EBADMSG).
 *
 * Not here: the layout (swap_reserve.c), the engine (io*.c).
 */
#include <string.h>

#include "nvme/swap_internal.h"

/* Piece p of tensor id (see struct swap_piece). */
static void
piece_of(const struct zinf_swap *s, int id, uint32_t p, struct swap_piece *out)
{
	const struct swap_tensor *t = &s->t[id];
	const uint64_t *ext = &s->ext_off[(size_t)id * s->n_dirs];
	uint64_t su = s->stripe_unit;
	if (s->n_dirs == 1) {
		/* One extent: one request, or (CRC on) one per stripe unit, checked one by one. */
		out->dir = 0;
		out->buf_off = s->crc ? (uint64_t)p * su : 0;
		out->file_off = ext[0] + out->buf_off;
		out->len = s->crc ? ZINF_MIN(su, t->buf_bytes - out->buf_off) : t->buf_bytes;
		return;
	}
	out->dir = (t->dir0 + p) % s->n_dirs;
	out->buf_off = (uint64_t)p * su;
	out->file_off = ext[out->dir] + (uint64_t)(p / s->n_dirs) * su;
	out->len = ZINF_MIN(su, t->buf_bytes - out->buf_off);
}

static const char *
tensor_kind(const struct zinf_swap *s, int id)
{
	return s->kinds[s->t[id].kind].name;
}

static int
op_check(struct zinf_swap *s, int id, void *buf, struct zinf_swap_op *op, const char *what)
{
	if (!s || !op) {
		return SWAP_FAIL(s, -EINVAL, "%s: NULL %s", what, s ? "operation" : "swap space");
	}
	memset(op, 0, sizeof(*op));
	op->id = id;
	op->buf = buf;
	if (!s->reserved) {
		return op->result = SWAP_FAIL(s, -EBUSY, "%s before zinf_swap_reserve()", what);
	}
	if (id < 0 || id >= s->nt) {
		return op->result = SWAP_FAIL(s, -EINVAL, "%s of unknown tensor id %d", what, id);
	}
	if (!buf && s->t[id].buf_bytes) {
		return op->result = SWAP_FAIL(s, -EINVAL, "%s of %s[%u]: NULL buffer", what,
					      tensor_kind(s, id), s->t[id].index);
	}
	if ((uintptr_t)buf % s->align) {
		return op->result =
			       SWAP_FAIL(s, -EINVAL,
					 "%s of %s[%u]: buffer %p is not aligned to %u "
					 "bytes",
					 what, tensor_kind(s, id), s->t[id].index, buf, s->align);
	}
	enum swap_state st = s->t[id].state;
	if (st == SWAP_WRITING || st == SWAP_READING) {
		return op->result = SWAP_FAIL(s, -EBUSY, "%s of %s[%u] while a %s is in flight",
					      what, tensor_kind(s, id), s->t[id].index,
					      st == SWAP_WRITING ? "write" : "read");
	}
	return 0;
}

/* Submit piece p of op (its CRC first, for a write with CRC on). */
static int
piece_submit(struct zinf_swap *s, struct zinf_swap_op *op, uint32_t p)
{
	struct swap_tensor *t = &s->t[op->id];
	const struct swap_kind *kd = &s->kinds[t->kind];
	struct swap_piece pc;
	piece_of(s, op->id, p, &pc);
	char *b = (char *)op->buf + pc.buf_off;
	int ret;
	if (op->write) {
		if (s->crc) {
			t->crc_new[p] = zinf_crc32c(0, b, pc.len);
		}
		ret = zinf_io_write_async(s->io, &op->reqs[p], kd->files[pc.dir], b, pc.len,
					  pc.file_off);
	} else {
		ret = zinf_io_read_async(s->io, &op->reqs[p], kd->files[pc.dir], b, pc.len,
					 pc.file_off);
	}
	if (ret < 0) {
		return SWAP_FAIL(s, ret, "submitting %s of %s[%u] to %s: %s",
				 op->write ? "write" : "read", kd->name, t->index,
				 kd->paths[pc.dir], strerror(-ret));
	}
	return 0;
}

/*
 * Submit every piece of op. With CRC on, each piece's checksum is computed just before it is
 * submitted, so that checksumming overlaps the transfer of the pieces before it. On a failed
 * submit, wait for those already queued.
 */
static int
op_start(struct zinf_swap *s, struct zinf_swap_op *op)
{
	struct swap_tensor *t = &s->t[op->id];
	if (t->npieces == 0) {
		return 0;
	}
	op->reqs = zc_calloc(t->npieces, sizeof(*op->reqs));
	if (!op->reqs) {
		return SWAP_FAIL(s, -ENOMEM, "%s of %s[%u]: out of memory for %u requests",
				 op->write ? "write" : "read", tensor_kind(s, op->id), t->index,
				 t->npieces);
	}
	for (uint32_t p = 0; p < t->npieces; p++) {
		int ret = piece_submit(s, op, p);
		if (ret < 0) {
			for (uint32_t q = 0; q < p; q++) {
				zinf_io_wait(s->io, &op->reqs[q]);
			}
			zc_free(op->reqs);
			op->reqs = NULL;
			op->nreq = 0;
			return ret;
		}
		op->nreq = (int)p + 1;
	}
	return 0;
}

/*
 * Start op's pieces for tensor t; a refused start puts t back in `refused` (a write: UNWRITTEN,
 * a read: VALID), an op with no piece (a zero-byte tensor) completes at once.
 */
static int
op_run(struct zinf_swap *s, struct zinf_swap_op *op, struct swap_tensor *t, enum swap_state refused)
{
	int ret = op_start(s, op);
	if (ret < 0) {
		t->state = refused;
		op->result = ret;
		return ret;
	}
	if (op->nreq == 0) {
		t->state = SWAP_VALID;
		op->result = 0;
	}
	return 0;
}

int
zinf_swap_write_async(struct zinf_swap *s, int id, void *buf, struct zinf_swap_op *op)
{
	int ret = op_check(s, id, buf, op, "write");
	if (ret < 0) {
		return ret;
	}
	op->write = true;
	struct swap_tensor *t = &s->t[id];
	/* Unwritten until the write completes: a failed or torn write is never read as data. */
	t->state = SWAP_WRITING;
	if (t->buf_bytes > t->bytes) {
		memset((char *)buf + t->bytes, 0, t->buf_bytes - t->bytes);
	}
	return op_run(s, op, t, SWAP_UNWRITTEN);
}

int
zinf_swap_read_async(struct zinf_swap *s, int id, void *buf, struct zinf_swap_op *op)
{
	int ret = op_check(s, id, buf, op, "read");
	if (ret < 0) {
		return ret;
	}
	struct swap_tensor *t = &s->t[id];
	if (t->state != SWAP_VALID) {
		return op->result = SWAP_FAIL(s, -ENODATA,
					      "read of %s[%u], which holds no data (never "
					      "written, or its last write failed)",
					      tensor_kind(s, id), t->index);
	}
	t->state = SWAP_READING;
	return op_run(s, op, t, SWAP_VALID);
}

/*
 * Piece op->ndone has completed: check its result and (a read with CRC on) its checksum, so
 * that verification overlaps the pieces still in flight. The first error is kept in
 * op->result, which holds 0 until then.
 */
static void
piece_done(struct zinf_swap *s, struct zinf_swap_op *op)
{
	struct swap_tensor *t = &s->t[op->id];
	const struct swap_kind *kd = &s->kinds[t->kind];
	const struct zinf_io_req *r = &op->reqs[op->ndone];
	uint32_t p = (uint32_t)op->ndone++;
	if (op->result) {
		return;
	}
	if (r->result != (int64_t)r->len) {
		int ret = r->result < 0 ? (int)r->result : -EIO;
		op->result =
			SWAP_FAIL(s, ret, "%s of %s[%u] failed: %s at offset %llu, %zu bytes: %s",
				  op->write ? "write" : "read", kd->name, t->index,
				  zinf_io_file_path(r->file), (unsigned long long)r->offset, r->len,
				  strerror(-ret));
		return;
	}
	if (!op->write && s->crc) {
		uint32_t c = zinf_crc32c(0, r->buf, r->len);
		if (c != t->crc[p]) {
			op->result = SWAP_FAIL(s, -EBADMSG,
					       "CRC mismatch reading %s[%u] from %s at offset "
					       "%llu, %zu bytes: 0x%08x, written 0x%08x",
					       kd->name, t->index, zinf_io_file_path(r->file),
					       (unsigned long long)r->offset, r->len, c, t->crc[p]);
		}
	}
}

/* Every piece is complete and checked: settle the tensor's state, free the requests. */
static int
op_finish(struct zinf_swap *s, struct zinf_swap_op *op)
{
	struct swap_tensor *t = &s->t[op->id];
	int ret = (int)op->result;
	if (op->write) {
		if (ret == 0) {
			if (s->crc) {
				memcpy(t->crc, t->crc_new, t->npieces * sizeof(*t->crc));
			}
			t->state = SWAP_VALID;
		} else {
			t->state = SWAP_UNWRITTEN;
		}
	} else {
		t->state = SWAP_VALID;
	}
	zc_free(op->reqs);
	op->reqs = NULL;
	return ret;
}

int
zinf_swap_wait(struct zinf_swap *s, struct zinf_swap_op *op)
{
	if (!s || !op) {
		return SWAP_FAIL(s, -EINVAL, "zinf_swap_wait: NULL %s",
				 s ? "operation" : "swap space");
	}
	if (!op->reqs) {
		return (int)op->result;
	}
	while (op->ndone < op->nreq) {
		zinf_io_wait(s->io, &op->reqs[op->ndone]);
		piece_done(s, op);
	}
	return op_finish(s, op);
}

int
zinf_swap_poll(struct zinf_swap *s, struct zinf_swap_op *op)
{
	if (!s || !op) {
		return SWAP_FAIL(s, -EINVAL, "zinf_swap_poll: NULL %s",
				 s ? "operation" : "swap space");
	}
	if (!op->reqs) {
		return 1;
	}
	while (op->ndone < op->nreq) {
		if (!zinf_io_poll(s->io, &op->reqs[op->ndone])) {
			return 0;
		}
		piece_done(s, op);
	}
	op_finish(s, op);
	return 1;
}

int
zinf_swap_write(struct zinf_swap *s, int id, void *buf)
{
	struct zinf_swap_op op;
	int ret = zinf_swap_write_async(s, id, buf, &op);
	return ret < 0 ? ret : zinf_swap_wait(s, &op);
}

int
zinf_swap_read(struct zinf_swap *s, int id, void *buf)
{
	struct zinf_swap_op op;
	int ret = zinf_swap_read_async(s, id, buf, &op);
	return ret < 0 ? ret : zinf_swap_wait(s, &op);
}
