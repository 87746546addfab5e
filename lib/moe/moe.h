/* moe.h - one Mixture-of-Experts layer on any backend (Tutel, arXiv 2206.03382, sec. 3.4.x).
 *
 * Shapes follow Tutel: T tokens, model dim M, expert hidden dim H, E experts, top-k, capacity
 * C slots per expert. All tensors are float32, contiguous, row-major:
 *
 *   x, y, dx, dy   [T, M]        layer input / output and their gradients
 *   wg             [M, E]        gate weights (logits = x wg, no bias)
 *   w1 [E, M, H], b1 [E, H]      expert fc1:  h   = act(disp[e] w1[e] + b1[e])
 *   w2 [E, H, M], b2 [E, M]      expert fc2:  out = h w2[e] + b2[e]
 *   disp, eo       [E, C, M]     dispatched tokens (encode output), expert outputs
 *
 * Forward, one step (moe_forward):
 *  1. Gating. logits = x wg [T,E]; with gate noise s > 0 the routed logits are
 *     logits + s/E * N(0,1) (Tutel's `gate_noise`; draw (step, t, e) from rng.h stream
 *     RNG_STREAM_NOISE, index (step * T + t) * E + e). p = softmax(routed logits) in float32.
 *     The k largest p (ties: lower expert index first) give idx[r][t], r = 0..k-1 in
 *     descending order. Gate scores: k == 1: score = p[t, idx0] (not normalised, otherwise
 *     the gate would get no gradient); k > 1: score_r = p[t, idx_r] / max(sum_r' p[t, idx_r'],
 *     FLT_EPSILON), i.e. the k chosen values renormalised to sum 1 (Tutel normalize_gate).
 *  2. Auxiliary loss (returned, its gradient added in backward with weight aux_weight):
 *     MOE_LOSS_GSHARD (GShard, Lepikhin et al. 2020, Algorithm 1; Tutel gshard_loss):
 *       l = E * sum_e mean_t(mask1[t,e]) * mean_t(p[t,e]),  mask1 = one-hot of idx0;
 *       mask1 carries no gradient.
 *     MOE_LOSS_LOAD_IMPORTANCE (Shazeer et al. 2017, "Outrageously large neural networks",
 *       sec. 4 and appendix A; Tutel load_importance_loss), needs gate noise s > 0 and E >= 2:
 *       q = softmax(logits) (no noise); Imp_e = sum_t q[t,e];
 *       thr_t = routed (noisy) logit of the k-th choice (Tutel mixes units here: a logit
 *       against probabilities; we follow it); Load_e = sum_t Phi((q[t,e] - thr_t) / (s/E));
 *       cv2(v) = var(v) / (mean(v)^2 + 1e-10), var unbiased (divide by E-1);
 *       l = (cv2(Imp) + cv2(Load)) / 2.  Gradient flows through q and through thr_t.
 *  3. Batch-prioritized routing (BPR, Riquelme et al. 2021, V-MoE): when on, tokens are
 *     visited in the order of their top gate value p[t, idx0], descending, stable (ties keep
 *     token order); otherwise in token order.
 *  4. Capacity from the setting x (Tutel capacity_setting, sec. 3.4.9), n_e = number of
 *     (token, rank) choices of expert e, before dropping:
 *       x > 0:  C = k * int(x * ceil(T / E))   exactly Tutel's extract_critical: T/E rounded
 *               up in integers, times x in double, truncated toward zero (Python's int()),
 *               times k. So 1.1 with ceil(T/E) = 1000 gives 1100 (the product is
 *               1100.0000000000002), and x = 1 with T = 5, E = 2, k = 2 gives 6.
 *       x == 0: C = max_e n_e             (smallest C that drops nothing)
 *       x < 0:  C = min(max_e n_e, k * int(|x| * ceil(T / E)))
 *     then C is rounded up to a multiple of capacity_align (1 = no alignment). A setting
 *     that leaves C = 0 (Tutel would drop every token) is refused as a usage error.
 *  5. Locations: one pass over rank r = 0..k-1 (outer) and tokens in BPR order (inner) with
 *     one counter per expert: loc = counter[e]++; the choice is kept when loc < C, else
 *     dropped (loc = -1). So every first choice is placed before any second choice, and
 *     the kept slots of expert e are exactly 0..min(n_e, C)-1 (no holes). dropped counts
 *     the dropped (token, rank) choices.
 *  6. Encode (Tutel K0): disp[e, c] = x[t] for the choice placed at (e, c); the padding slots
 *     c >= min(n_e, C) are zeroed, nothing else is written twice.
 *  7. Experts: out = act(disp w1 + b1) w2 + b2, per expert, over the kept rows only (padding
 *     rows of eo are not written: nothing reads them). act: relu or tanh-GELU.
 *  8. Decode (Tutel K1): y[t] = sum_r [kept] score_r[t] * eo[idx_r, loc_r]; a token whose
 *     choices were all dropped gets y[t] = 0.
 * Backward (moe_backward, after moe_forward on the same layer, same x):
 *     decode backward: d_eo[e,c] = score * dy[t] (K0), dscore = <dy[t], eo[e,c]> (K2);
 *     expert backward (dW, db, d_disp); encode backward dx[t] = sum_r d_disp[idx_r, loc_r]
 *     (K1, unweighted); gate backward: dscore -> renormalisation -> softmax -> logits ->
 *     dwg = x^T dlogits, dx += dlogits wg^T; plus aux_weight * d(aux loss).
 * The dense GShard formulation (moe_dense_*) computes the same function with one-hot masks,
 * combine weights [T,E,C] and einsums; it is the baseline and the tests' oracle.
 *
 * Backend: the layer and its parameters live on a backend (backend.h) and every step is a
 * sequence of its ops (gate, count, locations, encode, GEMMs, decode and their backwards);
 * inputs, outputs and parameters are backend memory. The host reads back the expert counts
 * (it sizes C from them), the auxiliary loss, and nothing else.
 * Errors: CORE_EUSAGE for inconsistent sizes (E < 1, k < 1, k > E, T/M/H < 1, bad setting),
 * CORE_ENOMEM. Determinism: same inputs and seed give identical outputs at any thread count
 * and buffer alignment.
 */
