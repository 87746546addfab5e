/* moe.c - the sparse MoE layer: configuration, parameters, the per-expert FFN and the forward
 * and backward passes that chain gating, scan, encode, experts and decode (moe.h).
 *
 * Memory: the layer keeps only what backward needs and reuses buffers in place where the data
 * flow allows it: decode-backward writes d_eo over eo (K2 reads each row before K0
 * overwrites it), and each expert's d_disp overwrites its disp rows after dW1 has read them.
 * The experts run their GEMMs over the kept rows min(n_e, C) only, so the layer's encode and
 * decode-backward leave the padding rows as they are (moe_encode_kept and
 * moe_decode_backward_kept): nothing reads them.
 */
#include "moe/moe.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/backend.h"
#include "common/err.h"
#include "common/rng.h"
#include "common/banned.h"

/* Up to this many experts the gate products run in moe.c's own loops (see gate_logits). */
#define GATE_E_MAX 64
/* Below this many elements a loop runs on one thread: a parallel region costs more. */
#define PAR_MIN 32768

void moe_config_default(struct moe_config *cfg, int64_t T, int64_t M, int64_t H, int E)
{
	memset(cfg, 0, sizeof *cfg);
	cfg->T = T;
	cfg->M = M;
	cfg->H = H;
	cfg->E = E;
	cfg->k = E < 2 ? 1 : 2;
	cfg->capacity_setting = 1.0;
	cfg->capacity_align = 1;
	cfg->act = MOE_ACT_RELU;
	cfg->loss = MOE_LOSS_GSHARD;
	cfg->seed = 1;
}

int moe_config_check(const struct moe_config *cfg)
{
	if (cfg->E < 1)
		return err_set(CORE_EUSAGE, NULL, "number of experts %d is below 1", cfg->E);
	if (cfg->k < 1 || cfg->k > cfg->E)
		return err_set(CORE_EUSAGE, NULL, "top-k %d is outside [1, E = %d]", cfg->k,
			       cfg->E);
	if (cfg->T < 1 || cfg->M < 1 || cfg->H < 1)
		return err_set(CORE_EUSAGE, NULL, "sizes T=%lld M=%lld H=%lld must be >= 1",
			       (long long)cfg->T, (long long)cfg->M, (long long)cfg->H);
	if ((int64_t)cfg->k * cfg->T > INT32_MAX || cfg->T * (int64_t)cfg->E > INT32_MAX)
		return err_set(CORE_EUSAGE, NULL, "T=%lld is too large for 32-bit slot indices",
			       (long long)cfg->T);
	if (!isfinite(cfg->capacity_setting))
		return err_set(CORE_EUSAGE, NULL, "capacity setting is not finite");
	if (cfg->capacity_align < 1)
		return err_set(CORE_EUSAGE, NULL, "capacity alignment %d is below 1",
			       cfg->capacity_align);
	if (!(cfg->gate_noise >= 0.0f) || !isfinite(cfg->gate_noise))
		return err_set(CORE_EUSAGE, NULL, "gate noise must be finite and >= 0");
	if (cfg->act != MOE_ACT_RELU && cfg->act != MOE_ACT_GELU)
		return err_set(CORE_EUSAGE, NULL, "unknown activation %d", (int)cfg->act);
	if (cfg->loss == MOE_LOSS_LOAD_IMPORTANCE && (cfg->gate_noise <= 0.0f || cfg->E < 2))
		return err_set(CORE_EUSAGE, NULL,
			       "the load-importance loss needs gate noise > 0 and E >= 2");
	if (cfg->loss != MOE_LOSS_GSHARD && cfg->loss != MOE_LOSS_LOAD_IMPORTANCE)
		return err_set(CORE_EUSAGE, NULL, "unknown auxiliary loss %d", (int)cfg->loss);
	return 0;
}

/* Allocations of 4 MiB and more sit on 2 MiB boundaries with transparent huge pages
 * requested: the kernels jump between rows of [E,C,M], and 4 KiB pages would cost a TLB miss
 * per row. Smaller ones are 64-byte aligned. alloc_round gives the bytes really taken. */
#define HUGE_PAGE ((size_t)2 << 20)

static size_t alloc_round(size_t bytes)
{
	size_t align = bytes >= 2 * HUGE_PAGE ? HUGE_PAGE : 64;
	return (bytes + align - 1) / align * align;
}

