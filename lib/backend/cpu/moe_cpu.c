/* moe_cpu.c - the CPU backend's MoE kernels: gating (softmax, top-k, auxiliary losses and
 * their backward), expert counts, locations, and Tutel's encode/decode kernels K0/K1/K2
 * (arXiv 2206.03382 sec. 3.4.7). Contracts and math in backend.h.
 *
 * Every kernel walks the tokens in order: encode and decode-backward read each token's row
 * once and write its (up to k) slots, decode and encode-backward gather its k rows in one
 * pass. Each slot has one owner, so no two threads write the same row.
 */
#include "backend/cpu/cpu_impl.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/rng.h"
#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif
#include "common/banned.h"

/* Work of the gate per (token, expert), in units of one element of a plain loop: the noise
 * draw, the exp, the top-k scan and the renormalisation. It decides only when the gate is
 * worth a parallel region. */
#define GATE_COST 16

/* ---- gating ---------------------------------------------------------------------------- */

static void softmax_row(const float *in, float *out, int E)
{
	float mx = in[0];
	for (int e = 1; e < E; e++)
		mx = in[e] > mx ? in[e] : mx;
	float sum = 0.0f;
	for (int e = 0; e < E; e++) {
		out[e] = expf(in[e] - mx);
		sum += out[e];
	}
	float inv = 1.0f / sum;
	for (int e = 0; e < E; e++)
		out[e] *= inv;
}

/* The noise added to routed logit (t, e) at this step (Tutel: gate_noise * randn / E). */
static float gate_noise_at(const struct backend_moe_gate *g, int64_t t, int e)
{
	uint64_t i = (g->step * (uint64_t)g->T + (uint64_t)t) * (uint64_t)g->E + (uint64_t)e;
	return g->noise / (float)g->E * rng_normal(g->seed, RNG_STREAM_NOISE, i);
}

static double phi_pdf(double z)
{
	return exp(-0.5 * z * z) / sqrt(2.0 * M_PI);
}

static double phi_cdf(double z)
{
	return 0.5 * erfc(-z / sqrt(2.0));
}

/* cv2(v) = var(v) / (mean^2 + 1e-10), unbiased variance; and d cv2 / d v_e into g. */
static double cv2_and_grad(const double *v, int E, double *g)
{
	double mu = 0.0, var = 0.0;
	for (int e = 0; e < E; e++)
		mu += v[e];
	mu /= E;
	for (int e = 0; e < E; e++)
		var += (v[e] - mu) * (v[e] - mu);
	var /= (E - 1);
	double den = mu * mu + 1e-10;
	if (g)
		for (int e = 0; e < E; e++)
			g[e] = 2.0 * (v[e] - mu) / (E - 1) / den - var * 2.0 * mu / E / (den * den);
	return var / den;
}

/* The routed logit of (t, e): logit plus noise when noise is on. */
static float routed_logit(const struct backend_moe_gate *g, const float *logits, int64_t t,
			  int e)
{
	float v = logits[t * g->E + e];
	if (g->noise > 0.0f)
		v += gate_noise_at(g, t, e);
	return v;
}

