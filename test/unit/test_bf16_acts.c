/* test_bf16_acts.c - the bfloat16-activation ops of backend.h (layernorm_forward_bf16 and the
 * others) against their float ops: the producers' out must be the float op's out rounded to
 * bfloat16 (to nearest even: backend_bf16_from_float, written independently of the backend's
 * vector rounding), and every other output the same bits; the products on x in bfloat16
 * must give the float op's bits on x widened. In BACKEND_BF16 that is what makes a model
 * that uses them train to the same bits as one that does not, so equality, not a tolerance.
 * The float ops themselves are checked against the reference backend in test_backend.c.
 *
 * Every backend that has the ops runs, in each precision it has (cpu: fp32 and, where the
 * CPU has AVX512_BF16, bf16), at 1 and 3 threads; shapes cover the products' blocks of rows
 * and of columns, both weight layouts, the skinny loops (OC <= 64), and attention with one
 * and several blocks of queries.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "common/err.h"
#include "common/rng.h"
#include "common/banned.h"

TestSuite(bf16_acts, .timeout = 120);

/* n N(0, s) draws into host memory from stream draw */
static float *draws(size_t n, double s, uint64_t draw)
{
	float *x = malloc(sizeof *x * (n ? n : 1));
	cr_assert(x);
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(s * rng_normal(41, RNG_STREAM_TEST, draw + i));
	return x;
}

static uint16_t *rounded(const float *x, size_t n)
{
	uint16_t *h = malloc(sizeof *h * (n ? n : 1));
	cr_assert(h);
	for (size_t i = 0; i < n; i++)
		h[i] = backend_bf16_from_float(x[i]);
	return h;
}

static float *widened(const uint16_t *h, size_t n)
{
	float *x = malloc(sizeof *x * (n ? n : 1));
	cr_assert(x);
	for (size_t i = 0; i < n; i++)
		x[i] = backend_bf16_to_float(h[i]);
	return x;
}

/* backend memory holding a copy of n bytes of host (or 0xff bytes when host is NULL) */
static void *dev(struct backend *be, const void *host, size_t n)
{
	void *p;
	cr_assert_eq(be->op->alloc(be, &p, n ? n : 4), 0);
	if (host)
		cr_assert_eq(be->op->upload(be, p, host, n), 0);
	else
		cr_assert_eq(be->op->memset(be, p, 0xff, n), 0);
	return p;
}

static void *back(struct backend *be, const void *p, size_t n)
{
	void *h = malloc(n ? n : 4);
	cr_assert(h);
	cr_assert_eq(be->op->download(be, h, p, n), 0);
	return h;
}

static void same(const void *a, const void *b, size_t n, const char *what, const char *who)
{
	const unsigned char *x = a, *y = b;
	for (size_t i = 0; i < n; i++)
		cr_assert(x[i] == y[i], "%s: %s differs from the float op at byte %zu", who, what, i);
}

/* the float op's out [n] rounded, against the bf16 op's out16 */
static void same_rounded(struct backend *be, const void *out, const void *out16, size_t n,
			 const char *who)
{
	float *f = back(be, out, 4 * n);
	uint16_t *h = back(be, out16, 2 * n), *want = rounded(f, n);
	for (size_t i = 0; i < n; i++)
		cr_assert(h[i] == want[i], "%s: out[%zu] = 0x%04x, the float op's %a rounds to 0x%04x",
			  who, i, h[i], (double)f[i], want[i]);
	free(f), free(h), free(want);
}

