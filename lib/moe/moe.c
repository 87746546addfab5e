/* moe.c - the sparse MoE layer: configuration, parameters, capacity, and the forward and
 * backward passes that chain the backend's gate, count, locations, encode, expert GEMMs and
 * decode ops (moe.h, backend.h).
 *
 * Memory: the layer keeps only what backward needs and reuses buffers in place where the data
 * flow allows it: decode-backward writes d_eo over eo (K2 reads each row before K0
 * overwrites it), and each expert's d_disp overwrites its disp rows after dW1 has read them
 * (matmul_backward computes dw before dx). The experts run their GEMMs over the kept rows
 * min(n_e, C) only, so the layer's encode and decode-backward leave the padding rows as they
 * are (zero_pad = 0): nothing reads them.
 */
#include "moe/moe.h"
#include "moe/moe_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/progress.h"
#include "common/rng.h"
#include "common/banned.h"

/* The largest buffer the layer will size, in elements (E * C * max(M, H)): 4 PB of floats.
 * A capacity beyond it is a mistake in the setting (a trace line of 1e30), refused before
 * any size_t product could overflow. */
#define MOE_MAX_ELEMS 1e15

static const char *const act_names[] = {[MOE_ACT_RELU] = "relu", [MOE_ACT_GELU] = "gelu"};
static const char *const loss_names[] = {[MOE_LOSS_GSHARD] = "gshard",
					 [MOE_LOSS_LOAD_IMPORTANCE] = "load-importance"};
#define NAMES(a) (int)(sizeof(a) / sizeof(a[0]))

static int name_index(const char *const *names, int n, const char *name)
{
	for (int i = 0; i < n; i++)
		if (strcmp(names[i], name) == 0)
			return i;
	return -1;
}

const char *moe_act_name(enum moe_act a)
{
	return (unsigned)a < NAMES(act_names) ? act_names[a] : "?";
}

/* "a, b, c" from the table, into buf (static: the tables never change). */
static const char *join_names(const char *const *names, int n, char *buf, size_t size)
{
	size_t used = 0;
	for (int i = 0; i < n && used < size; i++)
		used += (size_t)snprintf(buf + used, size - used, "%s%s", i ? ", " : "", names[i]);
	return buf;
}

int moe_act_from_name(const char *name) { return name_index(act_names, NAMES(act_names), name); }

const char *moe_act_names(void)
{
	static char buf[64];
	return join_names(act_names, NAMES(act_names), buf, sizeof buf);
}

const char *moe_loss_name(enum moe_loss l)
{
	return (unsigned)l < NAMES(loss_names) ? loss_names[l] : "?";
}

int moe_loss_from_name(const char *name)
{
	return name_index(loss_names, NAMES(loss_names), name);
}

const char *moe_loss_names(void)
{
	static char buf[64];
	return join_names(loss_names, NAMES(loss_names), buf, sizeof buf);
}

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
	if (cfg->M > INT32_MAX || cfg->H > INT32_MAX)
		return err_set(CORE_EUSAGE, NULL, "M=%lld or H=%lld is too large for the GEMMs",
			       (long long)cfg->M, (long long)cfg->H);
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

/* ---- parameters ------------------------------------------------------------------------ */

int moe_params_alloc_n(struct moe_params *p, struct backend *be, const size_t n[5])
{
	float **t[] = {&p->wg, &p->w1, &p->b1, &p->w2, &p->b2};

	memset(p, 0, sizeof *p);
	p->be = be;
	for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
		if (backend_alloc_zero(be, (void **)t[i], n[i] * sizeof(float)) < 0) {
			moe_params_free(p);
			return err_set(CORE_ENOMEM, NULL, "cannot allocate the MoE parameters");
		}
	return 0;
}

int moe_params_alloc(struct moe_params *p, const struct moe_config *cfg, struct backend *be)
{
	const size_t M = (size_t)cfg->M, H = (size_t)cfg->H, E = (size_t)cfg->E;
	const size_t n[5] = {M * E, E * M * H, E * H, E * H * M, E * M};
	return moe_params_alloc_n(p, be, n);
}