int cpu_moe_gate_forward(struct backend *be, const struct backend_moe_gate *g,
			 const float *logits, float *probs, float *clean, float *top,
			 int32_t *idx, float *score, float *aux)
{
	const int E = g->E, k = g->k, li = g->load_importance;
	const int64_t T = g->T;

	cpu_enter(be);
	/* Per-thread scratch, allocated before the region so that a failure is an error, not
	 * tokens silently skipped. */
	const size_t nth = (size_t)omp_get_max_threads();
	float *bufs = malloc(sizeof(float) * (size_t)E * nth);
	unsigned char *takens = malloc((size_t)E * nth);
	if (!bufs || !takens) {
		free(bufs);
		free(takens);
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the gate's scratch");
	}
	/* Per token: noisy logits -> softmax -> top-k (ties: lower index) -> renormalise. */
#pragma omp parallel if (T * E * GATE_COST >= CPU_PAR_MIN)
	{
		float *buf = bufs + (size_t)E * (size_t)omp_get_thread_num();
		unsigned char *taken = takens + (size_t)E * (size_t)omp_get_thread_num();
#pragma omp for schedule(static)
		for (int64_t t = 0; t < T; t++) {
			for (int e = 0; e < E; e++)
				buf[e] = routed_logit(g, logits, t, e);
			float *p = probs + t * E;
			softmax_row(buf, p, E);
			if (clean)
				softmax_row(logits + t * E, clean + t * E, E);
			memset(taken, 0, (size_t)E);
			float sum = 0.0f;
			for (int j = 0; j < k; j++) {
				int best = -1;
				for (int e = 0; e < E; e++)
					if (!taken[e] && (best < 0 || p[e] > p[best]))
						best = e;
				taken[best] = 1;
				idx[(int64_t)j * T + t] = best;
				score[(int64_t)j * T + t] = p[best];
				sum += p[best];
			}
			if (k > 1) {
				float den = sum > FLT_EPSILON ? sum : FLT_EPSILON;
				for (int j = 0; j < k; j++)
					score[(int64_t)j * T + t] /= den;
			}
			top[t] = p[idx[t]];
		}
	}
	free(bufs);
	free(takens);

	/* Auxiliary loss: reductions over T in double, serially (T*E adds; deterministic). */
	double *acc = calloc((size_t)E * 4, sizeof(double));
	if (!acc)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the gate loss accumulators");
	if (!li) {
		double *ce = acc, *me = acc + E;
		for (int64_t t = 0; t < T; t++) {
			ce[idx[t]] += 1.0;
			for (int e = 0; e < E; e++)
				me[e] += probs[t * E + e];
		}
		double l = 0.0;
		for (int e = 0; e < E; e++)
			l += (ce[e] / (double)T) * (me[e] / (double)T);
		*aux = (float)(l * E);
	} else {
		double *imp = acc, *load = acc + E;
		double sigma = g->noise / (double)E;
		for (int64_t t = 0; t < T; t++) {
			int ek = idx[(int64_t)(k - 1) * T + t];
			double thr = routed_logit(g, logits, t, ek);
			for (int e = 0; e < E; e++) {
				imp[e] += clean[t * E + e];
				load[e] += phi_cdf((clean[t * E + e] - thr) / sigma);
			}
		}
		*aux = (float)(0.5 * (cv2_and_grad(imp, E, NULL) + cv2_and_grad(load, E, NULL)));
	}
	free(acc);
	return 0;
}

/* Per-expert factors of the auxiliary loss's gradient, into acc [4E]: GShard,
 * acc[e] = aux_weight * d l / d p[t,e] = aux_weight E ce_e / T with ce_e = mean_t mask1[t,e];
 * load-importance, acc[2E + e] and acc[3E + e] = aux_weight/2 times d cv2 / d Imp_e and
 * d cv2 / d Load_e (the latter over sigma, the chain rule's factor of Phi's argument). */
static void aux_factors(const struct backend_moe_gate *g, const float *logits,
			const float *clean, const int32_t *idx, float aux_weight, double *acc)
{
	const int E = g->E, k = g->k;
	const int64_t T = g->T;
	const double sigma = g->noise / (double)E;

	if (!g->load_importance) {
		for (int64_t t = 0; t < T; t++)
			acc[idx[t]] += 1.0;
		for (int e = 0; e < E; e++)
			acc[e] = aux_weight * (double)E * (acc[e] / (double)T) / (double)T;
		return;
	}
	double *imp = acc, *load = acc + E, *gimp = acc + 2 * E, *gload = acc + 3 * E;
	for (int64_t t = 0; t < T; t++) {
		int ek = idx[(int64_t)(k - 1) * T + t];
		double thr = routed_logit(g, logits, t, ek);
		for (int e = 0; e < E; e++) {
			imp[e] += clean[t * E + e];
			load[e] += phi_cdf((clean[t * E + e] - thr) / sigma);
		}
	}
	cv2_and_grad(imp, E, gimp);
	cv2_and_grad(load, E, gload);
	for (int e = 0; e < E; e++) {
		gimp[e] *= 0.5 * aux_weight;
		gload[e] *= 0.5 * aux_weight / sigma;
	}
}