static void layernorms(struct backend *be, const char *who)
{
	static const int shapes[][2] = {{1, 8}, {37, 48}, {130, 256}, {5, 1000}};
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		const int N = shapes[s][0], C = shapes[s][1];
		const size_t n = (size_t)N * C;
		float *x = draws(n, 1, 0), *r = draws(n, 1, n), *k = draws(n, 1, 2 * n);
		float *w = draws((size_t)C, 0.5, 3 * n), *b = draws((size_t)C, 0.5, 4 * n);
		void *dx = dev(be, x, 4 * n), *dw = dev(be, w, 4 * C), *db = dev(be, b, 4 * C);
		void *dk = dev(be, k, 4 * n), *dbias = dev(be, b, 4 * C);
		for (int res = 0; res < 2; res++) {
			void *o = dev(be, NULL, 4 * n), *o16 = dev(be, NULL, 2 * n);
			void *m[2], *rs[2], *rr[2];
			for (int v = 0; v < 2; v++) {
				m[v] = dev(be, NULL, 4 * N), rs[v] = dev(be, NULL, 4 * N);
				rr[v] = dev(be, r, 4 * n);
			}
			char w2[160];
			snprintf(w2, sizeof w2, "%s %slayernorm_forward_bf16 N %d C %d", who,
				 res ? "residual_" : "", N, C);
			if (res) {
				cr_assert_eq(be->op->residual_layernorm_forward(be, rr[0], o, m[0], rs[0],
						dk, s % 2 ? dbias : NULL, dw, db, N, C), 0);
				cr_assert_eq(be->op->residual_layernorm_forward_bf16(be, rr[1], o16,
						m[1], rs[1], dk, s % 2 ? dbias : NULL, dw, db, N, C),
					     0, "%s: %s", w2, err_detail());
			} else {
				cr_assert_eq(be->op->layernorm_forward(be, o, m[0], rs[0], dx, dw, db,
								       N, C), 0);
				cr_assert_eq(be->op->layernorm_forward_bf16(be, o16, m[1], rs[1], dx, dw,
									    db, N, C),
					     0, "%s: %s", w2, err_detail());
			}
			same_rounded(be, o, o16, n, w2);
			void *pairs[][2] = {{m[0], m[1]}, {rs[0], rs[1]}, {rr[0], rr[1]}};
			const char *names[] = {"mean", "rstd", "res"};
			for (int i = 0; i < 3; i++) {
				size_t bytes = i < 2 ? 4 * (size_t)N : 4 * n;
				void *a = back(be, pairs[i][0], bytes), *c = back(be, pairs[i][1], bytes);
				same(a, c, bytes, names[i], w2);
				free(a), free(c);
			}
			be->op->free(be, o), be->op->free(be, o16);
			for (int v = 0; v < 2; v++)
				be->op->free(be, m[v]), be->op->free(be, rs[v]), be->op->free(be, rr[v]);
		}
		void *all[] = {dx, dw, db, dk, dbias};
		for (size_t i = 0; i < 5; i++)
			be->op->free(be, all[i]);
		free(x), free(r), free(k), free(w), free(b);
	}
}

static void activations(struct backend *be, const char *who)
{
	static const int shapes[][2] = {{1, 16}, {33, 100}, {64, 1024}};
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
		for (int act = 0; act < 2; act++) {
			const int N = shapes[s][0], C = shapes[s][1];
			const size_t n = (size_t)N * C;
			enum backend_act a = act ? BACKEND_ACT_RELU : BACKEND_ACT_GELU;
			float *p = draws(n, 2, 5 * n), *b = draws((size_t)C, 0.5, 6 * n);
			void *p0 = dev(be, p, 4 * n), *p1 = dev(be, p, 4 * n), *db = dev(be, b, 4 * C);
			void *o = dev(be, NULL, 4 * n), *o16 = dev(be, NULL, 2 * n);
			char w2[160];
			snprintf(w2, sizeof w2, "%s bias_act_forward_bf16 (%s) N %d C %d", who,
				 act ? "relu" : "gelu", N, C);
			cr_assert_eq(be->op->bias_act_forward(be, p0, o, db, N, C, a), 0);
			cr_assert_eq(be->op->bias_act_forward_bf16(be, p1, o16, db, N, C, a), 0,
				     "%s: %s", w2, err_detail());
			same_rounded(be, o, o16, n, w2);
			float *q0 = back(be, p0, 4 * n), *q1 = back(be, p1, 4 * n);
			same(q0, q1, 4 * n, "pre", w2);
			void *all[] = {p0, p1, db, o, o16};
			for (size_t i = 0; i < 5; i++)
				be->op->free(be, all[i]);
			free(p), free(b), free(q0), free(q1);
		}
}

