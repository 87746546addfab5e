/* test_gpt2_grad.c - every backward op of the host backends (cpu and the reference backend
 * ref) against central finite differences, and the whole GPT-2 gradient against finite
 * differences of gpt2_forward's loss, on both.
 *
 * Layer ops: the scalar is L = sum(R * f(inputs)) for a fixed random R (so dL/dout = R), f
 * is a naive double-precision forward written here, and the difference quotient is taken in
 * double (step 1e-5: error ~1e-10), so the reference does not share a line with the code
 * under test. Inputs are floats widened to double, so both see the same point.
 *
 * Model: tiny config (L=2, C=16, NH=2, T=8, V=32, B=2) with weights larger than GPT-2's
 * init so gradients are well above float noise; a random subset of parameters from every
 * tensor, each by a fourth-order difference of the float loss, and the directional
 * derivative along random directions over all parameters. The same with a head over 5
 * classes instead of the 32 tokens (n_out: a window router's model), its targets classes.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "common/err.h"
#include "common/rng.h"
#include "model/gpt2.h"

/* The backend under test: each Test runs its body on cpu (2 threads) and on ref. */
static struct backend *be;

static void on_backend(const char *name, int threads, void (*body)(void))
{
	cr_assert_eq(backend_open(&be, name, &(struct backend_params){.threads = threads}), 0,
		     "%s", name);
	body();
	backend_close(be);
	be = NULL;
}

static void each_backend(void (*body)(void))
{
	on_backend("cpu", 2, body);
	on_backend("ref", 0, body);
}

TestSuite(gpt2_grad, .timeout = 60);

static float *randn(size_t n, float std, uint64_t base)
{
	float *x = malloc(n * sizeof *x + 64);
	cr_assert(x);
	for (size_t i = 0; i < n; i++)
		x[i] = std * rng_normal(11, RNG_STREAM_TEST, base + i);
	return x;
}

static double *widen(const float *x, size_t n)
{
	double *d = malloc(n * sizeof *d + 64);
	cr_assert(d);
	for (size_t i = 0; i < n; i++)
		d[i] = x[i];
	return d;
}

/* A scalar function of the double buffers its context points at. */
typedef double (*scalar_fn)(void *ctx);

/* Central difference of f in element x[i] (restored afterwards). */
static double fd(scalar_fn f, void *ctx, double *x, size_t i)
{
	const double h = 1e-5 * fmax(1.0, fabs(x[i]));
	double s = x[i];
	x[i] = s + h;
	double lp = f(ctx);
	x[i] = s - h;
	double lm = f(ctx);
	x[i] = s;
	return (lp - lm) / (2 * h);
}

/* Every element of an analytic gradient g of buffer x against finite differences. */
static void check_grad(scalar_fn f, void *ctx, double *x, const float *g, size_t n, double atol,
		       double rtol, const char *what)
{
	for (size_t i = 0; i < n; i++) {
		double want = fd(f, ctx, x, i);
		double d = fabs(g[i] - want);
		cr_assert(d <= atol + rtol * fabs(want) && isfinite(g[i]),
			  "%s on %s: element %zu: backward %.9g, finite difference %.9g (diff %.3g)",
			  what, be->name, i, (double)g[i], want, d);
	}
}

/* ---- matmul --------------------------------------------------------------------------- */

struct mm_ctx {
	int N, IC, OC, layout;
	double *x, *w, *b, *R;
};

static double mm_loss(void *p)
{
	struct mm_ctx *c = p;
	double L = 0;
	for (int n = 0; n < c->N; n++)
		for (int o = 0; o < c->OC; o++) {
			double y = c->b ? c->b[o] : 0;
			for (int i = 0; i < c->IC; i++)
				y += c->x[n * c->IC + i] * (c->layout == BACKEND_W_IO
								    ? c->w[i * c->OC + o]
								    : c->w[o * c->IC + i]);
			L += c->R[n * c->OC + o] * y;
		}
	return L;
}