void moe_params_free(struct moe_params *p)
{
	struct backend *be = p->be;
	if (be) {
		be->op->free(be, p->wg);
		be->op->free(be, p->w1);
		be->op->free(be, p->b1);
		be->op->free(be, p->w2);
		be->op->free(be, p->b2);
	}
	memset(p, 0, sizeof *p);
}

int moe_params_init(struct moe_params *p, const struct moe_config *cfg, uint64_t seed)
{
	struct backend *be = p->be;
	const int64_t M = cfg->M, H = cfg->H, E = cfg->E;
	/* One counter range: wg, w1, w2, b1, b2 draw consecutive indices of RNG_STREAM_INIT. */
	const uint64_t o_w1 = (uint64_t)(M * E), o_w2 = o_w1 + (uint64_t)(E * M * H);
	const uint64_t o_b1 = o_w2 + (uint64_t)(E * H * M), o_b2 = o_b1 + (uint64_t)(E * H);

	ERR_FORWARD(be->op->fill_normal(be, p->wg, (size_t)(M * E), 0.0f, 1.0f / sqrtf((float)M),
					seed, RNG_STREAM_INIT, 0));
	ERR_FORWARD(be->op->fill_normal(be, p->w1, (size_t)(E * M * H), 0.0f,
					1.0f / sqrtf((float)M), seed, RNG_STREAM_INIT, o_w1));
	ERR_FORWARD(be->op->fill_normal(be, p->w2, (size_t)(E * H * M), 0.0f,
					1.0f / sqrtf((float)H), seed, RNG_STREAM_INIT, o_w2));
	ERR_FORWARD(be->op->fill_normal(be, p->b1, (size_t)(E * H), 0.0f, 0.1f, seed,
					RNG_STREAM_INIT, o_b1));
	return be->op->fill_normal(be, p->b2, (size_t)(E * M), 0.0f, 0.1f, seed, RNG_STREAM_INIT,
				   o_b2);
}

/* ---- capacity -------------------------------------------------------------------------- */

int64_t moe_capacity_fixed(int E, int64_t T, int k, double x)
{
	int64_t per_expert = (T + E - 1) / E;
	/* Python's int() of the double product: truncation toward zero. A product beyond any
	 * real capacity (a trace may hold 1e30) saturates at 2^53 instead of overflowing the
	 * conversion; moe_route then refuses the capacity as too large. */
	double v = x * (double)per_expert;
	if (!(v * k < 9007199254740992.0))
		return (int64_t)1 << 53;
	return (int64_t)k * (int64_t)v;
}

int64_t moe_capacity(const int64_t *count, int E, int64_t T, int k, double setting, int align)
{
	int64_t need = 0, C;

	for (int e = 0; e < E; e++)
		need = count[e] > need ? count[e] : need;
	if (setting == 0.0) {
		C = need;
	} else {
		C = moe_capacity_fixed(E, T, k, fabs(setting));
		if (setting < 0.0 && need < C)
			C = need;
	}
	if (align > 1 && C % align)
		C += align - C % align;
	return C;
}

double moe_step_flops(const struct moe_config *cfg, int64_t T, double R, int backward,
		      int input_grad)
{
	const double gate = 2.0 * (double)T * (double)cfg->M * cfg->E;
	const double experts = 4.0 * R * (double)cfg->M * (double)cfg->H;
	if (!backward)
		return gate + experts;
	/* Without the input gradient the d_disp GEMM and the gate's dx term are skipped. */
	return 3.0 * (gate + experts) - (input_grad ? 0.0 : 2.0 * R * cfg->M * cfg->H + gate);
}

/* ---- the layer ------------------------------------------------------------------------- */

/* A buffer of backend memory that grows on demand and is counted in the layer's bytes. */
struct buf {
	void *p;
	size_t bytes;
};

