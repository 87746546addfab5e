/* backend_ref.c - the reference backend "ref": every operation of backend.h as the plainest
 * loops that compute it, the oracle that test/unit/test_backend.c holds every other backend to.
 *
 * An oracle is worth exactly its independence and its accuracy, so:
 *  - it is written from the contracts in backend.h (and the math in moe.h's header comment),
 *    never from the CPU backend, the model or the MoE code: a mistake copied from there would
 *    hide in the comparison instead of showing;
 *  - every sum, dot product and transcendental function is computed in double and rounded to
 *    float once, at the end, so its own error is about half an ulp of each result and what a
 *    test sees is the other backend's float error;
 *  - no BLAS, no OpenMP, no SIMD: one thread and sums in index order, deterministic by
 *    construction and easy to read against the formula. It is still O(the math), e.g.
 *    attention costs B NH T^2 hs, because the tests run it on shapes of a few hundred.
 * Memory is host memory from aligned_alloc. Scratch is allocated per call and freed, so
 * workspace_bytes is 0. Speed is not a goal anywhere in this file.
 *
 * Where the contract prescribes float arithmetic (fill_normal, the gate noise) it is written as
 * separate statements, so that no compiler contracts a product and a sum into one fma (GCC
 * does not in ISO C mode; clang's default contracts only within one expression).
 */
#include "backend/backend.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "common/err.h"
#include "common/rng.h"
#include "common/banned.h"

/* Zeroed scratch of n elements of size bytes; NULL (with the detail set) on failure. */
static void *scratch(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size);
	if (!p)
		err_set(CORE_ENOMEM, NULL, "ref backend: cannot allocate %zu x %zu bytes",
			n, size);
	return p;
}

/* ---- lifetime and memory -------------------------------------------------------------- */

static void ref_close(struct backend *be)
{
	(void)be; /* no state: ctx is NULL */
}

static int ref_alloc(struct backend *be, void **ptr, size_t bytes)
{
	/* aligned_alloc wants a size that is a multiple of the alignment; 0 bytes still gets a
	 * block, so that the pointer can be freed like any other */
	size_t n = bytes ? bytes : 1;
	*ptr = NULL;
	if (n > SIZE_MAX - 63)
		return err_set(CORE_ENOMEM, NULL, "ref backend: cannot allocate %zu bytes", bytes);
	n = (n + 63) & ~(size_t)63;
	*ptr = aligned_alloc(64, n);
	if (!*ptr)
		return err_set(CORE_ENOMEM, NULL, "ref backend: cannot allocate %zu bytes", bytes);
	return 0;
}

static void ref_free(struct backend *be, void *ptr)
{
	free(ptr);
}

static int ref_upload(struct backend *be, void *dst, const void *host_src, size_t bytes)
{
	if (bytes)
		memcpy(dst, host_src, bytes);
	return 0;
}

static int ref_download(struct backend *be, void *host_dst, const void *src, size_t bytes)
{
	if (bytes)
		memcpy(host_dst, src, bytes);
	return 0;
}

static int ref_copy(struct backend *be, void *dst, const void *src, size_t bytes)
{
	if (bytes)
		memmove(dst, src, bytes);
	return 0;
}

static int ref_copy_2d(struct backend *be, void *dst, size_t dpitch, const void *src,
		       size_t spitch, size_t width, size_t rows)
{
	for (size_t i = 0; width && i < rows; i++)
		memcpy((char *)dst + i * dpitch, (const char *)src + i * spitch, width);
	return 0;
}

static int ref_memset(struct backend *be, void *dst, int byte, size_t bytes)
{
	if (bytes)
		memset(dst, byte, bytes);
	return 0;
}

static int ref_sync(struct backend *be)
{
	return 0; /* nothing is ever queued */
}

static size_t ref_workspace_bytes(struct backend *be)
{
	return 0; /* scratch lives for one call only */
}

/* ---- fills and reductions ------------------------------------------------------------- */

static int ref_fill(struct backend *be, float *x, size_t n, float value)
{
	for (size_t i = 0; i < n; i++)
		x[i] = value;
	return 0;
}

static int ref_add_f32(struct backend *be, float *y, const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		y[i] += x[i];
	return 0;
}

static int ref_fill_normal(struct backend *be, float *x, size_t n, float mean, float std,
			   uint64_t seed, uint64_t stream, uint64_t base)
{
	/* float arithmetic as the contract writes it, one rounding per operation: these bits
	 * must be every backend's bits */
	for (size_t i = 0; i < n; i++) {
		float scaled = std * rng_normal(seed, stream, base + i);
		x[i] = mean + scaled;
	}
	return 0;
}

static int ref_sum(struct backend *be, double *out, const float *x, size_t n, int squares)
{
	double s = 0;
	for (size_t i = 0; i < n; i++)
		s += squares ? (double)x[i] * x[i] : (double)x[i];
	*out = s;
	return 0;
}

/* ---- matrix products ------------------------------------------------------------------ */

static int ref_gemm(struct backend *be, int transA, int transB, int M, int N, int K, float alpha,
		    const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
	for (int i = 0; i < M; i++)
		for (int j = 0; j < N; j++) {
			double s = 0;
			for (int p = 0; p < K; p++) {
				/* op(A)[i,p] and op(B)[p,j] of the stored row-major matrices */
				double a = transA ? A[(size_t)p * lda + i] : A[(size_t)i * lda + p];
				double b = transB ? B[(size_t)j * ldb + p] : B[(size_t)p * ldb + j];
				s += a * b;
			}
			double c = (double)alpha * s;
			if (beta != 0.0f) /* beta == 0: C is not read, it may hold NaN */
				c += (double)beta * C[(size_t)i * ldc + j];
			C[(size_t)i * ldc + j] = (float)c;
		}
	return 0;
}

