/* backend_cpu.c - the CPU backend: one sgemm (oneDNN's or OpenBLAS's, cpu_blas.h) for every
 * matrix product, OpenMP loops for the rest (the MoE kernels are in moe_cpu.c). Contracts in
 * backend.h.
 *
 * Where the time goes: on a GPT-2 step almost all flops are matrix products, so each linear
 * layer is ONE sgemm over the whole [B*T, C] batch, and attention is a handful of small sgemms
 * per (batch, head) run in parallel over the pairs (the OpenMP build of OpenBLAS runs
 * single-threaded inside a parallel region, so the two thread pools never fight). Attention
 * skips the masked upper triangle block by block. The elementwise ops are fused where the
 * model allows (bias + GELU, residual + LayerNorm, softmax + cross-entropy) and written as
 * plain loops the compiler vectorises. In bf16 (oneDNN's matmul primitive, AMX where the CPU
 * has it) the products are no longer most of the step: what they read is. So attention keeps
 * each head's rounded q, k, v and its blocks dense, and the activations that feed only
 * products can be written and read in bfloat16 (the *_bf16 ops, backend.h).
 *
 * Determinism: no atomics. Reductions over rows either run over a fixed split of the
 * columns (each output column summed in row order) or over CPU_CHUNKS fixed row chunks
 * summed in chunk order, and no matrix product splits its reduction dimension, so results do
 * not depend on how many threads run or how OpenMP schedules them.
 */
#include "backend/cpu/cpu_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "backend/backend_impl.h"
#include "common/err.h"
#include "common/rng.h"
#include "common/banned.h"

/* The MoE kernels (moe_cpu.c). */
int cpu_moe_gate_forward(struct backend *be, const struct backend_moe_gate *g,
			 const float *logits, float *probs, float *clean, float *top,
			 int32_t *idx, float *score, float *aux);
int cpu_moe_gate_backward(struct backend *be, const struct backend_moe_gate *g,
			  const float *logits, const float *probs, const float *clean,
			  const int32_t *idx, const float *dscore, float aux_weight,
			  float *dlogits);
int cpu_moe_count(struct backend *be, const int32_t *idx, int64_t n, int E, int64_t *count);
int cpu_moe_locations(struct backend *be, const int32_t *idx, const float *top, int64_t T,
		      int k, int E, int64_t C, int32_t *loc);
int cpu_moe_encode(struct backend *be, const struct backend_moe_route *r, const float *x,
		   float *disp, int64_t M, int zero_pad);
int cpu_moe_decode(struct backend *be, const struct backend_moe_route *r, const float *eo,
		   float *y, int64_t M);
int cpu_moe_decode_backward(struct backend *be, const struct backend_moe_route *r,
			    const float *dy, const float *eo, float *d_eo, float *dscore,
			    int64_t M, int zero_pad);
int cpu_moe_encode_backward(struct backend *be, const struct backend_moe_route *r,
			    const float *d_disp, float *dx, int64_t M);
int cpu_moe_encode_bf16(struct backend *be, const struct backend_moe_route *r,
			const uint16_t *x, uint16_t *disp, int64_t M, int zero_pad);
int cpu_moe_decode_bf16(struct backend *be, const struct backend_moe_route *r,
			const uint16_t *eo, uint16_t *y, int64_t M);
int cpu_moe_decode_backward_bf16(struct backend *be, const struct backend_moe_route *r,
				 const uint16_t *dy, const uint16_t *eo, uint16_t *d_eo,
				 float *dscore, int64_t M, int zero_pad);
int cpu_moe_encode_backward_bf16(struct backend *be, const struct backend_moe_route *r,
				 const uint16_t *d_disp, uint16_t *dx, int64_t M);

/* AdamW (adamw_cpu.c, built without fp contraction: torch's arithmetic, fma for fma). */
int cpu_adamw_update(struct backend *be, float *p, const float *g, float *m, float *v,
		     const struct backend_segment *seg, int nseg, double lr, double beta1,
		     double beta2, double eps, long t, float grad_scale);

/* Attention row/key block: rows of block r attend to keys of blocks 0..r only, so the
 * products skip all but (nb + 1) / (2 nb) of the T x T scores (nb = T / ATT_BLOCK blocks).
 * 32 measured ~1-2% faster than 64 and 6% faster than no blocking at T = 256, hs = 64. */
#ifndef ATT_BLOCK
#define ATT_BLOCK 32
#endif

/* Products with at most this many output columns (the MoE gate: one column per expert) run
 * in this file's own loops: BLAS handles such skinny shapes poorly, and they are bound by
 * reading x once anyway. */
#define SKINNY_OC 64
/* The skinny weight gradient sums rows in at most this many fixed chunks (double partials of
 * [OC, IC] each, summed in chunk order). */
#define SKINNY_CHUNKS 16

/* Allocations of 4 MiB and more sit on 2 MiB boundaries with transparent huge pages
 * requested: the kernels jump between rows of large buffers ([E,C,M], activations), and
 * 4 KiB pages would cost a TLB miss per row. Smaller ones are 64-byte aligned. */
#define HUGE_PAGE ((size_t)2 << 20)

static inline int min_int(int a, int b) { return a < b ? a : b; }

/* ---- lifetime, memory, workspace ------------------------------------------------------ */

static int cpu_alloc(struct backend *be, void **ptr, size_t bytes)
{
	size_t align = bytes >= 2 * HUGE_PAGE ? HUGE_PAGE : 64;
	size_t rounded = bytes ? (bytes + align - 1) / align * align : 64;

	*ptr = aligned_alloc(align, rounded);
	if (!*ptr)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate %zu bytes", bytes);
	if (align == HUGE_PAGE)
		madvise(*ptr, rounded, MADV_HUGEPAGE);
	return 0;
}

static void cpu_free(struct backend *be, void *ptr) { free(ptr); }

/* Copies of this many bytes and more are split over the threads: one core does not reach
 * the memory bandwidth (MACHINE.md: 19-36 GB/s on one, 35-44 on two), and below it the
 * fork costs more than it saves. */
#define COPY_PAR_MIN ((size_t)1 << 20)

/* Host memory both ways: upload, download and copy are one memcpy, split over the threads
 * when large. */
static int cpu_copy(struct backend *be, void *dst, const void *src, size_t bytes)
{
	if (bytes < COPY_PAR_MIN || be->threads < 2) {
		memcpy(dst, src, bytes);
		return 0;
	}
	cpu_enter(be);
#pragma omp parallel
	{
		size_t nt = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
		size_t lo = bytes * id / nt, hi = bytes * (id + 1) / nt;
		memcpy((char *)dst + lo, (const char *)src + lo, hi - lo);
	}
	return 0;
}

static int cpu_copy_2d(struct backend *be, void *dst, size_t dpitch, const void *src,
		       size_t spitch, size_t width, size_t rows)
{
	for (size_t i = 0; width && i < rows; i++)
		memcpy((char *)dst + i * dpitch, (const char *)src + i * spitch, width);
	return 0;
}

static int cpu_memset(struct backend *be, void *dst, int byte, size_t bytes)
{
	memset(dst, byte, bytes);
	return 0;
}

static int cpu_sync(struct backend *be) { return 0; }

void *cpu_workspace(struct backend *be, size_t bytes)
{
	struct cpu_ctx *c = cpu_ctx(be);

	if (bytes <= c->ws_bytes)
		return c->ws;
	free(c->ws);
	c->ws_bytes = 0;
	if (cpu_alloc(be, &c->ws, bytes) < 0) {
		c->ws = NULL;
		err_set(CORE_ENOMEM, NULL, "cannot allocate %zu bytes of workspace", bytes);
		return NULL;
	}
	c->ws_bytes = bytes;
	return c->ws;
}

static size_t cpu_workspace_bytes(struct backend *be) { return cpu_ctx(be)->ws_bytes; }

static void cpu_close(struct backend *be)
{
	struct cpu_ctx *c = cpu_ctx(be);
	if (c) {
		free(c->ws);
		free(c->shared);
		free(c->wide);
	}
	free(c);
	be->ctx = NULL;
}

/* ---- fills and reductions -------------------------------------------------------------- */

static int cpu_fill(struct backend *be, float *x, size_t n, float value)
{
	cpu_enter(be);
#pragma omp parallel for schedule(static) if (n >= CPU_PAR_MIN)
	for (size_t i = 0; i < n; i++)
		x[i] = value;
	return 0;
}

static int cpu_add_f32(struct backend *be, float *y, const float *x, size_t n)
{
	cpu_enter(be);
#pragma omp parallel for schedule(static) if (n >= CPU_PAR_MIN)
	for (size_t i = 0; i < n; i++)
		y[i] += x[i];
	return 0;
}

static int cpu_fill_normal(struct backend *be, float *x, size_t n, float mean, float std,
			   uint64_t seed, uint64_t stream, uint64_t base)
{
	cpu_enter(be);
	rng_fill_normal(x, (int64_t)n, mean, std, seed, stream, base);
	return 0;
}