struct moe_layer {
	struct moe_config cfg;
	struct backend *be;
	int timing;  /* stages timed (moe_layer_set_timing) */
	size_t bytes, peak;
	struct buf logits, probs, clean, top, idx, loc, score, dscore, count, aux;
	struct buf disp, eo, hpre, h, dh, dlogits;
	int64_t *count_host, *used_host; /* [E] */
	struct moe_routing r;
	struct backend_moe_route route;
	struct moe_times times;
	int have_forward;
};

static size_t round64(size_t bytes) { return (bytes + 63) / 64 * 64; }

static int grow(struct moe_layer *l, struct buf *b, size_t bytes)
{
	struct backend *be = l->be;
	if (bytes <= b->bytes)
		return 0;
	bytes = round64(bytes);
	be->op->free(be, b->p);
	l->bytes -= b->bytes;
	b->bytes = 0;
	b->p = NULL;
	if (be->op->alloc(be, &b->p, bytes) < 0) {
		b->p = NULL;
		return err_set(CORE_ENOMEM, NULL, "cannot allocate %zu bytes of MoE workspace",
			       bytes);
	}
	b->bytes = bytes;
	l->bytes += bytes;
	if (l->bytes > l->peak)
		l->peak = l->bytes;
	return 0;
}

size_t moe_layer_bytes_for(const struct moe_config *cfg, int64_t T, int k, int64_t C,
			   int backward)
{
	const size_t t = (size_t)T, e = (size_t)cfg->E, c = (size_t)C, m = (size_t)cfg->M;
	const size_t h = (size_t)cfg->H, kk = (size_t)k;
	/* The buffers of struct moe_layer, in its order. */
	size_t n[] = {
		t * e * 4, t * e * 4, cfg->loss == MOE_LOSS_LOAD_IMPORTANCE ? t * e * 4 : 0,
		t * 4, kk * t * 4, kk * t * 4, kk * t * 4, backward ? kk * t * 4 : 0, e * 8, 4,
		e * c * m * 4, e * c * m * 4, cfg->act == MOE_ACT_GELU ? e * c * h * 4 : 0,
		e * c * h * 4, backward ? c * h * 4 : 0, backward ? t * e * 4 : 0,
	};
	size_t total = 0;
	for (size_t i = 0; i < sizeof n / sizeof n[0]; i++)
		total += round64(n[i]);
	return total;
}

int moe_layer_init(struct moe_layer **out, const struct moe_config *cfg, struct backend *be)
{
	*out = NULL;
	ERR_FORWARD(moe_config_check(cfg));
	struct moe_layer *l = calloc(1, sizeof *l);
	if (l) {
		l->count_host = calloc((size_t)cfg->E, sizeof(int64_t));
		l->used_host = calloc((size_t)cfg->E, sizeof(int64_t));
	}
	if (!l || !l->count_host || !l->used_host) {
		moe_layer_free(l);
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the MoE layer");
	}
	l->cfg = *cfg;
	l->be = be;
	/* stages and expert GEMMs timed: always in host memory, on a device when asked */
	l->timing = be->host_visible;
	if (l->timing)
		be->op->profile(be, 1);
	*out = l;
	return 0;
}

void moe_layer_free(struct moe_layer *l)
{
	if (!l)
		return;
	struct buf *all[] = {&l->logits, &l->probs, &l->clean, &l->top, &l->idx,
			     &l->loc, &l->score, &l->dscore, &l->count, &l->aux,
			     &l->disp, &l->eo, &l->hpre, &l->h, &l->dh, &l->dlogits};
	for (size_t i = 0; l->be && i < sizeof all / sizeof all[0]; i++)
		l->be->op->free(l->be, all[i]->p);
	free(l->count_host);
	free(l->used_host);
	free(l);
}

const struct moe_routing *moe_layer_routing(const struct moe_layer *l) { return &l->r; }
const struct backend_moe_route *moe_layer_route(const struct moe_layer *l) { return &l->route; }
const struct moe_times *moe_layer_times(const struct moe_layer *l) { return &l->times; }
size_t moe_layer_peak_bytes(const struct moe_layer *l) { return l->peak; }

