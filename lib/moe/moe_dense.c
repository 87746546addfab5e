/* moe_dense.c - the dense GShard formulation of the MoE layer (Lepikhin et al. 2020; Tutel
 * paper Fig. 20a): one-hot masks, locations by cumulative sums over tokens, combine weights
 * [T,E,C], dispatch = einsum("TEC,TM->ECM"), y = einsum("TEC,ECM->TM"), experts over all C
 * slots, and a hand-written backward. It is the baseline moe-bench runs next to the sparse
 * layer and the oracle the tests compare the sparse layer with, so it shares only the gating
 * (softmax/top-k, checked separately against finite differences) with moe.c: capacity, BPR
 * order, locations, dispatch, combine and the expert FFN are written again here, the plain
 * way. The einsums are GEMMs over the [T, E*C] view of the combine tensor, as in GShard.
 */
#include "moe/moe.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/banned.h"

enum {
	D_LOGITS, D_PROBS, D_CLEAN, D_DLOGITS, /* [T,E] floats */
	D_TOP, D_IDX, D_SCORE, D_DSCORE,       /* [T] / [k*T] */
	D_MASK, D_LOCS,                         /* [k,T,E] floats, int64 */
	D_COMBINE, D_DMASK, D_DCOMBINE,         /* [T,E,C] floats */
	D_DISP, D_EO, D_H, D_HPRE,              /* [E,C,M], [E,C,M], [E,C,H] x2 */
	D_DEO, D_DH, D_DDISP,                   /* backward */
	D_COUNT
};

static void dense_sizes(const struct moe_config *cfg, int64_t T, int k, int64_t C,
			int backward, size_t sz[D_COUNT])
{
	const size_t t = (size_t)T, e = (size_t)cfg->E, c = (size_t)C, m = (size_t)cfg->M;
	const size_t h = (size_t)cfg->H, kk = (size_t)k, f = sizeof(float);

	memset(sz, 0, sizeof(size_t) * D_COUNT);
	sz[D_LOGITS] = sz[D_PROBS] = t * e * f;
	sz[D_CLEAN] = cfg->loss == MOE_LOSS_LOAD_IMPORTANCE ? t * e * f : 0;
	sz[D_TOP] = t * f;
	sz[D_IDX] = kk * t * sizeof(int32_t);
	sz[D_SCORE] = kk * t * f;
	sz[D_MASK] = kk * t * e * f;
	sz[D_LOCS] = kk * t * e * sizeof(int64_t);
	sz[D_COMBINE] = sz[D_DMASK] = t * e * c * f;
	sz[D_DISP] = sz[D_EO] = e * c * m * f;
	sz[D_H] = e * c * h * f;
	sz[D_HPRE] = cfg->act == MOE_ACT_GELU ? e * c * h * f : 0;
	if (backward) {
		sz[D_DLOGITS] = t * e * f;
		sz[D_DSCORE] = kk * t * f;
		sz[D_DCOMBINE] = t * e * c * f;
		sz[D_DEO] = sz[D_DDISP] = e * c * m * f;
		sz[D_DH] = e * c * h * f;
	}
}

size_t moe_dense_bytes(const struct moe_config *cfg, int64_t T, int k, int64_t C,
		       int backward)
{
	size_t sz[D_COUNT], total = 0;

	dense_sizes(cfg, T, k, C, backward, sz);
	for (int i = 0; i < D_COUNT; i++)
		total += sz[i];
	return total;
}

struct keyed {
	float key;
	int64_t t;
};

static int by_key_desc(const void *a, const void *b)
{
	const struct keyed *x = a, *y = b;
	if (x->key != y->key)
		return x->key > y->key ? -1 : 1;
	return x->t < y->t ? -1 : (x->t > y->t);
}

static float act_f(enum moe_act a, float v)
{
	if (a == MOE_ACT_RELU)
		return v > 0.0f ? v : 0.0f;
	const float c = 0.7978845608028654f;
	return 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
}

