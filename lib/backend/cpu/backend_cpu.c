/* backend_cpu.c - the CPU backend: CBLAS sgemm for every matrix product, OpenMP loops for the
 * rest.
 *
 * Where the time goes: on a GPT-2 step almost all flops are matrix products, so each linear
 * layer is ONE sgemm over the whole [B*T, C] batch, and attention is a handful of small sgemms
 * per (batch, head) run in parallel over the pairs (the OpenMP build of OpenBLAS runs
 * single-threaded inside a parallel region, so the two thread pools never fight). Attention
 * skips the masked upper triangle block by block. The elementwise ops are fused where the
 * model allows (bias + GELU, residual + LayerNorm, softmax + cross-entropy) and written as
 * plain loops the compiler vectorises; exp is a branch-free polynomial so that it vectorises
 * too (libm's expf/tanhf would not without -ffast-math).
 *
 * Determinism: no atomics. Reductions over rows either run over a fixed split of the
 * columns (each output column summed in row order) or over BACKEND_CHUNKS fixed row chunks
 * summed in chunk order, so results do not depend on how OpenMP schedules the loop.
 */
#include "backend/backend.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "common/banned.h"

/* Attention row/key block: rows of block r attend to keys of blocks 0..r only, so the
 * products skip all but (nb + 1) / (2 nb) of the T x T scores (nb = T / ATT_BLOCK blocks).
 * 32 measured ~1-2% faster than 64 and 6% faster than no blocking at T = 256, hs = 64. */
#ifndef ATT_BLOCK
#define ATT_BLOCK 32
#endif

static inline int min_int(int a, int b) { return a < b ? a : b; }

/* The calling thread's share [*d0, *d1) of D items in a parallel region: contiguous, and a
 * multiple of 16 long (whole 64-byte lines of floats, so no two threads write one line). */
static inline void thread_share(int64_t D, int64_t *d0, int64_t *d1)
{
	int64_t n = omp_get_num_threads(), per = ((D + n - 1) / n + 15) / 16 * 16;
	int64_t lo = omp_get_thread_num() * per;
	*d0 = lo < D ? lo : D;
	*d1 = lo + per < D ? lo + per : D;
}

/* exp(x) for x in float range, ~1 ulp: Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2,
 * Cephes minimax polynomial for e^r, 2^n built in the exponent bits. Branch-free so that a
 * loop calling it vectorises. */
static inline float exp_approx(float x)
{
	x = x < -87.0f ? -87.0f : x; /* a NaN passes both clamps and stays NaN */
	x = x > 88.0f ? 88.0f : x;
	/* Adding 1.5*2^23 rounds to the nearest integer, which then sits in the low mantissa
	 * bits: read it from there with unsigned arithmetic (no float-to-int conversion, no
	 * signed shift: defined for every input, NaN included). */
	union {
		float f;
		uint32_t u;
	} nb = {.f = x * 1.44269504088896341f + 12582912.0f};
	float n = nb.f - 12582912.0f;
	float r = x - n * 0.693359375f;
	r = r + n * 2.12194440e-4f;
	float z = r * r;
	float p = 1.9875691500e-4f;
	p = p * r + 1.3981999507e-3f;
	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	p = p * z + r + 1.0f;
	union {
		uint32_t u;
		float f;
	} s = {.u = (nb.u - 0x4B400000u + 127u) << 23};
	return p * s.f;
}

/* tanh-GELU: 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3). Since
 * 0.5 (1 + tanh(u)) = sigmoid(2u), gelu(x) = x sigmoid(2u), which needs one exp and has no
 * cancellation near 0. */
#define GELU_K0 0.7978845608028654f
#define GELU_K1 0.044715f

static inline float gelu_sig(float x)
{
	float u = GELU_K0 * (x + GELU_K1 * x * x * x);
	return 1.0f / (1.0f + exp_approx(-2.0f * u));
}

/* ---- matrix products ---------------------------------------------------------------- */

static void add_bias(float *y, const float *bias, int N, int C)
{
#pragma omp parallel for schedule(static)
	for (int n = 0; n < N; n++) {
		float *row = y + (size_t)n * C;
#pragma omp simd
		for (int c = 0; c < C; c++)
			row[c] += bias[c];
	}
}

