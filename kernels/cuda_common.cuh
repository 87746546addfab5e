/* cuda_common.cuh - what every file of the CUDA backend shares: its state, its workspace, and
 * how a CUDA or cuBLAS failure becomes a libcore error (common/err.h).
 *
 * The CUDA backend is lib/backend/backend.h's table filled with kernels: backend_cuda.cu holds
 * the table, memory, the matrix products (cuBLAS) and the GPT-2 ops; attention.cu the fused
 * attention; moe.cu the MoE ops. All work is queued on one stream per backend, in order, so an
 * op may use the workspace and return without waiting; download and sync wait. Only copies,
 * memsets and NCCL transfers may go to a second stream (backend.h, side_begin), ordered with
 * the first by events; none of them uses the workspace. Nothing here
 * uses atomics on floats: every reduction has a fixed split and a fixed order, so a result does
 * not depend on scheduling.
 */
#ifndef CORE_KERNELS_CUDA_COMMON_CUH
#define CORE_KERNELS_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "backend/backend.h"
#include "common/err.h"
}

#define CUDA_EV_RING 512

struct cuda_ctx {
	int device;              /* the GPU the backend runs on */
	int sms;                 /* multiprocessors: grid sizes of grid-stride loops */
	cudaStream_t stream;
	cublasHandle_t blas;
	void *ws;                /* workspace, grown on demand (cuda_workspace) */
	size_t ws_bytes;
	enum backend_precision precision; /* of the matrix products (backend.h) */
	void *lp;                /* the bfloat16 copies of a product's operands (bf16 precision),
				  * apart from ws: a product inside an op runs on operands the op
				  * keeps in ws */
	size_t lp_bytes;
	/* gemm timing (profile): a ring of event pairs around the products, read back as they
	 * complete, so timing never stalls the stream */
	int profiling;
	double gemm_s;
	cudaEvent_t ev[CUDA_EV_RING][2];
	int ev_made, ev_head, ev_n;
	int attention_fused;     /* CORE_CUDA_ATTENTION=fused: attention.cu where it applies */
	/* the second queue (backend.h, side_begin): made on first use */
	cudaStream_t side;
	cudaEvent_t fork;                      /* the main queue's point a side_begin waits for */
	cudaEvent_t marks[BACKEND_SIDE_MARKS]; /* side_end's marks, mark % BACKEND_SIDE_MARKS */
	int on_side;                           /* between side_begin and side_end */
	int unjoined;                          /* the second queue has work the main queue does
						* not wait for yet (side_end since the last join) */
	int64_t nmarks;                        /* marks made so far */
};

/* The queue of copy, copy_2d, memset and comm_exchange: the second one between side_begin
 * and side_end. */
static inline cudaStream_t cuda_xfer_stream(const struct cuda_ctx *c)
{
	return c->on_side ? c->side : c->stream;
}

static inline struct cuda_ctx *cuda_ctx_of(struct backend *be)
{
	return (struct cuda_ctx *)be->ctx;
}

/* 0, or CORE_EIO with "what: <CUDA's message>" recorded. */
static inline int cuda_fail(cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return 0;
	return err_set(e == cudaErrorMemoryAllocation ? CORE_ENOMEM : CORE_EIO, NULL,
		       "cuda: %s: %s", what, cudaGetErrorString(e));
}

/* Every kernel launch is written CUDA_LAUNCH(kernel, grid, block, smem, stream, args...) (a
 * template kernel in parentheses), and dynamic shared memory CUDA_DYN_SHARED(type, name), so
 * that these files also compile as C++ against test/emu's CPU emulator (make test-cuda-emu),
 * which runs each launch's threads on the CPU. Under nvcc they are the plain syntax. */
#if defined(__CUDACC__)
#define CUDA_LAUNCH(kernel, grid, block, smem, stream, ...)                                    \
	kernel<<<grid, block, smem, stream>>>(__VA_ARGS__)
#define CUDA_DYN_SHARED(type, name) extern __shared__ type name[]
#elif defined(CORE_CUDA_EMU)
#define CUDA_LAUNCH(kernel, grid, block, smem, stream, ...)                                    \
	emu_launch(#kernel, (const void *)(kernel), __FILE__, __LINE__, dim3(grid), dim3(block), \
		   smem, stream, kernel, __VA_ARGS__)
#define CUDA_DYN_SHARED(type, name) type *name = (type *)emu_dyn_shared()
#else
#error "kernels/ compiles with nvcc, or as C++ for the emulator with -DCORE_CUDA_EMU"
#endif

