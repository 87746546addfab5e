/* backend_cuda.cu - the CUDA backend: lib/backend/backend.h's table on one NVIDIA GPU.
 *
 * Memory is cudaMalloc'd device memory (host_visible 0); every op is queued on the backend's
 * stream in call order and returns at once, so errors of a kernel's execution surface at the
 * next sync or download (backend.h allows this). Matrix products go to cuBLAS in the precision
 * the backend was opened with (backend.h): plain fp32 by default (no TF32: the results are
 * compared with the CPU's to 1e-3 over a training run), TF32 compute, or bfloat16 copies of
 * both operands (rounded by a kernel of this file into a workspace of their own) multiplied
 * into fp32; everything else is a kernel of this file or of moe.cu (the MoE ops), in fp32
 * whatever the precision.
 *
 * Determinism (backend.h): no float atomics. A reduction over rows (a bias gradient, the
 * layernorm weight gradients) is split into fixed chunks of rows whose partial sums are added
 * in chunk order; a row reduction (layernorm, softmax) is one warp's or one block's fixed
 * shuffle tree. cuBLAS gives the same bits for the same call on the same GPU; since it may
 * pick another kernel for a pointer that is not 16-byte aligned, gemm stages such operands
 * through aligned workspace, so a product does not depend on where its operands sit.
 *
 * Attention is the cuBLAS formulation (llm.c's "attention_forward3" family, and PyTorch's
 * unfused path): q, k, v permuted to [B, NH, T, hs], S = q k^T / sqrt(hs) as one strided-batched
 * product, a causal softmax that writes P below the diagonal and zeros above it into att, then
 * P v; the backward is three more batched products and a softmax backward. That is the default.
 *
 * Environment: CORE_CUDA_ATTENTION selects the attention, read once when the backend opens:
 *   cublas  the formulation above (the default, and what an empty value means);
 *   fused   attention.cu's flash-attention-style kernels where hs <= 128 (the cuBLAS path for
 *           larger heads); att then holds the forward's logsumexp (and output when T > hs),
 *           not P, and backend->attention_keeps_p is 0. They compute in fp32: with
 *           precision tf32 or bf16 attention stays the cuBLAS formulation, its products
 *           rounded like every other.
 * Any other value makes backend_open fail with CORE_EUSAGE naming the variable and the value.
 */
#include <cub/cub.cuh>
#include <cuda_bf16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

extern "C" {
#include "common/rng.h"
int backend_cuda_init(struct backend *be, const struct backend_params *params);
}

/* ---- errors, workspace, timing ---------------------------------------------------------- */

static int blas_fail(cublasStatus_t s, const char *what)
{
	if (s == CUBLAS_STATUS_SUCCESS)
		return 0;
	return err_set(s == CUBLAS_STATUS_ALLOC_FAILED ? CORE_ENOMEM : CORE_EIO, NULL,
		       "cublas: %s: %s", what, cublasGetStatusString(s));
}

/* *buf (of *have bytes) grown to at least bytes, by half again so that a slowly growing
 * demand does not reallocate often; the stream is drained before the old one goes. */
static int grow(struct cuda_ctx *c, void **buf, size_t *have, size_t bytes, const char *what)
{
	if (bytes <= *have)
		return 0;
	size_t want = bytes + bytes / 2;
	if (*buf) {
		CUDA_TRY(cudaStreamSynchronize(c->stream), "workspace: waiting for the stream");
		cudaFree(*buf);
		*buf = NULL;
		*have = 0;
	}
	CUDA_TRY(cudaMalloc(buf, want), what);
	*have = want;
	return 0;
}

int cuda_workspace(struct cuda_ctx *c, size_t bytes, void **out)
{
	ERR_FORWARD(grow(c, &c->ws, &c->ws_bytes, bytes, "workspace allocation"));
	*out = c->ws;
	return 0;
}

/* Fold the timed products that have finished (all of them, waiting, when wait) into
 * gemm_s. Events complete in stream order, so the ring is read from its oldest pair. */
static void gemm_timing_drain(struct cuda_ctx *c, int wait)
{
	while (c->ev_n > 0) {
		cudaEvent_t *e = c->ev[c->ev_head];
		if (wait)
			cudaEventSynchronize(e[1]);
		else if (cudaEventQuery(e[1]) != cudaSuccess)
			break;
		float ms = 0.0f;
		if (cudaEventElapsedTime(&ms, e[0], e[1]) == cudaSuccess)
			c->gemm_s += 1e-3 * ms;
		c->ev_head = (c->ev_head + 1) % CUDA_EV_RING;
		c->ev_n--;
	}
}

/* The event pair to record around the next product, or NULL when not profiling. */
static cudaEvent_t *gemm_timing_begin(struct cuda_ctx *c)
{
	if (!c->profiling)
		return NULL;
	gemm_timing_drain(c, 0);
	if (c->ev_n == CUDA_EV_RING) { /* full: wait for the oldest */
		cudaEventSynchronize(c->ev[c->ev_head][1]);
		gemm_timing_drain(c, 0);
	}
	cudaEvent_t *e = c->ev[(c->ev_head + c->ev_n) % CUDA_EV_RING];
	cudaEventRecord(e[0], c->stream);
	return e;
}

static void gemm_timing_end(struct cuda_ctx *c, cudaEvent_t *e)
{
	if (!e)
		return;
	cudaEventRecord(e[1], c->stream);
	c->ev_n++;
}

/* ---- lifetime and memory ---------------------------------------------------------------- */

static void cu_close(struct backend *be)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	if (!c)
		return;
	cudaStreamSynchronize(c->stream);
	if (c->side) {
		cudaStreamSynchronize(c->side);
		for (int i = 0; i < BACKEND_SIDE_MARKS; i++)
			cudaEventDestroy(c->marks[i]);
		cudaEventDestroy(c->fork);
		cudaStreamDestroy(c->side);
	}
	if (c->ev_made)
		for (int i = 0; i < CUDA_EV_RING; i++)
			for (int j = 0; j < 2; j++)
				cudaEventDestroy(c->ev[i][j]);
	if (c->ws)
		cudaFree(c->ws);
	if (c->lp)
		cudaFree(c->lp);
	cublasDestroy(c->blas);
	cudaStreamDestroy(c->stream);
	free(c);
	be->ctx = NULL;
}

static int cu_alloc(struct backend *be, void **ptr, size_t bytes)
{
	*ptr = NULL;
	/* cudaMalloc gives 256-byte aligned memory; a zero-byte request still gets a pointer */
	cudaError_t e = cudaMalloc(ptr, bytes ? bytes : 256);
	if (e != cudaSuccess) {
		*ptr = NULL;
		return err_set(CORE_ENOMEM, NULL, "cuda: cannot allocate %zu bytes of device memory: "
			       "%s", bytes, cudaGetErrorString(e));
	}
	return 0;
}

static void cu_free(struct backend *be, void *ptr)
{
	if (ptr)
		cudaFree(ptr); /* waits for the device: no queued op still reads it */
}

/* The main queue waits for everything queued on the second one (upload, download), when it
 * does not already. */
static int join_side(struct cuda_ctx *c)
{
	if (!c->unjoined)
		return 0;
	CUDA_TRY(cudaEventRecord(c->fork, c->side), "joining the second queue");
	CUDA_TRY(cudaStreamWaitEvent(c->stream, c->fork, 0), "joining the second queue");
	c->unjoined = 0;
	return 0;
}

static int cu_upload(struct backend *be, void *dst, const void *src, size_t bytes)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	if (!bytes)
		return 0;
	ERR_FORWARD(join_side(c));
	CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream), "upload");
	/* the host buffer is the caller's again when upload returns */
	CUDA_TRY(cudaStreamSynchronize(c->stream), "upload");
	return 0;
}

static int cu_download(struct backend *be, void *dst, const void *src, size_t bytes)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	ERR_FORWARD(join_side(c));
	if (bytes)
		CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream),
			 "download");
	CUDA_TRY(cudaStreamSynchronize(c->stream), "download (or an op queued before it)");
	return 0;
}