void cpu_column_sums(float *out, const float *a, int64_t rows, int64_t n)
{
	/* Below 32K elements a parallel region costs more than the sums (the MoE layer calls
	 * this per expert, some with a handful of rows). */
#pragma omp parallel if (rows * n >= 32768)
	{
		int64_t c0, c1;
		thread_share(n, &c0, &c1);
		if (c1 > c0) {
			float *o = out + c0;
			const int64_t w = c1 - c0;
			memset(o, 0, sizeof(float) * (size_t)w);
			for (int64_t i = 0; i < rows; i++) {
				const float *row = a + i * n + c0;
#pragma omp simd
				for (int64_t c = 0; c < w; c++)
					o[c] += row[c];
			}
		}
	}
}

/* Time inside sgemm, for the matmul share of a step that dpc-train-path reports. Kept per
 * thread (padded against false sharing) and in wall-clock terms: a call made inside a
 * parallel region of n threads counts 1/n of its duration, so the sum over threads
 * estimates the wall time during which the cores were in matrix products. */
#define PROF_THREADS 256
static struct {
	double s;
	char pad[56];
} prof_gemm[PROF_THREADS];
static int prof_on;

static void cpu_profile(int enable)
{
	prof_on = enable;
	memset(prof_gemm, 0, sizeof prof_gemm);
}

static double cpu_gemm_seconds(void)
{
	double s = 0.0;
	for (int i = 0; i < PROF_THREADS; i++)
		s += prof_gemm[i].s;
	return s;
}

static void gemm_call(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
		      float alpha, const float *A, int lda, const float *B, int ldb, float beta,
		      float *C, int ldc)
{
	if (!prof_on) {
		cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
		return;
	}
	double t0 = omp_get_wtime();
	cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
	int tid = omp_get_thread_num();
	/* Threads past the table share its last slot, atomically (a rare thread count). */
	double dt = (omp_get_wtime() - t0) / omp_get_num_threads();
	if (tid < PROF_THREADS - 1) {
		prof_gemm[tid].s += dt;
	} else {
#pragma omp atomic
		prof_gemm[PROF_THREADS - 1].s += dt;
	}
}

/* Row-major C[M,N] = alpha op(A) op(B) + beta C with the threads splitting C into blocks of
 * rows (or of columns, when C is wider than tall) and each block one single-threaded sgemm
 * inside our own parallel region: one fork and one barrier per product, instead of
 * OpenBLAS's threads waiting on each other's packed panels, which stalls badly whenever
 * another process holds one of the cores. The reduction dimension K is never split, so the
 * result has the same bits at any thread count. */