void moe_layer_set_timing(struct moe_layer *l, int on)
{
	l->timing = on || l->be->host_visible;
	if (l->timing)
		l->be->op->profile(l->be, 1);
}

/* The time once a backend that queues work (a GPU) has finished it. */
static double synced_now(struct moe_layer *l)
{
	l->be->op->sync(l->be);
	return now_seconds();
}

/* Stage boundaries: each stage's time is its own; NaN when the stages are not timed (a
 * device runs ahead). */
static double stage_clock(struct moe_layer *l)
{
	return l->timing ? synced_now(l) : NAN;
}

static enum backend_act backend_act(enum moe_act a)
{
	return a == MOE_ACT_GELU ? BACKEND_ACT_GELU : BACKEND_ACT_RELU;
}

static int check_call(const struct moe_config *cfg, int64_t T, int k, double setting)
{
	if (k < 1 || k > cfg->E)
		return err_set(CORE_EUSAGE, NULL, "top-k %d is outside [1, E = %d]", k, cfg->E);
	if (T < 1 || T > cfg->T)
		return err_set(CORE_EUSAGE, NULL, "token count %lld is outside [1, %lld]",
			       (long long)T, (long long)cfg->T);
	if (!isfinite(setting))
		return err_set(CORE_EUSAGE, NULL, "capacity setting is not finite");
	return 0;
}

/* The buffers routing needs for T tokens and k choices, and the routing structs over them. */
static int grow_routing(struct moe_layer *l, int64_t T, int k)
{
	const size_t TE = (size_t)(T * l->cfg.E), kT = (size_t)k * (size_t)T;

	ERR_FORWARD(grow(l, &l->logits, sizeof(float) * TE));
	ERR_FORWARD(grow(l, &l->probs, sizeof(float) * TE));
	if (l->cfg.loss == MOE_LOSS_LOAD_IMPORTANCE)
		ERR_FORWARD(grow(l, &l->clean, sizeof(float) * TE));
	ERR_FORWARD(grow(l, &l->top, sizeof(float) * (size_t)T));
	ERR_FORWARD(grow(l, &l->idx, sizeof(int32_t) * kT));
	ERR_FORWARD(grow(l, &l->loc, sizeof(int32_t) * kT));
	ERR_FORWARD(grow(l, &l->score, sizeof(float) * kT));
	ERR_FORWARD(grow(l, &l->count, sizeof(int64_t) * (size_t)l->cfg.E));
	ERR_FORWARD(grow(l, &l->aux, sizeof(float)));
	return 0;
}

int moe_route_gate(struct moe_layer *l, const float *wg, const float *x, int64_t T, int k,
		   uint64_t step)
{
	const struct moe_config *cfg = &l->cfg;
	struct backend *be = l->be;
	const int E = cfg->E;
	struct moe_routing *r = &l->r;

	l->have_forward = 0;
	memset(&l->times, 0, sizeof l->times);
	double t0 = stage_clock(l), t1;
	ERR_FORWARD(grow_routing(l, T, k));
	*r = (struct moe_routing){.T = T, .E = E, .k = k, .noise_step = step, .idx = l->idx.p,
				  .loc = l->loc.p, .score = l->score.p, .count = l->count_host,
				  .used = l->used_host};

	/* 1-2. Gating: logits = x wg, then softmax, top-k, scores and the auxiliary loss. */
	const int eval = step == MOE_STEP_EVAL;
	const struct backend_moe_gate g = {
		.T = T, .E = E, .k = k, .noise = eval ? 0.0f : cfg->gate_noise, .seed = cfg->seed,
		.step = eval ? 0 : step,
		.load_importance = !eval && cfg->loss == MOE_LOSS_LOAD_IMPORTANCE,
	};
	ERR_FORWARD(be->op->matmul_forward(be, l->logits.p, x, wg, NULL, (int)T, (int)cfg->M, E,
					   BACKEND_W_IO));
	ERR_FORWARD(be->op->moe_gate_forward(be, &g, l->logits.p, l->probs.p,
					     g.load_importance ? l->clean.p : NULL, l->top.p,
					     l->idx.p, l->score.p, l->aux.p));
	ERR_FORWARD(be->op->download(be, &r->aux_loss, l->aux.p, sizeof(float)));
	t1 = stage_clock(l);
	l->times.gate = t1 - t0;
	t0 = t1;

	/* 3. Counts, read back: they size C. */
	ERR_FORWARD(be->op->moe_count(be, l->idx.p, (int64_t)k * T, E, l->count.p));
	ERR_FORWARD(be->op->download(be, r->count, l->count.p, sizeof(int64_t) * (size_t)E));
	l->times.scan = stage_clock(l) - t0;
	return 0;
}