static int cpu_sum(struct backend *be, double *out, const float *x, size_t n, int squares)
{
	double part[CPU_CHUNKS];

	cpu_enter(be);
#pragma omp parallel for schedule(static) if (n >= CPU_PAR_MIN)
	for (int k = 0; k < CPU_CHUNKS; k++) {
		size_t i0 = n * (size_t)k / CPU_CHUNKS, i1 = n * (size_t)(k + 1) / CPU_CHUNKS;
		double s = 0.0;
		if (squares) {
#pragma omp simd reduction(+ : s)
			for (size_t i = i0; i < i1; i++)
				s += (double)x[i] * (double)x[i];
		} else {
#pragma omp simd reduction(+ : s)
			for (size_t i = i0; i < i1; i++)
				s += (double)x[i];
		}
		part[k] = s;
	}
	double s = 0.0;
	for (int k = 0; k < CPU_CHUNKS; k++)
		s += part[k];
	*out = s;
	return 0;
}

void cpu_column_sums(float *out, const float *a, int64_t rows, int64_t n)
{
#pragma omp parallel if (rows * n >= CPU_PAR_MIN)
	{
		int64_t c0, c1;
		thread_share(n, &c0, &c1);
		if (c1 > c0) {
			float *o = out + c0;
			const int64_t w = c1 - c0;
			memset(o, 0, sizeof(float) * (size_t)w);
			for (int64_t i = 0; i < rows; i++) {
				const float *row = a + i * n + c0;
#pragma omp simd
				for (int64_t c = 0; c < w; c++)
					o[c] += row[c];
			}
		}
	}
}

/* ---- matrix products ------------------------------------------------------------------ */

/* Time inside sgemm, for the matmul share of a step that dpc-train-path reports, kept in
 * wall-clock terms: a call made inside a parallel region of n threads counts 1/n of its
 * duration, so the sum over threads estimates the wall time the cores spent in products. */
static void cpu_profile(struct backend *be, int enable)
{
	struct cpu_ctx *c = cpu_ctx(be);
	c->prof_on = enable;
	memset(c->prof, 0, sizeof c->prof);
}

static double cpu_gemm_seconds(struct backend *be)
{
	const struct cpu_ctx *c = cpu_ctx(be);
	double s = 0.0;
	for (int i = 0; i < CPU_PROF_SLOTS; i++)
		s += c->prof[i].s;
	return s;
}

/* An operand of a bf16 product that is bfloat16 already: op(X)'s rows as to_bf16 makes them,
 * ld elements apart (0: no padding). */
struct bf16_operand {
	const uint16_t *h;
	int ld;
};

/* One product on the calling thread, in the backend's precision; ah, bh (bf16 only) as
 * gemm_bf16 takes them. A bf16 product whose workspace cannot be had runs in fp32 instead
 * (counted in bf16_fallbacks) when its float operands are there; one whose operand is only
 * in bfloat16 (its float pointer NULL) sets bf16_failed, which the op reports. */
static void product(struct cpu_ctx *ctx, int ta, int tb, int M, int N, int K, float alpha,
		    const float *A, int lda, const float *B, int ldb, float beta, float *C,
		    int ldc, struct bf16_operand ah, struct bf16_operand bh)
{
	if (ctx->bf16 && ctx->blas->gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C,
					       ldc, ah.h, ah.ld, bh.h, bh.ld) == 0)
		return;
	if (ctx->bf16 && (!A || !B)) {
#pragma omp atomic write
		ctx->bf16_failed = 1;
		return;
	}
	if (ctx->bf16) {
#pragma omp atomic
		ctx->bf16_fallbacks++;
	}
	ctx->blas->sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* product(), timed when profiling */
static void gemm_timed(struct cpu_ctx *ctx, int ta, int tb, int M, int N, int K, float alpha,
		       const float *A, int lda, const float *B, int ldb, float beta, float *C,
		       int ldc, struct bf16_operand ah, struct bf16_operand bh)
{
	if (!ctx->prof_on) {
		product(ctx, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ah, bh);
		return;
	}
	double t0 = omp_get_wtime();
	product(ctx, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ah, bh);
	int tid = omp_get_thread_num();
	double dt = (omp_get_wtime() - t0) / omp_get_num_threads();
	if (tid < CPU_PROF_SLOTS - 1) {
		ctx->prof[tid].s += dt;
	} else {
#pragma omp atomic
		ctx->prof[CPU_PROF_SLOTS - 1].s += dt;
	}
}

/* gemm_timed with compact bfloat16 operands (NULL: rounded from A, B) */
static void gemm_h(struct cpu_ctx *ctx, int ta, int tb, int M, int N, int K, float alpha,
		   const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc,
		   const uint16_t *ah, const uint16_t *bh)
{
	gemm_timed(ctx, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
		   (struct bf16_operand){ah, 0}, (struct bf16_operand){bh, 0});
}

static void gemm_call(struct cpu_ctx *ctx, int ta, int tb, int M, int N, int K, float alpha,
		      const float *A, int lda, const float *B, int ldb, float beta, float *C,
		      int ldc)
{
	gemm_h(ctx, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL, NULL);
}

/* OpenBLAS runs products up to about this size (M*N*K; 1e6 for its SkylakeX kernels) through
 * a separate small-matrix kernel whose sums round differently. No block of a split product
 * goes below four times that, so every block takes the same kernel as the whole product. */
#define GEMM_MIN_BLOCK 4e6
/* A bf16 product is split into at most BF16_BLOCKS blocks of at least BF16_MIN_BLOCK
 * (M*N*K; see sgemm): fewer, larger blocks keep AMX's tiles busy. */
#ifndef BF16_BLOCKS
#define BF16_BLOCKS 4
#endif
#define BF16_MIN_BLOCK 16e6

/* to_bf16 (rows of src, row stride ld, into compact bfloat16 rows) split over nth threads by
 * rows: each value is rounded alone, so the split changes nothing but the time. */
static void to_bf16_par(struct cpu_ctx *ctx, int nth, uint16_t *dst, const float *src,
			int rows, int cols, int ld)
{
	if (nth < 2 || (int64_t)rows * cols < CPU_PAR_MIN) {
		ctx->blas->to_bf16(dst, src, rows, cols, ld);
		return;
	}
#pragma omp parallel num_threads(nth)
	{
		const int n = omp_get_num_threads(), t = omp_get_thread_num();
		const int r0 = (int)((int64_t)rows * t / n), r1 = (int)((int64_t)rows * (t + 1) / n);
		ctx->blas->to_bf16(dst + (size_t)r0 * cols, src + (size_t)r0 * ld, r1 - r0, cols,
				   ld);
	}
}

static void sgemm_bf16(struct backend *be, int ta, int tb, int M, int N, int K, float alpha,
		       const float *A, int lda, const float *B, int ldb, float beta, float *C,
		       int ldc, const uint16_t *ah_all, const uint16_t *bh_all);

/* Row-major C[M,N] = alpha op(A) op(B) + beta C with the threads splitting C into blocks of
 * rows (or of columns, when C is wider than tall) and each block one single-threaded sgemm
 * inside our own parallel region: one fork and one barrier per product, instead of
 * OpenBLAS's threads waiting on each other's packed panels, which stalls badly whenever
 * another process holds one of the cores.
 * The bits do not depend on the thread count: the reduction dimension K is never split,
 * blocks start on whole 16-wide panels (the kernel's tiles, so the same tiles cover the
 * same elements in any split) and stay above GEMM_MIN_BLOCK (the same kernel), so each
 * element is summed exactly as in the whole product. test_backend.c checks it at 1, 2 and 3
 * threads. */