static void *alloc_rounded(size_t bytes) /* bytes from alloc_round, > 0 */
{
	size_t align = bytes >= 2 * HUGE_PAGE ? HUGE_PAGE : 64;
	void *p = aligned_alloc(align, bytes);
	if (p && align == HUGE_PAGE)
		madvise(p, bytes, MADV_HUGEPAGE);
	return p;
}

void *moe_alloc(size_t bytes)
{
	bytes = bytes ? alloc_round(bytes) : 64;
	void *p = alloc_rounded(bytes);
	if (p)
		memset(p, 0, bytes);
	return p;
}

static float *falloc(size_t n)
{
	return moe_alloc(n * sizeof(float));
}

int moe_params_alloc(struct moe_params *p, const struct moe_config *cfg)
{
	const size_t M = (size_t)cfg->M, H = (size_t)cfg->H, E = (size_t)cfg->E;

	memset(p, 0, sizeof *p);
	p->wg = falloc(M * E);
	p->w1 = falloc(E * M * H);
	p->b1 = falloc(E * H);
	p->w2 = falloc(E * H * M);
	p->b2 = falloc(E * M);
	if (!p->wg || !p->w1 || !p->b1 || !p->w2 || !p->b2) {
		moe_params_free(p);
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the MoE parameters");
	}
	return 0;
}

void moe_params_free(struct moe_params *p)
{
	free(p->wg);
	free(p->w1);
	free(p->b1);
	free(p->w2);
	free(p->b2);
	memset(p, 0, sizeof *p);
}

void moe_params_init(struct moe_params *p, const struct moe_config *cfg, uint64_t seed)
{
	const int64_t M = cfg->M, H = cfg->H, E = cfg->E;

	rng_fill_normal(p->wg, M * E, 0.0f, 1.0f / sqrtf((float)M), seed, RNG_STREAM_INIT, 0);
	rng_fill_normal(p->w1, E * M * H, 0.0f, 1.0f / sqrtf((float)M), seed, RNG_STREAM_INIT,
			(uint64_t)(M * E));
	rng_fill_normal(p->w2, E * H * M, 0.0f, 1.0f / sqrtf((float)H), seed, RNG_STREAM_INIT,
			(uint64_t)(M * E + E * M * H));
	rng_fill_normal(p->b1, E * H, 0.0f, 0.1f, seed, RNG_STREAM_INIT,
			(uint64_t)(M * E + 2 * E * M * H));
	rng_fill_normal(p->b2, E * M, 0.0f, 0.1f, seed, RNG_STREAM_INIT,
			(uint64_t)(M * E + 2 * E * M * H + E * H));
}

size_t moe_layer_bytes_for(const struct moe_config *cfg, int64_t T, int k, int64_t C,
			   int backward)
{
	const size_t t = (size_t)T, e = (size_t)cfg->E, c = (size_t)C, m = (size_t)cfg->M;
	const size_t h = (size_t)cfg->H, kk = (size_t)k;
	size_t n[] = {
		t * e * 4, t * e * 4, cfg->loss == MOE_LOSS_LOAD_IMPORTANCE ? t * e * 4 : 0,
		t * 4, kk * t * 4, kk * t * 4, kk * t * 4, e * 8, e * 8,
		e * c * m * 4, e * c * m * 4, e * c * h * 4,
		cfg->act == MOE_ACT_GELU ? e * c * h * 4 : 0,
		backward ? kk * t * 4 : 0, backward ? t * e * 4 : 0, backward ? c * h * 4 : 0,
		cfg->E <= GATE_E_MAX ? m * e * 4 : 0,
	};
	size_t total = 0;
	for (size_t i = 0; i < sizeof n / sizeof n[0]; i++)
		total += alloc_round(n[i]);
	return total;
}

/* ---- the layer ------------------------------------------------------------------------- */

/* A buffer that grows on demand and is counted in the layer's bytes. */
struct buf {
	void *p;
	size_t bytes;
};

struct moe_layer {
	struct moe_config cfg;
	size_t bytes, peak;
	struct buf logits, probs, clean, top, idx, loc, score, dscore, count, used;
	struct buf disp, eo, hpre, h, dh, dlogits, wgt;
	struct moe_routing r;
	struct moe_times times;
	int have_forward;
};

static int grow(struct moe_layer *l, struct buf *b, size_t bytes)
{
	if (bytes <= b->bytes)
		return 0;
	bytes = alloc_round(bytes);
	free(b->p);
	l->bytes -= b->bytes;
	b->bytes = 0;
	b->p = alloc_rounded(bytes);
	if (!b->p)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate %zu bytes of MoE workspace",
			       bytes);
	b->bytes = bytes;
	l->bytes += bytes;
	if (l->bytes > l->peak)
		l->peak = l->bytes;
	return 0;
}