int moe_route_place(struct moe_layer *l, int64_t C)
{
	const struct moe_config *cfg = &l->cfg;
	struct backend *be = l->be;
	struct moe_routing *r = &l->r;
	const int E = cfg->E, k = r->k;
	const int64_t T = r->T;
	double t0 = stage_clock(l);

	if ((double)E * (double)C * (double)(cfg->M > cfg->H ? cfg->M : cfg->H) > MOE_MAX_ELEMS)
		return err_set(CORE_EUSAGE, NULL, "capacity %lld is too large", (long long)C);
	r->C = C;
	r->dropped = 0;
	/* 5. Locations. */
	ERR_FORWARD(be->op->moe_locations(be, l->idx.p, cfg->bpr ? l->top.p : NULL, T, k, E, C,
					  l->loc.p));
	/* Expert e keeps its first min(n_e, C) choices, so the drops follow from the counts. */
	for (int e = 0; e < E; e++) {
		r->used[e] = r->count[e] < C ? r->count[e] : C;
		r->dropped += r->count[e] - r->used[e];
	}
	l->route = (struct backend_moe_route){.T = T, .C = C, .E = E, .k = k, .idx = l->idx.p,
					      .loc = l->loc.p, .score = l->score.p,
					      .count = l->count.p};
	l->times.scan += stage_clock(l) - t0;
	return 0;
}

int moe_route(struct moe_layer *l, const float *wg, const float *x, int64_t T, int k,
	      double capacity_setting, uint64_t step)
{
	const struct moe_config *cfg = &l->cfg;

	if (k == 0)
		k = cfg->k;
	ERR_FORWARD(check_call(cfg, T, k, capacity_setting));
	ERR_FORWARD(moe_route_gate(l, wg, x, T, k, step));
	/* 4. Capacity. */
	const int64_t C = moe_capacity(l->r.count, cfg->E, T, k, capacity_setting,
				       cfg->capacity_align);
	if (C < 1)
		return err_set(CORE_EUSAGE, NULL, "capacity setting %g leaves no slot per expert "
			       "(k*int(%g*ceil(T/E)) = 0 at T=%lld, E=%d, k=%d)", capacity_setting,
			       fabs(capacity_setting), (long long)T, cfg->E, k);
	return moe_route_place(l, C);
}

/* 7. The experts over their kept rows: h = act(disp w1 + b1), eo = h w2 + b2. relu keeps
 * only h (h > 0 is relu's mask); gelu also keeps the pre-activation. */