static void sgemm(struct backend *be, int ta, int tb, int M,
		  int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
		  float beta, float *C, int ldc)
{
	struct cpu_ctx *ctx = cpu_ctx(be);
	const double mnk = (double)M * N * K;
	const int by_rows = M >= N;
	if (ctx->bf16) {
		sgemm_bf16(be, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL, NULL);
		return;
	}
	int nth = omp_in_parallel() ? 1 : be->threads;
	if (nth > mnk / GEMM_MIN_BLOCK)
		nth = (int)(mnk / GEMM_MIN_BLOCK);
	if (nth < 2) {
		/* OpenBLAS's OpenMP build threads a product itself, as many ways as OpenMP's
		 * thread count says, and its split changes the bits: one thread it is. */
		const int outer = !omp_in_parallel() && omp_get_max_threads() > 1;
		if (outer)
			omp_set_num_threads(1);
		gemm_call(ctx, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
		if (outer)
			omp_set_num_threads(be->threads);
		return;
	}
#pragma omp parallel num_threads(nth)
	{
		int64_t s0, s1; /* blocks of whole 16-wide panels */
		thread_share(by_rows ? M : N, &s0, &s1);
		const int d0 = (int)s0, d1 = (int)s1;
		if (d1 > d0) {
			if (by_rows) /* rows d0..d1 of C come from rows of op(A) */
				gemm_call(ctx, ta, tb, d1 - d0, N, K, alpha,
					  ta == 0 ? A + (size_t)d0 * lda : A + d0, lda,
					  B, ldb, beta, C + (size_t)d0 * ldc, ldc);
			else /* columns d0..d1 of C come from columns of op(B) */
				gemm_call(ctx, ta, tb, M, d1 - d0, K, alpha, A, lda,
					  tb == 0 ? B + d0 : B + (size_t)d0 * ldb, ldb,
					  beta, C + d0, ldc);
		}
	}
}

/* sgemm in bf16. Blocks are fixed by the shape alone, never by the thread count: oneDNN's
 * AMX kernel blocks K differently for different block shapes (seen at K = 2048), so the same
 * blocks must be computed whatever the threads. The operand every block reads whole (B for
 * blocks of rows, A for blocks of columns) is rounded to bfloat16 once, here; each block
 * rounds its own part of the other. ah_all (bh_all), when not NULL, is op(A) (op(B)) in
 * bfloat16 already, as to_bf16 makes it without padding, and A (B) may be NULL: the blocks
 * are the same, and the same bits come out, as from A (B) rounded. */
static void sgemm_bf16(struct backend *be, int ta, int tb, int M, int N, int K, float alpha,
		       const float *A, int lda, const float *B, int ldb, float beta, float *C,
		       int ldc, const uint16_t *ah_all, const uint16_t *bh_all)
{
	struct cpu_ctx *ctx = cpu_ctx(be);
	const double mnk = (double)M * N * K;
	const int by_rows = M >= N, D = by_rows ? M : N;
	int nblk = (int)(mnk / BF16_MIN_BLOCK);
	nblk = nblk < 1 ? 1 : nblk > BF16_BLOCKS ? BF16_BLOCKS : nblk;
	if (nblk > (D + 15) / 16)
		nblk = D > 16 ? (D + 15) / 16 : 1;
	const int per = ((D + nblk - 1) / nblk + 15) / 16 * 16;
	nblk = D > 0 ? (D + per - 1) / per : 1;
	const int nth = omp_in_parallel() ? 1 : min_int(be->threads, nblk);
	const uint16_t *whole = by_rows ? bh_all : ah_all;
	if (!whole && nblk > 1 && K > 0) {
		const size_t n = (size_t)K * (by_rows ? N : M);
		if (n > ctx->shared_n) {
			free(ctx->shared);
			ctx->shared_n = 0;
			if ((ctx->shared = aligned_alloc(64, (n * 2 + 63) / 64 * 64)))
				ctx->shared_n = n;
		}
		if (ctx->shared) { /* else each block rounds it again */
			if (by_rows)
				to_bf16_par(ctx, nth, ctx->shared, B, tb ? N : K, tb ? K : N, ldb);
			else
				to_bf16_par(ctx, nth, ctx->shared, A, ta ? K : M, ta ? M : K, lda);
			whole = ctx->shared;
		}
	}
	/* a block of the other operand within its rounded whole: rows d0.. of op(A) are rows
	 * of A's rounding (ta 0) or columns (ta 1, then its rows M apart); columns of op(B)
	 * likewise */
	const uint16_t *part = by_rows ? ah_all : bh_all;
	const int part_t = by_rows ? ta : !tb, part_w = by_rows ? (ta ? M : K) : (tb ? K : N);
#pragma omp parallel for schedule(static) num_threads(nth) if (nth > 1)
	for (int b = 0; b < nblk; b++) {
		const int d0 = b * per, d1 = min_int(D, d0 + per);
		struct bf16_operand w = {whole, 0}, p = {NULL, 0};
		if (part)
			p = part_t ? (struct bf16_operand){part + d0, part_w}
				   : (struct bf16_operand){part + (size_t)d0 * part_w, 0};
		if (by_rows)
			gemm_timed(ctx, ta, tb, d1 - d0, N, K, alpha,
				   !A ? NULL : ta == 0 ? A + (size_t)d0 * lda : A + d0, lda, B, ldb,
				   beta, C + (size_t)d0 * ldc, ldc, p, w);
		else
			gemm_timed(ctx, ta, tb, M, d1 - d0, K, alpha, A, lda,
				   !B ? NULL : tb == 0 ? B + d0 : B + (size_t)d0 * ldb, ldb, beta,
				   C + d0, ldc, w, p);
	}
}

static int cpu_gemm(struct backend *be, int transA, int transB, int M, int N, int K,
		    float alpha, const float *A, int lda, const float *B, int ldb, float beta,
		    float *C, int ldc)
{
	cpu_enter(be);
	sgemm(be, transA != 0, transB != 0, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
	return 0;
}

static void add_bias(float *y, const float *bias, int N, int C)
{
#pragma omp parallel for schedule(static) if ((int64_t)N * C >= CPU_PAR_MIN)
	for (int n = 0; n < N; n++) {
		float *row = y + (size_t)n * C;
#pragma omp simd
		for (int c = 0; c < C; c++)
			row[c] += bias[c];
	}
}

/* dst[i] = src[i] rounded to bfloat16 (and back to float), i < n */
static void round_copy(float *dst, const float *src, size_t n)
{
#pragma omp parallel for schedule(static) if (n >= CPU_PAR_MIN)
	for (size_t i = 0; i < n; i++)
		dst[i] = backend_bf16_to_float(backend_bf16_from_float(src[i]));
}

/* w as [OC, IC] rows (the skinny loops run along IC): w itself for the OI layout, else its
 * transpose in ws; in bf16, rounded, in ws either way. */
static const float *skinny_rows(struct backend *be, const float *w, int IC, int OC,
				enum backend_wlayout layout, float *ws)
{
	const int bf16 = cpu_ctx(be)->bf16;
	if (layout == BACKEND_W_OI && !bf16)
		return w;
	if (layout == BACKEND_W_OI) {
		round_copy(ws, w, (size_t)IC * OC);
		return ws;
	}
	for (int i = 0; i < IC; i++)
		for (int o = 0; o < OC; o++) {
			float v = w[(size_t)i * OC + o];
			ws[(size_t)o * IC + i] =
				bf16 ? backend_bf16_to_float(backend_bf16_from_float(v)) : v;
		}
	return ws;
}

/* y[n, o] = <x[n], w row o> (+ bias[o]), token-parallel. In bf16, on x and w rounded (in
 * the workspace), as every product of the precision. */
static int skinny_forward(struct backend *be, float *y, const float *x, const float *w,
			  const float *bias, int N, int IC, int OC, enum backend_wlayout layout)
{
	const int bf16 = cpu_ctx(be)->bf16;
	const size_t W = (size_t)IC * OC, X = bf16 ? (size_t)N * IC : 0;
	/* the OI layout is already [OC, IC]: in fp32, no transpose, no workspace */
	const int need = layout == BACKEND_W_IO || bf16;
	float *ws = need ? cpu_workspace(be, sizeof(float) * (W + X)) : NULL;
	if (need && !ws)
		return CORE_ENOMEM;
	const float *wr = skinny_rows(be, w, IC, OC, layout, ws);
	if (bf16) {
		round_copy(ws + W, x, X);
		x = ws + W;
	}
#pragma omp parallel for schedule(static) if ((int64_t)N * IC * OC >= CPU_PAR_MIN)
	for (int n = 0; n < N; n++) {
		const float *xr = x + (size_t)n * IC;
		for (int o = 0; o < OC; o++) {
			const float *r = wr + (size_t)o * IC;
			float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
			for (int i = 0; i < IC; i++)
				acc += xr[i] * r[i];
			y[(size_t)n * OC + o] = bias ? acc + bias[o] : acc;
		}
	}
	return 0;
}

/* One pass over the rows: the weight gradient x^T dy into SKINNY_CHUNKS fixed row chunks of
 * double partials (summed in chunk order afterwards), and dx (+)= dy w^T. A row of dx is
 * written only after that row of x has been read, so dx may be x. In bf16 the products read
 * x, dy and w rounded (copies in the workspace); dbias sums dy as it is. */
static int skinny_backward(struct backend *be, float *dx, float *dw, float *dbias,
			   const float *dy, const float *x, const float *w, int N, int IC, int OC,
			   enum backend_wlayout layout, int accumulate)
{
	const int bf16 = cpu_ctx(be)->bf16;
	const size_t W = (size_t)IC * OC;
	const size_t X = bf16 && dw ? (size_t)N * IC : 0, G = bf16 ? (size_t)N * OC : 0;
	const size_t dbl = (W + X + G + 1) / 2 * 2; /* floats before the double partials */
	const int nchunk = N < SKINNY_CHUNKS ? N : SKINNY_CHUNKS;
	float *ws = cpu_workspace(be, sizeof(float) * dbl +
					      (dw ? sizeof(double) * W * (size_t)nchunk : 0));
	if (!ws)
		return CORE_ENOMEM;
	double *part = (double *)(ws + dbl);
	const float *wr = dx ? skinny_rows(be, w, IC, OC, layout, ws) : NULL;

	if (dbias)
		cpu_column_sums(dbias, dy, N, OC);
	if (!dx && !dw)
		return 0;
	if (bf16) {
		round_copy(ws + W + X, dy, G);
		dy = ws + W + X;
		if (dw) {
			round_copy(ws + W, x, X);
			x = ws + W;
		}
	}
#pragma omp parallel for schedule(static) if ((int64_t)N * IC * OC >= CPU_PAR_MIN)
	for (int k = 0; k < nchunk; k++) {
		const int n0 = (int)((int64_t)N * k / nchunk);
		const int n1 = (int)((int64_t)N * (k + 1) / nchunk);
		double *acc = dw ? part + W * (size_t)k : NULL;
		if (acc)
			memset(acc, 0, sizeof(double) * W);
		for (int n = n0; n < n1; n++) {
			const float *xr = x + (size_t)n * IC, *g = dy + (size_t)n * OC;
			if (acc)
				for (int o = 0; o < OC; o++) {
					const double go = g[o];
					double *a = acc + (size_t)o * IC;
#pragma omp simd
					for (int i = 0; i < IC; i++)
						a[i] += go * xr[i];
				}
			if (dx) {
				float *d = dx + (size_t)n * IC;
				if (!accumulate)
					memset(d, 0, sizeof(float) * (size_t)IC);
				for (int o = 0; o < OC; o++) {
					const float go = g[o], *r = wr + (size_t)o * IC;
#pragma omp simd
					for (int i = 0; i < IC; i++)
						d[i] += go * r[i];
				}
			}
		}
	}
	if (!dw)
		return 0;
#pragma omp parallel for schedule(static) if (W * (size_t)nchunk >= CPU_PAR_MIN)
	for (int o = 0; o < OC; o++)
		for (int i = 0; i < IC; i++) {
			double v = 0.0;
			for (int k = 0; k < nchunk; k++)
				v += part[W * (size_t)k + (size_t)o * IC + (size_t)i];
			if (layout == BACKEND_W_IO)
				dw[(size_t)i * OC + o] = (float)v;
			else
				dw[(size_t)o * IC + i] = (float)v;
		}
	return 0;
}

static int cpu_matmul_forward(struct backend *be, float *y, const float *x, const float *w,
			      const float *bias, int N, int IC, int OC,
			      enum backend_wlayout layout)
{
	cpu_enter(be);
	if (OC <= SKINNY_OC)
		return skinny_forward(be, y, x, w, bias, N, IC, OC, layout);
	if (layout == BACKEND_W_IO)
		sgemm(be, 0, 0, N, OC, IC, 1.0f, x, IC, w, OC, 0.0f, y, OC);
	else
		sgemm(be, 0, 1, N, OC, IC, 1.0f, x, IC, w, IC, 0.0f, y, OC);
	if (bias)
		add_bias(y, bias, N, OC);
	return 0;
}

static int cpu_matmul_backward(struct backend *be, float *dx, float *dw, float *dbias,
			       const float *dy, const float *x, const float *w, int N, int IC,
			       int OC, enum backend_wlayout layout, int accumulate)
{
	float beta = accumulate ? 1.0f : 0.0f;

	cpu_enter(be);
	if (OC <= SKINNY_OC)
		return skinny_backward(be, dx, dw, dbias, dy, x, w, N, IC, OC, layout, accumulate);
	/* dw and dbias first: dx may overwrite x. */
	if (dw && layout == BACKEND_W_IO) /* dw [IC,OC] = x^T dy */
		sgemm(be, 1, 0, IC, OC, N, 1.0f, x, IC, dy, OC, 0.0f, dw, OC);
	else if (dw) /* dw [OC,IC] = dy^T x */
		sgemm(be, 1, 0, OC, IC, N, 1.0f, dy, OC, x, IC, 0.0f, dw, IC);
	if (dbias)
		cpu_column_sums(dbias, dy, N, OC);
	if (dx && layout == BACKEND_W_IO) /* dx = dy w^T, w [IC,OC] */
		sgemm(be, 0, 1, N, IC, OC, 1.0f, dy, OC, w, OC, beta, dx, IC);
	else if (dx) /* dx = dy w, w [OC,IC] */
		sgemm(be, 0, 0, N, IC, OC, 1.0f, dy, OC, w, IC, beta, dx, IC);
	return 0;
}

/* ---- embeddings ------------------------------------------------------------------------ */

static int cpu_encoder_forward(struct backend *be, float *out, const int32_t *tok,
			       const float *wte, const float *wpe, int B, int T, int C)
{
	cpu_enter(be);
#pragma omp parallel for schedule(static)
	for (int n = 0; n < B * T; n++) {
		float *o = out + (size_t)n * C;
		const float *e = wte + (size_t)tok[n] * C, *p = wpe + (size_t)(n % T) * C;
#pragma omp simd
		for (int c = 0; c < C; c++)
			o[c] = e[c] + p[c];
	}
	return 0;
}

static int cpu_encoder_backward(struct backend *be, float *dwte, float *dwpe, const float *dout,
				const int32_t *tok, int B, int T, int C, int V)
{
	cpu_enter(be);
	/* dwte: a scatter-add over tokens; each thread owns a slice of the columns and walks
	 * the tokens in order, so every sum has a fixed order and no two threads collide. */
#pragma omp parallel
	{
		int64_t s0, s1;
		thread_share(C, &s0, &s1);
		const int c0 = (int)s0, w = (int)(s1 - s0);
		if (w > 0) {
			for (int v = 0; v < V; v++)
				memset(dwte + (size_t)v * C + c0, 0, sizeof(float) * (size_t)w);
			for (int n = 0; n < B * T; n++) {
				float *d = dwte + (size_t)tok[n] * C + c0;
				const float *g = dout + (size_t)n * C + c0;
#pragma omp simd
				for (int c = 0; c < w; c++)
					d[c] += g[c];
			}
		}
	}
#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++) {
		float *d = dwpe + (size_t)t * C;
		memcpy(d, dout + (size_t)t * C, sizeof(float) * (size_t)C);
		for (int b = 1; b < B; b++) {
			const float *g = dout + ((size_t)b * T + t) * C;
#pragma omp simd
			for (int c = 0; c < C; c++)
				d[c] += g[c];
		}
	}
	return 0;
}

/* ---- layernorm ------------------------------------------------------------------------- */

static inline void ln_row(float *o, float *mean, float *rstd, const float *x, const float *w,
			  const float *b, int C)
{
	float s = 0.0f;
#pragma omp simd reduction(+ : s)
	for (int c = 0; c < C; c++)
		s += x[c];
	float m = s / (float)C;
	float v = 0.0f;
#pragma omp simd reduction(+ : v)
	for (int c = 0; c < C; c++) {
		float d = x[c] - m;
		v += d * d;
	}
	float r = 1.0f / sqrtf(v / (float)C + 1e-5f);
#pragma omp simd
	for (int c = 0; c < C; c++)
		o[c] = (x[c] - m) * r * w[c] + b[c];
	*mean = m;
	*rstd = r;
}

/* ---- bfloat16 activations: shared pieces ----------------------------------------------- */

/* dst[i] = bf16(src[i]), i < n: the products' own rounding (to_bf16) where the library has
 * one, else backend.h's (the same on every finite float32 that is not subnormal, and the
 * backend flushes subnormals) */
static void round_bf16(const struct cpu_ctx *ctx, uint16_t *dst, const float *src, int n)
{
	if (ctx->blas->to_bf16) {
		ctx->blas->to_bf16(dst, src, 1, n, n);
		return;
	}
	for (int i = 0; i < n; i++)
		dst[i] = backend_bf16_from_float(src[i]);
}

/* The context's float buffer of at least n (not the workspace, which the float op then
 * called uses); NULL (detail set) if it cannot grow */
static float *wide_room(struct backend *be, size_t n)
{
	struct cpu_ctx *c = cpu_ctx(be);
	if (n > c->wide_n) {
		free(c->wide);
		c->wide_n = 0;
		if (!(c->wide = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64))) {
			err_set(CORE_ENOMEM, NULL, "cannot allocate %zu floats", n);
			return NULL;
		}
		c->wide_n = n;
	}
	return c->wide;
}

