/* backend.h - the seam between the math and the machine: a backend object, taken by name from
 * a registry, that owns its memory and runs every operation the model and the MoE layer need.
 *
 * The model (lib/model) and the MoE layer (lib/moe) are written against this table only, so a
 * device backend is added by filling the same table with its own kernels and one row of the
 * registry (backend.c); nothing above this layer changes. Built in:
 *   cpu   OpenMP loops and OpenBLAS sgemm: what every program runs by default;
 *   ref   plain C loops accumulating in double, no BLAS, no threads: the oracle every other
 *         backend is tested against, op by op (test/unit/test_backend.c), as ggml's
 *         test-backend-ops does. Written from the contracts below, not from the CPU code.
 *
 * Memory. Every pointer an op takes is backend memory from be->op->alloc (or an offset into
 * it), except where a parameter says "host": segment tables, argument structs. Data moves
 * in and out with upload and download. When be->host_visible is 1 (cpu, ref) backend memory
 * is ordinary host memory and the host may read and write it directly; code that must run on
 * any backend uses upload/download. Buffers hold float32 (or int32 tokens and slots, int64
 * counts, double sums, the bfloat16 rows of the *_bf16 MoE ops), row-major, contiguous
 * unless a leading dimension is given; they need no alignment beyond their element's (ops
 * must give the same bits at any such address).
 *
 * Errors. Every op returns 0 or a negative CORE_E* code (common/err.h) with the detail set.
 * A backend that queues work (a GPU) may report an op's failure at the next sync instead.
 * Ops only fail for reasons outside the caller's control (memory for internal workspace, a
 * device fault); argument errors are the caller's to prevent.
 *
 * Determinism. Same inputs and thread count give the same bits; the built-in backends also
 * give the same bits at any thread count and alignment. Reductions use fixed splits summed in
 * a fixed order, never atomics.
 *
 * Conventions: "forward" ops overwrite their outputs; "backward" ops overwrite parameter
 * gradients and overwrite or accumulate the input gradient as `accumulate` says. Shapes use
 * the model's letters: N rows (= B*T tokens), C channels, IC/OC input/output width, V vocab,
 * NH heads, and the MoE layer's: T tokens, M model dim, E experts, k choices, C slots.
 */
#ifndef CORE_BACKEND_H
#define CORE_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct backend;

/* Weight layouts for matmul: Conv1D (HF GPT-2 attn/mlp): w [IC,OC], y = x w.
 * Linear (lm_head): w [OC,IC], y = x w^T. */
enum backend_wlayout { BACKEND_W_IO = 0, BACKEND_W_OI = 1 };

/* Elementwise activations. GELU is the tanh approximation
 *   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 * (GPT-2's and Tutel's), relu(x) = max(x, 0). */
enum backend_act { BACKEND_ACT_GELU = 0, BACKEND_ACT_RELU = 1 };

/* How matrix products (gemm, matmul_*, the products inside attention and the MoE experts)
 * treat their float operands; everything else (parameters, activations, gradients, AdamW's
 * state, every other op) stays float32 whatever the precision, so float32 parameters are the
 * master weights of a reduced-precision run and checkpoints do not change.
 *   fp32  operands as they are, float32 products and sums: the only precision of cpu and ref;
 *   tf32  each operand rounded to TF32 (8 exponent bits, 10 stored mantissa bits: tensor
 *         cores), products summed in float32;
 *   bf16  each operand rounded to bfloat16 (8 exponent bits, 7 stored mantissa bits; round
 *         to nearest even), products summed in float32 into float32 outputs (the inputs'
 *         rounding is the only change: a product of two bfloat16 values is exact in float32).
 * Where the rounding of TF32 is not specified (the hardware's), a value exactly halfway may go
 * either way; other values round to the nearest. */
enum backend_precision { BACKEND_FP32 = 0, BACKEND_TF32 = 1, BACKEND_BF16 = 2 };