#ifndef CORE_MOE_H
#define CORE_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

enum moe_act { MOE_ACT_RELU = 0, MOE_ACT_GELU = 1 };
enum moe_loss { MOE_LOSS_GSHARD = 0, MOE_LOSS_LOAD_IMPORTANCE = 1 };

struct moe_config {
	int64_t T, M, H; /* tokens (maximum per call), model dim, hidden dim */
	int E;           /* experts */
	int k;           /* default top-k (a call may pass another k in 1..E) */
	double capacity_setting; /* default setting, see 4. above */
	int capacity_align;      /* round C up to a multiple of this (>= 1) */
	int bpr;                 /* batch-prioritized routing on/off */
	float gate_noise;        /* s >= 0, see 1. above */
	enum moe_act act;
	enum moe_loss loss;
	uint64_t seed;           /* key for the gate noise */
};

/* Names of the activations ("relu", "gelu") and losses ("gshard", "load-importance"), for
 * options and reports; the _from_name functions return -1 for an unknown name. A list of the
 * names, comma-separated, for messages. */
const char *moe_act_name(enum moe_act a);
int moe_act_from_name(const char *name);
const char *moe_act_names(void);
const char *moe_loss_name(enum moe_loss l);
int moe_loss_from_name(const char *name);
const char *moe_loss_names(void);

/* Fill cfg with defaults: k 2, capacity 1.0, align 1, BPR off, no noise, relu, GShard loss. */
void moe_config_default(struct moe_config *cfg, int64_t T, int64_t M, int64_t H, int E);
/* CORE_EUSAGE with a detail naming the bad value when the config is inconsistent. */
int moe_config_check(const struct moe_config *cfg);