static void sgemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
		  float alpha, const float *A, int lda, const float *B, int ldb, float beta,
		  float *C, int ldc)
{
	int nth = omp_in_parallel() ? 1 : omp_get_max_threads();
	if (nth < 2 || (double)M * N * K < 2e6) {
		gemm_call(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
		return;
	}
	const int by_rows = M >= N;
#pragma omp parallel num_threads(nth)
	{
		int64_t s0, s1; /* blocks of whole 16-wide panels */
		thread_share(by_rows ? M : N, &s0, &s1);
		const int d0 = (int)s0, d1 = (int)s1;
		if (d1 > d0) {
			if (by_rows) /* rows d0..d1 of C come from rows of op(A) */
				gemm_call(ta, tb, d1 - d0, N, K, alpha,
					    ta == CblasNoTrans ? A + (size_t)d0 * lda : A + d0, lda,
					    B, ldb, beta, C + (size_t)d0 * ldc, ldc);
			else /* columns d0..d1 of C come from columns of op(B) */
				gemm_call(ta, tb, M, d1 - d0, K, alpha, A, lda,
					    tb == CblasNoTrans ? B + d0 : B + (size_t)d0 * ldb, ldb,
					    beta, C + d0, ldc);
		}
	}
}

static void cpu_matmul_forward(float *y, const float *x, const float *w, const float *bias, int N,
			       int IC, int OC, enum backend_wlayout layout)
{
	if (layout == BACKEND_W_IO)
		sgemm(CblasNoTrans, CblasNoTrans, N, OC, IC, 1.0f, x, IC, w, OC, 0.0f, y, OC);
	else
		sgemm(CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, x, IC, w, IC, 0.0f, y, OC);
	if (bias)
		add_bias(y, bias, N, OC);
}

static void cpu_matmul_backward(float *dx, float *dw, float *dbias, const float *dy, const float *x,
				const float *w, int N, int IC, int OC, enum backend_wlayout layout,
				int accumulate)
{
	float beta = accumulate ? 1.0f : 0.0f;
	if (layout == BACKEND_W_IO) {
		if (dx) /* dx = dy w^T, w [IC,OC] */
			sgemm(CblasNoTrans, CblasTrans, N, IC, OC, 1.0f, dy, OC, w, OC, beta, dx,
			      IC);
		if (dw) /* dw [IC,OC] = x^T dy */
			sgemm(CblasTrans, CblasNoTrans, IC, OC, N, 1.0f, x, IC, dy, OC, 0.0f, dw,
			      OC);
	} else {
		if (dx) /* dx = dy w, w [OC,IC] */
			sgemm(CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dy, OC, w, IC, beta, dx,
			      IC);
		if (dw) /* dw [OC,IC] = dy^T x */
			sgemm(CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dy, OC, x, IC, 0.0f, dw,
			      IC);
	}
	if (dbias)
		cpu_column_sums(dbias, dy, N, OC);
}

/* ---- embeddings --------------------------------------------------------------------- */

static void cpu_encoder_forward(float *out, const int32_t *tok, const float *wte, const float *wpe,
				int B, int T, int C)
{
#pragma omp parallel for schedule(static)
	for (int n = 0; n < B * T; n++) {
		float *o = out + (size_t)n * C;
		const float *e = wte + (size_t)tok[n] * C, *p = wpe + (size_t)(n % T) * C;
#pragma omp simd
		for (int c = 0; c < C; c++)
			o[c] = e[c] + p[c];
	}
}

static void cpu_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tok,
				 int B, int T, int C, int V)
{
	/* dwte: a scatter-add over tokens; each thread owns a slice of the columns and walks
	 * the tokens in order, so every sum has a fixed order and no two threads collide. */
#pragma omp parallel
	{
		int64_t s0, s1;
		thread_share(C, &s0, &s1);
		const int c0 = (int)s0, w = (int)(s1 - s0);
		if (w > 0) {
			for (int v = 0; v < V; v++)
				memset(dwte + (size_t)v * C + c0, 0, sizeof(float) * (size_t)w);
			for (int n = 0; n < B * T; n++) {
				float *d = dwte + (size_t)tok[n] * C + c0;
				const float *g = dout + (size_t)n * C + c0;
#pragma omp simd
				for (int c = 0; c < w; c++)
					d[c] += g[c];
			}
		}
	}
#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++) {
		float *d = dwpe + (size_t)t * C;
		memcpy(d, dout + (size_t)t * C, sizeof(float) * (size_t)C);
		for (int b = 1; b < B; b++) {
			const float *g = dout + ((size_t)b * T + t) * C;
#pragma omp simd
			for (int c = 0; c < C; c++)
				d[c] += g[c];
		}
	}
}

/* ---- layernorm ---------------------------------------------------------------------- */

static inline void ln_row(float *o, float *mean, float *rstd, const float *x, const float *w,
			  const float *b, int C)
{
	float s = 0.0f;
#pragma omp simd reduction(+ : s)
	for (int c = 0; c < C; c++)
		s += x[c];
	float m = s / (float)C;
	float v = 0.0f;
#pragma omp simd reduction(+ : v)
	for (int c = 0; c < C; c++) {
		float d = x[c] - m;
		v += d * d;
	}
	float r = 1.0f / sqrtf(v / (float)C + 1e-5f);
#pragma omp simd
	for (int c = 0; c < C; c++)
		o[c] = (x[c] - m) * r * w[c] + b[c];
	*mean = m;
	*rstd = r;
}

static void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *x,
				  const float *w, const float *b, int N, int C)
{
#pragma omp parallel for schedule(static)
	for (int n = 0; n < N; n++)
		ln_row(out + (size_t)n * C, mean + n, rstd + n, x + (size_t)n * C, w, b, C);
}

