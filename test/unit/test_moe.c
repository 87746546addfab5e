/* test_moe.c - the sparse MoE layer (lib/moe/moe.h) against three independent references:
 *  - the dense GShard formulation (moe_dense_step): output and every gradient to 1e-5
 *    relative (max-abs error over a tensor divided by the reference tensor's max-abs);
 *  - a naive capacity/drop loop written here (for each rank, for each token in BPR order,
 *    assign if the expert has room) for C, the locations and the dropped count;
 *  - a double-precision forward written here (per token, per choice, no slots at all),
 *    for the output and, by central finite differences, for the gradients of the gate
 *    weights, the input and a sample of the expert weights.
 * Every case prints its parameters when it fails.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "common/err.h"
#include "common/rng.h"
#include "moe/moe.h"
#include "common/banned.h"

/* The backend the cases run on (its memory is host memory: the test reads it directly). */
static struct backend *be;

static void use_backend(const char *name, int threads)
{
	backend_close(be);
	cr_assert_eq(backend_open(&be, name, &(struct backend_params){.threads = threads}), 0,
		     "%s", name);
}

struct tcase {
	int64_t T, M, H;
	int E, k, bpr, gelu, li;
	int refused; /* set by run_case: the setting left no slot and both refused it */
	double cap;
	float noise;
	char name[200];
};

static void case_name(struct tcase *c)
{
	snprintf(c->name, sizeof c->name,
		 "%s: T=%lld E=%d k=%d M=%lld H=%lld cap=%g bpr=%d act=%s noise=%g loss=%s",
		 be->name, (long long)c->T, c->E, c->k, (long long)c->M, (long long)c->H, c->cap,
		 c->bpr, c->gelu ? "gelu" : "relu", (double)c->noise,
		 c->li ? "load-importance" : "gshard");
}

static void make_cfg(const struct tcase *c, struct moe_config *cfg)
{
	moe_config_default(cfg, c->T + 3, c->M, c->H, c->E);
	cfg->k = 1; /* the calls pass k: k per call */
	cfg->capacity_setting = 1.0;
	cfg->bpr = c->bpr;
	cfg->gate_noise = c->noise;
	cfg->act = c->gelu ? MOE_ACT_GELU : MOE_ACT_RELU;
	cfg->loss = c->li ? MOE_LOSS_LOAD_IMPORTANCE : MOE_LOSS_GSHARD;
	cfg->seed = 7;
}

static double rel_err(const float *a, const float *b, int64_t n)
{
	double num = 0.0, den = 0.0;
	for (int64_t i = 0; i < n; i++) {
		double d = fabs((double)a[i] - (double)b[i]);
		num = d > num ? d : num;
		den = fabs((double)b[i]) > den ? fabs((double)b[i]) : den;
	}
	return den > 0.0 ? num / den : num;
}

/* ---- naive capacity and drop reference ---- */

/* Tutel's extract_critical: k * int(|x| * ceil(T / E)), Python's int() truncating. */
static int64_t tutel_fixed(int64_t T, int E, int k, double x)
{
	return k * (int64_t)trunc(fabs(x) * (double)((T + E - 1) / E));
}

static int64_t naive_capacity(const int64_t *count, int E, int64_t T, int k, double x)
{
	int64_t need = 0;
	for (int e = 0; e < E; e++)
		if (count[e] > need)
			need = count[e];
	if (x == 0.0)
		return need;
	int64_t fixed = tutel_fixed(T, E, k, x);
	return x > 0.0 ? fixed : (need < fixed ? need : fixed);
}

/* Stable descending insertion sort of tokens by key. */
static void naive_order(const float *key, int64_t T, int64_t *ord)
{
	for (int64_t i = 0; i < T; i++) {
		int64_t j = i;
		while (j > 0 && key[ord[j - 1]] < key[i]) {
			ord[j] = ord[j - 1];
			j--;
		}
		ord[j] = i;
	}
}