static void drop(struct moe_layer *l, struct buf *b)
{
	free(b->p);
	l->bytes -= b->bytes;
	b->p = NULL;
	b->bytes = 0;
}

int moe_layer_init(struct moe_layer **out, const struct moe_config *cfg)
{
	*out = NULL;
	ERR_FORWARD(moe_config_check(cfg));
	struct moe_layer *l = calloc(1, sizeof *l);
	if (!l)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the MoE layer");
	l->cfg = *cfg;
	*out = l;
	return 0;
}

void moe_layer_free(struct moe_layer *l)
{
	if (!l)
		return;
	struct buf *all[] = { &l->logits, &l->probs, &l->clean, &l->top, &l->idx, &l->loc,
			      &l->score, &l->dscore, &l->count, &l->used,
			      &l->disp, &l->eo, &l->hpre, &l->h, &l->dh, &l->dlogits,
			      &l->wgt };
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		drop(l, all[i]);
	free(l);
}

const struct moe_routing *moe_layer_routing(const struct moe_layer *l)
{
	return &l->r;
}

const struct moe_times *moe_layer_times(const struct moe_layer *l)
{
	return &l->times;
}

size_t moe_layer_bytes(const struct moe_layer *l)
{
	return l->bytes;
}

size_t moe_layer_peak_bytes(const struct moe_layer *l)
{
	return l->peak;
}