static void attentions(struct backend *be, const char *who)
{
	static const int shapes[][4] = {{2, 37, 48, 3}, {1, 300, 64, 2}, {3, 1, 32, 4}};
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		const int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], NH = shapes[s][3];
		const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
		const size_t na = (size_t)B * NH * T * T;
		float *q = draws(nq, 1, 7 * nq);
		void *dq = dev(be, q, 4 * nq), *o = dev(be, NULL, 4 * no), *o16 = dev(be, NULL, 2 * no);
		void *a0 = dev(be, NULL, 4 * na), *a1 = dev(be, NULL, 4 * na);
		char w2[160];
		snprintf(w2, sizeof w2, "%s attention_forward_bf16 B %d T %d C %d NH %d", who, B, T,
			 C, NH);
		cr_assert_eq(be->op->attention_forward(be, o, a0, dq, B, T, C, NH), 0);
		cr_assert_eq(be->op->attention_forward_bf16(be, o16, a1, dq, B, T, C, NH), 0,
			     "%s: %s", w2, err_detail());
		same_rounded(be, o, o16, no, w2);
		float *x0 = back(be, a0, 4 * na), *x1 = back(be, a1, 4 * na);
		same(x0, x1, 4 * na, "att", w2);
		void *all[] = {dq, o, o16, a0, a1};
		for (size_t i = 0; i < 5; i++)
			be->op->free(be, all[i]);
		free(q), free(x0), free(x1);
	}
}

/* (N, IC, OC): blocks of rows and of columns of each product, the skinny loops (OC <= 64),
 * one row, and the widths gpt-tiny's products have */
static const int mm_shapes[][3] = {{512, 256, 768}, {512, 1024, 256}, {64, 48, 600},
				   {300, 96, 40}, {1, 64, 130}, {700, 130, 17}, {2048, 256, 256}};

