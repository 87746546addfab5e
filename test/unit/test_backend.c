/* test_backend.c - every operation of every built backend against the reference backend "ref"
 * (lib/backend/ref: plain loops in double), op by op, as ggml's test-backend-ops does.
 *
 * A case is one op at one shape with one set of flags. For every backend in backend_names()
 * other than ref (so a "cuda" joins by being built) each case runs
 *  - once on ref, with 64-byte aligned buffers: the expected values;
 *  - on the backend under test opened with 1 and 2 threads (and 3 for cpu), each once with
 *    aligned buffers and once with every buffer moved on by one element. backend.h promises
 *    the same bits at any thread count and alignment, so all these runs must agree bit for
 *    bit, and the first must be close to ref: |got - want| <= atol + rtol |want| with the
 *    tolerance of the table below named for each output; integers (idx, loc, count) exactly.
 * Data moves only through alloc/upload/download, never by dereferencing backend memory, so a
 * device backend works unchanged. Inputs are N(0,1) draws from RNG_STREAM_TEST, fixed per case,
 * the same for both backends. Outputs a case does not preset are filled with 0xff bytes first
 * (NaN, -1), so that an element an op forgets to write, or a C that gemm reads at beta 0,
 * shows; outputs a case presets (beta 1, accumulate, padding left "as they are") check that
 * the op reads or leaves them as the contract says.
 *
 * The MoE ops downstream of routing get routings built here (k distinct experts per token,
 * distinct BPR keys), so both backends see identical routes; the gate itself is compared token
 * by token except where ref's probabilities have a near-tie that float rounding may break
 * either way (counted, and required to be rare).
 *
 * Two whole steps close the file: one GPT-2 training step (forward, backward, grad norm,
 * AdamW) and one MoE layer step (forward, backward), each on the tested backend at every
 * thread count (same bits) and on ref, compared tensor by tensor.
 *
 * Every failure names the op, the shape and the variant (backend, threads, alignment), so a
 * case can be rerun. Each test ends by printing to stderr how many cases ran and the largest
 * error seen as a fraction of its tolerance (--verbose: the same for every op).
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "common/err.h"
#include "common/rng.h"
#include "model/gpt2.h"
#include "moe/moe.h"
#include "common/banned.h"

TestSuite(backend, .timeout = 60);

/* ---- tolerances ----------------------------------------------------------------------- *
 * ref rounds each result once from double, so these are the tested backend's float error
 * with room to spare; inputs are O(1) (N(0,1), weights N(0, 0.5)). A real bug (a wrong index,
 * a missed term) is off by O(1), far above every line here. */
enum tol {
	TOL_EXACT,
	TOL_ROUND,
	TOL_SUM_F,
	TOL_DOT,
	TOL_SUM_D,
	TOL_LN,
	TOL_LN_STAT,
	TOL_LN_BWD,
	TOL_ACT,
	TOL_PROB,
	TOL_ATT,
	TOL_ATT_BWD,
	TOL_LOSS,
	TOL_ADAMW,
	TOL_SCORE,
	TOL_AUX,
	TOL_GATE_BWD,
	TOL_BF16_SUM,
	TOL_BF16_ROUND,
	NTOL
};

static const struct {
	const char *name;
	double atol, rtol;
} tols[NTOL] = {
	/* copies and fills (fill, fill_normal, encode): one formula in float, the same bits */
	[TOL_EXACT] = {"exact", 0, 0},
	/* one to three float roundings of an elementwise formula (encoder, bias add, residual
	 * sum, relu, scaled copies): a few ulps, and absolute at cancellation to ~0 */
	[TOL_ROUND] = {"round", 1e-6, 1e-6},
	/* float sums of up to ~500 O(1) terms (dbias over rows, dwte, dwpe, decode, encode
	 * backward): a plain float loop reaches 1e-4 absolute at 500 */
	[TOL_SUM_F] = {"sum-float", 5e-5, 2e-5},
	/* dot products of up to 300 terms (gemm, matmul and its gradients, MoE dscore); float
	 * accumulation error grows like sqrt(K) eps |x||w| and cancellation leaves results near
	 * 0, hence the absolute part */
	[TOL_DOT] = {"dot", 1e-4, 1e-5},
	/* the sum op: the contract accumulates in double; only the order may differ */
	[TOL_SUM_D] = {"sum-double", 1e-9, 1e-11},
	/* layernorm output: float mean and two-pass variance over up to 768 channels */
	[TOL_LN] = {"layernorm", 2e-5, 2e-5},
	/* the kept mean and rstd (rstd up to 316 when a row is constant: relative) */
	[TOL_LN_STAT] = {"ln-stat", 1e-6, 1e-5},
	/* layernorm backward: dx subtracts two row means (cancellation), dw/db sum over rows */
	[TOL_LN_BWD] = {"ln-backward", 5e-5, 5e-5},
	/* GELU and its derivative: float tanh or an exp-based approximation of it; the
	 * derivative's 1 - tanh^2 cancels in float for |x| > 3 */
	[TOL_ACT] = {"activation", 5e-6, 2e-5},
	/* softmax probabilities (attention P, cross-entropy, gate): a float exp (possibly an
	 * approximation) and a float row sum of up to 5000 terms; relative, tiny
	 * probabilities included */
	[TOL_PROB] = {"probability", 1e-8, 3e-5},
	/* attention output: P v summed over up to 100 keys */
	[TOL_ATT] = {"attention", 2e-5, 2e-5},
	/* attention backward: two chained reductions (dP, then dq/dk over keys/queries) */
	[TOL_ATT_BWD] = {"attention-backward", 5e-5, 1e-4},
	/* -log p: log of a float row sum of up to 5000 terms */
	[TOL_LOSS] = {"loss", 2e-5, 1e-5},
	/* AdamW in float against double: each step's update is lr times an O(1) ratio */
	[TOL_ADAMW] = {"adamw", 1e-6, 1e-5},
	/* gate scores: probabilities divided by their float sum */
	[TOL_SCORE] = {"gate-score", 1e-7, 2e-5},
	/* auxiliary losses: sums over T E probabilities (GShard), cv2 of sums with erfc
	 * (load-importance; var/mean^2 amplifies the error of the sums) */
	[TOL_AUX] = {"aux-loss", 1e-6, 1e-4},
	/* gate backward: softmax backward subtracts a row dot product (cancellation), and the
	 * load-importance term scales by pdf/sigma with sigma = s/E as small as 1/64 */
	[TOL_GATE_BWD] = {"gate-backward", 5e-6, 2e-4},
	/* bfloat16 results of a float32 sum rounded once (decode_bf16, encode_backward_bf16):
	 * compared with the exact sum (ref's fp32 op on the widened inputs, see arg.exact), not
	 * with ref's bfloat16, and allowed half a bfloat16 ulp of the result (the rounding) plus
	 * this, the float32 sum's error: up to 6 roundings of sums of up to 6 O(1) terms, so
	 * ~6 * 2^-24 * 24 < 1e-5 absolute. The rounding alone may use all of the half ulp (the
	 * largest error reported is then ~1.0 of the tolerance); a wrong rounding (truncation:
	 * up to a whole ulp) or a missed term is far above it. */
	[TOL_BF16_SUM] = {"bf16-sum", 1e-5, 1e-6},
	/* d_eo of decode_backward_bf16: the float32 product (2^-24 relative) rounded once */
	[TOL_BF16_ROUND] = {"bf16-round", 0, 1e-7},
};

/* ---- cases and the harness ------------------------------------------------------------ */

enum kind { F32, I32, I64, F64, BF16 };
static const size_t kind_size[] = {4, 4, 8, 8, 2};
static const char *const kind_name[] = {"float", "int32", "int64", "double", "bfloat16"};

#define MAXARG 10
#define MAXOWN 40

/* One argument of an op: a buffer of backend memory (or NULL), its contents before the op and
 * whether it is compared after. */
struct arg {
	const char *name;
	enum kind kind;
	size_t n;             /* elements */
	const void *init;     /* host data uploaded before the op; NULL: 0xff bytes */
	int out;              /* compared after the op */
	enum tol tol;         /* for float and double outputs */
	int alias;            /* >= 0: pass the buffer of that argument instead of a new one */
	int null;             /* pass NULL */
	const uint8_t *unspec; /* elements the contract leaves unspecified: never compared */
	const uint8_t *skip;  /* elements not compared with ref (set after ref's run) */
	const float *exact;   /* BF16 outputs of a sum: the unrounded values (host), which the
			       * tested run and ref's are each compared with instead of with
			       * each other, allowing half a bfloat16 ulp (see TOL_BF16_SUM) */
	int ties;             /* with exact: the exact values are exact (not rounded to float), so
			       * a tie must go to the even neighbour: sums of a few bfloat16
			       * values (encode backward), which are exact in float and often
			       * ties, unlike decode's products with float scores */
	void *want, *got;     /* ref's result, the first tested run's result */
};

struct harness;

struct kase {
	const char *op;     /* the op, for the counts */
	char what[200];     /* op and shape, in every failure message */
	int nargs;
	struct arg a[MAXARG];
	/* calls the op with p[i] the backend buffer of argument i */
	int (*run)(struct backend *be, void *const *p, const struct kase *k);
	/* after ref's run: may mark elements to skip (the gate's near-ties) */
	void (*after_ref)(struct kase *k, struct harness *h);
	int i[10];          /* the op's integer parameters, in the order its run() says */
	int64_t l[6];
	float f[4];
	double d[4];
	uint64_t u[4];
	struct backend_moe_gate gate;
	const struct backend_segment *seg;
	void *own[MAXOWN];  /* host memory freed with the case */
	int nown;
};

#define MAXOPS 40

struct harness {
	const char *name;     /* the backend under test */
	struct backend *ref;
	struct backend *be[3];
	int threads[3], nbe;
	long cases;
	const char *summary; /* set by a whole-step test: its line instead of the op counts */
	struct {
		const char *op;
		long cases;
		double worst; /* largest |got - want| / (atol + rtol |want|) */
		const char *where; /* the output it was seen in */
		char shape[200];   /* and the case */
	} st[MAXOPS];
	int nst;
	long tie_tokens, gate_tokens; /* tokens skipped for a near-tie / compared */
};

static uint64_t draws; /* next RNG_STREAM_TEST index: every array gets fresh numbers */

static void *own(struct kase *k, size_t bytes)
{
	cr_assert(k->nown < MAXOWN, "%s: too many host arrays", k->what);
	void *p = calloc(bytes ? bytes : 1, 1);
	cr_assert(p, "%s: out of host memory", k->what);
	k->own[k->nown++] = p;
	return p;
}

/* n draws of mean + std N(0,1), owned by the case. */
static float *randn(struct kase *k, size_t n, float mean, float std)
{
	float *x = own(k, n * sizeof *x);
	for (size_t j = 0; j < n; j++)
		x[j] = mean + std * rng_normal(7, RNG_STREAM_TEST, draws + j);
	draws += n;
	return x;
}

/* n draws uniform in [lo, hi). */
static float *randu(struct kase *k, size_t n, float lo, float hi)
{
	float *x = own(k, n * sizeof *x);
	for (size_t j = 0; j < n; j++)
		x[j] = lo + (hi - lo) * rng_uniform(7, RNG_STREAM_TEST, draws + j);
	draws += n;
	return x;
}

static uint64_t randbelow(uint64_t n)
{
	return rng_below(7, RNG_STREAM_TEST, draws++, n);
}