static float gelu(float x)
{
	const float c = 0.7978845608028654f; /* sqrt(2/pi) */
	return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

static float gelu_grad(float x)
{
	const float c = 0.7978845608028654f;
	float th = tanhf(c * (x + 0.044715f * x * x * x));
	return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * c * (1.0f + 0.134145f * x * x);
}

/* dh *= act'(pre) in place and db1 = column sums of the result, in one pass over dh
 * (parallel over column blocks). relu takes its mask from h (h > 0 iff pre > 0). */
static void act_backward_colsum(float *dh, const float *h, const float *pre, int64_t rows,
				int64_t H, float *db1)
{
#pragma omp parallel for schedule(static) if (rows * H >= PAR_MIN)
	for (int64_t j0 = 0; j0 < H; j0 += 256) {
		int64_t j1 = j0 + 256 < H ? j0 + 256 : H;
		for (int64_t j = j0; j < j1; j++)
			db1[j] = 0.0f;
		for (int64_t i = 0; i < rows; i++) {
			float *d = dh + i * H;
			if (pre) {
				const float *pr = pre + i * H;
				for (int64_t j = j0; j < j1; j++) {
					d[j] *= gelu_grad(pr[j]);
					db1[j] += d[j];
				}
			} else {
				const float *hr = h + i * H;
#pragma omp simd
				for (int64_t j = j0; j < j1; j++) {
					d[j] = hr[j] > 0.0f ? d[j] : 0.0f;
					db1[j] += d[j];
				}
			}
		}
	}
}

static double now(void)
{
	return omp_get_wtime();
}

/* The gate's products have N = E columns only (a few experts): BLAS handles such skinny
 * shapes poorly, and they are memory-bound anyway (x is read once). Up to GATE_E_MAX experts
 * they run here, token-parallel, against wg transposed to [E, M] so that every inner loop
 * runs along M. */
static void transpose_wg(const float *wg, int64_t M, int E, float *wgt)
{
	for (int64_t m = 0; m < M; m++)
		for (int e = 0; e < E; e++)
			wgt[(int64_t)e * M + m] = wg[m * E + e];
}

/* logits[t, e] = <x[t], wg[:, e]>. */
static void gate_logits(const float *x, const float *wgt, int64_t T, int64_t M, int E,
			float *logits)
{
#pragma omp parallel for schedule(static) if (T * M * E >= PAR_MIN)
	for (int64_t t = 0; t < T; t++) {
		const float *xt = x + t * M;
		for (int e = 0; e < E; e++) {
			const float *w = wgt + (int64_t)e * M;
			float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
			for (int64_t m = 0; m < M; m++)
				acc += xt[m] * w[m];
			logits[t * E + e] = acc;
		}
	}
}

/* One pass over the tokens: dx[t] += dlogits[t] wg^T (when dx is not NULL) and
 * dwg = x^T dlogits, reduced over T in per-thread double partials that are summed in
 * thread order (deterministic for a fixed thread count). */
static int gate_backward_products(const float *x, const float *dlogits, const float *wgt,
				  int64_t T, int64_t M, int E, float *dx, float *dwg)
{
	int nt = T * M * E >= PAR_MIN ? omp_get_max_threads() : 1;
	double *part = calloc((size_t)nt * (size_t)E * (size_t)M, sizeof(double));

	if (!part)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the gate gradient partials");
#pragma omp parallel num_threads(nt)
	{
		double *acc = part + (size_t)omp_get_thread_num() * (size_t)E * (size_t)M;
#pragma omp for schedule(static)
		for (int64_t t = 0; t < T; t++) {
			const float *xt = x + t * M, *dl = dlogits + t * E;
			for (int e = 0; e < E; e++) {
				const double g = dl[e];
				double *a = acc + (int64_t)e * M;
#pragma omp simd
				for (int64_t m = 0; m < M; m++)
					a[m] += g * xt[m];
			}
			if (dx) {
				float *d = dx + t * M;
				for (int e = 0; e < E; e++) {
					const float g = dl[e], *w = wgt + (int64_t)e * M;
#pragma omp simd
					for (int64_t m = 0; m < M; m++)
						d[m] += g * w[m];
				}
			}
		}
	}
	for (int64_t m = 0; m < M; m++)
		for (int e = 0; e < E; e++) {
			double v = 0.0;
			for (int i = 0; i < nt; i++)
				v += part[((size_t)i * (size_t)E + (size_t)e) * (size_t)M + (size_t)m];
			dwg[m * E + e] = (float)v;
		}
	free(part);
	return 0;
}

int moe_route(struct moe_layer *l, const float *wg, const float *x, int64_t T, int k,
	      double capacity_setting, uint64_t step)
{
	const struct moe_config *cfg = &l->cfg;
	const int64_t M = cfg->M, H = cfg->H;
	const int E = cfg->E;
	const int li = cfg->loss == MOE_LOSS_LOAD_IMPORTANCE;
	struct moe_routing *r = &l->r;
	double t0 = now(), t1;

	if (k == 0)
		k = cfg->k;
	if (k < 1 || k > E)
		return err_set(CORE_EUSAGE, NULL, "top-k %d is outside [1, E = %d]", k, E);
	if (T < 1 || T > cfg->T)
		return err_set(CORE_EUSAGE, NULL, "token count %lld is outside [1, %lld]",
			       (long long)T, (long long)cfg->T);
	if (!isfinite(capacity_setting))
		return err_set(CORE_EUSAGE, NULL, "capacity setting is not finite");
	l->have_forward = 0;
	memset(&l->times, 0, sizeof l->times);
	ERR_FORWARD(grow(l, &l->logits, sizeof(float) * (size_t)(T * E)));
	ERR_FORWARD(grow(l, &l->probs, sizeof(float) * (size_t)(T * E)));
	if (li)
		ERR_FORWARD(grow(l, &l->clean, sizeof(float) * (size_t)(T * E)));
	ERR_FORWARD(grow(l, &l->top, sizeof(float) * (size_t)T));
	ERR_FORWARD(grow(l, &l->idx, sizeof(int32_t) * (size_t)(k * T)));
	ERR_FORWARD(grow(l, &l->loc, sizeof(int32_t) * (size_t)(k * T)));
	ERR_FORWARD(grow(l, &l->score, sizeof(float) * (size_t)(k * T)));
	ERR_FORWARD(grow(l, &l->count, sizeof(int64_t) * (size_t)E));
	ERR_FORWARD(grow(l, &l->used, sizeof(int64_t) * (size_t)E));
	memset(r, 0, sizeof *r);
	r->T = T;
	r->E = E;
	r->k = k;
	r->idx = l->idx.p;
	r->loc = l->loc.p;
	r->score = l->score.p;
	r->count = l->count.p;
	r->used = l->used.p;

	/* 1-2. Gating. */
	float *logits = l->logits.p;
	if (E <= GATE_E_MAX) {
		ERR_FORWARD(grow(l, &l->wgt, sizeof(float) * (size_t)(M * E)));
		transpose_wg(wg, M, E, l->wgt.p);
		gate_logits(x, l->wgt.p, T, M, E, logits);
	} else {
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, E, (int)M, 1.0f, x,
			    (int)M, wg, E, 0.0f, logits, E);
	}
	ERR_FORWARD(moe_gate_forward(cfg, logits, T, k, step, l->probs.p, li ? l->clean.p : NULL,
				     l->top.p, r));
	t1 = now();
	l->times.gate = t1 - t0;
	t0 = t1;

	/* 3-5. Capacity and locations. */
	moe_route_count(r);
	r->C = moe_capacity(r->count, E, T, k, capacity_setting, cfg->capacity_align);
	const int64_t C = r->C;
	if (C < 1)
		return err_set(CORE_EUSAGE, NULL, "capacity setting %g leaves no slot per expert "
			       "(k*int(%g*ceil(T/E)) = 0 at T=%lld, E=%d, k=%d)", capacity_setting,
			       fabs(capacity_setting), (long long)T, E, k);
	if ((double)E * (double)C * (double)(M > H ? M : H) > 1e15)
		return err_set(CORE_EUSAGE, NULL, "capacity %lld is too large", (long long)C);
	ERR_FORWARD(moe_route_locations(r, l->top.p, cfg->bpr));
	l->times.scan = now() - t0;
	return 0;
}