static void matmuls(struct backend *be, const char *who)
{
	for (size_t s = 0; s < sizeof mm_shapes / sizeof mm_shapes[0]; s++)
		for (int lay = 0; lay < 2; lay++) {
			const int N = mm_shapes[s][0], IC = mm_shapes[s][1], OC = mm_shapes[s][2];
			const enum backend_wlayout L = lay ? BACKEND_W_OI : BACKEND_W_IO;
			const size_t nx = (size_t)N * IC, nw = (size_t)IC * OC, ny = (size_t)N * OC;
			const uint64_t d = 1000003 * s + 17 * lay;
			float *x = draws(nx, 1, d), *w = draws(nw, 0.5, d + nx);
			float *bias = draws((size_t)OC, 0.5, d + nx + nw), *dy = draws(ny, 1, d + 3 * nx);
			float *dx0 = draws(nx, 1, d + 5 * nx);
			uint16_t *xh = rounded(x, nx);
			float *xw = widened(xh, nx);
			void *X = dev(be, xw, 4 * nx), *XH = dev(be, xh, 2 * nx), *W = dev(be, w, 4 * nw);
			void *BI = dev(be, bias, 4 * (size_t)OC), *DY = dev(be, dy, 4 * ny);
			char w2[200];
			snprintf(w2, sizeof w2, "%s matmul_*_bf16 N %d IC %d OC %d %s", who, N, IC, OC,
				 lay ? "OI" : "IO");
			/* forward, with and without a bias */
			for (int hb = 0; hb < 2; hb++) {
				void *y0 = dev(be, NULL, 4 * ny), *y1 = dev(be, NULL, 4 * ny);
				cr_assert_eq(be->op->matmul_forward(be, y0, X, W, hb ? BI : NULL, N, IC,
								    OC, L), 0);
				cr_assert_eq(be->op->matmul_forward_bf16(be, y1, XH, W, hb ? BI : NULL, N,
									 IC, OC, L), 0,
					     "%s: %s", w2, err_detail());
				float *a = back(be, y0, 4 * ny), *b = back(be, y1, 4 * ny);
				same(a, b, 4 * ny, hb ? "y (with bias)" : "y", w2);
				free(a), free(b);
				be->op->free(be, y0), be->op->free(be, y1);
			}
			/* backward: everything wanted (overwriting, then accumulating dx), dw only */
			for (int v = 0; v < 3; v++) {
				void *g[2][3];
				for (int k = 0; k < 2; k++) {
					g[k][0] = v == 2 ? NULL : dev(be, dx0, 4 * nx);
					g[k][1] = dev(be, NULL, 4 * nw);
					g[k][2] = v == 2 ? NULL : dev(be, NULL, 4 * (size_t)OC);
				}
				cr_assert_eq(be->op->matmul_backward(be, g[0][0], g[0][1], g[0][2], DY, X,
								     W, N, IC, OC, L, v == 1), 0);
				cr_assert_eq(be->op->matmul_backward_bf16(be, g[1][0], g[1][1], g[1][2],
									  DY, XH, W, N, IC, OC, L,
									  v == 1), 0,
					     "%s: %s", w2, err_detail());
				const size_t bytes[3] = {4 * nx, 4 * nw, 4 * (size_t)OC};
				const char *names[3] = {"dx", "dw", "dbias"};
				for (int k = 0; k < 3; k++) {
					if (!g[0][k])
						continue;
					void *a = back(be, g[0][k], bytes[k]), *b = back(be, g[1][k], bytes[k]);
					same(a, b, bytes[k], names[k], w2);
					free(a), free(b);
					be->op->free(be, g[0][k]), be->op->free(be, g[1][k]);
				}
			}
			void *all[] = {X, XH, W, BI, DY};
			for (size_t i = 0; i < 5; i++)
				be->op->free(be, all[i]);
			free(x), free(w), free(bias), free(dy), free(dx0), free(xh), free(xw);
		}
}

Test(bf16_acts, each_op_is_its_float_op_rounded)
{
	static const enum backend_precision precs[] = {BACKEND_FP32, BACKEND_BF16};
	char list[256], *save = NULL;
	int ran = 0;
	snprintf(list, sizeof list, "%s", backend_names());
	for (char *name = strtok_r(list, ", ", &save); name; name = strtok_r(NULL, ", ", &save))
		for (size_t p = 0; p < 2; p++)
			for (int threads = 1; threads <= 3; threads += 2) {
				struct backend *be = NULL;
				struct backend_params par = {.threads = threads, .precision = precs[p]};
				if (backend_open(&be, name, &par) < 0)
					continue; /* not built here, no such precision, no device */
				if (!be->op->matmul_forward_bf16) {
					backend_close(be);
					continue;
				}
				cr_assert(be->op->layernorm_forward_bf16 &&
					  be->op->residual_layernorm_forward_bf16 &&
					  be->op->bias_act_forward_bf16 &&
					  be->op->attention_forward_bf16 &&
					  be->op->matmul_backward_bf16,
					  "%s: the bf16-activation ops come all or none", name);
				char who[64];
				snprintf(who, sizeof who, "%s %s %d thread(s)", name,
					 backend_precision_name(precs[p]), threads);
				layernorms(be, who);
				activations(be, who);
				attentions(be, who);
				matmuls(be, who);
				backend_close(be);
				ran++;
			}
	cr_assert(ran >= 2, "cpu in fp32 at 1 and 3 threads at least (ran %d)", ran);
	fprintf(stderr, "test_bf16_acts: %d backend x precision x thread settings: every op equal "
		"to its float op rounded\n", ran);
}