static void check_matmul_backward(int N, int IC, int OC, int layout, int accumulate)
{
	float *x = randn((size_t)N * IC, 1, 0), *w = randn((size_t)IC * OC, 1, 1000),
	      *b = randn(OC, 1, 2000), *R = randn((size_t)N * OC, 1, 3000);
	float *dx = randn((size_t)N * IC, 1, 4000), *dw = malloc(sizeof(float) * IC * OC),
	      *db = malloc(sizeof(float) * OC);
	float *dx0 = malloc(sizeof(float) * N * IC);
	memcpy(dx0, dx, sizeof(float) * N * IC);
	cr_assert_eq(be->op->matmul_backward(be, dx, dw, db, R, x, w, N, IC, OC, layout,
					     accumulate), 0);
	if (accumulate) /* the input gradient was added to what dx held */
		for (int i = 0; i < N * IC; i++)
			dx[i] -= dx0[i];
	struct mm_ctx c = {N,
			   IC,
			   OC,
			   layout,
			   widen(x, (size_t)N * IC),
			   widen(w, (size_t)IC * OC),
			   widen(b, OC),
			   widen(R, (size_t)N * OC)};
	char what[96];
	snprintf(what, sizeof what, "matmul_backward N=%d IC=%d OC=%d layout=%d acc=%d", N, IC, OC,
		 layout, accumulate);
	check_grad(mm_loss, &c, c.x, dx, (size_t)N * IC, 2e-5, 2e-5, what);
	check_grad(mm_loss, &c, c.w, dw, (size_t)IC * OC, 2e-5, 2e-5, what);
	check_grad(mm_loss, &c, c.b, db, OC, 2e-5, 2e-5, what);
	/* NULL outputs are allowed and leave the others alone */
	cr_assert_eq(be->op->matmul_backward(be, NULL, dw, NULL, R, x, w, N, IC, OC, layout, 0),
		     0);
	check_grad(mm_loss, &c, c.w, dw, (size_t)IC * OC, 2e-5, 2e-5, what);
	free(x), free(w), free(b), free(R), free(dx), free(dw), free(db), free(dx0);
	free(c.x), free(c.w), free(c.b), free(c.R);
}

static void matmul_with_bias_on(void)
{
	check_matmul_backward(5, 3, 7, BACKEND_W_IO, 0);
	check_matmul_backward(9, 6, 4, BACKEND_W_IO, 1);
	check_matmul_backward(8, 5, 6, BACKEND_W_OI, 0);
	check_matmul_backward(3, 33, 17, BACKEND_W_OI, 1);
}

Test(gpt2_grad, matmul_with_bias)
{
	each_backend(matmul_with_bias_on);
}

/* ---- layernorm ------------------------------------------------------------------------ */

struct ln_ctx {
	int N, C;
	double *x, *w, *b, *R;
};

static double ln_loss(void *p)
{
	struct ln_ctx *c = p;
	double L = 0;
	for (int n = 0; n < c->N; n++) {
		const double *r = c->x + (size_t)n * c->C;
		double m = 0, v = 0;
		for (int i = 0; i < c->C; i++)
			m += r[i];
		m /= c->C;
		for (int i = 0; i < c->C; i++)
			v += (r[i] - m) * (r[i] - m);
		double s = 1 / sqrt(v / c->C + 1e-5);
		for (int i = 0; i < c->C; i++)
			L += c->R[n * c->C + i] * ((r[i] - m) * s * c->w[i] + c->b[i]);
	}
	return L;
}

static void check_layernorm_backward(int N, int C, int accumulate)
{
	float *x = randn((size_t)N * C, 1.5f, 0), *w = randn(C, 1, 1000), *b = randn(C, 1, 2000);
	float *R = randn((size_t)N * C, 1, 3000);
	float *out = malloc(sizeof(float) * N * C), *mean = malloc(sizeof(float) * N),
	      *rstd = malloc(sizeof(float) * N);
	float *dx = randn((size_t)N * C, 1, 4000), *dx0 = malloc(sizeof(float) * N * C);
	float *dw = malloc(sizeof(float) * C), *db = malloc(sizeof(float) * C);
	memcpy(dx0, dx, sizeof(float) * N * C);
	cr_assert_eq(be->op->layernorm_forward(be, out, mean, rstd, x, w, b, N, C), 0);
	cr_assert_eq(be->op->layernorm_backward(be, dx, dw, db, R, x, w, mean, rstd, N, C,
						accumulate), 0);
	if (accumulate)
		for (int i = 0; i < N * C; i++)
			dx[i] -= dx0[i];
	struct ln_ctx c = {N,           C,           widen(x, (size_t)N * C),
			   widen(w, C), widen(b, C), widen(R, (size_t)N * C)};
	char what[80];
	snprintf(what, sizeof what, "layernorm_backward N=%d C=%d acc=%d", N, C, accumulate);
	check_grad(ln_loss, &c, c.x, dx, (size_t)N * C, 2e-5, 1e-4, what);
	check_grad(ln_loss, &c, c.w, dw, C, 2e-5, 1e-4, what);
	check_grad(ln_loss, &c, c.b, db, C, 2e-5, 1e-4, what);
	free(x), free(w), free(b), free(R), free(out), free(mean), free(rstd);
	free(dx), free(dx0), free(dw), free(db);
	free(c.x), free(c.w), free(c.b), free(c.R);
}