static int cu_copy(struct backend *be, void *dst, const void *src, size_t bytes)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	if (bytes)
		CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
					 cuda_xfer_stream(c)), "copy");
	return 0;
}

/* cudaMemcpy2DAsync takes pitches up to the device's maximum pitch (2^31 - 1 on the GPUs we
 * know); beyond it, one copy per row. */
static int cu_copy_2d(struct backend *be, void *dst, size_t dpitch, const void *src,
		      size_t spitch, size_t width, size_t rows)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	if (!width || !rows)
		return 0;
	if (rows == 1 || (dpitch == width && spitch == width)) {
		CUDA_TRY(cudaMemcpyAsync(dst, src, width * rows, cudaMemcpyDeviceToDevice,
					 cuda_xfer_stream(c)), "copy_2d");
		return 0;
	}
	if (dpitch <= INT32_MAX && spitch <= INT32_MAX) {
		CUDA_TRY(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows,
					   cudaMemcpyDeviceToDevice, cuda_xfer_stream(c)),
			 "copy_2d");
		return 0;
	}
	for (size_t i = 0; i < rows; i++)
		CUDA_TRY(cudaMemcpyAsync((char *)dst + i * dpitch, (const char *)src + i * spitch,
					 width, cudaMemcpyDeviceToDevice, cuda_xfer_stream(c)),
			 "copy_2d");
	return 0;
}

static int cu_memset(struct backend *be, void *dst, int byte, size_t bytes)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	if (bytes)
		CUDA_TRY(cudaMemsetAsync(dst, byte, bytes, cuda_xfer_stream(c)), "memset");
	return 0;
}

static int cu_sync(struct backend *be)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	CUDA_TRY(cudaStreamSynchronize(c->stream), "an op queued on the device");
	if (c->side)
		CUDA_TRY(cudaStreamSynchronize(c->side), "a transfer queued on the device");
	c->unjoined = 0;
	return 0;
}

/* ---- the second queue (backend.h) ---- */

static int cu_side_begin(struct backend *be)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	if (c->on_side)
		return err_set(CORE_EUSAGE, NULL, "side_begin twice without side_end");
	if (!c->side) {
		/* the greatest priority: a transfer's blocks go before the products' waiting ones */
		int least = 0, greatest = 0;
		CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest),
			 "creating the second stream");
		CUDA_TRY(cudaStreamCreateWithPriority(&c->side, cudaStreamNonBlocking, greatest),
			 "creating the second stream");
		int made = 0, fork = 0;
		cudaError_t e = cudaEventCreateWithFlags(&c->fork, cudaEventDisableTiming);
		fork = e == cudaSuccess;
		while (e == cudaSuccess && made < BACKEND_SIDE_MARKS &&
		       (e = cudaEventCreateWithFlags(&c->marks[made], cudaEventDisableTiming)) ==
			       cudaSuccess)
			made++;
		if (e != cudaSuccess) { /* only what was made */
			while (made-- > 0)
				cudaEventDestroy(c->marks[made]);
			if (fork)
				cudaEventDestroy(c->fork);
			cudaStreamDestroy(c->side);
			c->side = NULL;
			return cuda_fail(e, "creating the second stream's events");
		}
	}
	CUDA_TRY(cudaEventRecord(c->fork, c->stream), "side_begin");
	CUDA_TRY(cudaStreamWaitEvent(c->side, c->fork, 0), "side_begin");
	c->on_side = 1;
	return 0;
}

static int cu_side_end(struct backend *be, int64_t *mark)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	if (!c->on_side)
		return err_set(CORE_EUSAGE, NULL, "side_end without side_begin");
	c->on_side = 0;
	CUDA_TRY(cudaEventRecord(c->marks[c->nmarks % BACKEND_SIDE_MARKS], c->side), "side_end");
	if (mark)
		*mark = c->nmarks;
	c->nmarks++;
	c->unjoined = 1;
	return 0;
}

static int cu_side_wait(struct backend *be, int64_t mark)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	if (mark < 0 || mark >= c->nmarks)
		return err_set(CORE_EUSAGE, NULL, "side_wait for mark %lld: %lld made so far",
			       (long long)mark, (long long)c->nmarks);
	CUDA_TRY(cudaStreamWaitEvent(c->stream, c->marks[mark % BACKEND_SIDE_MARKS], 0),
		 "side_wait");
	if (mark == c->nmarks - 1) /* the newest: every transfer so far */
		c->unjoined = 0;
	return 0;
}

static size_t cu_workspace_bytes(struct backend *be)
{
	return cuda_ctx_of(be)->ws_bytes;
}

/* ---- fills and reductions --------------------------------------------------------------- */

__global__ void k_fill(float *x, size_t n, float v)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		x[i] = v;
}

static int cu_fill(struct backend *be, float *x, size_t n, float value)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	if (!n)
		return 0;
	CUDA_LAUNCH(k_fill, cuda_grid(c, n, 256), 256, 0, c->stream, x, n, value);
	CUDA_LAUNCHED("fill");
	return 0;
}

__global__ void k_add_f32(float *y, const float *x, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		y[i] = __fadd_rn(y[i], x[i]); /* never fused with anything: the CPU's bits */
}

static int cu_add_f32(struct backend *be, float *y, const float *x, size_t n)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	if (!n)
		return 0;
	CUDA_LAUNCH(k_add_f32, cuda_grid(c, n, 256), 256, 0, c->stream, y, x, n);
	CUDA_LAUNCHED("add_f32");
	return 0;
}

/* Drawn on the host by the one generator every backend shares (common/rng.h), so the bits are
 * the CPU's: a parameter initialisation, once per run, not a hot path. */
static int cu_fill_normal(struct backend *be, float *x, size_t n, float mean, float std,
			  uint64_t seed, uint64_t stream, uint64_t base)
{
	if (!n)
		return 0;
	float *h = (float *)malloc(sizeof(float) * n);
	if (!h)
		return err_set(CORE_ENOMEM, NULL, "cuda: fill_normal: cannot allocate %zu host "
			       "floats", n);
	rng_fill_normal(h, (int64_t)n, mean, std, seed, stream, base);
	int rc = cu_upload(be, x, h, sizeof(float) * n);
	free(h);
	return rc;
}

/* Sum in double: SUM_BLOCKS fixed ranges (a function of n alone), each a block's fixed tree,
 * then one block adds the partials in a fixed tree. */
#define SUM_THREADS 256
#define SUM_BLOCKS 512

__device__ __forceinline__ double block_sum_d(double v, double *sh)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_down_sync(0xffffffffu, v, o);
	int w = threadIdx.x / 32, l = threadIdx.x % 32;
	if (l == 0)
		sh[w] = v;
	__syncthreads();
	v = threadIdx.x < blockDim.x / 32 ? sh[threadIdx.x] : 0.0;
	if (w == 0)
		for (int o = 16; o > 0; o >>= 1)
			v += __shfl_down_sync(0xffffffffu, v, o);
	__syncthreads();
	return v; /* in thread 0 */
}

__global__ void k_sum_partial(double *part, const float *x, size_t n, size_t per, int squares)
{
	__shared__ double sh[32];
	size_t lo = blockIdx.x * per, hi = lo + per < n ? lo + per : n;
	double s = 0.0;
	for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
		double v = x[i];
		s += squares ? v * v : v;
	}
	s = block_sum_d(s, sh);
	if (threadIdx.x == 0)
		part[blockIdx.x] = s;
}

__global__ void k_sum_final(double *out, const double *part, int np)
{
	__shared__ double sh[32];
	double s = 0.0;
	for (int i = threadIdx.x; i < np; i += blockDim.x)
		s += part[i];
	s = block_sum_d(s, sh);
	if (threadIdx.x == 0)
		*out = s;
}