/* Token t's dlogits: through the score renormalisation and the softmax, plus the auxiliary
 * loss's terms (acc from aux_factors); dp and dq are E floats of scratch each. */
static void gate_token_backward(const struct backend_moe_gate *g, int64_t t,
				const float *logits, const float *probs, const float *clean,
				const int32_t *idx, const float *dscore, const double *acc,
				float *dp, float *dq, float *dlogits)
{
	const int E = g->E, k = g->k, li = g->load_importance;
	const int64_t T = g->T;
	const float *p = probs + t * E;
	float *dl = dlogits + t * E;

	for (int e = 0; e < E; e++)
		dp[e] = li ? 0.0f : (float)acc[e];
	/* Through the renormalisation s_j = p_j / S, S = sum_r p_r (k > 1). */
	if (k == 1) {
		dp[idx[t]] += dscore[t];
	} else {
		float S = 0.0f, sp = 0.0f;
		for (int j = 0; j < k; j++)
			S += p[idx[(int64_t)j * T + t]];
		int clamped = !(S > FLT_EPSILON);
		S = clamped ? FLT_EPSILON : S;
		for (int j = 0; j < k; j++)
			sp += dscore[(int64_t)j * T + t] * p[idx[(int64_t)j * T + t]];
		for (int j = 0; j < k; j++) {
			int e = idx[(int64_t)j * T + t];
			dp[e] += dscore[(int64_t)j * T + t] / S - (clamped ? 0.0f : sp / (S * S));
		}
	}
	/* Softmax backward: dlogit = p * (dp - <p, dp>). */
	float dot = 0.0f;
	for (int e = 0; e < E; e++)
		dot += p[e] * dp[e];
	for (int e = 0; e < E; e++)
		dl[e] = p[e] * (dp[e] - dot);
	if (!li)
		return;
	/* Load-importance: through the clean softmax q, and through thr_t, the routed logit of
	 * the rank-(k-1) choice, whose gradient goes straight into that logit. */
	const double sigma = g->noise / (double)E, *gimp = acc + 2 * E, *gload = acc + 3 * E;
	const float *q = clean + t * E;
	int ek = idx[(int64_t)(k - 1) * T + t];
	double thr = routed_logit(g, logits, t, ek);
	double dthr = 0.0;
	for (int e = 0; e < E; e++) {
		double gl = gload[e] * phi_pdf((q[e] - thr) / sigma);
		dq[e] = (float)(gimp[e] + gl);
		dthr -= gl;
	}
	float dotq = 0.0f;
	for (int e = 0; e < E; e++)
		dotq += q[e] * dq[e];
	for (int e = 0; e < E; e++)
		dl[e] += q[e] * (dq[e] - dotq);
	dl[ek] += (float)dthr;
}

int cpu_moe_gate_backward(struct backend *be, const struct backend_moe_gate *g,
			  const float *logits, const float *probs, const float *clean,
			  const int32_t *idx, const float *dscore, float aux_weight,
			  float *dlogits)
{
	const int E = g->E;
	const int64_t T = g->T;
	cpu_enter(be);
	const size_t nth = (size_t)omp_get_max_threads();
	double *acc = calloc((size_t)E * 4, sizeof(double));
	float *dps = malloc(sizeof(float) * (size_t)E * 2 * nth); /* per thread: dp, dq */

	if (!acc || !dps) {
		free(acc);
		free(dps);
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the gate's scratch");
	}
	aux_factors(g, logits, clean, idx, aux_weight, acc);
#pragma omp parallel if (T * E * GATE_COST >= CPU_PAR_MIN)
	{
		float *dp = dps + (size_t)E * 2 * (size_t)omp_get_thread_num();
#pragma omp for schedule(static)
		for (int64_t t = 0; t < T; t++)
			gate_token_backward(g, t, logits, probs, clean, idx, dscore, acc, dp, dp + E,
					    dlogits);
	}
	free(dps);
	free(acc);
	return 0;
}