/* x widened from bfloat16 into wide_room */
static const float *widen_bf16(struct backend *be, const uint16_t *x, size_t n)
{
	float *f = wide_room(be, n);
	if (!f)
		return NULL;
	cpu_enter(be);
#pragma omp parallel for schedule(static) if (n >= CPU_PAR_MIN)
	for (size_t i = 0; i < n; i++)
		f[i] = backend_bf16_to_float(x[i]);
	return f;
}

/* Per thread, a float row of n for an op whose out is bfloat16 (NULL: none needed) */
static float *row_ws(struct backend *be, const uint16_t *out16, int n)
{
	static float none;
	if (!out16)
		return &none;
	return cpu_workspace(be, sizeof(float) * (size_t)be->threads * (size_t)n);
}

/* LayerNorm of N rows into out, or rounded into out16 when it is not NULL (one loop for
 * both, so that the bits are the same) */
static int layernorm_rows(struct backend *be, float *out, uint16_t *out16, float *mean,
			  float *rstd, float *res, const float *skip, const float *bias,
			  const float *w, const float *b, int N, int C)
{
	const struct cpu_ctx *ctx = cpu_ctx(be);
	float *ws = row_ws(be, out16, C);
	if (!ws)
		return CORE_ENOMEM;
	cpu_enter(be);
#pragma omp parallel for schedule(static)
	for (int n = 0; n < N; n++) {
		float *r = res + (size_t)n * C;
		if (skip) {
			const float *s = skip + (size_t)n * C;
			if (bias) {
#pragma omp simd
				for (int c = 0; c < C; c++)
					r[c] += s[c] + bias[c];
			} else {
#pragma omp simd
				for (int c = 0; c < C; c++)
					r[c] += s[c];
			}
		}
		float *o = out16 ? ws + (size_t)omp_get_thread_num() * C : out + (size_t)n * C;
		ln_row(o, mean + n, rstd + n, r, w, b, C);
		if (out16)
			round_bf16(ctx, out16 + (size_t)n * C, o, C);
	}
	return 0;
}

