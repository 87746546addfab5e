/* moe_dense.c - the dense GShard formulation of the MoE layer (Lepikhin et al. 2020; Tutel
 * paper Fig. 20a): one-hot masks, locations by cumulative sums over tokens, combine weights
 * [T,E,C], dispatch = einsum("TEC,TM->ECM"), y = einsum("TEC,ECM->TM"), experts over all C
 * slots, and a hand-written backward. It is the baseline moe-bench runs next to the sparse
 * layer and the oracle the tests compare the sparse layer with, so it shares only the gating
 * op and the backend's GEMM and activation ops (each tested against the reference backend)
 * with moe.c: capacity, BPR order, locations, dispatch, combine and the score gradients are
 * written again here, the plain way, on the host. The einsums are GEMMs over the [T, E*C]
 * view of the combine tensor, as in GShard.
 */
#include "moe/moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/progress.h"
#include "common/banned.h"

/* The buffers of one step. The masks and locations live on the host; the rest in backend
 * memory, the host reading or writing some of them through host_of(). */
enum {
	D_MASK, D_LOCS,                         /* host: [k,T,E] floats, int64 */
	D_LOGITS, D_PROBS, D_CLEAN, D_DLOGITS,  /* [T,E] floats */
	D_TOP, D_IDX, D_SCORE, D_DSCORE, D_AUX, /* [T] / [k*T] / 1 */
	D_COMBINE, D_DMASK, D_DCOMBINE,         /* [T,E,C] floats */
	D_DISP, D_EO, D_H, D_HPRE,              /* [E,C,M], [E,C,M], [E,C,H] x2 */
	D_DEO, D_DH, D_DDISP,                   /* backward */
	D_COUNT
};
#define D_FIRST_DEV D_LOGITS