/* ---- counts and locations -------------------------------------------------------------- */

int cpu_moe_count(struct backend *be, const int32_t *idx, int64_t n, int E, int64_t *count)
{
	memset(count, 0, sizeof(int64_t) * (size_t)E);
	for (int64_t i = 0; i < n; i++)
		count[idx[i]]++;
	return 0;
}

/* Stable descending order of the BPR keys: LSD radix sort on the float bits (the keys are
 * probabilities in [0, 1], so their bit patterns order like the values). Sorting the
 * complemented bits ascending gives descending values, ties in token order. */
static int bpr_order(const float *top, int64_t T, int32_t *order)
{
	uint32_t *key = malloc(sizeof(uint32_t) * (size_t)T * 2);
	int32_t *tmp = malloc(sizeof(int32_t) * (size_t)T);

	if (!key || !tmp) {
		free(key);
		free(tmp);
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the routing order");
	}
	uint32_t *key2 = key + T;
	for (int64_t t = 0; t < T; t++) {
		uint32_t b;
		memcpy(&b, &top[t], sizeof b);
		key[t] = ~b;
		order[t] = (int32_t)t;
	}
	for (int shift = 0; shift < 32; shift += 8) {
		int64_t hist[257] = { 0 };
		for (int64_t t = 0; t < T; t++)
			hist[((key[t] >> shift) & 255u) + 1]++;
		for (int b = 0; b < 256; b++)
			hist[b + 1] += hist[b];
		for (int64_t t = 0; t < T; t++) {
			int64_t d = hist[(key[t] >> shift) & 255u]++;
			key2[d] = key[t];
			tmp[d] = order[t];
		}
		memcpy(key, key2, sizeof(uint32_t) * (size_t)T);
		memcpy(order, tmp, sizeof(int32_t) * (size_t)T);
	}
	free(key);
	free(tmp);
	return 0;
}

int cpu_moe_locations(struct backend *be, const int32_t *idx, const float *top, int64_t T,
		      int k, int E, int64_t C, int32_t *loc)
{
	int32_t *order = NULL;
	int64_t *fill = calloc((size_t)E, sizeof(int64_t));

	if (!fill)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the expert counters");
	if (top) {
		order = malloc(sizeof(int32_t) * (size_t)T);
		int rc = order ? bpr_order(top, T, order)
			       : err_set(CORE_ENOMEM, NULL, "cannot allocate the routing order");
		if (rc < 0) {
			free(fill);
			free(order);
			return rc;
		}
	}
	/* The exclusive scan: one counter per expert, ranks outer so that every first choice
	 * is placed before any second choice. */
	for (int j = 0; j < k; j++) {
		const int32_t *ix = idx + (int64_t)j * T;
		int32_t *lc = loc + (int64_t)j * T;
		for (int64_t i = 0; i < T; i++) {
			int64_t t = order ? order[i] : i;
			int64_t l = fill[ix[t]]++;
			lc[t] = l < C ? (int32_t)l : -1;
		}
	}
	free(fill);
	free(order);
	return 0;
}

/* ---- row helpers ------------------------------------------------------------------------
 * The [E,C,M] buffers and the [T,M] outputs are written once, in order, and are far larger
 * than the caches: streaming (non-temporal) stores skip the read-for-ownership a normal store
 * pays, so a row write costs one memory transfer instead of two. They need 64-byte aligned
 * rows (M a multiple of 16 and aligned buffers); otherwise the plain loops run, with the same
 * operations in the same order (a first row by multiplication or copy, then fused
 * multiply-adds or adds), so the bits never depend on which path ran. Every parallel region
 * that streams ends with a store fence. */