static struct kase *kase_new(const char *op, int (*run)(struct backend *, void *const *,
							  const struct kase *),
			     const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static struct kase *kase_new(const char *op, int (*run)(struct backend *, void *const *,
							  const struct kase *),
			     const char *fmt, ...)
{
	struct kase *k = calloc(1, sizeof *k);
	cr_assert(k);
	k->op = op;
	k->run = run;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(k->what, sizeof k->what, fmt, ap);
	va_end(ap);
	return k;
}

static void kase_free(struct kase *k)
{
	for (int j = 0; j < k->nown; j++)
		free(k->own[j]);
	for (int j = 0; j < k->nargs; j++) {
		free(k->a[j].want);
		free(k->a[j].got);
	}
	free(k);
}

static int arg_add(struct kase *k, const char *name, enum kind kind, size_t n, const void *init,
		   int out, enum tol tol)
{
	cr_assert(k->nargs < MAXARG);
	struct arg *a = &k->a[k->nargs];
	a->name = name;
	a->kind = kind;
	a->n = n;
	a->init = init;
	a->out = out;
	a->tol = tol;
	a->alias = -1;
	return k->nargs++;
}

/* An input, an output (init NULL: filled with 0xff), NULL, an output in the buffer of input
 * `of` (n elements, the op's in-place form). */
#define IN(k, name, kind, n, init) arg_add(k, name, kind, n, init, 0, TOL_EXACT)
#define OUT(k, name, kind, n, init, tol) arg_add(k, name, kind, n, init, 1, tol)

static void arg_null(struct kase *k, const char *name)
{
	k->a[arg_add(k, name, F32, 0, NULL, 0, TOL_EXACT)].null = 1;
}

static void arg_alias(struct kase *k, const char *name, int of, enum tol tol)
{
	int j = arg_add(k, name, k->a[of].kind, k->a[of].n, NULL, 1, tol);
	k->a[j].alias = of;
}

/* Run k on be, aligned or with every buffer one element past a 64-byte boundary, and download
 * the outputs into res[] (allocated here). who names the run in messages. */
static void exec(struct backend *be, const char *who, struct kase *k, int misalign, void **res)
{
	void *base[MAXARG] = {0}, *p[MAXARG] = {0};
	int rc;

	for (int j = 0; j < k->nargs; j++) {
		struct arg *a = &k->a[j];
		if (a->null || a->alias >= 0)
			continue;
		size_t es = kind_size[a->kind], bytes = a->n * es;
		rc = be->op->alloc(be, &base[j], bytes + (misalign ? 64 : 0));
		cr_assert_eq(rc, 0, "%s [%s]: alloc of %zu bytes for '%s' failed: %s", k->what, who,
			     bytes, a->name, err_detail());
		p[j] = (char *)base[j] + (misalign ? es : 0);
		if (a->init)
			rc = be->op->upload(be, p[j], a->init, bytes);
		else
			rc = be->op->memset(be, p[j], 0xff, bytes);
		cr_assert_eq(rc, 0, "%s [%s]: preparing '%s' failed: %s", k->what, who, a->name,
			     err_detail());
	}
	for (int j = 0; j < k->nargs; j++)
		if (k->a[j].alias >= 0)
			p[j] = p[k->a[j].alias];
	rc = k->run(be, p, k);
	cr_assert_eq(rc, 0, "%s [%s]: the op returned %d: %s", k->what, who, rc, err_detail());
	rc = be->op->sync(be);
	cr_assert_eq(rc, 0, "%s [%s]: sync returned %d: %s", k->what, who, rc, err_detail());
	for (int j = 0; j < k->nargs; j++) {
		struct arg *a = &k->a[j];
		res[j] = NULL;
		if (!a->out)
			continue;
		size_t bytes = a->n * kind_size[a->kind];
		res[j] = malloc(bytes ? bytes : 1);
		cr_assert(res[j]);
		rc = be->op->download(be, res[j], p[j], bytes);
		cr_assert_eq(rc, 0, "%s [%s]: download of '%s' failed: %s", k->what, who, a->name,
			     err_detail());
	}
	for (int j = 0; j < k->nargs; j++)
		be->op->free(be, base[j]);
}

static double value_at(const void *buf, enum kind kind, size_t j)
{
	switch (kind) {
	case F32: return ((const float *)buf)[j];
	case BF16: return backend_bf16_to_float(((const uint16_t *)buf)[j]);
	case I32: return ((const int32_t *)buf)[j];
	case I64: return (double)((const int64_t *)buf)[j];
	default: return ((const double *)buf)[j];
	}
}

/* The tested run res[] must equal the first tested run bit for bit (unspecified elements
 * aside). */
static void expect_same_bits(const struct kase *k, void *const *res, const char *first,
			     const char *who)
{
	for (int j = 0; j < k->nargs; j++) {
		const struct arg *a = &k->a[j];
		if (!a->out)
			continue;
		size_t es = kind_size[a->kind];
		for (size_t e = 0; e < a->n; e++) {
			if (a->unspec && a->unspec[e])
				continue;
			const char *x = (const char *)a->got + e * es;
			const char *y = (const char *)res[j] + e * es;
			if (memcmp(x, y, es) != 0)
				cr_assert_fail("%s: '%s'[%zu] differs between [%s] and [%s]: %.9g "
					       "vs %.9g (same inputs must give the same bits)",
					       k->what, a->name, e, first, who,
					       value_at(a->got, a->kind, e),
					       value_at(res[j], a->kind, e));
		}
	}
}

/* Half the spacing of bfloat16 values at v (8 significant bits; subnormals below 2^-126). */
static double bf16_half_ulp(double v)
{
	int ex;
	if (!(fabs(v) > 0) || !isfinite(v))
		return ldexp(1.0, -134);
	frexp(fabs(v), &ex); /* |v| in [2^(ex-1), 2^ex): ulp 2^(ex-8) */
	return fmax(ldexp(1.0, ex - 9), ldexp(1.0, -134));
}

/* Element e of a bfloat16 output with exact values: |v - exact| <= half an ulp of v + atol +
 * rtol |exact|, and, where a->ties, at a tie (|v - exact| half an ulp exactly) v is the even
 * neighbour; returns the fraction of the bound used. */
static double bf16_close(const struct kase *k, const struct arg *a, size_t e, double v,
			 const char *who)
{
	double x = a->exact[e], d = fabs(v - x);
	double lim = bf16_half_ulp(v) + tols[a->tol].atol + tols[a->tol].rtol * fabs(x);
	if (a->ties && d == bf16_half_ulp(v) && (backend_bf16_from_float((float)v) & 1u))
		cr_assert_fail("%s [%s]: '%s'[%zu] = %.9g, exact %.9g: a tie rounded to the odd "
			       "neighbour (round to nearest even)", k->what, who, a->name, e, v, x);
	if (!(d <= lim))
		cr_assert_fail("%s [%s]: '%s'[%zu] = %.9g, exact %.9g: |diff| %.3g > half a "
			       "bfloat16 ulp %.3g + %.3g + %.3g |exact| (tolerance '%s')", k->what,
			       who, a->name, e, v, x, d, bf16_half_ulp(v), tols[a->tol].atol,
			       tols[a->tol].rtol, tols[a->tol].name);
	return d / lim;
}

/* |got - want| <= atol + rtol |want| for every compared element of argument a; returns the
 * largest fraction of the tolerance used. */
static double expect_close(const struct kase *k, const struct arg *a, const char *who)
{
	double worst = 0;
	for (size_t e = 0; e < a->n; e++) {
		if ((a->unspec && a->unspec[e]) || (a->skip && a->skip[e]))
			continue;
		double g = value_at(a->got, a->kind, e), w = value_at(a->want, a->kind, e);
		if (a->kind == I32 || a->kind == I64) {
			if (g != w)
				cr_assert_fail("%s [%s]: '%s'[%zu] = %.0f, ref %.0f (%s, compared "
					       "exactly)", k->what, who, a->name, e, g, w,
					       kind_name[a->kind]);
			continue;
		}
		size_t es = kind_size[a->kind];
		if (a->exact) {
			double f = bf16_close(k, a, e, g, who);
			bf16_close(k, a, e, w, "ref");
			worst = f > worst ? f : worst;
			continue;
		}
		if (memcmp((const char *)a->got + e * es, (const char *)a->want + e * es, es) == 0)
			continue; /* equal bits, NaN poison left alone by both included */
		double lim = tols[a->tol].atol + tols[a->tol].rtol * fabs(w), d = fabs(g - w);
		if (!(d <= lim))
			cr_assert_fail("%s [%s]: '%s'[%zu] = %.9g, ref %.9g: |diff| %.3g > %.3g + "
				       "%.3g |ref| (tolerance '%s')", k->what, who, a->name, e, g,
				       w, d, tols[a->tol].atol, tols[a->tol].rtol,
				       tols[a->tol].name);
		double frac = lim > 0 ? d / lim : 0;
		worst = frac > worst ? frac : worst;
	}
	return worst;
}

static void note(struct harness *h, const struct kase *k, double worst, const char *where)
{
	const char *op = k->op;
	int j = 0;
	while (j < h->nst && strcmp(h->st[j].op, op) != 0)
		j++;
	if (j == h->nst) {
		cr_assert(h->nst < MAXOPS);
		h->st[h->nst++].op = op;
	}
	h->st[j].cases++;
	if (worst > h->st[j].worst || !h->st[j].where) {
		h->st[j].worst = worst;
		h->st[j].where = where;
		snprintf(h->st[j].shape, sizeof h->st[j].shape, "%s", k->what);
	}
	h->cases++;
}

/* The case on ref, then on every variant of the backend under test; compare; free the case
 * unless keep (the caller reads its results). */
static void run_case(struct harness *h, struct kase *k, int keep)
{
	void *res[MAXARG];
	char first[80] = "", who[80], uses[24];

	exec(h->ref, "ref", k, 0, res);
	for (int j = 0; j < k->nargs; j++)
		k->a[j].want = res[j];
	if (k->after_ref)
		k->after_ref(k, h);
	for (int b = 0; b < h->nbe; b++)
		for (int mis = 0; mis < 2; mis++) {
			uses[0] = '\0';
			if (h->be[b]->threads != h->threads[b])
				snprintf(uses, sizeof uses, " (uses %d)", h->be[b]->threads);
			snprintf(who, sizeof who, "%s threads=%d%s %s", h->name, h->threads[b],
				 uses, mis ? "misaligned" : "aligned");
			exec(h->be[b], who, k, mis, res);
			if (!first[0]) {
				snprintf(first, sizeof first, "%s", who);
				for (int j = 0; j < k->nargs; j++)
					k->a[j].got = res[j];
				continue;
			}
			expect_same_bits(k, res, first, who);
			for (int j = 0; j < k->nargs; j++)
				free(res[j]);
		}
	double worst = 0;
	const char *where = "";
	for (int j = 0; j < k->nargs; j++)
		if (k->a[j].out) {
			double w = expect_close(k, &k->a[j], first);
			if (w > worst || !where[0]) {
				worst = w;
				where = k->a[j].name;
			}
		}
	note(h, k, worst, where);
	if (!keep)
		kase_free(k);
}

/* fn(h) for every built backend but ref, with h holding ref and the backend opened at each
 * thread count; prints what ran. */
static void for_each_backend(const char *test, void (*fn)(struct harness *))
{
	char list[256], *save = NULL;
	int tested = 0;

	snprintf(list, sizeof list, "%s", backend_names());
	for (char *name = strtok_r(list, ", ", &save); name; name = strtok_r(NULL, ", ", &save)) {
		if (strcmp(name, "ref") == 0)
			continue;
		struct harness h = {.name = name};
		static const int threads[] = {1, 2, 3};
		h.nbe = strcmp(name, "cpu") == 0 ? 3 : 2;
		for (int b = 0; b < h.nbe; b++) {
			struct backend_params par = {.threads = threads[b]};
			h.threads[b] = threads[b];
			int rc = backend_open(&h.be[b], name, &par);
			if (rc == CORE_EUNSUPPORTED && b == 0)
				break; /* built, but no device here */
			cr_assert_eq(rc, 0, "cannot open backend '%s' with %d threads: %s", name,
				     threads[b], err_detail());
		}
		if (!h.be[0]) {
			fprintf(stderr, "test_backend: %s: SKIPPED backend '%s': built but cannot "
				"start here (%s)\n", test, name, err_detail());
			continue;
		}
		int rc = backend_open(&h.ref, "ref", NULL);
		cr_assert_eq(rc, 0, "cannot open ref: %s", err_detail());
		fn(&h);
		for (int j = 0; j < h.nst; j++)
			cr_log_info("%s: %s: %ld cases; largest error %.3f of the tolerance, in "
				    "'%s' of %s", name, h.st[j].op, h.st[j].cases, h.st[j].worst,
				    h.st[j].where, h.st[j].shape);
		int worst = 0;
		for (int j = 1; j < h.nst; j++)
			worst = h.st[j].worst > h.st[worst].worst ? j : worst;
		/* stderr: seen without --verbose, so `make test` shows what ran */
		if (h.summary)
			fprintf(stderr, "test_backend: %s on '%s': %s\n", test, name, h.summary);
		else
			fprintf(stderr, "test_backend: %s on '%s': %ld op x shape cases, each on ref and "
			"%d variants (threads x alignment); largest error %.2f of the tolerance "
			"(%s)\n", test, name, h.cases, 2 * h.nbe, h.nst ? h.st[worst].worst : 0.0,
			h.nst ? h.st[worst].op : "-");
		tested++;
		for (int b = 0; b < h.nbe; b++)
			backend_close(h.be[b]);
		backend_close(h.ref);
	}
	if (!tested)
		fprintf(stderr, "test_backend: %s: no backend besides ref is built (%s): nothing "
			"compared\n", test, backend_names());
}

/* ---- fills and reductions ------------------------------------------------------------- */

/* fill: i[0] n; f[0] value. fill_normal: i[0] n; f[0] mean, f[1] std; u[] seed, stream,
 * base. sum: i[0] n, i[1] squares. */
static int run_fill(struct backend *be, void *const *p, const struct kase *k)
{
	return be->op->fill(be, p[0], (size_t)k->i[0], k->f[0]);
}

/* add_f32: i[0] n; p[] y, x. */
static int run_add_f32(struct backend *be, void *const *p, const struct kase *k)
{
	return be->op->add_f32(be, p[0], p[1], (size_t)k->i[0]);
}

static int run_fill_normal(struct backend *be, void *const *p, const struct kase *k)
{
	return be->op->fill_normal(be, p[0], (size_t)k->i[0], k->f[0], k->f[1], k->u[0], k->u[1],
				   k->u[2]);
}

static int run_sum(struct backend *be, void *const *p, const struct kase *k)
{
	return be->op->sum(be, p[0], p[1], (size_t)k->i[0], k->i[1]);
}

/* copy_2d: i[] dpitch, spitch, width, rows in floats (the op counts bytes); p[] dst, src. */
static int run_copy_2d(struct backend *be, void *const *p, const struct kase *k)
{
	const size_t f = sizeof(float);
	return be->op->copy_2d(be, p[0], (size_t)k->i[0] * f, p[1], (size_t)k->i[1] * f,
			       (size_t)k->i[2] * f, (size_t)k->i[3]);
}

/* Strided copies: rows of width floats between pitches, the destination preset so that what
 * lies between its rows must come back untouched. */
static void copy_2d_cases(struct harness *h)
{
	static const int sh[][4] = {
		/* dpitch, spitch, width, rows */
		{5, 5, 5, 3},   {7, 5, 5, 4},   {5, 9, 3, 6},   {64, 17, 17, 5},
		{3, 100, 3, 33}, {1, 1, 1, 1},   {8, 8, 0, 4},   {9, 4, 4, 0},
	};
	for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
		const int dp = sh[s][0], sp = sh[s][1], w = sh[s][2], rows = sh[s][3];
		struct kase *k = kase_new("copy_2d", run_copy_2d, "copy_2d dpitch=%d spitch=%d "
					  "width=%d rows=%d (floats)", dp, sp, w, rows);
		k->i[0] = dp, k->i[1] = sp, k->i[2] = w, k->i[3] = rows;
		const size_t r1 = (size_t)(rows ? rows : 1), nd = r1 * (size_t)dp, ns = r1 * (size_t)sp;
		OUT(k, "dst", F32, nd, randn(k, nd, 0, 1), TOL_EXACT);
		IN(k, "src", F32, ns, randn(k, ns, 0, 1));
		run_case(h, k, 0);
	}
}

static void fills_and_sums(struct harness *h)
{
	static const int ns[] = {0, 1, 3, 7, 16, 17, 32, 33, 100, 1000, 4097};
	for (size_t s = 0; s < sizeof ns / sizeof ns[0]; s++) {
		int n = ns[s];
		/* three elements past n preset: a fill must stop at n */
		for (int v = 0; v < 2; v++) {
			float value = v ? -0.0f : 1.5f;
			struct kase *k = kase_new("fill", run_fill, "fill n=%d value=%g", n,
						  (double)value);
			k->i[0] = n;
			k->f[0] = value;
			OUT(k, "x", F32, (size_t)n + 3, randn(k, (size_t)n + 3, 0, 1), TOL_EXACT);
			run_case(h, k, 0);
		}
		static const struct {
			float mean, std;
			uint64_t seed, stream, base;
		} fn[] = {{0.0f, 1.0f, 42, RNG_STREAM_TEST, 0},
			  {0.5f, 0.02f, 7, RNG_STREAM_INIT, ((uint64_t)1 << 40) + 5}};
		for (size_t v = 0; v < 2; v++) {
			struct kase *k = kase_new("fill_normal", run_fill_normal,
						  "fill_normal n=%d mean=%g std=%g seed=%llu "
						  "stream=%llu base=%llu", n, (double)fn[v].mean,
						  (double)fn[v].std, (unsigned long long)fn[v].seed,
						  (unsigned long long)fn[v].stream,
						  (unsigned long long)fn[v].base);
			k->i[0] = n;
			k->f[0] = fn[v].mean;
			k->f[1] = fn[v].std;
			k->u[0] = fn[v].seed;
			k->u[1] = fn[v].stream;
			k->u[2] = fn[v].base;
			OUT(k, "x", F32, (size_t)n + 3, randn(k, (size_t)n + 3, 0, 1), TOL_EXACT);
			run_case(h, k, 0);
		}
		{
			/* three elements past n preset: the add must stop at n */
			struct kase *k = kase_new("add_f32", run_add_f32, "add_f32 n=%d", n);
			k->i[0] = n;
			OUT(k, "y", F32, (size_t)n + 3, randn(k, (size_t)n + 3, 0, 1), TOL_EXACT);
			IN(k, "x", F32, (size_t)n, randn(k, (size_t)n, 0.5f, 1));
			run_case(h, k, 0);
		}
		for (int sq = 0; sq < 2; sq++) {
			struct kase *k = kase_new("sum", run_sum, "sum n=%d squares=%d", n, sq);
			k->i[0] = n;
			k->i[1] = sq;
			OUT(k, "out", F64, 1, NULL, TOL_SUM_D);
			IN(k, "x", F32, (size_t)n, randn(k, (size_t)n, 0.25f, 1));
			run_case(h, k, 0);
		}
	}
	copy_2d_cases(h);
	/* a long sum: double accumulation is the contract */
	for (int sq = 0; sq < 2; sq++) {
		struct kase *k = kase_new("sum", run_sum, "sum n=100003 squares=%d", sq);
		k->i[0] = 100003;
		k->i[1] = sq;
		OUT(k, "out", F64, 1, NULL, TOL_SUM_D);
		IN(k, "x", F32, 100003, randn(k, 100003, 0.25f, 1));
		run_case(h, k, 0);
	}
}

/* 87 cases x 6 variants: under the CUDA emulator with AddressSanitizer on 2 busy cores this
 * passed 60 s (2 s without the sanitizers) */
Test(backend, fills_and_sums, .timeout = 180)
{
	for_each_backend("fills_and_sums", fills_and_sums);
}

/* ---- matrix products ------------------------------------------------------------------ */

/* gemm: i[] transA, transB, M, N, K, lda, ldb, ldc; f[] alpha, beta; p[] A, B, C. */
static int run_gemm(struct backend *be, void *const *p, const struct kase *k)
{
	return be->op->gemm(be, k->i[0], k->i[1], k->i[2], k->i[3], k->i[4], k->f[0], p[0],
			    k->i[5], p[1], k->i[6], k->f[1], p[2], k->i[7]);
}

/* One gemm case; the stored shapes are A [M,K] or [K,M] and B [K,N] or [N,K], each row pad
 * elements longer than its width. */
static void gemm_case(struct harness *h, int ta, int tb, int M, int N, int K, int pad,
		      float alpha, int beta)
{
	int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
	int lda = ac + pad, ldb = bc + pad, ldc = N + pad;
	struct kase *k = kase_new("gemm", run_gemm,
				  "gemm transA=%d transB=%d M=%d N=%d K=%d lda=%d ldb=%d ldc=%d "
				  "alpha=%g beta=%d", ta, tb, M, N, K, lda, ldb, ldc,
				  (double)alpha, beta);
	int *iv = k->i;
	iv[0] = ta, iv[1] = tb, iv[2] = M, iv[3] = N, iv[4] = K;
	iv[5] = lda, iv[6] = ldb, iv[7] = ldc;
	k->f[0] = alpha;
	k->f[1] = (float)beta;
	size_t na = (size_t)ar * lda, nb = (size_t)br * ldb, nc = (size_t)M * ldc;
	IN(k, "A", F32, na, randn(k, na, 0, 1));
	IN(k, "B", F32, nb, randn(k, nb, 0, 0.5f));
	/* beta 0: C holds NaN, which must not leak into the result; the padding of C must
	 * come back as it was */
	OUT(k, "C", F32, nc, beta ? randn(k, nc, 0, 1) : NULL, TOL_DOT);
	run_case(h, k, 0);
}

static void gemm_cases(struct harness *h)
{
	static const int shapes[][3] = {
		{1, 1, 1},   {1, 7, 3},   {3, 1, 17},   {7, 17, 33},  {17, 33, 7},
		{16, 32, 48}, {32, 32, 32}, {33, 16, 64}, {64, 48, 17}, {100, 33, 65},
		{5, 7, 300},  {3, 100, 1},  {128, 96, 64},
		/* big enough for a threaded backend to split rows or columns unevenly */
		{301, 130, 70}, {41, 263, 300},
	};
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		/* leading dimensions past the width in every other shape */
		int pad = s % 2 ? 3 : 0;
		float alpha = s % 3 == 1 ? -0.75f : 1.0f;
		for (int ta = 0; ta < 2; ta++)
			for (int tb = 0; tb < 2; tb++)
				for (int beta = 0; beta < 2; beta++)
					gemm_case(h, ta, tb, shapes[s][0], shapes[s][1],
						  shapes[s][2], pad, alpha, beta);
	}
}