/* Element (i, o) of the weight w of an IC -> OC matmul, for either layout. */
static double w_at(const float *w, enum backend_wlayout layout, int i, int o, int IC, int OC)
{
	return layout == BACKEND_W_IO ? w[(size_t)i * OC + o] : w[(size_t)o * IC + i];
}

static int ref_matmul_forward(struct backend *be, float *y, const float *x, const float *w,
			      const float *bias, int N, int IC, int OC, enum backend_wlayout layout)
{
	for (int n = 0; n < N; n++)
		for (int o = 0; o < OC; o++) {
			double s = bias ? bias[o] : 0.0;
			for (int i = 0; i < IC; i++)
				s += (double)x[(size_t)n * IC + i] * w_at(w, layout, i, o, IC, OC);
			y[(size_t)n * OC + o] = (float)s;
		}
	return 0;
}

static int ref_matmul_backward(struct backend *be, float *dx, float *dw, float *dbias,
			       const float *dy, const float *x, const float *w, int N, int IC,
			       int OC, enum backend_wlayout layout, int accumulate)
{
	/* dw and dbias first: dx may be the buffer that holds x */
	if (dw)
		for (int i = 0; i < IC; i++)
			for (int o = 0; o < OC; o++) {
				double s = 0;
				for (int n = 0; n < N; n++)
					s += (double)x[(size_t)n * IC + i] * dy[(size_t)n * OC + o];
				size_t at = layout == BACKEND_W_IO ? (size_t)i * OC + o
								   : (size_t)o * IC + i;
				dw[at] = (float)s;
			}
	if (dbias)
		for (int o = 0; o < OC; o++) {
			double s = 0;
			for (int n = 0; n < N; n++)
				s += dy[(size_t)n * OC + o];
			dbias[o] = (float)s;
		}
	if (dx)
		for (int n = 0; n < N; n++)
			for (int i = 0; i < IC; i++) {
				double s = accumulate ? dx[(size_t)n * IC + i] : 0.0;
				for (int o = 0; o < OC; o++)
					s += (double)dy[(size_t)n * OC + o] *
					     w_at(w, layout, i, o, IC, OC);
				dx[(size_t)n * IC + i] = (float)s;
			}
	return 0;
}

/* ---- GPT-2 ---------------------------------------------------------------------------- */

static int ref_encoder_forward(struct backend *be, float *out, const int32_t *tok,
			       const float *wte, const float *wpe, int B, int T, int C)
{
	for (int n = 0; n < B * T; n++)
		for (int c = 0; c < C; c++)
			out[(size_t)n * C + c] = (float)((double)wte[(size_t)tok[n] * C + c] +
							 wpe[(size_t)(n % T) * C + c]);
	return 0;
}

static int ref_encoder_backward(struct backend *be, float *dwte, float *dwpe, const float *dout,
				const int32_t *tok, int B, int T, int C, int V)
{
	int N = B * T;
	/* The token positions grouped by token (a counting sort, stable), so that each row of
	 * dwte is one double sum over its positions without a V x C double buffer. */
	size_t *start = scratch((size_t)V + 1, sizeof *start);
	size_t *pos = scratch((size_t)N, sizeof *pos);
	if (!start || !pos) {
		free(start);
		free(pos);
		return CORE_ENOMEM;
	}
	for (int n = 0; n < N; n++)
		start[tok[n] + 1]++;
	for (int v = 0; v < V; v++)
		start[v + 1] += start[v];
	size_t *next = scratch((size_t)V, sizeof *next);
	if (!next) {
		free(start);
		free(pos);
		return CORE_ENOMEM;
	}
	memcpy(next, start, sizeof *next * (size_t)V);
	for (int n = 0; n < N; n++)
		pos[next[tok[n]]++] = (size_t)n;
	free(next);

	for (int v = 0; v < V; v++)
		for (int c = 0; c < C; c++) {
			double s = 0;
			for (size_t j = start[v]; j < start[v + 1]; j++)
				s += dout[pos[j] * C + c];
			dwte[(size_t)v * C + c] = (float)s; /* 0 for a token no position holds */
		}
	for (int t = 0; t < T; t++)
		for (int c = 0; c < C; c++) {
			double s = 0;
			for (int b = 0; b < B; b++)
				s += dout[((size_t)b * T + t) * C + c];
			dwpe[(size_t)t * C + c] = (float)s;
		}
	free(start);
	free(pos);
	return 0;
}

/* One row: out = (x - mean) / sqrt(var + 1e-5) * w + b with the biased (divide by C) variance
 * from the two-pass formula, all in double. */
static void layernorm_row(float *out, float *mean, float *rstd, const float *x, const float *w,
			  const float *b, int C)
{
	double m = 0, var = 0;
	for (int c = 0; c < C; c++)
		m += x[c];
	m /= C;
	for (int c = 0; c < C; c++)
		var += ((double)x[c] - m) * ((double)x[c] - m);
	var /= C;
	double r = 1.0 / sqrt(var + 1e-5);
	for (int c = 0; c < C; c++)
		out[c] = (float)(((double)x[c] - m) * r * w[c] + b[c]);
	*mean = (float)m;
	*rstd = (float)r;
}

static int ref_layernorm_forward(struct backend *be, float *out, float *mean, float *rstd,
				 const float *x, const float *w, const float *b, int N, int C)
{
	for (int n = 0; n < N; n++)
		layernorm_row(out + (size_t)n * C, &mean[n], &rstd[n], x + (size_t)n * C, w, b, C);
	return 0;
}

