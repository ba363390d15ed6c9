/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpu_adam/adam_simd_body.h: the vector kernels, written once over a width-generic layer
 * (DeepSpeed's csrc/includes/simd.h does the same): Adam with f32 and with bf16 state, Adam
 * with a bf16 master (one pass per element), Adagrad, Lion, the sum of squares, the inf/NaN
 * check, the unscale and convert passes, the gradient loads and copy stores, the tails through
 * zero-padded buffers, and the path's kernel table
 * zinf_adam_<isa>_ops. Included once, last, by each ISA file (adam_avx2.c, adam_avx512.c), which
 * first defines the layer for its vector type. Not here: any intrinsic of one width, and any
 * choice that differs between paths (hardware bf16 conversion, masks): those are the layer's.
 *
 * The layer (ZINF_ALWAYS_INLINE functions, except the macros named so):
 *   ZV_ISA            macro: the path's name as a token (avx2): the table is zinf_adam_avx2_ops,
 *                     its name "avx2", its missing() the file's avx2_missing
 *   ZV_WIDTH          macro: floats per vector
 *   ZV_PS ZV_EPI32 ZV_PD ZV_HALF ZV_ANY
 *                     macros: the types of a vector of ZV_WIDTH floats, of ZV_WIDTH int32, of
 *                     ZV_WIDTH / 2 doubles, of ZV_WIDTH 16-bit values, and of the inf/NaN
 *                     check's accumulator
 *   zv_loadu zv_storeu zv_set1 zv_add zv_mul zv_div zv_sqrt
 *                     f32 vectors, unaligned, each operation rounded once
 *   zv_fmadd(a, b, c) a * b + c rounded once
 *   zv_sign(c)        Lion's sign: 1, -1, or 0 for zeros and NaN
 *   zh_loadu zh_storeu zh_stream
 *                     ZV_WIDTH 16-bit values; zh_stream: a streaming store, aligned to
 *                     sizeof(ZV_HALF)
 *   zv_from_f16 zv_from_bf16 zv_to_f16
 *                     exact widenings; f32 -> f16 by F16C, round to nearest even
 *   zv_to_bf16(x, hw) f32 -> bf16, round to nearest even, NaN quieted, subnormals kept;
 *                     hw: the CPU has AVX512-BF16 (the layer may use it or not)
 *   zv_state_round(a, m, v, mo, vo, i)
 *                     the bf16-state step's new m and v of elements i.. to bf16: RNE, or
 *                     stochastic with the body's sr_bits(a->sr_key, i) (declared ahead), its low
 *                     16 bits of each lane for m and its high 16 for v, as
 *                     adam_bf16state_elem(); NaN quieted
 *   zv_bf16_sr_sat(x, r)
 *                     f32 -> bf16 by stochastic rounding with the 16 random bits r of each
 *                     lane, saturating: adam_bf16_sr_sat() per lane (the bf16 master's rounding)
 *   zvi_set1 zvi_iota zvi_add zvi_xor zvi_and zvi_mullo zvi_loadu, macro zvi_srli(x, imm)
 *                     int32 lanes (iota: 0, 1, ..., ZV_WIDTH - 1; loadu: unaligned)
 *   zvd_zero zvd_add zvd_fmadd zvd_storeu, zvd_lo(x) zvd_hi(x), macro ZVD_HSUM(s)
 *                     doubles; lo/hi: the low and high halves of a float vector, widened;
 *                     ZVD_HSUM: the sum of the ZV_WIDTH / 2 doubles s[] in a fixed pairwise
 *                     tree, (s[0] + s[1]) + (s[2] + s[3]) ... (a macro: as an inline function
 *                     GCC swapped the operands of some additions, and a sum of NaNs of both
 *                     signs changed its sign bit)
 *   zvi_set1_16 zv_any_none zv_any_allset32 zv_any_allset16 zv_any_found
 *                     the inf/NaN check: accumulate the lanes (ZV_WIDTH of 32 bits or
 *                     2 * ZV_WIDTH of 16 bits, loaded unaligned) whose exponent bits are all set
 *
 * Adam's operation order here (grad_in, adam_math) is what the CUDA kernel (kernels/adam.cu)
 * repeats: change one and the other, or the GPU tier stops being bit-identical to the CPU tier.
 */
#ifndef ZINF_ADAM_SIMD_BODY_H
#define ZINF_ADAM_SIMD_BODY_H

#include "cpu_adam/adam_bf16m_internal.h"
#include "cpu_adam/adam_q8_internal.h"

#define ZV_CAT_(a, b) a##b
#define ZV_CAT(a, b)  ZV_CAT_(a, b)
#define ZV_STR_(a)    #a
#define ZV_STR(a)     ZV_STR_(a)
/* This path's name for a function: ZV_FN(adam) is avx2_adam in adam_avx2.c. */
#define ZV_FN(name) ZV_CAT(ZV_ISA, ZV_CAT(_, name))

/* ---- loads and stores ----------------------------------------------------------------------- */

ZINF_ALWAYS_INLINE ZV_PS
load_grad(const void *g, enum zinf_dtype dt, size_t i)
{
	switch (dt) {
	case ZINF_F16:
		return zv_from_f16(zh_loadu((const uint16_t *)g + i));
	case ZINF_BF16:
		return zv_from_bf16(zh_loadu((const uint16_t *)g + i));
	default:
		return zv_loadu((const float *)g + i);
	}
}

/* Store ZV_WIDTH copies. nt: the 16-bit copy is aligned to sizeof(ZV_HALF) and is written with
 * streaming stores: it is write-only here, so this saves the read-for-ownership of its lines. */
ZINF_ALWAYS_INLINE void
store_copy(void *c, enum zinf_copy_kind ck, size_t i, ZV_PS p, bool nt, bool hw)
{
	ZV_HALF h;
	switch (ck) {
	case ZINF_COPY_F32:
		zv_storeu((float *)c + i, p);
		return;
	case ZINF_COPY_F16:
		h = zv_to_f16(p);
		break;
	case ZINF_COPY_BF16:
		h = zv_to_bf16(p, hw);
		break;
	default:
		return;
	}
	if (nt) {
		zh_stream((uint16_t *)c + i, h);
	} else {
		zh_storeu((uint16_t *)c + i, h);
	}
}

ZINF_ALWAYS_INLINE bool
copy_nt(const struct zinf_opt_args *a, enum zinf_copy_kind ck)
{
	return (ck == ZINF_COPY_F16 || ck == ZINF_COPY_BF16) &&
	       ((uintptr_t)a->copy & (sizeof(ZV_HALF) - 1)) == 0;
}

/* ---- the optimizers' arithmetic ------------------------------------------------------------- */

/*
 * adam_sr_lane(key, e) for the elements e = i .. i + ZV_WIDTH - 1 (any i): the lanes share i's
 * high word unless they cross a multiple of 2^32 (rare: then each lane's own, from a buffer), so
 * every lane's bits are those of its own 64-bit index, as on the scalar path.
 */
ZINF_ALWAYS_INLINE ZV_EPI32
sr_lanes(uint32_t key, uint64_t i)
{
	uint32_t lo = (uint32_t)i;
	if (__builtin_expect(lo > UINT32_MAX - (ZV_WIDTH - 1), 0)) {
		_Alignas(64) uint32_t b[ZV_WIDTH];
		for (int l = 0; l < ZV_WIDTH; l++) {
			b[l] = adam_sr_lane(key, i + (uint64_t)l);
		}
		return zvi_loadu(b);
	}
	uint32_t k = key ^ (uint32_t)(i >> 32) * 0x85ebca77u;
	return zvi_xor(zvi_add(zvi_set1((int)lo), zvi_iota()), zvi_set1((int)k));
}

/* adam_sr_bits(key, e) for the elements e = i .. i + ZV_WIDTH - 1 */
ZINF_ALWAYS_INLINE ZV_EPI32
sr_bits(uint32_t key, uint64_t i)
{
	ZV_EPI32 h = sr_lanes(key, i);
	h = zvi_xor(h, zvi_srli(h, 16));
	h = zvi_mullo(h, zvi_set1((int)0x7feb352du));
	h = zvi_xor(h, zvi_srli(h, 15));
	h = zvi_mullo(h, zvi_set1((int)0x846ca68bu));
	h = zvi_xor(h, zvi_srli(h, 16));
	return h;
}

/* adam_sr_bits_master(key, e) for the elements e = i .. i + ZV_WIDTH - 1 */
ZINF_ALWAYS_INLINE ZV_EPI32
sr_bits_master(uint32_t key, uint64_t i)
{
	ZV_EPI32 h = sr_lanes(key, i);
	h = zvi_xor(h, zvi_srli(h, 16));
	h = zvi_mullo(h, zvi_set1((int)0x21f0aaadu));
	h = zvi_xor(h, zvi_srli(h, 15));
	h = zvi_mullo(h, zvi_set1((int)0xd35a2d97u));
	h = zvi_xor(h, zvi_srli(h, 15));
	return h;
}

/* g * grad_scale (+ wd * p) */
ZINF_ALWAYS_INLINE ZV_PS
grad_in(const struct zinf_opt_args *a, enum zinf_dtype gdt, size_t i, ZV_PS p)
{
	ZV_PS g = zv_mul(load_grad(a->grad, gdt, i), zv_set1(a->grad_scale));
	if (a->l2) {
		g = zv_fmadd(zv_set1(a->wd), p, g);
	}
	return g;
}

/* The Adam update of ZV_WIDTH elements given m and v as floats; returns p and the new m, v. */
ZINF_ALWAYS_INLINE ZV_PS
adam_math(const struct zinf_opt_args *a, ZV_PS p, ZV_PS g, ZV_PS *m, ZV_PS *v)
{
	p = zv_mul(p, zv_set1(a->decay));
	*m = zv_fmadd(zv_set1(a->b1), *m, zv_mul(zv_set1(a->omb1), g));
	*v = zv_fmadd(zv_set1(a->b2), *v, zv_mul(zv_set1(a->omb2), zv_mul(g, g)));
	ZV_PS denom = zv_add(zv_mul(zv_sqrt(*v), zv_set1(a->inv_bc2_sqrt)), zv_set1(a->eps));
	return zv_fmadd(zv_set1(a->nstep), zv_div(*m, denom), p);
}

/* ---- the tails ------------------------------------------------------------------------------ */

/*
 * The last k < ZV_WIDTH elements of a range do not go through scalar code (whose arithmetic
 * differs: no FMA, division by bc2_sqrt): they are copied into zero-padded buffers one vector
 * long, the vector loop runs on the buffers, and the k results are copied back. So an element's
 * result is the same function of its inputs wherever it sits (start, middle, tail of a call or
 * tile), for any alignment and any n. The padding lanes compute on zeros and are dropped.
 */
#define ZV_TAIL_MAX 16
_Static_assert(ZV_WIDTH <= ZV_TAIL_MAX, "tail buffers shorter than a vector");

struct zinf_tail_buf {
	_Alignas(64) float p[ZV_TAIL_MAX];
	_Alignas(64) uint32_t g[ZV_TAIL_MAX];
	_Alignas(64) uint32_t m[ZV_TAIL_MAX];
	_Alignas(64) uint32_t v[ZV_TAIL_MAX];
	_Alignas(64) uint32_t c[ZV_TAIL_MAX];
};

static inline size_t
copy_size(enum zinf_copy_kind ck)
{
	return ck == ZINF_COPY_F32 ? 4 : ck == ZINF_COPY_NONE ? 0 : 2;
}

/* Elements [i, i + k) of *a into b (zero-padded); *t: the argument block pointing at b.
 * ss: bytes per element of m and v (4, or 2 for bf16 state). */
static inline void
tail_in(const struct zinf_opt_args *a, size_t i, size_t k, size_t ss, struct zinf_tail_buf *b,
	struct zinf_opt_args *t)
{
	size_t gs = zinf_dtype_size(a->gdt);
	memset(b, 0, sizeof(*b));
	*t = *a;
	memcpy(b->p, a->param + i, k * 4);
	t->param = b->p;
	memcpy(b->g, (const char *)a->grad + i * gs, k * gs);
	t->grad = b->g;
	if (a->m) {
		memcpy(b->m, (const char *)a->m + i * ss, k * ss);
		t->m = b->m;
	}
	if (a->v) {
		memcpy(b->v, (const char *)a->v + i * ss, k * ss);
		t->v = b->v;
	}
	t->copy = a->ck == ZINF_COPY_NONE ? NULL : b->c;
}

/* The k results back from b into *a's arrays. */
static inline void
tail_out(const struct zinf_opt_args *a, size_t i, size_t k, size_t ss,
	 const struct zinf_tail_buf *b)
{
	memcpy(a->param + i, b->p, k * 4);
	if (a->m) {
		memcpy((char *)a->m + i * ss, b->m, k * ss);
	}
	if (a->v) {
		memcpy((char *)a->v + i * ss, b->v, k * ss);
	}
	size_t cs = copy_size(a->ck);
	if (cs) {
		memcpy((char *)a->copy + i * cs, b->c, k * cs);
	}
}

/*
 * One optimizer's kernel, from its `name##_loop(a, i0, i1, gdt, ck, nt, hoff)` (the vector loop
 * over whole vectors; nt: streaming copy stores; hoff: the elements' offset in the call, for the
 * stochastic-rounding hash). It defines `name##_body`, which runs [i0, i1) with the last
 * (i1 - i0) % ZV_WIDTH elements through the same loop on zero-padded buffers, and ZV_FN(name),
 * the table entry, which picks once per range a body specialised for (grad dtype, copy kind), so
 * that the inner loops have no dtype switch. ss: bytes per element of m and v (4, or 2 for bf16
 * state).
 */
#define ZV_CASE(name, gdt, ck)                                                                     \
	case (gdt)*4 + (ck):                                                                       \
		name##_body(a, i0, i1, (gdt), (ck));                                               \
		break;

#define ZV_KERNEL(name, ss)                                                                        \
	ZINF_ALWAYS_INLINE void name##_body(const struct zinf_opt_args *a, size_t i0, size_t i1,   \
					    enum zinf_dtype gdt, enum zinf_copy_kind ck)           \
	{                                                                                          \
		size_t k = (i1 - i0) % ZV_WIDTH, ie = i1 - k;                                      \
		name##_loop(a, i0, ie, gdt, ck, copy_nt(a, ck), 0);                                \
		if (k) {                                                                           \
			struct zinf_tail_buf b;                                                    \
			struct zinf_opt_args t;                                                    \
			tail_in(a, ie, k, (ss), &b, &t);                                           \
			name##_loop(&t, 0, ZV_WIDTH, gdt, ck, false, ie);                          \
			tail_out(a, ie, k, (ss), &b);                                              \
		}                                                                                  \
	}                                                                                          \
	static void ZV_FN(name)(const struct zinf_opt_args *a, size_t i0, size_t i1)               \
	{                                                                                          \
		switch (a->gdt * 4 + a->ck) {                                                      \
			ZV_CASE(name, ZINF_F32, ZINF_COPY_NONE)                                    \
			ZV_CASE(name, ZINF_F32, ZINF_COPY_F32)                                     \
			ZV_CASE(name, ZINF_F32, ZINF_COPY_F16)                                     \
			ZV_CASE(name, ZINF_F32, ZINF_COPY_BF16)                                    \
			ZV_CASE(name, ZINF_F16, ZINF_COPY_NONE)                                    \
			ZV_CASE(name, ZINF_F16, ZINF_COPY_F32)                                     \
			ZV_CASE(name, ZINF_F16, ZINF_COPY_F16)                                     \
			ZV_CASE(name, ZINF_F16, ZINF_COPY_BF16)                                    \
			ZV_CASE(name, ZINF_BF16, ZINF_COPY_NONE)                                   \
			ZV_CASE(name, ZINF_BF16, ZINF_COPY_F32)                                    \
			ZV_CASE(name, ZINF_BF16, ZINF_COPY_F16)                                    \
		default:                                                                           \
			name##_body(a, i0, i1, ZINF_BF16, ZINF_COPY_BF16);                         \
			break;                                                                     \
		}                                                                                  \
	}

/* ---- the optimizers ------------------------------------------------------------------------- */

ZINF_ALWAYS_INLINE void
adam_loop(const struct zinf_opt_args *args, size_t i0, size_t i1, enum zinf_dtype gdt,
	  enum zinf_copy_kind ck, bool nt, size_t hoff)
{
	/* A local copy: the stores below could alias *args as far as the compiler knows, which
	 * would reload and re-broadcast every scalar in every iteration. */
	const struct zinf_opt_args la = *args, *a = &la;
	float *P = a->param, *M = a->m, *V = a->v;
	size_t i = i0;
	for (; i + ZV_WIDTH <= i1; i += ZV_WIDTH) {
		ZV_PS p = zv_loadu(P + i);
		ZV_PS g = grad_in(a, gdt, i, p);
		ZV_PS m = zv_loadu(M + i), v = zv_loadu(V + i);
		p = adam_math(a, p, g, &m, &v);
		zv_storeu(M + i, m);
		zv_storeu(V + i, v);
		zv_storeu(P + i, p);
		store_copy(a->copy, ck, i, p, nt, a->hw_bf16);
	}
	if (nt) {
		_mm_sfence();
	}
	(void)hoff;
}

ZV_KERNEL(adam, 4)

ZINF_ALWAYS_INLINE void
adam_bf16state_loop(const struct zinf_opt_args *args, size_t i0, size_t i1, enum zinf_dtype gdt,
		    enum zinf_copy_kind ck, bool nt, size_t hoff)
{
	const struct zinf_opt_args la = *args, *a = &la;
	float *P = a->param;
	uint16_t *M = a->m, *V = a->v;
	size_t i = i0;
	for (; i + ZV_WIDTH <= i1; i += ZV_WIDTH) {
		ZV_PS p = zv_loadu(P + i);
		ZV_PS g = grad_in(a, gdt, i, p);
		ZV_PS m = zv_from_bf16(zh_loadu(M + i)), v = zv_from_bf16(zh_loadu(V + i));
		p = adam_math(a, p, g, &m, &v);
		ZV_HALF mo, vo;
		zv_state_round(a, m, v, &mo, &vo, i + hoff + a->hbase);
		zh_storeu(M + i, mo);
		zh_storeu(V + i, vo);
		zv_storeu(P + i, p);
		store_copy(a->copy, ck, i, p, nt, a->hw_bf16);
	}
	if (nt) {
		_mm_sfence();
	}
	(void)hoff;
}

ZV_KERNEL(adam_bf16state, 2)

ZINF_ALWAYS_INLINE void
adagrad_loop(const struct zinf_opt_args *args, size_t i0, size_t i1, enum zinf_dtype gdt,
	     enum zinf_copy_kind ck, bool nt, size_t hoff)
{
	const struct zinf_opt_args la = *args, *a = &la;
	float *P = a->param, *H = a->v;
	size_t i = i0;
	for (; i + ZV_WIDTH <= i1; i += ZV_WIDTH) {
		ZV_PS p = zv_loadu(P + i);
		ZV_PS g = grad_in(a, gdt, i, p);
		ZV_PS h = zv_fmadd(g, g, zv_loadu(H + i));
		ZV_PS std = zv_add(zv_sqrt(h), zv_set1(a->eps));
		p = zv_fmadd(zv_set1(a->nstep), zv_div(g, std), p);
		zv_storeu(H + i, h);
		zv_storeu(P + i, p);
		store_copy(a->copy, ck, i, p, nt, a->hw_bf16);
	}
	if (nt) {
		_mm_sfence();
	}
	(void)hoff;
}

ZV_KERNEL(adagrad, 4)

ZINF_ALWAYS_INLINE void
lion_loop(const struct zinf_opt_args *args, size_t i0, size_t i1, enum zinf_dtype gdt,
	  enum zinf_copy_kind ck, bool nt, size_t hoff)
{
	const struct zinf_opt_args la = *args, *a = &la;
	float *P = a->param, *M = a->m;
	size_t i = i0;
	for (; i + ZV_WIDTH <= i1; i += ZV_WIDTH) {
		ZV_PS p = zv_mul(zv_loadu(P + i), zv_set1(a->decay));
		ZV_PS g = zv_mul(load_grad(a->grad, gdt, i), zv_set1(a->grad_scale));
		ZV_PS m = zv_loadu(M + i);
		ZV_PS c = zv_fmadd(zv_set1(a->b1), m, zv_mul(zv_set1(a->omb1), g));
		p = zv_fmadd(zv_set1(a->nstep), zv_sign(c), p);
		m = zv_fmadd(zv_set1(a->b2), m, zv_mul(zv_set1(a->omb2), g));
		zv_storeu(M + i, m);
		zv_storeu(P + i, p);
		store_copy(a->copy, ck, i, p, nt, a->hw_bf16);
	}
	if (nt) {
		_mm_sfence();
	}
	(void)hoff;
}

ZV_KERNEL(lion, 4)

/* q8 state: the blocks decoded, stepped by this path's Adam kernel above, encoded (the codec
 * loops of adam_q8_internal.h, compiled with this path's flags, encode the same bytes) */
static void
ZV_FN(adam_q8state)(const struct zinf_opt_args *a, size_t i0, size_t i1)
{
	q8_step(a, i0, i1, ZV_FN(adam));
}

/*
 * The bf16 master, one pass per vector: the master widened (exact), the gradient, m and v (bf16
 * when mvb, else floats: f32 moments or q8's decoded) through adam_math as adam_loop and
 * adam_bf16state_loop do (the same bits), the moments stored (bf16: zv_state_round with hash
 * index hbase + hoff + i), the master rounded back (stochastic: zv_bf16_sr_sat with the master's
 * bits of the same index; or RNE) and the copy (f16: the float update, as the kernels; bf16: the
 * new master; f32: it widened).
 */
ZINF_ALWAYS_INLINE void
bf16master_loop(const struct zinf_opt_args *args, size_t i0, size_t i1, enum zinf_dtype gdt,
		enum zinf_copy_kind ck, bool nt, size_t hoff, bool mvb)
{
	const struct zinf_opt_args la = *args, *a = &la;
	uint16_t *W = a->master;
	const bool sr = a->mrounding == ZINF_ROUND_STOCHASTIC;
	const ZV_EPI32 low = zvi_set1(0xffff);
	const uint64_t h0 = a->hbase + hoff;
	for (size_t i = i0; i + ZV_WIDTH <= i1; i += ZV_WIDTH) {
		ZV_PS p = zv_from_bf16(zh_loadu(W + i));
		ZV_PS g = grad_in(a, gdt, i, p);
		ZV_PS m, v;
		if (mvb) {
			m = zv_from_bf16(zh_loadu((const uint16_t *)a->m + i));
			v = zv_from_bf16(zh_loadu((const uint16_t *)a->v + i));
		} else {
			m = zv_loadu((const float *)a->m + i);
			v = zv_loadu((const float *)a->v + i);
		}
		p = adam_math(a, p, g, &m, &v);
		if (mvb) {
			ZV_HALF mo, vo;
			zv_state_round(a, m, v, &mo, &vo, h0 + i);
			zh_storeu((uint16_t *)a->m + i, mo);
			zh_storeu((uint16_t *)a->v + i, vo);
		} else {
			zv_storeu((float *)a->m + i, m);
			zv_storeu((float *)a->v + i, v);
		}
		ZV_HALF w = sr ? zv_bf16_sr_sat(p, zvi_and(sr_bits_master(a->mkey, h0 + i), low))
			       : zv_to_bf16(p, a->hw_bf16);
		zh_storeu(W + i, w);
		if (ck == ZINF_COPY_F16) {
			store_copy(a->copy, ck, i, p, nt, a->hw_bf16);
		} else if (ck == ZINF_COPY_BF16) {
			if (nt) {
				zh_stream((uint16_t *)a->copy + i, w);
			} else {
				zh_storeu((uint16_t *)a->copy + i, w);
			}
		} else if (ck == ZINF_COPY_F32) {
			zv_storeu((float *)a->copy + i, zv_from_bf16(w));
		}
	}
	if (nt) {
		_mm_sfence();
	}
}

/* [i0, i1) of a run: the vectors, then the last (i1 - i0) % ZV_WIDTH elements through the same
 * loop on zero-padded buffers (the tails of ZV_KERNEL, with the master's 16-bit array). */
ZINF_ALWAYS_INLINE void
bf16master_body(const struct zinf_opt_args *a, size_t i0, size_t i1, enum zinf_dtype gdt,
		enum zinf_copy_kind ck, bool mvb)
{
	size_t k = (i1 - i0) % ZV_WIDTH, ie = i1 - k;
	bf16master_loop(a, i0, ie, gdt, ck, copy_nt(a, ck), 0, mvb);
	if (k) {
		size_t gs = zinf_dtype_size(gdt), ss = mvb ? 2 : 4, cs = copy_size(ck);
		struct zinf_tail_buf b;
		_Alignas(64) uint16_t wb[ZV_TAIL_MAX];
		memset(&b, 0, sizeof(b));
		memset(wb, 0, sizeof(wb));
		struct zinf_opt_args t = *a;
		memcpy(wb, a->master + ie, k * 2);
		t.master = wb;
		memcpy(b.g, (const char *)a->grad + ie * gs, k * gs);
		t.grad = b.g;
		memcpy(b.m, (const char *)a->m + ie * ss, k * ss);
		t.m = b.m;
		memcpy(b.v, (const char *)a->v + ie * ss, k * ss);
		t.v = b.v;
		t.copy = cs ? b.c : NULL;
		bf16master_loop(&t, 0, ZV_WIDTH, gdt, ck, false, ie, mvb);
		memcpy(a->master + ie, wb, k * 2);
		memcpy((char *)a->m + ie * ss, b.m, k * ss);
		memcpy((char *)a->v + ie * ss, b.v, k * ss);
		if (cs) {
			memcpy((char *)a->copy + ie * cs, b.c, k * cs);
		}
	}
}

#define ZV_BM_CASE(gdt, ck)                                                                        \
	case (gdt)*4 + (ck):                                                                       \
		if (mvb) {                                                                         \
			bf16master_body(a, i0, i1, (gdt), (ck), true);                             \
		} else {                                                                           \
			bf16master_body(a, i0, i1, (gdt), (ck), false);                            \
		}                                                                                  \
		break;

/* One run of a bf16-master step (adam_bf16m_internal.h's driver): a body specialised for (grad
 * dtype, copy kind, bf16 or float m and v). A bf16 copy that is the master itself is not written
 * twice. */
static void
ZV_FN(bf16master_run)(const struct zinf_opt_args *args, size_t i0, size_t i1)
{
	struct zinf_opt_args u = *args;
	const struct zinf_opt_args *a = &u;
	if (u.ck == ZINF_COPY_BF16 && (uint16_t *)u.copy == u.master) {
		u.ck = ZINF_COPY_NONE;
		u.copy = NULL;
	}
	bool mvb = u.mv == ZINF_MOMENTS_BF16;
	switch (u.gdt * 4 + u.ck) {
		ZV_BM_CASE(ZINF_F32, ZINF_COPY_NONE)
		ZV_BM_CASE(ZINF_F32, ZINF_COPY_F32)
		ZV_BM_CASE(ZINF_F32, ZINF_COPY_F16)
		ZV_BM_CASE(ZINF_F32, ZINF_COPY_BF16)
		ZV_BM_CASE(ZINF_F16, ZINF_COPY_NONE)
		ZV_BM_CASE(ZINF_F16, ZINF_COPY_F32)
		ZV_BM_CASE(ZINF_F16, ZINF_COPY_F16)
		ZV_BM_CASE(ZINF_F16, ZINF_COPY_BF16)
		ZV_BM_CASE(ZINF_BF16, ZINF_COPY_NONE)
		ZV_BM_CASE(ZINF_BF16, ZINF_COPY_F32)
		ZV_BM_CASE(ZINF_BF16, ZINF_COPY_F16)
	default:
		if (mvb) {
			bf16master_body(a, i0, i1, ZINF_BF16, ZINF_COPY_BF16, true);
		} else {
			bf16master_body(a, i0, i1, ZINF_BF16, ZINF_COPY_BF16, false);
		}
		break;
	}
}

/* bf16 master: the runs (q8: decoded blocks) through this path's one-pass kernel above */
static void
ZV_FN(adam_bf16master)(const struct zinf_opt_args *a, size_t i0, size_t i1)
{
	bf16m_step(a, i0, i1, ZV_FN(bf16master_run));
}

/* ---- the gradient helpers ------------------------------------------------------------------- */

/* acc0/acc1 += the squares of x's lanes, in float64. Squares of float32 values are exact in
 * float64, so each FMA adds exactly one rounding. */
ZINF_ALWAYS_INLINE void
sumsq_acc(ZV_PS x, ZV_PD *acc0, ZV_PD *acc1)
{
	ZV_PD lo = zvd_lo(x), hi = zvd_hi(x);
	*acc0 = zvd_fmadd(lo, lo, *acc0);
	*acc1 = zvd_fmadd(hi, hi, *acc1);
}

static double
ZV_FN(sumsq)(const void *g, enum zinf_dtype dt, size_t i0, size_t i1)
{
	ZV_PD acc0 = zvd_zero(), acc1 = zvd_zero();
	size_t i = i0;
	for (; i + ZV_WIDTH <= i1; i += ZV_WIDTH) {
		sumsq_acc(load_grad(g, dt, i), &acc0, &acc1);
	}
	if (i < i1) { /* the tail zero-padded through the same accumulators (adds exact zeros) */
		_Alignas(sizeof(ZV_PS)) uint32_t b[ZV_WIDTH] = {0};
		size_t es = zinf_dtype_size(dt);
		memcpy(b, (const char *)g + i * es, (i1 - i) * es);
		sumsq_acc(load_grad(b, dt, 0), &acc0, &acc1);
	}
	double s[ZV_WIDTH / 2];
	zvd_storeu(s, zvd_add(acc0, acc1));
	return ZVD_HSUM(s);
}

static bool
ZV_FN(has_inf_nan)(const void *g, enum zinf_dtype dt, size_t i0, size_t i1)
{
	size_t i = i0;
	ZV_ANY any = zv_any_none();
	if (dt == ZINF_F32) {
		const ZV_EPI32 e = zvi_set1(0x7f800000);
		for (; i + ZV_WIDTH <= i1; i += ZV_WIDTH) {
			any = zv_any_allset32(any, (const float *)g + i, e);
		}
	} else {
		const ZV_EPI32 e = zvi_set1_16(dt == ZINF_F16 ? 0x7c00 : 0x7f80);
		for (; i + 2 * ZV_WIDTH <= i1; i += 2 * ZV_WIDTH) {
			any = zv_any_allset16(any, (const uint16_t *)g + i, e);
		}
	}
	if (zv_any_found(any)) {
		return true;
	}
	return adam_nonfinite_range(g, dt, i, i1);
}

/* ---- the three-pass flow's passes (benchmark) ----------------------------------------------- */

ZINF_ALWAYS_INLINE void
scale_loop(void *g, enum zinf_dtype dt, float s, size_t i0, size_t i1)
{
	const ZV_PS vs = zv_set1(s);
	size_t i = i0;
	for (; i + ZV_WIDTH <= i1; i += ZV_WIDTH) {
		ZV_PS x = zv_mul(load_grad(g, dt, i), vs);
		switch (dt) {
		case ZINF_F16:
			zh_storeu((uint16_t *)g + i, zv_to_f16(x));
			break;
		case ZINF_BF16:
			zh_storeu((uint16_t *)g + i, zv_to_bf16(x, false));
			break;
		default:
			zv_storeu((float *)g + i, x);
			break;
		}
	}
}

ZINF_ALWAYS_INLINE void
convert_loop(const float *src, void *dst, enum zinf_copy_kind ck, size_t i0, size_t i1)
{
	for (size_t i = i0; i + ZV_WIDTH <= i1; i += ZV_WIDTH) {
		store_copy(dst, ck, i, zv_loadu(src + i), false, false);
	}
}

/* g *= s in place and dst = src as ck; the last (i1 - i0) % ZV_WIDTH elements through the same
 * loop on a zero-padded buffer, as the optimizers' tails. */
static void
ZV_FN(scale)(void *g, enum zinf_dtype dt, float s, size_t i0, size_t i1)
{
	size_t k = (i1 - i0) % ZV_WIDTH, ie = i1 - k, es = zinf_dtype_size(dt);
	scale_loop(g, dt, s, i0, ie);
	if (k) {
		_Alignas(64) uint32_t b[ZV_WIDTH] = {0};
		memcpy(b, (char *)g + ie * es, k * es);
		scale_loop(b, dt, s, 0, ZV_WIDTH);
		memcpy((char *)g + ie * es, b, k * es);
	}
}

static void
ZV_FN(convert)(const float *src, void *dst, enum zinf_copy_kind ck, size_t i0, size_t i1)
{
	size_t k = (i1 - i0) % ZV_WIDTH, ie = i1 - k, cs = copy_size(ck);
	convert_loop(src, dst, ck, i0, ie);
	if (k) {
		_Alignas(64) float sb[ZV_WIDTH] = {0};
		_Alignas(64) uint32_t db[ZV_WIDTH];
		memcpy(sb, src + ie, k * 4);
		convert_loop(sb, db, ck, 0, ZV_WIDTH);
		memcpy((char *)dst + ie * cs, db, k * cs);
	}
}

const struct zinf_adam_ops ZV_CAT(zinf_adam_, ZV_CAT(ZV_ISA, _ops)) = {
	.name = ZV_STR(ZV_ISA),
	.missing = ZV_FN(missing),
	.step =
		{
			[ZINF_OPT_ADAM] = ZV_FN(adam),
			[ZINF_OPT_ADAM_BF16STATE] = ZV_FN(adam_bf16state),
			[ZINF_OPT_ADAGRAD] = ZV_FN(adagrad),
			[ZINF_OPT_LION] = ZV_FN(lion),
			[ZINF_OPT_ADAM_Q8STATE] = ZV_FN(adam_q8state),
			[ZINF_OPT_ADAM_BF16MASTER] = ZV_FN(adam_bf16master),
		},
	.sumsq = ZV_FN(sumsq),
	.has_inf_nan = ZV_FN(has_inf_nan),
	.scale = ZV_FN(scale),
	.convert = ZV_FN(convert),
};

#endif