Test(backend, gemm)
{
	for_each_backend("gemm", gemm_cases);
}

/* matmul_forward: i[] N, IC, OC, layout; p[] y, x, w, bias.
 * matmul_backward: i[] N, IC, OC, layout, accumulate; p[] dx, dw, dbias, dy, x, w. */
static int run_matmul_forward(struct backend *be, void *const *p, const struct kase *k)
{
	return be->op->matmul_forward(be, p[0], p[1], p[2], p[3], k->i[0], k->i[1], k->i[2],
				      (enum backend_wlayout)k->i[3]);
}

static int run_matmul_backward(struct backend *be, void *const *p, const struct kase *k)
{
	return be->op->matmul_backward(be, p[0], p[1], p[2], p[3], p[4], p[5], k->i[0], k->i[1],
				       k->i[2], (enum backend_wlayout)k->i[3], k->i[4]);
}

/* which of dx, dw, dbias a backward case leaves out, or dx in the buffer of x */
enum mm_variant { MM_ALL, MM_NO_DX, MM_NO_DW, MM_NO_DBIAS, MM_DX_IS_X };
static const char *const mm_variant_name[] = {"all", "dx=NULL", "dw=NULL", "dbias=NULL",
					      "dx=x"};

static void matmul_backward_case(struct harness *h, int N, int IC, int OC, int layout, int acc,
				 enum mm_variant var)
{
	struct kase *k = kase_new("matmul_backward", run_matmul_backward,
				  "matmul_backward N=%d IC=%d OC=%d layout=%s accumulate=%d %s", N,
				  IC, OC, layout ? "OI" : "IO", acc, mm_variant_name[var]);
	k->i[0] = N, k->i[1] = IC, k->i[2] = OC, k->i[3] = layout, k->i[4] = acc;
	size_t nx = (size_t)N * IC, nw = (size_t)IC * OC;
	float *x = randn(k, nx, 0, 1);
	if (var == MM_NO_DX)
		arg_null(k, "dx");
	else if (var == MM_DX_IS_X)
		arg_add(k, "dx", F32, 0, NULL, 1, TOL_DOT); /* made an alias of x below */
	else
		OUT(k, "dx", F32, nx, acc ? randn(k, nx, 0, 1) : NULL, TOL_DOT);
	if (var == MM_NO_DW)
		arg_null(k, "dw");
	else
		OUT(k, "dw", F32, nw, NULL, TOL_DOT);
	if (var == MM_NO_DBIAS)
		arg_null(k, "dbias");
	else
		OUT(k, "dbias", F32, (size_t)OC, NULL, TOL_SUM_F);
	IN(k, "dy", F32, (size_t)N * OC, randn(k, (size_t)N * OC, 0, 1));
	int xi = IN(k, "x", F32, nx, x);
	IN(k, "w", F32, nw, randn(k, nw, 0, 0.5f));
	if (var == MM_DX_IS_X) {
		k->a[0].alias = xi;
		k->a[0].n = nx;
	}
	run_case(h, k, 0);
}

static void matmul_cases(struct harness *h)
{
	static const int shapes[][3] = {
		{1, 1, 1},    {3, 7, 17},   {7, 33, 3},  {16, 32, 48}, {17, 64, 33},
		{33, 100, 7}, {64, 16, 100}, {100, 48, 32}, {32, 300, 16},
		/* big enough for a threaded backend to split rows or columns unevenly */
		{301, 70, 130}, {41, 300, 263}, {517, 40, 150},
	};
	size_t ns = sizeof shapes / sizeof shapes[0];
	for (size_t s = 0; s < ns; s++) {
		int N = shapes[s][0], IC = shapes[s][1], OC = shapes[s][2];
		for (int layout = 0; layout < 2; layout++) {
			for (int bias = 0; bias < 2; bias++) {
				struct kase *k = kase_new("matmul_forward", run_matmul_forward,
							  "matmul_forward N=%d IC=%d OC=%d "
							  "layout=%s bias=%d", N, IC, OC,
							  layout ? "OI" : "IO", bias);
				k->i[0] = N, k->i[1] = IC, k->i[2] = OC, k->i[3] = layout;
				OUT(k, "y", F32, (size_t)N * OC, NULL, TOL_DOT);
				IN(k, "x", F32, (size_t)N * IC, randn(k, (size_t)N * IC, 0, 1));
				IN(k, "w", F32, (size_t)IC * OC,
				   randn(k, (size_t)IC * OC, 0, 0.5f));
				if (bias)
					IN(k, "bias", F32, (size_t)OC, randn(k, (size_t)OC, 0, 1));
				else
					arg_null(k, "bias");
				run_case(h, k, 0);
			}
			for (int acc = 0; acc < 2; acc++)
				matmul_backward_case(h, N, IC, OC, layout, acc, MM_ALL);
			/* each gradient left out, and dx computed into x, at a few shapes */
			if (s % 3 == 1) {
				for (int var = MM_NO_DX; var <= MM_NO_DBIAS; var++)
					matmul_backward_case(h, N, IC, OC, layout, s % 2,
							     (enum mm_variant)var);
				for (int acc = 0; acc < 2; acc++)
					matmul_backward_case(h, N, IC, OC, layout, acc,
							     MM_DX_IS_X);
			}
		}
	}
}

Test(backend, matmul)
{
	for_each_backend("matmul", matmul_cases);
}

/* ---- GPT-2: embeddings and layernorm -------------------------------------------------- */

/* encoder_forward: i[] B, T, C; p[] out, tok, wte, wpe.
 * encoder_backward: i[] B, T, C, V; p[] dwte, dwpe, dout, tok. */
static int run_encoder_forward(struct backend *be, void *const *p, const struct kase *k)
{
	return be->op->encoder_forward(be, p[0], p[1], p[2], p[3], k->i[0], k->i[1], k->i[2]);
}

static int run_encoder_backward(struct backend *be, void *const *p, const struct kase *k)
{
	return be->op->encoder_backward(be, p[0], p[1], p[2], p[3], k->i[0], k->i[1], k->i[2],
					k->i[3]);
}

static int32_t *randtok(struct kase *k, size_t n, int V)
{
	int32_t *t = own(k, n * sizeof *t);
	for (size_t j = 0; j < n; j++)
		t[j] = (int32_t)randbelow((uint64_t)V);
	return t;
}

/* layernorm_forward: i[] N, C; p[] out, mean, rstd, x, w, b.
 * residual_layernorm_forward: i[] N, C; p[] res, out, mean, rstd, skip, bias, w, b.
 * layernorm_backward: i[] N, C, accumulate; p[] dx, dw, db, dout, x, w, mean, rstd. */
static int run_layernorm_forward(struct backend *be, void *const *p, const struct kase *k)
{
	return be->op->layernorm_forward(be, p[0], p[1], p[2], p[3], p[4], p[5], k->i[0],
					 k->i[1]);
}

static int run_residual_layernorm(struct backend *be, void *const *p, const struct kase *k)
{
	return be->op->residual_layernorm_forward(be, p[0], p[1], p[2], p[3], p[4], p[5], p[6],
						  p[7], k->i[0], k->i[1]);
}

static int run_layernorm_backward(struct backend *be, void *const *p, const struct kase *k)
{
	return be->op->layernorm_backward(be, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7],
					  k->i[0], k->i[1], k->i[2]);
}

static void embedding_and_layernorm(struct harness *h)
{
	static const int enc[][4] = {{1, 1, 1, 1},   {2, 3, 7, 5},    {3, 17, 33, 50},
				     {4, 32, 16, 100}, {1, 100, 64, 257}, {2, 33, 17, 3},
				     {8, 64, 128, 1000}};
	for (size_t s = 0; s < sizeof enc / sizeof enc[0]; s++) {
		int B = enc[s][0], T = enc[s][1], C = enc[s][2], V = enc[s][3];
		size_t n = (size_t)B * T;
		struct kase *k = kase_new("encoder_forward", run_encoder_forward,
					  "encoder_forward B=%d T=%d C=%d V=%d", B, T, C, V);
		k->i[0] = B, k->i[1] = T, k->i[2] = C;
		OUT(k, "out", F32, n * C, NULL, TOL_ROUND);
		IN(k, "tok", I32, n, randtok(k, n, V));
		IN(k, "wte", F32, (size_t)V * C, randn(k, (size_t)V * C, 0, 1));
		IN(k, "wpe", F32, (size_t)T * C, randn(k, (size_t)T * C, 0, 1));
		run_case(h, k, 0);

		k = kase_new("encoder_backward", run_encoder_backward,
			     "encoder_backward B=%d T=%d C=%d V=%d (dwpe with 2 rows past T)", B,
			     T, C, V);
		k->i[0] = B, k->i[1] = T, k->i[2] = C, k->i[3] = V;
		OUT(k, "dwte", F32, (size_t)V * C, NULL, TOL_SUM_F);
		/* rows T.. of dwpe are not written: preset, they must come back unchanged */
		OUT(k, "dwpe", F32, (size_t)(T + 2) * C, randn(k, (size_t)(T + 2) * C, 0, 1),
		    TOL_SUM_F);
		IN(k, "dout", F32, n * C, randn(k, n * C, 0, 1));
		IN(k, "tok", I32, n, randtok(k, n, V));
		run_case(h, k, 0);
	}

	static const int ln[][2] = {{1, 1},   {1, 3},   {3, 7},  {7, 17}, {17, 33},
				    {16, 64}, {33, 100}, {5, 256}, {2, 768}, {4, 32},
				    {300, 100}, {257, 768}};
	for (size_t s = 0; s < sizeof ln / sizeof ln[0]; s++) {
		int N = ln[s][0], C = ln[s][1];
		size_t n = (size_t)N * C;
		/* a mean far from 0 tests the two-pass variance */
		struct kase *k = kase_new("layernorm_forward", run_layernorm_forward,
					  "layernorm_forward N=%d C=%d", N, C);
		k->i[0] = N, k->i[1] = C;
		OUT(k, "out", F32, n, NULL, TOL_LN);
		OUT(k, "mean", F32, (size_t)N, NULL, TOL_LN_STAT);
		OUT(k, "rstd", F32, (size_t)N, NULL, TOL_LN_STAT);
		IN(k, "x", F32, n, randn(k, n, 3, 2));
		IN(k, "w", F32, (size_t)C, randn(k, (size_t)C, 1, 0.5f));
		IN(k, "b", F32, (size_t)C, randn(k, (size_t)C, 0, 0.5f));
		run_case(h, k, 0);

		for (int bias = 0; bias < 2; bias++) {
			k = kase_new("residual_layernorm_forward", run_residual_layernorm,
				     "residual_layernorm_forward N=%d C=%d bias=%d", N, C, bias);
			k->i[0] = N, k->i[1] = C;
			OUT(k, "res", F32, n, randn(k, n, 1, 1), TOL_ROUND);
			OUT(k, "out", F32, n, NULL, TOL_LN);
			OUT(k, "mean", F32, (size_t)N, NULL, TOL_LN_STAT);
			OUT(k, "rstd", F32, (size_t)N, NULL, TOL_LN_STAT);
			IN(k, "skip", F32, n, randn(k, n, 1, 1));
			if (bias)
				IN(k, "bias", F32, (size_t)C, randn(k, (size_t)C, 0, 1));
			else
				arg_null(k, "bias");
			IN(k, "w", F32, (size_t)C, randn(k, (size_t)C, 1, 0.5f));
			IN(k, "b", F32, (size_t)C, randn(k, (size_t)C, 0, 0.5f));
			run_case(h, k, 0);
		}

		for (int acc = 0; acc < 2; acc++) {
			k = kase_new("layernorm_backward", run_layernorm_backward,
				     "layernorm_backward N=%d C=%d accumulate=%d", N, C, acc);
			k->i[0] = N, k->i[1] = C, k->i[2] = acc;
			float *x = randn(k, n, 3, 2), *mean = own(k, sizeof(float) * N),
			      *rstd = own(k, sizeof(float) * N);
			/* the forward's statistics of x, as the backward expects them */
			for (int r = 0; r < N; r++) {
				const float *xr = x + (size_t)r * C;
				double m = 0, v = 0;
				for (int c = 0; c < C; c++)
					m += xr[c];
				m /= C;
				for (int c = 0; c < C; c++)
					v += (xr[c] - m) * (xr[c] - m);
				mean[r] = (float)m;
				rstd[r] = (float)(1.0 / sqrt(v / C + 1e-5));
			}
			OUT(k, "dx", F32, n, acc ? randn(k, n, 0, 1) : NULL, TOL_LN_BWD);
			OUT(k, "dw", F32, (size_t)C, NULL, TOL_LN_BWD);
			OUT(k, "db", F32, (size_t)C, NULL, TOL_SUM_F);
			IN(k, "dout", F32, n, randn(k, n, 0, 1));
			IN(k, "x", F32, n, x);
			IN(k, "w", F32, (size_t)C, randn(k, (size_t)C, 1, 0.5f));
			IN(k, "mean", F32, (size_t)N, mean);
			IN(k, "rstd", F32, (size_t)N, rstd);
			run_case(h, k, 0);
		}
	}
}

Test(backend, embedding_and_layernorm)
{
	for_each_backend("embedding_and_layernorm", embedding_and_layernorm);
}

/* ---- GPT-2: activations --------------------------------------------------------------- */

/* bias_act_forward: i[] N, C, act; p[] pre, out, bias (out may be pre).
 * act_backward: i[] N, C, act; p[] d, dbias, x. */
static int run_bias_act(struct backend *be, void *const *p, const struct kase *k)
{
	return be->op->bias_act_forward(be, p[0], p[1], p[2], k->i[0], k->i[1],
					(enum backend_act)k->i[2]);
}

static int run_act_backward(struct backend *be, void *const *p, const struct kase *k)
{
	return be->op->act_backward(be, p[0], p[1], p[2], k->i[0], k->i[1],
				    (enum backend_act)k->i[2]);
}

/* Pre-activations N(0, 2) with the tails, exact zeros and a tiny negative sprinkled in. */
static float *preacts(struct kase *k, size_t n)
{
	float *x = randn(k, n, 0, 2);
	static const float special[] = {-30.0f, 30.0f, 0.0f, -1e-4f, 9.0f, -9.0f};
	for (size_t j = 0; j < n; j += 5)
		x[j] = special[(j / 5) % 6];
	return x;
}

static void activations(struct harness *h)
{
	static const int shapes[][2] = {{1, 1},   {3, 7},    {7, 17}, {17, 33},
					{16, 64}, {33, 100}, {64, 256}, {301, 513}};
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		int N = shapes[s][0], C = shapes[s][1];
		size_t n = (size_t)N * C;
		/* gelu, relu, relu with out = pre */
		for (int v = 0; v < 3; v++) {
			int act = v ? BACKEND_ACT_RELU : BACKEND_ACT_GELU;
			struct kase *k = kase_new("bias_act_forward", run_bias_act,
						  "bias_act_forward N=%d C=%d act=%s%s", N, C,
						  act ? "relu" : "gelu", v == 2 ? " out=pre" : "");
			k->i[0] = N, k->i[1] = C, k->i[2] = act;
			int pre = OUT(k, "pre", F32, n, preacts(k, n), TOL_ROUND);
			if (v == 2)
				arg_alias(k, "out", pre, TOL_ROUND);
			else
				OUT(k, "out", F32, n, NULL, act ? TOL_ROUND : TOL_ACT);
			float *bias = randn(k, (size_t)C, 0, 0.5f);
			bias[0] = 0.0f; /* keeps the specials of column 0 */
			IN(k, "bias", F32, (size_t)C, bias);
			run_case(h, k, 0);
		}
		/* gelu (x = pre), relu with x = pre, relu with x = out; dbias or NULL */
		for (int v = 0; v < 3; v++)
			for (int db = 0; db < 2; db++) {
				int act = v ? BACKEND_ACT_RELU : BACKEND_ACT_GELU;
				struct kase *k = kase_new(
					"act_backward", run_act_backward,
					"act_backward N=%d C=%d act=%s x=%s dbias=%s", N, C,
					act ? "relu" : "gelu", v == 2 ? "out" : "pre",
					db ? "yes" : "NULL");
				k->i[0] = N, k->i[1] = C, k->i[2] = act;
				float *x = preacts(k, n);
				if (v == 2)
					for (size_t j = 0; j < n; j++)
						x[j] = x[j] > 0.0f ? x[j] : 0.0f;
				OUT(k, "d", F32, n, randn(k, n, 0, 1), act ? TOL_ROUND : TOL_ACT);
				if (db)
					OUT(k, "dbias", F32, (size_t)C, NULL, TOL_SUM_F);
				else
					arg_null(k, "dbias");
				IN(k, "x", F32, n, x);
				run_case(h, k, 0);
			}
	}
}

