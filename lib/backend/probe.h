/* probe.h - ceilings of a backend, measured in the same run as the figures they bound: the
 * rate of one plain matrix product and of one plain copy. Benchmarks (moe-bench, and the
 * later moe-profile) report their kernels against these rather than against numbers from
 * another day or another machine. */
#ifndef CORE_PROBE_H
#define CORE_PROBE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

/* One plain product C[M,N] = A[M,K] B[K,N] on the backend, with buffers kept between
 * timings so that a benchmark can interleave it with its own steps (both then see the same
 * machine load). */
struct probe_gemm {
	struct backend *be;
	int M, N, K;
	float *a, *b, *c;
};

int probe_gemm_init(struct probe_gemm *p, struct backend *be, int M, int N, int K);
/* Seconds of one product (the backend synchronised before and after). */
double probe_gemm_seconds(struct probe_gemm *p);
void probe_gemm_free(struct probe_gemm *p);

/* Median GB/s (bytes read + written) of the backend's copy op moving `bytes` in total (half
 * read, half written), over reps timed copies after one untimed. NaN if the buffers cannot
 * be allocated. */
double probe_copy_gbps(struct backend *be, size_t bytes, long reps);

#endif