static int experts_forward(struct moe_layer *l, const struct moe_params *p)
{
	const struct moe_config *cfg = &l->cfg;
	struct backend *be = l->be;
	const int64_t M = cfg->M, H = cfg->H, C = l->r.C;
	const enum backend_act act = backend_act(cfg->act);
	float *disp = l->disp.p, *eo = l->eo.p, *h = l->h.p, *hpre = l->hpre.p;

	for (int e = 0; e < cfg->E; e++) {
		const int rows = (int)l->r.used[e];
		if (rows == 0)
			continue;
		float *he = h + (int64_t)e * C * H;
		float *pe = cfg->act == MOE_ACT_GELU ? hpre + (int64_t)e * C * H : he;
		ERR_FORWARD(be->op->matmul_forward(be, pe, disp + (int64_t)e * C * M,
						   p->w1 + (int64_t)e * M * H, NULL, rows, (int)M,
						   (int)H, BACKEND_W_IO));
		ERR_FORWARD(be->op->bias_act_forward(be, pe, he, p->b1 + (int64_t)e * H, rows,
						     (int)H, act));
		ERR_FORWARD(be->op->matmul_forward(be, eo + (int64_t)e * C * M, he,
						   p->w2 + (int64_t)e * H * M,
						   p->b2 + (int64_t)e * M, rows, (int)H, (int)M,
						   BACKEND_W_IO));
	}
	return 0;
}

int moe_forward(struct moe_layer *l, const struct moe_params *p, const float *x, float *y,
		int64_t T, int k, double capacity_setting, uint64_t step)
{
	const struct moe_config *cfg = &l->cfg;
	struct backend *be = l->be;
	const int64_t M = cfg->M, H = cfg->H;
	const int E = cfg->E;

	ERR_FORWARD(moe_route(l, p->wg, x, T, k, capacity_setting, step));
	const int64_t C = l->r.C;
	double t0 = stage_clock(l), t1;

	/* 6. Encode. */
	ERR_FORWARD(grow(l, &l->disp, sizeof(float) * (size_t)(E * C * M)));
	ERR_FORWARD(grow(l, &l->eo, sizeof(float) * (size_t)(E * C * M)));
	if (cfg->act == MOE_ACT_GELU)
		ERR_FORWARD(grow(l, &l->hpre, sizeof(float) * (size_t)(E * C * H)));
	ERR_FORWARD(grow(l, &l->h, sizeof(float) * (size_t)(E * C * H)));
	ERR_FORWARD(be->op->moe_encode(be, &l->route, x, l->disp.p, M, 0));
	t1 = stage_clock(l);
	l->times.encode = t1 - t0;
	t0 = t1;

	/* 7. Experts. */
	double g0 = be->op->gemm_seconds(be);
	ERR_FORWARD(experts_forward(l, p));
	t1 = stage_clock(l);
	l->times.gemm_fwd = be->op->gemm_seconds(be) - g0;
	l->times.experts = t1 - t0;
	t0 = t1;

	/* 8. Decode. */
	ERR_FORWARD(be->op->moe_decode(be, &l->route, l->eo.p, y, M));
	l->times.decode = stage_clock(l) - t0;
	l->have_forward = 1;
	return 0;
}

/* Expert backward over the kept rows, from d_eo (over eo): dW2, db2 and dh; act'; dW1, db1,
 * and d_disp over disp when the input needs a gradient. Experts without rows get zero
 * gradients. */
static int experts_backward(struct moe_layer *l, const struct moe_params *p,
			    struct moe_params *g, int input_grad)
{
	const struct moe_config *cfg = &l->cfg;
	struct backend *be = l->be;
	const int64_t M = cfg->M, H = cfg->H, C = l->r.C;
	const enum backend_act act = backend_act(cfg->act);
	float *disp = l->disp.p, *d_eo = l->eo.p, *h = l->h.p, *hpre = l->hpre.p, *dh = l->dh.p;

