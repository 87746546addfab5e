/* moe_kernels.c - the MoE layer's routing and data-movement kernels: gating (softmax, top-k,
 * auxiliary losses and their backward), capacity, locations, and Tutel's encode/decode
 * kernels K0/K1/K2 (arXiv 2206.03382 sec. 3.4.7). Contract and math in moe.h.
 *
 * The kernels are organised around the slot -> token table slot_tok built by the scan, so
 * that encode and decode-backward walk the [E,C,M] buffer in order (sequential writes, every
 * slot written exactly once, padding zeroed in the same pass), while decode and
 * encode-backward walk the tokens in order and gather their k rows in one pass.
 */
#include "moe.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "rng.h"
#include "banned.h"

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
static float gate_noise_at(const struct moe_config *cfg, int64_t T, uint64_t step, int64_t t,
			   int e)
{
	uint64_t i = (step * (uint64_t)T + (uint64_t)t) * (uint64_t)cfg->E + (uint64_t)e;
	return cfg->gate_noise / (float)cfg->E * rng_normal(cfg->seed, RNG_STREAM_NOISE, i);
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
static float routed_logit(const struct moe_config *cfg, const float *logits, int64_t T,
			  uint64_t step, int64_t t, int e)
{
	float v = logits[t * cfg->E + e];
	if (cfg->gate_noise > 0.0f)
		v += gate_noise_at(cfg, T, step, t, e);
	return v;
}

int moe_gate_forward(const struct moe_config *cfg, const float *logits, int64_t T, int k,
		     uint64_t step, float *probs, float *clean, float *top,
		     struct moe_routing *r)
{
	const int E = cfg->E;
	const int li = cfg->loss == MOE_LOSS_LOAD_IMPORTANCE;

	if (k < 1 || k > E)
		return err_set(CORE_EUSAGE, NULL, "top-k %d is outside [1, %d]", k, E);
	if (li && (cfg->gate_noise <= 0.0f || E < 2))
		return err_set(CORE_EUSAGE, NULL,
			       "the load-importance loss needs gate noise > 0 and E >= 2");
	r->noise_step = step;
	/* Per token: noisy logits -> softmax -> top-k (ties: lower index) -> renormalise. */
#pragma omp parallel
	{
		float *buf = malloc(sizeof(float) * (size_t)E);
		unsigned char *taken = malloc((size_t)E);
#pragma omp for schedule(static)
		for (int64_t t = 0; t < T; t++) {
			if (!buf || !taken)
				continue;
			for (int e = 0; e < E; e++)
				buf[e] = routed_logit(cfg, logits, T, step, t, e);
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
				r->idx[(int64_t)j * T + t] = best;
				r->score[(int64_t)j * T + t] = p[best];
				sum += p[best];
			}
			if (k > 1) {
				float den = sum > FLT_EPSILON ? sum : FLT_EPSILON;
				for (int j = 0; j < k; j++)
					r->score[(int64_t)j * T + t] /= den;
			}
			top[t] = p[r->idx[t]];
		}
		free(buf);
		free(taken);
	}

	/* Auxiliary loss: reductions over T in double, serially (T*E adds; deterministic). */
	double *acc = calloc((size_t)E * 4, sizeof(double));
	if (!acc)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the gate loss accumulators");
	if (!li) {
		double *ce = acc, *me = acc + E;
		for (int64_t t = 0; t < T; t++) {
			ce[r->idx[t]] += 1.0;
			for (int e = 0; e < E; e++)
				me[e] += probs[t * E + e];
		}
		double l = 0.0;
		for (int e = 0; e < E; e++)
			l += (ce[e] / (double)T) * (me[e] / (double)T);
		r->aux_loss = (float)(l * E);
	} else {
		double *imp = acc, *load = acc + E;
		double sigma = cfg->gate_noise / (double)E;
		for (int64_t t = 0; t < T; t++) {
			int ek = r->idx[(int64_t)(k - 1) * T + t];
			double thr = routed_logit(cfg, logits, T, step, t, ek);
			for (int e = 0; e < E; e++) {
				imp[e] += clean[t * E + e];
				load[e] += phi_cdf((clean[t * E + e] - thr) / sigma);
			}
		}
		r->aux_loss = (float)(0.5 * (cv2_and_grad(imp, E, NULL) +
					     cv2_and_grad(load, E, NULL)));
	}
	free(acc);
	return 0;
}