static int ref_residual_layernorm_forward(struct backend *be, float *res, float *out,
					  float *mean, float *rstd, const float *skip,
					  const float *bias, const float *w, const float *b, int N,
					  int C)
{
	for (int n = 0; n < N; n++) {
		float *r = res + (size_t)n * C;
		for (int c = 0; c < C; c++)
			r[c] = (float)((double)r[c] + skip[(size_t)n * C + c] +
				       (bias ? bias[c] : 0.0));
		/* the normalised row is the stored (rounded) res: what the backward sees as x */
		layernorm_row(out + (size_t)n * C, &mean[n], &rstd[n], r, w, b, C);
	}
	return 0;
}

static int ref_layernorm_backward(struct backend *be, float *dx, float *dw, float *db,
				  const float *dout, const float *x, const float *w,
				  const float *mean, const float *rstd, int N, int C,
				  int accumulate)
{
	/* xhat from the forward's float mean and rstd, as the contract says */
	for (int c = 0; c < C; c++) {
		double sw = 0, sb = 0;
		for (int n = 0; n < N; n++) {
			size_t i = (size_t)n * C + c;
			double xhat = ((double)x[i] - mean[n]) * rstd[n];
			sw += (double)dout[i] * xhat;
			sb += dout[i];
		}
		dw[c] = (float)sw;
		db[c] = (float)sb;
	}
	for (int n = 0; n < N; n++) {
		const float *xr = x + (size_t)n * C, *dr = dout + (size_t)n * C;
		double m = mean[n], r = rstd[n];
		/* the row means in dx = rstd (g - mean_c(g) - xhat mean_c(g xhat)), g = w dout */
		double mg = 0, mgx = 0;
		for (int c = 0; c < C; c++) {
			double g = (double)w[c] * dr[c];
			mg += g;
			mgx += g * ((xr[c] - m) * r);
		}
		mg /= C;
		mgx /= C;
		for (int c = 0; c < C; c++) {
			double g = (double)w[c] * dr[c], xhat = (xr[c] - m) * r;
			double d = r * (g - mg - xhat * mgx);
			size_t i = (size_t)n * C + c;
			dx[i] = (float)(accumulate ? dx[i] + d : d);
		}
	}
	return 0;
}

/* sqrt(2/pi) and the cubic coefficient of the tanh approximation */
#define GELU_K 0.7978845608028654
#define GELU_A 0.044715

static double gelu(double x)
{
	return 0.5 * x * (1.0 + tanh(GELU_K * (x + GELU_A * x * x * x)));
}

/* d/dx of gelu: 0.5 (1 + th) + 0.5 x (1 - th^2) K (1 + 3 A x^2), th = tanh(K (x + A x^3)). */
static double gelu_grad(double x)
{
	double th = tanh(GELU_K * (x + GELU_A * x * x * x));
	return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * GELU_K * (1.0 + 3.0 * GELU_A * x * x);
}

static int ref_bias_act_forward(struct backend *be, float *pre, float *out, const float *bias,
				int N, int C, enum backend_act act)
{
	for (int n = 0; n < N; n++)
		for (int c = 0; c < C; c++) {
			size_t i = (size_t)n * C + c;
			float p = (float)((double)pre[i] + bias[c]);
			pre[i] = p; /* then out, which may be the same element (relu) */
			out[i] = act == BACKEND_ACT_GELU ? (float)gelu(p) : (p > 0.0f ? p : 0.0f);
		}
	return 0;
}

static int ref_act_backward(struct backend *be, float *d, float *dbias, const float *x, int N,
			    int C, enum backend_act act)
{
	for (size_t i = 0; i < (size_t)N * C; i++) {
		if (act == BACKEND_ACT_GELU)
			d[i] = (float)((double)d[i] * gelu_grad(x[i]));
		else
			d[i] = x[i] > 0.0f ? d[i] : 0.0f; /* relu'(0) = 0 */
	}
	if (dbias)
		for (int c = 0; c < C; c++) {
			double s = 0;
			for (int n = 0; n < N; n++)
				s += d[(size_t)n * C + c];
			dbias[c] = (float)s;
		}
	return 0;
}

static int ref_attention_forward(struct backend *be, float *out, float *att, const float *qkv,
				 int B, int T, int C, int NH)
{
	int hs = C / NH;
	double scale = 1.0 / sqrt((double)hs);
	double *p = scratch((size_t)T, sizeof *p);
	if (!p)
		return CORE_ENOMEM;
	for (int b = 0; b < B; b++)
		for (int h = 0; h < NH; h++)
			for (int i = 0; i < T; i++) {
				const float *q = qkv + ((size_t)b * T + i) * 3 * C + (size_t)h * hs;
				double mx = -INFINITY, sum = 0;
				for (int j = 0; j <= i; j++) { /* causal: keys j <= i only */
					const float *k = qkv + ((size_t)b * T + j) * 3 * C + C +
							 (size_t)h * hs;
					double s = 0;
					for (int d = 0; d < hs; d++)
						s += (double)q[d] * k[d];
					p[j] = s * scale;
					mx = p[j] > mx ? p[j] : mx;
				}
				for (int j = 0; j <= i; j++) {
					p[j] = exp(p[j] - mx);
					sum += p[j];
				}
				float *a = att + (((size_t)b * NH + h) * T + i) * T;
				for (int j = 0; j < T; j++) {
					if (j <= i)
						p[j] /= sum;
					a[j] = j <= i ? (float)p[j] : 0.0f;
				}
				/* out_i = sum_j P_ij v_j (v of head h from column 2C + h hs) */
				const float *v = qkv + ((size_t)b * T * 3 + 2) * C + (size_t)h * hs;
				float *o = out + ((size_t)b * T + i) * C + (size_t)h * hs;
				for (int d = 0; d < hs; d++) {
					double s = 0;
					for (int j = 0; j <= i; j++)
						s += p[j] * v[(size_t)j * 3 * C + d];
					o[d] = (float)s;
				}
			}
	free(p);
	return 0;
}