static void cpu_residual_layernorm_forward(float *res, float *out, float *mean, float *rstd,
					   const float *skip, const float *bias, const float *w,
					   const float *b, int N, int C)
{
#pragma omp parallel for schedule(static)
	for (int n = 0; n < N; n++) {
		float *r = res + (size_t)n * C;
		const float *s = skip + (size_t)n * C;
		if (bias) {
#pragma omp simd
			for (int c = 0; c < C; c++)
				r[c] += s[c] + bias[c];
		} else {
#pragma omp simd
			for (int c = 0; c < C; c++)
				r[c] += s[c];
		}
		ln_row(out + (size_t)n * C, mean + n, rstd + n, r, w, b, C);
	}
}

/* With xhat = (x - mean) rstd and g = w * dout:
 * dx = rstd (g - mean(g) - xhat mean(g xhat)); dw = sum_n dout xhat; db = sum_n dout. */
static void cpu_layernorm_backward(float *dx, float *dw, float *db, float *partials,
				   const float *dout, const float *x, const float *w,
				   const float *mean, const float *rstd, int N, int C,
				   int accumulate)
{
#pragma omp parallel for schedule(static)
	for (int k = 0; k < BACKEND_CHUNKS; k++) {
		float *pw = partials + (size_t)k * 2 * C, *pb = pw + C;
		memset(pw, 0, sizeof(float) * 2 * (size_t)C);
		int n0 = (int)((int64_t)N * k / BACKEND_CHUNKS);
		int n1 = (int)((int64_t)N * (k + 1) / BACKEND_CHUNKS);
		for (int n = n0; n < n1; n++) {
			const float *xr = x + (size_t)n * C, *dr = dout + (size_t)n * C;
			float *dxr = dx + (size_t)n * C;
			float m = mean[n], r = rstd[n];
			float sg = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : sg, sgx)
			for (int c = 0; c < C; c++) {
				float xh = (xr[c] - m) * r;
				float g = w[c] * dr[c];
				sg += g;
				sgx += g * xh;
			}
			sg /= (float)C;
			sgx /= (float)C;
			if (accumulate) {
#pragma omp simd
				for (int c = 0; c < C; c++) {
					float xh = (xr[c] - m) * r;
					dxr[c] += (w[c] * dr[c] - sg - xh * sgx) * r;
					pw[c] += dr[c] * xh;
					pb[c] += dr[c];
				}
			} else {
#pragma omp simd
				for (int c = 0; c < C; c++) {
					float xh = (xr[c] - m) * r;
					dxr[c] = (w[c] * dr[c] - sg - xh * sgx) * r;
					pw[c] += dr[c] * xh;
					pb[c] += dr[c];
				}
			}
		}
	}
	memcpy(dw, partials, sizeof(float) * (size_t)C);
	memcpy(db, partials + C, sizeof(float) * (size_t)C);
	for (int k = 1; k < BACKEND_CHUNKS; k++) {
		const float *pw = partials + (size_t)k * 2 * C, *pb = pw + C;
#pragma omp simd
		for (int c = 0; c < C; c++) {
			dw[c] += pw[c];
			db[c] += pb[c];
		}
	}
}

/* ---- GELU --------------------------------------------------------------------------- */

static void cpu_bias_gelu_forward(float *pre, float *out, const float *bias, int N, int C)
{
#pragma omp parallel for schedule(static)
	for (int n = 0; n < N; n++) {
		float *p = pre + (size_t)n * C, *o = out + (size_t)n * C;
#pragma omp simd
		for (int c = 0; c < C; c++) {
			float x = p[c] + bias[c];
			p[c] = x;
			o[c] = x * gelu_sig(x);
		}
	}
}

/* d/dx [x s(2u)] = s + 2 x s (1 - s) u', u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2). The bias
 * gradient is the column sum of the result, so threads split the columns. */
static void cpu_gelu_backward(float *d, float *dbias, const float *pre, int N, int C)
{
#pragma omp parallel
	{
		int64_t s0, s1;
		thread_share(C, &s0, &s1);
		const int c0 = (int)s0, w = (int)(s1 - s0);
		if (w > 0) {
			float *db = dbias + c0;
			memset(db, 0, sizeof(float) * (size_t)w);
			for (int n = 0; n < N; n++) {
				float *dr = d + (size_t)n * C + c0;
				const float *xr = pre + (size_t)n * C + c0;
#pragma omp simd
				for (int c = 0; c < w; c++) {
					float x = xr[c];
					float s = gelu_sig(x);
					float du = GELU_K0 * (1.0f + 3.0f * GELU_K1 * x * x);
					float g = (s + 2.0f * x * s * (1.0f - s) * du) * dr[c];
					dr[c] = g;
					db[c] += g;
				}
			}
		}
	}
}