/* After a kernel launch: the launch's own error (a bad configuration), not a fault of earlier
 * work, which the next sync reports. */
#define CUDA_LAUNCHED(what) ERR_FORWARD(cuda_fail(cudaGetLastError(), what))
#define CUDA_TRY(expr, what) ERR_FORWARD(cuda_fail((expr), what))

/* A workspace of at least bytes, 256-byte aligned, valid until the next call (it is reused by
 * every op; work already queued on the stream that reads the old one finishes first, since
 * cudaFree waits for the device). Split it with cuda_ws_take. */
int cuda_workspace(struct cuda_ctx *c, size_t bytes, void **out);

/* Carve bytes (rounded up to 256) off *p. */
static inline void *cuda_ws_take(char **p, size_t bytes)
{
	void *r = *p;
	*p += (bytes + 255) & ~(size_t)255;
	return r;
}
static inline size_t cuda_ws_round(size_t bytes)
{
	return (bytes + 255) & ~(size_t)255;
}

/* Grid for n elements at `block` threads each, capped at 32 blocks per multiprocessor (kernels
 * loop over the rest). */
static inline unsigned cuda_grid(const struct cuda_ctx *c, size_t n, unsigned block)
{
	size_t g = (n + block - 1) / block, cap = (size_t)c->sms * 32;
	return (unsigned)(g < 1 ? 1 : g > cap ? cap : g);
}

/* Fused attention (attention.cu), with backend.h's signatures, for the shapes where
 * cuda_attention_fused_fits (hs <= 128); att then holds what attention.cu says, not P. */
int cuda_attention_fused_fits(int T, int C, int NH);
int cuda_attention_fused_forward(struct backend *be, float *out, float *att, const float *qkv,
				 int B, int T, int C, int NH);
int cuda_attention_fused_backward(struct backend *be, float *dqkv, const float *dout,
				  const float *qkv, const float *att, int B, int T, int C, int NH);

/* The MoE ops (moe.cu), with backend.h's signatures. */
int cuda_moe_gate_forward(struct backend *be, const struct backend_moe_gate *g,
			  const float *logits, float *probs, float *clean, float *top,
			  int32_t *idx, float *score, float *aux);
int cuda_moe_gate_backward(struct backend *be, const struct backend_moe_gate *g,
			   const float *logits, const float *probs, const float *clean,
			   const int32_t *idx, const float *dscore, float aux_weight, float *dlogits);
int cuda_moe_count(struct backend *be, const int32_t *idx, int64_t n, int E, int64_t *count);
int cuda_moe_locations(struct backend *be, const int32_t *idx, const float *top, int64_t T,
		       int k, int E, int64_t C, int32_t *loc);
int cuda_moe_route_copies(struct backend *be, const struct backend_moe_route *in, int r,
			  int32_t *vidx, int32_t *vloc, float *vscore, int64_t *vcount);
int cuda_moe_encode(struct backend *be, const struct backend_moe_route *r, const float *x,
		    float *disp, int64_t M, int zero_pad);
int cuda_moe_decode(struct backend *be, const struct backend_moe_route *r, const float *eo,
		    float *y, int64_t M);
int cuda_moe_decode_backward(struct backend *be, const struct backend_moe_route *r,
			     const float *dy, const float *eo, float *d_eo, float *dscore, int64_t M,
			     int zero_pad);
int cuda_moe_encode_backward(struct backend *be, const struct backend_moe_route *r,
			     const float *d_disp, float *dx, int64_t M);
int cuda_moe_encode_bf16(struct backend *be, const struct backend_moe_route *r,
			 const uint16_t *x, uint16_t *disp, int64_t M, int zero_pad);
int cuda_moe_decode_bf16(struct backend *be, const struct backend_moe_route *r,
			 const uint16_t *eo, uint16_t *y, int64_t M);
int cuda_moe_decode_backward_bf16(struct backend *be, const struct backend_moe_route *r,
				  const uint16_t *dy, const uint16_t *eo, uint16_t *d_eo,
				  float *dscore, int64_t M, int zero_pad);
int cuda_moe_encode_backward_bf16(struct backend *be, const struct backend_moe_route *r,
				  const uint16_t *d_disp, uint16_t *dx, int64_t M);

/* The device collectives (nccl.cu), with backend.h's signatures. */
int cuda_comm_unique_id(struct backend *be, void *id);
int cuda_comm_open(struct backend *be, void **comm, const void *id, int nranks, int rank);
void cuda_comm_close(struct backend *be, void *comm);
int cuda_comm_exchange(struct backend *be, void *comm, const struct backend_xfer *x, int nx);

#endif