static int cu_sum(struct backend *be, double *out, const float *x, size_t n, int squares)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	size_t per = (n + SUM_BLOCKS - 1) / SUM_BLOCKS;
	per = per < 1 ? 1 : per;
	int np = (int)((n + per - 1) / per);
	np = np < 1 ? 1 : np;
	void *ws;
	ERR_FORWARD(cuda_workspace(c, sizeof(double) * np, &ws));
	CUDA_LAUNCH(k_sum_partial, np, SUM_THREADS, 0, c->stream, (double *)ws, x, n, per, squares);
	CUDA_LAUNCHED("sum");
	CUDA_LAUNCH(k_sum_final, 1, SUM_THREADS, 0, c->stream, out, (const double *)ws, np);
	CUDA_LAUNCHED("sum");
	return 0;
}

/* ---- matrix products -------------------------------------------------------------------- */

/* Elements a row-major operand of rows x cols with leading dimension ld spans. */
static size_t span(int rows, int cols, int ld)
{
	return rows && cols ? (size_t)(rows - 1) * (size_t)ld + (size_t)cols : 0;
}

/* dst[i] = src[i] rounded to bfloat16 (to nearest, ties to even: __float2bfloat16_rn). */
__global__ void k_to_bf16(__nv_bfloat16 *dst, const float *src, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		dst[i] = __float2bfloat16_rn(src[i]);
}

/* The bfloat16 copy of a (batched) operand: the whole range it spans, gaps included (the
 * product reads the copy with the operand's own leading dimension and stride). *out is
 * taken from c->lp at byte offset *off. */
static int to_bf16(struct cuda_ctx *c, const float *x, size_t n, size_t *off,
		   const __nv_bfloat16 **out)
{
	__nv_bfloat16 *d = (__nv_bfloat16 *)((char *)c->lp + *off);
	*off += cuda_ws_round(2 * n);
	*out = d;
	if (n)
		CUDA_LAUNCH(k_to_bf16, cuda_grid(c, n, 256), 256, 0, c->stream, d, x, n);
	CUDA_LAUNCHED("gemm: rounding to bfloat16");
	return 0;
}

/* c->lp of at least bytes. */
static int lp_workspace(struct cuda_ctx *c, size_t bytes)
{
	return grow(c, &c->lp, &c->lp_bytes, bytes, "bfloat16 workspace allocation");
}

/* Row-major C = alpha op(A) op(B) + beta C as cuBLAS's column-major C^T = op(B)^T op(A)^T,
 * batched with strides (batch 1: a plain product), in the backend's precision (backend.h):
 * fp32 is cublasSgemm; tf32 the same product with TF32 compute (cuBLAS rounds the operands);
 * bf16 rounds both operands into c->lp first (counted in the product's time: it is part of
 * its cost) and multiplies the bfloat16 copies into float32 C. */
static int sgemm_rm(struct cuda_ctx *c, int ta, int tb, int M, int N, int K, float alpha,
		    const float *A, int lda, long long sA, const float *B, int ldb, long long sB,
		    float beta, float *C, int ldc, long long sC, int batch)
{
	cudaEvent_t *ev = gemm_timing_begin(c);
	cublasOperation_t opA = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opB = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	cublasStatus_t s;
	if (c->precision == BACKEND_FP32) {
		if (batch == 1)
			s = cublasSgemm(c->blas, opB, opA, N, M, K, &alpha, B, ldb, A, lda, &beta, C,
					ldc);
		else
			s = cublasSgemmStridedBatched(c->blas, opB, opA, N, M, K, &alpha, B, ldb, sB,
						      A, lda, sA, &beta, C, ldc, sC, batch);
	} else if (c->precision == BACKEND_TF32) {
		s = cublasGemmStridedBatchedEx(c->blas, opB, opA, N, M, K, &alpha, B, CUDA_R_32F,
					       ldb, sB, A, CUDA_R_32F, lda, sA, &beta, C,
					       CUDA_R_32F, ldc, sC, batch,
					       CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
	} else {
		/* alpha == 0 or K == 0: cuBLAS reads neither operand, so neither is rounded */
		int read = alpha != 0.0f && K > 0;
		size_t nA = read ? (size_t)(batch - 1) * (size_t)sA +
				   (ta ? span(K, M, lda) : span(M, K, lda)) : 0;
		size_t nB = read ? (size_t)(batch - 1) * (size_t)sB +
				   (tb ? span(N, K, ldb) : span(K, N, ldb)) : 0;
		size_t off = 0;
		const __nv_bfloat16 *a = NULL, *b = NULL;
		ERR_FORWARD(lp_workspace(c, cuda_ws_round(2 * nA) + cuda_ws_round(2 * nB) + 256));
		ERR_FORWARD(to_bf16(c, A, nA, &off, &a));
		ERR_FORWARD(to_bf16(c, B, nB, &off, &b));
		if (!read) /* a valid address all the same */
			a = b = (const __nv_bfloat16 *)c->lp;
		s = cublasGemmStridedBatchedEx(c->blas, opB, opA, N, M, K, &alpha, b, CUDA_R_16BF,
					       ldb, sB, a, CUDA_R_16BF, lda, sA, &beta, C,
					       CUDA_R_32F, ldc, sC, batch, CUBLAS_COMPUTE_32F,
					       CUBLAS_GEMM_DEFAULT);
	}
	gemm_timing_end(c, ev);
	return blas_fail(s, "sgemm");
}

static int aligned16(const void *p)
{
	return ((uintptr_t)p & 15) == 0;
}

static int cu_gemm(struct backend *be, int transA, int transB, int M, int N, int K, float alpha,
		   const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	if (M == 0 || N == 0)
		return 0;
	if (K == 0) { /* C = beta C: cuBLAS would do the same; kept explicit */
		if (beta == 0.0f) {
			for (int i = 0; i < M; i++)
				CUDA_TRY(cudaMemsetAsync(C + (size_t)i * ldc, 0, sizeof(float) * N,
							 c->stream), "gemm");
			return 0;
		}
	}
	if (aligned16(A) && aligned16(B) && aligned16(C))
		return sgemm_rm(c, transA, transB, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C,
				ldc, 0, 1);
	/* stage through aligned workspace with the same leading dimensions (module comment) */
	size_t nA = transA ? span(K, M, lda) : span(M, K, lda);
	size_t nB = transB ? span(N, K, ldb) : span(K, N, ldb);
	size_t nC = span(M, N, ldc);
	void *ws;
	ERR_FORWARD(cuda_workspace(c, cuda_ws_round(4 * nA) + cuda_ws_round(4 * nB) +
				   cuda_ws_round(4 * nC), &ws));
	char *p = (char *)ws;
	float *a = (float *)cuda_ws_take(&p, 4 * nA), *b = (float *)cuda_ws_take(&p, 4 * nB);
	float *cc = (float *)cuda_ws_take(&p, 4 * nC);
	CUDA_TRY(cudaMemcpyAsync(a, A, 4 * nA, cudaMemcpyDeviceToDevice, c->stream), "gemm");
	CUDA_TRY(cudaMemcpyAsync(b, B, 4 * nB, cudaMemcpyDeviceToDevice, c->stream), "gemm");
	/* the gaps between C's rows must come back as they were: copy the whole span in */
	CUDA_TRY(cudaMemcpyAsync(cc, C, 4 * nC, cudaMemcpyDeviceToDevice, c->stream), "gemm");
	ERR_FORWARD(sgemm_rm(c, transA, transB, M, N, K, alpha, a, lda, 0, b, ldb, 0, beta, cc,
			     ldc, 0, 1));
	CUDA_TRY(cudaMemcpyAsync(C, cc, 4 * nC, cudaMemcpyDeviceToDevice, c->stream), "gemm");
	return 0;
}

/* Elementwise kernels over [rows, cols] go row by row (a block per row, grid-stride), the
 * threads along the row: no division per element, which at HBM speed would cost more than
 * the memory traffic. */
#define ROWS_GRID(c, rows) ((unsigned)((rows) < (size_t)(c)->sms * 16 ? (rows) : (size_t)(c)->sms * 16))

/* y[n, :] += bias. */
__global__ void k_add_bias(float *y, const float *bias, size_t N, int OC)
{
	for (size_t n = blockIdx.x; n < N; n += gridDim.x)
		for (int c = threadIdx.x; c < OC; c += blockDim.x)
			y[n * OC + c] += bias[c];
}

static int cu_matmul_forward(struct backend *be, float *y, const float *x, const float *w,
			     const float *bias, int N, int IC, int OC, enum backend_wlayout layout)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	ERR_FORWARD(cu_gemm(be, 0, layout == BACKEND_W_OI, N, OC, IC, 1.0f, x, IC, w,
			    layout == BACKEND_W_OI ? IC : OC, 0.0f, y, OC));
	if (bias && N && OC) {
		CUDA_LAUNCH(k_add_bias, ROWS_GRID(c, (size_t)N), 256, 0, c->stream, y, bias,
			    (size_t)N, OC);
		CUDA_LAUNCHED("matmul_forward bias");
	}
	return 0;
}

