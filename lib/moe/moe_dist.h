/* moe_dist.h - the MoE layer of moe.h across W ranks: expert parameters sharded ZeRO-3 style
 * over all ranks in one layout, and a plan {r, d, a} that may change every step at no cost
 * (Tutel, arXiv 2206.03382, sec. 3.4.2 adaptive parallelism, 3.4.4 adaptive pipelining,
 * 3.4.5 2DH All-to-All, 3.4.8 flexible All-to-All).
 *
 * Placement. Each rank q holds T local tokens. With E >= W (W divides E) rank q owns experts
 * q*E/W .. (q+1)*E/W - 1 whole (s = 1); with E < W (E divides W) each expert is split over
 * s = W/E consecutive ranks along the hidden dimension H: rank q holds rows
 * [(q % s) H/s, (q % s + 1) H/s) of expert q / s (s divides H and M). The shard:
 *   w1 [El, H/s, M]  fc1 weights out-in (row h = the weights into hidden unit h)
 *   b1 [El, H/s]
 *   w2 [El, H/s, M]  fc2 weights in-out (row h = the weights out of hidden unit h)
 *   b2 [El, M]       (E >= W; El = E/W)   or   [M/s], columns (q % s) M/s.. of b2[q/s]
 * So a run of ranks' shards, concatenated, is a run of hidden units (or experts) of the
 * full parameters: an all-gather in a group of consecutive ranks assembles them in place.
 * The gate wg [M, E] is replicated (data parallel; its gradient is summed over ranks).
 *
 * Plan r (the parallelism, one storage layout for all):
 *   r = 0   data parallel: every rank all-gathers every expert and runs all E on its own
 *           tokens; no tokens move; gradients are reduce-scattered to the shards.
 *   r >= 1  EP+DP+MP, r in the divisors of s (only r = 1 when E >= W): the ranks of an
 *           expert form r model-parallel slices of H/r hidden units, each slice all-gathered
 *           within a group of g = s/r consecutive ranks; every token is sent to all r slices
 *           (encode writes the r copies, "local repeat"), one of the g ranks of each slice
 *           takes 1/g of the capacity of each source; each slice returns a partial output
 *           (only slice 0 adds b2) and decode sums the r partials ("local sum").
 * Plan d in {1, 2, 4, 8} (pipelining, r >= 1): the capacity each rank sends each peer is cut
 * into d row ranges; the exchange of range i+1 runs on the communication thread while the
 * experts compute range i, and its return while range i+1 computes (on device memory: on the
 * backend's second queue, see below). Never the batch.
 * Plan a: the All-to-All algorithm (dist.h: linear or 2dh; mpi, the reference, also works on
 * host memory).
 *
 * The math is the single-process layer's (moe.h) on each rank's tokens with these
 * differences, all deliberate and all independent of the plan:
 *  - capacity: C_g slots per expert per rank, the same on every rank: setting 0 = the
 *    largest n_e over experts and ranks; x > 0 = k int(x ceil(T/E)) of the local T; x < 0
 *    the smaller; then rounded up to a multiple of lcm(capacity_align, s). Drops are
 *    decided per rank (Tutel's semantics); without drops every token's output is the
 *    single-process layer's on the concatenated batch of all ranks (tests check it);
 *  - gate noise of rank q at step t is drawn as step t*W + q of the single-process layer,
 *    which is exactly the noise its concatenated batch would draw;
 *  - the auxiliary loss is each rank's own, and the layer's objective carries their mean:
 *    aux_weight multiplies mean over ranks, reported as aux_loss.
 * Gradients: the objective is sum over ranks and tokens <dy, y> + aux_weight * mean aux; every
 * gradient shard is the sum over ranks of that rank's contributions (reduce-scatter), and
 * the gate's gradient is the same on every rank (all-reduce).
 *
 * Device memory (a backend that is not host-visible: cuda): the layer opens its own
 * dist_dev (dist_dev.h) at moe_dist_layer_init, on every rank (collective; CORE_EUNSUPPORTED
 * when the backend has no device collectives or NCCL is missing), and every exchange of
 * backend memory goes through it: the parameters' all-gather, the gradients' reduce-scatter
 * and the gate gradient's all-reduce (summed in rank order: the same bits on every rank),
 * and the tokens' All-to-All (a = linear or 2dh; a = mpi, which runs on host memory, is
 * CORE_EUSAGE). Only small host values (capacity, drops, auxiliary loss, agreement) go over
 * MPI. Pipelining d > 1 cuts the exchange as on the host, and the pieces' All-to-Alls run on
 * the backend's second queue (backend.h, side_begin; a second CUDA stream), ordered with the
 * experts by marks: piece i's exchange overlaps piece i-1's expert GEMMs. Nothing waits for
 * the device between the stages: the step's stage times (all but gate, which the host times
 * around the routing, whose counts come back to it), comm, comm_exposed and gemm are NaN
 * unless moe_dist_layer_set_timing asked for them, which synchronizes at every stage and
 * runs each exchange between two syncs (so nothing overlaps while timed). r > 1's route of
 * r expert copies is built on the device (moe_route_copies). The host path (cpu, ref) is
 * unchanged: stages always timed, d > 1 on the communication thread.
 *
 * Memory: the shard storage never changes; the layer's workspace (gathered parameters,
 * dispatch and receive buffers, activations) grows to the largest step and is reused, so
 * once every plan has run, switching r or d allocates nothing (moe_dist_stats.allocs).
 * Errors: as moe.h, plus CORE_EUSAGE for placements that do not fit (E and W, H or M not
 * divisible by s, r not allowed, d not in {1,2,4,8}) and for ranks that disagree on sizes or
 * on the step's arguments (every rank reports it, none hangs: checked before the first
 * exchange of each step).
 */