/* Dropped choices and the slots, from idx [k*T] and the BPR keys. */
static int64_t naive_drops(const int32_t *idx, const float *key, int64_t T, int E, int k,
			   int bpr, double x, int64_t *C_out, int32_t *loc)
{
	int64_t *count = calloc((size_t)E, sizeof *count), *ord = malloc(sizeof *ord * T);
	int64_t *fill = calloc((size_t)E, sizeof *fill), dropped = 0;
	for (int64_t i = 0; i < (int64_t)k * T; i++)
		count[idx[i]]++;
	int64_t C = naive_capacity(count, E, T, k, x);
	if (bpr) {
		naive_order(key, T, ord);
	} else {
		for (int64_t t = 0; t < T; t++)
			ord[t] = t;
	}
	for (int r = 0; r < k; r++)
		for (int64_t i = 0; i < T; i++) {
			int64_t t = ord[i];
			int e = idx[r * T + t];
			if (fill[e] < C) {
				loc[r * T + t] = (int32_t)fill[e]++;
			} else {
				loc[r * T + t] = -1;
				dropped++;
			}
		}
	*C_out = C;
	free(count);
	free(ord);
	free(fill);
	return dropped;
}

/* ---- double-precision reference forward ---- */

struct dparams {
	double *wg, *w1, *b1, *w2, *b2;
};

static double *to_double(const float *a, int64_t n)
{
	size_t cnt = n > 0 && n < (1 << 28) ? (size_t)n : 1;
	double *d = calloc(cnt, sizeof(double));
	for (size_t i = 0; i < cnt && (int64_t)i < n; i++)
		d[i] = a[i];
	return d;
}

static double act_d(int gelu, double v)
{
	if (!gelu)
		return v > 0.0 ? v : 0.0;
	const double c = sqrt(2.0 / M_PI);
	return 0.5 * v * (1.0 + tanh(c * (v + 0.044715 * v * v * v)));
}

/* Objective sum(G * y) + aux_w * aux at step 0; the choices (idx) and kept flags are
 * written to sel (k*T ints: expert, or -1 - expert when dropped) so a caller can see
 * whether a perturbation changed the routing. */