static float act_df(enum moe_act a, float v)
{
	if (a == MOE_ACT_RELU)
		return v > 0.0f ? 1.0f : 0.0f;
	const float c = 0.7978845608028654f;
	float th = tanhf(c * (v + 0.044715f * v * v * v));
	return 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * c * (1.0f + 0.134145f * v * v);
}

int moe_dense_step(const struct moe_config *cfg, const struct moe_params *p, const float *x,
		   float *y, int64_t T, int k, double capacity_setting, uint64_t step,
		   const float *dy, float *dx, struct moe_params *g, float aux_weight,
		   int64_t *dropped, int64_t *capacity, float *aux_loss, struct moe_times *times,
		   size_t *peak_bytes)
{
	const int64_t M = cfg->M, H = cfg->H;
	const int E = cfg->E;
	const int bwd = g != NULL;
	void *b[D_COUNT] = { 0 };
	size_t sz[D_COUNT];
	struct moe_times tm = { 0 };
	int rc = 0;
	double t0 = omp_get_wtime(), t1;

	ERR_FORWARD(moe_config_check(cfg));
	if (k == 0)
		k = cfg->k;
	if (k < 1 || k > E)
		return err_set(CORE_EUSAGE, NULL, "top-k %d is outside [1, E = %d]", k, E);
	if (T < 1)
		return err_set(CORE_EUSAGE, NULL, "token count %lld is below 1", (long long)T);

	/* Gating (shared with the sparse layer). */
	dense_sizes(cfg, T, k, 1, bwd, sz);
	for (int i = D_LOGITS; i <= D_LOCS; i++) {
		if (!sz[i])
			continue;
		b[i] = calloc(1, sz[i]);
		if (!b[i]) {
			rc = err_set(CORE_ENOMEM, NULL, "cannot allocate %zu bytes", sz[i]);
			goto out;
		}
	}
	float *logits = b[D_LOGITS], *probs = b[D_PROBS], *clean = b[D_CLEAN];
	float *top = b[D_TOP], *mask = b[D_MASK];
	int64_t *locs = b[D_LOCS];
	struct moe_routing r = { .T = T, .E = E, .k = k, .idx = b[D_IDX], .score = b[D_SCORE] };
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, E, (int)M, 1.0f, x,
		    (int)M, p->wg, E, 0.0f, logits, E);
	rc = moe_gate_forward(cfg, logits, T, k, step, probs, clean, top, &r);
	if (rc < 0)
		goto out;
	t1 = omp_get_wtime();
	tm.gate = t1 - t0;
	t0 = t1;

	/* One-hot masks per rank, in token order; then locations by cumulative sums over the
	 * tokens in (BPR) order, offset by the totals of the earlier ranks. */
	for (int j = 0; j < k; j++)
		for (int64_t t = 0; t < T; t++)
			mask[((int64_t)j * T + t) * E + r.idx[(int64_t)j * T + t]] = 1.0f;
	struct keyed *ord = malloc(sizeof *ord * (size_t)T);
	if (!ord) {
		rc = err_set(CORE_ENOMEM, NULL, "cannot allocate the token order");
		goto out;
	}
	for (int64_t t = 0; t < T; t++) {
		ord[t].key = cfg->bpr ? top[t] : 0.0f;
		ord[t].t = t;
	}
	qsort(ord, (size_t)T, sizeof *ord, by_key_desc);
	int64_t need = 0;
	for (int e = 0; e < E; e++) {
		int64_t base = 0;
		for (int j = 0; j < k; j++) {
			int64_t cum = 0;
			for (int64_t i = 0; i < T; i++) {
				int64_t t = ord[i].t, at = ((int64_t)j * T + t) * E + e;
				cum += (int64_t)mask[at];
				locs[at] = base + cum - 1;
			}
			base += cum;
		}
		need = base > need ? base : need;
	}
	free(ord);
	/* Tutel: samples_per_expert = ceil(T/E); capacity = k * int(|x| * samples_per_expert),
	 * or max location + 1 for x = 0, capped by that for x < 0; then aligned up. */
	int64_t C, samples_per_expert = (T + E - 1) / E;
	if (capacity_setting == 0.0) {
		C = need;
	} else {
		C = k * (int64_t)trunc(fabs(capacity_setting) * (double)samples_per_expert);
		if (capacity_setting < 0.0 && need < C)
			C = need;
	}
	if (C % cfg->capacity_align)
		C += cfg->capacity_align - C % cfg->capacity_align;
	if (C < 1) {
		rc = err_set(CORE_EUSAGE, NULL, "capacity setting %g leaves no slot per expert",
			     capacity_setting);
		goto out;
	}
	int64_t ndrop = 0;
	for (int64_t i = 0; i < (int64_t)k * T * E; i++)
		if (mask[i] != 0.0f && locs[i] >= C) {
			mask[i] = 0.0f;
			ndrop++;
		}
	dense_sizes(cfg, T, k, C, bwd, sz);
	for (int i = D_COMBINE; i < D_COUNT; i++) {
		if (!sz[i])
			continue;
		b[i] = calloc(1, sz[i]);
		if (!b[i]) {
			rc = err_set(CORE_ENOMEM, NULL, "cannot allocate %zu bytes for the dense "
				     "formulation", sz[i]);
			goto out;
		}
	}
	/* combine[t,e,c] = sum_r score_r[t] mask_r[t,e] onehot(loc_r[t,e])[c]; the dispatch
	 * mask is the same without the scores. */
	float *combine = b[D_COMBINE], *dmask = b[D_DMASK];
	const int64_t EC = (int64_t)E * C;
	for (int j = 0; j < k; j++)
		for (int64_t t = 0; t < T; t++)
			for (int e = 0; e < E; e++) {
				int64_t at = ((int64_t)j * T + t) * E + e;
				if (mask[at] == 0.0f)
					continue;
				combine[t * EC + e * C + locs[at]] += r.score[(int64_t)j * T + t];
				dmask[t * EC + e * C + locs[at]] = 1.0f;
			}
	t1 = omp_get_wtime();
	tm.scan = t1 - t0;
	t0 = t1;

	/* dispatch = einsum("TEC,TM->ECM", dmask, x): per expert, [C,T] x [T,M]. */
	float *disp = b[D_DISP], *eo = b[D_EO], *h = b[D_H], *hpre = b[D_HPRE];
	if (!hpre)
		hpre = h; /* relu: the mask comes from h itself */
	for (int e = 0; e < E; e++)
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)C, (int)M, (int)T, 1.0f,
			    dmask + e * C, (int)EC, x, (int)M, 0.0f, disp + e * C * M, (int)M);
	t1 = omp_get_wtime();
	tm.encode = t1 - t0;
	t0 = t1;

	/* Experts over all C slots. */
	for (int e = 0; e < E; e++) {
		float *he = h + e * C * H, *pe = hpre + e * C * H;
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)C, (int)H, (int)M, 1.0f,
			    disp + e * C * M, (int)M, p->w1 + e * M * H, (int)H, 0.0f, pe, (int)H);
		for (int64_t i = 0; i < C; i++)
			for (int64_t j = 0; j < H; j++) {
				float v = pe[i * H + j] + p->b1[e * H + j];
				pe[i * H + j] = v;
				he[i * H + j] = act_f(cfg->act, v);
			}
		for (int64_t i = 0; i < C; i++)
			memcpy(eo + (e * C + i) * M, p->b2 + e * M, sizeof(float) * (size_t)M);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)C, (int)M, (int)H, 1.0f,
			    he, (int)H, p->w2 + e * H * M, (int)M, 1.0f, eo + e * C * M, (int)M);
	}
	t1 = omp_get_wtime();
	tm.experts = t1 - t0;
	t0 = t1;

	/* y = einsum("TEC,ECM->TM", combine, eo): [T, E*C] x [E*C, M]. */
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)M, (int)EC, 1.0f,
		    combine, (int)EC, eo, (int)M, 0.0f, y, (int)M);
	t1 = omp_get_wtime();
	tm.decode = t1 - t0;
	t0 = t1;
	if (dropped)
		*dropped = ndrop;
	if (capacity)
		*capacity = C;
	if (aux_loss)
		*aux_loss = r.aux_loss;
	if (!bwd)
		goto out;

	/* Backward of the combine einsum: d_eo = combine^T dy, dcombine = dy eo^T, and the
	 * score gradient collects dcombine where combine was built from that score. */
	float *d_eo = b[D_DEO], *dcomb = b[D_DCOMBINE], *dscore = b[D_DSCORE];
	cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)EC, (int)M, (int)T, 1.0f,
		    combine, (int)EC, dy, (int)M, 0.0f, d_eo, (int)M);
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)EC, (int)M, 1.0f, dy,
		    (int)M, eo, (int)M, 0.0f, dcomb, (int)EC);
	for (int j = 0; j < k; j++)
		for (int64_t t = 0; t < T; t++) {
			double s = 0.0;
			for (int e = 0; e < E; e++) {
				int64_t at = ((int64_t)j * T + t) * E + e;
				if (mask[at] != 0.0f)
					s += dcomb[t * EC + e * C + locs[at]];
			}
			dscore[(int64_t)j * T + t] = (float)s;
		}
	t1 = omp_get_wtime();
	tm.bwd_decode = t1 - t0;
	t0 = t1;

	/* Expert backward over all C slots. */
	float *dh = b[D_DH], *d_disp = b[D_DDISP];
	for (int e = 0; e < E; e++) {
		float *de = d_eo + e * C * M, *he = h + e * C * H, *pe = hpre + e * C * H;
		float *dhe = dh + e * C * H;
		for (int64_t j = 0; j < M; j++) {
			double s = 0.0;
			for (int64_t i = 0; i < C; i++)
				s += de[i * M + j];
			g->b2[e * M + j] = (float)s;
		}
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)H, (int)M, (int)C, 1.0f,
			    he, (int)H, de, (int)M, 0.0f, g->w2 + e * H * M, (int)M);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)C, (int)H, (int)M, 1.0f,
			    de, (int)M, p->w2 + e * H * M, (int)M, 0.0f, dhe, (int)H);
		for (int64_t i = 0; i < C * H; i++)
			dhe[i] *= act_df(cfg->act, pe[i]);
		for (int64_t j = 0; j < H; j++) {
			double s = 0.0;
			for (int64_t i = 0; i < C; i++)
				s += dhe[i * H + j];
			g->b1[e * H + j] = (float)s;
		}
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)M, (int)H, (int)C, 1.0f,
			    disp + e * C * M, (int)M, dhe, (int)H, 0.0f, g->w1 + e * M * H, (int)H);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)C, (int)M, (int)H, 1.0f,
			    dhe, (int)H, p->w1 + e * M * H, (int)H, 0.0f, d_disp + e * C * M,
			    (int)M);
	}
	t1 = omp_get_wtime();
	tm.bwd_experts = t1 - t0;
	t0 = t1;

	/* Backward of the dispatch einsum: dx = dmask [T, E*C] x d_disp [E*C, M]. */
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)M, (int)EC, 1.0f,
		    dmask, (int)EC, d_disp, (int)M, 0.0f, dx, (int)M);
	t1 = omp_get_wtime();
	tm.bwd_encode = t1 - t0;
	t0 = t1;

	float *dlogits = b[D_DLOGITS];
	rc = moe_gate_backward(cfg, logits, probs, clean, &r, dscore, aux_weight, dlogits);
	if (rc < 0)
		goto out;
	cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)M, E, (int)T, 1.0f, x, (int)M,
		    dlogits, E, 0.0f, g->wg, E);
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)M, E, 1.0f, dlogits,
		    E, p->wg, E, 1.0f, dx, (int)M);
	tm.bwd_gate = omp_get_wtime() - t0;
out:
	if (rc == 0 && peak_bytes) {
		size_t total = 0;
		for (int i = 0; i < D_COUNT; i++)
			total += b[i] ? sz[i] : 0;
		*peak_bytes = total;
	}
	if (times)
		*times = tm;
	for (int i = 0; i < D_COUNT; i++)
		free(b[i]);
	return rc;
}