/* With P the kept probabilities (j <= i) and S the scaled scores of one head:
 *   dv_j = sum_i P_ij dout_i,  dP_ij = <dout_i, v_j>,
 *   dS_ij = P_ij (dP_ij - sum_l P_il dP_il)   (softmax backward),
 *   dq_i = scale sum_j dS_ij k_j,  dk_j = scale sum_i dS_ij q_i.
 * dk and dv gather over queries, so the gradient of one (b, h) is summed in a double buffer
 * g [T][3][hs] and rounded once; the (b, h) blocks cover dqkv exactly. Entries of att above
 * the diagonal are never read. */
static int ref_attention_backward(struct backend *be, float *dqkv, const float *dout,
				  const float *qkv, const float *att, int B, int T, int C, int NH)
{
	int hs = C / NH;
	double scale = 1.0 / sqrt((double)hs);
	double *g = scratch((size_t)T * 3 * hs, sizeof *g), *dp = scratch((size_t)T, sizeof *dp);
	if (!g || !dp) {
		free(g);
		free(dp);
		return CORE_ENOMEM;
	}
	for (int b = 0; b < B; b++)
		for (int h = 0; h < NH; h++) {
			/* q, k, v of token t of this head at row t, columns h hs, C + h hs, ... */
			const float *x = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
			memset(g, 0, sizeof *g * (size_t)T * 3 * hs);
			for (int i = 0; i < T; i++) {
				const float *a = att + (((size_t)b * NH + h) * T + i) * T;
				const float *go = dout + ((size_t)b * T + i) * C + (size_t)h * hs;
				const float *qi = x + (size_t)i * 3 * C;
				double rowdot = 0;
				for (int j = 0; j <= i; j++) {
					const float *vj = x + (size_t)j * 3 * C + 2 * C;
					double *gv = g + ((size_t)j * 3 + 2) * hs, s = 0;
					for (int d = 0; d < hs; d++) {
						s += (double)go[d] * vj[d];
						gv[d] += (double)a[j] * go[d];
					}
					dp[j] = s;
					rowdot += (double)a[j] * s;
				}
				for (int j = 0; j <= i; j++) {
					const float *kj = x + (size_t)j * 3 * C + C;
					double *gq = g + (size_t)i * 3 * hs;
					double *gk = g + ((size_t)j * 3 + 1) * hs;
					double ds = (double)a[j] * (dp[j] - rowdot) * scale;
					for (int d = 0; d < hs; d++) {
						gq[d] += ds * kj[d];
						gk[d] += ds * qi[d];
					}
				}
			}
			for (int t = 0; t < T; t++)
				for (int part = 0; part < 3; part++) {
					float *o = dqkv + ((size_t)b * T + t) * 3 * C +
						   (size_t)part * C + (size_t)h * hs;
					for (int d = 0; d < hs; d++)
						o[d] = (float)g[((size_t)t * 3 + part) * hs + d];
				}
		}
	free(g);
	free(dp);
	return 0;
}

static int ref_crossentropy_forward(struct backend *be, float *probs, float *losses,
				    const int32_t *targets, int N, int V)
{
	for (int n = 0; n < N; n++) {
		float *row = probs + (size_t)n * V;
		double mx = -INFINITY, s = 0;
		for (int j = 0; j < V; j++)
			mx = row[j] > mx ? row[j] : mx;
		for (int j = 0; j < V; j++)
			s += exp(row[j] - mx);
		/* -log p[target] = log sum exp(l - max) - (l[target] - max), before the row is
		 * overwritten */
		if (targets)
			losses[n] = (float)(log(s) - (row[targets[n]] - mx));
		for (int j = 0; j < V; j++)
			row[j] = (float)(exp(row[j] - mx) / s);
	}
	return 0;
}

static int ref_crossentropy_backward(struct backend *be, float *probs, const int32_t *targets,
				     int N, int V, float scale)
{
	for (int n = 0; n < N; n++)
		for (int j = 0; j < V; j++) {
			size_t i = (size_t)n * V + j;
			double onehot = j == targets[n] ? 1.0 : 0.0;
			probs[i] = (float)((double)scale * (probs[i] - onehot));
		}
	return 0;
}

/* The formula in double, from the double hyper-parameters as given. The float code rounds
 * each constant it forms (lr, beta2, 1 - beta2, the bias corrections, as torch does) to
 * float, which moves it by at most 6e-8 relative; rounding beta to float first and then
 * forming 1 - beta would magnify that by beta / (1 - beta), 1000 times at beta2 = 0.999, so
 * the oracle forms every constant exactly. Each element is rounded to float once. */
static int ref_adamw_update(struct backend *be, float *p, const float *g, float *m, float *v,
			    const struct backend_segment *seg, int nseg, double lr, double beta1,
			    double beta2, double eps, long t, float grad_scale)
{
	double bc1 = 1.0 - pow(beta1, (double)t), bc2 = 1.0 - pow(beta2, (double)t);
	for (int s = 0; s < nseg; s++) {
		double wd = seg[s].weight_decay;
		for (size_t i = seg[s].offset; i < seg[s].offset + seg[s].n; i++) {
			double gi = (double)grad_scale * g[i];
			double pi = p[i] * (1.0 - lr * wd);
			double mi = beta1 * m[i] + (1.0 - beta1) * gi;
			double vi = beta2 * v[i] + (1.0 - beta2) * gi * gi;
			pi -= lr / bc1 * mi / (sqrt(vi) / sqrt(bc2) + eps);
			p[i] = (float)pi;
			m[i] = (float)mi;
			v[i] = (float)vi;
		}
	}
	return 0;
}