static double ref_objective(const struct tcase *c, const struct moe_config *cfg,
			    const struct dparams *p, const double *x, const double *G,
			    double aux_w, double *y_out, int *sel)
{
	const int64_t T = c->T, M = c->M, H = c->H;
	const int E = c->E, k = c->k;
	double *pr = malloc(sizeof(double) * (size_t)(T * E));
	double *q = malloc(sizeof(double) * (size_t)(T * E));
	double *rl = malloc(sizeof(double) * (size_t)(T * E));
	int32_t *idx = calloc((size_t)(k * T), sizeof(int32_t));
	int32_t *loc = calloc((size_t)(k * T), sizeof(int32_t));
	double *score = malloc(sizeof(double) * (size_t)(k * T));
	float *key = calloc((size_t)T, sizeof(float));
	double *hid = malloc(sizeof(double) * (size_t)H);
	double obj = 0.0;

	for (int64_t t = 0; t < T; t++) {
		double mx = -INFINITY, s = 0.0, sq = 0.0, mq = -INFINITY;
		for (int e = 0; e < E; e++) {
			double l = 0.0;
			for (int64_t m = 0; m < M; m++)
				l += x[t * M + m] * p->wg[m * E + e];
			q[t * E + e] = l;
			float nz = cfg->gate_noise > 0.0f
					   ? cfg->gate_noise / (float)E *
						     rng_normal(cfg->seed, RNG_STREAM_NOISE,
								(uint64_t)(t * E + e))
					   : 0.0f;
			rl[t * E + e] = l + nz;
			mx = rl[t * E + e] > mx ? rl[t * E + e] : mx;
			mq = l > mq ? l : mq;
		}
		for (int e = 0; e < E; e++) {
			pr[t * E + e] = exp(rl[t * E + e] - mx);
			s += pr[t * E + e];
			q[t * E + e] = exp(q[t * E + e] - mq);
			sq += q[t * E + e];
		}
		for (int e = 0; e < E; e++) {
			pr[t * E + e] /= s;
			q[t * E + e] /= sq;
		}
		double sum = 0.0;
		for (int r = 0; r < k; r++) {
			int best = -1;
			for (int e = 0; e < E; e++) {
				int taken = 0;
				for (int j = 0; j < r; j++)
					taken |= idx[j * T + t] == e;
				if (!taken && (best < 0 || pr[t * E + e] > pr[t * E + best]))
					best = e;
			}
			idx[r * T + t] = best;
			score[r * T + t] = pr[t * E + best];
			sum += pr[t * E + best];
		}
		if (k > 1)
			for (int r = 0; r < k; r++)
				score[r * T + t] /= sum;
		key[t] = (float)pr[t * E + idx[t]];
	}
	int64_t C;
	naive_drops(idx, key, T, E, k, c->bpr, c->cap, &C, loc);
	for (int64_t t = 0; t < T; t++) {
		for (int64_t m = 0; m < M; m++)
			y_out[t * M + m] = 0.0;
		for (int r = 0; r < k; r++) {
			int e = idx[r * T + t];
			sel[r * T + t] = loc[r * T + t] < 0 ? -1 - e : e;
			if (loc[r * T + t] < 0)
				continue;
			for (int64_t j = 0; j < H; j++) {
				double v = p->b1[e * H + j];
				for (int64_t m = 0; m < M; m++)
					v += x[t * M + m] * p->w1[(e * M + m) * H + j];
				hid[j] = act_d(c->gelu, v);
			}
			for (int64_t m = 0; m < M; m++) {
				double o = p->b2[e * M + m];
				for (int64_t j = 0; j < H; j++)
					o += hid[j] * p->w2[(e * H + j) * M + m];
				y_out[t * M + m] += score[r * T + t] * o;
			}
		}
		for (int64_t m = 0; m < M; m++)
			obj += G[t * M + m] * y_out[t * M + m];
	}
	/* Auxiliary loss. */
	double aux = 0.0;
	if (!c->li) {
		for (int e = 0; e < E; e++) {
			double ce = 0.0, me = 0.0;
			for (int64_t t = 0; t < T; t++) {
				ce += idx[t] == e;
				me += pr[t * E + e];
			}
			aux += (ce / T) * (me / T);
		}
		aux *= E;
	} else {
		double imp[64] = { 0 }, load[64] = { 0 }, sig = cfg->gate_noise / (double)E;
		for (int64_t t = 0; t < T; t++) {
			double thr = rl[t * E + idx[(k - 1) * T + t]];
			for (int e = 0; e < E; e++) {
				imp[e] += q[t * E + e];
				load[e] += 0.5 * erfc(-(q[t * E + e] - thr) / sig / sqrt(2.0));
			}
		}
		for (int w = 0; w < 2; w++) {
			double *v = w ? load : imp, mu = 0.0, var = 0.0;
			for (int e = 0; e < E; e++)
				mu += v[e] / E;
			for (int e = 0; e < E; e++)
				var += (v[e] - mu) * (v[e] - mu) / (E - 1);
			aux += 0.5 * var / (mu * mu + 1e-10);
		}
	}
	obj += aux_w * aux;
	free(pr);
	free(q);
	free(rl);
	free(idx);
	free(loc);
	free(score);
	free(key);
	free(hid);
	return obj;
}

/* ---- one case ---- */

struct bufs {
	struct moe_params p, gs, gd;
	float *x, *y, *yd, *dy, *dx, *dxd;
};