static void layernorm_on(void)
{
	check_layernorm_backward(3, 8, 0);   /* fewer rows than chunks */
	check_layernorm_backward(70, 24, 1); /* several rows per chunk */
	check_layernorm_backward(33, 64, 0);
}

Test(gpt2_grad, layernorm)
{
	each_backend(layernorm_on);
}

/* ---- GELU ----------------------------------------------------------------------------- */

struct gelu_ctx {
	int N, C;
	double *x, *bias, *R;
};

static double gelu_loss(void *p)
{
	struct gelu_ctx *c = p;
	double L = 0;
	for (int n = 0; n < c->N; n++)
		for (int i = 0; i < c->C; i++) {
			double x = c->x[n * c->C + i] + c->bias[i];
			double y =
				0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
			L += c->R[n * c->C + i] * y;
		}
	return L;
}

static double relu_loss(void *p)
{
	struct gelu_ctx *c = p;
	double L = 0;
	for (int n = 0; n < c->N; n++)
		for (int i = 0; i < c->C; i++) {
			double x = c->x[n * c->C + i] + c->bias[i];
			L += c->R[n * c->C + i] * (x > 0 ? x : 0);
		}
	return L;
}

static void gelu_with_bias_on(void)
{
	int N = 13, C = 35;
	float *x = randn((size_t)N * C, 2.5f, 0), *bias = randn(C, 0.5f, 1000),
	      *R = randn((size_t)N * C, 1, 2000);
	x[0] = -12.0f, x[1] = 9.0f, x[2] = 0.0f; /* saturated tails and the origin */
	float *pre = malloc(sizeof(float) * N * C), *out = malloc(sizeof(float) * N * C);
	float *d = malloc(sizeof(float) * N * C), *db = malloc(sizeof(float) * C);
	memcpy(pre, x, sizeof(float) * N * C);
	/* pre = x + bias, what the backward needs */
	cr_assert_eq(be->op->bias_act_forward(be, pre, out, bias, N, C, BACKEND_ACT_GELU), 0);
	memcpy(d, R, sizeof(float) * N * C);
	cr_assert_eq(be->op->act_backward(be, d, db, pre, N, C, BACKEND_ACT_GELU), 0);
	struct gelu_ctx c = {N, C, widen(x, (size_t)N * C), widen(bias, C),
			     widen(R, (size_t)N * C)};
	check_grad(gelu_loss, &c, c.x, d, (size_t)N * C, 1e-6, 2e-5, "act_backward gelu N=13 C=35");
	check_grad(gelu_loss, &c, c.bias, db, C, 1e-5, 2e-5, "act_backward gelu bias N=13 C=35");
	/* relu in place (out = pre), its mask taken from the output; the inputs moved off 0,
	 * where relu has no derivative */
	for (int i = 0; i < N * C; i++) {
		x[i] = fabsf(x[i] + bias[i % C]) < 1e-3f ? 0.5f : x[i];
		c.x[i] = x[i];
	}
	memcpy(pre, x, sizeof(float) * N * C);
	cr_assert_eq(be->op->bias_act_forward(be, pre, pre, bias, N, C, BACKEND_ACT_RELU), 0);
	memcpy(d, R, sizeof(float) * N * C);
	cr_assert_eq(be->op->act_backward(be, d, db, pre, N, C, BACKEND_ACT_RELU), 0);
	check_grad(relu_loss, &c, c.x, d, (size_t)N * C, 1e-6, 2e-5, "relu_backward N=13 C=35");
	check_grad(relu_loss, &c, c.bias, db, C, 1e-5, 2e-5, "relu_backward bias N=13 C=35");
	free(x), free(bias), free(R), free(pre), free(out), free(d), free(db);
	free(c.x), free(c.bias), free(c.R);
}

Test(gpt2_grad, gelu_with_bias)
{
	each_backend(gelu_with_bias_on);
}

/* ---- attention ------------------------------------------------------------------------ */

struct att_ctx {
	int B, T, C, NH;
	double *qkv, *R, *p;
};