/* ---- attention ---------------------------------------------------------------------- */

/* Row i of S (already scaled) -> causal softmax over keys 0..i; keys i+1..kn-1 set to 0 so
 * that the block products that follow can run over whole blocks. */
static inline void causal_softmax_row(float *s, int i, int kn)
{
	float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
	for (int j = 0; j <= i; j++)
		mx = s[j] > mx ? s[j] : mx;
	float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
	for (int j = 0; j <= i; j++) {
		float e = exp_approx(s[j] - mx);
		s[j] = e;
		sum += e;
	}
	float inv = 1.0f / sum;
#pragma omp simd
	for (int j = 0; j <= i; j++)
		s[j] *= inv;
	for (int j = i + 1; j < kn; j++)
		s[j] = 0.0f;
}

/* dst [hs, n] (row stride T) = transpose of the n x hs block at src (row stride ld). The
 * products then run as NN, which OpenBLAS's small-matrix kernels do ~1.5x faster than NT at
 * these sizes (32 x 256 x 64: 113 vs 76 GFLOP/s). Tiles of 16 rows keep both sides in L1. */
static void transpose_block(float *dst, const float *src, int n, int hs, int ld, int T)
{
	for (int j0 = 0; j0 < n; j0 += 16) {
		int j1 = min_int(n, j0 + 16);
		for (int d = 0; d < hs; d++) {
			float *o = dst + (size_t)d * T;
#pragma omp simd
			for (int j = j0; j < j1; j++)
				o[j] = src[(size_t)j * ld + d];
		}
	}
}

static void cpu_attention_forward(float *out, float *att, float *ws, const float *qkv, int B, int T,
				  int C, int NH)
{
	const int hs = C / NH, C3 = 3 * C;
	const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel
	{
		float *kt = ws + (size_t)omp_get_thread_num() * ((size_t)T * T + (size_t)hs * T);
#pragma omp for schedule(static)
		for (int bh = 0; bh < B * NH; bh++) {
			int b = bh / NH, h = bh % NH;
			const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs;
			const float *k = q + C, *v = q + 2 * C;
			float *P = att + (size_t)bh * T * T;
			float *o = out + (size_t)b * T * C + (size_t)h * hs;
			transpose_block(kt, k, T, hs, C3, T);
			for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
				int rn = min_int(ATT_BLOCK, T - r0), kn = r0 + rn;
				float *Pr = P + (size_t)r0 * T;
				/* S[r0.., 0..kn) = scale * Q K^T */
				gemm_call(CblasNoTrans, CblasNoTrans, rn, kn, hs,
					    scale, q + (size_t)r0 * C3, C3, kt, T, 0.0f, Pr, T);
				for (int i = 0; i < rn; i++)
					causal_softmax_row(Pr + (size_t)i * T, r0 + i, kn);
				/* O[r0..] = P V */
				gemm_call(CblasNoTrans, CblasNoTrans, rn, hs, kn,
					    1.0f, Pr, T, v, C3, 0.0f, o + (size_t)r0 * C, C);
			}
		}
	}
}

static size_t cpu_attention_ws_floats(int T, int hs)
{
	return (size_t)omp_get_max_threads() * ((size_t)T * T + (size_t)hs * T);
}

/* With P = softmax(S), dP = dO V^T: dS = P (dP - rowsum(P dP)) * scale (scale folded in),
 * dQ = dS K, dK = dS^T Q, dV = P^T dO; all restricted to the causal blocks. */