/* ---- the MoE layer -------------------------------------------------------------------- */

/* The routed logit of token t, expert e: the logit plus s/E times a standard normal draw, in
 * float as the contract writes it (separate statements: no fma). */
static float routed_logit(const struct backend_moe_gate *g, float logit, int64_t t, int e)
{
	if (g->noise == 0.0f)
		return logit;
	uint64_t at = ((uint64_t)g->step * (uint64_t)g->T + (uint64_t)t) * (uint64_t)g->E +
		      (uint64_t)e;
	float s = g->noise / (float)g->E;
	float z = s * rng_normal(g->seed, RNG_STREAM_NOISE, at);
	return logit + z;
}

/* out[e] = softmax(z)[e] over E values, in double with the maximum subtracted. */
static void softmax_row(float *out, const float *z, int E)
{
	double mx = -INFINITY, s = 0;
	for (int e = 0; e < E; e++)
		mx = z[e] > mx ? z[e] : mx;
	for (int e = 0; e < E; e++)
		s += exp(z[e] - mx);
	for (int e = 0; e < E; e++)
		out[e] = (float)(exp(z[e] - mx) / s);
}

/* The standard normal CDF and density. */
static double norm_cdf(double x)
{
	return 0.5 * erfc(-x / sqrt(2.0));
}

static double norm_pdf(double x)
{
	return exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
}

/* cv2(v) = var(v) / (mean(v)^2 + 1e-10), unbiased variance, and (when grad is not NULL) its
 * gradient: with mu the mean and D = mu^2 + 1e-10,
 *   d var / d v_e = 2 (v_e - mu) / (E - 1)   (the mean's own term sums to zero),
 *   d D / d v_e = 2 mu / E,  so  d cv2 / d v_e = (d var / d v_e) / D - var (2 mu / E) / D^2. */
static double cv2(const double *v, int E, double *grad)
{
	double mu = 0, var = 0;
	for (int e = 0; e < E; e++)
		mu += v[e];
	mu /= E;
	for (int e = 0; e < E; e++)
		var += (v[e] - mu) * (v[e] - mu);
	var /= E - 1;
	double D = mu * mu + 1e-10;
	if (grad)
		for (int e = 0; e < E; e++)
			grad[e] = 2.0 * (v[e] - mu) / (E - 1) / D - var * (2.0 * mu / E) / (D * D);
	return var / D;
}

/* Imp_e = sum_t clean[t,e] and Load_e = sum_t Phi((clean[t,e] - thr_t) / sigma), the two
 * vectors of the load-importance loss, from the forward's clean probabilities and the routed
 * logit thr_t of each token's rank-(k-1) choice. */
static void load_importance(double *imp, double *load, const struct backend_moe_gate *g,
			    const float *clean, const float *thr)
{
	double sigma = (double)g->noise / g->E;
	for (int e = 0; e < g->E; e++) {
		double si = 0, sl = 0;
		for (int64_t t = 0; t < g->T; t++) {
			double c = clean[t * g->E + e];
			si += c;
			sl += norm_cdf((c - thr[t]) / sigma);
		}
		imp[e] = si;
		load[e] = sl;
	}
}

static int ref_moe_gate_forward(struct backend *be, const struct backend_moe_gate *g,
				const float *logits, float *probs, float *clean, float *top,
				int32_t *idx, float *score, float *aux)
{
	int64_t T = g->T;
	int E = g->E, k = g->k;
	float *z = scratch((size_t)E, sizeof *z), *thr = scratch((size_t)T, sizeof *thr);
	char *chosen = scratch((size_t)E, 1);
	double *u = scratch((size_t)E, sizeof *u), *w = scratch((size_t)E, sizeof *w);
	int rc = 0;
	if (!z || !thr || !chosen || !u || !w) {
		rc = CORE_ENOMEM;
		goto out;
	}
	for (int64_t t = 0; t < T; t++) {
		const float *lt = logits + t * E;
		float *pt = probs + t * E;
		for (int e = 0; e < E; e++)
			z[e] = routed_logit(g, lt[e], t, e);
		softmax_row(pt, z, E);
		if (g->load_importance)
			softmax_row(clean + t * E, lt, E);
		/* top-k on the float probabilities: a strictly larger value displaces, so the
		 * lower expert index wins a tie */
		memset(chosen, 0, (size_t)E);
		double sum = 0;
		for (int r = 0; r < k; r++) {
			int best = -1;
			for (int e = 0; e < E; e++)
				if (!chosen[e] && (best < 0 || pt[e] > pt[best]))
					best = e;
			chosen[best] = 1;
			idx[r * T + t] = best;
			sum += pt[best];
		}
		/* k == 1: the probability itself (else the gate would get no gradient) */
		double div = k > 1 ? (sum > FLT_EPSILON ? sum : FLT_EPSILON) : 1.0;
		for (int r = 0; r < k; r++)
			score[r * T + t] = (float)(pt[idx[r * T + t]] / div);
		top[t] = pt[idx[t]];
		thr[t] = z[idx[(int64_t)(k - 1) * T + t]];
	}

	double a = 0;
	if (!g->load_importance) {
		/* GShard: E sum_e (n1_e / T) (sum_t probs[t,e] / T) */
		for (int e = 0; e < E; e++) {
			double n1 = 0, ps = 0;
			for (int64_t t = 0; t < T; t++) {
				n1 += idx[t] == e;
				ps += probs[t * E + e];
			}
			a += (n1 / (double)T) * (ps / (double)T);
		}
		a *= E;
	} else {
		load_importance(u, w, g, clean, thr);
		a = (cv2(u, E, NULL) + cv2(w, E, NULL)) / 2.0;
	}
	*aux = (float)a;
out:
	free(z);
	free(thr);
	free(chosen);
	free(u);
	free(w);
	return rc;
}

