/* cpu_impl.h - what the CPU backend's files (backend_cpu.c, moe_cpu.c) share: the context,
 * the workspace, thread partitions and the elementwise math. Private to lib/backend/cpu.
 */
#ifndef CORE_CPU_IMPL_H
#define CORE_CPU_IMPL_H

#include <omp.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_blas.h"

/* Below this many elements a loop runs on one thread: forking a parallel region costs more
 * than the work (a few microseconds against ~10 GB/s of one core). */
#define CPU_PAR_MIN 32768

/* Rows of a row reduction are split into this many fixed chunks, whatever the thread count,
 * and the chunk partials summed in chunk order: the bits do not depend on the threads. */
#define CPU_CHUNKS 32

/* Time-in-sgemm slots, one per thread, padded against false sharing; threads past the table
 * share its last slot. */
#define CPU_PROF_SLOTS 256

struct cpu_ctx {
	const struct cpu_blas *blas; /* the process's matrix-product library (cpu_blas.h) */
	int bf16;                    /* products in bfloat16 (--precision bf16) */
	long bf16_fallbacks;         /* bf16 products run in fp32 for want of workspace */
	int bf16_failed;             /* a product with a bf16-only operand could not run */
	uint16_t *shared;            /* the bf16 operand all blocks of a product read */
	size_t shared_n;
	float *wide;                 /* a bfloat16 operand widened, for the float ops */
	size_t wide_n;
	int prof_on;
	struct {
		double s;
		char pad[56];
	} prof[CPU_PROF_SLOTS];
	void *ws; /* workspace for the ops, grown on demand and kept */
	size_t ws_bytes;
};

static inline struct cpu_ctx *cpu_ctx(struct backend *be) { return be->ctx; }

/* Every op starts here: the OpenMP regions it forks use the backend's thread count (several
 * backends with different counts may be open in one process). */
static inline void cpu_enter(struct backend *be)
{
	if (omp_get_max_threads() != be->threads)
		omp_set_num_threads(be->threads);
}

/* The workspace, at least bytes long and 64-byte aligned; NULL (detail set) if it cannot
 * grow. One op uses it at a time, so ops carve their scratch from its start. */
void *cpu_workspace(struct backend *be, size_t bytes);

/* The calling thread's share [*d0, *d1) of D items in a parallel region: contiguous, and a
 * multiple of 16 long (whole 64-byte lines of floats, so no two threads write one line). */
static inline void thread_share(int64_t D, int64_t *d0, int64_t *d1)
{
	int64_t n = omp_get_num_threads(), per = ((D + n - 1) / n + 15) / 16 * 16;
	int64_t lo = omp_get_thread_num() * per;
	*d0 = lo < D ? lo : D;
	*d1 = lo + per < D ? lo + per : D;
}

/* out[j] = sum over i < rows of a[i * n + j]. Parallel over slices of columns, each column
 * summed in row order by one thread, so the bits do not depend on the thread count. */
void cpu_column_sums(float *out, const float *a, int64_t rows, int64_t n);

/* exp(x) for x in float range, ~1 ulp: Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2,
 * Cephes minimax polynomial for e^r, 2^n built in the exponent bits. Branch-free so that a
 * loop calling it vectorises (libm's expf and tanhf would not without -ffast-math). */
static inline float exp_approx(float x)
{
	x = x < -87.0f ? -87.0f : x; /* a NaN passes both clamps and stays NaN */
	x = x > 88.0f ? 88.0f : x;
	/* Adding 1.5*2^23 rounds to the nearest integer, which then sits in the low mantissa
	 * bits: read it from there with unsigned arithmetic (no float-to-int conversion, no
	 * signed shift: defined for every input, NaN included). */
	union {
		float f;
		uint32_t u;
	} nb = {.f = x * 1.44269504088896341f + 12582912.0f};
	float n = nb.f - 12582912.0f;
	float r = x - n * 0.693359375f;
	r = r + n * 2.12194440e-4f;
	float z = r * r;
	float p = 1.9875691500e-4f;
	p = p * r + 1.3981999507e-3f;
	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	p = p * z + r + 1.0f;
	union {
		uint32_t u;
		float f;
	} s = {.u = (nb.u - 0x4B400000u + 127u) << 23};
	return p * s.f;
}

/* tanh-GELU: 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3). Since
 * 0.5 (1 + tanh(u)) = sigmoid(2u), gelu(x) = x sigmoid(2u), which needs one exp and has no
 * cancellation near 0. The one GELU of the CPU backend (the model's MLP and the MoE experts). */
#define GELU_K0 0.7978845608028654f
#define GELU_K1 0.044715f

static inline float gelu_sig(float x)
{
	float u = GELU_K0 * (x + GELU_K1 * x * x * x);
	return 1.0f / (1.0f + exp_approx(-2.0f * u));
}

#endif
