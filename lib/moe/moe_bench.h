/* moe_bench.h - timing one MoE layer the way moe-bench reports it, as a library so that the
 * later benchmarks (moe-profile's sweeps) time the same steps the same way.
 *
 * Four runs, each over warmup + iters steps of the same inputs (only the timed ones are
 * kept): the sparse layer forward (+ backward); its encode and decode kernels alone; the dense
 * GShard formulation; and a dry run that routes once and reports the memory both would take.
 * Each step's capacity setting comes from a trace when one is given (replayed cyclically),
 * else from the config. Times are wall-clock on the backend, synchronised at stage ends.
 */
#ifndef CORE_MOE_BENCH_H
#define CORE_MOE_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "moe/moe.h"

/* The auxiliary-loss weight of the timed backward: alpha = 1e-2, the coefficient of the
 * load-balancing loss in the Switch Transformer (Fedus et al. 2021, sec. 2.2) and GShard
 * style setups. It scales a term of the gate gradient; the time does not depend on it. */
#define MOE_BENCH_AUX_WEIGHT 0.01f

/* Called after each timed step j (outside its time) with the step's output y ([T, M] in the
 * backend's memory), its seconds and its auxiliary loss; a negative return ends the run with
 * that error. fn NULL: no call. */
struct moe_bench_hook {
	int (*fn)(void *arg, long j, double seconds, double aux, const float *y);
	void *arg;
};

struct moe_bench_opts {
	struct moe_config cfg; /* cfg.T: tokens per step */
	struct backend *be;
	int forward_only;      /* time the forward only */
	int input_grad;        /* the backward computes dx (Tutel's helloworld does not) */
	long iters, warmup;    /* timed and untimed steps */
	const double *trace;   /* capacity setting per step, cyclic; NULL: cfg.capacity_setting */
	size_t trace_n;
	int64_t dense_T;       /* tokens of the dense run (<= cfg.T) */
	int bf16;              /* encode-decode on bfloat16 rows (the backend's moe_*_bf16) */
	float aux_weight;      /* the auxiliary loss's weight in the backward (0 for none;
				* MOE_BENCH_AUX_WEIGHT by default) */
	struct moe_bench_hook hook; /* after each timed step of the layer run */
	int stage_times;            /* a device: moe_layer_set_timing(1) */
};

/* Parameters, their gradients and the step's inputs and outputs, on the backend. */
struct moe_bench_data {
	struct moe_params p, g;
	float *x, *y, *dy, *dx; /* [T, M] */
};

/* Per-step samples of the timed steps. */
struct moe_bench_samples {
	long n;
	double *step, *fwd, *bwd; /* seconds */
	struct moe_times *st;
	int64_t *dropped, *C, *rows; /* rows: kept (token, expert) pairs */
	double *aux;      /* the auxiliary loss of each step (NaN where not computed) */
	int E;
	int64_t *load;    /* [E] n_e of the last timed step: choices per expert before dropping
			   * (all zero where not known) */
};

struct moe_bench_result {
	struct moe_bench_samples s;
	int64_t T;               /* tokens per step of this run */
	size_t layer_bytes_peak; /* what the formulation allocated at its peak */
	double kept_rows_mean;   /* R, the mean over the timed steps */
	double flops;            /* useful flops per step (moe_step_flops at R) */
	/* layer: one plain GEMM of the experts' fc1 shape [rows, M] x [M, H], timed after each
	 * step (the same machine load); non-GEMM: step time outside the expert GEMMs */
	int64_t ref_rows;
	double ref_gflops, nongemm_s;
	/* encode-decode: bytes read + written per step, and a plain copy of as many bytes */
	double bytes_moved, copy_gbps;
	/* dry run */
	int64_t C;
	int C_exact;       /* C is the setting's (> 0); else the largest routing could need */
	size_t data_bytes; /* parameters, their gradients and the step's four [T, M] arrays */
	size_t sparse_bytes, dense_bytes;
};

/* The capacity setting of step i. */
double moe_bench_setting(const struct moe_bench_opts *o, long i);

/* x, y, dy, dx [cfg->T, M] on be, zeroed; x and dy drawn as rows row0 .. row0 + T - 1 of
 * the inputs of a run with more tokens (a rank of a distributed run draws its rows of the
 * whole batch). */
int moe_bench_inputs(struct backend *be, const struct moe_config *cfg, uint64_t row0,
		     float **x, float **y, float **dy, float **dx);
int moe_bench_data_alloc(struct moe_bench_data *d, const struct moe_bench_opts *o);
void moe_bench_data_free(struct moe_bench_data *d);

int moe_bench_layer(const struct moe_bench_opts *o, struct moe_bench_data *d,
		    struct moe_bench_result *r);
/* The encode and decode kernels alone (the experts are the identity: decode reads the
 * encode output), and a plain copy of the same number of bytes. With o->bf16 the rows are
 * bfloat16 (x and dy rounded from the float inputs once, before the steps: half the bytes);
 * CORE_EUNSUPPORTED when the backend lacks those ops. */
int moe_bench_encdec(const struct moe_bench_opts *o, struct moe_bench_data *d,
		     struct moe_bench_result *r);
/* The dense GShard formulation on the first dense_T tokens of the same inputs. Refused with
 * CORE_ENOMEM when its buffers would take more than MOE_BENCH_MEM_FRAC of the machine's
 * memory: thrashing it would measure the disk. */
int moe_bench_dense(const struct moe_bench_opts *o, struct moe_bench_data *d,
		    struct moe_bench_result *r);
/* Whether every run asked for can run, checked before any runs, so that a run refused late
 * never follows one already reported: with dense, the dense formulation's memory (as
 * moe_bench_dense checks it). CORE_ENOMEM when it would not fit. */
int moe_bench_check(const struct moe_bench_opts *o, int dense);
/* What a run would allocate, computed, not allocated (nothing is routed): C from the
 * capacity setting when it fixes it (> 0), else the largest C any routing could give (every
 * token choosing the same expert: T, or the cap of a negative setting); the bytes of the data
 * and of both formulations at that C. */
int moe_bench_dry(const struct moe_bench_opts *o, struct moe_bench_result *r);
void moe_bench_result_free(struct moe_bench_result *r);

/* The most of the physical memory a dense run may plan to take. */
#define MOE_BENCH_MEM_FRAC 0.6

/* Median over the samples of the moe_times field at byte offset off (offsetof). */
double moe_bench_stage_median(const struct moe_bench_samples *s, size_t off);

#endif