#if defined(__AVX512F__)
#define ROW_VEC 16
#define ROW_ALIGN 64
typedef __m512 vrow;
static inline vrow v_load(const float *p) { return _mm512_loadu_ps(p); }
static inline vrow v_zero(void) { return _mm512_setzero_ps(); }
static inline vrow v_mul(vrow a, float s) { return _mm512_mul_ps(a, _mm512_set1_ps(s)); }
static inline vrow v_fma(vrow a, float s, vrow acc)
{
	return _mm512_fmadd_ps(a, _mm512_set1_ps(s), acc);
}
static inline vrow v_add(vrow a, vrow b) { return _mm512_add_ps(a, b); }
static inline void v_stream(float *p, vrow v) { _mm512_stream_ps(p, v); }
#elif defined(__AVX__) && defined(__FMA__)
#define ROW_VEC 8
#define ROW_ALIGN 32
typedef __m256 vrow;
static inline vrow v_load(const float *p) { return _mm256_loadu_ps(p); }
static inline vrow v_zero(void) { return _mm256_setzero_ps(); }
static inline vrow v_mul(vrow a, float s) { return _mm256_mul_ps(a, _mm256_set1_ps(s)); }
static inline vrow v_fma(vrow a, float s, vrow acc)
{
	return _mm256_fmadd_ps(a, _mm256_set1_ps(s), acc);
}
static inline vrow v_add(vrow a, vrow b) { return _mm256_add_ps(a, b); }
static inline void v_stream(float *p, vrow v) { _mm256_stream_ps(p, v); }
#endif

static inline void fence(void)
{
#ifdef ROW_VEC
	_mm_sfence();
#endif
}

/* 1 when rows of M floats starting at p can be streamed. */
static inline int streamable(const float *p, int64_t M)
{
#ifdef ROW_VEC
	return ((uintptr_t)p % ROW_ALIGN) == 0 && M % ROW_VEC == 0;
#else
	(void)p;
	(void)M;
	return 0;
#endif
}

/* The plain rows: dst = *w s (w NULL: a copy of s), then dst = fma(s, *w, dst) (w NULL:
 * dst + s) for each further row. */
static inline void row_first(float *dst, const float *s, const float *w, int64_t M)
{
	if (!w) {
		memcpy(dst, s, sizeof(float) * (size_t)M);
		return;
	}
	const float w0 = *w;
#pragma omp simd
	for (int64_t m = 0; m < M; m++)
		dst[m] = s[m] * w0;
}

static inline void row_next(float *dst, const float *s, const float *w, int64_t M)
{
	if (!w) {
#pragma omp simd
		for (int64_t m = 0; m < M; m++)
			dst[m] += s[m];
		return;
	}
	const float wi = *w;
#pragma omp simd
	for (int64_t m = 0; m < M; m++)
		dst[m] = fmaf(s[m], wi, dst[m]);
}

/* dst = w[0] src[0] + w[1] src[1] + ... over n rows, as fused multiply-adds from the first
 * product (w NULL: unweighted sums from a copy of the first row; n 0: zeros). */
static void row_combine(float *dst, const float *const *src, const float *w, int n, int64_t M,
			int stream)
{
#ifdef ROW_VEC
	if (stream) {
		for (int64_t m = 0; m < M; m += ROW_VEC) {
			vrow acc = v_zero();
			if (n > 0)
				acc = w ? v_mul(v_load(src[0] + m), w[0]) : v_load(src[0] + m);
			for (int i = 1; i < n; i++)
				acc = w ? v_fma(v_load(src[i] + m), w[i], acc)
					: v_add(acc, v_load(src[i] + m));
			v_stream(dst + m, acc);
		}
		return;
	}
#else
	(void)stream;
#endif
	if (n == 0) {
		memset(dst, 0, sizeof(float) * (size_t)M);
		return;
	}
	row_first(dst, src[0], w, M);
	for (int i = 1; i < n; i++)
		row_next(dst, src[i], w ? w + i : NULL, M);
}

/* The kept rows of token t in buf ([E,C,M]) and their scores; returns how many (<= k). */
static int token_rows(const struct backend_moe_route *r, int64_t t, const float *buf, int64_t M,
		      const float **rows, float *w)
{
	int n = 0;
	for (int j = 0; j < r->k; j++) {
		int32_t l = r->loc[(int64_t)j * r->T + t];
		if (l < 0)
			continue;
		rows[n] = buf + ((int64_t)r->idx[(int64_t)j * r->T + t] * r->C + l) * M;
		w[n++] = r->score[(int64_t)j * r->T + t];
	}
	return n;
}