static double att_loss(void *ptr)
{
	struct att_ctx *c = ptr;
	int B = c->B, T = c->T, C = c->C, NH = c->NH, hs = C / NH;
	double L = 0, *p = c->p;
	for (int b = 0; b < B; b++)
		for (int h = 0; h < NH; h++)
			for (int i = 0; i < T; i++) {
				const double *q = c->qkv + ((size_t)b * T + i) * 3 * C + h * hs;
				double mx = -INFINITY, sum = 0;
				for (int j = 0; j <= i; j++) { /* causal: keys 0..i only */
					const double *k =
						c->qkv + ((size_t)b * T + j) * 3 * C + C + h * hs;
					double s = 0;
					for (int e = 0; e < hs; e++)
						s += q[e] * k[e];
					p[j] = s / sqrt((double)hs);
					mx = fmax(mx, p[j]);
				}
				for (int j = 0; j <= i; j++)
					sum += p[j] = exp(p[j] - mx);
				for (int e = 0; e < hs; e++) {
					double o = 0;
					for (int j = 0; j <= i; j++)
						o += p[j] / sum *
						     c->qkv[((size_t)b * T + j) * 3 * C + 2 * C +
							    h * hs + e];
					L += c->R[((size_t)b * T + i) * C + h * hs + e] * o;
				}
			}
	return L;
}

static void check_attention_backward(int B, int T, int C, int NH)
{
	size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
	float *qkv = randn(nq, 1, 0), *R = randn(no, 1, 500000);
	float *out = malloc(sizeof(float) * no), *att = malloc(sizeof(float) * B * NH * T * T);
	float *dqkv = malloc(sizeof(float) * nq);
	for (size_t i = 0; i < nq; i++)
		dqkv[i] = NAN; /* every element must be written */
	cr_assert_eq(be->op->attention_forward(be, out, att, qkv, B, T, C, NH), 0);
	cr_assert_eq(be->op->attention_backward(be, dqkv, R, qkv, att, B, T, C, NH), 0);
	struct att_ctx c = {B, T, C, NH, widen(qkv, nq), widen(R, no), malloc(sizeof(double) * T)};
	char what[80];
	snprintf(what, sizeof what, "attention_backward B=%d T=%d C=%d NH=%d", B, T, C, NH);
	check_grad(att_loss, &c, c.qkv, dqkv, nq, 1e-5, 1e-4, what);
	free(qkv), free(R), free(out), free(att), free(dqkv);
	free(c.qkv), free(c.R), free(c.p);
}

static void attention_on(void)
{
	check_attention_backward(2, 5, 8, 2);
	check_attention_backward(1, 1, 4, 2);
}

Test(gpt2_grad, attention)
{
	each_backend(attention_on);
}

static void attention_several_blocks_on(void)
{
	/* T past the attention block (32 or 64): full blocks, a partial one, block-boundary rows */
	check_attention_backward(1, 67, 4, 2);
}

Test(gpt2_grad, attention_several_blocks)
{
	each_backend(attention_several_blocks_on);
}

/* ---- softmax cross-entropy ------------------------------------------------------------ */

struct ce_ctx {
	int N, V;
	double *logits;
	const int32_t *tgt;
};

static double ce_loss(void *p)
{
	struct ce_ctx *c = p;
	double L = 0;
	for (int n = 0; n < c->N; n++) {
		const double *l = c->logits + (size_t)n * c->V;
		double mx = -INFINITY, s = 0;
		for (int j = 0; j < c->V; j++)
			mx = fmax(mx, l[j]);
		for (int j = 0; j < c->V; j++)
			s += exp(l[j] - mx);
		L += -(l[c->tgt[n]] - mx - log(s));
	}
	return L / c->N;
}

static void softmax_crossentropy_on(void)
{
	int N = 7, V = 29;
	float *logits = randn((size_t)N * V, 3, 0), *probs = malloc(sizeof(float) * N * V);
	float *losses = malloc(sizeof(float) * N);
	int32_t tgt[7];
	for (int n = 0; n < N; n++)
		tgt[n] = (int32_t)rng_below(11, RNG_STREAM_TEST, 9000 + n, V);
	memcpy(probs, logits, sizeof(float) * N * V);
	cr_assert_eq(be->op->crossentropy_forward(be, probs, losses, tgt, N, V), 0);
	cr_assert_eq(be->op->crossentropy_backward(be, probs, tgt, N, V, 1.0f / N), 0);
	struct ce_ctx c = {N, V, widen(logits, (size_t)N * V), tgt};
	check_grad(ce_loss, &c, c.logits, probs, (size_t)N * V, 1e-7, 2e-5,
		   "crossentropy_backward N=7 V=29");
	free(logits), free(probs), free(losses), free(c.logits);
}

Test(gpt2_grad, softmax_crossentropy)
{
	each_backend(softmax_crossentropy_on);
}

/* ---- embeddings ----------------------------------------------------------------------- */

struct enc_ctx {
	int B, T, C;
	const int32_t *tok;
	double *wte, *wpe, *R;
};

static double enc_loss(void *p)
{
	struct enc_ctx *c = p;
	double L = 0;
	for (int n = 0; n < c->B * c->T; n++)
		for (int i = 0; i < c->C; i++)
			L += c->R[(size_t)n * c->C + i] * (c->wte[(size_t)c->tok[n] * c->C + i] +
							   c->wpe[(size_t)(n % c->T) * c->C + i]);
	return L;
}