static __attribute__((noinline)) void run_case(struct tcase *c, int fd)
{
	struct moe_config cfg;
	struct moe_layer *l;
	struct bufs b;
	const int64_t T = c->T, M = c->M;
	const float aux_w = 0.3f;

	case_name(c);
	make_cfg(c, &cfg);
	cr_assert_eq(moe_params_alloc(&b.p, &cfg, be), 0);
	cr_assert_eq(moe_params_alloc(&b.gs, &cfg, be), 0);
	cr_assert_eq(moe_params_alloc(&b.gd, &cfg, be), 0);
	cr_assert_eq(moe_params_init(&b.p, &cfg, 11), 0);
	/* 64-byte aligned, so that M % 16 == 0 cases take the streaming-store paths. */
	size_t nb = (sizeof(float) * T * M + 63) / 64 * 64;
	b.x = aligned_alloc(64, nb);
	b.y = aligned_alloc(64, nb);
	b.yd = aligned_alloc(64, nb);
	b.dy = aligned_alloc(64, nb);
	b.dx = aligned_alloc(64, nb);
	b.dxd = aligned_alloc(64, nb);
	rng_fill_normal(b.x, T * M, 0.0f, 1.0f, 3, RNG_STREAM_TEST, 0);
	rng_fill_normal(b.dy, T * M, 0.0f, 1.0f, 4, RNG_STREAM_TEST, 0);

	cr_assert_eq(moe_layer_init(&l, &cfg, be), 0, "%s", c->name);
	/* A first call with other settings, so the real one runs on grown, dirty buffers: top-1
	 * and one slot per expert (1 * int(1.5)), below anything the real call needs, so that
	 * the layer's peak is the real call's. */
	cr_assert_eq(moe_forward(l, &b.p, b.x, b.y, T, 1, 1.5 / (double)((T + c->E - 1) / c->E),
				 5), 0, "%s", c->name);
	cr_assert_eq(moe_layer_routing(l)->C, 1, "%s", c->name);
	if (c->cap != 0.0 && tutel_fixed(T, c->E, c->k, c->cap) == 0) {
		/* The setting leaves no slot (Tutel would drop every token): both refuse. */
		cr_assert_eq(moe_forward(l, &b.p, b.x, b.y, T, c->k, c->cap, 0), CORE_EUSAGE,
			     "%s: a capacity of 0 is not refused", c->name);
		cr_assert_eq(moe_dense_step(&cfg, &b.p, b.x, b.yd, T, c->k, c->cap, 0, b.dy,
					    b.dxd, &b.gd, aux_w, NULL),
			     CORE_EUSAGE, "%s: the dense formulation takes a capacity of 0",
			     c->name);
		c->refused = 1;
		goto done;
	}
	cr_assert_eq(moe_forward(l, &b.p, b.x, b.y, T, c->k, c->cap, 0), 0, "%s", c->name);
	const struct moe_routing *r = moe_layer_routing(l);
	int64_t dropped_s = r->dropped, C_s = r->C;
	float aux_s = r->aux_loss;

	/* Drops and slots against the naive loop (same choices, same keys). */
	int32_t *loc = malloc(sizeof(int32_t) * T * c->k);
	int64_t C_n;
	{
		/* The BPR keys p[t, idx0]: the layer does not expose them, so run the gate here
		 * on logits computed in double (the choices must come out the same). */
		float *logits = malloc(sizeof(float) * T * c->E);
		float *probs = malloc(sizeof(float) * T * c->E);
		float *top = malloc(sizeof(float) * T);
		int32_t *idx = malloc(sizeof(int32_t) * T * c->k);
		float *score = malloc(sizeof(float) * T * c->k), aux;
		const struct backend_moe_gate g = {
			.T = T, .E = c->E, .k = c->k, .noise = cfg.gate_noise, .seed = cfg.seed,
			.step = 0, .load_importance = c->li,
		};
		for (int64_t t = 0; t < T; t++)
			for (int e = 0; e < c->E; e++) {
				double s = 0.0;
				for (int64_t m = 0; m < M; m++)
					s += (double)b.x[t * M + m] * b.p.wg[m * c->E + e];
				logits[t * c->E + e] = (float)s;
			}
		float *clean = c->li ? malloc(sizeof(float) * T * c->E) : NULL;
		cr_assert_eq(be->op->moe_gate_forward(be, &g, logits, probs, clean, top, idx, score,
						      &aux), 0);
		for (int64_t i = 0; i < T * c->k; i++)
			cr_assert_eq(idx[i], r->idx[i], "%s: choice %lld differs", c->name,
				     (long long)i);
		int64_t dn = naive_drops(r->idx, top, T, c->E, c->k, c->bpr, c->cap, &C_n, loc);
		cr_assert_eq(C_s, C_n, "%s: capacity %lld, naive %lld", c->name, (long long)C_s,
			     (long long)C_n);
		cr_assert_eq(dropped_s, dn, "%s: dropped %lld, naive %lld", c->name,
			     (long long)dropped_s, (long long)dn);
		for (int64_t i = 0; i < T * c->k; i++)
			cr_assert_eq(r->loc[i], loc[i], "%s: slot of choice %lld: %d, naive %d",
				     c->name, (long long)i, r->loc[i], loc[i]);
		free(logits);
		free(probs);
		free(top);
		free(idx);
		free(score);
		free(clean);
	}
	free(loc);

	cr_assert_eq(moe_backward(l, &b.p, b.x, b.dy, b.dx, &b.gs, aux_w), 0, "%s", c->name);
	cr_assert_eq(moe_layer_peak_bytes(l), moe_layer_bytes_for(&cfg, T, c->k, C_s, 1), "%s: layer bytes %zu, analytic %zu", c->name,
		     moe_layer_peak_bytes(l), moe_layer_bytes_for(&cfg, T, c->k, C_s, 1));
	{
		/* Without an input gradient the weight gradients are the same, bit for bit. */
		struct moe_params g2;
		cr_assert_eq(moe_params_alloc(&g2, &cfg, be), 0);
		cr_assert_eq(moe_forward(l, &b.p, b.x, b.y, T, c->k, c->cap, 0), 0);
		cr_assert_eq(moe_backward(l, &b.p, b.x, b.dy, NULL, &g2, aux_w), 0, "%s", c->name);
		cr_assert(!memcmp(g2.wg, b.gs.wg, sizeof(float) * M * c->E), "%s: dwg", c->name);
		cr_assert(!memcmp(g2.w1, b.gs.w1, sizeof(float) * c->E * M * c->H), "%s: dw1",
			  c->name);
		cr_assert(!memcmp(g2.b2, b.gs.b2, sizeof(float) * c->E * M), "%s: db2", c->name);
		moe_params_free(&g2);
	}

	/* Dense formulation. */
	struct moe_dense_result dr;
	cr_assert_eq(moe_dense_step(&cfg, &b.p, b.x, b.yd, T, c->k, c->cap, 0, b.dy, b.dxd, &b.gd,
				    aux_w, &dr),
		     0, "%s", c->name);
	const int64_t dropped_d = dr.dropped, C_d = dr.C;
	const float aux_d = dr.aux_loss;
	const size_t peak = dr.peak_bytes;
	cr_assert_eq(C_d, C_s, "%s: dense C %lld, sparse %lld", c->name, (long long)C_d,
		     (long long)C_s);
	cr_assert_eq(dropped_d, dropped_s, "%s: dense dropped %lld, sparse %lld", c->name,
		     (long long)dropped_d, (long long)dropped_s);
	cr_assert_eq(peak, moe_dense_bytes(&cfg, T, c->k, C_d, 1), "%s", c->name);
	cr_assert_float_eq(aux_s, aux_d, 1e-6f * (fabsf(aux_d) + 1.0f), "%s", c->name);
	const int64_t E = c->E, H = c->H;
	struct {
		const char *what;
		const float *a, *b;
		int64_t n;
	} cmp[] = {
		{ "y", b.y, b.yd, T * M },
		{ "dx", b.dx, b.dxd, T * M },
		{ "dwg", b.gs.wg, b.gd.wg, M * E },
		{ "dw1", b.gs.w1, b.gd.w1, E * M * H },
		{ "db1", b.gs.b1, b.gd.b1, E * H },
		{ "dw2", b.gs.w2, b.gd.w2, E * H * M },
		{ "db2", b.gs.b2, b.gd.b2, E * M },
	};
	for (size_t i = 0; i < sizeof cmp / sizeof cmp[0]; i++) {
		double e = rel_err(cmp[i].a, cmp[i].b, cmp[i].n);
		cr_assert(e <= 1e-5, "%s: %s differs from dense by %.3g relative", c->name,
			  cmp[i].what, e);
	}

	if (fd) {
		/* Double-precision reference: output, then central differences. */
		struct dparams dp = { to_double(b.p.wg, M * E), to_double(b.p.w1, E * M * H),
				      to_double(b.p.b1, E * H), to_double(b.p.w2, E * H * M),
				      to_double(b.p.b2, E * M) };
		double *xd = to_double(b.x, T * M), *G = to_double(b.dy, T * M);
		double *yr = malloc(sizeof(double) * T * M);
		int *sel0 = malloc(sizeof(int) * T * c->k), *sel1 = malloc(sizeof(int) * T * c->k);
		ref_objective(c, &cfg, &dp, xd, G, aux_w, yr, sel0);
		double num = 0.0, den = 0.0;
		for (int64_t i = 0; i < T * M; i++) {
			num = fmax(num, fabs(b.y[i] - yr[i]));
			den = fmax(den, fabs(yr[i]));
		}
		cr_assert(num <= 1e-5 * den + 1e-6, "%s: y differs from the double reference by "
			  "%.3g (scale %.3g)", c->name, num, den);
		struct {
			const char *what;
			double *v;
			const float *g;
			int64_t n, stride;
		} fdv[] = {
			{ "dwg", dp.wg, b.gs.wg, M * E, 1 },
			{ "dx", xd, b.dx, T * M, T * M > 24 ? 7 : 1 },
			{ "dw1", dp.w1, b.gs.w1, E * M * H, 5 },
			{ "db2", dp.b2, b.gs.b2, E * M, 3 },
		};
		const double h = 1e-5;
		for (size_t w = 0; w < sizeof fdv / sizeof fdv[0]; w++) {
			int64_t checked = 0, skipped = 0;
			double gmax = 0.0;
			for (int64_t i = 0; i < fdv[w].n; i++)
				gmax = fmax(gmax, fabs(fdv[w].g[i]));
			for (int64_t i = 0; i < fdv[w].n; i += fdv[w].stride) {
				double v0 = fdv[w].v[i];
				fdv[w].v[i] = v0 + h;
				double lp = ref_objective(c, &cfg, &dp, xd, G, aux_w, yr, sel1);
				int same = !memcmp(sel0, sel1, sizeof(int) * T * c->k);
				fdv[w].v[i] = v0 - h;
				double lm = ref_objective(c, &cfg, &dp, xd, G, aux_w, yr, sel1);
				same &= !memcmp(sel0, sel1, sizeof(int) * T * c->k);
				fdv[w].v[i] = v0;
				if (!same) {
					skipped++; /* a routing decision flipped: not differentiable */
					continue;
				}
				double fdg = (lp - lm) / (2.0 * h);
				checked++;
				cr_assert(fabs(fdg - fdv[w].g[i]) <= 1e-3 * gmax + 1e-4,
					  "%s: %s[%lld] = %.6g, finite differences %.6g", c->name,
					  fdv[w].what, (long long)i, (double)fdv[w].g[i], fdg);
			}
			cr_assert(checked >= skipped, "%s: %s: %lld checked, %lld skipped", c->name,
				  fdv[w].what, (long long)checked, (long long)skipped);
		}
		free(dp.wg);
		free(dp.w1);
		free(dp.b1);
		free(dp.w2);
		free(dp.b2);
		free(xd);
		free(G);
		free(yr);
		free(sel0);
		free(sel1);
	}

done:
	moe_layer_free(l);
	moe_params_free(&b.p);
	moe_params_free(&b.gs);
	moe_params_free(&b.gd);
	free(b.x);
	free(b.y);
	free(b.yd);
	free(b.dy);
	free(b.dx);
	free(b.dxd);
}