/* Column sums of a [N, C] array with a fixed split: chunk j of COLSUM_ROWS rows gives
 * part[j, c] (a float loop down the rows), then the chunks are added in order. f selects what
 * is summed: 0 the array itself, 1 dout * xhat of a layernorm (x, mean, rstd given). */
#define COLSUM_ROWS 64

__global__ void k_colsum_part(float *part, const float *a, int N, int C)
{
	int c = blockIdx.y * blockDim.x + threadIdx.x;
	if (c >= C)
		return;
	int lo = blockIdx.x * COLSUM_ROWS, hi = min(lo + COLSUM_ROWS, N);
	float s = 0.0f;
	for (int n = lo; n < hi; n++)
		s += a[(size_t)n * C + c];
	part[(size_t)blockIdx.x * C + c] = s;
}

__global__ void k_colsum_final(float *out, const float *part, int nchunk, int C)
{
	int c = blockIdx.x * blockDim.x + threadIdx.x;
	if (c >= C)
		return;
	float s = 0.0f;
	for (int j = 0; j < nchunk; j++)
		s += part[(size_t)j * C + c];
	out[c] = s;
}

/* out[C] = column sums of a[N, C], through workspace part (nchunk * C floats). */
static int colsum(struct cuda_ctx *c, float *out, const float *a, int N, int C, float *part)
{
	int nchunk = (N + COLSUM_ROWS - 1) / COLSUM_ROWS;
	if (nchunk == 0) {
		CUDA_TRY(cudaMemsetAsync(out, 0, sizeof(float) * C, c->stream), "column sums");
		return 0;
	}
	dim3 grid(nchunk, (C + 127) / 128);
	CUDA_LAUNCH(k_colsum_part, grid, 128, 0, c->stream, part, a, N, C);
	CUDA_LAUNCHED("column sums");
	CUDA_LAUNCH(k_colsum_final, (C + 127) / 128, 128, 0, c->stream, out, part, nchunk, C);
	CUDA_LAUNCHED("column sums");
	return 0;
}

static size_t colsum_ws(int N, int C)
{
	return cuda_ws_round(sizeof(float) * (size_t)((N + COLSUM_ROWS - 1) / COLSUM_ROWS) * C);
}

static int cu_matmul_backward(struct backend *be, float *dx, float *dw, float *dbias,
			      const float *dy, const float *x, const float *w, int N, int IC,
			      int OC, enum backend_wlayout layout, int accumulate)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	if (dw) {
		if (layout == BACKEND_W_IO) /* dw[IC, OC] = x^T dy */
			ERR_FORWARD(cu_gemm(be, 1, 0, IC, OC, N, 1.0f, x, IC, dy, OC, 0.0f, dw, OC));
		else /* dw[OC, IC] = dy^T x */
			ERR_FORWARD(cu_gemm(be, 1, 0, OC, IC, N, 1.0f, dy, OC, x, IC, 0.0f, dw, IC));
	}
	if (dbias) {
		void *ws;
		ERR_FORWARD(cuda_workspace(c, colsum_ws(N, OC), &ws));
		ERR_FORWARD(colsum(c, dbias, dy, N, OC, (float *)ws));
	}
	if (dx) { /* dx[N, IC] (+)= dy w^T */
		if (layout == BACKEND_W_IO)
			ERR_FORWARD(cu_gemm(be, 0, 1, N, IC, OC, 1.0f, dy, OC, w, OC,
					    accumulate ? 1.0f : 0.0f, dx, IC));
		else
			ERR_FORWARD(cu_gemm(be, 0, 0, N, IC, OC, 1.0f, dy, OC, w, IC,
					    accumulate ? 1.0f : 0.0f, dx, IC));
	}
	return 0;
}

/* ---- GPT-2: embeddings ------------------------------------------------------------------ */

__global__ void k_encoder_forward(float *out, const int32_t *tok, const float *wte,
				  const float *wpe, int B, int T, int C)
{
	for (size_t bt = blockIdx.x; bt < (size_t)B * T; bt += gridDim.x) {
		const float *e = wte + (size_t)tok[bt] * C, *p = wpe + (bt % T) * C;
		for (int c = threadIdx.x; c < C; c += blockDim.x)
			out[bt * C + c] = e[c] + p[c];
	}
}

static int cu_encoder_forward(struct backend *be, float *out, const int32_t *tok,
			      const float *wte, const float *wpe, int B, int T, int C)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	size_t n = (size_t)B * T * C;
	if (!n)
		return 0;
	CUDA_LAUNCH(k_encoder_forward, ROWS_GRID(c, (size_t)B * T), 256, 0, c->stream, out, tok,
		    wte, wpe, B, T, C);
	CUDA_LAUNCHED("encoder_forward");
	return 0;
}

__global__ void k_iota(int32_t *x, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		x[i] = i;
}

/* first[v] = the first index of v in the sorted keys, or -1. */
__global__ void k_group_starts(int32_t *first, const int32_t *keys, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n && (i == 0 || keys[i] != keys[i - 1]))
		first[keys[i]] = i;
}

/* dwte[v, c] = sum, in token order, of dout[pos, c] over the positions of v (sorted by a
 * stable radix sort, so in order within v). */
__global__ void k_wte_backward(float *dwte, const float *dout, const int32_t *keys,
			       const int32_t *pos, const int32_t *first, int n, int V, int C)
{
	int c = blockIdx.y * blockDim.x + threadIdx.x, v = blockIdx.x;
	if (c >= C)
		return;
	float s = 0.0f;
	for (int i = first[v]; i >= 0 && i < n && keys[i] == v; i++)
		s += dout[(size_t)pos[i] * C + c];
	dwte[(size_t)v * C + c] = s;
}

__global__ void k_wpe_backward(float *dwpe, const float *dout, int B, int T, int C)
{
	int c = blockIdx.y * blockDim.x + threadIdx.x, t = blockIdx.x;
	if (c >= C)
		return;
	float s = 0.0f;
	for (int b = 0; b < B; b++)
		s += dout[((size_t)b * T + t) * C + c];
	dwpe[(size_t)t * C + c] = s;
}