static void embedding_on(void)
{
	int B = 3, T = 6, C = 20, V = 9; /* 18 tokens over 9 ids: repeats and (likely) misses */
	int32_t tok[18];
	for (int n = 0; n < B * T; n++)
		tok[n] = (int32_t)rng_below(11, RNG_STREAM_TEST, 7000 + n, V - 1); /* id 8 unused */
	float *wte = randn((size_t)V * C, 1, 0), *wpe = randn((size_t)T * C, 1, 1000),
	      *R = randn((size_t)B * T * C, 1, 2000);
	float *dwte = randn((size_t)V * C, 1, 3000), *dwpe = randn((size_t)T * C, 1, 4000);
	cr_assert_eq(be->op->encoder_backward(be, dwte, dwpe, R, tok, B, T, C, V), 0);
	struct enc_ctx c = {B,
			    T,
			    C,
			    tok,
			    widen(wte, (size_t)V * C),
			    widen(wpe, (size_t)T * C),
			    widen(R, (size_t)B * T * C)};
	check_grad(enc_loss, &c, c.wte, dwte, (size_t)V * C, 1e-5, 1e-5, "encoder_backward wte");
	check_grad(enc_loss, &c, c.wpe, dwpe, (size_t)T * C, 1e-5, 1e-5, "encoder_backward wpe");
	for (int i = 0; i < C; i++)
		cr_assert(dwte[8 * C + i] == 0.0f, "unused token row not zeroed");
	free(wte), free(wpe), free(R), free(dwte), free(dwpe);
	free(c.wte), free(c.wpe), free(c.R);
}

Test(gpt2_grad, embedding)
{
	each_backend(embedding_on);
}

/* ---- the whole model ------------------------------------------------------------------ */

static const struct model_config tiny = {.n_layer = 2, .n_embd = 16, .n_head = 2,
					 .seq_len = 8, .vocab_size = 32, .n_out = 0};
/* a window router's model: the same blocks, a head over 5 classes */
static const struct model_config tiny_router = {.n_layer = 2, .n_embd = 16, .n_head = 2,
						.seq_len = 8, .vocab_size = 32, .n_out = 5};
static const struct model_config *cur = &tiny; /* the model the tests below build */
enum { TB = 2, TT = 8 };

/* Weights N(0, 0.15) (LayerNorm weights 1 + N(0, 0.15)) so the gradients stand well clear
 * of float rounding in the loss. */
static void tiny_model(struct gpt2 *g, int32_t *x, int32_t *y)
{
	cr_assert_eq(gpt2_create(g, cur, TB, TT, be), 0);
	for (size_t i = 0; i < g->nparams; i++)
		g->params[i] = 0.15f * rng_normal(3, RNG_STREAM_TEST, i);
	for (int v = 0; v < g->nviews; v++)
		if (strstr(g->views[v].name, "ln_") && strstr(g->views[v].name, ".weight")) {
			float *w = g->views[v].data;
			for (int64_t i = 0; i < tensor_numel(&g->views[v]); i++)
				w[i] += 1.0f;
		}
	for (int n = 0; n < TB * TT; n++) {
		x[n] = (int32_t)rng_below(3, RNG_STREAM_TEST, 100000 + n, tiny.vocab_size);
		y[n] = (int32_t)rng_below(3, RNG_STREAM_TEST, 200000 + n,
					  (uint64_t)model_n_out(cur));
	}
}

static double model_loss(struct gpt2 *g, const int32_t *x, const int32_t *y)
{
	float loss;
	cr_assert_eq(gpt2_forward(g, x, y, TB, TT, &loss), 0);
	return loss;
}

/* Fourth-order central difference: error O(h^4) from truncation, so h can be large enough
 * that float rounding in the loss (~1e-7 relative) stays small after division by h. */
static double model_fd(struct gpt2 *g, const int32_t *x, const int32_t *y, float *p, float h)
{
	float s = *p;
	*p = s + 2 * h;
	double l2 = model_loss(g, x, y);
	*p = s + h;
	double l1 = model_loss(g, x, y);
	*p = s - h;
	double m1 = model_loss(g, x, y);
	*p = s - 2 * h;
	double m2 = model_loss(g, x, y);
	*p = s;
	return (-l2 + 8 * l1 - 8 * m1 + m2) / (12.0 * h);
}