/* Row pointers and weights of one token's choices, on the stack, for k up to this. */
#define KSTACK 16

/* ---- encode / decode -------------------------------------------------------------------- */

/* The row kernels below write disjoint rows and reduce nothing across rows, so their
 * result does not depend on which thread takes which row: they use dynamic scheduling, which
 * keeps both cores busy when the machine is shared and one thread gets preempted. */
#define ROW_CHUNK 32

/* Zero the padding rows [min(n_e, C), C) of every expert (streamed when st); call inside a
 * parallel region (work-shared, no barrier at the end). */
static void zero_padding(const struct backend_moe_route *r, float *buf, int64_t M, int st)
{
	const int64_t C = r->C;
#pragma omp for schedule(dynamic, ROW_CHUNK) collapse(2) nowait
	for (int e = 0; e < r->E; e++)
		for (int64_t c = 0; c < C; c++)
			if (c >= r->count[e])
				row_combine(buf + ((int64_t)e * C + c) * M, NULL, NULL, 0, M, st);
}

/* K0 in token order: each token row is read once and written to its (up to k) slots, so
 * the input is read T times, not k*T times. Each slot has one owner: no write conflicts. */
int cpu_moe_encode(struct backend *be, const struct backend_moe_route *r, const float *x,
		   float *disp, int64_t M, int zero_pad)
{
	const int64_t T = r->T, C = r->C;
	const int k = r->k;
	const int st = streamable(disp, M) && streamable(x, M);

	cpu_enter(be);
#pragma omp parallel if ((T + (int64_t)r->E * C) * M >= CPU_PAR_MIN)
	{
		if (zero_pad)
			zero_padding(r, disp, M, st);
#pragma omp for schedule(dynamic, ROW_CHUNK) nowait
		for (int64_t t = 0; t < T; t++) {
			const float *src = x + t * M;
			for (int j = 0; j < k; j++) {
				int32_t l = r->loc[(int64_t)j * T + t];
				if (l < 0)
					continue;
				float *dst = disp + ((int64_t)r->idx[(int64_t)j * T + t] * C + l) * M;
				row_combine(dst, &src, NULL, 1, M, st);
			}
		}
		fence();
	}
	return 0;
}

/* Decode and encode-backward share one gather: out[t] = sum over t's kept choices of
 * (weight) * buf[idx, loc]; weighted by the gate score for decode, unweighted for
 * encode-backward. */
static void gather_tokens(const struct backend_moe_route *r, const float *buf, float *out,
			  int64_t M, int weighted)
{
	const int64_t T = r->T;
	const int k = r->k;
	const int st = streamable(out, M) && streamable(buf, M);

	if (k > KSTACK) {
		/* Rare: more choices than the stack holds; accumulate the rows one at a time, with
		 * the operations of row_combine's plain path. */
#pragma omp parallel for schedule(dynamic, ROW_CHUNK) if (T * M * k >= CPU_PAR_MIN)
		for (int64_t t = 0; t < T; t++) {
			float *o = out + t * M;
			int n = 0;
			for (int j = 0; j < k; j++) {
				int64_t i = (int64_t)j * T + t;
				if (r->loc[i] < 0)
					continue;
				const float *s = buf + ((int64_t)r->idx[i] * r->C + r->loc[i]) * M;
				const float *w = weighted ? &r->score[i] : NULL;
				if (n++ == 0)
					row_first(o, s, w, M);
				else
					row_next(o, s, w, M);
			}
			if (n == 0)
				memset(o, 0, sizeof(float) * (size_t)M);
		}
		return;
	}
#pragma omp parallel if (T * M * k >= CPU_PAR_MIN)
	{
		const float *rows[KSTACK];
		float w[KSTACK];
#pragma omp for schedule(dynamic, ROW_CHUNK) nowait
		for (int64_t t = 0; t < T; t++) {
			int n = token_rows(r, t, buf, M, rows, w);
			row_combine(out + t * M, rows, weighted ? w : NULL, n, M, st);
		}
		fence();
	}
}