Test(backend, activations)
{
	for_each_backend("activations", activations);
}

/* ---- attention ------------------------------------------------------------------------ */

/* attention_forward: i[] B, T, C, NH; p[] out, att, qkv.
 * attention_backward: i[] B, T, C, NH; p[] dqkv, dout, qkv, att. */
static int run_attention_forward(struct backend *be, void *const *p, const struct kase *k)
{
	return be->op->attention_forward(be, p[0], p[1], p[2], k->i[0], k->i[1], k->i[2],
					 k->i[3]);
}

/* attention_backward takes the att its own forward wrote (backend.h: what att holds above
 * the diagonal is the backend's business), so its case runs the forward first:
 * p[] dqkv, out, att, dout, qkv. */
static int run_attention_backward(struct backend *be, void *const *p, const struct kase *k)
{
	int rc = be->op->attention_forward(be, p[1], p[2], p[4], k->i[0], k->i[1], k->i[2],
					   k->i[3]);
	return rc ? rc : be->op->attention_backward(be, p[0], p[3], p[4], p[2], k->i[0],
						    k->i[1], k->i[2], k->i[3]);
}

/* Shapes for every tiling of cuda's fused kernels (attention.cu: tiles of 64 queries x 64 keys,
 * 32 keys at hs > 64; hs padded to 16, 32, 64 or 128; O kept in att when T > hs, recomputed
 * when not; hs > 128 falls back to the cuBLAS path): T = 1, below, at and past a tile and not a
 * multiple of one; hs from 1 to 136, multiples of 4 (float4 loads) and not. att is compared
 * only on a backend that keeps P there (backend.h); out and dqkv always. */
static void attention(struct harness *h)
{
	static const int shapes[][4] = {
		{1, 1, 4, 1},    {2, 3, 12, 3},   {1, 7, 8, 2},     {2, 17, 16, 4}, {1, 33, 24, 2},
		{1, 32, 32, 4},  {2, 64, 16, 2},  {1, 100, 48, 4},  {1, 97, 64, 8}, {3, 5, 6, 6},
		{2, 128, 128, 4}, {4, 65, 96, 3},
		{2, 1, 32, 2},   {1, 70, 64, 4},  {2, 33, 30, 3},   {2, 130, 64, 2},
		{2, 150, 128, 2}, {1, 40, 128, 2}, {1, 140, 256, 2}, {1, 20, 256, 2},
		{1, 9, 272, 2},
	};
	int keeps_p = h->be[0]->attention_keeps_p;
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], NH = shapes[s][3];
		size_t nq = (size_t)B * T * 3 * C, na = (size_t)B * NH * T * T;
		uint8_t *upper = NULL; /* att above the diagonal (all of it without P): unspecified */
		struct kase *k = kase_new("attention_forward", run_attention_forward,
					  "attention_forward B=%d T=%d C=%d NH=%d", B, T, C, NH);
		k->i[0] = B, k->i[1] = T, k->i[2] = C, k->i[3] = NH;
		upper = own(k, na);
		for (size_t bh = 0; bh < (size_t)B * NH; bh++)
			for (int i = 0; i < T; i++)
				for (int j = keeps_p ? i + 1 : 0; j < T; j++)
					upper[(bh * T + i) * T + j] = 1;
		OUT(k, "out", F32, (size_t)B * T * C, NULL, TOL_ATT);
		int ai = OUT(k, "att", F32, na, NULL, TOL_PROB);
		k->a[ai].unspec = upper;
		IN(k, "qkv", F32, nq, randn(k, nq, 0, 1));
		run_case(h, k, 1);

		/* the backward, after the backend's own forward */
		struct kase *b = kase_new("attention_backward", run_attention_backward,
					  "attention_backward B=%d T=%d C=%d NH=%d (after its forward)",
					  B, T, C, NH);
		b->i[0] = B, b->i[1] = T, b->i[2] = C, b->i[3] = NH;
		OUT(b, "dqkv", F32, nq, NULL, TOL_ATT_BWD);
		OUT(b, "out", F32, (size_t)B * T * C, NULL, TOL_ATT);
		int bi = OUT(b, "att", F32, na, NULL, TOL_PROB);
		b->a[bi].unspec = upper;
		IN(b, "dout", F32, (size_t)B * T * C, randn(b, (size_t)B * T * C, 0, 1));
		IN(b, "qkv", F32, nq, k->a[2].init);
		run_case(h, b, 0);
		kase_free(k);
	}
}

Test(backend, attention)
{
	for_each_backend("attention", attention);
}

/* cuda reads CORE_CUDA_ATTENTION when it opens: a value it does not know is a usage error that
 * names the variable and the value (Criterion runs each test in its own process). */
Test(backend, cuda_attention_variable)
{
	if (!strstr(backend_names(), "cuda")) {
		cr_log_info("cuda is not built: CORE_CUDA_ATTENTION not checked");
		return;
	}
	struct backend *be = NULL;
	/* checked before the device is looked for: a usage error even without a GPU */
	setenv("CORE_CUDA_ATTENTION", "flash", 1);
	int rc = backend_open(&be, "cuda", NULL);
	cr_assert_eq(rc, CORE_EUSAGE, "CORE_CUDA_ATTENTION=flash: backend_open returned %d", rc);
	cr_assert(strstr(err_detail(), "CORE_CUDA_ATTENTION") && strstr(err_detail(), "'flash'"),
		  "the detail does not name the variable and the value: %s", err_detail());
	static const char *const good[] = {"cublas", "fused", ""};
	for (int i = 0; i < 3; i++) {
		setenv("CORE_CUDA_ATTENTION", good[i], 1);
		rc = backend_open(&be, "cuda", NULL);
		if (rc == CORE_EUNSUPPORTED) {
			fprintf(stderr, "test_backend: cuda_attention_variable: SKIPPED the accepted "
				"values: cuda cannot start here (%s)\n", err_detail());
			return;
		}
		cr_assert_eq(rc, 0, "CORE_CUDA_ATTENTION='%s': %s", good[i], err_detail());
		cr_assert_eq(be->attention_keeps_p, i != 1, "CORE_CUDA_ATTENTION='%s': "
			     "attention_keeps_p is %d", good[i], be->attention_keeps_p);
		backend_close(be);
	}
}

/* ---- cross-entropy and AdamW ---------------------------------------------------------- */

/* crossentropy_forward: i[] N, V; p[] probs, losses, targets.
 * crossentropy_backward: i[] N, V; f[0] scale; p[] probs, targets.
 * adamw_update: i[0] nseg; d[] lr, beta1, beta2, eps; l[0] t; f[0] grad_scale; seg;
 *   p[] p, g, m, v. */
static int run_ce_forward(struct backend *be, void *const *p, const struct kase *k)
{
	return be->op->crossentropy_forward(be, p[0], p[1], p[2], k->i[0], k->i[1]);
}

static int run_ce_backward(struct backend *be, void *const *p, const struct kase *k)
{
	return be->op->crossentropy_backward(be, p[0], p[1], k->i[0], k->i[1], k->f[0]);
}

static int run_adamw(struct backend *be, void *const *p, const struct kase *k)
{
	return be->op->adamw_update(be, p[0], p[1], p[2], p[3], k->seg, k->i[0], k->d[0],
				    k->d[1], k->d[2], k->d[3], (long)k->l[0], k->f[0]);
}

static void crossentropy_and_adamw(struct harness *h)
{
	static const int shapes[][2] = {{1, 1},   {1, 2},    {3, 7},  {7, 17},  {17, 33},
					{16, 64}, {33, 100}, {5, 257}, {2, 1000}, {3, 5000},
					{64, 5000}};
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		int N = shapes[s][0], V = shapes[s][1];
		size_t n = (size_t)N * V;
		for (int tg = 0; tg < 2; tg++) {
			struct kase *k = kase_new("crossentropy_forward", run_ce_forward,
						  "crossentropy_forward N=%d V=%d targets=%s", N, V,
						  tg ? "yes" : "NULL");
			k->i[0] = N, k->i[1] = V;
			float *logits = randn(k, n, 0, 4);
			logits[n / 2] = 80.0f; /* must not overflow */
			logits[n - 1] = -80.0f;
			OUT(k, "probs", F32, n, logits, TOL_PROB);
			/* targets NULL: the losses must be left as they are */
			OUT(k, "losses", F32, (size_t)N, randn(k, (size_t)N, 0, 1), TOL_LOSS);
			if (tg)
				IN(k, "targets", I32, (size_t)N, randtok(k, (size_t)N, V));
			else
				arg_null(k, "targets");
			run_case(h, k, 0);
		}
		for (int sc = 0; sc < 2; sc++) {
			float scale = sc ? 2.5f : 1.0f / (float)N;
			struct kase *k = kase_new("crossentropy_backward", run_ce_backward,
						  "crossentropy_backward N=%d V=%d scale=%g", N, V,
						  (double)scale);
			k->i[0] = N, k->i[1] = V;
			k->f[0] = scale;
			OUT(k, "probs", F32, n, randu(k, n, 0, 1), TOL_ROUND);
			IN(k, "targets", I32, (size_t)N, randtok(k, (size_t)N, V));
			run_case(h, k, 0);
		}
	}

	/* AdamW on a flat buffer with segments of different weight decay and gaps between them
	 * that no segment covers (they must come back unchanged) */
	static const size_t sizes[] = {1, 7, 100, 1000, 4099, 100003};
	for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
		for (int step = 0; step < 2; step++)
			for (int sc = 0; sc < 2; sc++) {
				size_t n = sizes[s];
				long t = step ? 50 : 1;
				float gs = sc ? 2.0f : 0.5f;
				double b2 = step ? 0.999 : 0.95;
				struct kase *k = kase_new("adamw_update", run_adamw,
							  "adamw_update n=%zu t=%ld grad_scale=%g "
							  "beta2=%g", n, t, (double)gs, b2);
				struct backend_segment *seg = own(k, 4 * sizeof *seg);
				int nseg = 0;
				if (n < 7) {
					seg[nseg++] = (struct backend_segment){0, n, 0.1};
				} else {
					size_t q = n / 7;
					seg[nseg++] = (struct backend_segment){0, 2 * q, 0.1};
					seg[nseg++] = (struct backend_segment){2 * q, q, 0.0};
					/* a gap of q elements, then */
					seg[nseg++] = (struct backend_segment){4 * q, q + 1, 0.01};
					seg[nseg++] = (struct backend_segment){5 * q + 1,
									       n - 5 * q - 1, 0.1};
				}
				k->seg = seg;
				k->i[0] = nseg;
				k->d[0] = step ? 1e-2 : 3e-3;
				k->d[1] = 0.9, k->d[2] = b2, k->d[3] = 1e-8;
				k->l[0] = t;
				k->f[0] = gs;
				float *m = own(k, n * sizeof *m), *v = own(k, n * sizeof *v);
				if (step) {
					/* a state like 49 earlier steps leave: v >= m^2, so that
					 * the step is at most about lr */
					float *r = randn(k, 2 * n, 0, 0.1f);
					for (size_t j = 0; j < n; j++) {
						m[j] = r[j];
						v[j] = r[j] * r[j] + r[n + j] * r[n + j] + 1e-6f;
					}
				}
				OUT(k, "p", F32, n, randn(k, n, 0, 1), TOL_ADAMW);
				IN(k, "g", F32, n, randn(k, n, 0, 1));
				OUT(k, "m", F32, n, m, TOL_ADAMW);
				OUT(k, "v", F32, n, v, TOL_ADAMW);
				run_case(h, k, 0);
			}
}

Test(backend, crossentropy_and_adamw)
{
	for_each_backend("crossentropy_and_adamw", crossentropy_and_adamw);
}

/* ---- the MoE gate --------------------------------------------------------------------- */

/* moe_gate_forward: gate; p[] logits, probs, clean, top, idx, score, aux.
 * moe_gate_backward: gate; f[0] aux_weight; p[] logits, probs, clean, idx, dscore, dlogits. */
enum { G_LOGITS, G_PROBS, G_CLEAN, G_TOP, G_IDX, G_SCORE, G_AUX };

static int run_gate_forward(struct backend *be, void *const *p, const struct kase *k)
{
	return be->op->moe_gate_forward(be, &k->gate, p[0], p[1], p[2], p[3], p[4], p[5], p[6]);
}

static int run_gate_backward(struct backend *be, void *const *p, const struct kase *k)
{
	return be->op->moe_gate_backward(be, &k->gate, p[0], p[1], p[2], p[3], p[4], k->f[0],
					 p[5]);
}

/* The routed logit as the contract defines it (float, no fma). */
static float routed(const struct backend_moe_gate *g, const float *logits, int64_t t, int e)
{
	float z = logits[t * g->E + e];
	if (g->noise == 0.0f)
		return z;
	float s = g->noise / (float)g->E;
	float nz = s * rng_normal(g->seed, RNG_STREAM_NOISE,
				  ((uint64_t)g->step * (uint64_t)g->T + (uint64_t)t) * g->E + e);
	return z + nz;
}

/* After ref's gate forward: a token whose ref probabilities have two of the k + 1 largest
 * within 1e-5 relative of each other (not equal by construction: equal routed logits give
 * equal probabilities on every backend, and then the lower index must win) may be ordered
 * differently by a float softmax; its idx, score and top are not compared, and neither is the
 * aux loss of the case (the choices feed it). */
static void gate_near_ties(struct kase *k, struct harness *h)
{
	const struct backend_moe_gate *g = &k->gate;
	const float *logits = k->a[G_LOGITS].init, *p = k->a[G_PROBS].want;
	const int32_t *idx = k->a[G_IDX].want;
	int64_t T = g->T;
	int E = g->E, K = g->k;
	uint8_t *tok = own(k, (size_t)T), *rk = own(k, (size_t)K * T), *aux = own(k, 1);
	for (int64_t t = 0; t < T; t++) {
		const float *pt = p + t * E;
		int near = 0;
		for (int r = 0; r < K; r++) {
			int e = idx[r * T + t], n = -1;
			if (r + 1 < K) {
				n = idx[(r + 1) * T + t];
			} else {
				for (int c = 0; c < E; c++) { /* the largest not chosen */
					int chosen = 0;
					for (int q = 0; q < K; q++)
						chosen |= idx[q * T + t] == c;
					if (!chosen && (n < 0 || pt[c] > pt[n]))
						n = c;
				}
			}
			if (n < 0)
				continue; /* k == E */
			if (pt[e] - pt[n] < 1e-5 * pt[e] &&
			    routed(g, logits, t, e) != routed(g, logits, t, n))
				near = 1;
		}
		if (near) {
			tok[t] = 1;
			for (int r = 0; r < K; r++)
				rk[r * T + t] = 1;
			aux[0] = 1;
			h->tie_tokens++;
		}
	}
	h->gate_tokens += T;
	k->a[G_TOP].skip = tok;
	k->a[G_IDX].skip = rk;
	k->a[G_SCORE].skip = rk;
	k->a[G_AUX].skip = aux;
}

/* Gate logits: N(0, 1.5), or (ties) every row made of E/2 values each at two experts. */
static float *gate_logits(struct kase *k, int64_t T, int E, int ties)
{
	float *x = randn(k, (size_t)(T * E), 0, 1.5f);
	if (ties)
		for (int64_t t = 0; t < T; t++)
			for (int e = 1; e < E; e += 2) {
				int64_t other = (int64_t)randbelow((uint64_t)(e + 1) / 2) * 2;
				x[t * E + e] = x[t * E + other];
			}
	return x;
}

static struct kase *gate_forward_case(int64_t T, int E, int K, float noise, int li, int ties)
{
	struct kase *k = kase_new("moe_gate_forward", run_gate_forward,
				  "moe_gate_forward T=%lld E=%d k=%d noise=%g loss=%s seed=1234 "
				  "step=3%s", (long long)T, E, K, (double)noise,
				  li ? "load-importance" : "gshard", ties ? " tied logits" : "");
	k->gate = (struct backend_moe_gate){.T = T, .E = E, .k = K, .noise = noise,
					    .seed = 1234, .step = 3, .load_importance = li};
	size_t n = (size_t)(T * E);
	IN(k, "logits", F32, n, gate_logits(k, T, E, ties));
	OUT(k, "probs", F32, n, NULL, TOL_PROB);
	if (li)
		OUT(k, "clean", F32, n, NULL, TOL_PROB);
	else
		arg_null(k, "clean");
	OUT(k, "top", F32, (size_t)T, NULL, TOL_PROB);
	OUT(k, "idx", I32, (size_t)(K * T), NULL, TOL_EXACT);
	OUT(k, "score", F32, (size_t)(K * T), NULL, TOL_SCORE);
	OUT(k, "aux", F32, 1, NULL, TOL_AUX);
	k->after_ref = gate_near_ties;
	return k;
}