/* The products the cpu backend runs in its own loops (at most 64 output columns: a small
 * model's projections, the MoE gate) round their operands in bf16 like every other product:
 * matmul_forward and matmul_backward on x, w (and dy) in bf16 give the bits of the same ops
 * in fp32 on the operands rounded; dbias, not a product, sums dy as it is. */
Test(bf16_acts, skinny_products_round_their_operands)
{
	struct backend *h = NULL, *f = NULL;
	if (backend_open(&h, "cpu", &(struct backend_params){.precision = BACKEND_BF16}) < 0) {
		fprintf(stderr, "test_bf16_acts: skinny_products_round_their_operands: SKIPPED "
			"(%s)\n", err_detail());
		return;
	}
	cr_assert_eq(backend_open(&f, "cpu", NULL), 0);
	static const int shapes[][3] = {{300, 96, 40}, {700, 130, 17}, {5, 64, 64}};
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
		for (int lay = 0; lay < 2; lay++) {
			const int N = shapes[s][0], IC = shapes[s][1], OC = shapes[s][2];
			const enum backend_wlayout L = lay ? BACKEND_W_OI : BACKEND_W_IO;
			const size_t nx = (size_t)N * IC, nw = (size_t)IC * OC, ny = (size_t)N * OC;
			float *x = draws(nx, 1, 11), *w = draws(nw, 0.5, 12 + nx);
			float *dy = draws(ny, 1, 13 + nx + nw);
			uint16_t *xh = rounded(x, nx), *wh = rounded(w, nw), *gh = rounded(dy, ny);
			float *xr = widened(xh, nx), *wr = widened(wh, nw), *gr = widened(gh, ny);
			char who[96];
			snprintf(who, sizeof who, "skinny N %d IC %d OC %d %s", N, IC, OC,
				 lay ? "OI" : "IO");
			float *out[2][4]; /* y, dx, dw, dbias: bf16 on x, fp32 on rounded */
			for (int v = 0; v < 2; v++) {
				struct backend *be = v ? f : h;
				void *X = dev(be, v ? xr : x, 4 * nx), *W = dev(be, v ? wr : w, 4 * nw);
				void *G = dev(be, v ? gr : dy, 4 * ny), *D = dev(be, dy, 4 * ny);
				void *Y = dev(be, NULL, 4 * ny), *DX = dev(be, NULL, 4 * nx);
				void *DW = dev(be, NULL, 4 * nw), *DB = dev(be, NULL, 4 * (size_t)OC);
				cr_assert_eq(be->op->matmul_forward(be, Y, X, W, NULL, N, IC, OC, L), 0);
				cr_assert_eq(be->op->matmul_backward(be, DX, DW, NULL, G, X, W, N, IC, OC,
								     L, 0), 0);
				/* dbias from dy as it is, in both */
				cr_assert_eq(be->op->matmul_backward(be, NULL, NULL, DB, D, X, W, N, IC,
								     OC, L, 0), 0);
				out[v][0] = back(be, Y, 4 * ny), out[v][1] = back(be, DX, 4 * nx);
				out[v][2] = back(be, DW, 4 * nw), out[v][3] = back(be, DB, 4 * (size_t)OC);
				void *all[] = {X, W, G, D, Y, DX, DW, DB};
				for (size_t i = 0; i < 8; i++)
					be->op->free(be, all[i]);
			}
			const size_t bytes[4] = {4 * ny, 4 * nx, 4 * nw, 4 * (size_t)OC};
			const char *names[4] = {"y", "dx", "dw", "dbias"};
			for (int k = 0; k < 4; k++) {
				for (size_t i = 0; i < bytes[k]; i++)
					cr_assert(((unsigned char *)out[0][k])[i] ==
							  ((unsigned char *)out[1][k])[i],
						  "%s: %s in bf16 differs from fp32 on the rounded operands "
						  "at byte %zu", who, names[k], i);
				free(out[0][k]), free(out[1][k]);
			}
			free(x), free(w), free(dy), free(xh), free(wh), free(gh), free(xr), free(wr),
				free(gr);
		}
	backend_close(h);
	backend_close(f);
}