int cpu_moe_decode(struct backend *be, const struct backend_moe_route *r, const float *eo,
		   float *y, int64_t M)
{
	cpu_enter(be);
	gather_tokens(r, eo, y, M, 1);
	return 0;
}

int cpu_moe_encode_backward(struct backend *be, const struct backend_moe_route *r,
			    const float *d_disp, float *dx, int64_t M)
{
	cpu_enter(be);
	gather_tokens(r, d_disp, dx, M, 0);
	return 0;
}

int cpu_moe_decode_backward(struct backend *be, const struct backend_moe_route *r,
			    const float *dy, const float *eo, float *d_eo, float *dscore,
			    int64_t M, int zero_pad)
{
	const int64_t T = r->T, C = r->C;
	const int k = r->k;

	cpu_enter(be);
	/* One pass over the tokens: dy[t] is read once for its k choices. K2 reads each
	 * expert-output row before K0 overwrites it, so d_eo may alias eo (the layer does that
	 * to save E*C*M floats); then the row is in cache and plain stores are right. */
#pragma omp parallel if ((T + (int64_t)r->E * C) * M >= CPU_PAR_MIN)
	{
		if (zero_pad)
			zero_padding(r, d_eo, M, 0);
#pragma omp for schedule(dynamic, ROW_CHUNK) nowait
		for (int64_t t = 0; t < T; t++) {
			const float *g = dy + t * M;
			for (int j = 0; j < k; j++) {
				int64_t i = (int64_t)j * T + t;
				int32_t l = r->loc[i];
				if (l < 0) {
					dscore[i] = 0.0f;
					continue;
				}
				int64_t s = (int64_t)r->idx[i] * C + l;
				const float *o = eo + s * M;
				float *out = d_eo + s * M;
				const float sc = r->score[i];
				float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
				for (int64_t m = 0; m < M; m++)
					dot += g[m] * o[m];
				dscore[i] = dot;
#pragma omp simd
				for (int64_t m = 0; m < M; m++)
					out[m] = sc * g[m];
			}
		}
	}
	return 0;
}

/* ---- the dispatch ops on bfloat16 rows ----------------------------------------------------
 * Plain loops on the widened values, tokens shared among the threads as above (each output
 * row has one owner). Decode and encode backward keep float accumulators for a block of
 * BF_BLOCK elements on the stack and run the contract's chain per element (fused
 * multiply-adds from zero, in rank order), so any k works; each result is rounded once. The
 * dot product of decode backward has a fixed order (8 partial sums by m % 8, then a fixed
 * tree), so its bits depend neither on the thread count nor on alignment. */
#define BF_BLOCK 256

static void zero_padding_bf16(const struct backend_moe_route *r, uint16_t *buf, int64_t M)
{
	const int64_t C = r->C;
#pragma omp for schedule(dynamic, ROW_CHUNK) collapse(2) nowait
	for (int e = 0; e < r->E; e++)
		for (int64_t c = 0; c < C; c++)
			if (c >= r->count[e])
				memset(buf + ((int64_t)e * C + c) * M, 0, sizeof *buf * (size_t)M);
}

int cpu_moe_encode_bf16(struct backend *be, const struct backend_moe_route *r,
			const uint16_t *x, uint16_t *disp, int64_t M, int zero_pad)
{
	const int64_t T = r->T, C = r->C;
	const int k = r->k;

	cpu_enter(be);
#pragma omp parallel if ((T + (int64_t)r->E * C) * M >= CPU_PAR_MIN)
	{
		if (zero_pad)
			zero_padding_bf16(r, disp, M);
#pragma omp for schedule(dynamic, ROW_CHUNK) nowait
		for (int64_t t = 0; t < T; t++)
			for (int j = 0; j < k; j++) {
				const int64_t i = (int64_t)j * T + t;
				if (r->loc[i] >= 0)
					memcpy(disp + ((int64_t)r->idx[i] * C + r->loc[i]) * M,
					       x + t * M, sizeof *x * (size_t)M);
			}
	}
	return 0;
}