/* A bfloat16 (the upper half of a float32, in a uint16_t) widened to float: exact. */
static inline float backend_bf16_to_float(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

/* f rounded to bfloat16: to nearest, ties to even; a NaN stays a NaN (quietened, its sign
 * kept), as CUDA's __float2bfloat16_rn. */
static inline uint16_t backend_bf16_from_float(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x0040u);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* "fp32", "tf32", "bf16"; and back (-1 when unknown). */
const char *backend_precision_name(enum backend_precision p);
int backend_precision_from_name(const char *name);

/* A run [offset, offset + n) of a flat parameter buffer and the weight decay it gets. */
struct backend_segment {
	size_t offset, n;
	double weight_decay;
};

/* What the MoE gate ops need to know (host struct). */
struct backend_moe_gate {
	int64_t T;         /* tokens */
	int E, k;          /* experts, choices per token (1 <= k <= E) */
	float noise;       /* s >= 0: routed logit (t, e) = logit + s / E * rng_normal(seed,
			    * RNG_STREAM_NOISE, (step * T + t) * E + e) (common/rng.h); 0: none */
	uint64_t seed, step;
	int load_importance; /* auxiliary loss: 0 GShard, 1 load-importance (needs noise > 0,
			      * E >= 2) */
};

/* The routing of one step (host struct; the arrays are backend memory). */
struct backend_moe_route {
	int64_t T, C;           /* tokens, slots per expert */
	int E, k;
	const int32_t *idx;     /* [k*T] expert of choice r of token t, at r*T + t */
	const int32_t *loc;     /* [k*T] its slot in [0, C), or -1 when dropped */
	const float *score;     /* [k*T] its gate score */
	const int64_t *count;   /* [E] choices of each expert before dropping (n_e); expert e
				 * holds its kept choices in slots 0 .. min(n_e, C) - 1 */
};

/* Bytes of a communicator id (comm_unique_id): NCCL's NCCL_UNIQUE_ID_BYTES. */
enum { BACKEND_COMM_ID_BYTES = 128 };

/* One transfer of comm_exchange: bytes from buf to peer (recv = 0), or from peer into buf
 * (recv = 1); peer is a rank of the communicator. */
struct backend_xfer {
	int peer;
	int recv;
	void *buf;
	size_t bytes;
};

struct backend_ops {
	/* ---- lifetime and memory ------------------------------------------------------ */

	/* Free the backend's own state (backend_close calls it; memory still allocated from
	 * the backend is the caller's leak). */
	void (*close)(struct backend *be);

	/* *ptr = bytes of backend memory (contents undefined), at least 64-byte aligned;
	 * bytes == 0 gives a valid pointer to free. */
	int (*alloc)(struct backend *be, void **ptr, size_t bytes);
	void (*free)(struct backend *be, void *ptr); /* NULL is allowed */
	/* upload, download, copy: the source and destination ranges must not overlap. */
	int (*upload)(struct backend *be, void *dst, const void *host_src, size_t bytes);
	int (*download)(struct backend *be, void *host_dst, const void *src, size_t bytes);
	int (*copy)(struct backend *be, void *dst, const void *src, size_t bytes);
	/* A strided copy: rows rows of width bytes, row i from src + i * spitch to dst + i *
	 * dpitch (pitches >= width; rows or width 0: nothing). The stride copies of an
	 * All-to-All (lib/dist/dist_dev.h) gather or scatter the blocks of a piece with it: one
	 * call per block position instead of one copy per block. The source and destination
	 * ranges must not overlap. */
	int (*copy_2d)(struct backend *be, void *dst, size_t dpitch, const void *src,
		       size_t spitch, size_t width, size_t rows);
	int (*memset)(struct backend *be, void *dst, int byte, size_t bytes);
	/* Wait for all queued work; returns the first error an op reported since the last
	 * sync. Download waits by itself. */
	int (*sync)(struct backend *be);
	/* Bytes of workspace the backend holds for its ops (grown on demand, kept). */
	size_t (*workspace_bytes)(struct backend *be);

	/* ---- fills and reductions ------------------------------------------------------ */

	/* x[i] = value, i < n. */
	int (*fill)(struct backend *be, float *x, size_t n, float value);
	/* y[i] += x[i], i < n, one float rounding each (so every backend gives the same bits):
	 * the sums of the device reduce-scatter and all-reduce (lib/dist/dist_dev.h), added
	 * member by member in a fixed order. x and y must not overlap. */
	int (*add_f32)(struct backend *be, float *y, const float *x, size_t n);
	/* x[i] = mean + std * rng_normal(seed, stream, base + i) (common/rng.h), i < n, in
	 * float: a rounded product, then a rounded sum (no fused multiply-add), so every
	 * backend gives the same bits. */
	int (*fill_normal)(struct backend *be, float *x, size_t n, float mean, float std,
			   uint64_t seed, uint64_t stream, uint64_t base);
	/* *out (one double, backend memory) = sum over i < n of x[i] (squares = 0) or x[i]^2
	 * (squares = 1), accumulated in double. */
	int (*sum)(struct backend *be, double *out, const float *x, size_t n, int squares);

	/* ---- matrix products ---------------------------------------------------------- */

	/* Row-major C[M,N] = alpha op(A) op(B) + beta C, op(X) = X or X^T (transA, transB),
	 * leading dimensions lda, ldb, ldc in elements (as CBLAS row-major). beta == 0: C is
	 * not read (may hold NaN). */
	int (*gemm)(struct backend *be, int transA, int transB, int M, int N, int K, float alpha,
		    const float *A, int lda, const float *B, int ldb, float beta, float *C,
		    int ldc);
	/* y[N,OC] = x[N,IC] w + bias (bias [OC] may be NULL). */
	int (*matmul_forward)(struct backend *be, float *y, const float *x, const float *w,
			      const float *bias, int N, int IC, int OC,
			      enum backend_wlayout layout);
	/* dw = x^T dy in the layout of w; dbias[OC] = column sums of dy; dx[N,IC] = dy w^T,
	 * added to dx when accumulate. dx, dw, dbias may each be NULL (not wanted). dw and
	 * dbias are computed before dx is written, so dx may be the same buffer as x. */
	int (*matmul_backward)(struct backend *be, float *dx, float *dw, float *dbias,
			       const float *dy, const float *x, const float *w, int N, int IC,
			       int OC, enum backend_wlayout layout, int accumulate);

	/* ---- GPT-2 ---------------------------------------------------------------------- */

	/* out[n,:] = wte[tok[n],:] + wpe[n % T,:] for the B*T tokens tok (int32 in [0, V)). */
	int (*encoder_forward)(struct backend *be, float *out, const int32_t *tok,
			       const float *wte, const float *wpe, int B, int T, int C);
	/* dwte[V,C] = sum over n with tok[n] = v of dout[n,:] (rows no token hit are zero);
	 * dwpe[t,:] = sum over b of dout[b*T + t,:] for t < T (rows T.. are not written). */
	int (*encoder_backward)(struct backend *be, float *dwte, float *dwpe, const float *dout,
				const int32_t *tok, int B, int T, int C, int V);
	/* Per row: mean, biased variance var, rstd = 1/sqrt(var + 1e-5), out = (x - mean) *
	 * rstd * w + b; mean[N] and rstd[N] are kept for the backward. */
	int (*layernorm_forward)(struct backend *be, float *out, float *mean, float *rstd,
				 const float *x, const float *w, const float *b, int N, int C);
	/* res = res + skip + bias (res holds a branch output on entry; bias [C] may be NULL),
	 * then out = layernorm(res) as above. */
	int (*residual_layernorm_forward)(struct backend *be, float *res, float *out, float *mean,
					  float *rstd, const float *skip, const float *bias,
					  const float *w, const float *b, int N, int C);
	/* With xhat = (x - mean) rstd from the forward: dw = sum_n dout xhat, db = sum_n dout
	 * (overwritten); dx = rstd (w dout - mean_c(w dout) - xhat mean_c(w dout xhat)),
	 * added to dx when accumulate. */
	int (*layernorm_backward)(struct backend *be, float *dx, float *dw, float *db,
				  const float *dout, const float *x, const float *w,
				  const float *mean, const float *rstd, int N, int C,
				  int accumulate);
	/* pre[N,C] += bias (bias [C]; in place), out = act(pre). For relu out may be pre (then
	 * only out is kept, which is all relu's backward needs). */
	int (*bias_act_forward)(struct backend *be, float *pre, float *out, const float *bias,
				int N, int C, enum backend_act act);
	/* d[N,C]: on entry dL/d out, on exit dL/d pre = d * act'(pre); dbias[C] = column sums
	 * of the result (may be NULL). x is pre (gelu) or pre or out (relu: out > 0 iff
	 * pre > 0, and act'(0) = 0). */
	int (*act_backward)(struct backend *be, float *d, float *dbias, const float *x, int N,
			    int C, enum backend_act act);
	/* Causal multi-head attention over qkv [B,T,3C] (q | k | v, head h at columns
	 * h*hs..(h+1)*hs of each third, hs = C/NH): scores q.k / sqrt(hs) over keys j <= i,
	 * softmax P, out [B,T,C] = P v. att [B,NH,T,T] is scratch the caller provides and the
	 * backend fills with whatever its backward needs: its content is the backend's own
	 * business, so the backward must be given the att this backend's forward wrote, and
	 * nothing else may rely on it. When be->attention_keeps_p is 1 att holds P on and below
	 * the diagonal (cpu, ref, cuda's default; above the diagonal still the backend's: the
	 * CPU backend's block products rely on the zeros its forward writes there); cuda's
	 * fused attention keeps the rows' logsumexp there instead, and a copy of out when
	 * T > hs (kernels/attention.cu). */
	int (*attention_forward)(struct backend *be, float *out, float *att, const float *qkv,
				 int B, int T, int C, int NH);
	/* dqkv [B,T,3C] overwritten from dout [B,T,C], with att from attention_forward. */
	int (*attention_backward)(struct backend *be, float *dqkv, const float *dout,
				  const float *qkv, const float *att, int B, int T, int C, int NH);
	/* ---- bfloat16 activations (optional: NULL where the backend has none) ----------
	 *
	 * An activation that feeds nothing but matrix products (a LayerNorm's output before
	 * the attention, the MLP or the head; attention's output; GELU's output) is rounded
	 * to bfloat16 by those products in BACKEND_BF16 anyway. These ops write it rounded in
	 * the first place and read it so: half the bytes written and read, and no rounding
	 * of it inside the products. Each gives the bits of the float op of the same name
	 * with its out rounded to bfloat16 (to nearest, ties to even), or with its x widened
	 * from bfloat16, in any precision; in BACKEND_BF16, where a product rounds x anyway,
	 * a model that uses them therefore trains to the same bits as one that does not. */
	int (*layernorm_forward_bf16)(struct backend *be, uint16_t *out, float *mean,
				      float *rstd, const float *x, const float *w, const float *b,
				      int N, int C);
	int (*residual_layernorm_forward_bf16)(struct backend *be, float *res, uint16_t *out,
					       float *mean, float *rstd, const float *skip,
					       const float *bias, const float *w, const float *b,
					       int N, int C);
	int (*bias_act_forward_bf16)(struct backend *be, float *pre, uint16_t *out,
				     const float *bias, int N, int C, enum backend_act act);
	int (*attention_forward_bf16)(struct backend *be, uint16_t *out, float *att,
				      const float *qkv, int B, int T, int C, int NH);
	int (*matmul_forward_bf16)(struct backend *be, float *y, const uint16_t *x,
				   const float *w, const float *bias, int N, int IC, int OC,
				   enum backend_wlayout layout);
	int (*matmul_backward_bf16)(struct backend *be, float *dx, float *dw, float *dbias,
				    const float *dy, const uint16_t *x, const float *w, int N,
				    int IC, int OC, enum backend_wlayout layout, int accumulate);
	/* In place: logits [N,V] -> softmax probabilities; losses[n] = -log p[n, target[n]]
	 * (targets may be NULL: probabilities only, losses untouched). */
	int (*crossentropy_forward)(struct backend *be, float *probs, float *losses,
				    const int32_t *targets, int N, int V);
	/* In place: probs -> scale * (p - onehot(target)) (scale 1/N for a mean loss); targets
	 * are required here. */
	int (*crossentropy_backward)(struct backend *be, float *probs, const int32_t *targets,
				     int N, int V, float scale);
	/* One AdamW step on the segments (host array) of the flat buffers p, g, m, v, each
	 * segment with its own weight decay wd (elements between segments untouched):
	 *   g' = grad_scale g; p *= 1 - lr wd; m = b1 m + (1 - b1) g'; v = b2 v + (1 - b2) g'^2;
	 *   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
	 * Bit for bit as torch 1.13's _single_tensor_adamw on float tensors: the scalars
	 * 1 - lr wd, b1, 1 - b1, b2, 1 - b2, sqrt(1 - b2^t), eps and -lr / (1 - b1^t) are
	 * formed in double and rounded to float once; then per element, in float, with each
	 * operation rounded: g' = g * grad_scale; p' = p * (1 - lr wd);
	 * m = fma(1 - b1, g', m * b1); v = fma((1 - b2) * g', g', v * b2);
	 * d = sqrt(v) / sqrt(1 - b2^t) + eps; p = p' + (-lr / (1 - b1^t) * m) / d.
	 * (The reference backend computes the formula in double instead: it is the oracle
	 * for the math, the torch test pins the rounding.) */
	int (*adamw_update)(struct backend *be, float *p, const float *g, float *m, float *v,
			    const struct backend_segment *seg, int nseg, double lr, double beta1,
			    double beta2, double eps, long t, float grad_scale);

	/* ---- the MoE layer (Tutel, arXiv 2206.03382 sec. 3.4; lib/moe/moe.h) -------------- */

	/* Gating of g->T tokens from logits [T,E]:
	 *  probs [T,E] = softmax over e of the routed logits (logit + noise, see
	 *    backend_moe_gate), in float;
	 *  clean [T,E] = softmax of the logits without noise (only when load_importance; else
	 *    clean may be NULL);
	 *  idx[r*T + t], r < k: the k largest probs of token t in descending order, ties to the
	 *    lower expert index;
	 *  score[r*T + t] = probs[t, idx]; when k > 1 divided by max(sum over the k chosen,
	 *    FLT_EPSILON) (the k values renormalised);
	 *  top[t] = probs[t, idx[t]] (the rank-0 probability, the BPR key);
	 *  *aux (one float, backend memory) = the auxiliary loss, in double, rounded:
	 *    GShard: E * sum_e (n1_e / T) (sum_t probs[t,e] / T), n1_e = tokens whose rank-0
	 *      choice is e;
	 *    load-importance: sigma = s/E, Imp_e = sum_t clean[t,e], thr_t = the routed logit
	 *      of token t's rank-(k-1) choice, Load_e = sum_t Phi((clean[t,e] - thr_t) / sigma)
	 *      (Phi the standard normal CDF), cv2(v) = var(v) / (mean(v)^2 + 1e-10) with the
	 *      unbiased variance (divide by E-1); aux = (cv2(Imp) + cv2(Load)) / 2. */
	int (*moe_gate_forward)(struct backend *be, const struct backend_moe_gate *g,
				const float *logits, float *probs, float *clean, float *top,
				int32_t *idx, float *score, float *aux);
	/* dlogits [T,E] (overwritten) = the gradient w.r.t. the logits of
	 *   sum_{r,t} dscore[r*T + t] * score[r*T + t] + aux_weight * aux
	 * through the renormalisation (when the sum of the k chosen probs was clamped at
	 * FLT_EPSILON the divisor is a constant) and the softmax; the noise is a constant; the
	 * GShard n1_e carry no gradient; load-importance: the gradient flows through clean and
	 * through thr_t, which is a routed logit (noise constant), and Phi' is the normal pdf.
	 * logits, probs, clean (load-importance only), idx are the forward's. */
	int (*moe_gate_backward)(struct backend *be, const struct backend_moe_gate *g,
				 const float *logits, const float *probs, const float *clean,
				 const int32_t *idx, const float *dscore, float aux_weight,
				 float *dlogits);
	/* count[e] (int64, backend memory) = number of i < n with idx[i] == e, e < E (every
	 * idx[i] in [0, E)). */
	int (*moe_count)(struct backend *be, const int32_t *idx, int64_t n, int E,
			 int64_t *count);
	/* Slots: visiting ranks r = 0..k-1 (outer) and, within a rank, the tokens in order of
	 * top[t] descending, ties in token order (top NULL: token order), each choice takes
	 * the next free slot of its expert: loc = the number of choices of that expert
	 * visited before it, kept when loc < C, else loc = -1 (dropped). */
	int (*moe_locations)(struct backend *be, const int32_t *idx, const float *top, int64_t T,
			     int k, int E, int64_t C, int32_t *loc);
	/* The route of r copies of every expert (the distributed layer at r > 1,
	 * lib/moe/moe_dist.c), from in's arrays, n = in->k * in->T: for i < n and j < r,
	 * vidx[j*n + i] = in->idx[i] * r + j, vloc[j*n + i] = in->loc[i] and
	 * vscore[j*n + i] = in->score[i]; vcount[e*r + j] = in->count[e] for e < in->E. NULL
	 * where backend memory is host memory (cpu, ref): the caller writes them itself. */
	int (*moe_route_copies)(struct backend *be, const struct backend_moe_route *in, int r,
				int32_t *vidx, int32_t *vloc, float *vscore, int64_t *vcount);
	/* Encode (Tutel K0): disp[E,C,M] row (idx, loc) = x[t] for every kept choice of token t;
	 * rows past min(n_e, C) of each expert are zeroed when zero_pad, else left as they
	 * are. */
	int (*moe_encode)(struct backend *be, const struct backend_moe_route *r, const float *x,
			  float *disp, int64_t M, int zero_pad);
	/* Decode (K1): y[t] = sum over t's kept choices, in rank order, of score * eo[idx, loc]
	 * (fused multiply-adds from zero: y = fma(s_r, eo_r, y)); a token with no kept choice
	 * gets zeros. */
	int (*moe_decode)(struct backend *be, const struct backend_moe_route *r, const float *eo,
			  float *y, int64_t M);
	/* Decode backward: for every kept choice (r, t): dscore[r*T + t] = <dy[t], eo[idx, loc]>
	 * (K2) and d_eo[idx, loc] = score * dy[t] (K0); dropped choices get dscore 0. Padding
	 * rows of d_eo are zeroed when zero_pad. d_eo may be eo (each row is read before it is
	 * written). */
	int (*moe_decode_backward)(struct backend *be, const struct backend_moe_route *r,
				   const float *dy, const float *eo, float *d_eo, float *dscore,
				   int64_t M, int zero_pad);
	/* Encode backward (K1 unweighted): dx[t] = sum over t's kept choices, in rank order, of
	 * d_disp[idx, loc]; zeros when none. */
	int (*moe_encode_backward)(struct backend *be, const struct backend_moe_route *r,
				   const float *d_disp, float *dx, int64_t M);

	/* The four dispatch ops above on bfloat16 data (NULL where a backend lacks them; cpu,
	 * ref and cuda have them).
	 * A bfloat16 is a uint16_t holding the upper half of a float32 (8 exponent bits, 7
	 * stored mantissa bits); bf(v) below is v rounded to it, to nearest, ties to even (a
	 * NaN stays a NaN). The routing (idx, loc, score, count) and dscore stay float32; only
	 * the rows ([T, M] and [E, C, M]) change type, so the same route serves both. Each sum
	 * is the fp32 op's float32 computation on the values widened to float (exactly), with
	 * one rounding to bfloat16 at the end:
	 *   encode_bf16: the rows copied bit for bit (padding rows zeroed or left as above);
	 *   decode_bf16: y[t] = bf(the fp32 decode's fma chain over the kept choices of t);
	 *   decode_backward_bf16: dscore = <dy[t], eo row> accumulated in float32 (output
	 *     float32; a product of two bfloat16 values is exact in float32, so only the sum
	 *     rounds), d_eo row = bf(score * dy[t]) (the float32 product, then bf: the one
	 *     double rounding of the set, at most a bfloat16 ulp from the exact product's);
	 *     d_eo may be eo, padding rows zeroed when zero_pad;
	 *   encode_backward_bf16: dx[t] = bf(the float32 sum, in rank order, of the rows).
	 * Rounding once from a float32 sum leaves a result within half a bfloat16 ulp of that
	 * sum, so within about one ulp (2^-7 relative) of the exact value, plus the float32
	 * sum's own error: what test_backend allows against ref (which sums in double). */
	int (*moe_encode_bf16)(struct backend *be, const struct backend_moe_route *r,
			       const uint16_t *x, uint16_t *disp, int64_t M, int zero_pad);
	int (*moe_decode_bf16)(struct backend *be, const struct backend_moe_route *r,
			       const uint16_t *eo, uint16_t *y, int64_t M);
	int (*moe_decode_backward_bf16)(struct backend *be, const struct backend_moe_route *r,
					const uint16_t *dy, const uint16_t *eo, uint16_t *d_eo,
					float *dscore, int64_t M, int zero_pad);
	int (*moe_encode_backward_bf16)(struct backend *be, const struct backend_moe_route *r,
					const uint16_t *d_disp, uint16_t *dx, int64_t M);

	/* ---- profiling ------------------------------------------------------------------ */

	/* Time the matrix products from now on (enable = 1; clears the total) or stop. */
	void (*profile)(struct backend *be, int enable);
	/* Wall-clock seconds spent in matrix products since profile(be, 1) (NaN if the backend
	 * cannot tell). */
	double (*gemm_seconds)(struct backend *be);

	/* ---- device collectives (NULL where the backend has none: cpu, ref) ----------------
	 *
	 * Point-to-point transfers between processes, one backend (one device) per process,
	 * on backend memory, for the MoE layer's All-to-All (lib/dist/dist_dev.h; cuda: NCCL).
	 * A communicator joins nranks processes: one of them makes an id, which the caller
	 * carries to the others by its own means (MPI), and each opens the communicator with
	 * that id and its rank. Opening is collective and blocks until all nranks have joined;
	 * processes that open several communicators open them in the same order. Only point
	 * to point: the All-to-All algorithms (Linear, 2DH) are the caller's, written once
	 * over these transfers and copy_2d, rather than once per backend.
	 *
	 * The errors are CORE_EUNSUPPORTED when the library behind them cannot be loaded (one
	 * line saying why), CORE_EIO for a failure of the library or of a peer. */

	/* id (host, BACKEND_COMM_ID_BYTES) = a new communicator id, made by one process of
	 * the future communicator. id NULL: only check that communicators can be made here
	 * (loads the library), so that every process can fail before any blocks in comm_open. */
	int (*comm_unique_id)(struct backend *be, void *id);
	/* *comm = this process, rank rank of nranks, in the communicator of id. */
	int (*comm_open)(struct backend *be, void **comm, const void *id, int nranks, int rank);
	/* Waits for the transfers queued on comm, then frees it (NULL is allowed). */
	void (*comm_close)(struct backend *be, void *comm);
	/* One round of transfers (host array x of nx entries), queued on the backend's queue
	 * after the ops before it and before those after it, like any op: every send and
	 * receive of the round may proceed at once (no order among them, so no deadlock
	 * between peers that each send before they receive), and the round is complete when
	 * the queue has run past it (sync, download). Between two processes, the k-th send of
	 * one to the other matches the k-th receive of the other from it, rounds in order,
	 * and the two must have the same bytes; entries of 0 bytes are skipped (on both sides).
	 * Buffers are backend memory and must not be touched until the round is complete. A
	 * mismatch (bytes, a missing partner) is an error where the library detects it, and
	 * a hang where it does not (NCCL mostly does not): the caller's to prevent. */
	int (*comm_exchange)(struct backend *be, void *comm, const struct backend_xfer *x,
			     int nx);

	/* ---- a second queue (NULL where ops run in call order anyway: cpu, ref) -------------
	 *
	 * For transfers that overlap the ops: the MoE layer's exchanges beside its experts'
	 * products (lib/moe/moe_dist.c). side_begin: the copy, copy_2d, memset and
	 * comm_exchange called from now on are queued on the backend's second queue, after
	 * everything queued on the main queue so far and after the second queue's own earlier
	 * work; every other op stays on the main queue. side_end: those four go back to the
	 * main queue, and *mark (if mark is not NULL) names the second queue's work so far.
	 * side_wait: the main queue's ops queued from now on wait until the second queue has
	 * run past mark. Nothing else orders the two queues: a main op that reads what the
	 * second queue writes needs a side_wait first, and a transfer must not write what the
	 * main queue still reads (the caller orders them with these calls). sync, upload and
	 * download wait for both queues. side_begin twice without a side_end between, side_end
	 * without side_begin and a mark not yet made are CORE_EUSAGE. Marks are kept in a ring
	 * of BACKEND_SIDE_MARKS: waiting for an older one waits for a later point of the second
	 * queue (correct, later). */
	int (*side_begin)(struct backend *be);
	int (*side_end)(struct backend *be, int64_t *mark);
	int (*side_wait)(struct backend *be, int64_t mark);
};

#define BACKEND_SIDE_MARKS 64

struct backend {
	const struct backend_ops *op;
	const char *name;  /* the registry name */
	int host_visible;  /* backend memory is host memory */
	int threads;       /* threads the backend's ops use */
	enum backend_precision precision; /* of its matrix products (backend_params) */
	const char *gemm_kernel; /* what runs its matrix products, for reports: "onednn 2.6.3
				  * avx512_core_amx", "openblas 0.3.21 SkylakeX", "cublas",
				  * "plain loops" */
	int attention_keeps_p; /* 1: attention_forward leaves P in att (see there); 0: att
				* holds something else of the backend's */
	void *ctx;         /* the backend's own state */
};

/* Options for backend_open; zero means "the default". */
struct backend_params {
	int threads; /* cpu: OpenMP and BLAS threads (default: OMP_NUM_THREADS or all cores) */
	enum backend_precision precision; /* of the matrix products (default fp32); a backend
					   * without it is CORE_EUSAGE at backend_open */
	int device;  /* cuda: the GPU, counted modulo the GPUs present (default 0); one process
		      * per GPU passes its rank on the node */
};

/* Open the backend registered under name (params may be NULL). An unknown name, or one this
 * binary was built without ("cuda" without nvcc), is CORE_EUSAGE naming the backends that
 * are built; a backend that is built but cannot start (no device) is CORE_EUNSUPPORTED. */
int backend_open(struct backend **out, const char *name, const struct backend_params *params);
void backend_close(struct backend *be);
/* The names built into this binary, comma-separated ("cpu, ref"). */
const char *backend_names(void);
/* The precisions backend `name` has, comma-separated ("fp32, tf32, bf16"); NULL when no
 * backend of that name is built. */
const char *backend_precisions(const char *name);

/* alloc, then memset to zero; *ptr NULL on failure. */
int backend_alloc_zero(struct backend *be, void **ptr, size_t bytes);

#endif