/* The gradient of L = sum_{r,t} dscore score + aux_weight aux with respect to the logits, by
 * hand, in double. Per token, with p the (routed) probs:
 *   scores: k == 1: dL/dp[idx0] = dscore. k > 1, S = sum_r p[idx_r] >= FLT_EPSILON:
 *     score_r = p_r / S, so dL/dp[idx_j] = dscore_j / S - (sum_r dscore_r p_r) / S^2;
 *     S clamped: dL/dp[idx_j] = dscore_j / FLT_EPSILON (a constant divisor).
 *   GShard aux: dL/dp[t,e] += aux_weight E (n1_e / T) / T (n1_e carries no gradient).
 *   through the softmax: dL/dz_e = p_e (dL/dp_e - sum_j p_j dL/dp_j), and z = logit + noise.
 * Load-importance aux, with q = clean, u_te = (q[t,e] - thr_t) / sigma:
 *   dL/dq[t,e] = aux_weight (dcv2(Imp)_e + dcv2(Load)_e pdf(u_te) / sigma) / 2,
 *   dL/dthr_t = -aux_weight sum_e dcv2(Load)_e pdf(u_te) / sigma / 2,
 *   then q's softmax backward into the logits, and thr_t (the routed logit of the rank-(k-1)
 *   choice, noise constant) adds straight to its logit. */
static int ref_moe_gate_backward(struct backend *be, const struct backend_moe_gate *g,
				 const float *logits, const float *probs, const float *clean,
				 const int32_t *idx, const float *dscore, float aux_weight,
				 float *dlogits)
{
	int64_t T = g->T;
	int E = g->E, k = g->k, li = g->load_importance;
	double *dp = scratch((size_t)E, sizeof *dp), *dq = scratch((size_t)E, sizeof *dq);
	double *ga = scratch((size_t)E, sizeof *ga), *dimp = scratch((size_t)E, sizeof *dimp);
	double *dload = scratch((size_t)E, sizeof *dload), *imp = scratch((size_t)E, sizeof *imp);
	double *load = scratch((size_t)E, sizeof *load);
	float *thr = scratch((size_t)T, sizeof *thr);
	int rc = 0;
	if (!dp || !dq || !ga || !dimp || !dload || !imp || !load || !thr) {
		rc = CORE_ENOMEM;
		goto out;
	}
	double sigma = (double)g->noise / E;
	if (!li) {
		for (int64_t t = 0; t < T; t++)
			ga[idx[t]] += 1.0; /* n1_e */
		for (int e = 0; e < E; e++)
			ga[e] = (double)aux_weight * E * (ga[e] / (double)T) / (double)T;
	} else {
		for (int64_t t = 0; t < T; t++) {
			int e = idx[(int64_t)(k - 1) * T + t];
			thr[t] = routed_logit(g, logits[t * E + e], t, e);
		}
		load_importance(imp, load, g, clean, thr);
		cv2(imp, E, dimp);
		cv2(load, E, dload);
		for (int e = 0; e < E; e++) {
			dimp[e] *= (double)aux_weight / 2.0;
			dload[e] *= (double)aux_weight / 2.0;
		}
	}

	for (int64_t t = 0; t < T; t++) {
		const float *pt = probs + t * E;
		for (int e = 0; e < E; e++)
			dp[e] = li ? 0.0 : ga[e];
		if (k == 1) {
			dp[idx[t]] += dscore[t];
		} else {
			double S = 0, dot = 0;
			for (int r = 0; r < k; r++) {
				S += pt[idx[r * T + t]];
				dot += (double)dscore[r * T + t] * pt[idx[r * T + t]];
			}
			for (int r = 0; r < k; r++) {
				double d = dscore[r * T + t];
				dp[idx[r * T + t]] += S >= FLT_EPSILON ? d / S - dot / (S * S)
								       : d / FLT_EPSILON;
			}
		}
		double pd = 0;
		for (int e = 0; e < E; e++)
			pd += pt[e] * dp[e];
		for (int e = 0; e < E; e++)
			dp[e] = pt[e] * (dp[e] - pd); /* now dL/dlogit via the routed softmax */

		if (li) {
			const float *qt = clean + t * E;
			double dthr = 0, qd = 0;
			for (int e = 0; e < E; e++) {
				double f = norm_pdf((qt[e] - thr[t]) / sigma) / sigma;
				dq[e] = dimp[e] + dload[e] * f;
				dthr -= dload[e] * f;
			}
			for (int e = 0; e < E; e++)
				qd += qt[e] * dq[e];
			for (int e = 0; e < E; e++)
				dp[e] += qt[e] * (dq[e] - qd);
			dp[idx[(int64_t)(k - 1) * T + t]] += dthr;
		}
		for (int e = 0; e < E; e++)
			dlogits[t * E + e] = (float)dp[e];
	}
out:
	free(dp);
	free(dq);
	free(ga);
	free(dimp);
	free(dload);
	free(imp);
	free(load);
	free(thr);
	return rc;
}