static void cpu_attention_backward(float *dqkv, float *ws, const float *dout, const float *qkv,
				   const float *att, int B, int T, int C, int NH)
{
	const int hs = C / NH, C3 = 3 * C;
	const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel
	{
		float *dS = ws + (size_t)omp_get_thread_num() * ((size_t)T * T + (size_t)hs * T);
		float *vt = dS + (size_t)T * T;
#pragma omp for schedule(static)
		for (int bh = 0; bh < B * NH; bh++) {
			int b = bh / NH, h = bh % NH;
			const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs;
			const float *k = q + C, *v = q + 2 * C;
			const float *P = att + (size_t)bh * T * T;
			const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
			float *dq = dqkv + (size_t)b * T * C3 + (size_t)h * hs;
			float *dk = dq + C, *dv = dq + 2 * C;
			transpose_block(vt, v, T, hs, C3, T);
			for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
				int rn = min_int(ATT_BLOCK, T - r0), kn = r0 + rn;
				float *dSr = dS + (size_t)r0 * T;
				gemm_call(CblasNoTrans, CblasNoTrans, rn, kn, hs,
					    1.0f, dO + (size_t)r0 * C, C, vt, T, 0.0f, dSr, T);
				for (int ii = 0; ii < rn; ii++) {
					int i = r0 + ii;
					const float *p = P + (size_t)i * T;
					float *d = dSr + (size_t)ii * T;
					float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
					for (int j = 0; j <= i; j++)
						dot += p[j] * d[j];
#pragma omp simd
					for (int j = 0; j <= i; j++)
						d[j] = p[j] * (d[j] - dot) * scale;
					for (int j = i + 1; j < kn; j++)
						d[j] = 0.0f;
				}
				gemm_call(CblasNoTrans, CblasNoTrans, rn, hs, kn,
					    1.0f, dSr, T, k, C3, 0.0f, dq + (size_t)r0 * C3, C3);
			}
			for (int c0 = 0; c0 < T; c0 += ATT_BLOCK) {
				int cn = min_int(ATT_BLOCK, T - c0), m = T - c0;
				gemm_call(CblasTrans, CblasNoTrans, cn, hs, m,
					    1.0f, dS + (size_t)c0 * T + c0, T, q + (size_t)c0 * C3,
					    C3, 0.0f, dk + (size_t)c0 * C3, C3);
				gemm_call(CblasTrans, CblasNoTrans, cn, hs, m,
					    1.0f, P + (size_t)c0 * T + c0, T, dO + (size_t)c0 * C,
					    C, 0.0f, dv + (size_t)c0 * C3, C3);
			}
		}
	}
}

/* ---- softmax cross-entropy ---------------------------------------------------------- */

static void cpu_crossentropy_forward(float *probs, float *losses, const int32_t *targets, int N,
				     int V)
{
#pragma omp parallel for schedule(static)
	for (int n = 0; n < N; n++) {
		float *p = probs + (size_t)n * V;
		float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
		for (int j = 0; j < V; j++)
			mx = p[j] > mx ? p[j] : mx;
		float tl = targets ? p[targets[n]] : 0.0f;
		float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
		for (int j = 0; j < V; j++) {
			float e = exp_approx(p[j] - mx);
			p[j] = e;
			sum += e;
		}
		float inv = 1.0f / sum;
#pragma omp simd
		for (int j = 0; j < V; j++)
			p[j] *= inv;
		if (targets) /* -log softmax = log(sum) - (logit - max) */
			losses[n] = logf(sum) - (tl - mx);
	}
}

static void cpu_crossentropy_backward(float *probs, const int32_t *targets, int N, int V,
				      float scale)
{
#pragma omp parallel for schedule(static)
	for (int n = 0; n < N; n++) {
		float *p = probs + (size_t)n * V;
#pragma omp simd
		for (int j = 0; j < V; j++)
			p[j] *= scale;
		p[targets[n]] -= scale;
	}
}

/* ---- optimizer ---------------------------------------------------------------------- */

/* Bit for bit the arithmetic of torch 1.13 _single_tensor_adamw (torch/optim/adamw.py) on
 * the CPU, checked against it element by element:
 *   param.mul_(1 - lr * wd)
 *   exp_avg.mul_(b1).add_(grad, alpha=1 - b1)          add with alpha is a fused multiply-add
 *   exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=1 - b2)   fma((1 - b2) g, g, v b2)
 *   denom = (exp_avg_sq.sqrt() / sqrt(1 - b2^t)).add_(eps)
 *   param.addcdiv_(exp_avg, denom, value=-lr / (1 - b1^t))   p + (value m) / denom
 * with the Python-double scalars rounded to float as ATen does for float tensors. */
struct adamw_consts {
	float decay, b1, c1, b2, c2, bc2s, eps, step, scale;
};