static int cpu_layernorm_forward(struct backend *be, float *out, float *mean, float *rstd,
				 const float *x, const float *w, const float *b, int N, int C)
{
	/* res is only read when skip is NULL */
	return layernorm_rows(be, out, NULL, mean, rstd, (float *)x, NULL, NULL, w, b, N, C);
}

static int cpu_layernorm_forward_bf16(struct backend *be, uint16_t *out, float *mean,
				      float *rstd, const float *x, const float *w, const float *b,
				      int N, int C)
{
	return layernorm_rows(be, NULL, out, mean, rstd, (float *)x, NULL, NULL, w, b, N, C);
}

static int cpu_residual_layernorm_forward(struct backend *be, float *res, float *out,
					  float *mean, float *rstd, const float *skip,
					  const float *bias, const float *w, const float *b, int N,
					  int C)
{
	return layernorm_rows(be, out, NULL, mean, rstd, res, skip, bias, w, b, N, C);
}

static int cpu_residual_layernorm_forward_bf16(struct backend *be, float *res, uint16_t *out,
					       float *mean, float *rstd, const float *skip,
					       const float *bias, const float *w, const float *b,
					       int N, int C)
{
	return layernorm_rows(be, NULL, out, mean, rstd, res, skip, bias, w, b, N, C);
}

/* With xhat = (x - mean) rstd and g = w * dout:
 * dx = rstd (g - mean(g) - xhat mean(g xhat)); dw = sum_n dout xhat; db = sum_n dout.
 * dw and db over CPU_CHUNKS fixed row chunks of partials in the workspace. */
static int cpu_layernorm_backward(struct backend *be, float *dx, float *dw, float *db,
				  const float *dout, const float *x, const float *w,
				  const float *mean, const float *rstd, int N, int C,
				  int accumulate)
{
	float *partials = cpu_workspace(be, sizeof(float) * CPU_CHUNKS * 2 * (size_t)C);
	if (!partials)
		return CORE_ENOMEM;
	cpu_enter(be);
#pragma omp parallel for schedule(static)
	for (int k = 0; k < CPU_CHUNKS; k++) {
		float *pw = partials + (size_t)k * 2 * C, *pb = pw + C;
		memset(pw, 0, sizeof(float) * 2 * (size_t)C);
		int n0 = (int)((int64_t)N * k / CPU_CHUNKS);
		int n1 = (int)((int64_t)N * (k + 1) / CPU_CHUNKS);
		for (int n = n0; n < n1; n++) {
			const float *xr = x + (size_t)n * C, *dr = dout + (size_t)n * C;
			float *dxr = dx + (size_t)n * C;
			float m = mean[n], r = rstd[n];
			float sg = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : sg, sgx)
			for (int c = 0; c < C; c++) {
				float xh = (xr[c] - m) * r;
				float g = w[c] * dr[c];
				sg += g;
				sgx += g * xh;
			}
			sg /= (float)C;
			sgx /= (float)C;
			if (accumulate) {
#pragma omp simd
				for (int c = 0; c < C; c++) {
					float xh = (xr[c] - m) * r;
					dxr[c] += (w[c] * dr[c] - sg - xh * sgx) * r;
					pw[c] += dr[c] * xh;
					pb[c] += dr[c];
				}
			} else {
#pragma omp simd
				for (int c = 0; c < C; c++) {
					float xh = (xr[c] - m) * r;
					dxr[c] = (w[c] * dr[c] - sg - xh * sgx) * r;
					pw[c] += dr[c] * xh;
					pb[c] += dr[c];
				}
			}
		}
	}
	memcpy(dw, partials, sizeof(float) * (size_t)C);
	memcpy(db, partials + C, sizeof(float) * (size_t)C);
	for (int k = 1; k < CPU_CHUNKS; k++) {
		const float *pw = partials + (size_t)k * 2 * C, *pb = pw + C;
#pragma omp simd
		for (int c = 0; c < C; c++) {
			dw[c] += pw[c];
			db[c] += pb[c];
		}
	}
	return 0;
}

/* ---- activations ----------------------------------------------------------------------- */

/* pre += bias, then act into out, or rounded into out16 when it is not NULL (one loop) */
static int bias_act_rows(struct backend *be, float *pre, float *out, uint16_t *out16,
			 const float *bias, int N, int C, enum backend_act act)
{
	const struct cpu_ctx *ctx = cpu_ctx(be);
	float *ws = row_ws(be, out16, C);
	if (!ws)
		return CORE_ENOMEM;
	cpu_enter(be);
#pragma omp parallel for schedule(static) if ((int64_t)N * C >= CPU_PAR_MIN)
	for (int n = 0; n < N; n++) {
		float *p = pre + (size_t)n * C;
		float *o = out16 ? ws + (size_t)omp_get_thread_num() * C : out + (size_t)n * C;
		if (act == BACKEND_ACT_GELU) {
#pragma omp simd
			for (int c = 0; c < C; c++) {
				float x = p[c] + bias[c];
				p[c] = x;
				o[c] = x * gelu_sig(x);
			}
		} else {
#pragma omp simd
			for (int c = 0; c < C; c++) {
				float x = p[c] + bias[c];
				p[c] = x;
				o[c] = x > 0.0f ? x : 0.0f;
			}
		}
		if (out16)
			round_bf16(ctx, out16 + (size_t)n * C, o, C);
	}
	return 0;
}

static int cpu_bias_act_forward(struct backend *be, float *pre, float *out, const float *bias,
				int N, int C, enum backend_act act)
{
	return bias_act_rows(be, pre, out, NULL, bias, N, C, act);
}

static int cpu_bias_act_forward_bf16(struct backend *be, float *pre, uint16_t *out,
				     const float *bias, int N, int C, enum backend_act act)
{
	return bias_act_rows(be, pre, NULL, out, bias, N, C, act);
}

/* GELU: d/dx [x s(2u)] = s + 2 x s (1 - s) u', u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
 * The bias gradient is the column sum of the result, so threads split the columns. */
static int cpu_act_backward(struct backend *be, float *d, float *dbias, const float *x, int N,
			    int C, enum backend_act act)
{
	cpu_enter(be);
#pragma omp parallel if ((int64_t)N * C >= CPU_PAR_MIN)
	{
		int64_t s0, s1;
		thread_share(C, &s0, &s1);
		const int c0 = (int)s0, w = (int)(s1 - s0);
		float *db = dbias ? dbias + c0 : NULL;
		if (w > 0 && db)
			memset(db, 0, sizeof(float) * (size_t)w);
		for (int n = 0; w > 0 && n < N; n++) {
			float *dr = d + (size_t)n * C + c0;
			const float *xr = x + (size_t)n * C + c0;
			if (act == BACKEND_ACT_GELU) {
#pragma omp simd
				for (int c = 0; c < w; c++) {
					float v = xr[c];
					float s = gelu_sig(v);
					float du = GELU_K0 * (1.0f + 3.0f * GELU_K1 * v * v);
					dr[c] = (s + 2.0f * v * s * (1.0f - s) * du) * dr[c];
				}
			} else {
#pragma omp simd
				for (int c = 0; c < w; c++)
					dr[c] = xr[c] > 0.0f ? dr[c] : 0.0f;
			}
			if (db) {
#pragma omp simd
				for (int c = 0; c < w; c++)
					db[c] += dr[c];
			}
		}
	}
	return 0;
}

/* ---- attention ------------------------------------------------------------------------- */