static void gather_bf16(const struct backend_moe_route *r, const uint16_t *buf, uint16_t *out,
			int64_t M, int weighted)
{
	const int64_t T = r->T;
	const int k = r->k;

#pragma omp parallel for schedule(dynamic, ROW_CHUNK) if (T * M * k >= CPU_PAR_MIN)
	for (int64_t t = 0; t < T; t++) {
		float acc[BF_BLOCK];
		for (int64_t m0 = 0; m0 < M; m0 += BF_BLOCK) {
			const int64_t n = M - m0 < BF_BLOCK ? M - m0 : BF_BLOCK;
			for (int64_t m = 0; m < n; m++)
				acc[m] = 0.0f;
			for (int j = 0; j < k; j++) {
				const int64_t i = (int64_t)j * T + t;
				if (r->loc[i] < 0)
					continue;
				const uint16_t *s =
					buf + ((int64_t)r->idx[i] * r->C + r->loc[i]) * M + m0;
				const float w = r->score[i];
				if (weighted)
					for (int64_t m = 0; m < n; m++)
						acc[m] = fmaf(w, backend_bf16_to_float(s[m]),
							      acc[m]);
				else
					for (int64_t m = 0; m < n; m++)
						acc[m] += backend_bf16_to_float(s[m]);
			}
			uint16_t *o = out + t * M + m0;
			for (int64_t m = 0; m < n; m++)
				o[m] = backend_bf16_from_float(acc[m]);
		}
	}
}

int cpu_moe_decode_bf16(struct backend *be, const struct backend_moe_route *r,
			const uint16_t *eo, uint16_t *y, int64_t M)
{
	cpu_enter(be);
	gather_bf16(r, eo, y, M, 1);
	return 0;
}

int cpu_moe_encode_backward_bf16(struct backend *be, const struct backend_moe_route *r,
				 const uint16_t *d_disp, uint16_t *dx, int64_t M)
{
	cpu_enter(be);
	gather_bf16(r, d_disp, dx, M, 0);
	return 0;
}

int cpu_moe_decode_backward_bf16(struct backend *be, const struct backend_moe_route *r,
				 const uint16_t *dy, const uint16_t *eo, uint16_t *d_eo,
				 float *dscore, int64_t M, int zero_pad)
{
	const int64_t T = r->T, C = r->C;
	const int k = r->k;

	cpu_enter(be);
#pragma omp parallel if ((T + (int64_t)r->E * C) * M >= CPU_PAR_MIN)
	{
		if (zero_pad) /* padding rows are not kept rows: as in cpu_moe_decode_backward */
			zero_padding_bf16(r, d_eo, M);
#pragma omp for schedule(dynamic, ROW_CHUNK) nowait
		for (int64_t t = 0; t < T; t++) {
			const uint16_t *g = dy + t * M;
			for (int j = 0; j < k; j++) {
				const int64_t i = (int64_t)j * T + t;
				const int32_t l = r->loc[i];
				if (l < 0) {
					dscore[i] = 0.0f;
					continue;
				}
				const int64_t s = (int64_t)r->idx[i] * C + l;
				const uint16_t *o = eo + s * M;
				float p[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
				for (int64_t m = 0; m < M; m++)
					p[m & 7] = fmaf(backend_bf16_to_float(g[m]),
							backend_bf16_to_float(o[m]), p[m & 7]);
				dscore[i] = ((p[0] + p[4]) + (p[2] + p[6])) +
					    ((p[1] + p[5]) + (p[3] + p[7]));
				/* the row of eo has been read: d_eo may overwrite it */
				uint16_t *d = d_eo + s * M;
				const float sc = r->score[i];
				for (int64_t m = 0; m < M; m++)
					d[m] = backend_bf16_from_float(sc *
								       backend_bf16_to_float(g[m]));
			}
		}
	}
	return 0;
}