/* The grid's cases are tiny: on one thread, since on a shared 2-core machine every parallel
 * region of a tiny case can wait a whole time slice for its second thread; larger_case runs
 * the parallel paths. The grid runs on the CPU backend and on the reference backend. */
static void grid_on(double cap, int fd)
{
	static const int64_t Ts[] = { 1, 6, 37 };
	static const int Es[] = { 1, 2, 5 };
	static const int64_t Ms[] = { 3, 8 };
	int n = 0, refused = 0;

	for (size_t a = 0; a < 3; a++)
		for (size_t e = 0; e < 3; e++)
			for (int k = 1; k <= 3 && k <= Es[e]; k++)
				for (size_t m = 0; m < 2; m++)
					for (int bpr = 0; bpr < 2; bpr++) {
						struct tcase c = { .T = Ts[a], .M = Ms[m], .H = 5,
								   .E = Es[e], .k = k, .bpr = bpr,
								   .cap = cap };
						c.gelu = n % 3 == 1;
						c.noise = n % 2 ? 1.5f : 0.0f;
						c.li = c.noise > 0.0f && c.E >= 2 && n % 4 == 1;
						n++;
						run_case(&c, fd && c.T <= 6);
						refused += c.refused;
					}
	cr_assert_eq(n, 72, "the grid ran %d cases, not 72", n);
	cr_assert(refused < n / 2, "%d of %d cases left no slot", refused, n);
}