/* Row i of S (already scaled) -> causal softmax over keys 0..i; keys i+1..kn-1 set to 0 so
 * that the block products that follow can run over whole blocks. */
static inline void causal_softmax_row(float *s, int i, int kn)
{
	float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
	for (int j = 0; j <= i; j++)
		mx = s[j] > mx ? s[j] : mx;
	float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
	for (int j = 0; j <= i; j++) {
		float e = exp_approx(s[j] - mx);
		s[j] = e;
		sum += e;
	}
	float inv = 1.0f / sum;
#pragma omp simd
	for (int j = 0; j <= i; j++)
		s[j] *= inv;
	for (int j = i + 1; j < kn; j++)
		s[j] = 0.0f;
}

/* Row i of dS (dP on entry) -> scale * P (dP - rowsum(P dP)) over keys 0..i, with p row i
 * of P; keys i+1..kn-1 set to 0. */
static inline void causal_softmax_backward_row(float *d, const float *p, int i, int kn,
					       float scale)
{
	float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
	for (int j = 0; j <= i; j++)
		dot += p[j] * d[j];
#pragma omp simd
	for (int j = 0; j <= i; j++)
		d[j] = p[j] * (d[j] - dot) * scale;
	for (int j = i + 1; j < kn; j++)
		d[j] = 0.0f;
}

/* dst [hs, n] (row stride T) = transpose of the n x hs block at src (row stride ld). The
 * products then run as NN, which OpenBLAS's small-matrix kernels do ~1.5x faster than NT at
 * these sizes (32 x 256 x 64: 113 vs 76 GFLOP/s). Tiles of 16 rows keep both sides in L1. */
static void transpose_block(float *dst, const float *src, int n, int hs, int ld, int T)
{
	for (int j0 = 0; j0 < n; j0 += 16) {
		int j1 = min_int(n, j0 + 16);
		for (int d = 0; d < hs; d++) {
			float *o = dst + (size_t)d * T;
#pragma omp simd
			for (int j = j0; j < j1; j++)
				o[j] = src[(size_t)j * ld + d];
		}
	}
}

/* In bf16 the products run on blocks of this many query rows, each against the keys up to
 * its end: oneDNN's AMX kernel pays per call what fp32's small-matrix kernel does not, and
 * four times ATT_BLOCK's rows measured fastest at T = 256, hs = 64 (64 and 256 within 5%). */
#ifndef ATT_BLOCK_BF16
#define ATT_BLOCK_BF16 128
#endif

/* Per thread, in the workspace. fp32: a T x T block of scores and an hs x T transposed
 * block. bf16: a dense block of scores (ATT_BLOCK_BF16 x T floats), its P and dS in
 * bfloat16 (as many bytes again), the head's q, k, v, dO in compact bfloat16 T x hs blocks
 * and its dK, dV sums in float T x hs blocks. */
static size_t attention_ws_floats(const struct cpu_ctx *ctx, int T, int hs)
{
	if (!ctx->bf16)
		return (size_t)T * T + (size_t)hs * T;
	return 2 * (size_t)ATT_BLOCK_BF16 * T + 4 * (size_t)hs * T + (size_t)ATT_BLOCK_BF16 * hs;
}

static float *attention_ws(struct backend *be, int T, int hs)
{
	return cpu_workspace(be, sizeof(float) * (size_t)be->threads *
					 attention_ws_floats(cpu_ctx(be), T, hs));
}

struct att_bf16_ws {
	float *S;                     /* [rb, kn] dense: scores, P, dP, dS of a row block */
	uint16_t *Ph, *dSh;           /* [rb, kn] compact: the block's P and dS in bf16 */
	uint16_t *qh, *kh, *vh, *doh; /* [T, hs] compact bf16 */
	float *dK, *dV;               /* [T, hs] dense: the head's dK, dV summed over blocks */
	float *O;                     /* [rb, hs] dense: a block's output, to be rounded */
};

static struct att_bf16_ws att_bf16_ws(float *ws, int T, int hs)
{
	const size_t rt = (size_t)ATT_BLOCK_BF16 * T, th = (size_t)T * hs;
	float *w = ws + (size_t)omp_get_thread_num() * (2 * rt + 4 * th + (size_t)ATT_BLOCK_BF16 * hs);
	struct att_bf16_ws a = {.S = w, .Ph = (uint16_t *)(w + rt)};
	a.dSh = a.Ph + rt;
	a.qh = a.dSh + rt;
	a.kh = a.qh + th, a.vh = a.kh + th, a.doh = a.vh + th;
	a.dK = (float *)(a.doh + th);
	a.dV = a.dK + th;
	a.O = a.dV + th;
	return a;
}

/* cpu_attention_forward in bf16. Per head, q, k and v are rounded once; per block of rows
 * r0..r0+rn against keys 0..kn: S = scale Q K^T into the dense block, each row's softmax
 * there (zero above the diagonal), written to att (zeros too, which a product run in fp32
 * for want of workspace would read) and, rounded, to the compact Ph that O = P V reads. No
 * product reads or writes a strided block but O. */
static int attention_forward_bf16(struct backend *be, float *out, uint16_t *out16, float *att,
				  const float *qkv, int B, int T, int C, int NH, float *ws)
{
	struct cpu_ctx *ctx = cpu_ctx(be);
	const int hs = C / NH, C3 = 3 * C;
	const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel
	{
		struct att_bf16_ws w = att_bf16_ws(ws, T, hs);
#pragma omp for schedule(static)
		for (int bh = 0; bh < B * NH; bh++) {
			int b = bh / NH, h = bh % NH;
			const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs;
			const float *k = q + C, *v = q + 2 * C;
			float *P = att + (size_t)bh * T * T;
			const size_t o0 = (size_t)b * T * C + (size_t)h * hs;
			ctx->blas->to_bf16(w.qh, q, T, hs, C3);
			ctx->blas->to_bf16(w.kh, k, T, hs, C3);
			ctx->blas->to_bf16(w.vh, v, T, hs, C3);
			for (int r0 = 0; r0 < T; r0 += ATT_BLOCK_BF16) {
				int rn = min_int(ATT_BLOCK_BF16, T - r0), kn = r0 + rn;
				gemm_h(ctx, 0, 1, rn, kn, hs, scale, q + (size_t)r0 * C3, C3, k,
					   C3, 0.0f, w.S, kn, w.qh + (size_t)r0 * hs, w.kh);
				for (int i = 0; i < rn; i++) {
					float *s = w.S + (size_t)i * kn;
					causal_softmax_row(s, r0 + i, kn);
					memcpy(P + (size_t)(r0 + i) * T, s, sizeof(float) * (size_t)kn);
				}
				ctx->blas->to_bf16(w.Ph, w.S, rn, kn, kn);
				/* into out, or rounded into out16 from the dense block O */
				float *o = out16 ? w.O : out + o0 + (size_t)r0 * C;
				gemm_h(ctx, 0, 0, rn, hs, kn, 1.0f, w.S, kn, v, C3, 0.0f, o,
				       out16 ? hs : C, w.Ph, w.vh);
				for (int i = 0; out16 && i < rn; i++) /* rows of out16 are C apart */
					ctx->blas->to_bf16(out16 + o0 + (size_t)(r0 + i) * C,
							   w.O + (size_t)i * hs, 1, hs, hs);
			}
		}
	}
	return 0;
}

/* Rows r0..r0+rn of dS = scale * P (dP - rowsum(P dP)) over the causal keys, from dP in the
 * dense block S (row stride kn) and P in att (row stride T); S keeps dS, and dS and P go
 * rounded to the compact dSh and Ph, zero above the diagonal. */
static void softmax_backward_bf16(struct cpu_ctx *ctx, struct att_bf16_ws *w, const float *P,
				  int r0, int rn, int kn, int T, float scale)
{
	for (int ii = 0; ii < rn; ii++) {
		int i = r0 + ii;
		const float *p = P + (size_t)i * T;
		causal_softmax_backward_row(w->S + (size_t)ii * kn, p, i, kn, scale);
		uint16_t *ph = w->Ph + (size_t)ii * kn;
		ctx->blas->to_bf16(ph, p, 1, i + 1, T);
		memset(ph + i + 1, 0, sizeof *ph * (size_t)(kn - i - 1));
	}
	ctx->blas->to_bf16(w->dSh, w->S, rn, kn, kn);
}

/* cpu_attention_backward in bf16. Per head, q, k, v and dO are rounded once; per block of
 * rows (the last first): dP = dO V^T into the dense block, dS and P rounded to compact
 * blocks, dQ = dS K, and dK += dS^T Q, dV += P^T dO over the block's keys, summed in dense
 * T x hs blocks (the last block, which reaches every key, writes them; the others add to
 * them) and copied to dqkv once. */