int moe_forward(struct moe_layer *l, const struct moe_params *p, const float *x, float *y,
		int64_t T, int k, double capacity_setting, uint64_t step)
{
	const struct moe_config *cfg = &l->cfg;
	const int64_t M = cfg->M, H = cfg->H;
	const int E = cfg->E;
	struct moe_routing *r = &l->r;

	ERR_FORWARD(moe_route(l, p->wg, x, T, k, capacity_setting, step));
	const int64_t C = r->C;
	double t0 = now(), t1;

	/* 6. Encode. */
	ERR_FORWARD(grow(l, &l->disp, sizeof(float) * (size_t)(E * C * M)));
	ERR_FORWARD(grow(l, &l->eo, sizeof(float) * (size_t)(E * C * M)));
	ERR_FORWARD(grow(l, &l->h, sizeof(float) * (size_t)(E * C * H)));
	if (cfg->act == MOE_ACT_GELU)
		ERR_FORWARD(grow(l, &l->hpre, sizeof(float) * (size_t)(E * C * H)));
	float *disp = l->disp.p, *eo = l->eo.p, *h = l->h.p, *hpre = l->hpre.p;
	moe_encode_kept(r, x, disp, M);
	t1 = now();
	l->times.encode = t1 - t0;
	t0 = t1;

	/* 7. Experts over the kept rows. relu keeps only h (h > 0 is relu's mask); gelu also
	 * keeps the pre-activation. */
	for (int e = 0; e < E; e++) {
		const int64_t rows = r->used[e];
		if (rows == 0)
			continue;
		const float *a = disp + (int64_t)e * C * M;
		float *he = h + (int64_t)e * C * H, *pe = hpre ? hpre + (int64_t)e * C * H : NULL;
		float *oe = eo + (int64_t)e * C * M;
		const float *b1 = p->b1 + (int64_t)e * H, *b2 = p->b2 + (int64_t)e * M;
		double g0 = now();
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)H, (int)M,
			    1.0f, a, (int)M, p->w1 + (int64_t)e * M * H, (int)H, 0.0f, he, (int)H);
		l->times.gemm_fwd += now() - g0;
#pragma omp parallel for schedule(static) if (rows * (H + M) >= PAR_MIN)
		for (int64_t i = 0; i < rows; i++) {
			float *hr = he + i * H;
			if (pe) {
				float *pr = pe + i * H;
				for (int64_t j = 0; j < H; j++) {
					pr[j] = hr[j] + b1[j];
					hr[j] = gelu(pr[j]);
				}
			} else {
#pragma omp simd
				for (int64_t j = 0; j < H; j++) {
					float v = hr[j] + b1[j];
					hr[j] = v > 0.0f ? v : 0.0f;
				}
			}
			float *orow = oe + i * M;
			memcpy(orow, b2, sizeof(float) * (size_t)M);
		}
		g0 = now();
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)M, (int)H,
			    1.0f, he, (int)H, p->w2 + (int64_t)e * H * M, (int)M, 1.0f, oe, (int)M);
		l->times.gemm_fwd += now() - g0;
	}
	t1 = now();
	l->times.experts = t1 - t0;
	t0 = t1;

	/* 8. Decode. */
	moe_decode(r, eo, y, M);
	l->times.decode = now() - t0;
	l->have_forward = 1;
	return 0;
}