static int cu_encoder_backward(struct backend *be, float *dwte, float *dwpe, const float *dout,
			       const int32_t *tok, int B, int T, int C, int V)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	int n = B * T;
	size_t tmp = 0;
	cub::DeviceRadixSort::SortPairs(NULL, tmp, (const int32_t *)NULL, (int32_t *)NULL,
					(const int32_t *)NULL, (int32_t *)NULL, n, 0,
					32 - __builtin_clz((unsigned)(V > 1 ? V - 1 : 1)), c->stream);
	void *ws;
	ERR_FORWARD(cuda_workspace(c, 3 * cuda_ws_round(4 * (size_t)n) + cuda_ws_round(4 * (size_t)V)
				   + cuda_ws_round(tmp), &ws));
	char *p = (char *)ws;
	int32_t *iota = (int32_t *)cuda_ws_take(&p, 4 * (size_t)n);
	int32_t *keys = (int32_t *)cuda_ws_take(&p, 4 * (size_t)n);
	int32_t *pos = (int32_t *)cuda_ws_take(&p, 4 * (size_t)n);
	int32_t *first = (int32_t *)cuda_ws_take(&p, 4 * (size_t)V);
	void *cubtmp = cuda_ws_take(&p, tmp);
	if (n) {
		CUDA_LAUNCH(k_iota, (n + 255) / 256, 256, 0, c->stream, iota, n);
		CUDA_LAUNCHED("encoder_backward");
		CUDA_TRY(cub::DeviceRadixSort::SortPairs(cubtmp, tmp, tok, keys, iota, pos, n, 0,
							 32 - __builtin_clz((unsigned)(V > 1 ? V - 1 : 1)),
							 c->stream), "encoder_backward: sort");
	}
	CUDA_TRY(cudaMemsetAsync(first, 0xff, 4 * (size_t)V, c->stream), "encoder_backward");
	if (n) {
		CUDA_LAUNCH(k_group_starts, (n + 255) / 256, 256, 0, c->stream, first, keys, n);
		CUDA_LAUNCHED("encoder_backward");
	}
	if (V && C) {
		CUDA_LAUNCH(k_wte_backward, dim3(V, (C + 127) / 128), 128, 0, c->stream, dwte, dout,
			    keys, pos, first, n, V, C);
		CUDA_LAUNCHED("encoder_backward");
	}
	if (T && C) {
		CUDA_LAUNCH(k_wpe_backward, dim3(T, (C + 127) / 128), 128, 0, c->stream, dwpe, dout,
			    B, T, C);
		CUDA_LAUNCHED("encoder_backward");
	}
	return 0;
}

/* ---- GPT-2: layernorm ------------------------------------------------------------------- */

__device__ __forceinline__ float warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v; /* in every lane */
}

__device__ __forceinline__ float warp_max(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

/* One warp per row; with res non-NULL the row is first res = res + skip (+ bias). */
__global__ void k_layernorm(float *out, float *mean, float *rstd, float *res, const float *skip,
			    const float *bias, const float *x, const float *w, const float *b,
			    int N, int C)
{
	int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
	if (row >= N)
		return;
	const float *xr;
	if (res) {
		float *r = res + (size_t)row * C;
		const float *s = skip + (size_t)row * C;
		for (int c = lane; c < C; c += 32)
			r[c] = bias ? r[c] + s[c] + bias[c] : r[c] + s[c];
		__syncwarp();
		xr = r;
	} else {
		xr = x + (size_t)row * C;
	}
	float s = 0.0f;
	for (int c = lane; c < C; c += 32)
		s += xr[c];
	float m = warp_sum(s) / (float)C;
	float v = 0.0f;
	for (int c = lane; c < C; c += 32) {
		float d = xr[c] - m;
		v += d * d;
	}
	float rs = 1.0f / sqrtf(warp_sum(v) / (float)C + 1e-5f);
	float *o = out + (size_t)row * C;
	for (int c = lane; c < C; c += 32)
		o[c] = (xr[c] - m) * rs * w[c] + b[c];
	if (lane == 0) {
		mean[row] = m;
		rstd[row] = rs;
	}
}

static int layernorm(struct backend *be, float *out, float *mean, float *rstd, float *res,
		     const float *skip, const float *bias, const float *x, const float *w,
		     const float *b, int N, int C)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	if (!N)
		return 0;
	CUDA_LAUNCH(k_layernorm, (N + 7) / 8, 256, 0, c->stream, out, mean, rstd, res, skip, bias,
		    x, w, b, N, C);
	CUDA_LAUNCHED("layernorm_forward");
	return 0;
}

static int cu_layernorm_forward(struct backend *be, float *out, float *mean, float *rstd,
				const float *x, const float *w, const float *b, int N, int C)
{
	return layernorm(be, out, mean, rstd, NULL, NULL, NULL, x, w, b, N, C);
}

static int cu_residual_layernorm_forward(struct backend *be, float *res, float *out,
					 float *mean, float *rstd, const float *skip,
					 const float *bias, const float *w, const float *b, int N,
					 int C)
{
	return layernorm(be, out, mean, rstd, res, skip, bias, NULL, w, b, N, C);
}

/* dx per row, one warp per row. Reads x before writing dx (dx may not alias x, but the
 * contract does not ask for it either). */
__global__ void k_layernorm_dx(float *dx, const float *dout, const float *x, const float *w,
			       const float *mean, const float *rstd, int N, int C, int accumulate)
{
	int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
	if (row >= N)
		return;
	const float *d = dout + (size_t)row * C, *xr = x + (size_t)row * C;
	float m = mean[row], rs = rstd[row], a = 0.0f, bsum = 0.0f;
	for (int c = lane; c < C; c += 32) {
		float wd = w[c] * d[c];
		a += wd;
		bsum += wd * (xr[c] - m) * rs;
	}
	a = warp_sum(a) / (float)C;
	bsum = warp_sum(bsum) / (float)C;
	float *o = dx + (size_t)row * C;
	for (int c = lane; c < C; c += 32) {
		float xh = (xr[c] - m) * rs;
		float v = rs * (w[c] * d[c] - a - xh * bsum);
		o[c] = accumulate ? o[c] + v : v;
	}
}

/* Partial dw, db over chunks of rows (as k_colsum_part), then added in chunk order. */
__global__ void k_layernorm_dwdb_part(float *pw, float *pb, const float *dout, const float *x,
				      const float *mean, const float *rstd, int N, int C)
{
	int c = blockIdx.y * blockDim.x + threadIdx.x;
	if (c >= C)
		return;
	int lo = blockIdx.x * COLSUM_ROWS, hi = min(lo + COLSUM_ROWS, N);
	float sw = 0.0f, sb = 0.0f;
	for (int n = lo; n < hi; n++) {
		float d = dout[(size_t)n * C + c];
		sw += d * ((x[(size_t)n * C + c] - mean[n]) * rstd[n]);
		sb += d;
	}
	pw[(size_t)blockIdx.x * C + c] = sw;
	pb[(size_t)blockIdx.x * C + c] = sb;
}

static int cu_layernorm_backward(struct backend *be, float *dx, float *dw, float *db,
				 const float *dout, const float *x, const float *w,
				 const float *mean, const float *rstd, int N, int C, int accumulate)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	int nchunk = (N + COLSUM_ROWS - 1) / COLSUM_ROWS;
	void *ws;
	ERR_FORWARD(cuda_workspace(c, 2 * colsum_ws(N, C), &ws));
	char *p = (char *)ws;
	float *pw = (float *)cuda_ws_take(&p, colsum_ws(N, C));
	float *pb = (float *)cuda_ws_take(&p, colsum_ws(N, C));
	if (nchunk) {
		CUDA_LAUNCH(k_layernorm_dwdb_part, dim3(nchunk, (C + 127) / 128), 128, 0, c->stream,
			    pw, pb, dout, x, mean, rstd, N, C);
		CUDA_LAUNCHED("layernorm_backward");
		CUDA_LAUNCH(k_colsum_final, (C + 127) / 128, 128, 0, c->stream, dw, pw, nchunk, C);
		CUDA_LAUNCHED("layernorm_backward");
		CUDA_LAUNCH(k_colsum_final, (C + 127) / 128, 128, 0, c->stream, db, pb, nchunk, C);
		CUDA_LAUNCHED("layernorm_backward");
		CUDA_LAUNCH(k_layernorm_dx, (N + 7) / 8, 256, 0, c->stream, dx, dout, x, w, mean,
			    rstd, N, C, accumulate);
		CUDA_LAUNCHED("layernorm_backward");
	} else if (C) {
		CUDA_TRY(cudaMemsetAsync(dw, 0, 4 * (size_t)C, c->stream), "layernorm_backward");
		CUDA_TRY(cudaMemsetAsync(db, 0, 4 * (size_t)C, c->stream), "layernorm_backward");
	}
	return 0;
}