#ifndef CORE_MOE_DIST_H
#define CORE_MOE_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "dist/dist.h"
#include "moe/moe.h"

/* Where the experts of cfg lie on W ranks. */
struct moe_dist_place {
	int W, q;  /* world size, this rank */
	int s;     /* ranks per expert (1 when E >= W) */
	int El;    /* experts in this rank's shard (E/W, or 1 when E < W) */
	int64_t Hs; /* hidden rows in the shard: H / s */
	int64_t b2n; /* floats of b2 in the shard: El*M, or M/s */
	int r_max; /* ceil(W/E) = s */
};
/* CORE_EUSAGE naming the problem when cfg cannot be placed on W ranks. */
int moe_dist_place(struct moe_dist_place *pl, const struct moe_config *cfg, int W, int q);

struct moe_plan {
	int r;            /* 0 or a divisor of s */
	int d;            /* 1, 2, 4, 8 */
	enum dist_a2a a;
};
/* CORE_EUSAGE naming the allowed values when the plan does not fit the placement. d and a
 * are ignored (taken as 1 and linear) at r = 0, where no token moves. */
int moe_plan_check(const struct moe_plan *p, const struct moe_dist_place *pl);
/* The allowed r in increasing order (0 first), up to n; returns their number. */
int moe_plan_rs(const struct moe_dist_place *pl, int *rs, int n);

/* One rank's parameters (or gradients): a struct moe_params whose tensors hold the shard
 * above (moe_params_free frees it). */
int moe_dist_params_alloc(struct moe_params *p, const struct moe_config *cfg,
			  const struct moe_dist_place *pl, struct backend *be);
/* This rank's shard of full single-process parameters (moe.h's layout, on any backend; the
 * shard's backend may differ): the same numbers, placed as above. Gradients too. */
int moe_dist_params_from_full(struct moe_params *p, const struct moe_config *cfg,
			      const struct moe_dist_place *pl, const struct moe_params *full);
/* The inverse, on every rank (collective over d): full (moe.h's layout, any backend) = the
 * shards of all W ranks put back together, this rank's p among them; the gate from this
 * rank (the same on every rank). Gradient shards become the full gradient the same way. */
int moe_dist_params_to_full(struct moe_params *full, const struct moe_config *cfg,
			    const struct moe_dist_place *pl, const struct moe_params *p,
			    struct dist *d);
/* The same with the caller's host scratch buf of moe_dist_gather_floats(cfg, pl) floats,
 * allocating nothing when p and full are in host memory (a training model's every step). */
int moe_dist_params_to_full_buf(struct moe_params *full, const struct moe_config *cfg,
				const struct moe_dist_place *pl, const struct moe_params *p,
				struct dist *d, float *buf);
size_t moe_dist_gather_floats(const struct moe_config *cfg, const struct moe_dist_place *pl);
/* The shard of moe_params_init(seed)'s parameters (draws the full set on p's backend for a
 * moment, so the numbers do not depend on W). */