static void whole_model_random_parameters_on(void)
{
	struct gpt2 g;
	int32_t x[TB * TT], y[TB * TT];
	tiny_model(&g, x, y);
	model_loss(&g, x, y);
	cr_assert_eq(gpt2_backward(&g), 0);
	float *grad = malloc(sizeof(float) * g.nparams);
	memcpy(grad, g.grads, sizeof(float) * g.nparams);
	double num = 0, den = 0;
	int checked = 0;
	for (int v = 0; v < g.nviews; v++) {
		struct tensor *t = &g.views[v];
		size_t base = (size_t)((float *)t->data - g.params), n = (size_t)tensor_numel(t);
		for (int k = 0; k < 4; k++) {
			size_t i = base + rng_below(5, RNG_STREAM_TEST, (uint64_t)v * 16 + k, n);
			if (t == &g.views[1]) /* wpe: rows past T = 8 would get no gradient */
				i = base + rng_below(5, RNG_STREAM_TEST, (uint64_t)v * 16 + k,
						     (size_t)TT * tiny.n_embd);
			double want = model_fd(&g, x, y, &g.params[i], 1e-2f);
			double d = fabs(grad[i] - want);
			cr_assert(d <= 2e-4 + 2e-2 * fabs(want),
				  "model L=2 C=16 NH=2 T=8 V=32 out=%d B=2: %s[%zu]: backward "
				  "%.7g, finite difference %.7g", model_n_out(cur),
				  t->name, i - base, (double)grad[i], want);
			num += (grad[i] - want) * (grad[i] - want);
			den += want * want;
			checked++;
		}
	}
	cr_assert(sqrt(num / den) < 5e-3, "model gradient: relative error %.3g over %d parameters",
		  sqrt(num / den), checked);
	free(grad);
	gpt2_free(&g);
}

Test(gpt2_grad, whole_model_random_parameters)
{
	each_backend(whole_model_random_parameters_on);
}

static void whole_model_directional_derivative_on(void)
{
	struct gpt2 g;
	int32_t x[TB * TT], y[TB * TT];
	tiny_model(&g, x, y);
	model_loss(&g, x, y);
	cr_assert_eq(gpt2_backward(&g), 0);
	float *grad = malloc(sizeof(float) * g.nparams), *p0 = malloc(sizeof(float) * g.nparams);
	float *u = malloc(sizeof(float) * g.nparams);
	memcpy(grad, g.grads, sizeof(float) * g.nparams);
	memcpy(p0, g.params, sizeof(float) * g.nparams);
	for (int dir = 0; dir < 3; dir++) {
		double gu = 0;
		for (size_t i = 0; i < g.nparams; i++) {
			u[i] = rng_normal(9, RNG_STREAM_TEST, (uint64_t)dir * g.nparams + i);
			gu += (double)grad[i] * u[i];
		}
		/* L(p0 + e u), fourth order in e */
		double e = 2e-3, l[4], es[4] = {2, 1, -1, -2};
		for (int k = 0; k < 4; k++) {
			for (size_t i = 0; i < g.nparams; i++)
				g.params[i] = p0[i] + (float)(es[k] * e) * u[i];
			l[k] = model_loss(&g, x, y);
		}
		memcpy(g.params, p0, sizeof(float) * g.nparams);
		double want = (-l[0] + 8 * l[1] - 8 * l[2] + l[3]) / (12 * e);
		cr_assert(fabs(gu - want) <= 1e-3 * fabs(want) + 1e-4,
			  "model gradient along direction %d: g.u = %.7g, finite difference %.7g",
			  dir, gu, want);
	}
	free(grad), free(p0), free(u);
	gpt2_free(&g);
}

Test(gpt2_grad, whole_model_directional_derivative)
{
	each_backend(whole_model_directional_derivative_on);
}

/* n_out = 5: lm_head is [5, C], the loss a cross-entropy over the 5 classes, and the
 * gradient still that of the loss (a class >= 5 is refused as a target, a token < 32 taken
 * as an input). */
static void router_head_on(void)
{
	struct gpt2 g;
	int32_t x[TB * TT], y[TB * TT];
	tiny_model(&g, x, y);
	const struct tensor *h = gpt2_find(&g, "lm_head.weight");
	cr_assert(h && h->ne[0] == 5 && h->ne[1] == 16, "lm_head is not [5, 16]");
	float logits[TB * TT * 5];
	cr_assert_eq(gpt2_forward_logits(&g, x, TB, TT, logits), 0);
	y[3] = 5;
	cr_expect_eq(gpt2_forward(&g, x, y, TB, TT, NULL), CORE_EUSAGE, "target 5 of 5 classes");
	gpt2_free(&g);
	whole_model_random_parameters_on();
	whole_model_directional_derivative_on();
}

Test(gpt2_grad, head_over_classes)
{
	cur = &tiny_router;
	each_backend(router_head_on);
	cur = &tiny;
}