static int ref_moe_count(struct backend *be, const int32_t *idx, int64_t n, int E,
			 int64_t *count)
{
	for (int e = 0; e < E; e++)
		count[e] = 0;
	for (int64_t i = 0; i < n; i++)
		if (idx[i] >= 0 && idx[i] < E)
			count[idx[i]]++;
	return 0;
}

struct keyed {
	float key;
	int64_t t;
};

/* Descending key, then ascending token: a total order, so qsort's instability is harmless. */
static int by_key_desc(const void *pa, const void *pb)
{
	const struct keyed *a = pa, *b = pb;
	if (a->key != b->key)
		return a->key > b->key ? -1 : 1;
	return (a->t > b->t) - (a->t < b->t);
}

static int ref_moe_locations(struct backend *be, const int32_t *idx, const float *top, int64_t T,
			     int k, int E, int64_t C, int32_t *loc)
{
	struct keyed *order = scratch((size_t)T, sizeof *order);
	int64_t *next = scratch((size_t)E, sizeof *next);
	if (!order || !next) {
		free(order);
		free(next);
		return CORE_ENOMEM;
	}
	for (int64_t t = 0; t < T; t++) {
		order[t].key = top ? top[t] : 0.0f; /* top NULL: all keys equal, token order */
		order[t].t = t;
	}
	qsort(order, (size_t)T, sizeof *order, by_key_desc);
	for (int r = 0; r < k; r++)
		for (int64_t j = 0; j < T; j++) {
			int64_t i = r * T + order[j].t;
			int64_t l = next[idx[i]]++;
			loc[i] = l < C ? (int32_t)l : -1;
		}
	free(order);
	free(next);
	return 0;
}

/* The dispatch ops below serve both element types of their rows: float32, and bfloat16 (the
 * *_bf16 ops), each sum in double from the widened values and rounded once at the store. */

/* d rounded to bfloat16, to nearest, ties to even. d is first cut to float toward zero
 * (exact when d is a float), then the float's low 16 bits decide, with sticky = whether the
 * cut lost anything; a float's own rounding would round twice. */
static uint16_t bf16_of_double(double d)
{
	if (isnan(d))
		return backend_bf16_from_float((float)d);
	float f = (float)d;
	if (fabs((double)f) > fabs(d))
		f = nextafterf(f, 0.0f);
	const int sticky = (double)f != d;
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	uint32_t hi = u >> 16, lo = u & 0xffffu;
	if (lo > 0x8000u || (lo == 0x8000u && (sticky || (hi & 1u))))
		hi++; /* the magnitude up: sign-magnitude bits, so right for either sign */
	return (uint16_t)hi;
}

/* Element i of a row buffer of floats (bf16 = 0) or bfloat16s (bf16 = 1), widened; and the
 * store of a double, rounded once to the buffer's type. */