/* Sizes of every buffer; those after D_COMBINE depend on C. */
static void dense_sizes(const struct moe_config *cfg, int64_t T, int k, int64_t C,
			int backward, size_t sz[D_COUNT])
{
	const size_t t = (size_t)T, e = (size_t)cfg->E, c = (size_t)C, m = (size_t)cfg->M;
	const size_t h = (size_t)cfg->H, kk = (size_t)k, f = sizeof(float);

	memset(sz, 0, sizeof(size_t) * D_COUNT);
	sz[D_IDX] = kk * t * sizeof(int32_t);
	sz[D_SCORE] = kk * t * f;
	sz[D_TOP] = t * f;
	sz[D_MASK] = kk * t * e * f;
	sz[D_LOCS] = kk * t * e * sizeof(int64_t);
	sz[D_AUX] = f;
	sz[D_LOGITS] = sz[D_PROBS] = t * e * f;
	sz[D_CLEAN] = cfg->loss == MOE_LOSS_LOAD_IMPORTANCE ? t * e * f : 0;
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

/* Host copies of backend buffers (only on a backend whose memory is not host memory) are
 * not counted. */
size_t moe_dense_bytes(const struct moe_config *cfg, int64_t T, int k, int64_t C,
		       int backward)
{
	size_t sz[D_COUNT], total = 0;

	dense_sizes(cfg, T, k, C, backward, sz);
	for (int i = 0; i < D_COUNT; i++)
		total += sz[i];
	return total;
}

/* The buffers, host and backend, of one call. */
struct dense {
	const struct moe_config *cfg;
	struct backend *be;
	int64_t T, C;
	int k;
	size_t sz[D_COUNT];
	void *b[D_COUNT];
	/* Host views of backend buffers the host writes or reads: the buffer itself when the
	 * backend's memory is host memory, else a host copy uploaded or downloaded. */
	void *host[D_COUNT];
};

static int dense_alloc(struct dense *d, int from, int to)
{
	struct backend *be = d->be;
	for (int i = from; i < to; i++) {
		if (!d->sz[i])
			continue;
		if (i < D_FIRST_DEV) {
			d->b[i] = calloc(1, d->sz[i]);
			if (!d->b[i])
				return err_set(CORE_ENOMEM, NULL, "cannot allocate %zu bytes for the "
					       "dense formulation", d->sz[i]);
		} else {
			ERR_FORWARD(backend_alloc_zero(be, &d->b[i], d->sz[i]));
		}
	}
	return 0;
}

static void dense_free(struct dense *d)
{
	for (int i = 0; i < D_COUNT; i++) {
		if (i < D_FIRST_DEV)
			free(d->b[i]);
		else if (d->b[i])
			d->be->op->free(d->be, d->b[i]);
		if (!d->be->host_visible)
			free(d->host[i]);
	}
}

/* A host pointer for backend buffer i (see struct dense). */
static void *host_of(struct dense *d, int i)
{
	if (d->be->host_visible)
		return d->b[i];
	if (!d->host[i])
		d->host[i] = calloc(1, d->sz[i] ? d->sz[i] : 1);
	if (!d->host[i])
		err_set(CORE_ENOMEM, NULL, "cannot allocate %zu bytes for the dense formulation",
			d->sz[i]);
	return d->host[i];
}

/* Backend buffer i's content on the host (host_of, downloaded when it is a copy); NULL
 * with the detail set on failure. */
static void *fetch(struct dense *d, int i)
{
	void *h = host_of(d, i);
	if (h && !d->be->host_visible && d->be->op->download(d->be, h, d->b[i], d->sz[i]) < 0)
		return NULL;
	return h;
}

/* The host's writes to buffer i (through host_of) into backend memory. */
static int push(struct dense *d, int i)
{
	return d->be->host_visible ? 0 : d->be->op->upload(d->be, d->b[i], d->host[i], d->sz[i]);
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

/* Gating through the backend (the one piece shared with the sparse layer). */
static int dense_gate(struct dense *d, const struct moe_params *p, const float *x,
		      uint64_t step, float *aux)
{
	const struct moe_config *cfg = d->cfg;
	struct backend *be = d->be;
	const int64_t T = d->T;
	const struct backend_moe_gate g = {
		.T = T, .E = cfg->E, .k = d->k, .noise = cfg->gate_noise, .seed = cfg->seed,
		.step = step, .load_importance = cfg->loss == MOE_LOSS_LOAD_IMPORTANCE,
	};
	ERR_FORWARD(be->op->matmul_forward(be, d->b[D_LOGITS], x, p->wg, NULL, (int)T,
					   (int)cfg->M, cfg->E, BACKEND_W_IO));
	ERR_FORWARD(be->op->moe_gate_forward(be, &g, d->b[D_LOGITS], d->b[D_PROBS],
					     d->b[D_CLEAN], d->b[D_TOP], d->b[D_IDX],
					     d->b[D_SCORE], d->b[D_AUX]));
	return be->op->download(be, aux, d->b[D_AUX], sizeof(float));
}

/* One-hot masks per rank, in token order; then locations by cumulative sums over the tokens
 * in (BPR) order, offset by the totals of the earlier ranks; the capacity (into d->C); the
 * drops. */
static int dense_locations(struct dense *d, double setting, int64_t *dropped)
{
	const struct moe_config *cfg = d->cfg;
	const int64_t T = d->T;
	const int E = cfg->E, k = d->k;
	const int32_t *idx = fetch(d, D_IDX);
	const float *top = fetch(d, D_TOP);
	float *mask = d->b[D_MASK];
	int64_t *locs = d->b[D_LOCS];

	if (!idx || !top)
		return CORE_ENOMEM;

	for (int j = 0; j < k; j++)
		for (int64_t t = 0; t < T; t++)
			mask[((int64_t)j * T + t) * E + idx[(int64_t)j * T + t]] = 1.0f;
	struct keyed *ord = malloc(sizeof *ord * (size_t)T);
	if (!ord)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the token order");
	for (int64_t t = 0; t < T; t++)
		ord[t] = (struct keyed){cfg->bpr ? top[t] : 0.0f, t};
	qsort(ord, (size_t)T, sizeof *ord, by_key_desc);
	int64_t need = 0;
	for (int e = 0; e < E; e++) {
		int64_t base = 0;
		for (int j = 0; j < k; j++) {
			int64_t cum = 0;
			for (int64_t i = 0; i < T; i++) {
				int64_t at = ((int64_t)j * T + ord[i].t) * E + e;
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
	if (setting == 0.0) {
		C = need;
	} else {
		C = k * (int64_t)trunc(fabs(setting) * (double)samples_per_expert);
		if (setting < 0.0 && need < C)
			C = need;
	}
	if (C % cfg->capacity_align)
		C += cfg->capacity_align - C % cfg->capacity_align;
	if (C < 1)
		return err_set(CORE_EUSAGE, NULL, "capacity setting %g leaves no slot per expert",
			       setting);
	*dropped = 0;
	for (int64_t i = 0; i < (int64_t)k * T * E; i++)
		if (mask[i] != 0.0f && locs[i] >= C) {
			mask[i] = 0.0f;
			(*dropped)++;
		}
	d->C = C;
	return 0;
}

/* combine[t,e,c] = sum_r score_r[t] mask_r[t,e] onehot(loc_r[t,e])[c]; the dispatch mask is
 * the same without the scores. Built on the host, then moved to the backend. */
static int dense_combine(struct dense *d)
{
	const int64_t T = d->T, C = d->C, EC = (int64_t)d->cfg->E * C;
	const int E = d->cfg->E;
	const float *mask = d->b[D_MASK], *score = fetch(d, D_SCORE);
	const int64_t *locs = d->b[D_LOCS];
	float *combine = host_of(d, D_COMBINE), *dmask = host_of(d, D_DMASK);

	if (!score || !combine || !dmask)
		return CORE_ENOMEM;
	for (int j = 0; j < d->k; j++)
		for (int64_t t = 0; t < T; t++)
			for (int e = 0; e < E; e++) {
				int64_t at = ((int64_t)j * T + t) * E + e;
				if (mask[at] == 0.0f)
					continue;
				combine[t * EC + e * C + locs[at]] += score[(int64_t)j * T + t];
				dmask[t * EC + e * C + locs[at]] = 1.0f;
			}
	ERR_FORWARD(push(d, D_COMBINE));
	return push(d, D_DMASK);
}

/* dispatch, the experts over all C slots, combine. */
static int dense_forward(struct dense *d, const struct moe_params *p, const float *x, float *y,
			 struct moe_times *tm)
{
	const struct moe_config *cfg = d->cfg;
	struct backend *be = d->be;
	const int64_t T = d->T, C = d->C, M = cfg->M, H = cfg->H, EC = (int64_t)cfg->E * C;
	float *dmask = d->b[D_DMASK], *disp = d->b[D_DISP], *eo = d->b[D_EO], *h = d->b[D_H];
	float *hpre = cfg->act == MOE_ACT_GELU ? d->b[D_HPRE] : h;
	double t0 = now_seconds(), t1;

	/* dispatch = einsum("TEC,TM->ECM", dmask, x): per expert, [C,T] x [T,M]. */
	for (int e = 0; e < cfg->E; e++)
		ERR_FORWARD(be->op->gemm(be, 1, 0, (int)C, (int)M, (int)T, 1.0f, dmask + e * C,
					 (int)EC, x, (int)M, 0.0f, disp + e * C * M, (int)M));
	be->op->sync(be);
	t1 = now_seconds();
	tm->encode = t1 - t0;
	t0 = t1;
	for (int e = 0; e < cfg->E; e++) {
		float *he = h + e * C * H, *pe = hpre + e * C * H;
		ERR_FORWARD(be->op->matmul_forward(be, pe, disp + e * C * M, p->w1 + e * M * H,
						   NULL, (int)C, (int)M, (int)H, BACKEND_W_IO));
		ERR_FORWARD(be->op->bias_act_forward(be, pe, he, p->b1 + e * H, (int)C, (int)H,
						     cfg->act == MOE_ACT_GELU ? BACKEND_ACT_GELU
									      : BACKEND_ACT_RELU));
		ERR_FORWARD(be->op->matmul_forward(be, eo + e * C * M, he, p->w2 + e * H * M,
						   p->b2 + e * M, (int)C, (int)H, (int)M,
						   BACKEND_W_IO));
	}
	be->op->sync(be);
	t1 = now_seconds();
	tm->experts = t1 - t0;
	t0 = t1;
	/* y = einsum("TEC,ECM->TM", combine, eo): [T, E*C] x [E*C, M]. */
	ERR_FORWARD(be->op->gemm(be, 0, 0, (int)T, (int)M, (int)EC, 1.0f, d->b[D_COMBINE],
				 (int)EC, eo, (int)M, 0.0f, y, (int)M));
	be->op->sync(be);
	tm->decode = now_seconds() - t0;
	return 0;
}

/* The combine einsum's backward: d_eo = combine^T dy, dcombine = dy eo^T, and each score's
 * gradient collects dcombine where combine was built from that score (on the host). */
static int dense_backward_combine(struct dense *d, const float *dy)
{
	const struct moe_config *cfg = d->cfg;
	struct backend *be = d->be;
	const int64_t T = d->T, C = d->C, M = cfg->M, EC = (int64_t)cfg->E * C;
	const int E = cfg->E;
	const float *mask = d->b[D_MASK];
	const int64_t *locs = d->b[D_LOCS];

	ERR_FORWARD(be->op->gemm(be, 1, 0, (int)EC, (int)M, (int)T, 1.0f, d->b[D_COMBINE],
				 (int)EC, dy, (int)M, 0.0f, d->b[D_DEO], (int)M));
	ERR_FORWARD(be->op->gemm(be, 0, 1, (int)T, (int)EC, (int)M, 1.0f, dy, (int)M,
				 d->b[D_EO], (int)M, 0.0f, d->b[D_DCOMBINE], (int)EC));
	const float *dcomb = fetch(d, D_DCOMBINE);
	float *dscore = host_of(d, D_DSCORE);
	if (!dcomb || !dscore)
		return CORE_ENOMEM;
	for (int j = 0; j < d->k; j++)
		for (int64_t t = 0; t < T; t++) {
			double s = 0.0;
			for (int e = 0; e < E; e++) {
				int64_t at = ((int64_t)j * T + t) * E + e;
				if (mask[at] != 0.0f)
					s += dcomb[t * EC + e * C + locs[at]];
			}
			dscore[(int64_t)j * T + t] = (float)s;
		}
	return push(d, D_DSCORE);
}

/* Expert backward over all C slots, then dx = dmask [T, E*C] x d_disp [E*C, M]. */
static int dense_backward_experts(struct dense *d, const struct moe_params *p,
				  struct moe_params *g, float *dx)
{
	const struct moe_config *cfg = d->cfg;
	struct backend *be = d->be;
	const int64_t T = d->T, C = d->C, M = cfg->M, H = cfg->H, EC = (int64_t)cfg->E * C;
	float *d_eo = d->b[D_DEO], *h = d->b[D_H], *dh = d->b[D_DH], *d_disp = d->b[D_DDISP];
	const float *pre = cfg->act == MOE_ACT_GELU ? d->b[D_HPRE] : h;

	for (int e = 0; e < cfg->E; e++) {
		float *dhe = dh + e * C * H;
		ERR_FORWARD(be->op->matmul_backward(be, dhe, g->w2 + e * H * M, g->b2 + e * M,
						    d_eo + e * C * M, h + e * C * H,
						    p->w2 + e * H * M, (int)C, (int)H, (int)M,
						    BACKEND_W_IO, 0));
		ERR_FORWARD(be->op->act_backward(be, dhe, g->b1 + e * H, pre + e * C * H, (int)C,
						 (int)H, cfg->act == MOE_ACT_GELU
								 ? BACKEND_ACT_GELU
								 : BACKEND_ACT_RELU));
		ERR_FORWARD(be->op->matmul_backward(be, d_disp + e * C * M, g->w1 + e * M * H, NULL,
						    dhe, (float *)d->b[D_DISP] + e * C * M,
						    p->w1 + e * M * H, (int)C, (int)M, (int)H,
						    BACKEND_W_IO, 0));
	}
	return be->op->gemm(be, 0, 0, (int)T, (int)M, (int)EC, 1.0f, d->b[D_DMASK], (int)EC,
			    d_disp, (int)M, 0.0f, dx, (int)M);
}

int moe_dense_step(const struct moe_config *cfg, const struct moe_params *p, const float *x,
		   float *y, int64_t T, int k, double capacity_setting, uint64_t step,
		   const float *dy, float *dx, struct moe_params *g, float aux_weight,
		   struct moe_dense_result *res)
{
	struct backend *be = p->be;
	const int bwd = g != NULL;
	struct dense d = {.cfg = cfg, .be = be, .T = T};
	struct moe_times tm = {0};
	int64_t dropped = 0;
	float aux = 0.0f;
	int rc;

	ERR_FORWARD(moe_config_check(cfg));
	if (k == 0)
		k = cfg->k;
	if (k < 1 || k > cfg->E)
		return err_set(CORE_EUSAGE, NULL, "top-k %d is outside [1, E = %d]", k, cfg->E);
	if (T < 1)
		return err_set(CORE_EUSAGE, NULL, "token count %lld is below 1", (long long)T);
	d.k = k;
	double t0 = now_seconds(), t1;
	dense_sizes(cfg, T, k, 1, bwd, d.sz);
	rc = dense_alloc(&d, 0, D_COMBINE);
	if (!rc)
		rc = dense_gate(&d, p, x, step, &aux);
	if (rc)
		goto out;
	t1 = now_seconds();
	tm.gate = t1 - t0;
	t0 = t1;

	rc = dense_locations(&d, capacity_setting, &dropped);
	if (!rc) {
		dense_sizes(cfg, T, k, d.C, bwd, d.sz);
		rc = dense_alloc(&d, D_COMBINE, D_COUNT);
	}
	if (!rc)
		rc = dense_combine(&d);
	if (rc)
		goto out;
	t1 = now_seconds();
	tm.scan = t1 - t0;
	t0 = t1;

	rc = dense_forward(&d, p, x, y, &tm);
	if (rc || !bwd)
		goto out;
	t0 = now_seconds();
	rc = dense_backward_combine(&d, dy);
	if (rc)
		goto out;
	t1 = now_seconds();
	tm.bwd_decode = t1 - t0;
	t0 = t1;
	rc = dense_backward_experts(&d, p, g, dx);
	if (rc)
		goto out;
	be->op->sync(be);
	t1 = now_seconds();
	tm.bwd_experts = t1 - t0; /* dx's dispatch GEMM included: one einsum with the experts' */
	t0 = t1;

	const struct backend_moe_gate gate = {
		.T = T, .E = cfg->E, .k = k, .noise = cfg->gate_noise, .seed = cfg->seed,
		.step = step, .load_importance = cfg->loss == MOE_LOSS_LOAD_IMPORTANCE,
	};
	rc = be->op->moe_gate_backward(be, &gate, d.b[D_LOGITS], d.b[D_PROBS], d.b[D_CLEAN],
				       d.b[D_IDX], d.b[D_DSCORE], aux_weight, d.b[D_DLOGITS]);
	if (!rc)
		rc = be->op->gemm(be, 1, 0, (int)cfg->M, cfg->E, (int)T, 1.0f, x, (int)cfg->M,
				  d.b[D_DLOGITS], cfg->E, 0.0f, g->wg, cfg->E);
	if (!rc)
		rc = be->op->gemm(be, 0, 1, (int)T, (int)cfg->M, cfg->E, 1.0f, d.b[D_DLOGITS],
				  cfg->E, p->wg, cfg->E, 1.0f, dx, (int)cfg->M);
	be->op->sync(be);
	tm.bwd_gate = now_seconds() - t0;
out:
	if (res) {
		memset(res, 0, sizeof *res);
		res->dropped = dropped;
		res->C = d.C;
		res->aux_loss = aux;
		res->times = tm;
		if (rc == 0)
			for (int i = 0; i < D_COUNT; i++)
				res->peak_bytes += d.b[i] ? d.sz[i] : 0;
	}
	dense_free(&d);
	return rc;
}