int moe_dist_params_init(struct moe_params *p, const struct moe_config *cfg,
			 const struct moe_dist_place *pl, uint64_t seed);

/* Per-step report. Times are this rank's wall seconds. */
struct moe_dist_step {
	int64_t C;        /* C_g, slots per expert per rank */
	int64_t need;     /* the largest n_e over experts and ranks (what setting 0 takes) */
	int64_t dropped;  /* dropped choices over all ranks */
	float aux_loss;   /* mean over ranks */
	struct moe_plan plan;
	double gate, encode, gather, experts, decode;    /* forward stages; experts includes */
	double bwd_decode, bwd_experts, bwd_encode, bwd_gate, reduce; /* its exchanges (NaN on
							 * a device, unless timed) */
	double comm;      /* seconds inside All-to-All exchanges (either thread), fwd + bwd */
	double comm_exposed; /* of which the caller's thread ran or waited for them: with
			      * d > 1, 1 - comm_exposed / comm is the share pipelining hid */
	double gemm;      /* seconds inside the expert GEMMs, fwd + bwd */
};

/* Counters over the layer's life. allocs counts workspace (re)allocations: once every plan
 * has run at the largest capacity it stops growing. param_bytes_moved counts the bytes of
 * parameters and gradients this rank received in all-gathers and reduce-scatters (the
 * plan's traffic, never a re-layout). On device memory allocs, bytes and peak include the
 * dist_dev's staging (grown to the largest step, then kept). */
struct moe_dist_stats {
	int64_t allocs;
	size_t bytes, peak;      /* workspace now and at most */
	int64_t steps;
	double param_bytes_moved, token_bytes_moved;
};

struct moe_dist_layer;

/* A layer for cfg on this rank of dist, with backend be (the CPU backends: exchanges read and
 * write backend memory as host memory; a device backend: through the dist_dev the layer
 * opens, see "Device memory"). Checks that all ranks passed the same cfg and the same kind
 * of backend memory. */
int moe_dist_layer_init(struct moe_dist_layer **out, const struct moe_config *cfg,
			struct backend *be, struct dist *d);
void moe_dist_layer_free(struct moe_dist_layer *l);
const struct moe_dist_place *moe_dist_layer_place(const struct moe_dist_layer *l);

/* Gating, capacity and locations for this step (every rank, same T, k, setting): afterwards
 * moe_dist_layer_last(l)->C and ->need say what the step needs, for choosing a plan. */
int moe_dist_route(struct moe_dist_layer *l, const struct moe_params *p, const float *x,
		   int64_t T, int k, double capacity_setting, uint64_t step);
/* The same with C_g = C slots per expert per rank (then aligned as above) whatever the
 * routing needs: what moe-profile measures a capacity bucket with. */
int moe_dist_route_capacity(struct moe_dist_layer *l, const struct moe_params *p,
			    const float *x, int64_t T, int k, int64_t C, uint64_t step);
/* The rest of the forward of the routed step under plan: y [T, M]. */
int moe_dist_forward_routed(struct moe_dist_layer *l, const struct moe_params *p,
			    const float *x, float *y, const struct moe_plan *plan);
/* Both. */
int moe_dist_forward(struct moe_dist_layer *l, const struct moe_params *p, const float *x,
		     float *y, int64_t T, int k, double capacity_setting, uint64_t step,
		     const struct moe_plan *plan);
/* Backward of the last forward, under its plan: dx (may be NULL) and the gradient shard g
 * (overwritten). */
int moe_dist_backward(struct moe_dist_layer *l, const struct moe_params *p,
		      const float *x, const float *dy, float *dx, struct moe_params *g,
		      float aux_weight);

const struct moe_dist_step *moe_dist_layer_last(const struct moe_dist_layer *l);
void moe_dist_layer_stats(const struct moe_dist_layer *l, struct moe_dist_stats *s);

/* On a device: time the stages and exchanges of the steps from now on (on = 1; the device is
 * synchronized at every stage and nothing overlaps), or let it run ahead (0, the default).
 * Host memory is always timed (its syncs cost nothing). Every rank alike. */
void moe_dist_layer_set_timing(struct moe_dist_layer *l, int on);
/* On a device with a second queue: the pipeline's exchanges there (1, the default) or in
 * order with the experts on the main queue (0: what the overlap saves is the difference).
 * Ignored on host memory. Every rank alike. */
void moe_dist_layer_set_overlap(struct moe_dist_layer *l, int on);

#endif