static void deterministic_and_shorter_sequences_on(void)
{
	struct gpt2 g;
	int32_t x[TB * TT], y[TB * TT];
	tiny_model(&g, x, y);
	float l1, l2;
	cr_assert_eq(gpt2_forward(&g, x, y, TB, TT, &l1), 0);
	cr_assert_eq(gpt2_backward(&g), 0);
	float *g1 = malloc(sizeof(float) * g.nparams);
	memcpy(g1, g.grads, sizeof(float) * g.nparams);
	cr_assert_eq(gpt2_forward(&g, x, y, TB, TT, &l2), 0);
	cr_assert_eq(gpt2_backward(&g), 0);
	cr_assert(l1 == l2 && memcmp(g1, g.grads, sizeof(float) * g.nparams) == 0,
		  "two identical steps differ");
	/* a shorter batch (T=5 < capacity 8): wpe rows 5..7 get exactly zero gradient, and the
	 * loss equals the mean of the per-position losses */
	cr_assert_eq(gpt2_forward(&g, x, y, 1, 5, &l1), 0);
	float ls[5];
	cr_assert_eq(gpt2_losses(&g, ls), 0);
	double s = 0;
	for (int n = 0; n < 5; n++)
		s += ls[n];
	cr_assert(fabs(s / 5 - l1) < 1e-6);
	cr_assert_eq(gpt2_backward(&g), 0);
	const float *dwpe = g.grads + ((float *)gpt2_find(&g, "wpe.weight")->data - g.params);
	for (int i = 5 * tiny.n_embd; i < 8 * tiny.n_embd; i++)
		cr_assert(dwpe[i] == 0.0f, "wpe gradient %d = %g past T", i, (double)dwpe[i]);
	cr_assert_lt(gpt2_backward(&g), 0, "a second backward without forward accepted");
	/* grad norm in double against a loop */
	double ss = 0;
	for (size_t i = 0; i < g.nparams; i++)
		ss += (double)g.grads[i] * g.grads[i];
	float norm;
	cr_assert_eq(gpt2_grad_norm(&g, &norm), 0);
	cr_assert(fabs(norm - sqrt(ss)) <= 1e-6 * sqrt(ss));
	free(g1);
	gpt2_free(&g);
}

Test(gpt2_grad, deterministic_and_shorter_sequences)
{
	each_backend(deterministic_and_shorter_sequences_on);
}

/* Same inputs give the same bits at any thread count, with the work really split (sizes
 * where every op runs in parallel): no reduction depends on the split or the scheduling.
 * Two AdamW steps of model cfg on the cpu backend with that many threads. */
/* Two training steps on cpu; acts: gpt2_bf16_activations(acts) when >= 0, else the
 * default. */
static void train_steps_in(const struct model_config *cfg, float *out, size_t *n, size_t cap,
			   int threads, enum backend_precision prec, int acts)
{
	struct gpt2 g;
	int B = 4, T = 64;
	int32_t x[256], y[256];
	struct backend *cpu;
	cr_assert_eq(backend_open(&cpu, "cpu", &(struct backend_params){.threads = threads,
									 .precision = prec}),
		     0, "%s", err_detail());
	cr_assert_eq(gpt2_create(&g, cfg, B, T, cpu), 0, "%s", err_detail());
	if (acts >= 0)
		cr_assert_eq(gpt2_bf16_activations(&g, acts), 0, "%s", err_detail());
	cr_assert_eq(gpt2_init_params(&g, 5), 0);
	for (int i = 0; i < B * T; i++) {
		x[i] = (int32_t)rng_below(5, RNG_STREAM_TEST, i, 64);
		y[i] = (int32_t)rng_below(6, RNG_STREAM_TEST, i, 64);
	}
	struct adamw_config opt = {0.9, 0.95, 1e-8, 0.1};
	float loss, norm;
	for (int t = 1; t <= 2; t++) {
		cr_assert_eq(gpt2_forward(&g, x, y, B, T, &loss), 0);
		cr_assert_eq(gpt2_backward(&g), 0);
		cr_assert_eq(gpt2_grad_norm(&g, &norm), 0);
		cr_assert_eq(gpt2_adamw_step(&g, &opt, 1e-2, t, 1.0f / (1.0f + norm)), 0);
	}
	cr_assert(2 * g.nparams <= cap);
	memcpy(out, g.params, sizeof(float) * g.nparams);
	memcpy(out + g.nparams, g.grads, sizeof(float) * g.nparams);
	*n = 2 * g.nparams;
	gpt2_free(&g);
	backend_close(cpu);
}