static void moe_gate(struct harness *h)
{
	static const int shapes[][3] = {{1, 1, 1},   {1, 2, 1},   {3, 2, 2},  {7, 4, 1},
					{17, 8, 2},  {33, 16, 2}, {100, 8, 3}, {64, 32, 1},
					{100, 64, 2}, {5, 7, 7},   {48, 16, 4}, {2048, 16, 2},
					{1000, 64, 4}};
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		int64_t T = shapes[s][0];
		int E = shapes[s][1], K = shapes[s][2];
		/* GShard without and with noise, load-importance (noise, E >= 2) */
		for (int mode = 0; mode < 3; mode++) {
			if (mode == 2 && E < 2)
				continue;
			float noise = mode ? 1.0f : 0.0f;
			struct kase *f = gate_forward_case(T, E, K, noise, mode == 2, 0);
			run_case(h, f, 1);

			/* the backward gets ref's forward outputs, so both backends see one
			 * routing */
			for (int w = 0; w < 2; w++) {
				float aux_weight = w ? 0.5f : 0.0f;
				if (w == 0 && s % 2)
					continue; /* aux_weight 0 at every other shape */
				struct kase *b = kase_new(
					"moe_gate_backward", run_gate_backward,
					"moe_gate_backward T=%lld E=%d k=%d noise=%g loss=%s "
					"aux_weight=%g seed=1234 step=3", (long long)T, E, K,
					(double)noise, mode == 2 ? "load-importance" : "gshard",
					(double)aux_weight);
				b->gate = f->gate;
				b->f[0] = aux_weight;
				size_t n = (size_t)(T * E);
				IN(b, "logits", F32, n, f->a[G_LOGITS].init);
				IN(b, "probs", F32, n, f->a[G_PROBS].want);
				if (mode == 2)
					IN(b, "clean", F32, n, f->a[G_CLEAN].want);
				else
					arg_null(b, "clean");
				IN(b, "idx", I32, (size_t)(K * T), f->a[G_IDX].want);
				IN(b, "dscore", F32, (size_t)(K * T),
				   randn(b, (size_t)(K * T), 0, 1));
				OUT(b, "dlogits", F32, n, NULL, TOL_GATE_BWD);
				run_case(h, b, 0);
			}
			kase_free(f);
		}
	}
	/* exact ties: equal logits give equal probabilities, and the lower expert must win */
	static const int tied[][3] = {{33, 8, 1}, {33, 8, 3}, {17, 6, 2}, {16, 16, 4}};
	for (size_t s = 0; s < sizeof tied / sizeof tied[0]; s++)
		run_case(h, gate_forward_case(tied[s][0], tied[s][1], tied[s][2], 0, 0, 1), 0);

	cr_log_info("%s: moe_gate_forward: %ld of %ld tokens not compared for a near-tie",
		    h->name, h->tie_tokens, h->gate_tokens);
	cr_assert(h->tie_tokens * 100 <= h->gate_tokens,
		  "%s: %ld of %ld gate tokens skipped for near-ties: more than 1%%", h->name,
		  h->tie_tokens, h->gate_tokens);
}

Test(backend, moe_gate)
{
	for_each_backend("moe_gate", moe_gate);
}

/* ---- MoE routing and dispatch --------------------------------------------------------- */

/* A routing built on the host: k distinct experts per token, scores in (0.05, 1), distinct
 * BPR keys, the counts, and the slots by the contract of moe_locations (BPR order). */
struct route {
	int64_t T, C;
	int E, k;
	int32_t *idx, *loc;
	float *score, *top;
	int64_t *count;
};

static void make_route(struct kase *kc, struct route *r, int64_t T, int E, int k, int64_t C)
{
	*r = (struct route){.T = T, .C = C, .E = E, .k = k};
	r->idx = own(kc, sizeof *r->idx * (size_t)(k * T));
	r->loc = own(kc, sizeof *r->loc * (size_t)(k * T));
	r->count = own(kc, sizeof *r->count * (size_t)E);
	r->score = randu(kc, (size_t)(k * T), 0.05f, 1.0f);
	r->top = own(kc, sizeof *r->top * (size_t)T);
	int *perm = own(kc, sizeof *perm * (size_t)(E > T ? E : T));
	for (int64_t t = 0; t < T; t++) {
		for (int e = 0; e < E; e++)
			perm[e] = e;
		for (int j = 0; j < k; j++) { /* a partial Fisher-Yates shuffle */
			int c = j + (int)randbelow((uint64_t)(E - j)), tmp = perm[j];
			perm[j] = perm[c];
			perm[c] = tmp;
			r->idx[j * T + t] = perm[j];
			r->count[perm[j]]++;
		}
	}
	/* keys (perm(t) + 1) / (T + 1) for a random permutation: all distinct */
	for (int64_t t = 0; t < T; t++)
		perm[t] = (int)t;
	for (int64_t t = T - 1; t > 0; t--) {
		int64_t c = (int64_t)randbelow((uint64_t)t + 1);
		int tmp = perm[t];
		perm[t] = perm[c];
		perm[c] = tmp;
	}
	for (int64_t t = 0; t < T; t++)
		r->top[t] = (float)(perm[t] + 1) / (float)(T + 1);
	/* visit rank by rank, tokens by top descending: the token with key rank j is the one
	 * with perm = T - 1 - j */
	int64_t *order = own(kc, sizeof *order * (size_t)T), *next = own(kc, sizeof *next * E);
	for (int64_t t = 0; t < T; t++)
		order[T - 1 - perm[t]] = t;
	for (int j = 0; j < k; j++)
		for (int64_t q = 0; q < T; q++) {
			int64_t i = j * T + order[q];
			int64_t l = next[r->idx[i]]++;
			r->loc[i] = l < C ? (int32_t)l : -1;
		}
}

/* The route's four arrays as arguments 0..3 (idx, loc, score, count). */
static void route_args(struct kase *k, const struct route *r)
{
	IN(k, "idx", I32, (size_t)(r->k * r->T), r->idx);
	IN(k, "loc", I32, (size_t)(r->k * r->T), r->loc);
	IN(k, "score", F32, (size_t)(r->k * r->T), r->score);
	IN(k, "count", I64, (size_t)r->E, r->count);
	k->l[0] = r->T, k->l[1] = r->C;
	k->i[0] = r->E, k->i[1] = r->k;
}

static struct backend_moe_route route_of(void *const *p, const struct kase *k)
{
	return (struct backend_moe_route){.T = k->l[0], .C = k->l[1], .E = k->i[0],
					  .k = k->i[1], .idx = p[0], .loc = p[1], .score = p[2],
					  .count = p[3]};
}

/* moe_count: l[] n; i[0] E; p[] idx, count.
 * moe_locations: l[] T, C; i[] k, E; top NULL or not; p[] idx, top, loc.
 * encode: l[2] M, i[2] zero_pad; p[4] x, p[5] disp. decode: l[2] M; p[4] eo, p[5] y.
 * decode_backward: l[2] M, i[2] zero_pad; p[4] dy, p[5] eo, p[6] d_eo, p[7] dscore.
 * encode_backward: l[2] M; p[4] d_disp, p[5] dx. */
static int run_count(struct backend *be, void *const *p, const struct kase *k)
{
	return be->op->moe_count(be, p[0], k->l[0], k->i[0], p[1]);
}

static int run_locations(struct backend *be, void *const *p, const struct kase *k)
{
	return be->op->moe_locations(be, p[0], p[1], k->l[0], k->i[0], k->i[1], k->l[1], p[2]);
}

static int run_encode(struct backend *be, void *const *p, const struct kase *k)
{
	struct backend_moe_route r = route_of(p, k);
	return be->op->moe_encode(be, &r, p[4], p[5], k->l[2], k->i[2]);
}

static int run_decode(struct backend *be, void *const *p, const struct kase *k)
{
	struct backend_moe_route r = route_of(p, k);
	return be->op->moe_decode(be, &r, p[4], p[5], k->l[2]);
}

static int run_decode_backward(struct backend *be, void *const *p, const struct kase *k)
{
	struct backend_moe_route r = route_of(p, k);
	return be->op->moe_decode_backward(be, &r, p[4], p[5], p[6], p[7], k->l[2], k->i[2]);
}

static int run_encode_backward(struct backend *be, void *const *p, const struct kase *k)
{
	struct backend_moe_route r = route_of(p, k);
	return be->op->moe_encode_backward(be, &r, p[4], p[5], k->l[2]);
}

/* One moe_locations case; key 0: top NULL, 1: distinct keys, 2: four values, tied. */
static void locations_case(struct harness *h, int64_t T, int K, int E, int64_t C, int key)
{
	static const char *const keys[] = {"NULL", "distinct", "tied"};
	struct kase *k = kase_new("moe_locations", run_locations,
				  "moe_locations T=%lld k=%d E=%d C=%lld top=%s", (long long)T, K,
				  E, (long long)C, keys[key]);
	struct route r;
	make_route(k, &r, T, E, K, C);
	if (key == 2)
		for (int64_t t = 0; t < T; t++)
			r.top[t] = (float)(randbelow(4) + 1) / 4.0f;
	k->l[0] = T, k->l[1] = C;
	k->i[0] = K, k->i[1] = E;
	IN(k, "idx", I32, (size_t)(K * T), r.idx);
	if (key)
		IN(k, "top", F32, (size_t)T, r.top);
	else
		arg_null(k, "top");
	OUT(k, "loc", I32, (size_t)(K * T), NULL, TOL_EXACT);
	run_case(h, k, 0);
}

/* The routes of the dispatch tests, float32 and bfloat16: with and without drops, M odd, a
 * multiple of 4 but not of 8, and of 8. */
static const int64_t routes[][5] = {
	/* T, M, E, k, C */
	{1, 1, 1, 1, 1},    {3, 7, 2, 2, 3},     {7, 17, 4, 1, 2},  {17, 16, 8, 2, 5},
	{33, 32, 4, 2, 40}, {100, 33, 16, 2, 12}, {64, 64, 8, 3, 20}, {100, 100, 32, 1, 3},
	{50, 48, 6, 6, 50}, {1024, 128, 16, 2, 100}, {2000, 64, 64, 4, 150},
};
#define NROUTES (sizeof routes / sizeof routes[0])

static void moe_dispatch(struct harness *h)
{
	static const int counts[][2] = {{1, 1}, {3, 2}, {17, 4}, {100, 8}, {1000, 64}, {33, 3},
					{200, 16}, {100000, 64}};
	for (size_t s = 0; s < sizeof counts / sizeof counts[0]; s++) {
		int64_t n = counts[s][0];
		int E = counts[s][1];
		struct kase *k = kase_new("moe_count", run_count, "moe_count n=%lld E=%d",
					  (long long)n, E);
		k->l[0] = n;
		k->i[0] = E;
		IN(k, "idx", I32, (size_t)n, randtok(k, (size_t)n, E));
		OUT(k, "count", I64, (size_t)E, NULL, TOL_EXACT);
		run_case(h, k, 0);
	}

	/* locations: capacities that drop most, about the mean load, nothing; BPR keys none,
	 * distinct, or four values (ties keep token order) */
	static const int Ts[] = {1, 3, 17, 33, 100, 4096};
	static const int EK[][2] = {{1, 1}, {2, 2}, {4, 1}, {8, 2}, {16, 3}};
	for (size_t a = 0; a < sizeof Ts / sizeof Ts[0]; a++)
		for (size_t b = 0; b < sizeof EK / sizeof EK[0]; b++) {
			int64_t T = Ts[a];
			int E = EK[b][0], K = EK[b][1];
			int64_t caps[3] = {1, (K * T + E - 1) / E, K * T};
			for (int c = 0; c < 3; c++)
				for (int key = 0; key < 3; key++)
					locations_case(h, T, K, E, caps[c], key);
		}

	/* encode, decode and their backwards on routes with and without drops */
	for (size_t s = 0; s < NROUTES; s++) {
		int64_t T = routes[s][0], M = routes[s][1], C = routes[s][4];
		int E = (int)routes[s][2], K = (int)routes[s][3];
		size_t nx = (size_t)(T * M), nd = (size_t)(E * C * M), nk = (size_t)(K * T);
		for (int zp = 0; zp < 2; zp++) {
			struct kase *k = kase_new("moe_encode", run_encode,
						  "moe_encode T=%lld M=%lld E=%d k=%d C=%lld "
						  "zero_pad=%d", (long long)T, (long long)M, E, K,
						  (long long)C, zp);
			struct route r;
			make_route(k, &r, T, E, K, C);
			route_args(k, &r);
			k->l[2] = M, k->i[2] = zp;
			IN(k, "x", F32, nx, randn(k, nx, 0, 1));
			/* preset: padding rows must be zeroed (zero_pad) or left as they are */
			OUT(k, "disp", F32, nd, randn(k, nd, 0, 1), TOL_EXACT);
			run_case(h, k, 0);
		}
		{
			struct kase *k = kase_new("moe_decode", run_decode,
						  "moe_decode T=%lld M=%lld E=%d k=%d C=%lld",
						  (long long)T, (long long)M, E, K, (long long)C);
			struct route r;
			make_route(k, &r, T, E, K, C);
			route_args(k, &r);
			k->l[2] = M;
			IN(k, "eo", F32, nd, randn(k, nd, 0, 1));
			OUT(k, "y", F32, nx, NULL, TOL_SUM_F);
			run_case(h, k, 0);
		}
		for (int zp = 0; zp < 2; zp++)
			for (int inplace = 0; inplace < 2; inplace++) {
				struct kase *k = kase_new(
					"moe_decode_backward", run_decode_backward,
					"moe_decode_backward T=%lld M=%lld E=%d k=%d C=%lld "
					"zero_pad=%d d_eo=%s", (long long)T, (long long)M, E, K,
					(long long)C, zp, inplace ? "eo" : "own buffer");
				struct route r;
				make_route(k, &r, T, E, K, C);
				route_args(k, &r);
				k->l[2] = M, k->i[2] = zp;
				IN(k, "dy", F32, nx, randn(k, nx, 0, 1));
				int eo = IN(k, "eo", F32, nd, randn(k, nd, 0, 1));
				if (inplace)
					arg_alias(k, "d_eo", eo, TOL_ROUND);
				else
					OUT(k, "d_eo", F32, nd, randn(k, nd, 0, 1), TOL_ROUND);
				OUT(k, "dscore", F32, nk, NULL, TOL_DOT);
				run_case(h, k, 0);
			}
		{
			struct kase *k = kase_new("moe_encode_backward", run_encode_backward,
						  "moe_encode_backward T=%lld M=%lld E=%d k=%d "
						  "C=%lld", (long long)T, (long long)M, E, K,
						  (long long)C);
			struct route r;
			make_route(k, &r, T, E, K, C);
			route_args(k, &r);
			k->l[2] = M;
			IN(k, "d_disp", F32, nd, randn(k, nd, 0, 1));
			OUT(k, "dx", F32, nx, NULL, TOL_SUM_F);
			run_case(h, k, 0);
		}
	}
}

/* 366 cases on every backend: under ASan the emulated cuda backend's (every CUDA thread a
 * user-level thread) alone takes about a minute of one core, past the suite's 60 s. */
Test(backend, moe_dispatch, .timeout = 180)
{
	for_each_backend("moe_dispatch", moe_dispatch);
}

/* ---- the dispatch ops on bfloat16 rows -----------------------------------------------------
 * The same routes and flags as moe_dispatch, the rows drawn N(0,1) and rounded to bfloat16.
 * encode_bf16 must give ref's bits; dscore is a float32 dot product as in the fp32 op (the
 * products are exact), compared with ref's; the bfloat16 sums and d_eo are compared with
 * their exact values, which ref's fp32 op gives from the widened inputs (rounding once from
 * double), within half a bfloat16 ulp plus the float32 sum's error; ref's own bfloat16 results
 * are held to the same bound. */

static int run_encode_bf16(struct backend *be, void *const *p, const struct kase *k)
{
	struct backend_moe_route r = route_of(p, k);
	return be->op->moe_encode_bf16(be, &r, p[4], p[5], k->l[2], k->i[2]);
}

static int run_decode_bf16(struct backend *be, void *const *p, const struct kase *k)
{
	struct backend_moe_route r = route_of(p, k);
	return be->op->moe_decode_bf16(be, &r, p[4], p[5], k->l[2]);
}

static int run_decode_backward_bf16(struct backend *be, void *const *p, const struct kase *k)
{
	struct backend_moe_route r = route_of(p, k);
	return be->op->moe_decode_backward_bf16(be, &r, p[4], p[5], p[6], p[7], k->l[2],
						k->i[2]);
}

static int run_encode_backward_bf16(struct backend *be, void *const *p, const struct kase *k)
{
	struct backend_moe_route r = route_of(p, k);
	return be->op->moe_encode_backward_bf16(be, &r, p[4], p[5], k->l[2]);
}

/* n draws of N(0,1) rounded to bfloat16, and those values widened back to float. */
static uint16_t *randbf(struct kase *k, size_t n)
{
	const float *x = randn(k, n, 0, 1);
	uint16_t *b = own(k, n * sizeof *b);
	for (size_t j = 0; j < n; j++)
		b[j] = backend_bf16_from_float(x[j]);
	return b;
}

