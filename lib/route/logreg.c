/* logreg.c - the router's logistic regression and its bias correction; the math is in
 * logreg.h.
 *
 * Why this shape: the loss is taken over blocks of rows; inside a block the rows are
 * independent (one thread each) and leave their loss and residuals p - e_y in place, and
 * every sum over rows (the loss, each gradient entry) then runs in row order, one thread per
 * slice of the gradient. No sum is split by thread or by block, so neither the fit nor the
 * correction changes with the thread count. The correction's auction and cycle steps are
 * serial and take most of its time (a parallel auction's bids would race, and their order
 * decides ties); only the logits and the per-class gains run in parallel.
 */
#include "route/logreg.h"

#include <lbfgs.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/banned.h"

#define BLOCK_DOUBLES (1 << 21) /* a block of rows of the loss holds this many doubles */
#define COLS 64      /* gradient columns per task */
#define ZSTACK 1024  /* standardised features kept on the stack (else recomputed per class) */
#define NONE UINT32_MAX

int logreg_init(struct logreg *m, int k, int d)
{
	memset(m, 0, sizeof *m);
	if (k < 1 || d < 1)
		return err_set(CORE_EUSAGE, NULL, "a logistic regression needs k >= 1 classes and "
			       "d >= 1 features, not %d and %d", k, d);
	if ((size_t)k * (size_t)d + (size_t)k > (size_t)INT32_MAX)
		return err_set(CORE_EUSAGE, NULL, "a logistic regression of %d classes by %d "
			       "features is too large", k, d);
	m->mu = calloc((size_t)d, sizeof *m->mu);
	m->sd = malloc(sizeof *m->sd * (size_t)d);
	m->w = calloc((size_t)k * (size_t)d, sizeof *m->w);
	m->b = calloc((size_t)k, sizeof *m->b);
	m->bias = calloc((size_t)k, sizeof *m->bias);
	if (!m->mu || !m->sd || !m->w || !m->b || !m->bias) {
		logreg_free(m);
		return err_set(CORE_ENOMEM, NULL, "out of memory for a %d by %d logistic regression",
			       k, d);
	}
	for (int j = 0; j < d; j++)
		m->sd[j] = 1.0f;
	m->k = k;
	m->d = d;
	return 0;
}

void logreg_free(struct logreg *m)
{
	free(m->mu);
	free(m->sd);
	free(m->w);
	free(m->b);
	free(m->bias);
	memset(m, 0, sizeof *m);
}

/* ---- the model ------------------------------------------------------------------------------ */

static double zval(const struct logreg *m, const float *row, int j)
{
	return ((double)row[j] - (double)m->mu[j]) / (double)m->sd[j];
}

static void zrow(const struct logreg *m, const float *row, double *z)
{
	for (int j = 0; j < m->d; j++)
		z[j] = zval(m, row, j);
}

/* Sums over the features run in LANES interleaved partial sums added in a fixed tree at
 * the end: the bits are the source's whether or not the compiler vectorises the lanes, and
 * the loop runs at vector speed (a single running sum is one long chain of dependent adds). */
#define LANES 8

