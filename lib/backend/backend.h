/* backend.h - the table of operations the model is written against.
 *
 * gpt2.c calls only these ops, so a device backend (CUDA, later) fills the same table with
 * its own kernels and the model code does not change. Pointers are to float32 buffers in the
 * backend's memory, row-major, contiguous unless a leading dimension is given. Shapes use the
 * model's letters: N rows (= B*T tokens), C channels, OC/IC output/input width, V vocab,
 * NH heads. Every op is deterministic for a given thread count: reductions over rows use
 * fixed chunks summed in a fixed order, never atomics.
 *
 * Conventions: "forward" ops overwrite their outputs. "backward" ops overwrite parameter
 * gradients (each parameter is used once per step) and overwrite or accumulate the input
 * gradient as the `accumulate` flag says (the residual stream accumulates).
 */
#ifndef CORE_BACKEND_H
#define CORE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

/* Rows of a row-reduction are split into this many fixed chunks, whatever the thread count;
 * ops that reduce over rows take a partials buffer of BACKEND_CHUNKS * (what they say). */
#define BACKEND_CHUNKS 32

/* Weight layouts for matmul: Conv1D (HF GPT-2 attn/mlp): w [IC,OC], y = x w.
 * Linear (lm_head): w [OC,IC], y = x w^T. */
enum backend_wlayout { BACKEND_W_IO = 0, BACKEND_W_OI = 1 };

/* A run [offset, offset + n) of a flat parameter buffer and the weight decay it gets. */
struct backend_segment {
	size_t offset, n;
	double weight_decay;
};

struct backend_ops {
	const char *name;

	/* y[N,OC] = x[N,IC] w + bias (bias may be NULL). */
	void (*matmul_forward)(float *y, const float *x, const float *w, const float *bias, int N,
			       int IC, int OC, enum backend_wlayout layout);
	/* dx[N,IC] (+)= dy w^T; dw = x^T dy (layout of w); dbias[OC] = column sums of dy.
	 * dx, dw, dbias may each be NULL (not wanted). */
	void (*matmul_backward)(float *dx, float *dw, float *dbias, const float *dy, const float *x,
				const float *w, int N, int IC, int OC, enum backend_wlayout layout,
				int accumulate);

	/* out[N,C] = wte[tok] + wpe[t] for tokens tok[B*T] at positions t = row % T. */
	void (*encoder_forward)(float *out, const int32_t *tok, const float *wte, const float *wpe,
				int B, int T, int C);
	/* dwte[V,C] and dwpe[T,C] overwritten (rows not hit are zero). */
	void (*encoder_backward)(float *dwte, float *dwpe, const float *dout, const int32_t *tok,
				 int B, int T, int C, int V);

	/* out = (x - mean) * rstd * w + b per row (eps 1e-5, biased variance); mean and rstd
	 * [N] are kept for the backward. */
	void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *x,
				  const float *w, const float *b, int N, int C);
	/* Fused residual + layernorm: res = res + skip + bias (res holds a branch output on
	 * entry; bias may be NULL), then out = layernorm(res). */
	void (*residual_layernorm_forward)(float *res, float *out, float *mean, float *rstd,
					   const float *skip, const float *bias, const float *w,
					   const float *b, int N, int C);
	/* dx (+)= layernorm input gradient; dw, db overwritten. partials: 2*C floats each of
	 * BACKEND_CHUNKS. */
	void (*layernorm_backward)(float *dx, float *dw, float *db, float *partials,
				   const float *dout, const float *x, const float *w,
				   const float *mean, const float *rstd, int N, int C,
				   int accumulate);

	/* pre[N,C] += bias (in place); out = gelu_tanh(pre). */
	void (*bias_gelu_forward)(float *pre, float *out, const float *bias, int N, int C);
	/* d[N,C]: on entry dL/d gelu output, on exit dL/d pre; dbias[C] = column sums of it. */
	void (*gelu_backward)(float *d, float *dbias, const float *pre, int N, int C);

	/* Causal multi-head attention over qkv [B,T,3C] (q | k | v, head h at columns
	 * h*hs..(h+1)*hs of each third), scale 1/sqrt(hs): out [B,T,C]; att [B,NH,T,T] keeps
	 * the probabilities for the backward (entries above the diagonal are unspecified). */
	void (*attention_forward)(float *out, float *att, float *ws, const float *qkv, int B, int T,
				  int C, int NH);
	/* dqkv [B,T,3C] overwritten from dout [B,T,C]. */
	void (*attention_backward)(float *dqkv, float *ws, const float *dout, const float *qkv,
				   const float *att, int B, int T, int C, int NH);
	/* Floats of the workspace ws both take, for sequence length T and head size hs, at the
	 * current thread count (omp_get_max_threads()). */
	size_t (*attention_ws_floats)(int T, int hs);

	/* In place: logits [N,V] -> softmax probabilities; losses[n] = -log p[n, target[n]]
	 * (targets may be NULL: probabilities only, losses untouched). */
	void (*crossentropy_forward)(float *probs, float *losses, const int32_t *targets, int N,
				     int V);
	/* In place: probs -> dlogits = scale * (p - onehot(target)), scale = 1/N for a mean. */
	void (*crossentropy_backward)(float *probs, const int32_t *targets, int N, int V,
				      float scale);

	/* One AdamW step on the segments of the flat buffers p, g, m, v (torch.optim.AdamW
	 * arithmetic, see backend_cpu.c), each segment with its own weight decay wd:
	 * g' = grad_scale * g; p *= 1 - lr*wd; m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2;
	 * p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). */
	void (*adamw_update)(float *p, const float *g, float *m, float *v,
			     const struct backend_segment *seg, int nseg, double lr, double beta1,
			     double beta2, double eps, long t, float grad_scale);
	/* Sum of squares of x[0..n) in double, fixed-order. */
	double (*sum_squares)(const float *x, size_t n);

	/* Profiling: enable (1) or disable (0) timing of matrix products, clearing the total;
	 * gemm_seconds is the wall-clock time spent in them since. */
	void (*profile)(int enable);
	double (*gemm_seconds)(void);
};

/* The CPU backend: OpenMP loops and CBLAS sgemm. */
const struct backend_ops *backend_cpu(void);

/* out[j] = sum over i < rows of a[i * n + j]. OpenMP-parallel over slices of columns, each
 * column summed in row order by one thread, so the bits do not depend on the thread count.
 * The CPU backend's bias gradients, and the MoE layer's (which calls CBLAS directly). */
void cpu_column_sums(float *out, const float *a, int64_t rows, int64_t n);

#endif
