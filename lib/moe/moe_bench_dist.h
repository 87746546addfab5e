/* moe_bench_dist.h - timing the distributed MoE layer (moe_dist.h) as moe-bench and
 * moe-profile report it. Every rank runs the same steps; a step is timed from a barrier to
 * the end of its backward on each rank, and its time is the slowest rank's.
 *
 * Inputs: rank q's tokens are rows q*T .. q*T + T - 1 of the inputs moe-bench draws for one
 * process with W*T tokens, so W ranks of T tokens run the single-process benchmark's batch.
 */
#ifndef CORE_MOE_BENCH_DIST_H
#define CORE_MOE_BENCH_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "dist/dist.h"
#include "moe/moe_bench.h"
#include "moe/moe_dict.h"
#include "moe/moe_dist.h"

struct moe_bench_dist_opts {
	struct moe_config cfg;  /* cfg.T: tokens per rank */
	struct backend *be;
	struct dist *d;
	int forward_only, input_grad;
	long iters, warmup;
	const double *trace;    /* capacity setting per step (cyclic over all steps, warmup
				 * included); NULL: cfg.capacity_setting */
	size_t trace_n;
	int64_t capacity;       /* > 0: every step runs with C_g = capacity */
	struct moe_plan plan;   /* the plan of every step, unless dict */
	float aux_weight;       /* the auxiliary loss's weight in the backward */
	const struct moe_dict *dict; /* each step's plan looked up by its C_g */
	struct moe_bench_hook hook;  /* after each timed step, on every rank (aux: the mean over
				      * ranks; seconds: the slowest rank's) */
	int stage_times;        /* a device: moe_dist_layer_set_timing(1) */
	int no_overlap;         /* a device: moe_dist_layer_set_overlap(0) */
};

/* The layer, its parameter shard and gradients, and the step's arrays on this rank. */
struct moe_bench_dist_data {
	struct moe_dist_layer *l;
	struct moe_params p, g;
	float *x, *y, *dy, *dx; /* [T, M] */
};
int moe_bench_dist_data_init(struct moe_bench_dist_data *dd, const struct moe_bench_dist_opts *o);
void moe_bench_dist_data_free(struct moe_bench_dist_data *dd);

/* Per timed step. */
struct moe_bench_dist_result {
	long n;
	double *step;           /* seconds, the slowest rank's */
	double *comm, *gemm;    /* this rank's seconds in exchanges and in expert GEMMs */
	double *exposed;        /* of comm, what this rank's caller thread waited for */
	int64_t *C, *dropped;
	struct moe_plan *plan;
	int *exact;             /* the dictionary had the step's bucket (1) or the nearest (0) */
	double total;           /* sum of step */
	long nearest;           /* steps whose bucket the dictionary lacked (nearest used) */
	struct moe_dist_step last;
	struct moe_dist_stats stats; /* this run's: the layer's counters over its steps */
};
int moe_bench_dist_run(const struct moe_bench_dist_opts *o, struct moe_bench_dist_data *dd,
		       struct moe_bench_dist_result *r);
void moe_bench_dist_result_free(struct moe_bench_dist_result *r);

#endif