	for (int e = 0; e < cfg->E; e++) {
		const int rows = (int)l->r.used[e];
		float *dw1 = g->w1 + (int64_t)e * M * H, *dw2 = g->w2 + (int64_t)e * H * M;
		float *db1 = g->b1 + (int64_t)e * H, *db2 = g->b2 + (int64_t)e * M;
		if (rows == 0) {
			ERR_FORWARD(be->op->memset(be, dw1, 0, sizeof(float) * (size_t)(M * H)));
			ERR_FORWARD(be->op->memset(be, dw2, 0, sizeof(float) * (size_t)(H * M)));
			ERR_FORWARD(be->op->memset(be, db1, 0, sizeof(float) * (size_t)H));
			ERR_FORWARD(be->op->memset(be, db2, 0, sizeof(float) * (size_t)M));
			continue;
		}
		float *a = disp + (int64_t)e * C * M;
		float *he = h + (int64_t)e * C * H;
		const float *pe = cfg->act == MOE_ACT_GELU ? hpre + (int64_t)e * C * H : he;
		ERR_FORWARD(be->op->matmul_backward(be, dh, dw2, db2, d_eo + (int64_t)e * C * M, he,
						    p->w2 + (int64_t)e * H * M, rows, (int)H,
						    (int)M, BACKEND_W_IO, 0));
		ERR_FORWARD(be->op->act_backward(be, dh, db1, pe, rows, (int)H, act));
		ERR_FORWARD(be->op->matmul_backward(be, input_grad ? a : NULL, dw1, NULL, dh, a,
						    p->w1 + (int64_t)e * M * H, rows, (int)M,
						    (int)H, BACKEND_W_IO, 0));
	}
	return 0;
}

/* Gate backward: dlogits, then dwg = x^T dlogits and dx += dlogits wg^T. */
int moe_gate_backward(struct moe_layer *l, const float *wg, const float *x, const float *dscore,
		      float *dx, float *dwg, float aux_weight)
{
	const struct moe_config *cfg = &l->cfg;
	struct backend *be = l->be;
	const struct moe_routing *r = &l->r;
	const int64_t T = r->T;
	const int eval = r->noise_step == MOE_STEP_EVAL;
	if (eval && cfg->loss == MOE_LOSS_LOAD_IMPORTANCE)
		return err_set(CORE_EUSAGE, NULL, "the load-importance loss of an evaluation "
			       "forward (no gate noise) has no gradient");
	const struct backend_moe_gate gate = {
		.T = T, .E = cfg->E, .k = r->k, .noise = eval ? 0.0f : cfg->gate_noise,
		.seed = cfg->seed, .step = eval ? 0 : r->noise_step,
		.load_importance = cfg->loss == MOE_LOSS_LOAD_IMPORTANCE,
	};
	ERR_FORWARD(grow(l, &l->dlogits, sizeof(float) * (size_t)(T * cfg->E)));
	ERR_FORWARD(be->op->moe_gate_backward(be, &gate, l->logits.p, l->probs.p, l->clean.p,
					      l->idx.p, dscore, aux_weight, l->dlogits.p));
	return be->op->matmul_backward(be, dx, dwg, NULL, l->dlogits.p, x, wg, (int)T,
				       (int)cfg->M, cfg->E, BACKEND_W_IO, 1);
}