static int attention_backward_bf16(struct backend *be, float *dqkv, const float *dout,
				   const float *qkv, const float *att, int B, int T, int C,
				   int NH, float *ws)
{
	struct cpu_ctx *ctx = cpu_ctx(be);
	const int hs = C / NH, C3 = 3 * C;
	const float scale = 1.0f / sqrtf((float)hs);
	const int nb = (T + ATT_BLOCK_BF16 - 1) / ATT_BLOCK_BF16;
#pragma omp parallel
	{
		struct att_bf16_ws w = att_bf16_ws(ws, T, hs);
#pragma omp for schedule(static)
		for (int bh = 0; bh < B * NH; bh++) {
			int b = bh / NH, h = bh % NH;
			const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs;
			const float *k = q + C, *v = q + 2 * C;
			const float *P = att + (size_t)bh * T * T;
			const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
			float *dq = dqkv + (size_t)b * T * C3 + (size_t)h * hs;
			float *dk = dq + C, *dv = dq + 2 * C;
			ctx->blas->to_bf16(w.qh, q, T, hs, C3);
			ctx->blas->to_bf16(w.kh, k, T, hs, C3);
			ctx->blas->to_bf16(w.vh, v, T, hs, C3);
			ctx->blas->to_bf16(w.doh, dO, T, hs, C);
			for (int r = nb - 1; r >= 0; r--) {
				int r0 = r * ATT_BLOCK_BF16, rn = min_int(ATT_BLOCK_BF16, T - r0);
				int kn = r0 + rn;
				float beta = r == nb - 1 ? 0.0f : 1.0f;
				gemm_h(ctx, 0, 1, rn, kn, hs, 1.0f, dO + (size_t)r0 * C, C, v, C3,
					   0.0f, w.S, kn, w.doh + (size_t)r0 * hs, w.vh);
				softmax_backward_bf16(ctx, &w, P, r0, rn, kn, T, scale);
				gemm_h(ctx, 0, 0, rn, hs, kn, 1.0f, w.S, kn, k, C3, 0.0f,
					   dq + (size_t)r0 * C3, C3, w.dSh, w.kh);
				gemm_h(ctx, 1, 0, kn, hs, rn, 1.0f, w.S, kn, q + (size_t)r0 * C3,
					   C3, beta, w.dK, hs, w.dSh, w.qh + (size_t)r0 * hs);
				gemm_h(ctx, 1, 0, kn, hs, rn, 1.0f, P + (size_t)r0 * T, T,
					   dO + (size_t)r0 * C, C, beta, w.dV, hs, w.Ph,
					   w.doh + (size_t)r0 * hs);
			}
			for (int t = 0; t < T; t++) {
				memcpy(dk + (size_t)t * C3, w.dK + (size_t)t * hs,
				       sizeof(float) * (size_t)hs);
				memcpy(dv + (size_t)t * C3, w.dV + (size_t)t * hs,
				       sizeof(float) * (size_t)hs);
			}
		}
	}
	return 0;
}

static int cpu_attention_forward(struct backend *be, float *out, float *att, const float *qkv,
				 int B, int T, int C, int NH)
{
	struct cpu_ctx *ctx = cpu_ctx(be);
	const int hs = C / NH, C3 = 3 * C;
	const float scale = 1.0f / sqrtf((float)hs);
	float *ws = attention_ws(be, T, hs);
	if (!ws)
		return CORE_ENOMEM;
	cpu_enter(be);
	if (ctx->bf16)
		return attention_forward_bf16(be, out, NULL, att, qkv, B, T, C, NH, ws);
#pragma omp parallel
	{
		float *kt = ws + (size_t)omp_get_thread_num() * attention_ws_floats(ctx, T, hs);
#pragma omp for schedule(static)
		for (int bh = 0; bh < B * NH; bh++) {
			int b = bh / NH, h = bh % NH;
			const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs;
			const float *k = q + C, *v = q + 2 * C;
			float *P = att + (size_t)bh * T * T;
			float *o = out + (size_t)b * T * C + (size_t)h * hs;
			transpose_block(kt, k, T, hs, C3, T);
			for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
				int rn = min_int(ATT_BLOCK, T - r0), kn = r0 + rn;
				float *Pr = P + (size_t)r0 * T;
				/* S[r0.., 0..kn) = scale * Q K^T */
				gemm_call(ctx, 0, 0, rn, kn, hs, scale,
					  q + (size_t)r0 * C3, C3, kt, T, 0.0f, Pr, T);
				for (int i = 0; i < rn; i++)
					causal_softmax_row(Pr + (size_t)i * T, r0 + i, kn);
				/* O[r0..] = P V */
				gemm_call(ctx, 0, 0, rn, hs, kn, 1.0f, Pr, T, v,
					  C3, 0.0f, o + (size_t)r0 * C, C);
			}
		}
	}
	return 0;
}

/* With P = softmax(S), dP = dO V^T: dS = P (dP - rowsum(P dP)) * scale (scale folded in),
 * dQ = dS K, dK = dS^T Q, dV = P^T dO; all restricted to the causal blocks. */
static int cpu_attention_backward(struct backend *be, float *dqkv, const float *dout,
				  const float *qkv, const float *att, int B, int T, int C, int NH)
{
	struct cpu_ctx *ctx = cpu_ctx(be);
	const int hs = C / NH, C3 = 3 * C;
	const float scale = 1.0f / sqrtf((float)hs);
	float *ws = attention_ws(be, T, hs);
	if (!ws)
		return CORE_ENOMEM;
	cpu_enter(be);
	if (ctx->bf16)
		return attention_backward_bf16(be, dqkv, dout, qkv, att, B, T, C, NH, ws);
#pragma omp parallel
	{
		float *dS = ws + (size_t)omp_get_thread_num() * attention_ws_floats(ctx, T, hs);
		float *vt = dS + (size_t)T * T;
#pragma omp for schedule(static)
		for (int bh = 0; bh < B * NH; bh++) {
			int b = bh / NH, h = bh % NH;
			const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs;
			const float *k = q + C, *v = q + 2 * C;
			const float *P = att + (size_t)bh * T * T;
			const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
			float *dq = dqkv + (size_t)b * T * C3 + (size_t)h * hs;
			float *dk = dq + C, *dv = dq + 2 * C;
			transpose_block(vt, v, T, hs, C3, T);
			for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
				int rn = min_int(ATT_BLOCK, T - r0), kn = r0 + rn;
				float *dSr = dS + (size_t)r0 * T;
				gemm_call(ctx, 0, 0, rn, kn, hs, 1.0f,
					  dO + (size_t)r0 * C, C, vt, T, 0.0f, dSr, T);
				for (int ii = 0; ii < rn; ii++)
					causal_softmax_backward_row(dSr + (size_t)ii * T,
								    P + (size_t)(r0 + ii) * T,
								    r0 + ii, kn, scale);
				gemm_call(ctx, 0, 0, rn, hs, kn, 1.0f, dSr, T, k,
					  C3, 0.0f, dq + (size_t)r0 * C3, C3);
			}
			for (int c0 = 0; c0 < T; c0 += ATT_BLOCK) {
				int cn = min_int(ATT_BLOCK, T - c0), m = T - c0;
				gemm_call(ctx, 1, 0, cn, hs, m, 1.0f,
					  dS + (size_t)c0 * T + c0, T, q + (size_t)c0 * C3, C3, 0.0f,
					  dk + (size_t)c0 * C3, C3);
				gemm_call(ctx, 1, 0, cn, hs, m, 1.0f,
					  P + (size_t)c0 * T + c0, T, dO + (size_t)c0 * C, C, 0.0f,
					  dv + (size_t)c0 * C3, C3);
			}
		}
	}
	return 0;
}

/* attention_forward with out rounded to bfloat16: in bf16, each block's output rounded from
 * the dense block it is computed in; else the float op's out, rounded */
static int cpu_attention_forward_bf16(struct backend *be, uint16_t *out, float *att,
				      const float *qkv, int B, int T, int C, int NH)
{
	struct cpu_ctx *ctx = cpu_ctx(be);
	const size_t n = (size_t)B * T * C;
	if (ctx->bf16) {
		float *ws = attention_ws(be, T, C / NH);
		if (!ws)
			return CORE_ENOMEM;
		cpu_enter(be);
		return attention_forward_bf16(be, NULL, out, att, qkv, B, T, C, NH, ws);
	}
	float *f = wide_room(be, n);
	if (!f)
		return CORE_ENOMEM;
	ERR_FORWARD(cpu_attention_forward(be, f, att, qkv, B, T, C, NH));
#pragma omp parallel for schedule(static) if (n >= CPU_PAR_MIN)
	for (int64_t r = 0; r < (int64_t)B * T; r++)
		round_bf16(ctx, out + (size_t)r * C, f + (size_t)r * C, C);
	return 0;
}

/* matmul_forward of x widened from bfloat16. In bf16 the products read x as it is (the
 * blocks and bits of matmul_forward on x, which they would round to the same values); the
 * skinny loops and fp32 read it widened. */