static void train_steps(const struct model_config *cfg, float *out, size_t *n, size_t cap,
			int threads)
{
	train_steps_in(cfg, out, n, cap, threads, BACKEND_FP32, -1);
}

static void bit_identical(const struct model_config *cfg, size_t cap, const char *what)
{
	size_t n1, n2;
	float *a = malloc(sizeof(float) * cap), *b = malloc(sizeof(float) * cap);
	train_steps(cfg, a, &n1, cap, 2);
	for (int threads = 1; threads <= 3; threads++) {
		train_steps(cfg, b, &n2, cap, threads);
		cr_assert(n1 == n2 && memcmp(a, b, sizeof(float) * n1) == 0,
			  "2 training steps of %s on %d threads differ from 2 threads", what,
			  threads);
	}
	free(a);
	free(b);
}

Test(gpt2_grad, bit_identical_at_any_thread_count)
{
	const struct model_config cfg = {.n_layer = 2, .n_embd = 64, .n_head = 2,
					 .seq_len = 64, .vocab_size = 64};
	bit_identical(&cfg, 300000, "L=2 C=64 NH=2 T=64 B=4 V=64");
}

/* The same with MoE MLPs (block 1: 8 experts, top-2, capacity 1, batch-prioritized). */
Test(gpt2_grad, moe_bit_identical_at_any_thread_count)
{
	struct model_config cfg = {.n_layer = 2, .n_embd = 64, .n_head = 2, .seq_len = 64,
				   .vocab_size = 64};
	cfg.moe = (struct model_moe){.experts = 8, .top_k = 2, .every = 2, .capacity_factor = 1.0,
				     .aux_weight = 0.01, .bpr = 1};
	bit_identical(&cfg, 1200000, "the MoE model");
}

/* In bf16, the activations that feed only products kept in bfloat16 (gpt2_bf16_activations,
 * the default there) train to the bits of the float activations the products round: a dense
 * model and one with an MoE block (whose ln_2 stays float), at 1 and 3 threads. C = 96 and
 * V = 80 keep some products above the skinny loops' 64 columns and some below. */
Test(gpt2_grad, bf16_activations_change_no_bit)
{
	struct backend *probe = NULL;
	if (backend_open(&probe, "cpu", &(struct backend_params){.precision = BACKEND_BF16}) < 0) {
		fprintf(stderr, "test_gpt2_grad: bf16_activations_change_no_bit: SKIPPED (%s)\n",
			err_detail());
		return;
	}
	cr_assert(probe->op->matmul_forward_bf16, "cpu in bf16 keeps bfloat16 activations");
	backend_close(probe);
	struct model_config dense = {.n_layer = 2, .n_embd = 96, .n_head = 2, .seq_len = 64,
				     .vocab_size = 80};
	struct model_config moe = dense;
	moe.moe = (struct model_moe){.experts = 4, .top_k = 2, .every = 2, .capacity_factor = 1.0,
				     .aux_weight = 0.01};
	const struct model_config *cfgs[] = {&dense, &moe};
	const size_t cap = 2000000;
	float *a = malloc(sizeof(float) * cap), *b = malloc(sizeof(float) * cap);
	cr_assert(a && b);
	for (int c = 0; c < 2; c++)
		for (int threads = 1; threads <= 3; threads += 2) {
			size_t n1, n2;
			train_steps_in(cfgs[c], a, &n1, cap, threads, BACKEND_BF16, 0);
			train_steps_in(cfgs[c], b, &n2, cap, threads, BACKEND_BF16, 1);
			cr_assert(n1 == n2 && memcmp(a, b, sizeof(float) * n1) == 0,
				  "%s, %d threads: 2 bf16 steps with bfloat16 activations differ from "
				  "2 with float ones", c ? "MoE" : "dense", threads);
		}
	/* and the float run is another one: the test compares two different paths */
	size_t n1, n2;
	train_steps_in(&dense, a, &n1, cap, 1, BACKEND_BF16, 1);
	train_steps_in(&dense, b, &n2, cap, 1, BACKEND_FP32, -1);
	cr_assert(memcmp(a, b, sizeof(float) * n1) != 0, "bf16 training equals fp32's");
	/* and on fp32 the switch is refused */
	struct backend *f32;
	struct gpt2 g;
	cr_assert_eq(backend_open(&f32, "cpu", NULL), 0);
	cr_assert_eq(gpt2_create(&g, &dense, 4, 64, f32), 0);
	cr_assert_eq(g.acts_bf16, 0);
	cr_assert_eq(gpt2_bf16_activations(&g, 1), CORE_EUSAGE);
	cr_assert(strstr(err_detail(), "fp32"), "%s", err_detail());
	gpt2_free(&g);
	backend_close(f32);
	free(a), free(b);
}