/* Parameters and gradients of one layer, shapes as above, in backend memory. */
struct moe_params {
	struct backend *be;
	float *wg, *w1, *b1, *w2, *b2;
};
/* Allocate (zeroed) / free parameter-shaped storage on be. */
int moe_params_alloc(struct moe_params *p, const struct moe_config *cfg, struct backend *be);
void moe_params_free(struct moe_params *p);
/* Deterministic init from seed: wg, w1, w2 ~ N(0, 1/sqrt(fan_in)), biases ~ N(0, 0.1). */
int moe_params_init(struct moe_params *p, const struct moe_config *cfg, uint64_t seed);

/* Routing metadata of one step: sizes and counts on the host, the per-choice arrays in
 * backend memory ([k][T], rank-major). */
struct moe_routing {
	int64_t T;
	int E, k;
	int64_t C;        /* capacity used */
	int64_t dropped;  /* dropped (token, rank) choices: sum_e max(n_e - C, 0) */
	float aux_loss;   /* value of the configured auxiliary loss */
	uint64_t noise_step; /* the step the gate noise was drawn for */
	int32_t *idx;     /* [k*T] expert of choice r of token t, at r*T + t (backend) */
	int32_t *loc;     /* [k*T] slot in that expert, -1 when dropped (backend) */
	float *score;     /* [k*T] gate score, renormalised, see 1. (backend) */
	int64_t *count;   /* [E] n_e: choices of expert e before dropping (host) */
	int64_t *used;    /* [E] min(n_e, C): kept rows of expert e (host) */
};

/* Per-stage wall times of the last call, seconds. gemm_fwd / gemm_bwd: the part of experts /
 * bwd_experts spent inside the expert sgemm calls (the rest of a step is "non-GEMM"). */
struct moe_times {
	double gate, scan, encode, experts, decode;                 /* forward */
	double bwd_decode, bwd_experts, bwd_encode, bwd_gate;       /* backward */
	double gemm_fwd, gemm_bwd;
};

struct moe_layer; /* opaque: config, workspace, saved activations */

/* A layer on be with workspace for up to cfg->T tokens. *out is NULL on failure. */
int moe_layer_init(struct moe_layer **out, const struct moe_config *cfg, struct backend *be);
void moe_layer_free(struct moe_layer *l);
/* Time each step's stages and expert GEMMs (struct moe_times; the backend's profile) from
 * now on: always in host memory; on a device only when asked (on = 1), since each stage then
 * waits for the device, and otherwise they are NaN and the device runs ahead. on = 0 stops
 * the stage syncs; the backend's profile, shared with its other users, stays on. */
void moe_layer_set_timing(struct moe_layer *l, int on);

/* Forward for T <= cfg->T tokens: y = MoE(x). k in 1..E (0 = config default); capacity
 * setting as in 4.; step indexes the gate-noise draws, or is MOE_STEP_EVAL: an evaluation
 * call (Tutel's eval mode), with no gate noise, where the load-importance loss, which needs
 * the noise, gives way to GShard's value and cannot be backpropagated (moe_backward refuses).
 * Saves what backward needs. */
#define MOE_STEP_EVAL UINT64_MAX
int moe_forward(struct moe_layer *l, const struct moe_params *p, const float *x, float *y,
		int64_t T, int k, double capacity_setting, uint64_t step);
/* Steps 1-5 only (gating, capacity, locations) for T tokens, with the same arguments as
 * moe_forward (which calls it); the routing is then in moe_layer_routing(). */
int moe_route(struct moe_layer *l, const float *wg, const float *x, int64_t T, int k,
	      double capacity_setting, uint64_t step);
/* The layer's encode and decode kernels alone, as moe-bench --only=encode-decode times them
 * on the routing of the last moe_route: disp = encode(x) (padding zeroed), y = decode(disp);
 * with backward, dscore and d_disp from decode backward (d_disp over disp), then dx =
 * encode-backward(d_disp). disp holds E*C*M floats; times->encode, decode, bwd_decode and
 * bwd_encode are set, on a device too (each kernel waited for). */
int moe_encode_decode(struct moe_layer *l, const float *x, float *disp, float *y,
		      const float *dy, float *dscore, float *dx, int backward,
		      struct moe_times *times);
