/* probe.c - a backend's GEMM and copy ceilings; see probe.h. */
#include "backend/probe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/progress.h"
#include "common/rng.h"
#include "common/stats.h"
#include "common/banned.h"

int probe_gemm_init(struct probe_gemm *p, struct backend *be, int M, int N, int K)
{
	memset(p, 0, sizeof *p);
	p->be = be;
	p->M = M > 0 ? M : 1;
	p->N = N;
	p->K = K;
	const size_t na = (size_t)p->M * K, nb = (size_t)K * N, nc = (size_t)p->M * N;
	if (be->op->alloc(be, (void **)&p->a, na * sizeof(float)) < 0 ||
	    be->op->alloc(be, (void **)&p->b, nb * sizeof(float)) < 0 ||
	    be->op->alloc(be, (void **)&p->c, nc * sizeof(float)) < 0) {
		probe_gemm_free(p);
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the %d x %d x %d GEMM probe",
			       M, N, K);
	}
	ERR_FORWARD(be->op->fill_normal(be, p->a, na, 0.0f, 1.0f, 9, RNG_STREAM_TEST, 0));
	return be->op->fill_normal(be, p->b, nb, 0.0f, 1.0f, 9, RNG_STREAM_TEST, 1u << 30);
}

double probe_gemm_seconds(struct probe_gemm *p)
{
	struct backend *be = p->be;
	be->op->sync(be);
	double t0 = now_seconds();
	int rc = be->op->gemm(be, 0, 0, p->M, p->N, p->K, 1.0f, p->a, p->K, p->b, p->N, 0.0f,
			      p->c, p->N);
	be->op->sync(be);
	return rc < 0 ? NAN : now_seconds() - t0;
}

void probe_gemm_free(struct probe_gemm *p)
{
	if (p->be) {
		p->be->op->free(p->be, p->a);
		p->be->op->free(p->be, p->b);
		p->be->op->free(p->be, p->c);
	}
	memset(p, 0, sizeof *p);
}

double probe_copy_gbps(struct backend *be, size_t bytes, long reps)
{
	const size_t half = bytes / 2;
	void *src = NULL, *dst = NULL;
	double *t = malloc(sizeof(double) * (size_t)(reps + 1)), rate = NAN;

	if (t && half > 0 && reps > 0 && backend_alloc_zero(be, &src, half) == 0 &&
	    backend_alloc_zero(be, &dst, half) == 0) {
		for (long i = 0; i <= reps; i++) {
			be->op->sync(be);
			double t0 = now_seconds();
			be->op->copy(be, dst, src, half);
			be->op->sync(be);
			t[i] = now_seconds() - t0;
		}
		rate = 2.0 * (double)half / stats_median(t + 1, reps, NULL, NULL) / 1e9;
	}
	if (src)
		be->op->free(be, src);
	if (dst)
		be->op->free(be, dst);
	free(t);
	return rate;
}