static void grid(double cap, int fd)
{
	use_backend("cpu", 1);
	grid_on(cap, fd);
	use_backend("ref", 1);
	grid_on(cap, fd);
	backend_close(be);
	be = NULL;
}

Test(moe, grid_factor_1)
{
	grid(1.0, 1);
}

Test(moe, grid_factor_0_6)
{
	grid(0.6, 0);
}

Test(moe, grid_factor_1_7)
{
	grid(1.7, 0);
}

Test(moe, grid_no_drop)
{
	grid(0.0, 1);
}

Test(moe, grid_adaptive_capped)
{
	grid(-0.8, 1);
}

Test(moe, grid_adaptive_loose)
{
	grid(-4.0, 0);
}

static void larger_cases(void)
{
	struct tcase c = { .T = 300, .M = 32, .H = 24, .E = 8, .k = 2, .bpr = 1, .cap = 1.0,
			   .gelu = 1, .noise = 1.0f };
	run_case(&c, 0);
	struct tcase d = { .T = 200, .M = 16, .H = 8, .E = 6, .k = 3, .bpr = 0, .cap = -1.1,
			   .noise = 2.0f, .li = 1 };
	run_case(&d, 0);
	struct tcase e = { .T = 50, .M = 48, .H = 16, .E = 3, .k = 3, .bpr = 1, .cap = 0.0 };
	run_case(&e, 1);
	/* More experts than the CPU backend's skinny gate products take: the BLAS path. */
	struct tcase f = { .T = 40, .M = 4, .H = 4, .E = 70, .k = 2, .bpr = 1, .cap = 1.5 };
	run_case(&f, 0);
	/* More choices per token than the kernels keep on the stack (k > 16). */
	struct tcase h = { .T = 30, .M = 16, .H = 8, .E = 20, .k = 18, .bpr = 1, .cap = -0.8 };
	run_case(&h, 0);
}

