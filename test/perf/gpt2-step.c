/* gpt2-step.c - time one GPT-2 training step (forward + backward + AdamW) on gpt-tiny.
 *
 * Not built by make. Compile by hand against libcore.a, wrapping cblas_sgemm so that the
 * time spent in matrix products is measured:
 *   make build/libcore.a && cc -std=c11 -D_GNU_SOURCE -O3 -march=native -fopenmp -Ilib \
 *     $(pkg-config --cflags openblas) test/perf/gpt2-step.c build/libcore.a \
 *     -Wl,--wrap=cblas_sgemm $(pkg-config --libs openblas) \
 *     -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp -lm -o build/gpt2-step
 *   OMP_NUM_THREADS=1 ./build/gpt2-step [steps] [L C NH T B V]
 * Prints the median step time over the timed steps (after 3 warm-up steps), tokens/s, the
 * share of the step spent inside sgemm (calls inside parallel regions count as their
 * per-thread time divided by the thread count), sgemm GFLOP per step, the CPU time per step
 * (all threads; at 1 thread it is robust to other processes on a shared machine), and peak
 * RSS against the model's own accounting of parameters, gradients, moments, activations.
 */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "model/gpt2.h"

#define MAXTH 64
static double sg_serial, sg_par[MAXTH], sg_flops;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void __real_cblas_sgemm(enum CBLAS_ORDER o, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb,
			blasint M, blasint N, blasint K, float alpha, const float *A, blasint lda,
			const float *B, blasint ldb, float beta, float *C, blasint ldc);
void __wrap_cblas_sgemm(enum CBLAS_ORDER o, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb,
			blasint M, blasint N, blasint K, float alpha, const float *A, blasint lda,
			const float *B, blasint ldb, float beta, float *C, blasint ldc);
void __wrap_cblas_sgemm(enum CBLAS_ORDER o, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb,
			blasint M, blasint N, blasint K, float alpha, const float *A, blasint lda,
			const float *B, blasint ldb, float beta, float *C, blasint ldc)
{
	double t0 = now();
	__real_cblas_sgemm(o, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
	double dt = now() - t0;
	if (omp_in_parallel()) {
		sg_par[omp_get_thread_num() % MAXTH] += dt;
#pragma omp atomic
		sg_flops += 2.0 * M * N * K;
	} else {
		sg_serial += dt;
		sg_flops += 2.0 * M * N * K;
	}
}

static double cpu_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	int steps = argc > 1 ? (int)strtol(argv[1], NULL, 10) : 12;
	struct gpt2_config cfg = {4, 256, 4, 256, 256};
	int B = 8, T = 256;
	if (argc > 7) {
		cfg.n_layer = (int)strtol(argv[2], NULL, 10);
		cfg.n_embd = (int)strtol(argv[3], NULL, 10);
		cfg.n_head = (int)strtol(argv[4], NULL, 10);
		cfg.seq_len = T = (int)strtol(argv[5], NULL, 10);
		B = (int)strtol(argv[6], NULL, 10);
		cfg.vocab_size = (int)strtol(argv[7], NULL, 10);
	}
	struct gpt2 g;
	if (gpt2_create(&g, &cfg, B, T) < 0) {
		fprintf(stderr, "gpt2-step: cannot create model\n");
		return 1;
	}
	gpt2_init_params(&g, 1);
	int32_t *x = malloc(sizeof(int32_t) * (size_t)B * T),
		*y = malloc(sizeof(int32_t) * (size_t)B * T);
	for (int i = 0; i < B * T; i++) {
		x[i] = (int32_t)((i * 7919u + 13u) % (unsigned)cfg.vocab_size);
		y[i] = (int32_t)((i * 104729u + 5u) % (unsigned)cfg.vocab_size);
	}
	struct adamw_config opt = {0.9, 0.95, 1e-8, 0.1};
	int nth = omp_get_max_threads();
	double *ts = malloc(sizeof(double) * (size_t)steps),
	       *fr = malloc(sizeof(double) * (size_t)steps);
	double *cs = malloc(sizeof(double) * (size_t)steps);
	double fl = 0;
	float loss = 0;
	for (int s = -3; s < steps; s++) {
		sg_serial = sg_flops = 0;
		memset(sg_par, 0, sizeof sg_par);
		double t0 = now(), c0 = cpu_now();
		gpt2_forward(&g, x, y, B, T, &loss);
		gpt2_backward(&g);
		float norm = gpt2_grad_norm(&g);
		gpt2_adamw_step(&g, &opt, 1e-3, s + 4, norm > 1.0f ? 1.0f / norm : 1.0f);
		double dt = now() - t0, dc = cpu_now() - c0;
		if (s >= 0) {
			double par = 0;
			for (int i = 0; i < MAXTH; i++)
				par += sg_par[i];
			ts[s] = dt;
			cs[s] = dc;
			fr[s] = (sg_serial + par / nth) / dt;
			fl = sg_flops;
		}
	}
	qsort(ts, (size_t)steps, sizeof *ts, cmp);
	qsort(fr, (size_t)steps, sizeof *fr, cmp);
	qsort(cs, (size_t)steps, sizeof *cs, cmp);
	double med = ts[steps / 2];
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	double mb = 1.0 / (1024.0 * 1024.0);
	double state = 4.0 * (double)g.nparams * sizeof(float);
	printf("threads %d  L=%d C=%d NH=%d T=%d B=%d V=%d  loss %.4f\n", nth, cfg.n_layer,
	       cfg.n_embd, cfg.n_head, T, B, cfg.vocab_size, (double)loss);
	printf("step median %.1f ms (min %.1f, max %.1f)  %.0f tokens/s\n", med * 1e3, ts[0] * 1e3,
	       ts[steps - 1] * 1e3, B * T / med);
	printf("cpu time per step median %.1f ms (all threads; spinning included)\n",
	       cs[steps / 2] * 1e3);
	printf("sgemm share %.1f%%  sgemm %.2f GFLOP/step\n", 100 * fr[steps / 2], fl * 1e-9);
	double acts = (double)gpt2_activation_bytes(&g);
	printf("memory: params+grads+m+v %.1f MiB + activations %.1f MiB = %.1f MiB; "
	       "peak RSS %.1f MiB (%.2fx)\n",
	       state * mb, acts * mb, (state + acts) * mb, (double)ru.ru_maxrss / 1024.0,
	       (double)ru.ru_maxrss * 1024.0 / (state + acts));
	gpt2_free(&g);
	free(x);
	free(y);
	free(ts);
	free(fr);
	free(cs);
	return 0;
}