/* ---- GPT-2: activations ----------------------------------------------------------------- */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

__global__ void k_bias_act(float *pre, float *out, const float *bias, size_t N, int C, int relu)
{
	for (size_t n = blockIdx.x; n < N; n += gridDim.x)
		for (int c = threadIdx.x; c < C; c += blockDim.x) {
			size_t i = n * C + c;
			float x = pre[i] + bias[c];
			pre[i] = x;
			out[i] = relu ? fmaxf(x, 0.0f)
				      : 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x)));
		}
}

static int cu_bias_act_forward(struct backend *be, float *pre, float *out, const float *bias,
			       int N, int C, enum backend_act act)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	size_t n = (size_t)N * C;
	if (!n)
		return 0;
	CUDA_LAUNCH(k_bias_act, ROWS_GRID(c, (size_t)N), 256, 0, c->stream, pre, out, bias,
		    (size_t)N, C, act == BACKEND_ACT_RELU);
	CUDA_LAUNCHED("bias_act_forward");
	return 0;
}

__global__ void k_act_backward(float *d, const float *x, size_t n, int relu)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float v = x[i], g;
		if (relu) {
			g = v > 0.0f ? 1.0f : 0.0f;
		} else {
			float u = GELU_K * (v + 0.044715f * v * v * v);
			float th = tanhf(u);
			g = 0.5f * (1.0f + th) +
			    0.5f * v * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
		}
		d[i] *= g;
	}
}

static int cu_act_backward(struct backend *be, float *d, float *dbias, const float *x, int N,
			   int C, enum backend_act act)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	size_t n = (size_t)N * C;
	if (n) {
		CUDA_LAUNCH(k_act_backward, cuda_grid(c, n, 256), 256, 0, c->stream, d, x, n,
			    act == BACKEND_ACT_RELU);
		CUDA_LAUNCHED("act_backward");
	}
	if (dbias) {
		void *ws;
		ERR_FORWARD(cuda_workspace(c, colsum_ws(N, C), &ws));
		ERR_FORWARD(colsum(c, dbias, d, N, C, (float *)ws));
	}
	return 0;
}

/* ---- GPT-2: attention ------------------------------------------------------------------- */

/* qkv [B, T, 3C] -> q, k, v [B, NH, T, hs]; with back = 1 the reverse, dq, dk, dv into
 * dqkv. One warp per row (b, h, t) of hs. */
__global__ void k_permute_qkv(float *q, float *k, float *v, float *qkv, int B, int T, int NH,
			      int hs, int back)
{
	size_t C = (size_t)NH * hs, rows = (size_t)B * NH * T;
	for (size_t r = blockIdx.x * (size_t)(blockDim.x / 32) + threadIdx.x / 32; r < rows;
	     r += (size_t)gridDim.x * (blockDim.x / 32)) {
		int t = (int)(r % T), h = (int)(r / T % NH), b = (int)(r / ((size_t)T * NH));
		size_t src = ((size_t)b * T + t) * 3 * C + (size_t)h * hs, dst = r * hs;
		for (int d = threadIdx.x % 32; d < hs; d += 32) {
			if (back) {
				qkv[src + d] = q[dst + d];
				qkv[src + C + d] = k[dst + d];
				qkv[src + 2 * C + d] = v[dst + d];
			} else {
				q[dst + d] = qkv[src + d];
				k[dst + d] = qkv[src + C + d];
				v[dst + d] = qkv[src + 2 * C + d];
			}
		}
	}
}

/* o [B, NH, T, hs] <-> out [B, T, C]; back = 0: out = o, 1: o = out. One warp per row. */
__global__ void k_permute_out(float *o, float *out, int B, int T, int NH, int hs, int back)
{
	size_t C = (size_t)NH * hs, rows = (size_t)B * NH * T;
	for (size_t r = blockIdx.x * (size_t)(blockDim.x / 32) + threadIdx.x / 32; r < rows;
	     r += (size_t)gridDim.x * (blockDim.x / 32)) {
		int t = (int)(r % T), h = (int)(r / T % NH), b = (int)(r / ((size_t)T * NH));
		size_t j = ((size_t)b * T + t) * C + (size_t)h * hs, i = r * hs;
		for (int d = threadIdx.x % 32; d < hs; d += 32) {
			if (back)
				o[i + d] = out[j + d];
			else
				out[j + d] = o[i + d];
		}
	}
}

/* In place on S [rows of T]: row i of each (b, h) becomes softmax over j <= i, zeros above.
 * One warp per row. */
__global__ void k_causal_softmax(float *S, size_t rows, int T)
{
	size_t row = blockIdx.x * (size_t)(blockDim.x / 32) + threadIdx.x / 32;
	int lane = threadIdx.x % 32;
	if (row >= rows)
		return;
	int i = (int)(row % T);
	float *s = S + row * T;
	float mx = -INFINITY;
	for (int j = lane; j <= i; j += 32)
		mx = fmaxf(mx, s[j]);
	mx = warp_max(mx);
	float sum = 0.0f;
	for (int j = lane; j <= i; j += 32) {
		float e = expf(s[j] - mx);
		s[j] = e;
		sum += e;
	}
	float inv = 1.0f / warp_sum(sum);
	for (int j = lane; j < T; j += 32)
		s[j] = j <= i ? s[j] * inv : 0.0f;
}

static int cu_attention_forward(struct backend *be, float *out, float *att, const float *qkv,
				int B, int T, int C, int NH)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	if (c->attention_fused && cuda_attention_fused_fits(T, C, NH))
		return cuda_attention_fused_forward(be, out, att, qkv, B, T, C, NH);
	int hs = C / NH, BH = B * NH;
	size_t n = (size_t)B * T * C;
	if (!n)
		return 0;
	size_t nTT = (size_t)BH * T * T;
	/* cuBLAS may choose another kernel for an operand that is not 16-byte aligned: P is
	 * then made in workspace and copied out, so att's address does not change the bits */
	int stage = !aligned16(att);
	void *ws;
	ERR_FORWARD(cuda_workspace(c, 4 * cuda_ws_round(4 * n) + (stage ? cuda_ws_round(4 * nTT) : 0),
				   &ws));
	char *p = (char *)ws;
	float *q = (float *)cuda_ws_take(&p, 4 * n), *k = (float *)cuda_ws_take(&p, 4 * n);
	float *v = (float *)cuda_ws_take(&p, 4 * n), *o = (float *)cuda_ws_take(&p, 4 * n);
	float *P = stage ? (float *)cuda_ws_take(&p, 4 * nTT) : att;
	unsigned g = ROWS_GRID(c, (size_t)BH * T / 8 + 1);
	CUDA_LAUNCH(k_permute_qkv, g, 256, 0, c->stream, q, k, v, (float *)qkv, B, T, NH, hs, 0);
	CUDA_LAUNCHED("attention_forward");
	long long TT = (long long)T * T, Th = (long long)T * hs;
	/* S = q k^T / sqrt(hs) into att */
	ERR_FORWARD(sgemm_rm(c, 0, 1, T, T, hs, 1.0f / sqrtf((float)hs), q, hs, Th, k, hs, Th, 0.0f,
			     P, T, TT, BH));
	size_t rows = (size_t)BH * T;
	CUDA_LAUNCH(k_causal_softmax, (unsigned)((rows + 7) / 8), 256, 0, c->stream, P, rows, T);
	CUDA_LAUNCHED("attention_forward");
	ERR_FORWARD(sgemm_rm(c, 0, 0, T, hs, T, 1.0f, P, T, TT, v, hs, Th, 0.0f, o, hs, Th, BH));
	if (stage)
		CUDA_TRY(cudaMemcpyAsync(att, P, 4 * nTT, cudaMemcpyDeviceToDevice, c->stream),
			 "attention_forward");
	CUDA_LAUNCH(k_permute_out, g, 256, 0, c->stream, o, out, B, T, NH, hs, 0);
	CUDA_LAUNCHED("attention_forward");
	return 0;
}