/* The same on bfloat16 rows (backend.h's moe_*_bf16 ops; dscore stays float):
 * CORE_EUNSUPPORTED when the backend lacks them. */
int moe_encode_decode_bf16(struct moe_layer *l, const uint16_t *x, uint16_t *disp, uint16_t *y,
			   const uint16_t *dy, float *dscore, uint16_t *dx, int backward,
			   struct moe_times *times);
/* Backward of the last forward: dx [T,M] and every gradient in g are overwritten. dx may be
 * NULL when the input needs no gradient: then the d_disp GEMM, encode-backward and the
 * gate's input term are skipped (as PyTorch skips them for an input without grad).
 * aux_weight multiplies the auxiliary loss added to the objective. */
int moe_backward(struct moe_layer *l, const struct moe_params *p, const float *x,
		 const float *dy, float *dx, struct moe_params *g, float aux_weight);

/* The routing of the last forward (valid until the next forward). */
const struct moe_routing *moe_layer_routing(const struct moe_layer *l);
/* The same routing as the backend's MoE ops take it. */
const struct backend_moe_route *moe_layer_route(const struct moe_layer *l);
/* Stage times of the last forward / backward. */
const struct moe_times *moe_layer_times(const struct moe_layer *l);
/* The high-water of the bytes the layer holds (workspace, saved activations, routing), each
 * buffer counted at its size rounded up to 64 bytes. The backend's own workspace
 * (be->op->workspace_bytes) comes on top. */
size_t moe_layer_peak_bytes(const struct moe_layer *l);

/* Bytes moe_forward (+ moe_backward when backward) allocates for T tokens, top-k and
 * capacity C (analytic; equals moe_layer_peak_bytes() after such a call on a fresh layer). */
size_t moe_layer_bytes_for(const struct moe_config *cfg, int64_t T, int k, int64_t C,
			   int backward);

/* ---- capacity (4. above), on the host ---- */

/* C for the given counts [E] and setting; align >= 1. 0 when the setting leaves no slot
 * (moe_route refuses that). */
int64_t moe_capacity(const int64_t *count, int E, int64_t T, int k, double setting,
		     int align);
/* Tutel's fixed capacity for a factor x > 0, before alignment: k * int(x * ceil(T / E)). */
int64_t moe_capacity_fixed(int E, int64_t T, int k, double x);

/* The flops a forward (+ backward) step does usefully: the gate 2 T M E, the experts
 * 4 R M H over the R = sum_e min(n_e, C) kept rows; a backward twice that, less 2 R M H +
 * 2 T M E without the input gradient. The same count for the sparse and dense formulations
 * (the dense one does more, on padding). */
double moe_step_flops(const struct moe_config *cfg, int64_t T, double R, int backward,
		      int input_grad);

/* ---- the dense GShard formulation: baseline and oracle ---- */

/* Forward and backward of the same function as moe_forward/moe_backward, written the GShard
 * way: masks [T,E] per rank, locations by cumulative sums of masks, combine [T,E,C],
 * dispatch = einsum("TEC,TM->ECM", combine != 0, x), y = einsum("TEC,ECM->TM", combine, eo),
 * backward by hand. On p's backend (x, y, dy, dx are its memory); the masks and the combine
 * tensor are built on the host. Allocates everything per call; dropped and C are returned
 * through the optional pointers. g may be NULL for forward only (then dy, dx are ignored). */
struct moe_dense_result {
	int64_t dropped, C;
	float aux_loss;
	struct moe_times times;
	size_t peak_bytes; /* what it allocated at its peak (= moe_dense_bytes) */
};
int moe_dense_step(const struct moe_config *cfg, const struct moe_params *p, const float *x,
		   float *y, int64_t T, int k, double capacity_setting, uint64_t step,
		   const float *dy, float *dx, struct moe_params *g, float aux_weight,
		   struct moe_dense_result *res);
/* Bytes the dense formulation allocates at its peak for this shape and capacity
 * (analytic; what moe_dense_step reports as peak_bytes). */
size_t moe_dense_bytes(const struct moe_config *cfg, int64_t T, int k, int64_t C,
		       int backward);

#endif