static float *widened(struct kase *k, const uint16_t *b, size_t n)
{
	float *x = own(k, n * sizeof *x);
	for (size_t j = 0; j < n; j++)
		x[j] = backend_bf16_to_float(b[j]);
	return x;
}

/* Argument j of the fp32 case k32 after it ran on ref: the exact values for the bfloat16
 * case k (owned by k); k32 is freed. */
static const float *exact_of(struct harness *h, struct kase *k, struct kase *k32, int j)
{
	void *res[MAXARG];
	exec(h->ref, "ref, fp32 on the widened inputs", k32, 0, res);
	float *x = own(k, k32->a[j].n * sizeof *x);
	memcpy(x, res[j], k32->a[j].n * sizeof *x);
	for (int i = 0; i < k32->nargs; i++)
		free(res[i]);
	kase_free(k32);
	return x;
}

static void moe_dispatch_bf16(struct harness *h)
{
	const struct backend_ops *op = h->be[0]->op;
	if (!op->moe_encode_bf16 || !op->moe_decode_bf16 || !op->moe_decode_backward_bf16 ||
	    !op->moe_encode_backward_bf16) {
		h->summary = "SKIPPED: the backend has no bfloat16 dispatch ops";
		return;
	}
	for (size_t s = 0; s < NROUTES; s++) {
		int64_t T = routes[s][0], M = routes[s][1], C = routes[s][4];
		int E = (int)routes[s][2], K = (int)routes[s][3];
		size_t nx = (size_t)(T * M), nd = (size_t)(E * C * M), nk = (size_t)(K * T);
		for (int zp = 0; zp < 2; zp++) {
			struct kase *k = kase_new("moe_encode_bf16", run_encode_bf16,
						  "moe_encode_bf16 T=%lld M=%lld E=%d k=%d C=%lld "
						  "zero_pad=%d", (long long)T, (long long)M, E, K,
						  (long long)C, zp);
			struct route r;
			make_route(k, &r, T, E, K, C);
			route_args(k, &r);
			k->l[2] = M, k->i[2] = zp;
			IN(k, "x", BF16, nx, randbf(k, nx));
			OUT(k, "disp", BF16, nd, randbf(k, nd), TOL_EXACT);
			run_case(h, k, 0);
		}
		{
			struct kase *k = kase_new("moe_decode_bf16", run_decode_bf16,
						  "moe_decode_bf16 T=%lld M=%lld E=%d k=%d C=%lld",
						  (long long)T, (long long)M, E, K, (long long)C);
			struct kase *k32 = kase_new("moe_decode", run_decode, "%s (fp32)", k->what);
			struct route r;
			make_route(k, &r, T, E, K, C);
			route_args(k, &r);
			route_args(k32, &r);
			k->l[2] = k32->l[2] = M;
			const uint16_t *eo = randbf(k, nd);
			IN(k, "eo", BF16, nd, eo);
			int y = OUT(k, "y", BF16, nx, NULL, TOL_BF16_SUM);
			IN(k32, "eo", F32, nd, widened(k, eo, nd));
			OUT(k32, "y", F32, nx, NULL, TOL_EXACT);
			k->a[y].exact = exact_of(h, k, k32, y);
			run_case(h, k, 0);
		}
		for (int zp = 0; zp < 2; zp++)
			for (int inplace = 0; inplace < 2; inplace++) {
				struct kase *k = kase_new(
					"moe_decode_backward_bf16", run_decode_backward_bf16,
					"moe_decode_backward_bf16 T=%lld M=%lld E=%d k=%d C=%lld "
					"zero_pad=%d d_eo=%s", (long long)T, (long long)M, E, K,
					(long long)C, zp, inplace ? "eo" : "own buffer");
				struct kase *k32 = kase_new("moe_decode_backward",
							    run_decode_backward, "%s (fp32)",
							    k->what);
				struct route r;
				make_route(k, &r, T, E, K, C);
				route_args(k, &r);
				route_args(k32, &r);
				k->l[2] = k32->l[2] = M, k->i[2] = k32->i[2] = zp;
				const uint16_t *dy = randbf(k, nx), *eo = randbf(k, nd);
				IN(k, "dy", BF16, nx, dy);
				int eoj = IN(k, "eo", BF16, nd, eo);
				IN(k32, "dy", F32, nx, widened(k, dy, nx));
				int eo32 = IN(k32, "eo", F32, nd, widened(k, eo, nd));
				int d;
				if (inplace) {
					arg_alias(k, "d_eo", eoj, TOL_BF16_ROUND);
					d = k->nargs - 1;
					arg_alias(k32, "d_eo", eo32, TOL_EXACT);
				} else {
					const uint16_t *pre = randbf(k, nd);
					d = OUT(k, "d_eo", BF16, nd, pre, TOL_BF16_ROUND);
					OUT(k32, "d_eo", F32, nd, widened(k, pre, nd), TOL_EXACT);
				}
				OUT(k, "dscore", F32, nk, NULL, TOL_DOT);
				OUT(k32, "dscore", F32, nk, NULL, TOL_EXACT);
				k->a[d].exact = exact_of(h, k, k32, d);
				run_case(h, k, 0);
			}
		{
			struct kase *k = kase_new(
				"moe_encode_backward_bf16", run_encode_backward_bf16,
				"moe_encode_backward_bf16 T=%lld M=%lld E=%d k=%d C=%lld",
				(long long)T, (long long)M, E, K, (long long)C);
			struct kase *k32 = kase_new("moe_encode_backward", run_encode_backward,
						    "%s (fp32)", k->what);
			struct route r;
			make_route(k, &r, T, E, K, C);
			route_args(k, &r);
			route_args(k32, &r);
			k->l[2] = k32->l[2] = M;
			const uint16_t *dd = randbf(k, nd);
			IN(k, "d_disp", BF16, nd, dd);
			int dx = OUT(k, "dx", BF16, nx, NULL, TOL_BF16_SUM);
			IN(k32, "d_disp", F32, nd, widened(k, dd, nd));
			OUT(k32, "dx", F32, nx, NULL, TOL_EXACT);
			k->a[dx].exact = exact_of(h, k, k32, dx);
			k->a[dx].ties = 1;
			run_case(h, k, 0);
		}
	}
}

Test(backend, moe_dispatch_bf16)
{
	for_each_backend("moe_dispatch_bf16", moe_dispatch_bf16);
}

/* ---- the registry --------------------------------------------------------------------- */

Test(backend, registry_names_the_built_backends)
{
	struct backend *be = (struct backend *)1;
	char list[256], *save = NULL;

	int rc = backend_open(&be, "nosuch", NULL);
	cr_assert_eq(rc, CORE_EUSAGE, "backend_open('nosuch') returned %d", rc);
	cr_assert_null(be, "a failed backend_open left *out set");
	char detail[512];
	snprintf(detail, sizeof detail, "%s", err_detail());
	cr_assert(strstr(detail, "nosuch"), "the detail does not name 'nosuch': %s", detail);
	snprintf(list, sizeof list, "%s", backend_names());
	int cuda_built = 0;
	for (char *name = strtok_r(list, ", ", &save); name; name = strtok_r(NULL, ", ", &save)) {
		cr_assert(strstr(detail, name), "the detail does not name built backend '%s': %s",
			  name, detail);
		cuda_built |= strcmp(name, "cuda") == 0;
	}

	if (!cuda_built) {
		rc = backend_open(&be, "cuda", NULL);
		cr_assert_eq(rc, CORE_EUSAGE, "backend_open('cuda') without cuda returned %d", rc);
		cr_assert(strstr(err_detail(), "not built"),
			  "the detail for 'cuda' does not say it is not built: %s", err_detail());
	} else {
		cr_log_info("cuda is built: its not-built message is not checked");
	}

	/* every built backend opens under its name and gives 64-byte aligned memory; ref is
	 * host memory, one thread */
	snprintf(list, sizeof list, "%s", backend_names());
	save = NULL;
	for (char *name = strtok_r(list, ", ", &save); name; name = strtok_r(NULL, ", ", &save)) {
		rc = backend_open(&be, name, NULL);
		if (rc == CORE_EUNSUPPORTED) {
			/* stderr, not cr_log_warn: a Criterion warning makes the run exit 1 */
			fprintf(stderr, "test_backend: registry: SKIPPED backend '%s': built but "
				"cannot start here (%s)\n", name, err_detail());
			continue;
		}
		cr_assert_eq(rc, 0, "backend_open('%s') returned %d: %s", name, rc, err_detail());
		cr_assert_str_eq(be->name, name);
		if (strcmp(name, "ref") == 0)
			cr_assert(be->host_visible == 1 && be->threads == 1);
		static const size_t sizes[] = {0, 1, 3, 64, 1000};
		for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
			void *p = NULL;
			rc = backend_alloc_zero(be, &p, sizes[s]);
			cr_assert_eq(rc, 0, "%s: alloc_zero(%zu): %s", name, sizes[s],
				     err_detail());
			cr_assert(p && (uintptr_t)p % 64 == 0, "%s: alloc(%zu) gave %p", name,
				  sizes[s], p);
			unsigned char back[1000];
			rc = be->op->download(be, back, p, sizes[s]);
			cr_assert_eq(rc, 0);
			for (size_t j = 0; j < sizes[s]; j++)
				cr_assert_eq(back[j], 0, "%s: alloc_zero(%zu) byte %zu is %d", name,
					     sizes[s], j, back[j]);
			be->op->free(be, p);
		}
		be->op->free(be, NULL);
		/* profiling: seconds or NaN, never negative; ref cannot tell */
		be->op->profile(be, 1);
		double secs = be->op->gemm_seconds(be);
		cr_assert(isnan(secs) || secs >= 0, "%s: gemm_seconds %g", name, secs);
		if (strcmp(name, "ref") == 0)
			cr_assert(isnan(secs) && be->op->workspace_bytes(be) == 0);
		be->op->profile(be, 0);
		backend_close(be);
	}
}

/* ---- whole steps: a GPT-2 training step and an MoE layer step ------------------------------
 * The same step on the tested backend (at each of its thread counts: the bits must agree)
 * and on ref, compared tensor by tensor: the largest difference over a tensor against the
 * tensor's largest reference magnitude (errors of many float ops accumulate along the
 * chain, so per-element tolerances would only measure cancellation). */

/* max |got - want| / max |want| over n floats (0 when both are zero). */
static double tensor_rel_err(const float *got, const float *want, size_t n)
{
	double num = 0.0, den = 0.0;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - (double)want[i]);
		num = d > num || isnan(d) ? d : num;
		den = fabs((double)want[i]) > den ? fabs((double)want[i]) : den;
	}
	return den > 0.0 ? num / den : num;
}

static float *download_floats(struct backend *be, const float *src, size_t n)
{
	float *h = malloc(sizeof(float) * (n ? n : 1));
	cr_assert(h);
	cr_assert_eq(be->op->download(be, h, src, sizeof(float) * n), 0);
	return h;
}

/* One step of a small GPT-2 on be: forward, backward, grad norm, AdamW (t = 1); the loss,
 * then the gradients and the parameters after the step, into host buffers. */
struct gpt2_step_out {
	float loss, norm;
	float *grads, *params;
	size_t n;
};

enum { GS_B = 3, GS_T = 16 };
static const struct model_config gs_cfg = {.n_layer = 2, .n_embd = 32, .n_head = 4,
					   .seq_len = GS_T, .vocab_size = 50, .n_out = 0};
static const double gs_lr = 1e-3;

static void gpt2_step_on(struct backend *be, struct gpt2_step_out *o)
{
	struct gpt2 g;
	int32_t x[GS_B * GS_T], y[GS_B * GS_T];
	for (int i = 0; i < GS_B * GS_T; i++) {
		x[i] = (int32_t)rng_below(21, RNG_STREAM_TEST, (uint64_t)i, 50);
		y[i] = (int32_t)rng_below(22, RNG_STREAM_TEST, (uint64_t)i, 50);
	}
	const struct adamw_config opt = {0.9, 0.95, 1e-8, 0.1};
	cr_assert_eq(gpt2_create(&g, &gs_cfg, GS_B, GS_T, be), 0, "%s", err_detail());
	cr_assert_eq(gpt2_init_params(&g, 3), 0);
	cr_assert_eq(gpt2_forward(&g, x, y, GS_B, GS_T, &o->loss), 0, "%s", err_detail());
	cr_assert_eq(gpt2_backward(&g), 0);
	cr_assert_eq(gpt2_grad_norm(&g, &o->norm), 0);
	o->n = g.nparams;
	o->grads = download_floats(be, g.grads, g.nparams);
	cr_assert_eq(gpt2_adamw_step(&g, &opt, gs_lr, 1, 1.0f), 0);
	o->params = download_floats(be, g.params, g.nparams);
	gpt2_free(&g);
}

static void gpt2_step(struct harness *h)
{
	static char line[200];
	double worst_g = 0.0, worst_p = 0.0;
	struct gpt2_step_out r, o[3];
	gpt2_step_on(h->ref, &r);
	double gmax = 0.0;
	for (size_t i = 0; i < r.n; i++)
		gmax = fabs(r.grads[i]) > gmax ? fabs(r.grads[i]) : gmax;
	/* Gradients to 1e-5 of their largest (float against double: ~1e-7 here); at t = 1
	 * AdamW moves each parameter by about
	 * lr g / (|g| + eps), so a gradient error delta moves it by up to 2 lr delta / (|g| +
	 * eps): that, plus float rounding, bounds the parameters after the step. */
	const double gtol = 1e-5, delta = gtol * gmax;
	for (int b = 0; b < h->nbe; b++) {
		gpt2_step_on(h->be[b], &o[b]);
		const char *what = "GPT-2 step L=2 C=32 NH=4 T=16 V=50 B=3";
		cr_assert(fabsf(o[b].loss - r.loss) <= 1e-5f * fabsf(r.loss), "%s on %s, %d threads: "
			  "loss %.9g, ref %.9g", what, h->name, h->threads[b], (double)o[b].loss,
			  (double)r.loss);
		cr_assert(fabsf(o[b].norm - r.norm) <= 1e-4f * r.norm, "%s on %s: grad norm %.9g, "
			  "ref %.9g", what, h->name, (double)o[b].norm, (double)r.norm);
		double e = tensor_rel_err(o[b].grads, r.grads, r.n);
		cr_assert(e <= gtol, "%s on %s, %d threads: gradients differ from ref by %.3g of "
			  "their largest (tolerance %g)", what, h->name, h->threads[b], e, gtol);
		worst_g = fmax(worst_g, e / gtol);
		for (size_t i = 0; i < r.n; i++) {
			double d = fabs((double)o[b].params[i] - r.params[i]);
			double tol = 1e-6 + 2.0 * gs_lr * fmin(1.0, delta / (fabs(r.grads[i]) + 1e-8));
			worst_p = fmax(worst_p, d / tol);
			cr_assert(d <= tol, "%s on %s: parameter %zu after AdamW %.9g, ref %.9g "
				  "(gradient %.3g)", what, h->name, i, (double)o[b].params[i],
				  r.params[i], (double)r.grads[i]);
		}
		if (b > 0)
			cr_assert(!memcmp(o[b].params, o[0].params, sizeof(float) * r.n) &&
				  !memcmp(o[b].grads, o[0].grads, sizeof(float) * r.n) &&
				  o[b].loss == o[0].loss, "%s on %s: %d threads and %d threads differ",
				  what, h->name, h->threads[b], h->threads[0]);
	}
	h->cases = 1;
	snprintf(line, sizeof line, "one GPT-2 step on ref and at %d thread counts (same bits); "
		 "gradients at %.2f, parameters after AdamW at %.2f of their tolerances", h->nbe,
		 worst_g, worst_p);
	h->summary = line;
	for (int b = 0; b < h->nbe; b++)
		free(o[b].grads), free(o[b].params);
	free(r.grads), free(r.params);
}

Test(backend, gpt2_training_step)
{
	for_each_backend("gpt2_training_step", gpt2_step);
}

/* One forward and backward of an MoE layer on be; outputs into host buffers, in the order
 * y, dx, dwg, dw1, db1, dw2, db2, then the routing (idx, loc). */
enum { MS_T = 200, MS_M = 24, MS_H = 16, MS_E = 6, MS_K = 2 };

struct moe_step_out {
	float *t[7];
	int32_t idx[MS_K * MS_T], loc[MS_K * MS_T];
	float aux;
	int64_t C, dropped;
};

static const size_t ms_n[7] = {MS_T * MS_M, MS_T * MS_M, MS_M * MS_E, MS_E * MS_M * MS_H,
			       MS_E * MS_H, MS_E * MS_H * MS_M, MS_E * MS_M};
static const char *const ms_name[7] = {"y", "dx", "dwg", "dw1", "db1", "dw2", "db2"};
/* Each tensor to 5e-6 of its largest: float sums of at most a few hundred terms against
 * double, ~4e-7 here. */
#define MS_TOL 5e-6