/* dS = P (dP - sum_j P dP) on and below the diagonal, 0 above; in place on dP. One warp per
 * row. */
__global__ void k_softmax_backward(float *dP, const float *P, size_t rows, int T)
{
	size_t row = blockIdx.x * (size_t)(blockDim.x / 32) + threadIdx.x / 32;
	int lane = threadIdx.x % 32;
	if (row >= rows)
		return;
	int i = (int)(row % T);
	float *d = dP + row * T;
	const float *pr = P + row * T;
	float s = 0.0f;
	for (int j = lane; j <= i; j += 32)
		s += pr[j] * d[j];
	s = warp_sum(s);
	for (int j = lane; j < T; j += 32)
		d[j] = j <= i ? pr[j] * (d[j] - s) : 0.0f;
}

static int cu_attention_backward(struct backend *be, float *dqkv, const float *dout,
				 const float *qkv, const float *att, int B, int T, int C, int NH)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	if (c->attention_fused && cuda_attention_fused_fits(T, C, NH))
		return cuda_attention_fused_backward(be, dqkv, dout, qkv, att, B, T, C, NH);
	int hs = C / NH, BH = B * NH;
	size_t n = (size_t)B * T * C, nTT = (size_t)BH * T * T;
	if (!n)
		return 0;
	int stage = !aligned16(att); /* as in the forward */
	void *ws;
	ERR_FORWARD(cuda_workspace(c, 7 * cuda_ws_round(4 * n) + (1 + stage) * cuda_ws_round(4 * nTT),
				   &ws));
	char *p = (char *)ws;
	float *q = (float *)cuda_ws_take(&p, 4 * n), *k = (float *)cuda_ws_take(&p, 4 * n);
	float *v = (float *)cuda_ws_take(&p, 4 * n), *dO = (float *)cuda_ws_take(&p, 4 * n);
	float *dq = (float *)cuda_ws_take(&p, 4 * n), *dk = (float *)cuda_ws_take(&p, 4 * n);
	float *dv = (float *)cuda_ws_take(&p, 4 * n), *dP = (float *)cuda_ws_take(&p, 4 * nTT);
	const float *P = att;
	if (stage) {
		float *Pa = (float *)cuda_ws_take(&p, 4 * nTT);
		CUDA_TRY(cudaMemcpyAsync(Pa, att, 4 * nTT, cudaMemcpyDeviceToDevice, c->stream),
			 "attention_backward");
		P = Pa;
	}
	unsigned g = ROWS_GRID(c, (size_t)BH * T / 8 + 1);
	CUDA_LAUNCH(k_permute_qkv, g, 256, 0, c->stream, q, k, v, (float *)qkv, B, T, NH, hs, 0);
	CUDA_LAUNCHED("attention_backward");
	CUDA_LAUNCH(k_permute_out, g, 256, 0, c->stream, dO, (float *)dout, B, T, NH, hs, 1);
	CUDA_LAUNCHED("attention_backward");
	long long TT = (long long)T * T, Th = (long long)T * hs;
	float scale = 1.0f / sqrtf((float)hs);
	/* dP = dO v^T; dv = P^T dO */
	ERR_FORWARD(sgemm_rm(c, 0, 1, T, T, hs, 1.0f, dO, hs, Th, v, hs, Th, 0.0f, dP, T, TT, BH));
	ERR_FORWARD(sgemm_rm(c, 1, 0, T, hs, T, 1.0f, P, T, TT, dO, hs, Th, 0.0f, dv, hs, Th, BH));
	size_t rows = (size_t)BH * T;
	CUDA_LAUNCH(k_softmax_backward, (unsigned)((rows + 7) / 8), 256, 0, c->stream, dP, P,
		    rows, T);
	CUDA_LAUNCHED("attention_backward");
	/* dq = dS k scale; dk = dS^T q scale */
	ERR_FORWARD(sgemm_rm(c, 0, 0, T, hs, T, scale, dP, T, TT, k, hs, Th, 0.0f, dq, hs, Th, BH));
	ERR_FORWARD(sgemm_rm(c, 1, 0, T, hs, T, scale, dP, T, TT, q, hs, Th, 0.0f, dk, hs, Th, BH));
	CUDA_LAUNCH(k_permute_qkv, g, 256, 0, c->stream, dq, dk, dv, dqkv, B, T, NH, hs, 1);
	CUDA_LAUNCHED("attention_backward");
	return 0;
}

/* ---- GPT-2: cross-entropy and AdamW ----------------------------------------------------- */

#define CE_THREADS 256

__device__ __forceinline__ float block_reduce_f(float v, float *sh, int is_max)
{
	for (int o = 16; o > 0; o >>= 1) {
		float u = __shfl_xor_sync(0xffffffffu, v, o);
		v = is_max ? fmaxf(v, u) : v + u;
	}
	int w = threadIdx.x / 32, l = threadIdx.x % 32;
	__syncthreads(); /* sh may still be read from the previous reduction */
	if (l == 0)
		sh[w] = v;
	__syncthreads();
	v = sh[0];
	for (int i = 1; i < (int)blockDim.x / 32; i++)
		v = is_max ? fmaxf(v, sh[i]) : v + sh[i];
	return v; /* in every thread */
}

/* One block per row. */
__global__ void k_crossentropy_forward(float *probs, float *losses, const int32_t *targets,
				       int V)
{
	__shared__ float sh[32];
	float *p = probs + (size_t)blockIdx.x * V;
	float mx = -INFINITY;
	for (int j = threadIdx.x; j < V; j += blockDim.x)
		mx = fmaxf(mx, p[j]);
	mx = block_reduce_f(mx, sh, 1);
	float tl = targets ? p[targets[blockIdx.x]] : 0.0f;
	__syncthreads(); /* everyone has read the target's logit before it is overwritten */
	float s = 0.0f;
	for (int j = threadIdx.x; j < V; j += blockDim.x) {
		float e = expf(p[j] - mx);
		p[j] = e;
		s += e;
	}
	s = block_reduce_f(s, sh, 0);
	float inv = 1.0f / s;
	for (int j = threadIdx.x; j < V; j += blockDim.x)
		p[j] *= inv;
	if (targets && threadIdx.x == 0)
		losses[blockIdx.x] = logf(s) - (tl - mx);
}

static int cu_crossentropy_forward(struct backend *be, float *probs, float *losses,
				   const int32_t *targets, int N, int V)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	if (!N)
		return 0;
	CUDA_LAUNCH(k_crossentropy_forward, N, CE_THREADS, 0, c->stream, probs, losses, targets, V);
	CUDA_LAUNCHED("crossentropy_forward");
	return 0;
}

__global__ void k_crossentropy_backward(float *probs, const int32_t *targets, size_t N, int V,
					float scale)
{
	for (size_t n = blockIdx.x; n < N; n += gridDim.x) {
		float *p = probs + n * V;
		int tg = targets[n];
		for (int j = threadIdx.x; j < V; j += blockDim.x) {
			float x = p[j] * scale;
			p[j] = j == tg ? x - scale : x;
		}
	}
}

static int cu_crossentropy_backward(struct backend *be, float *probs, const int32_t *targets,
				    int N, int V, float scale)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	size_t n = (size_t)N * V;
	if (!n)
		return 0;
	CUDA_LAUNCH(k_crossentropy_backward, ROWS_GRID(c, (size_t)N), 256, 0, c->stream, probs,
		    targets, (size_t)N, V, scale);
	CUDA_LAUNCHED("crossentropy_backward");
	return 0;
}

struct adamw_scalars {
	float decay, b1, omb1, b2, omb2, sqrt_bc2, eps, step;
};

/* Each operation rounded on its own, as backend.h spells it out (no contraction into fused
 * multiply-adds except the two the contract names). */