Test(moe, larger_case)
{
	use_backend("cpu", 2);
	larger_cases();
	use_backend("ref", 1);
	larger_cases();
	backend_close(be);
	be = NULL;
}

Test(moe, bad_config)
{
	struct moe_config cfg;
	struct moe_layer *l;

	use_backend("cpu", 1);
	moe_config_default(&cfg, 8, 4, 4, 0);
	cr_assert_lt(moe_layer_init(&l, &cfg, be), 0, "E = 0 accepted");
	moe_config_default(&cfg, 8, 4, 4, 2);
	cfg.k = 3;
	cr_assert_lt(moe_layer_init(&l, &cfg, be), 0, "k = 3 > E = 2 accepted");
	cfg.k = 2;
	cfg.loss = MOE_LOSS_LOAD_IMPORTANCE;
	cr_assert_lt(moe_layer_init(&l, &cfg, be), 0, "load-importance without noise accepted");
	cfg.loss = MOE_LOSS_GSHARD;
	cr_assert_eq(moe_layer_init(&l, &cfg, be), 0);
	struct moe_params p;
	cr_assert_eq(moe_params_alloc(&p, &cfg, be), 0);
	float x[9 * 4] = { 0 }, y[9 * 4];
	cr_assert_lt(moe_forward(l, &p, x, y, 9, 2, 1.0, 0), 0, "T above the layer's accepted");
	cr_assert_lt(moe_forward(l, &p, x, y, 8, 3, 1.0, 0), 0, "k > E accepted");
	moe_params_free(&p);
	moe_layer_free(l);
	backend_close(be);
	be = NULL;
}

/* One forward and backward of a layer big enough for every parallel path (T = 512) on a CPU
 * backend of `threads` threads, with the inputs and outputs at byte offset `shift` from a
 * 64-byte boundary; y, dx and every gradient into out (floats, in that order). */