/* One thread's share of the update. The Makefile builds with -fno-math-errno, so GCC
 * vectorises sqrtf here (vsqrtps); vector sqrt, division and FMA round exactly as the scalar
 * ones, so every width gives the same bits. */
static void adamw_range(float *restrict p, const float *restrict g, float *restrict m,
			float *restrict v, size_t i0, size_t i1, const struct adamw_consts *k)
{
	const float decay = k->decay, b1 = k->b1, c1 = k->c1, b2 = k->b2, c2 = k->c2;
	const float bc2s = k->bc2s, eps = k->eps, step = k->step, scale = k->scale;
#pragma omp simd
	for (size_t i = i0; i < i1; i++) {
		float gi = g[i] * scale;
		float pi = p[i] * decay;
		float mi = fmaf(c1, gi, m[i] * b1);
		float vi = fmaf(c2 * gi, gi, v[i] * b2);
		float den = sqrtf(vi) / bc2s + eps;
		p[i] = pi + (step * mi) / den;
		m[i] = mi;
		v[i] = vi;
	}
}

/* One parallel region for all segments (a model has dozens; a region each would put a
 * fork and a barrier per segment on the step): every thread takes its share of each
 * segment in turn, no barrier in between. */
static void cpu_adamw_update(float *p, const float *g, float *m, float *v,
			     const struct backend_segment *seg, int nseg, double lr, double beta1,
			     double beta2, double eps, long t, float grad_scale)
{
	const double bc1 = 1.0 - pow(beta1, (double)t), bc2 = 1.0 - pow(beta2, (double)t);
	struct adamw_consts k = {
		.b1 = (float)beta1,
		.c1 = (float)(1.0 - beta1),
		.b2 = (float)beta2,
		.c2 = (float)(1.0 - beta2),
		.bc2s = (float)sqrt(bc2),
		.eps = (float)eps,
		.step = (float)(-lr / bc1),
		.scale = grad_scale,
	};
#pragma omp parallel firstprivate(k)
	{
		size_t nth = (size_t)omp_get_num_threads(), tid = (size_t)omp_get_thread_num();
		for (int s = 0; s < nseg; s++) {
			size_t o = seg[s].offset, n = seg[s].n;
			k.decay = (float)(1.0 - lr * seg[s].weight_decay);
			adamw_range(p + o, g + o, m + o, v + o, n * tid / nth, n * (tid + 1) / nth,
				    &k);
		}
	}
}

static double cpu_sum_squares(const float *x, size_t n)
{
	double part[BACKEND_CHUNKS];
#pragma omp parallel for schedule(static)
	for (int k = 0; k < BACKEND_CHUNKS; k++) {
		size_t i0 = n * (size_t)k / BACKEND_CHUNKS,
		       i1 = n * (size_t)(k + 1) / BACKEND_CHUNKS;
		double s = 0.0;
#pragma omp simd reduction(+ : s)
		for (size_t i = i0; i < i1; i++)
			s += (double)x[i] * (double)x[i];
		part[k] = s;
	}
	double s = 0.0;
	for (int k = 0; k < BACKEND_CHUNKS; k++)
		s += part[k];
	return s;
}

static const struct backend_ops cpu_ops = {
	.name = "cpu",
	.matmul_forward = cpu_matmul_forward,
	.matmul_backward = cpu_matmul_backward,
	.encoder_forward = cpu_encoder_forward,
	.encoder_backward = cpu_encoder_backward,
	.layernorm_forward = cpu_layernorm_forward,
	.residual_layernorm_forward = cpu_residual_layernorm_forward,
	.layernorm_backward = cpu_layernorm_backward,
	.bias_gelu_forward = cpu_bias_gelu_forward,
	.gelu_backward = cpu_gelu_backward,
	.attention_forward = cpu_attention_forward,
	.attention_backward = cpu_attention_backward,
	.attention_ws_floats = cpu_attention_ws_floats,
	.crossentropy_forward = cpu_crossentropy_forward,
	.crossentropy_backward = cpu_crossentropy_backward,
	.adamw_update = cpu_adamw_update,
	.sum_squares = cpu_sum_squares,
	.profile = cpu_profile,
	.gemm_seconds = cpu_gemm_seconds,
};

const struct backend_ops *backend_cpu(void) { return &cpu_ops; }