static double ld(const void *p, size_t i, int bf16)
{
	return bf16 ? backend_bf16_to_float(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static void st(void *p, size_t i, double v, int bf16)
{
	if (bf16)
		((uint16_t *)p)[i] = bf16_of_double(v);
	else
		((float *)p)[i] = (float)v;
}

/* Rows min(n_e, C) .. C-1 of every expert of an [E, C, M] buffer of es-byte elements set to
 * zero. */
static void zero_padding(const struct backend_moe_route *r, void *buf, int64_t M, size_t es)
{
	for (int e = 0; e < r->E; e++) {
		int64_t used = r->count[e] < r->C ? r->count[e] : r->C;
		for (int64_t c = used; c < r->C; c++)
			memset((char *)buf + ((size_t)e * r->C + c) * M * es, 0, es * (size_t)M);
	}
}

/* The row of expert idx[i], slot loc[i] of an [E, C, M] buffer (in elements). */
static size_t row_of(const struct backend_moe_route *r, int64_t i, int64_t M)
{
	return ((size_t)r->idx[i] * r->C + (size_t)r->loc[i]) * M;
}

static void encode(const struct backend_moe_route *r, const void *x, void *disp, int64_t M,
		   int zero_pad, size_t es)
{
	if (zero_pad)
		zero_padding(r, disp, M, es);
	for (int64_t i = 0; i < r->k * r->T; i++)
		if (r->loc[i] >= 0)
			memcpy((char *)disp + row_of(r, i, M) * es,
			       (const char *)x + (size_t)(i % r->T) * M * es, es * (size_t)M);
}

/* out[t] = sum over token t's kept choices, in double, of (score, when weighted) times its
 * row of buf: decode (weighted) and encode backward (unweighted) are this one gather. */
static int gather(const struct backend_moe_route *r, const void *buf, void *out, int64_t M,
		  int weighted, int bf16)
{
	double *acc = scratch((size_t)M, sizeof *acc);
	if (!acc)
		return CORE_ENOMEM;
	for (int64_t t = 0; t < r->T; t++) {
		memset(acc, 0, sizeof *acc * (size_t)M);
		for (int rk = 0; rk < r->k; rk++) {
			int64_t i = rk * r->T + t;
			if (r->loc[i] < 0)
				continue;
			const size_t row = row_of(r, i, M);
			const double w = weighted ? (double)r->score[i] : 1.0;
			for (int64_t m = 0; m < M; m++)
				acc[m] += w * ld(buf, row + m, bf16);
		}
		for (int64_t m = 0; m < M; m++)
			st(out, (size_t)(t * M + m), acc[m], bf16);
	}
	free(acc);
	return 0;
}

static void decode_backward(const struct backend_moe_route *r, const void *dy, const void *eo,
			    void *d_eo, float *dscore, int64_t M, int zero_pad, int bf16)
{
	/* padding rows are not kept rows, so zeroing them first cannot clobber a row of eo
	 * that is still to be read when d_eo is eo */
	if (zero_pad)
		zero_padding(r, d_eo, M, bf16 ? 2 : 4);
	for (int64_t i = 0; i < r->k * r->T; i++) {
		if (r->loc[i] < 0) {
			dscore[i] = 0.0f;
			continue;
		}
		const size_t g = (size_t)(i % r->T) * M, row = row_of(r, i, M);
		double s = 0;
		for (int64_t m = 0; m < M; m++)
			s += ld(dy, g + m, bf16) * ld(eo, row + m, bf16);
		dscore[i] = (float)s;
		/* the row of eo has been read: now it may be overwritten */
		for (int64_t m = 0; m < M; m++)
			st(d_eo, row + m, (double)r->score[i] * ld(dy, g + m, bf16), bf16);
	}
}

static int ref_moe_encode(struct backend *be, const struct backend_moe_route *r, const float *x,
			  float *disp, int64_t M, int zero_pad)
{
	encode(r, x, disp, M, zero_pad, sizeof *x);
	return 0;
}

static int ref_moe_decode(struct backend *be, const struct backend_moe_route *r, const float *eo,
			  float *y, int64_t M)
{
	return gather(r, eo, y, M, 1, 0);
}

static int ref_moe_decode_backward(struct backend *be, const struct backend_moe_route *r,
				   const float *dy, const float *eo, float *d_eo, float *dscore,
				   int64_t M, int zero_pad)
{
	decode_backward(r, dy, eo, d_eo, dscore, M, zero_pad, 0);
	return 0;
}

static int ref_moe_encode_backward(struct backend *be, const struct backend_moe_route *r,
				   const float *d_disp, float *dx, int64_t M)
{
	return gather(r, d_disp, dx, M, 0, 0);
}

static int ref_moe_encode_bf16(struct backend *be, const struct backend_moe_route *r,
			       const uint16_t *x, uint16_t *disp, int64_t M, int zero_pad)
{
	encode(r, x, disp, M, zero_pad, sizeof *x);
	return 0;
}

static int ref_moe_decode_bf16(struct backend *be, const struct backend_moe_route *r,
			       const uint16_t *eo, uint16_t *y, int64_t M)
{
	return gather(r, eo, y, M, 1, 1);
}

static int ref_moe_decode_backward_bf16(struct backend *be, const struct backend_moe_route *r,
					const uint16_t *dy, const uint16_t *eo, uint16_t *d_eo,
					float *dscore, int64_t M, int zero_pad)
{
	decode_backward(r, dy, eo, d_eo, dscore, M, zero_pad, 1);
	return 0;
}

static int ref_moe_encode_backward_bf16(struct backend *be, const struct backend_moe_route *r,
					const uint16_t *d_disp, uint16_t *dx, int64_t M)
{
	return gather(r, d_disp, dx, M, 0, 1);
}

/* ---- profiling ------------------------------------------------------------------------ */

static void ref_profile(struct backend *be, int enable)
{
}

static double ref_gemm_seconds(struct backend *be)
{
	return NAN; /* the oracle does not time itself */
}

static const struct backend_ops ref_ops = {
	.close = ref_close,
	.alloc = ref_alloc,
	.free = ref_free,
	.upload = ref_upload,
	.download = ref_download,
	.copy = ref_copy,
	.copy_2d = ref_copy_2d,
	.memset = ref_memset,
	.sync = ref_sync,
	.workspace_bytes = ref_workspace_bytes,
	.fill = ref_fill,
	.add_f32 = ref_add_f32,
	.fill_normal = ref_fill_normal,
	.sum = ref_sum,
	.gemm = ref_gemm,
	.matmul_forward = ref_matmul_forward,
	.matmul_backward = ref_matmul_backward,
	.encoder_forward = ref_encoder_forward,
	.encoder_backward = ref_encoder_backward,
	.layernorm_forward = ref_layernorm_forward,
	.residual_layernorm_forward = ref_residual_layernorm_forward,
	.layernorm_backward = ref_layernorm_backward,
	.bias_act_forward = ref_bias_act_forward,
	.act_backward = ref_act_backward,
	.attention_forward = ref_attention_forward,
	.attention_backward = ref_attention_backward,
	.crossentropy_forward = ref_crossentropy_forward,
	.crossentropy_backward = ref_crossentropy_backward,
	.adamw_update = ref_adamw_update,
	.moe_gate_forward = ref_moe_gate_forward,
	.moe_gate_backward = ref_moe_gate_backward,
	.moe_count = ref_moe_count,
	.moe_locations = ref_moe_locations,
	.moe_encode = ref_moe_encode,
	.moe_decode = ref_moe_decode,
	.moe_decode_backward = ref_moe_decode_backward,
	.moe_encode_backward = ref_moe_encode_backward,
	.moe_encode_bf16 = ref_moe_encode_bf16,
	.moe_decode_bf16 = ref_moe_decode_bf16,
	.moe_decode_backward_bf16 = ref_moe_decode_backward_bf16,
	.moe_encode_backward_bf16 = ref_moe_encode_backward_bf16,
	.profile = ref_profile,
	.gemm_seconds = ref_gemm_seconds,
};

int backend_ref_init(struct backend *be, const struct backend_params *params)
{
	(void)params; /* one thread, whatever is asked */
	be->op = &ref_ops;
	be->host_visible = 1;
	be->attention_keeps_p = 1;
	be->threads = 1;
	be->gemm_kernel = "plain loops";
	be->ctx = NULL;
	return 0;
}