void moe_gate_backward(const struct moe_config *cfg, const float *logits, const float *probs,
		       const float *clean, const struct moe_routing *r, const float *dscore,
		       float aux_weight, float *dlogits)
{
	const int E = cfg->E, k = r->k;
	const int64_t T = r->T;
	const int li = cfg->loss == MOE_LOSS_LOAD_IMPORTANCE;
	double *acc = calloc((size_t)E * 4, sizeof(double));
	double sigma = cfg->gate_noise / (double)E;
	uint64_t step = 0;

	if (!acc)
		return; /* cannot happen in practice; leave dlogits as it is */
	/* Per-expert factors of the auxiliary-loss gradient. */
	if (!li) {
		/* d l / d p[t,e] = E * ce_e / T, ce_e = mean_t mask1[t,e]. */
		for (int64_t t = 0; t < T; t++)
			acc[r->idx[t]] += 1.0;
		for (int e = 0; e < E; e++)
			acc[e] = aux_weight * (double)E * (acc[e] / (double)T) / (double)T;
	} else {
		double *imp = acc, *load = acc + E, *gimp = acc + 2 * E, *gload = acc + 3 * E;
		step = r->noise_step;
		for (int64_t t = 0; t < T; t++) {
			int ek = r->idx[(int64_t)(k - 1) * T + t];
			double thr = routed_logit(cfg, logits, T, step, t, ek);
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
#pragma omp parallel
	{
		float *dp = malloc(sizeof(float) * (size_t)E * 2);
#pragma omp for schedule(static)
		for (int64_t t = 0; t < T; t++) {
			if (!dp)
				continue;
			const float *p = probs + t * E;
			float *dq = dp + E;
			float *dl = dlogits + t * E;
			for (int e = 0; e < E; e++)
				dp[e] = li ? 0.0f : (float)acc[e];
			/* Through the renormalisation s_j = p_j / S, S = sum_r p_r (k > 1). */
			if (k == 1) {
				dp[r->idx[t]] += dscore[t];
			} else {
				float S = 0.0f, sp = 0.0f;
				for (int j = 0; j < k; j++)
					S += p[r->idx[(int64_t)j * T + t]];
				int clamped = !(S > FLT_EPSILON);
				S = clamped ? FLT_EPSILON : S;
				for (int j = 0; j < k; j++)
					sp += dscore[(int64_t)j * T + t] * p[r->idx[(int64_t)j * T + t]];
				for (int j = 0; j < k; j++) {
					int e = r->idx[(int64_t)j * T + t];
					dp[e] += dscore[(int64_t)j * T + t] / S -
						 (clamped ? 0.0f : sp / (S * S));
				}
			}
			/* Softmax backward: dlogit = p * (dp - <p, dp>). */
			float dot = 0.0f;
			for (int e = 0; e < E; e++)
				dot += p[e] * dp[e];
			for (int e = 0; e < E; e++)
				dl[e] = p[e] * (dp[e] - dot);
			if (li) {
				const double *gimp = acc + 2 * E, *gload = acc + 3 * E;
				const float *q = clean + t * E;
				int ek = r->idx[(int64_t)(k - 1) * T + t];
				double thr = routed_logit(cfg, logits, T, step, t, ek);
				double dthr = 0.0;
				for (int e = 0; e < E; e++) {
					double g = gload[e] * phi_pdf((q[e] - thr) / sigma);
					dq[e] = (float)(gimp[e] + g);
					dthr -= g;
				}
				float dotq = 0.0f;
				for (int e = 0; e < E; e++)
					dotq += q[e] * dq[e];
				for (int e = 0; e < E; e++)
					dl[e] += q[e] * (dq[e] - dotq);
				/* thr is the routed logit itself: its gradient goes straight in. */
				dl[ek] += (float)dthr;
			}
		}
		free(dp);
	}
	free(acc);
}

/* ---- capacity and locations ------------------------------------------------------------- */

void moe_route_count(struct moe_routing *r)
{
	memset(r->count, 0, sizeof(int64_t) * (size_t)r->E);
	for (int64_t i = 0; i < (int64_t)r->k * r->T; i++)
		r->count[r->idx[i]]++;
}

int64_t moe_capacity(const int64_t *count, int E, int64_t T, int k, double setting, int align)
{
	int64_t need = 0, C;

	for (int e = 0; e < E; e++)
		need = count[e] > need ? count[e] : need;
	if (setting == 0.0) {
		C = need;
	} else {
		double x = fabs(setting);
		/* Forgive a relative 1e-9 of rounding error: 1.1 * 1000 is 1100.0000000000002
		 * in binary, and C should be 1100. */
		double v = (double)k * (double)T * x / (double)E;
		C = (int64_t)ceil(v - 1e-9 * v);
		if (setting < 0.0 && need < C)
			C = need;
	}
	if (C < 1)
		C = 1;
	if (align > 1)
		C = (C + align - 1) / align * align;
	return C;
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

int moe_route_locations(struct moe_routing *r, const float *top, int bpr)
{
	const int64_t T = r->T, C = r->C;
	const int E = r->E, k = r->k;
	int32_t *order = NULL;
	int64_t *fill = calloc((size_t)E, sizeof(int64_t));

	if (!fill)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the expert counters");
	if (bpr) {
		order = malloc(sizeof(int32_t) * (size_t)T);
		if (!order) {
			free(fill);
			return err_set(CORE_ENOMEM, NULL, "cannot allocate the routing order");
		}
		int rc = bpr_order(top, T, order);
		if (rc < 0) {
			free(fill);
			free(order);
			return rc;
		}
	}
	/* The exclusive scan: one counter per expert, ranks outer so that every first choice
	 * is placed before any second choice. */
	int64_t dropped = 0;
	for (int j = 0; j < k; j++) {
		const int32_t *idx = r->idx + (int64_t)j * T;
		int32_t *loc = r->loc + (int64_t)j * T;
		for (int64_t i = 0; i < T; i++) {
			int64_t t = order ? order[i] : i;
			int e = idx[t];
			int64_t l = fill[e]++;
			if (l < C) {
				loc[t] = (int32_t)l;
				r->slot_tok[(int64_t)e * C + l] = t * k + j;
			} else {
				loc[t] = -1;
				dropped++;
			}
		}
	}
	for (int e = 0; e < E; e++) {
		r->used[e] = fill[e] < C ? fill[e] : C;
		for (int64_t c = r->used[e]; c < C; c++)
			r->slot_tok[(int64_t)e * C + c] = -1;
	}
	r->dropped = dropped;
	free(fill);
	free(order);
	return 0;
}

/* ---- encode / decode -------------------------------------------------------------------- */

void moe_encode(const struct moe_routing *r, const float *x, float *disp, int64_t M)
{
	const int64_t n = (int64_t)r->E * r->C;
	const int k = r->k;

#pragma omp parallel for schedule(static)
	for (int64_t s = 0; s < n; s++) {
		int64_t st = r->slot_tok[s];
		if (st < 0)
			memset(disp + s * M, 0, sizeof(float) * (size_t)M);
		else
			memcpy(disp + s * M, x + (st / k) * M, sizeof(float) * (size_t)M);
	}
}

void moe_decode(const struct moe_routing *r, const float *eo, float *y, int64_t M)
{
	const int64_t T = r->T, C = r->C;
	const int k = r->k;

#pragma omp parallel for schedule(static)
	for (int64_t t = 0; t < T; t++) {
		float *yt = y + t * M;
		int first = 1;
		for (int j = 0; j < k; j++) {
			int32_t l = r->loc[(int64_t)j * T + t];
			if (l < 0)
				continue;
			const float *src = eo + ((int64_t)r->idx[(int64_t)j * T + t] * C + l) * M;
			const float s = r->score[(int64_t)j * T + t];
			if (first) {
#pragma omp simd
				for (int64_t m = 0; m < M; m++)
					yt[m] = s * src[m];
				first = 0;
			} else {
#pragma omp simd
				for (int64_t m = 0; m < M; m++)
					yt[m] += s * src[m];
			}
		}
		if (first)
			memset(yt, 0, sizeof(float) * (size_t)M);
	}
}

void moe_decode_backward(const struct moe_routing *r, const float *dy, const float *eo,
			 float *d_eo, float *dscore, int64_t M)
{
	const int64_t n = (int64_t)r->E * r->C, T = r->T;
	const int k = r->k;

	/* Dropped choices get no slot below; their score gradient is zero. */
#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < (int64_t)k * T; i++)
		if (r->loc[i] < 0)
			dscore[i] = 0.0f;
	/* One pass over the slots: K2 reads the expert output row before K0 writes the
	 * gradient row, so d_eo may alias eo (the layer does that to save E*C*M floats). */
#pragma omp parallel for schedule(static)
	for (int64_t s = 0; s < n; s++) {
		int64_t st = r->slot_tok[s];
		float *out = d_eo + s * M;
		if (st < 0) {
			memset(out, 0, sizeof(float) * (size_t)M);
			continue;
		}
		int64_t t = st / k, j = st % k;
		const float *g = dy + t * M, *o = eo + s * M;
		const float sc = r->score[j * T + t];
		float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
		for (int64_t m = 0; m < M; m++)
			dot += g[m] * o[m];
		dscore[j * T + t] = dot;
#pragma omp simd
		for (int64_t m = 0; m < M; m++)
			out[m] = sc * g[m];
	}
}

void moe_encode_backward(const struct moe_routing *r, const float *d_disp, float *dx,
			 int64_t M)
{
	const int64_t T = r->T, C = r->C;
	const int k = r->k;

#pragma omp parallel for schedule(static)
	for (int64_t t = 0; t < T; t++) {
		float *o = dx + t * M;
		int first = 1;
		for (int j = 0; j < k; j++) {
			int32_t l = r->loc[(int64_t)j * T + t];
			if (l < 0)
				continue;
			const float *src =
				d_disp + ((int64_t)r->idx[(int64_t)j * T + t] * C + l) * M;
			if (first) {
				memcpy(o, src, sizeof(float) * (size_t)M);
				first = 0;
			} else {
#pragma omp simd
				for (int64_t m = 0; m < M; m++)
					o[m] += src[m];
			}
		}
		if (first)
			memset(o, 0, sizeof(float) * (size_t)M);
	}
}