int moe_backward(struct moe_layer *l, const struct moe_params *p, const float *x,
		 const float *dy, float *dx, struct moe_params *g, float aux_weight)
{
	const struct moe_config *cfg = &l->cfg;
	const int64_t M = cfg->M, H = cfg->H;
	const int E = cfg->E;
	struct moe_routing *r = &l->r;
	const int64_t T = r->T, C = r->C;
	const int k = r->k;
	double t0 = now(), t1;

	if (!l->have_forward)
		return err_set(CORE_EUSAGE, NULL, "moe_backward without a forward");
	ERR_FORWARD(grow(l, &l->dscore, sizeof(float) * (size_t)(k * T)));
	ERR_FORWARD(grow(l, &l->dlogits, sizeof(float) * (size_t)(T * E)));
	ERR_FORWARD(grow(l, &l->dh, sizeof(float) * (size_t)(C * H)));
	float *disp = l->disp.p, *eo = l->eo.p, *h = l->h.p, *hpre = l->hpre.p, *dh = l->dh.p;
	float *dscore = l->dscore.p;

	/* Decode backward (K0 + K2), d_eo written over eo. */
	moe_decode_backward_kept(r, dy, eo, eo, dscore, M);
	float *d_eo = eo;
	t1 = now();
	l->times.bwd_decode = t1 - t0;
	t0 = t1;

	/* Expert backward; d_disp written over disp after dW1 has read it. */
	for (int e = 0; e < E; e++) {
		const int64_t rows = r->used[e];
		float *dw1 = g->w1 + (int64_t)e * M * H, *dw2 = g->w2 + (int64_t)e * H * M;
		float *db1 = g->b1 + (int64_t)e * H, *db2 = g->b2 + (int64_t)e * M;
		if (rows == 0) {
			memset(dw1, 0, sizeof(float) * (size_t)(M * H));
			memset(dw2, 0, sizeof(float) * (size_t)(H * M));
			memset(db1, 0, sizeof(float) * (size_t)H);
			memset(db2, 0, sizeof(float) * (size_t)M);
			continue;
		}
		float *a = disp + (int64_t)e * C * M, *de = d_eo + (int64_t)e * C * M;
		float *he = h + (int64_t)e * C * H, *pe = hpre ? hpre + (int64_t)e * C * H : NULL;
		cpu_column_sums(db2, de, rows, M);
		double g0 = now();
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)H, (int)M, (int)rows,
			    1.0f, he, (int)H, de, (int)M, 0.0f, dw2, (int)M);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)H, (int)M,
			    1.0f, de, (int)M, p->w2 + (int64_t)e * H * M, (int)M, 0.0f, dh, (int)H);
		l->times.gemm_bwd += now() - g0;
		act_backward_colsum(dh, he, pe, rows, H, db1);
		g0 = now();
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)M, (int)H, (int)rows,
			    1.0f, a, (int)M, dh, (int)H, 0.0f, dw1, (int)H);
		if (dx)
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)M,
				    (int)H, 1.0f, dh, (int)H, p->w1 + (int64_t)e * M * H, (int)H, 0.0f,
				    a, (int)M);
		l->times.gemm_bwd += now() - g0;
	}
	t1 = now();
	l->times.bwd_experts = t1 - t0;
	t0 = t1;

	/* Encode backward (K1, unweighted). */
	if (dx)
		moe_encode_backward(r, disp, dx, M);
	t1 = now();
	l->times.bwd_encode = t1 - t0;
	t0 = t1;

	/* Gate backward: dlogits, then dwg = x^T dlogits and dx += dlogits wg^T. */
	float *dlogits = l->dlogits.p;
	ERR_FORWARD(moe_gate_backward(cfg, l->logits.p, l->probs.p, l->clean.p, r, dscore,
				      aux_weight, dlogits));
	if (E <= GATE_E_MAX) {
		/* wgt still holds wg transposed from the forward. */
		ERR_FORWARD(gate_backward_products(x, dlogits, l->wgt.p, T, M, E, dx, g->wg));
	} else {
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)M, E, (int)T, 1.0f, x,
			    (int)M, dlogits, E, 0.0f, g->wg, E);
		if (dx)
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)M, E, 1.0f,
				    dlogits, E, p->wg, E, 1.0f, dx, (int)M);
	}
	l->times.bwd_gate = now() - t0;
	/* The saved activations were consumed in place. */
	l->have_forward = 0;
	return 0;
}