__global__ void k_adamw(float *p, const float *g, float *m, float *v, size_t n,
			struct adamw_scalars s, float grad_scale)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float gs = __fmul_rn(g[i], grad_scale);
		float pp = __fmul_rn(p[i], s.decay);
		float mi = __fmaf_rn(s.omb1, gs, __fmul_rn(m[i], s.b1));
		float vi = __fmaf_rn(__fmul_rn(s.omb2, gs), gs, __fmul_rn(v[i], s.b2));
		float d = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.sqrt_bc2), s.eps);
		p[i] = __fadd_rn(pp, __fdiv_rn(__fmul_rn(s.step, mi), d));
		m[i] = mi;
		v[i] = vi;
	}
}

static int cu_adamw_update(struct backend *be, float *p, const float *g, float *m, float *v,
			   const struct backend_segment *seg, int nseg, double lr, double beta1,
			   double beta2, double eps, long t, float grad_scale)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	for (int i = 0; i < nseg; i++) {
		size_t o = seg[i].offset, n = seg[i].n;
		if (!n)
			continue;
		struct adamw_scalars s;
		s.decay = (float)(1.0 - lr * seg[i].weight_decay);
		s.b1 = (float)beta1;
		s.omb1 = (float)(1.0 - beta1);
		s.b2 = (float)beta2;
		s.omb2 = (float)(1.0 - beta2);
		s.sqrt_bc2 = (float)sqrt(1.0 - pow(beta2, (double)t));
		s.eps = (float)eps;
		s.step = (float)(-lr / (1.0 - pow(beta1, (double)t)));
		CUDA_LAUNCH(k_adamw, cuda_grid(c, n, 256), 256, 0, c->stream, p + o, g + o, m + o,
			    v + o, n, s, grad_scale);
		CUDA_LAUNCHED("adamw_update");
	}
	return 0;
}

/* ---- profiling -------------------------------------------------------------------------- */

/* Device time of the products (CUDA events), which the stream runs one after another. */
static void cu_profile(struct backend *be, int enable)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	if (enable && !c->ev_made) {
		for (int i = 0; i < CUDA_EV_RING; i++)
			for (int j = 0; j < 2; j++)
				if (cudaEventCreate(&c->ev[i][j]) != cudaSuccess)
					return; /* no timing: gemm_seconds says NaN */
		c->ev_made = 1;
	}
	gemm_timing_drain(c, 1);
	c->profiling = enable && c->ev_made;
	if (enable)
		c->gemm_s = 0.0;
}

static double cu_gemm_seconds(struct backend *be)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	if (!c->ev_made)
		return NAN;
	gemm_timing_drain(c, 1);
	return c->gemm_s;
}

/* ---- the table -------------------------------------------------------------------------- */

/* C++20 designated initialisers: in declaration order, which the compiler checks. */
static const struct backend_ops cuda_ops = {
	.close = cu_close,
	.alloc = cu_alloc,
	.free = cu_free,
	.upload = cu_upload,
	.download = cu_download,
	.copy = cu_copy,
	.copy_2d = cu_copy_2d,
	.memset = cu_memset,
	.sync = cu_sync,
	.workspace_bytes = cu_workspace_bytes,
	.fill = cu_fill,
	.add_f32 = cu_add_f32,
	.fill_normal = cu_fill_normal,
	.sum = cu_sum,
	.gemm = cu_gemm,
	.matmul_forward = cu_matmul_forward,
	.matmul_backward = cu_matmul_backward,
	.encoder_forward = cu_encoder_forward,
	.encoder_backward = cu_encoder_backward,
	.layernorm_forward = cu_layernorm_forward,
	.residual_layernorm_forward = cu_residual_layernorm_forward,
	.layernorm_backward = cu_layernorm_backward,
	.bias_act_forward = cu_bias_act_forward,
	.act_backward = cu_act_backward,
	.attention_forward = cu_attention_forward,
	.attention_backward = cu_attention_backward,
	/* bfloat16 activations: not on cuda yet (its bf16 products round every operand) */
	.layernorm_forward_bf16 = NULL,
	.residual_layernorm_forward_bf16 = NULL,
	.bias_act_forward_bf16 = NULL,
	.attention_forward_bf16 = NULL,
	.matmul_forward_bf16 = NULL,
	.matmul_backward_bf16 = NULL,
	.crossentropy_forward = cu_crossentropy_forward,
	.crossentropy_backward = cu_crossentropy_backward,
	.adamw_update = cu_adamw_update,
	.moe_gate_forward = cuda_moe_gate_forward,
	.moe_gate_backward = cuda_moe_gate_backward,
	.moe_count = cuda_moe_count,
	.moe_locations = cuda_moe_locations,
	.moe_route_copies = cuda_moe_route_copies,
	.moe_encode = cuda_moe_encode,
	.moe_decode = cuda_moe_decode,
	.moe_decode_backward = cuda_moe_decode_backward,
	.moe_encode_backward = cuda_moe_encode_backward,
	.moe_encode_bf16 = cuda_moe_encode_bf16,
	.moe_decode_bf16 = cuda_moe_decode_bf16,
	.moe_decode_backward_bf16 = cuda_moe_decode_backward_bf16,
	.moe_encode_backward_bf16 = cuda_moe_encode_backward_bf16,
	.profile = cu_profile,
	.gemm_seconds = cu_gemm_seconds,
	.comm_unique_id = cuda_comm_unique_id,
	.comm_open = cuda_comm_open,
	.comm_close = cuda_comm_close,
	.comm_exchange = cuda_comm_exchange,
	.side_begin = cu_side_begin,
	.side_end = cu_side_end,
	.side_wait = cu_side_wait,
};

int backend_cuda_init(struct backend *be, const struct backend_params *params)
{
	const char *mode = getenv("CORE_CUDA_ATTENTION");
	int fused = mode && strcmp(mode, "fused") == 0;
	if (mode && *mode && !fused && strcmp(mode, "cublas") != 0)
		return err_set(CORE_EUSAGE, NULL, "environment variable CORE_CUDA_ATTENTION: '%s' is "
			       "neither cublas nor fused", mode);
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0)
		return err_set(CORE_EUNSUPPORTED, NULL, "no usable CUDA device here (%s)",
			       e == cudaErrorInsufficientDriver
				       ? "the NVIDIA driver is missing or older than this CUDA runtime"
			       : e == cudaErrorNoDevice || e == cudaSuccess ? "the driver sees no GPU"
								    : cudaGetErrorString(e));
	struct cuda_ctx *c = (struct cuda_ctx *)calloc(1, sizeof *c);
	if (!c)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the CUDA backend");
	int rc = 0;
	struct cudaDeviceProp prop;
	c->device = params->device > 0 ? params->device % n : 0;
	if ((rc = cuda_fail(cudaSetDevice(c->device), "selecting the device")) < 0 ||
	    (rc = cuda_fail(cudaGetDeviceProperties(&prop, c->device), "reading the device")) < 0 ||
	    (rc = cuda_fail(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking),
			    "creating a stream")) < 0) {
		free(c);
		return rc;
	}
	c->sms = prop.multiProcessorCount;
	/* the fused attention is fp32 (attention.cu); in tf32 or bf16 attention keeps the
	 * cuBLAS formulation, whose products round as every other product does (backend.h) */
	c->attention_fused = fused && params->precision == BACKEND_FP32;
	cublasStatus_t s = cublasCreate(&c->blas);
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasSetStream(c->blas, c->stream);
	/* fp32 products are plain fp32, no TF32 (results are compared with the CPU backend's);
	 * tf32 and bf16 ask for their compute type product by product (sgemm_rm) */
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH);
	c->precision = params->precision;
	if (s != CUBLAS_STATUS_SUCCESS) {
		rc = blas_fail(s, "starting cuBLAS");
		cudaStreamDestroy(c->stream);
		free(c);
		return rc;
	}
	be->op = &cuda_ops;
	be->host_visible = 0;
	be->attention_keeps_p = !c->attention_fused;
	be->threads = params->threads > 0 ? params->threads : 1;
	be->gemm_kernel = "cublas";
	be->ctx = c;
	return 0;
}