static void moe_step_on(struct backend *be, struct moe_step_out *o)
{
	struct moe_config cfg;
	struct moe_params p, g;
	struct moe_layer *l;
	float *x, *dy, *y, *dx;
	const size_t n = (size_t)MS_T * MS_M;

	moe_config_default(&cfg, MS_T, MS_M, MS_H, MS_E);
	cfg.k = MS_K;
	cfg.bpr = 1;
	cfg.gate_noise = 1.0f;
	cfg.act = MOE_ACT_GELU;
	cfg.seed = 4;
	cr_assert_eq(moe_params_alloc(&p, &cfg, be), 0);
	cr_assert_eq(moe_params_alloc(&g, &cfg, be), 0);
	cr_assert_eq(moe_params_init(&p, &cfg, 9), 0);
	cr_assert_eq(be->op->alloc(be, (void **)&x, n * sizeof(float)), 0);
	cr_assert_eq(be->op->alloc(be, (void **)&dy, n * sizeof(float)), 0);
	cr_assert_eq(be->op->alloc(be, (void **)&y, n * sizeof(float)), 0);
	cr_assert_eq(be->op->alloc(be, (void **)&dx, n * sizeof(float)), 0);
	cr_assert_eq(be->op->fill_normal(be, x, n, 0.0f, 1.0f, 5, RNG_STREAM_TEST, 0), 0);
	cr_assert_eq(be->op->fill_normal(be, dy, n, 0.0f, 1.0f, 6, RNG_STREAM_TEST, 0), 0);
	cr_assert_eq(moe_layer_init(&l, &cfg, be), 0);
	cr_assert_eq(moe_forward(l, &p, x, y, MS_T, MS_K, 1.0, 2), 0, "%s", err_detail());
	const struct moe_routing *r = moe_layer_routing(l);
	o->aux = r->aux_loss;
	o->C = r->C;
	o->dropped = r->dropped;
	cr_assert_eq(be->op->download(be, o->idx, r->idx, sizeof o->idx), 0);
	cr_assert_eq(be->op->download(be, o->loc, r->loc, sizeof o->loc), 0);
	cr_assert_eq(moe_backward(l, &p, x, dy, dx, &g, 0.3f), 0, "%s", err_detail());
	const float *src[7] = {y, dx, g.wg, g.w1, g.b1, g.w2, g.b2};
	for (int i = 0; i < 7; i++)
		o->t[i] = download_floats(be, src[i], ms_n[i]);
	moe_layer_free(l);
	moe_params_free(&p);
	moe_params_free(&g);
	be->op->free(be, x);
	be->op->free(be, dy);
	be->op->free(be, y);
	be->op->free(be, dx);
}

static void moe_step(struct harness *h)
{
	static char line[200];
	double worst = 0.0;
	struct moe_step_out r, o[3];
	const char *what = "MoE layer step T=200 M=24 H=16 E=6 k=2 BPR noise 1 gelu capacity 1";
	moe_step_on(h->ref, &r);
	for (int b = 0; b < h->nbe; b++) {
		moe_step_on(h->be[b], &o[b]);
		/* The inputs were chosen with no near-tie in the gate: the routing is exact. */
		cr_assert(!memcmp(o[b].idx, r.idx, sizeof r.idx) &&
			  !memcmp(o[b].loc, r.loc, sizeof r.loc) && o[b].C == r.C &&
			  o[b].dropped == r.dropped, "%s on %s: routing differs from ref", what,
			  h->name);
		cr_assert(fabsf(o[b].aux - r.aux) <= 1e-5f * fabsf(r.aux), "%s on %s: aux loss "
			  "%.9g, ref %.9g", what, h->name, (double)o[b].aux, (double)r.aux);
		for (int i = 0; i < 7; i++) {
			double e = tensor_rel_err(o[b].t[i], r.t[i], ms_n[i]);
			cr_assert(e <= MS_TOL, "%s on %s, %d threads: %s differs from ref by %.3g of "
				  "its largest (tolerance %g)", what, h->name, h->threads[b],
				  ms_name[i], e, MS_TOL);
			worst = fmax(worst, e / MS_TOL);
			if (b > 0)
				cr_assert(!memcmp(o[b].t[i], o[0].t[i], sizeof(float) * ms_n[i]),
					  "%s on %s: %s differs between %d and %d threads", what,
					  h->name, ms_name[i], h->threads[b], h->threads[0]);
		}
	}
	h->cases = 1;
	snprintf(line, sizeof line, "one MoE layer step on ref and at %d thread counts (same "
		 "bits); routing exact, y, dx and the 5 gradients at %.2f of the tolerance", h->nbe,
		 worst);
	h->summary = line;
	for (int i = 0; i < 7; i++) {
		free(r.t[i]);
		for (int b = 0; b < h->nbe; b++)
			free(o[b].t[i]);
	}
}

Test(backend, moe_layer_step)
{
	for_each_backend("moe_layer_step", moe_step);
}

/* ---- reduced-precision products (backend.h: enum backend_precision) --------------------- *
 * A backend opened with tf32 or bf16 must round every operand of a product to that format and
 * sum the exact products in float32. The oracle is written here, not taken from a backend:
 * each operand element is a value r that has an exact tf32 (bf16) form plus 0.1 to 0.4 of its
 * unit in the last place, away from zero. Rounding to nearest (ties to even or away) and
 * truncation all give r back, so the expected product is sum r_a r_b, in double, whatever the
 * hardware's rounding mode; a backend that skips the rounding is off by ~0.25 ulp per term
 * (1e-3 of the result for bf16, 1e-4 for tf32), far above the float32 accumulation bound the
 * comparison allows. Backends without the precision must refuse it at backend_open. */

/* x with its lowest `drop` mantissa bits cleared: a value of the narrower format. */
static float trunc_bits(float x, int drop)
{
	uint32_t u;
	memcpy(&u, &x, 4);
	u &= ~((1u << drop) - 1u);
	memcpy(&x, &u, 4);
	return x;
}

/* n operands: exact[] (representable with drop bits fewer) and given[] (exact + 0.1..0.4 ulp,
 * away from zero), drawn from draw onwards. */
static void narrow_operands(float *exact, float *given, size_t n, int drop, uint64_t draw)
{
	for (size_t i = 0; i < n; i++) {
		float r = trunc_bits((float)(2.0 * rng_uniform(31, RNG_STREAM_TEST, draw + 2 * i) -
					     1.0), drop);
		int e;
		frexpf(r, &e);
		float ulp = r == 0.0f ? 0.0f : ldexpf(1.0f, e - 24 + drop);
		float f = (float)(0.1 + 0.3 * rng_uniform(31, RNG_STREAM_TEST, draw + 2 * i + 1));
		exact[i] = r;
		given[i] = r + copysignf(f * ulp, r);
		cr_assert(trunc_bits(given[i], drop) == r, "operand %zu: %a + %g ulp leaves %a", i,
			  (double)r, (double)f, (double)given[i]);
	}
}

static void product_case(struct backend *be, int drop, int ta, int tb, int M, int N, int K,
			 float alpha, float beta, int pad, int shift, uint64_t draw)
{
	/* leading dimensions at least 1, as CBLAS wants them (K = 0) */
	int lda = (ta ? M : K > 0 ? K : 1) + pad, ldb = (tb ? K > 0 ? K : 1 : N) + pad;
	int ldc = N + pad;
	size_t nA = (size_t)(ta ? K : M) * lda, nB = (size_t)(tb ? N : K) * ldb;
	size_t nC = (size_t)M * ldc;
	float *ea = calloc(nA + 1, 4), *ga = calloc(nA + 1, 4), *eb = calloc(nB + 1, 4);
	float *gb = calloc(nB + 1, 4), *c0 = calloc(nC + 1, 4), *got = calloc(nC + 1, 4);
	cr_assert(ea && ga && eb && gb && c0 && got);
	narrow_operands(ea, ga, nA, drop, draw);
	narrow_operands(eb, gb, nB, drop, draw + 1000000);
	for (size_t i = 0; i < nC; i++)
		c0[i] = (float)rng_normal(31, RNG_STREAM_TEST, draw + 2000000 + i);
	/* shift: every buffer one float past an aligned address (the staging path) */
	void *pa, *pb, *pc;
	cr_assert_eq(be->op->alloc(be, &pa, 4 * (nA + 1)), 0);
	cr_assert_eq(be->op->alloc(be, &pb, 4 * (nB + 1)), 0);
	cr_assert_eq(be->op->alloc(be, &pc, 4 * (nC + 1)), 0);
	float *A = (float *)pa + shift, *B = (float *)pb + shift, *C = (float *)pc + shift;
	cr_assert_eq(be->op->upload(be, A, ga, 4 * nA), 0);
	cr_assert_eq(be->op->upload(be, B, gb, 4 * nB), 0);
	cr_assert_eq(be->op->upload(be, C, c0, 4 * nC), 0);
	int rc = be->op->gemm(be, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
	cr_assert_eq(rc, 0, "gemm: %s", err_detail());
	cr_assert_eq(be->op->download(be, got, C, 4 * nC), 0);
	double worst = 0;
	for (int i = 0; i < M; i++)
		for (int j = 0; j < N; j++) {
			double s = 0, mag = 0;
			for (int l = 0; l < K; l++) {
				double a = ta ? ea[(size_t)l * lda + i] : ea[(size_t)i * lda + l];
				double b = tb ? eb[(size_t)j * ldb + l] : eb[(size_t)l * ldb + j];
				s += a * b;
				mag += fabs(a * b);
			}
			double want = alpha * s + (beta != 0.0f ? beta * c0[(size_t)i * ldc + j] : 0);
			/* float32 sums of K exact products, then alpha and beta: a few ulps of
			 * the magnitudes involved */
			double tol = 4.0 * FLT_EPSILON * (fabs(alpha) * mag * (1 + K / 8.0) +
							  fabs(beta * c0[(size_t)i * ldc + j])) +
				     1e-30;
			double err = fabs(got[(size_t)i * ldc + j] - want);
			cr_assert(err <= tol, "%s %s: gemm ta %d tb %d M %d N %d K %d alpha %g beta "
				  "%g pad %d shift %d: C[%d,%d] = %.9g, want %.9g (error %.3g, "
				  "tolerance %.3g)", be->name, backend_precision_name(be->precision),
				  ta, tb, M, N, K, (double)alpha, (double)beta, pad, shift, i, j,
				  (double)got[(size_t)i * ldc + j], want, err, tol);
			worst = fmax(worst, err / tol);
		}
	/* the gaps between C's rows come back untouched */
	for (int i = 0; i < M; i++)
		for (int j = N; j < ldc; j++)
			cr_assert(memcmp(&got[(size_t)i * ldc + j], &c0[(size_t)i * ldc + j], 4) == 0,
				  "gemm wrote C[%d,%d] past N = %d", i, j, N);
	be->op->free(be, pa);
	be->op->free(be, pb);
	be->op->free(be, pc);
	free(ea), free(ga), free(eb), free(gb), free(c0), free(got);
}

/* attention on one backend: out, and dqkv from the backward of dout after it */
static void attention_run(struct backend *be, const float *qkv, const float *dout, float *out,
			  float *dqkv, int B, int T, int C, int NH)
{
	size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
	void *q, *o, *a, *d, *dq;
	cr_assert_eq(be->op->alloc(be, &q, 4 * nq), 0);
	cr_assert_eq(be->op->alloc(be, &dq, 4 * nq), 0);
	cr_assert_eq(be->op->alloc(be, &o, 4 * no), 0);
	cr_assert_eq(be->op->alloc(be, &d, 4 * no), 0);
	cr_assert_eq(be->op->alloc(be, &a, 4 * na), 0);
	cr_assert_eq(be->op->upload(be, q, qkv, 4 * nq), 0);
	cr_assert_eq(be->op->upload(be, d, dout, 4 * no), 0);
	cr_assert_eq(be->op->attention_forward(be, o, a, q, B, T, C, NH), 0, "%s", err_detail());
	cr_assert_eq(be->op->attention_backward(be, dq, d, q, a, B, T, C, NH), 0, "%s",
		     err_detail());
	cr_assert_eq(be->op->download(be, out, o, 4 * no), 0);
	cr_assert_eq(be->op->download(be, dqkv, dq, 4 * nq), 0);
	void *all[] = {q, dq, o, d, a};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		be->op->free(be, all[i]);
}

/* attention's products are batched ones: in a narrow precision its output and its backward's
 * dqkv stay within the format's error of ref's float64 results (a product that read a wrong
 * batch or block, or float32 operands, would not be both this close and this far) and move
 * away from the fp32 results (the operands were rounded); with 3 threads, the same bits as
 * with 1. T above 128 gives cpu's bf16 attention several blocks of queries. */
static void attention_case(struct backend *be, struct backend *be32, struct backend *ref,
			   enum backend_precision prec, int drop, int B, int T, int C, int NH)
{
	size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
	float *qkv = malloc(4 * nq), *dout = malloc(4 * no), *out[4], *dq[4];
	cr_assert(qkv && dout);
	for (size_t i = 0; i < nq; i++)
		qkv[i] = (float)rng_normal(33, RNG_STREAM_TEST, i);
	for (size_t i = 0; i < no; i++)
		dout[i] = (float)rng_normal(34, RNG_STREAM_TEST, i);
	struct backend *be3 = NULL;
	cr_assert_eq(backend_open(&be3, be->name,
				  &(struct backend_params){.precision = prec, .threads = 3}), 0);
	struct backend *bes[4] = {ref, be32, be, be3};
	for (int b = 0; b < 4; b++) {
		out[b] = malloc(4 * no), dq[b] = malloc(4 * nq);
		cr_assert(out[b] && dq[b]);
		attention_run(bes[b], qkv, dout, out[b], dq[b], B, T, C, NH);
	}
	double unit = ldexp(1.0, drop - 23); /* the format's relative spacing */
	double far = 0, dfar = 0, dscale = 0;
	for (size_t i = 0; i < no; i++) {
		double err = fabs(out[2][i] - out[0][i]);
		cr_assert(err <= 40 * unit * (1 + fabs(out[0][i])),
			  "%s %s: attention B %d T %d C %d NH %d: out[%zu] = %.7g, ref %.7g",
			  be->name, backend_precision_name(be->precision), B, T, C, NH, i,
			  (double)out[2][i], (double)out[0][i]);
		far = fmax(far, fabs(out[2][i] - out[1][i]));
	}
	/* dqkv: each of q, k, v's gradient sums over up to T products of rounded operands,
	 * the errors of which add like a random walk: held to a few units in the norm (a
	 * missing or doubled block of keys or queries is of the order of dqkv itself) */
	double se = 0, sr = 0, sf = 0;
	for (size_t i = 0; i < nq; i++) {
		se += ((double)dq[2][i] - dq[0][i]) * ((double)dq[2][i] - dq[0][i]);
		sr += (double)dq[0][i] * dq[0][i];
		sf += ((double)dq[2][i] - dq[1][i]) * ((double)dq[2][i] - dq[1][i]);
		dscale = fmax(dscale, fabs(dq[0][i]));
	}
	cr_assert(sqrt(se / sr) <= unit, "%s %s: attention backward B %d T %d C %d NH %d: "
		  "dqkv off ref by %.3g of its norm", be->name,
		  backend_precision_name(be->precision), B, T, C, NH, sqrt(se / sr));
	dfar = sqrt(sf / sr);
	cr_assert(far >= 0.05 * unit && dfar >= 0.05 * unit, "%s %s: attention equals the fp32 "
		  "one to %.3g (backward %.3g of its norm): were the operands rounded?", be->name,
		  backend_precision_name(be->precision), far, dfar);
	cr_assert(memcmp(out[2], out[3], 4 * no) == 0 && memcmp(dq[2], dq[3], 4 * nq) == 0,
		  "%s %s: attention B %d T %d: 1 and 3 threads differ", be->name,
		  backend_precision_name(be->precision), B, T);
	for (int b = 0; b < 4; b++)
		free(out[b]), free(dq[b]);
	free(qkv), free(dout);
	backend_close(be3);
}

/* The names and precision lists are made from the registry (backend.c), written out here by
 * hand: a backend or precision added to the table shows up in both, and in every test that
 * loops over backend_names(). */
Test(backend, registry_text)
{
	/* libcore decides whether cuda is in (nvcc found at build time), not this file */
	if (backend_precisions("cuda")) {
		cr_expect_str_eq(backend_names(), "cpu, ref, cuda");
		cr_expect_str_eq(backend_precisions("cuda"), "fp32, tf32, bf16");
	} else {
		cr_expect_str_eq(backend_names(), "cpu, ref");
	}
	cr_expect_str_eq(backend_precisions("cpu"), "fp32, bf16");
	cr_expect_str_eq(backend_precisions("ref"), "fp32");
	cr_expect_null(backend_precisions("gpu"));
	struct backend *be = NULL;
	cr_expect_eq(backend_open(&be, "ref", &(struct backend_params){.precision = BACKEND_TF32}),
		     CORE_EUSAGE);
	cr_expect_str_eq(err_detail(), "device 'ref' has no tf32 matrix products (it has: fp32)");
}

Test(backend, reduced_precision_products, .timeout = 120)
{
	static const struct {
		enum backend_precision p;
		int drop; /* float32 mantissa bits the format lacks */
	} prec[] = {{BACKEND_TF32, 13}, {BACKEND_BF16, 16}};
	char list[256], *save = NULL;
	snprintf(list, sizeof list, "%s", backend_names());
	for (char *name = strtok_r(list, ", ", &save); name; name = strtok_r(NULL, ", ", &save)) {
		const char *has = backend_precisions(name);
		cr_assert(has && strstr(has, "fp32"), "%s: precisions '%s'", name, has ? has : "");
		for (size_t p = 0; p < sizeof prec / sizeof prec[0]; p++) {
			const char *pn = backend_precision_name(prec[p].p);
			struct backend *be = NULL;
			int rc = backend_open(&be, name, &(struct backend_params){.precision =
										  prec[p].p});
			if (!strstr(has, pn)) {
				cr_assert_eq(rc, CORE_EUSAGE, "%s opened with %s: %d", name, pn, rc);
				cr_assert(strstr(err_detail(), pn) && strstr(err_detail(), name) &&
					  strstr(err_detail(), "fp32"), "%s", err_detail());
				continue;
			}
			/* built, but not here: no device, or (cpu bf16) no such instructions or
			 * library on this machine, which backend_open says in its detail */
			if (rc == CORE_EUNSUPPORTED || rc == CORE_EUSAGE) {
				fprintf(stderr, "test_backend: reduced_precision_products: SKIPPED "
					"backend '%s': built but cannot start here (%s)\n", name,
					err_detail());
				break;
			}
			cr_assert_eq(rc, 0, "%s %s: %s", name, pn, err_detail());
			cr_assert_eq(be->precision, prec[p].p);
			static const int shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 17, 64},
							{64, 48, 130}, {5, 9, 0}};
			int n = 0;
			uint64_t draw = 0;
			for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
				for (int t = 0; t < 4; t++, n++, draw += 10000000)
					product_case(be, prec[p].drop, t & 1, t >> 1, shapes[s][0],
						     shapes[s][1], shapes[s][2], n % 3 ? 1.0f : 0.5f,
						     n % 2 ? 0.75f : 0.0f, n % 5 == 3 ? 3 : 0,
						     n % 4 == 1, draw);
			struct backend *be32, *ref;
			cr_assert_eq(backend_open(&be32, name, NULL), 0);
			cr_assert_eq(backend_open(&ref, "ref", NULL), 0);
			attention_case(be, be32, ref, prec[p].p, prec[p].drop, 2, 37, 48, 3);
			attention_case(be, be32, ref, prec[p].p, prec[p].drop, 1, 300, 64, 2);
			fprintf(stderr, "test_backend: reduced_precision_products on '%s' %s: %d "
				"products against sums of the rounded operands, and attention (forward "
				"and backward, T up to 300) within the format's error\n", name, pn, n);
			backend_close(ref);
			backend_close(be32);
			backend_close(be);
		}
	}
}