static int cpu_matmul_forward_bf16(struct backend *be, float *y, const uint16_t *x,
				   const float *w, const float *bias, int N, int IC, int OC,
				   enum backend_wlayout layout)
{
	struct cpu_ctx *ctx = cpu_ctx(be);
	if (!ctx->bf16 || OC <= SKINNY_OC) {
		const float *xw = widen_bf16(be, x, (size_t)N * IC);
		return xw ? cpu_matmul_forward(be, y, xw, w, bias, N, IC, OC, layout) : CORE_ENOMEM;
	}
	cpu_enter(be);
	ctx->bf16_failed = 0;
	if (layout == BACKEND_W_IO)
		sgemm_bf16(be, 0, 0, N, OC, IC, 1.0f, NULL, IC, w, OC, 0.0f, y, OC, x, NULL);
	else
		sgemm_bf16(be, 0, 1, N, OC, IC, 1.0f, NULL, IC, w, IC, 0.0f, y, OC, x, NULL);
	if (ctx->bf16_failed)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the bf16 products' workspace");
	if (bias)
		add_bias(y, bias, N, OC);
	return 0;
}

/* matmul_backward of x widened from bfloat16, as matmul_forward_bf16 */
static int cpu_matmul_backward_bf16(struct backend *be, float *dx, float *dw, float *dbias,
				    const float *dy, const uint16_t *x, const float *w, int N,
				    int IC, int OC, enum backend_wlayout layout, int accumulate)
{
	struct cpu_ctx *ctx = cpu_ctx(be);
	if (!ctx->bf16 || OC <= SKINNY_OC) {
		const float *xw = dw ? widen_bf16(be, x, (size_t)N * IC) : NULL;
		if (dw && !xw)
			return CORE_ENOMEM;
		return cpu_matmul_backward(be, dx, dw, dbias, dy, xw, w, N, IC, OC, layout,
					   accumulate);
	}
	cpu_enter(be);
	ctx->bf16_failed = 0;
	if (dw && layout == BACKEND_W_IO) /* dw [IC,OC] = x^T dy */
		sgemm_bf16(be, 1, 0, IC, OC, N, 1.0f, NULL, IC, dy, OC, 0.0f, dw, OC, x, NULL);
	else if (dw) /* dw [OC,IC] = dy^T x */
		sgemm_bf16(be, 1, 0, OC, IC, N, 1.0f, dy, OC, NULL, IC, 0.0f, dw, IC, NULL, x);
	if (ctx->bf16_failed)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the bf16 products' workspace");
	/* dbias and dx do not read x */
	return cpu_matmul_backward(be, dx, NULL, dbias, dy, NULL, w, N, IC, OC, layout,
				   accumulate);
}

/* ---- softmax cross-entropy ------------------------------------------------------------- */

static int cpu_crossentropy_forward(struct backend *be, float *probs, float *losses,
				    const int32_t *targets, int N, int V)
{
	cpu_enter(be);
#pragma omp parallel for schedule(static)
	for (int n = 0; n < N; n++) {
		float *p = probs + (size_t)n * V;
		float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
		for (int j = 0; j < V; j++)
			mx = p[j] > mx ? p[j] : mx;
		float tl = targets ? p[targets[n]] : 0.0f;
		float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
		for (int j = 0; j < V; j++) {
			float e = exp_approx(p[j] - mx);
			p[j] = e;
			sum += e;
		}
		float inv = 1.0f / sum;
#pragma omp simd
		for (int j = 0; j < V; j++)
			p[j] *= inv;
		if (targets) /* -log softmax = log(sum) - (logit - max) */
			losses[n] = logf(sum) - (tl - mx);
	}
	return 0;
}

static int cpu_crossentropy_backward(struct backend *be, float *probs, const int32_t *targets,
				     int N, int V, float scale)
{
	cpu_enter(be);
#pragma omp parallel for schedule(static)
	for (int n = 0; n < N; n++) {
		float *p = probs + (size_t)n * V;
#pragma omp simd
		for (int j = 0; j < V; j++)
			p[j] *= scale;
		p[targets[n]] -= scale;
	}
	return 0;
}

static const struct backend_ops cpu_ops = {
	.close = cpu_close,
	.alloc = cpu_alloc,
	.free = cpu_free,
	.upload = cpu_copy,
	.download = cpu_copy,
	.copy = cpu_copy,
	.copy_2d = cpu_copy_2d,
	.memset = cpu_memset,
	.sync = cpu_sync,
	.workspace_bytes = cpu_workspace_bytes,
	.fill = cpu_fill,
	.add_f32 = cpu_add_f32,
	.fill_normal = cpu_fill_normal,
	.sum = cpu_sum,
	.gemm = cpu_gemm,
	.matmul_forward = cpu_matmul_forward,
	.matmul_backward = cpu_matmul_backward,
	.encoder_forward = cpu_encoder_forward,
	.encoder_backward = cpu_encoder_backward,
	.layernorm_forward = cpu_layernorm_forward,
	.residual_layernorm_forward = cpu_residual_layernorm_forward,
	.layernorm_backward = cpu_layernorm_backward,
	.bias_act_forward = cpu_bias_act_forward,
	.act_backward = cpu_act_backward,
	.attention_forward = cpu_attention_forward,
	.attention_backward = cpu_attention_backward,
	.layernorm_forward_bf16 = cpu_layernorm_forward_bf16,
	.residual_layernorm_forward_bf16 = cpu_residual_layernorm_forward_bf16,
	.bias_act_forward_bf16 = cpu_bias_act_forward_bf16,
	.attention_forward_bf16 = cpu_attention_forward_bf16,
	.matmul_forward_bf16 = cpu_matmul_forward_bf16,
	.matmul_backward_bf16 = cpu_matmul_backward_bf16,
	.crossentropy_forward = cpu_crossentropy_forward,
	.crossentropy_backward = cpu_crossentropy_backward,
	.adamw_update = cpu_adamw_update,
	.moe_gate_forward = cpu_moe_gate_forward,
	.moe_gate_backward = cpu_moe_gate_backward,
	.moe_count = cpu_moe_count,
	.moe_locations = cpu_moe_locations,
	.moe_encode = cpu_moe_encode,
	.moe_decode = cpu_moe_decode,
	.moe_decode_backward = cpu_moe_decode_backward,
	.moe_encode_backward = cpu_moe_encode_backward,
	.moe_encode_bf16 = cpu_moe_encode_bf16,
	.moe_decode_bf16 = cpu_moe_decode_bf16,
	.moe_decode_backward_bf16 = cpu_moe_decode_backward_bf16,
	.moe_encode_backward_bf16 = cpu_moe_encode_backward_bf16,
	.profile = cpu_profile,
	.gemm_seconds = cpu_gemm_seconds,
};

/* Flush-to-zero and denormals-are-zero on the calling thread: a float below 2^-126 that an
 * operation produces becomes zero (FTZ), and one it reads counts as zero (DAZ). On x86 an
 * operation that meets a subnormal takes a microcode assist of ~100 cycles; training meets
 * them more as it goes (softmax probabilities of bytes that never occur, their gradients
 * through the head's products), and on an Intel Xeon six steps from a phase-3 DiPaCo path ran
 * at a third of the speed of six from initialisation (MACHINE.md). */
static void flush_subnormals(void)
{
#if defined(__x86_64__) || defined(__i386__)
	_mm_setcsr(_mm_getcsr() | 0x8040); /* FTZ (bit 15), DAZ (bit 6) */
#endif
}

int backend_cpu_init(struct backend *be, const struct backend_params *params)
{
	const struct cpu_blas *blas;
	ERR_FORWARD(cpu_blas_get(&blas));
	struct cpu_ctx *c = calloc(1, sizeof *c);
	if (!c)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the cpu backend");
	if (be->precision == BACKEND_BF16 && !blas->gemm_bf16) {
		free(c);
		return err_set(CORE_EUSAGE, NULL, "device 'cpu' has no bf16 matrix products "
			       "here: %s", blas->why_no_bf16);
	}
	c->blas = blas;
	c->bf16 = be->precision == BACKEND_BF16;
	/* The thread count the process started with (OMP_NUM_THREADS, else every core), read
	 * before any backend changes it. */
	static int initial_threads;
	if (!initial_threads)
		initial_threads = omp_get_max_threads();
	const int threads = params->threads > 0 ? params->threads : initial_threads;
	omp_set_num_threads(threads);
	/* Subnormals flushed on every thread that computes: this one, and each of OpenMP's
	 * pool (its threads keep their MXCSR from region to region; threads it adds later
	 * start from their creator's, which is this one or one of them). The libraries' sgemm
	 * runs on our threads (one per block, sgemm() below), never on threads of its own. */
	flush_subnormals();
#pragma omp parallel num_threads(threads)
	flush_subnormals();
	be->op = &cpu_ops;
	be->host_visible = 1;
	be->attention_keeps_p = 1;
	be->threads = threads;
	be->gemm_kernel = blas->kernel;
	be->ctx = c;
	return 0;
}
