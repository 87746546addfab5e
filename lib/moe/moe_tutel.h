/* moe_tutel.h - the MoE layer's parameters in Tutel's state-dict names, as a safetensors file:
 * what tutel.moe.moe_layer(gate_type={'type': 'top', ...}, experts={'type': 'ffn', ...})
 * .state_dict() holds on one rank (tutel/impls/moe_layer.py, tutel/experts/ffn.py,
 * tutel/gates/top.py), so that a layer of moe-bench is loaded into Tutel (load_state_dict)
 * and one of Tutel's is loaded here. With El experts on the rank, each split over s ranks
 * (moe_dist.h's placement; one process: El = E, s = 1):
 *
 *   gates.0.wg.weight         [E, M]         the gate's nn.Linear weight: logits = x wg^T
 *                                            (moe.h's wg [M, E], transposed)
 *   experts.batched_fc1_w     [El, H/s, M]   fc1 weights out-in: row h = the weights into
 *                                            hidden unit h (moe.h's w1 [E, M, H] per expert
 *                                            transposed; moe_dist's shard as it is)
 *   experts.batched_fc1_bias  [El, H/s]
 *   experts.batched_fc2_w     [El, H/s, M]   fc2 weights in-out: row h = the weights out of
 *                                            hidden unit h (moe.h's w2, moe_dist's shard)
 *   experts.batched_fc2_bias  [El, M/s]      Tutel's shard of the output bias (E >= W: the
 *                                            whole [El, M])
 *   _num_global_experts       []  int64      E
 *
 * all float32 but the last. Beside them a file may hold moe_bench.input and moe_bench.output
 * ([T, M]: a step's x and y, so that the layer's output can be checked elsewhere); Tutel's
 * load_state_dict(..., strict=False) passes over them. The metadata record what wrote it,
 * the world and the rank, the layer's E, M, H, k, activation, BPR, capacity alignment and
 * gate noise, and the step's capacity setting and index: all that the output depends on
 * (test/ref/tutel_layer.py recomputes it, with numpy or with Tutel).
 */
#ifndef CORE_MOE_TUTEL_H
#define CORE_MOE_TUTEL_H

#include <stdint.h>

#include "moe/moe.h"
#include "moe/moe_dist.h"

/* The placement of one process: W = 1, El = E, s = 1. */
void moe_tutel_place_one(struct moe_dist_place *pl, const struct moe_config *cfg);

/* A step of the layer saved beside it: y = layer(x) at this capacity setting and step (the
 * gate noise's index), x and y [T, M] in the backend memory of the parameters. */
struct moe_tutel_step {
	const float *x, *y;
	int64_t T;
	double setting;
	long step;
};

/* Write path atomically: p (moe.h's layout when full, else moe_dist's shard of placement pl)
 * in Tutel's names; the step's x and y (st may be NULL) as moe_bench.input and .output, its
 * setting, the layer's k, activation, BPR, alignment and noise in the metadata. */
int moe_tutel_save(const char *path, const struct moe_config *cfg,
		   const struct moe_dist_place *pl, const struct moe_params *p, int full,
		   const struct moe_tutel_step *st);
/* Read path into p (as moe_tutel_save lays it out). Errors name the file: CORE_ENOTFOUND a
 * tensor missing, CORE_ESHAPE one of another dtype or shape than this layer's (both shapes
 * said), CORE_EFORMAT _num_global_experts other than E; p is left as it was. */
int moe_tutel_load(const char *path, const struct moe_config *cfg,
		   const struct moe_dist_place *pl, struct moe_params *p, int full);

#endif