/* ---- device collectives on one process ------------------------------------------------ *
 * A communicator of this process alone and rounds of transfers with itself: the k-th send
 * to a peer meets the k-th receive from it, whatever the sizes. This is where a machine with
 * one GPU runs the real NCCL (loading it, a communicator, a group of sends and receives);
 * the All-to-All over several processes is test/mpi/test_dist_dev.c's, under mpirun. Skipped
 * where the backend has no collectives (cpu, ref) or cannot make a communicator here (no
 * GPU; no NCCL library; the emulator's NCCL outside mpirun). */
/* fn(be) for each backend built into this binary that starts here, opened with the default
 * parameters and closed afterwards (one built without a device here is left out: the other
 * tests say so). */
static void each_startable_backend(void (*fn)(struct backend *be))
{
	char list[256], *save = NULL;
	snprintf(list, sizeof list, "%s", backend_names());
	for (char *name = strtok_r(list, ", ", &save); name; name = strtok_r(NULL, ", ", &save)) {
		struct backend *be = NULL;
		int rc = backend_open(&be, name, NULL);
		if (rc == CORE_EUNSUPPORTED)
			continue;
		cr_assert_eq(rc, 0, "%s: %s", name, err_detail());
		fn(be);
		backend_close(be);
	}
}

static void comm_self_round(struct backend *be)
{
	if (!be->op->comm_exchange) {
		cr_assert(!be->op->comm_unique_id && !be->op->comm_open && !be->op->comm_close,
			  "%s: some collectives but not comm_exchange", be->name);
		return;
	}
	if (be->op->comm_unique_id(be, NULL) < 0) {
		fprintf(stderr, "test_backend: comm_self_round: SKIPPED backend '%s': no "
			"communicator here (%s)\n", be->name, err_detail());
		return;
	}
	unsigned char id[BACKEND_COMM_ID_BYTES];
	void *comm = NULL;
	cr_assert_eq(be->op->comm_unique_id(be, id), 0, "%s: %s", be->name, err_detail());
	cr_assert_eq(be->op->comm_open(be, &comm, id, 1, 0), 0, "%s: %s", be->name, err_detail());
	/* three sends and three receives in one round, sizes 1, 4099 and 1 MiB + 3, and an
	 * empty entry on each side */
	static const size_t sz[] = {1, 0, 4099, ((size_t)1 << 20) + 3};
	enum { NS = sizeof sz / sizeof sz[0] };
	size_t total = 0;
	for (int i = 0; i < NS; i++)
		total += sz[i];
	unsigned char *h = malloc(total), *back = malloc(total);
	cr_assert(h && back);
	for (size_t i = 0; i < total; i++)
		h[i] = (unsigned char)(i * 7 + i / 251 + 3);
	void *src, *dst;
	cr_assert_eq(be->op->alloc(be, &src, total), 0);
	cr_assert_eq(be->op->alloc(be, &dst, total), 0);
	cr_assert_eq(be->op->upload(be, src, h, total), 0);
	cr_assert_eq(be->op->memset(be, dst, 0xa5, total), 0);
	struct backend_xfer x[2 * NS];
	size_t off = 0;
	for (int i = 0; i < NS; i++) {
		/* receives listed first: the order within a round does not matter */
		x[i] = (struct backend_xfer){0, 1, (char *)dst + off, sz[i]};
		x[NS + i] = (struct backend_xfer){0, 0, (char *)src + off, sz[i]};
		off += sz[i];
	}
	for (int round = 0; round < 2; round++) {
		cr_assert_eq(be->op->comm_exchange(be, comm, x, 2 * NS), 0, "%s round %d: %s",
			     be->name, round, err_detail());
		cr_assert_eq(be->op->download(be, back, dst, total), 0, "%s: %s", be->name,
			     err_detail());
		cr_assert(memcmp(h, back, total) == 0, "%s round %d: the bytes received differ "
			  "from those sent", be->name, round);
		cr_assert_eq(be->op->memset(be, dst, 0, total), 0);
	}
	be->op->comm_close(be, comm);
	be->op->free(be, src);
	be->op->free(be, dst);
	free(h);
	free(back);
	fprintf(stderr, "test_backend: comm_self_round on '%s': 2 rounds of 4 sends and 4 "
		"receives with itself (1 B to 1 MiB, an empty one), the same bytes back\n",
		be->name);
}

Test(backend, comm_self_round)
{
	each_startable_backend(comm_self_round);
}

/* The second queue (backend.h, side_begin): transfers queued there run after the main queue's
 * work before side_begin, and the main queue's work after side_wait runs after them; download
 * waits for both queues. On cuda under the emulator this is checked again with
 * CUDA_EMU_STREAMS=late-first and late-others (make test-cuda-emu), where a missing event shows:
 * the transfer or the op after it would read memory still poisoned. Misuse is CORE_EUSAGE. */
static void side_queue(struct backend *be)
{
	const struct backend_ops *op = be->op;
	if (!op->side_begin) {
		cr_assert(!op->side_end && !op->side_wait, "%s: side_begin without the rest",
			  be->name);
		return;
	}
	enum { N = 4099 };
	float *a, *b, *c, *d, h[N];
	cr_assert_eq(op->alloc(be, (void **)&a, sizeof h), 0);
	cr_assert_eq(op->alloc(be, (void **)&b, sizeof h), 0);
	cr_assert_eq(op->alloc(be, (void **)&c, sizeof h), 0);
	cr_assert_eq(op->alloc(be, (void **)&d, sizeof h), 0);
	int64_t m1 = -1, m2 = -1, m3 = -1;
	/* main: a = 1, d = 0.5; side: c = a, b = c (the even and the odd rows of 64 floats,
	 * and the tail), c = 0: the four ops follow the switch (a copy left on the main queue
	 * would run after the copies that read it, in late-first) */
	cr_assert_eq(op->fill(be, a, N, 1.0f), 0);
	cr_assert_eq(op->fill(be, d, N, 0.5f), 0);
	cr_assert_eq(op->side_begin(be), 0, "%s: %s", be->name, err_detail());
	cr_assert_eq(op->side_begin(be), CORE_EUSAGE, "%s: side_begin twice", be->name);
	cr_assert_eq(op->copy(be, c, a, sizeof h), 0);
	cr_assert_eq(op->copy_2d(be, b, 512, c, 512, 256, 32), 0);
	cr_assert_eq(op->copy_2d(be, b + 64, 512, c + 64, 512, 256, 32), 0);
	cr_assert_eq(op->copy_2d(be, b + 4096, 0, c + 4096, 0, 3 * sizeof(float), 1), 0);
	cr_assert_eq(op->memset(be, c, 0, sizeof h), 0);
	cr_assert_eq(op->side_end(be, &m1), 0, "%s: %s", be->name, err_detail());
	cr_assert_eq(op->side_end(be, NULL), CORE_EUSAGE, "%s: side_end twice", be->name);
	cr_assert_eq(op->side_wait(be, m1 + 1), CORE_EUSAGE, "%s: a mark not made", be->name);
	cr_assert_eq(op->side_wait(be, -1), CORE_EUSAGE, "%s: mark -1", be->name);
	/* main, after the mark: d += b, d += c (1.5) */
	cr_assert_eq(op->side_wait(be, m1), 0, "%s: %s", be->name, err_detail());
	cr_assert_eq(op->add_f32(be, d, b, N), 0);
	cr_assert_eq(op->add_f32(be, d, c, N), 0);
	/* side again: b = d, after the additions (side_begin's order); main waits, d += b
	 * (3) */
	cr_assert_eq(op->side_begin(be), 0);
	cr_assert_eq(op->copy_2d(be, b, 0, d, 0, sizeof h, 1), 0);
	cr_assert_eq(op->side_end(be, &m2), 0);
	cr_assert_eq(op->side_wait(be, m2), 0);
	cr_assert_eq(op->add_f32(be, d, b, N), 0);
	/* a transfer no op waits for: download waits for it by itself */
	cr_assert_eq(op->side_begin(be), 0);
	cr_assert_eq(op->copy_2d(be, c, 0, d, 0, sizeof h, 1), 0);
	cr_assert_eq(op->side_end(be, &m3), 0);
	cr_assert(m1 < m2 && m2 < m3, "%s: marks %lld %lld %lld do not increase", be->name,
		  (long long)m1, (long long)m2, (long long)m3);
	cr_assert_eq(op->download(be, h, c, sizeof h), 0, "%s: %s", be->name, err_detail());
	int bad = 0;
	for (int i = 0; i < N; i++)
		bad += h[i] != 3.0f;
	cr_assert_eq(bad, 0, "%s: %d of %d results are not 3 (c[0] = %g, c[%d] = %g)", be->name,
		     bad, N, (double)h[0], N - 1, (double)h[N - 1]);
	/* many marks: the ring wraps, and waiting for an old one still works */
	for (int i = 0; i < 2 * BACKEND_SIDE_MARKS + 3; i++) {
		cr_assert_eq(op->side_begin(be), 0);
		cr_assert_eq(op->memset(be, b, 0, sizeof h), 0);
		cr_assert_eq(op->side_end(be, NULL), 0);
	}
	cr_assert_eq(op->side_wait(be, m1), 0, "%s: an old mark: %s", be->name, err_detail());
	cr_assert_eq(op->sync(be), 0);
	op->free(be, a);
	op->free(be, b);
	op->free(be, c);
	op->free(be, d);
	fprintf(stderr, "test_backend: side_queue on '%s': transfers on the second queue in "
		"order with the ops around them, by side_begin and side_wait (%s)\n", be->name,
		getenv("CUDA_EMU_STREAMS") ? getenv("CUDA_EMU_STREAMS") : "device order");
}

Test(backend, side_queue)
{
	each_startable_backend(side_queue);
}

/* moe_route_copies (backend.h) against the definition written out on the host, exactly, at
 * several sizes and r; NULL on the host backends (the layer writes the copies itself). */
static void moe_route_copies(struct backend *be)
{
	if (!be->op->moe_route_copies) {
		cr_assert(be->host_visible, "%s: device memory without moe_route_copies", be->name);
		return;
	}
	static const struct {
		int T, k, E, r;
	} sh[] = {{1, 1, 1, 2}, {37, 2, 3, 2}, {300, 2, 8, 4}, {129, 3, 5, 3}, {64, 1, 2, 8}};
	int cases = 0;
	for (size_t c = 0; c < sizeof sh / sizeof sh[0]; c++) {
		const int64_t n = (int64_t)sh[c].k * sh[c].T, E = sh[c].E, r = sh[c].r;
		int32_t *idx = malloc(sizeof(int32_t) * n), *loc = malloc(sizeof(int32_t) * n);
		float *score = malloc(sizeof(float) * n);
		int64_t *count = malloc(sizeof(int64_t) * E);
		int32_t *vi = malloc(sizeof(int32_t) * n * r);
		int32_t *vl = malloc(sizeof(int32_t) * n * r);
		float *vs = malloc(sizeof(float) * n * r);
		int64_t *vc = malloc(sizeof(int64_t) * E * r);
		cr_assert(idx && loc && score && count && vi && vl && vs && vc);
		uint64_t s = 0x9e3779b97f4a7c15ull * (c + 1);
		for (int64_t i = 0; i < n; i++) {
			s = s * 6364136223846793005ull + 1442695040888963407ull;
			idx[i] = (int32_t)((s >> 33) % (uint64_t)E);
			loc[i] = (int32_t)((s >> 13) % 50) - 1;
			score[i] = (float)(s >> 40) / 16777216.0f - 0.5f;
		}
		for (int64_t e = 0; e < E; e++)
			count[e] = 1000 * e + 7 * (int64_t)c;
		void *d[8];
		size_t bytes[8] = {sizeof(int32_t) * n, sizeof(int32_t) * n, sizeof(float) * n,
				   sizeof(int64_t) * E, sizeof(int32_t) * n * r,
				   sizeof(int32_t) * n * r, sizeof(float) * n * r,
				   sizeof(int64_t) * E * r};
		const void *h[4] = {idx, loc, score, count};
		for (int i = 0; i < 8; i++) {
			cr_assert_eq(be->op->alloc(be, &d[i], bytes[i]), 0);
			if (i < 4)
				cr_assert_eq(be->op->upload(be, d[i], h[i], bytes[i]), 0);
		}
		const struct backend_moe_route in = {.T = sh[c].T, .C = 50, .E = (int)E,
						     .k = sh[c].k, .idx = d[0], .loc = d[1],
						     .score = d[2], .count = d[3]};
		cr_assert_eq(be->op->moe_route_copies(be, &in, (int)r, d[4], d[5], d[6], d[7]),
			     0, "%s: %s", be->name, err_detail());
		cr_assert_eq(be->op->download(be, vi, d[4], bytes[4]), 0);
		cr_assert_eq(be->op->download(be, vl, d[5], bytes[5]), 0);
		cr_assert_eq(be->op->download(be, vs, d[6], bytes[6]), 0);
		cr_assert_eq(be->op->download(be, vc, d[7], bytes[7]), 0);
		for (int64_t j = 0; j < r; j++)
			for (int64_t i = 0; i < n; i++) {
				cr_assert_eq(vi[j * n + i], idx[i] * r + j,
					     "%s T=%d r=%d: vidx[%lld]", be->name, sh[c].T, (int)r,
					     (long long)(j * n + i));
				cr_assert_eq(vl[j * n + i], loc[i]);
				cr_assert(memcmp(&vs[j * n + i], &score[i], 4) == 0);
			}
		for (int64_t e = 0; e < E; e++)
			for (int64_t j = 0; j < r; j++)
				cr_assert_eq(vc[e * r + j], count[e], "%s: vcount[%lld]", be->name,
					     (long long)(e * r + j));
		for (int i = 0; i < 8; i++)
			be->op->free(be, d[i]);
		free(idx), free(loc), free(score), free(count);
		free(vi), free(vl), free(vs), free(vc);
		cases++;
	}
	fprintf(stderr, "test_backend: moe_route_copies on '%s': %d routes copied r = 2 to 8 "
		"times, equal to the definition\n", be->name, cases);
}

Test(backend, moe_route_copies)
{
	each_startable_backend(moe_route_copies);
}