static size_t layer_step(int threads, size_t shift, int64_t M, float *out)
{
	const int64_t T = 512, H = 16;
	const int E = 8;
	struct moe_config cfg;
	struct moe_params p, g;
	struct moe_layer *l;
	const size_t n = (size_t)(T * M), bytes = sizeof(float) * n + 64;
	char *mem[4];
	float *io[4]; /* x, dy, y, dx */

	use_backend("cpu", threads);
	for (int i = 0; i < 4; i++) {
		mem[i] = aligned_alloc(64, (bytes + 63) / 64 * 64);
		io[i] = (float *)(mem[i] + shift);
	}
	rng_fill_normal(io[0], (int64_t)n, 0.0f, 1.0f, 6, RNG_STREAM_TEST, 0);
	rng_fill_normal(io[1], (int64_t)n, 0.0f, 1.0f, 7, RNG_STREAM_TEST, 0);
	moe_config_default(&cfg, T, M, H, E);
	cfg.bpr = 1;
	cfg.gate_noise = 1.0f;
	cfg.act = MOE_ACT_GELU;
	cr_assert_eq(moe_params_alloc(&p, &cfg, be), 0);
	cr_assert_eq(moe_params_alloc(&g, &cfg, be), 0);
	cr_assert_eq(moe_params_init(&p, &cfg, 5), 0);
	cr_assert_eq(moe_layer_init(&l, &cfg, be), 0);
	cr_assert_eq(moe_forward(l, &p, io[0], io[2], T, 2, 1.0, 3), 0);
	cr_assert_eq(moe_backward(l, &p, io[0], io[1], io[3], &g, 0.1f), 0);
	size_t k = 0;
	const struct {
		const float *v;
		size_t n;
	} parts[] = {
		{io[2], n}, {io[3], n}, {g.wg, (size_t)(M * E)}, {g.w1, (size_t)(E * M * H)},
		{g.b1, (size_t)(E * H)}, {g.w2, (size_t)(E * H * M)}, {g.b2, (size_t)(E * M)},
	};
	for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
		memcpy(out + k, parts[i].v, sizeof(float) * parts[i].n);
		k += parts[i].n;
	}
	moe_layer_free(l);
	moe_params_free(&p);
	moe_params_free(&g);
	for (int i = 0; i < 4; i++)
		free(mem[i]);
	backend_close(be);
	be = NULL;
	return k;
}

/* The same inputs give the same bits at any thread count and any buffer alignment: the row
 * kernels schedule dynamically and stream only on aligned rows, which must not matter, and
 * the reductions are in a fixed order. M = 32 streams on aligned buffers, M = 40 never. */
Test(moe, bit_identical_at_any_thread_count_and_alignment)
{
	const int64_t Ms[] = { 32, 40 };
	for (size_t m = 0; m < 2; m++) {
		/* y and dx [T,M]; wg, w1, b1, w2, b2: E (2 M H + H + 2 M) */
		const size_t cap = 2 * 512 * (size_t)Ms[m] + 8 * (34 * (size_t)Ms[m] + 16);
		float *a = malloc(sizeof(float) * cap), *b = malloc(sizeof(float) * cap);
		size_t na = layer_step(2, 0, Ms[m], a);
		cr_assert(na <= cap);
		const struct {
			int threads;
			size_t shift;
		} runs[] = { { 2, 0 }, { 1, 0 }, { 3, 0 }, { 2, 4 }, { 1, 36 }, { 3, 8 } };
		for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
			size_t nb = layer_step(runs[r].threads, runs[r].shift, Ms[m], b);
			cr_assert_eq(na, nb);
			for (size_t i = 0; i < na; i++)
				cr_assert(!memcmp(&a[i], &b[i], sizeof(float)),
					  "M=%lld on %d threads, buffers %zu bytes off alignment: "
					  "output float %zu is %a, %a on 2 threads aligned",
					  (long long)Ms[m], runs[r].threads, runs[r].shift, i,
					  (double)b[i], (double)a[i]);
		}
		free(a);
		free(b);
	}
}