int moe_backward(struct moe_layer *l, const struct moe_params *p, const float *x,
		 const float *dy, float *dx, struct moe_params *g, float aux_weight)
{
	const struct moe_config *cfg = &l->cfg;
	struct backend *be = l->be;
	struct moe_routing *r = &l->r;
	const int64_t M = cfg->M, H = cfg->H, T = r->T, C = r->C;
	const int E = cfg->E, k = r->k;

	if (!l->have_forward)
		return err_set(CORE_EUSAGE, NULL, "moe_backward without a forward");
	if (r->noise_step == MOE_STEP_EVAL && cfg->loss == MOE_LOSS_LOAD_IMPORTANCE)
		return err_set(CORE_EUSAGE, NULL, "the load-importance loss of an evaluation "
			       "forward (no gate noise) has no gradient");
	double t0 = stage_clock(l), t1;
	ERR_FORWARD(grow(l, &l->dscore, sizeof(float) * (size_t)(k * T)));
	ERR_FORWARD(grow(l, &l->dlogits, sizeof(float) * (size_t)(T * E)));
	ERR_FORWARD(grow(l, &l->dh, sizeof(float) * (size_t)(C * H)));

	/* Decode backward (K0 + K2), d_eo written over eo. */
	ERR_FORWARD(be->op->moe_decode_backward(be, &l->route, dy, l->eo.p, l->eo.p,
						l->dscore.p, M, 0));
	t1 = stage_clock(l);
	l->times.bwd_decode = t1 - t0;
	t0 = t1;

	double g0 = be->op->gemm_seconds(be);
	ERR_FORWARD(experts_backward(l, p, g, dx != NULL));
	t1 = stage_clock(l);
	l->times.gemm_bwd = be->op->gemm_seconds(be) - g0;
	l->times.bwd_experts = t1 - t0;
	t0 = t1;

	/* Encode backward (K1, unweighted) from d_disp (over disp). */
	if (dx)
		ERR_FORWARD(be->op->moe_encode_backward(be, &l->route, l->disp.p, dx, M));
	t1 = stage_clock(l);
	l->times.bwd_encode = t1 - t0;
	t0 = t1;

	ERR_FORWARD(moe_gate_backward(l, p->wg, x, l->dscore.p, dx, g->wg, aux_weight));
	l->times.bwd_gate = stage_clock(l) - t0;
	/* The saved activations were consumed in place. */
	l->have_forward = 0;
	return 0;
}

/* Both element types: the fp32 ops or their bfloat16 twins on the same route, each kernel
 * timed whatever moe_layer_set_timing says (timing them is what this is for). */
static int encode_decode(struct moe_layer *l, int bf16, const void *x, void *disp, void *y,
			 const void *dy, float *dscore, void *dx, int backward,
			 struct moe_times *times)
{
	struct backend *be = l->be;
	const struct backend_ops *op = be->op;
	const struct backend_moe_route *r = &l->route;
	const int64_t M = l->cfg.M;
	double t0 = synced_now(l), t1;

	ERR_FORWARD(bf16 ? op->moe_encode_bf16(be, r, x, disp, M, 1)
			 : op->moe_encode(be, r, x, disp, M, 1));
	t1 = synced_now(l);
	times->encode = t1 - t0;
	t0 = t1;
	ERR_FORWARD(bf16 ? op->moe_decode_bf16(be, r, disp, y, M)
			 : op->moe_decode(be, r, disp, y, M));
	t1 = synced_now(l);
	times->decode = t1 - t0;
	t0 = t1;
	if (!backward)
		return 0;
	ERR_FORWARD(bf16 ? op->moe_decode_backward_bf16(be, r, dy, disp, disp, dscore, M, 1)
			 : op->moe_decode_backward(be, r, dy, disp, disp, dscore, M, 1));
	t1 = synced_now(l);
	times->bwd_decode = t1 - t0;
	t0 = t1;
	ERR_FORWARD(bf16 ? op->moe_encode_backward_bf16(be, r, disp, dx, M)
			 : op->moe_encode_backward(be, r, disp, dx, M));
	times->bwd_encode = synced_now(l) - t0;
	return 0;
}

int moe_encode_decode(struct moe_layer *l, const float *x, float *disp, float *y,
		      const float *dy, float *dscore, float *dx, int backward,
		      struct moe_times *times)
{
	return encode_decode(l, 0, x, disp, y, dy, dscore, dx, backward, times);
}

int moe_encode_decode_bf16(struct moe_layer *l, const uint16_t *x, uint16_t *disp, uint16_t *y,
			   const uint16_t *dy, float *dscore, uint16_t *dx, int backward,
			   struct moe_times *times)
{
	const struct backend_ops *op = l->be->op;
	if (!op->moe_encode_bf16 || !op->moe_decode_bf16 || !op->moe_decode_backward_bf16 ||
	    !op->moe_encode_backward_bf16)
		return err_set(CORE_EUNSUPPORTED, NULL, "backend '%s' has no bfloat16 dispatch "
			       "ops", l->be->name);
	return encode_decode(l, 1, x, disp, y, dy, dscore, dx, backward, times);
}