static double lanes_sum(const double *s)
{
	return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* sum_j w_j z_j for the fit's double weights. */
static double dot_dd(const double *w, const double *z, int d)
{
	double s[LANES] = {0};
	int j = 0;

	for (; j + LANES <= d; j += LANES)
		for (int q = 0; q < LANES; q++)
			s[q] += w[j + q] * z[j + q];
	for (int q = 0; j + q < d; q++)
		s[q] += w[j + q] * z[j + q];
	return lanes_sum(s);
}

/* s_c(row) from z when given, else standardising as it goes: the same bits either way. */
static double logit1(const struct logreg *m, const float *row, const double *z, int c)
{
	const float *wc = m->w + (size_t)c * (size_t)m->d;
	const int d = m->d;
	double s[LANES] = {0};
	int j = 0;

	if (z) {
		for (; j + LANES <= d; j += LANES)
			for (int q = 0; q < LANES; q++)
				s[q] += (double)wc[j + q] * z[j + q];
		for (int q = 0; j + q < d; q++)
			s[q] += (double)wc[j + q] * z[j + q];
	} else {
		for (; j + LANES <= d; j += LANES)
			for (int q = 0; q < LANES; q++)
				s[q] += (double)wc[j + q] * zval(m, row, j + q);
		for (int q = 0; j + q < d; q++)
			s[q] += (double)wc[j + q] * zval(m, row, j + q);
	}
	return (double)m->b[c] + lanes_sum(s);
}

/* v_c(row); NaN (from a row that is not finite) ranks as -inf. */
static double decision(const struct logreg *m, const float *row, const double *z, int c)
{
	double v = (double)(float)logit1(m, row, z, c) + (double)m->bias[c];
	return v == v ? v : -INFINITY;
}

/* z of row on the stack when it fits (zb), else NULL (standardise per class). */
static const double *zmaybe(const struct logreg *m, const float *row, double *zb)
{
	if (m->d > ZSTACK)
		return NULL;
	zrow(m, row, zb);
	return zb;
}

void logreg_scores(const struct logreg *m, const float *row, float *out)
{
	double zb[ZSTACK];
	const double *z = zmaybe(m, row, zb);

	for (int c = 0; c < m->k; c++)
		out[c] = (float)decision(m, row, z, c);
}

void logreg_proba(const struct logreg *m, const float *row, float *p)
{
	double zb[ZSTACK], mx = -INFINITY, sum = 0.0;
	const double *z = zmaybe(m, row, zb);

	/* Online softmax: the running sum is rescaled when the maximum grows, so no buffer of
	 * k doubles is needed; the second pass recomputes each value. */
	for (int c = 0; c < m->k; c++) {
		double v = decision(m, row, z, c);
		if (v > mx) {
			sum = sum * exp(mx - v) + 1.0;
			mx = v;
		} else if (v > -INFINITY) {
			sum += exp(v - mx);
		}
	}
	for (int c = 0; c < m->k; c++)
		p[c] = mx == -INFINITY ? (float)(1.0 / m->k)
				       : (float)(exp(decision(m, row, z, c) - mx) / sum);
}

#define KSTACK 256 /* decision values kept on the stack (else recomputed for each place) */

void logreg_predict(const struct logreg *m, const float *row, int topn, uint32_t *idx)
{
	double zb[ZSTACK], vb[KSTACK], pv = INFINITY;
	const double *z = zmaybe(m, row, zb);
	const int keep = m->k <= KSTACK;
	int pc = -1;

	for (int c = 0; keep && c < m->k; c++)
		vb[c] = decision(m, row, z, c);
	/* One pass per place: the best (value, index) after the previous place's in the order
	 * value descending, index ascending. */
	for (int r = 0; r < topn; r++) {
		double bv = -INFINITY;
		int bc = -1;
		for (int c = 0; c < m->k; c++) {
			double v = keep ? vb[c] : decision(m, row, z, c);
			int after = r == 0 || v < pv || (v == pv && c > pc);
			if (after && (bc < 0 || v > bv)) {
				bv = v;
				bc = c;
			}
		}
		idx[r] = (uint32_t)bc;
		pv = bv;
		pc = bc;
	}
}

/* ---- loss and gradient ---------------------------------------------------------------------- */

struct lg_work {
	size_t rows; /* rows per block: the fewer blocks, the fewer barriers; the bits do not
		      * depend on it (every sum runs over the rows in order) */
	double *Z;   /* [rows * d] standardised rows of a block */
	double *R;   /* [rows * k] their residuals p - e_y */
	double *L;   /* [rows] their losses */
};

static void work_free(struct lg_work *ws)
{
	free(ws->Z);
	free(ws->R);
	free(ws->L);
}

static int work_alloc(struct lg_work *ws, int k, int d, size_t n)
{
	ws->rows = BLOCK_DOUBLES / ((size_t)d + (size_t)k);
	if (ws->rows < 64)
		ws->rows = 64;
	if (ws->rows > n)
		ws->rows = n;
	ws->Z = malloc(sizeof *ws->Z * ws->rows * (size_t)d);
	ws->R = malloc(sizeof *ws->R * ws->rows * (size_t)k);
	ws->L = malloc(sizeof *ws->L * ws->rows);
	if (ws->Z && ws->R && ws->L)
		return 0;
	work_free(ws);
	return err_set(CORE_ENOMEM, NULL, "out of memory for the logistic regression's loss");
}

/* L(theta) and, when grad is not NULL, its gradient; labels already checked. */
static double loss_grad(const struct logreg *m, const float *x, const uint32_t *y, size_t n,
			double l2, const double *theta, double *grad, struct lg_work *ws)
{
	const int k = m->k, d = m->d;
	const size_t kd = (size_t)k * (size_t)d;
	const double *W = theta, *B = theta + kd;
	const int ntile = (d + COLS - 1) / COLS, ntask = k * ntile;
	double total = 0.0;

	if (grad)
		memset(grad, 0, sizeof *grad * logreg_nparam(k, d));
	for (size_t r0 = 0; r0 < n; r0 += ws->rows) {
		const int nr = n - r0 < ws->rows ? (int)(n - r0) : (int)ws->rows;
#pragma omp parallel for schedule(static)
		for (int q = 0; q < nr; q++) {
			const size_t i = r0 + (size_t)q;
			double *z = ws->Z + (size_t)q * d, *r = ws->R + (size_t)q * k;
			double mx = -INFINITY, sum = 0.0;
			zrow(m, x + i * (size_t)d, z);
			for (int c = 0; c < k; c++) {
				const double s = B[c] + dot_dd(W + (size_t)c * d, z, d);
				r[c] = s;
				if (s > mx)
					mx = s;
			}
			const double sy = r[y[i]];
			for (int c = 0; c < k; c++) {
				r[c] = exp(r[c] - mx);
				sum += r[c];
			}
			/* -log p_y = log sum_c exp s_c - s_y, shifted by the maximum. */
			ws->L[q] = mx + log(sum) - sy;
			for (int c = 0; c < k; c++)
				r[c] = r[c] / sum - (c == (int)y[i] ? 1.0 : 0.0);
		}
		for (int q = 0; q < nr; q++)
			total += ws->L[q];
		if (!grad)
			continue;
#pragma omp parallel for schedule(static)
		for (int t = 0; t < ntask; t++) {
			const int c = t / ntile, j0 = (t % ntile) * COLS;
			const int j1 = j0 + COLS < d ? j0 + COLS : d;
			double *g = grad + (size_t)c * d;
			for (int q = 0; q < nr; q++) {
				const double rc = ws->R[(size_t)q * k + c];
				const double *z = ws->Z + (size_t)q * d;
				for (int j = j0; j < j1; j++)
					g[j] += rc * z[j];
			}
			if (j0 == 0)
				for (int q = 0; q < nr; q++)
					grad[kd + (size_t)c] += ws->R[(size_t)q * k + c];
		}
	}

	double w2 = 0.0;
	for (size_t q = 0; q < kd; q++)
		w2 += W[q] * W[q];
	if (grad) {
		for (size_t q = 0; q < kd; q++)
			grad[q] = grad[q] / (double)n + l2 * W[q];
		for (int c = 0; c < k; c++)
			grad[kd + (size_t)c] /= (double)n;
	}
	return total / (double)n + 0.5 * l2 * w2;
}

static int check_labels(const uint32_t *y, size_t n, int k)
{
	for (size_t i = 0; i < n; i++)
		if (y[i] >= (uint32_t)k)
			return err_set(CORE_EUSAGE, NULL, "label %u of row %zu is not below %d classes",
				       y[i], i, k);
	return 0;
}

/* The first value of x[nd] that is not finite, or nd; the same answer for any split. */
static size_t first_nonfinite(const float *x, size_t nd)
{
	size_t bad = nd;

#pragma omp parallel for schedule(static) reduction(min : bad)
	for (size_t q = 0; q < nd; q++)
		if (!isfinite(x[q]) && q < bad)
			bad = q;
	return bad;
}

static int check_features(const float *x, size_t n, int d)
{
	const size_t nd = n * (size_t)d, bad = first_nonfinite(x, nd);

	if (bad < nd)
		return err_set(CORE_ENAN, NULL, "feature %zu of row %zu is not finite (%g)",
			       bad % (size_t)d, bad / (size_t)d, (double)x[bad]);
	return 0;
}

int logreg_loss_grad(const struct logreg *m, const float *x, const uint32_t *y, size_t n,
		     double l2, const double *theta, double *loss, double *grad)
{
	struct lg_work ws;

	if (n < 1)
		return err_set(CORE_EUSAGE, NULL, "the logistic regression's loss needs rows");
	ERR_FORWARD(check_labels(y, n, m->k));
	ERR_FORWARD(work_alloc(&ws, m->k, m->d, n));
	*loss = loss_grad(m, x, y, n, l2, theta, grad, &ws);
	work_free(&ws);
	return 0;
}

/* ---- the fit -------------------------------------------------------------------------------- */

struct fit_ctx {
	const struct logreg *m;
	const float *x;
	const uint32_t *y;
	size_t n;
	double l2;
	struct lg_work ws;
	int evals, iters;
};

static lbfgsfloatval_t fit_evaluate(void *inst, const lbfgsfloatval_t *theta,
				    lbfgsfloatval_t *g, const int np, const lbfgsfloatval_t step)
{
	struct fit_ctx *F = inst;

	F->evals++;
	return loss_grad(F->m, F->x, F->y, F->n, F->l2, theta, g, &F->ws);
}

static int fit_progress(void *inst, const lbfgsfloatval_t *theta, const lbfgsfloatval_t *g,
			const lbfgsfloatval_t fx, const lbfgsfloatval_t xnorm,
			const lbfgsfloatval_t gnorm, const lbfgsfloatval_t step, int np, int it,
			int ls)
{
	((struct fit_ctx *)inst)->iters = it;
	return 0;
}

static const char *lbfgs_text(int status)
{
	switch (status) {
	case LBFGS_SUCCESS: return "converged";
	case LBFGS_STOP: return "stopped by the delta test";
	case LBFGS_ALREADY_MINIMIZED: return "already minimal at the start";
	case LBFGSERR_OUTOFMEMORY: return "out of memory";
	case LBFGSERR_CANCELED: return "cancelled";
	case LBFGSERR_OUTOFINTERVAL: return "line search step out of the interval of uncertainty";
	case LBFGSERR_INCORRECT_TMINMAX: return "line search interval of uncertainty too small";
	case LBFGSERR_ROUNDING_ERROR: return "line search stopped by rounding errors";
	case LBFGSERR_MINIMUMSTEP: return "line search step below its minimum";
	case LBFGSERR_MAXIMUMSTEP: return "line search step above its maximum";
	case LBFGSERR_MAXIMUMLINESEARCH: return "line search evaluation limit reached";
	case LBFGSERR_MAXIMUMITERATION: return "iteration limit reached";
	case LBFGSERR_WIDTHTOOSMALL: return "line search interval width too small";
	case LBFGSERR_INVALIDPARAMETERS: return "negative line search step";
	case LBFGSERR_INCREASEGRADIENT: return "search direction does not descend";
	default: return "invalid parameter or logic error";
	}
}

/* mu and sd of the training rows: sums in double, row by row. sd is taken around the float
 * mu that scoring uses, so the standardised training rows have mean zero as scored. */
static int fit_standardisation(struct logreg *m, const float *x, size_t n)
{
	const int d = m->d;
	double *s = calloc((size_t)d, sizeof *s);

	if (!s)
		return err_set(CORE_ENOMEM, NULL, "out of memory for feature statistics");
	for (size_t i = 0; i < n; i++)
		for (int j = 0; j < d; j++)
			s[j] += (double)x[i * (size_t)d + (size_t)j];
	for (int j = 0; j < d; j++) {
		m->mu[j] = (float)(s[j] / (double)n);
		s[j] = 0.0;
	}
	for (size_t i = 0; i < n; i++)
		for (int j = 0; j < d; j++) {
			double t = (double)x[i * (size_t)d + (size_t)j] - (double)m->mu[j];
			s[j] += t * t;
		}
	/* A spread within float rounding of the mean is rounding, not signal: such a feature
	 * is constant, and dividing by its sd would blow the rounding up into a huge z. */
	for (int j = 0; j < d; j++) {
		float sd = (float)sqrt(s[j] / (double)n);
		m->sd[j] = sd > 1e-6f * fabsf(m->mu[j]) && sd > 0 && isfinite(sd) ? sd : 1.0f;
	}
	free(s);
	return 0;
}

int logreg_fit(struct logreg *m, const float *x, const uint32_t *y, size_t n, int d, int k,
	       double l2, int max_iter, struct logreg_fit_report *rep)
{
	struct fit_ctx F = {.x = x, .y = y, .n = n, .l2 = l2};
	lbfgsfloatval_t *theta = NULL, fx = 0.0;
	lbfgs_parameter_t par;
	int rc;

	memset(m, 0, sizeof *m);
	if (k < 2)
		return err_set(CORE_EUSAGE, NULL, "a router needs k >= 2 classes, not %d", k);
	if (d < 1)
		return err_set(CORE_EUSAGE, NULL, "a router needs d >= 1 features, not %d", d);
	if (n < 1)
		return err_set(CORE_EUSAGE, NULL, "no rows to fit the logistic regression on");
	if (!(l2 >= 0) || !isfinite(l2))
		return err_set(CORE_EUSAGE, NULL, "L2 weight %g is not a finite number >= 0", l2);
	if (max_iter < 1)
		return err_set(CORE_EUSAGE, NULL, "max_iter must be >= 1, not %d", max_iter);
	ERR_FORWARD(check_labels(y, n, k));
	ERR_FORWARD(check_features(x, n, d));
	ERR_FORWARD(logreg_init(m, k, d));
	F.m = m;
	if ((rc = fit_standardisation(m, x, n)) || (rc = work_alloc(&F.ws, k, d, n)))
		goto out;

	const int np = (int)logreg_nparam(k, d);
	theta = lbfgs_malloc(np);
	if (!theta) {
		rc = err_set(CORE_ENOMEM, NULL, "out of memory for %d parameters", np);
		goto out;
	}
	memset(theta, 0, sizeof *theta * (size_t)np);
	lbfgs_parameter_init(&par);
	par.max_iterations = max_iter;
	par.epsilon = 1e-6;
	int st = lbfgs(np, theta, &fx, fit_evaluate, fit_progress, &F, &par);
	if (st == LBFGSERR_OUTOFMEMORY) {
		rc = err_set(CORE_ENOMEM, NULL, "liblbfgs: out of memory");
		goto out;
	}
	if (st <= LBFGSERR_INVALID_ORTHANTWISE_END && st != LBFGSERR_CANCELED) {
		/* LBFGSERR_UNKNOWNERROR .. LBFGSERR_INVALID_ORTHANTWISE_END: parameters this file
		 * chose; not a property of the data. */
		rc = err_set(CORE_EUSAGE, NULL, "liblbfgs refused its parameters (%d: %s)", st,
			     lbfgs_text(st));
		goto out;
	}
	for (size_t q = 0; q < (size_t)k * (size_t)d; q++)
		m->w[q] = (float)theta[q];
	for (int c = 0; c < k; c++)
		m->b[c] = (float)theta[(size_t)k * (size_t)d + (size_t)c];
	if (rep) {
		rep->loss = fx;
		rep->iterations = F.iters;
		rep->evaluations = F.evals;
		rep->status = st;
		rep->status_text = lbfgs_text(st);
	}
out:
	if (theta)
		lbfgs_free(theta);
	work_free(&F.ws);
	if (rc)
		logreg_free(m);
	return rc;
}

/* ---- the bias correction -------------------------------------------------------------------- */

/* Sift entry pos of a binary min-heap of m prices down; holders move with their prices. */
static void heap_down(double *p, uint32_t *h, size_t m, size_t pos)
{
	for (;;) {
		size_t l = 2 * pos + 1, r = l + 1, s = pos;
		if (l < m && p[l] < p[s])
			s = l;
		if (r < m && p[r] < p[s])
			s = r;
		if (s == pos)
			return;
		double tp = p[s];
		uint32_t th = h[s];
		p[s] = p[pos];
		h[s] = h[pos];
		p[pos] = tp;
		h[pos] = th;
		pos = s;
	}
}

struct auction {
	const float *f;       /* [n * k] logits s_ic */
	size_t n;
	int k;
	const uint64_t *t;    /* [k] slots per class */
	const size_t *off;    /* [k] first slot of each class: slots off[c] .. off[c] + t[c] */
	double *price;        /* [n] slot prices, each class's a min-heap */
	double *pmin;         /* [k] each class's lowest price (its heap's top), kept together */
	uint32_t *holder;     /* [n] each slot's row or NONE */
	int32_t *a;           /* [n] each row's class, -1 while unassigned */
	uint32_t *queue;      /* [n] unassigned rows, first in first out */
};

/* One eps-phase of the forward auction (logreg.h, step 1): every row unassigned, the prices
 * kept from the phase before, bids until every row holds a slot. */
static void auction_phase(struct auction *A, double eps)
{
	const size_t n = A->n;
	const int k = A->k;
	size_t head = 0, count = n;

	for (size_t i = 0; i < n; i++) {
		A->holder[i] = NONE;
		A->a[i] = -1;
		A->queue[i] = (uint32_t)i;
	}
	for (int c = 0; c < k; c++)
		A->pmin[c] = A->t[c] ? A->price[A->off[c]] : INFINITY;
	while (count > 0) {
		const uint32_t i = A->queue[head];
		const float *row = A->f + (size_t)i * (size_t)k;
		double best = -INFINITY, second = -INFINITY;
		int c1 = -1;

		head = head + 1 == n ? 0 : head + 1;
		count--;
		for (int c = 0; c < k; c++) {
			double v = (double)row[c] - A->pmin[c]; /* -inf for a class without slots */
			if (v > best) {
				second = best;
				best = v;
				c1 = c;
			} else if (v > second) {
				second = v;
			}
		}
		const size_t o = A->off[c1], ms = (size_t)A->t[c1];
		/* The second best value counts the next cheapest slot of the same class. */
		if (ms >= 2) {
			double p2 = A->price[o + 1];
			if (ms >= 3 && A->price[o + 2] < p2)
				p2 = A->price[o + 2];
			if ((double)row[c1] - p2 > second)
				second = (double)row[c1] - p2;
		}
		const uint32_t old = A->holder[o];
		A->price[o] += second == -INFINITY ? eps : best - second + eps;
		A->holder[o] = i;
		A->a[i] = c1;
		heap_down(A->price + o, A->holder + o, ms, 0);
		A->pmin[c1] = A->price[o];
		if (old != NONE) {
			A->a[old] = -1;
			A->queue[(head + count) % n] = old;
			count++;
		}
	}
}

/* w[c * k + c'] = min over rows i of class c of (s_ic - s_ic') and that row in rw (the lower
 * row on ties); +inf (and NONE) for a class without rows. */
static void class_gains(const float *f, size_t n, int k, const int32_t *a, uint32_t *order,
			size_t *start, double *w, uint32_t *rw)
{
	memset(start, 0, sizeof *start * (size_t)(k + 1));
	for (size_t i = 0; i < n; i++)
		start[a[i] + 1]++;
	for (int c = 0; c < k; c++)
		start[c + 1] += start[c];
	for (size_t i = 0; i < n; i++)
		order[start[a[i]]++] = (uint32_t)i;
	for (int c = k; c > 0; c--)
		start[c] = start[c - 1];
	start[0] = 0;

#pragma omp parallel for schedule(dynamic, 1)
	for (int c = 0; c < k; c++) {
		double *wc = w + (size_t)c * k;
		uint32_t *rc = rw + (size_t)c * k;
		for (int e = 0; e < k; e++) {
			wc[e] = INFINITY;
			rc[e] = NONE;
		}
		for (size_t q = start[c]; q < start[c + 1]; q++) {
			const uint32_t i = order[q];
			const float *row = f + (size_t)i * (size_t)k;
			for (int e = 0; e < k; e++) {
				double g = (double)row[c] - (double)row[e];
				if (e != c && g < wc[e]) {
					wc[e] = g;
					rc[e] = i;
				}
			}
		}
	}
}

/* Karp's minimum cycle mean over the nv classes V[] (complete graph, weights w), with D and P
 * of (nv + 1) * nv entries; a cycle of that mean into cyc[] (classes, in edge order), its
 * length into *clen. nv >= 2. */
static double min_cycle_mean(const double *w, int k, const int *V, int nv, double *D, int *P,
			     int *seq, int *last, int *cyc, int *clen)
{
	for (int v = 0; v < nv; v++)
		D[v] = 0.0;
	for (int j = 1; j <= nv; j++)
		for (int v = 0; v < nv; v++) {
			double best = INFINITY;
			int par = -1;
			for (int u = 0; u < nv; u++) {
				if (u == v)
					continue;
				double t = D[(size_t)(j - 1) * nv + u] + w[(size_t)V[u] * k + V[v]];
				if (t < best) {
					best = t;
					par = u;
				}
			}
			D[(size_t)j * nv + v] = best;
			P[(size_t)j * nv + v] = par;
		}
	double mu = INFINITY;
	int vs = 0;
	for (int v = 0; v < nv; v++) {
		double mv = -INFINITY;
		for (int j = 0; j < nv; j++) {
			double t = (D[(size_t)nv * nv + v] - D[(size_t)j * nv + v]) / (nv - j);
			if (t > mv)
				mv = t;
		}
		if (mv < mu) {
			mu = mv;
			vs = v;
		}
	}
	/* The walk of nv edges that gave D[nv][vs] holds a repeated class; every cycle on it has
	 * mean mu (Karp's proof), so the first one found walking back is taken. */
	seq[nv] = vs;
	for (int j = nv; j > 0; j--)
		seq[j - 1] = P[(size_t)j * nv + seq[j]];
	for (int v = 0; v < nv; v++)
		last[v] = -1;
	*clen = 0;
	for (int j = nv; j >= 0; j--) {
		int v = seq[j];
		if (last[v] >= 0) {
			*clen = last[v] - j;
			for (int q = 0; q < *clen; q++)
				cyc[q] = V[seq[j + q]];
			break;
		}
		last[v] = j;
	}
	return mu;
}

/* The buffers of an optimal assignment (step 1) and of the biases that realise it (step 2). */
struct assign_ws {
	size_t *off, *start;
	double *price, *w, *D, *pmin;
	uint32_t *holder, *queue, *rw;
	int32_t *a;
	int *P, *V, *seq, *last, *cyc;
};

static void ws_free(struct assign_ws *s)
{
	free(s->off);
	free(s->start);
	free(s->price);
	free(s->w);
	free(s->D);
	free(s->pmin);
	free(s->holder);
	free(s->queue);
	free(s->rw);
	free(s->a);
	free(s->P);
	free(s->V);
	free(s->seq);
	free(s->last);
	free(s->cyc);
	memset(s, 0, sizeof *s);
}

static int ws_alloc(struct assign_ws *s, size_t n, int k)
{
	const size_t kk = (size_t)k * (size_t)k, nv1 = (size_t)k + 1;
	memset(s, 0, sizeof *s);
	s->off = malloc(sizeof *s->off * (size_t)k);
	s->start = malloc(sizeof *s->start * nv1);
	s->price = calloc(n, sizeof *s->price);
	s->w = malloc(sizeof *s->w * kk);
	s->D = malloc(sizeof *s->D * nv1 * (size_t)k);
	s->pmin = malloc(sizeof *s->pmin * (size_t)k);
	s->holder = malloc(sizeof *s->holder * n);
	s->queue = malloc(sizeof *s->queue * n);
	s->rw = malloc(sizeof *s->rw * kk);
	s->a = malloc(sizeof *s->a * n);
	s->P = malloc(sizeof *s->P * nv1 * (size_t)k);
	s->V = malloc(sizeof *s->V * (size_t)k);
	s->seq = malloc(sizeof *s->seq * nv1);
	s->last = malloc(sizeof *s->last * (size_t)k);
	s->cyc = malloc(sizeof *s->cyc * (size_t)k);
	if (s->off && s->start && s->price && s->w && s->D && s->pmin && s->holder && s->queue &&
	    s->rw && s->a && s->P && s->V && s->seq && s->last && s->cyc)
		return 0;
	ws_free(s);
	return err_set(CORE_ENOMEM, NULL, "out of memory for an assignment of %zu rows", n);
}

/* Counts t[k] that an assignment of n rows can meet: 1 <= n < 2^32, sum n. */
static int check_targets(size_t n, int k, const uint64_t *t)
{
	uint64_t sum = 0;
	if (n < 1 || (uint64_t)n >= NONE)
		return err_set(CORE_EUSAGE, NULL, "an assignment takes 1 to %u rows, not %zu",
			       NONE - 1, n);
	for (int c = 0; c < k; c++) {
		if (t[c] > (uint64_t)n - sum)
			return err_set(CORE_EUSAGE, NULL, "target counts sum to more than the %zu rows",
				       n);
		sum += t[c];
	}
	if (sum != (uint64_t)n)
		return err_set(CORE_EUSAGE, NULL, "target counts sum to %llu, not to the %zu rows",
			       (unsigned long long)sum, n);
	return 0;
}

/* Step 1 (logreg.h) on the values f [n * k], C the largest spread of a row's values: an
 * optimal assignment with the counts t into s->a, and s->w, s->rw its class gains. Returns
 * mu*, the minimum cycle mean of those gains over the *nv classes with slots (s->V),
 * +inf with fewer than two. */
static double assign_optimal(struct assign_ws *s, const float *f, size_t n, int k,
			     const uint64_t *t, double C, int *nv_out)
{
	size_t o = 0;
	for (int c = 0; c < k; c++) {
		s->off[c] = o;
		o += (size_t)t[c];
	}
	struct auction A = {.f = f, .n = n, .k = k, .t = t, .off = s->off, .price = s->price,
			    .pmin = s->pmin, .holder = s->holder, .a = s->a, .queue = s->queue};
	const double eps_final = 1e-6 * C;
	for (double eps = C / 4;; eps /= 8) {
		if (eps < eps_final)
			eps = eps_final;
		auction_phase(&A, eps);
		if (eps == eps_final)
			break;
	}

	/* ... then what eps left over, cancelled cycle by cycle. */
	int nv = 0, clen = 0;
	for (int c = 0; c < k; c++)
		if (t[c] > 0)
			s->V[nv++] = c;
	double mu = INFINITY;
	const double tol = 1e-12 * C;
	for (size_t cancelled = 0;; cancelled++) {
		class_gains(f, n, k, s->a, s->holder, s->start, s->w, s->rw);
		if (nv < 2)
			break;
		mu = min_cycle_mean(s->w, k, s->V, nv, s->D, s->P, s->seq, s->last, s->cyc, &clen);
		if (!(mu < -tol) || cancelled >= n || clen < 2)
			break;
		double cw = 0.0;
		for (int q = 0; q < clen; q++)
			cw += s->w[(size_t)s->cyc[q] * k + s->cyc[(q + 1) % clen]];
		if (!(cw < -tol * clen))
			break;
		for (int q = 0; q < clen; q++)
			s->a[s->rw[(size_t)s->cyc[q] * k + s->cyc[(q + 1) % clen]]] =
				s->cyc[(q + 1) % clen];
	}
	*nv_out = nv;
	return mu;
}

/* The largest spread of a row's values (1 if none is positive and finite). */
static double spread(const float *f, size_t n, int k)
{
	double C = 0.0;
#pragma omp parallel for schedule(static) reduction(max : C)
	for (size_t i = 0; i < n; i++) {
		float lo = INFINITY, hi = -INFINITY;
		for (int c = 0; c < k; c++) {
			const float s = f[i * (size_t)k + (size_t)c];
			lo = s < lo ? s : lo;
			hi = s > hi ? s : hi;
		}
		if ((double)hi - (double)lo > C)
			C = (double)hi - (double)lo;
	}
	return C > 0 && isfinite(C) ? C : 1.0;
}

int logreg_assign(const float *score, size_t n, int k, const uint64_t *target_counts,
		  uint32_t *cls)
{
	struct assign_ws s;
	int nv;

	if (k < 1)
		return err_set(CORE_EUSAGE, NULL, "an assignment needs k >= 1 classes, not %d", k);
	ERR_FORWARD(check_targets(n, k, target_counts));
	const size_t i = first_nonfinite(score, n * (size_t)k);
	if (i < n * (size_t)k)
		return err_set(CORE_ENAN, NULL, "score %zu of row %zu is not finite", i % (size_t)k,
			       i / (size_t)k);
	ERR_FORWARD(ws_alloc(&s, n, k));
	assign_optimal(&s, score, n, k, target_counts, spread(score, n, k), &nv);
	for (size_t r = 0; r < n; r++)
		cls[r] = (uint32_t)s.a[r];
	ws_free(&s);
	return 0;
}

int logreg_fit_bias(struct logreg *m, const float *x, size_t n, const uint64_t *target_counts)
{
	const int k = m->k, d = m->d;
	struct assign_ws s;
	int nv;

	ERR_FORWARD(check_targets(n, k, target_counts));
	ERR_FORWARD(check_features(x, n, d));
	float *f = malloc(sizeof *f * n * (size_t)k);
	double *beta = malloc(sizeof *beta * (size_t)k);
	if (!f || !beta || ws_alloc(&s, n, k) < 0) {
		free(f);
		free(beta);
		return err_set(CORE_ENOMEM, NULL, "out of memory for the bias correction of %zu "
			       "rows", n);
	}

	/* The logits, row by row in parallel, rounded to float as logreg_predict sees them. */
#pragma omp parallel for schedule(static)
	for (size_t i = 0; i < n; i++) {
		double zb[ZSTACK];
		const float *row = x + i * (size_t)d;
		const double *z = zmaybe(m, row, zb);
		for (int c = 0; c < k; c++)
			f[i * (size_t)k + (size_t)c] = (float)logit1(m, row, z, c);
	}
	const double C = spread(f, n, k);

	/* 1. An optimal assignment with the target counts. */
	const double mu = assign_optimal(&s, f, n, k, target_counts, C, &nv);

	/* 2. The biases of largest margin g: bias_c' - bias_c <= w(c, c') - g, by Bellman-Ford
	 * from a virtual source. g is a hair under mu*, so that rounding cannot leave the
	 * critical cycle negative; k + 1 rounds at most all the same. */
	const double g = nv < 2 ? (C > 1 ? C : 1.0) : mu > 0 ? mu - 1e-9 * mu : 0.0;
	for (int c = 0; c < k; c++)
		beta[c] = 0.0;
	for (int round = 0; round <= k; round++) {
		int changed = 0;
		for (int q = 0; q < nv; q++) {
			const int u = s.V[q];
			for (int v = 0; v < k; v++) {
				double t = beta[u] + s.w[(size_t)u * k + v] - g;
				if (v != u && t < beta[v]) {
					beta[v] = t;
					changed = 1;
				}
			}
		}
		if (!changed)
			break;
	}

	/* 3. Mean zero, then float. */
	double mean = 0.0;
	for (int c = 0; c < k; c++)
		mean += beta[c];
	mean /= k;
	for (int c = 0; c < k; c++)
		m->bias[c] = (float)(beta[c] - mean);
	free(f);
	free(beta);
	ws_free(&s);
	return 0;
}
