/* moe_impl.h - the halves of the MoE layer's routing and its gate backward, for the layers
 * built on it inside lib/moe (moe_dist.c). Not part of libcore's public interface.
 *
 * moe_route() is moe_route_gate(), the capacity from the counts, then moe_route_place(): a
 * caller that decides C itself (the distributed layer takes the largest need over ranks)
 * calls the halves with its own C in between.
 */
#ifndef CORE_MOE_IMPL_H
#define CORE_MOE_IMPL_H

#include "moe/moe.h"

/* Parameters of sizes n[] (floats of wg, w1, b1, w2, b2), zeroed, on be: the full layer's
 * (moe_params_alloc) or a rank's shard (moe_dist_params_alloc). */
int moe_params_alloc_n(struct moe_params *p, struct backend *be, const size_t n[5]);
/* Steps 1-3 of moe.h for T tokens and top-k (1..E, checked by the caller): gating, the
 * auxiliary loss, and the counts n_e in moe_layer_routing()->count (host). */
int moe_route_gate(struct moe_layer *l, const float *wg, const float *x, int64_t T, int k,
		   uint64_t step);
/* Step 5 with capacity C >= 1: locations, used and dropped, and the backend route. */
int moe_route_place(struct moe_layer *l, int64_t C);
/* The gate's backward from dscore [k*T] (backend memory) for the routing of the last
 * moe_route_gate: dwg [M,E] = x^T dlogits (overwritten) and dx [T,M] += dlogits wg^T (dx
 * may be NULL). */
int moe_gate_backward(struct moe_layer *l, const float *wg, const float *x, const float *dscore,
		      float *dx, float *dwg, float aux_weight);

#endif
