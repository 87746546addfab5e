/* kmeans.c - k-means++ and Lloyd's iterations; the contract is in kmeans.h.
 *
 * Why this shape: every loop over rows is cut into blocks of BLOCK rows whatever the thread
 * count, each block's sum is taken in row order, and the blocks' sums are added in block
 * order by one thread, so the inertia and the D^2 weights (hence every draw and every
 * comparison) are the same bits with 1 thread or 64. The means are summed per cluster, each
 * by one thread in row order, for the same reason.
 */
#include "route/kmeans.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/rng.h"
#include "common/banned.h"

/* The draws of the k-means++ seeding. Local until rng.h gives it a name of its own. */

/* Rows per block of every sum over rows: fixed, so that sums do not depend on threads. */
#define BLOCK 1024

/* ||a - b||^2 in double (the float differences are exact), in eight interleaved partial sums
 * added in a fixed tree: the bits are the source's whether or not, and however, the
 * compiler vectorises the lanes, so fit and kmeans_nearest agree in every build. */
static double sqdist(const float *a, const float *b, int d)
{
	double s[8] = {0};
	int j = 0;

	for (; j + 8 <= d; j += 8)
		for (int q = 0; q < 8; q++) {
			double t = (double)a[j + q] - (double)b[j + q];
			s[q] += t * t;
		}
	for (int q = 0; j + q < d; q++) {
		double t = (double)a[j + q] - (double)b[j + q];
		s[q] += t * t;
	}
	return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

static uint32_t nearest1(const float *c, int k, int d, const float *x, double *best)
{
	uint32_t bi = 0;
	double bd = sqdist(x, c, d);

	for (int j = 1; j < k; j++) {
		double t = sqdist(x, c + (size_t)j * d, d);
		if (t < bd) {
			bd = t;
			bi = (uint32_t)j;
		}
	}
	*best = bd;
	return bi;
}

void kmeans_nearest(const float *centroids, int k, int d, const float *x, int topn,
		    uint32_t *idx, float *dist2)
{
	double dd[64], *db = topn <= 64 ? dd : malloc(sizeof *db * (size_t)topn);
	int m = 0;

	if (!db) {
		/* No memory for a long list: fall back to one selection pass per place. */
		for (int r = 0; r < topn; r++) {
			double bd = INFINITY;
			uint32_t bi = 0;
			for (int j = 0; j < k; j++) {
				int used = 0;
				for (int q = 0; q < r; q++)
					used |= idx[q] == (uint32_t)j;
				double t = sqdist(x, centroids + (size_t)j * d, d);
				if (!used && t < bd) {
					bd = t;
					bi = (uint32_t)j;
				}
			}
			idx[r] = bi;
			if (dist2)
				dist2[r] = (float)bd;
		}
		return;
	}
	/* Insertion into a sorted list; a later centroid passes an earlier one only when
	 * strictly nearer, so ties keep the lower index first. */
	for (int j = 0; j < k; j++) {
		double t = sqdist(x, centroids + (size_t)j * d, d);
		if (m == topn && !(t < db[m - 1]))
			continue;
		int p = m < topn ? m++ : m - 1;
		while (p > 0 && t < db[p - 1]) {
			db[p] = db[p - 1];
			idx[p] = idx[p - 1];
			p--;
		}
		db[p] = t;
		idx[p] = (uint32_t)j;
	}
	if (dist2)
		for (int r = 0; r < topn; r++)
			dist2[r] = (float)db[r];
	if (db != dd)
		free(db);
}

void kmeans_report_free(struct kmeans_report *rep)
{
	free(rep->history);
	free(rep->restart_inertia);
	rep->history = NULL;
	rep->restart_inertia = NULL;
}

/* One restart's buffers. */
struct work {
	const float *x;
	size_t n, nblocks;
	int d, k;
	double *w;        /* [n] D^2 weights (seeding), then each row's distance to its centroid */
	double *part;     /* [nblocks] per-block sums */
	uint32_t *a;      /* [n] assignment */
	uint32_t *order;  /* [n] rows grouped by cluster (counting sort), row order within */
	size_t *start;    /* [k + 1] each cluster's first place in order */
	float *c;         /* [k * d] centroids */
};

static double sum_blocks(const struct work *W)
{
	double s = 0.0;

	for (size_t b = 0; b < W->nblocks; b++)
		s += W->part[b];
	return s;
}

/* w[i] = min(w[i], ||x_i - c||^2); the blocks' sums of w into part. */
static void seed_weights(struct work *W, const float *c, int first)
{
	const size_t n = W->n;
	const int d = W->d;

#pragma omp parallel for schedule(static)
	for (size_t b = 0; b < W->nblocks; b++) {
		size_t i1 = (b + 1) * BLOCK < n ? (b + 1) * BLOCK : n;
		double s = 0.0;
		for (size_t i = b * BLOCK; i < i1; i++) {
			double t = sqdist(W->x + i * d, c, d);
			if (first || t < W->w[i])
				W->w[i] = t;
			s += W->w[i];
		}
		W->part[b] = s;
	}
}

/* k-means++ (D^2 sampling) into W->c for restart r. */
static void seed_plusplus(struct work *W, uint64_t seed, int r)
{
	const size_t n = W->n;
	const int d = W->d;
	const uint64_t base = (uint64_t)r << 32;
	size_t pick = (size_t)rng_below(seed, RNG_STREAM_KMEANS, base, n);

	memcpy(W->c, W->x + pick * d, sizeof(float) * (size_t)d);
	for (int j = 1; j < W->k; j++) {
		seed_weights(W, W->c + (size_t)(j - 1) * d, j == 1);
		double total = sum_blocks(W);
		if (!(total > 0)) {
			/* Every row sits on a chosen centroid: any row will do. */
			pick = (size_t)rng_below(seed, RNG_STREAM_KMEANS, base | (uint64_t)j, n);
		} else {
			/* u in [0, total): the row whose cumulative weight first exceeds u; a row of
			 * weight 0 can never be that row. Should rounding leave u past every
			 * cumulative sum, the last row of positive weight is taken. */
			double u = (double)(rng_u64(seed, RNG_STREAM_KMEANS, base | (uint64_t)j) >> 11) *
				   0x1p-53 * total;
			double acc = 0.0;
			size_t b = 0, last = n;
			while (b + 1 < W->nblocks && acc + W->part[b] <= u)
				acc += W->part[b++];
			size_t i1 = (b + 1) * BLOCK < n ? (b + 1) * BLOCK : n;
			pick = n;
			for (size_t i = b * BLOCK; i < i1 && pick == n; i++) {
				if (W->w[i] > 0)
					last = i;
				acc += W->w[i];
				if (W->w[i] > 0 && acc > u)
					pick = i;
			}
			if (pick == n) {
				for (size_t i = n; last == n && i-- > 0;)
					if (W->w[i] > 0)
						last = i;
				pick = last;
			}
		}
		memcpy(W->c + (size_t)j * d, W->x + pick * d, sizeof(float) * (size_t)d);
	}
}

/* Each row to its nearest centroid; W->w gets the distances. Returns the inertia and, in
 * *moved, the rows whose cluster changed (all of them when first). */
static double assign_step(struct work *W, int first, size_t *moved)
{
	const size_t n = W->n;
	size_t mv = 0;

#pragma omp parallel for schedule(static) reduction(+ : mv)
	for (size_t b = 0; b < W->nblocks; b++) {
		size_t i1 = (b + 1) * BLOCK < n ? (b + 1) * BLOCK : n;
		double s = 0.0;
		for (size_t i = b * BLOCK; i < i1; i++) {
			double t;
			uint32_t j = nearest1(W->c, W->k, W->d, W->x + i * W->d, &t);
			mv += first || j != W->a[i];
			W->a[i] = j;
			W->w[i] = t;
			s += t;
		}
		W->part[b] = s;
	}
	*moved = mv;
	return sum_blocks(W);
}

/* Centroids to the means of their rows; empty clusters re-seeded (kmeans.h). */
static void update_step(struct work *W, double *sum)
{
	const size_t n = W->n;
	const int k = W->k, d = W->d;
	size_t *st = W->start;

	memset(st, 0, sizeof *st * (size_t)(k + 1));
	for (size_t i = 0; i < n; i++)
		st[W->a[i] + 1]++;
	for (int j = 0; j < k; j++)
		st[j + 1] += st[j];
	for (size_t i = 0; i < n; i++)
		W->order[st[W->a[i]]++] = (uint32_t)i;
	for (int j = k; j > 0; j--)
		st[j] = st[j - 1];
	st[0] = 0;

#pragma omp parallel for schedule(dynamic, 1)
	for (int j = 0; j < k; j++) {
		double *s = sum + (size_t)j * d;
		size_t cnt = st[j + 1] - st[j];
		if (cnt == 0)
			continue;
		memset(s, 0, sizeof *s * (size_t)d);
		for (size_t q = st[j]; q < st[j + 1]; q++) {
			const float *xi = W->x + (size_t)W->order[q] * d;
			for (int e = 0; e < d; e++)
				s[e] += (double)xi[e];
		}
		for (int e = 0; e < d; e++)
			W->c[(size_t)j * d + e] = (float)(s[e] / (double)cnt);
	}

	/* Empty clusters: the row farthest from its centroid, among clusters that keep a row. */
	for (int j = 0; j < k; j++) {
		if (st[j + 1] != st[j])
			continue;
		size_t best = n;
		for (size_t i = 0; i < n; i++) {
			uint32_t a = W->a[i];
			if (st[a + 1] - st[a] >= 2 && W->w[i] > 0 && (best == n || W->w[i] > W->w[best]))
				best = i;
		}
		if (best == n)
			continue; /* every row sits on its centroid: nothing to split */
		memcpy(W->c + (size_t)j * d, W->x + best * d, sizeof(float) * (size_t)d);
		/* Counted as moved so that the next empty cluster looks elsewhere (only the
		 * counts matter from here on, the order is rebuilt at the next update). */
		W->w[best] = 0.0;
		for (int q = (int)W->a[best] + 1; q <= j; q++)
			st[q]--;
		for (int q = j + 1; q < (int)W->a[best] + 1; q++)
			st[q]++;
	}
}

static int check_args(const float *x, size_t n, int d, const struct kmeans_opts *o)
{
	if (o->k < 1)
		return err_set(CORE_EUSAGE, NULL, "k-means needs k >= 1 clusters, not %d", o->k);
	if (d < 1)
		return err_set(CORE_EUSAGE, NULL, "k-means needs features of dimension >= 1, not %d", d);
	if (o->restarts < 1 || o->max_iter < 1)
		return err_set(CORE_EUSAGE, NULL, "k-means needs restarts >= 1 and max_iter >= 1, "
			       "not %d and %d", o->restarts, o->max_iter);
	if (!(o->tol >= 0) || !isfinite(o->tol))
		return err_set(CORE_EUSAGE, NULL, "k-means tolerance %g is not a finite number >= 0",
			       o->tol);
	if (n < (size_t)o->k)
		return err_set(CORE_EUSAGE, NULL, "cannot make %d clusters of %zu points", o->k, n);
	if ((uint64_t)n > UINT32_MAX)
		return err_set(CORE_EUSAGE, NULL, "k-means takes at most %u points, not %zu",
			       UINT32_MAX, n);
	/* The first non-finite value, found in parallel: the minimum over blocks is the same
	 * whatever the split. */
	const size_t nd = n * (size_t)d;
	size_t bad = nd;
#pragma omp parallel for schedule(static) reduction(min : bad)
	for (size_t q = 0; q < nd; q++)
		if (!isfinite(x[q]) && q < bad)
			bad = q;
	if (bad < nd)
		return err_set(CORE_ENAN, NULL, "feature %zu of row %zu is not finite (%g)",
			       bad % (size_t)d, bad / (size_t)d, (double)x[bad]);
	for (size_t q = 0; o->init && q < (size_t)o->k * (size_t)d; q++)
		if (!isfinite(o->init[q]))
			return err_set(CORE_ENAN, NULL, "feature %zu of initial centroid %zu is not "
				       "finite (%g)", q % (size_t)d, q / (size_t)d, (double)o->init[q]);
	return 0;
}

int kmeans_fit(const float *x, size_t n, int d, const struct kmeans_opts *o, float *centroids,
	       uint32_t *assign, struct kmeans_report *rep)
{
	ERR_FORWARD(check_args(x, n, d, o));
	const int k = o->k;
	struct work W = {.x = x, .n = n, .d = d, .k = k, .nblocks = (n + BLOCK - 1) / BLOCK};
	double *sum = malloc(sizeof *sum * (size_t)k * (size_t)d);
	double *hist = malloc(sizeof *hist * (size_t)o->max_iter);
	double *best_hist = malloc(sizeof *best_hist * (size_t)o->max_iter);
	double *rin = malloc(sizeof *rin * (size_t)o->restarts);
	uint32_t *best_a = assign ? malloc(sizeof *best_a * n) : NULL;
	int rc = 0, best_r = -1, best_it = 0, best_conv = 0;
	double best_J = INFINITY;

	W.w = malloc(sizeof *W.w * n);
	W.part = malloc(sizeof *W.part * W.nblocks);
	W.a = malloc(sizeof *W.a * n);
	W.order = malloc(sizeof *W.order * n);
	W.start = malloc(sizeof *W.start * (size_t)(k + 1));
	W.c = malloc(sizeof *W.c * (size_t)k * (size_t)d);
	if (!sum || !hist || !best_hist || !rin || (assign && !best_a) || !W.w || !W.part ||
	    !W.a || !W.order || !W.start || !W.c) {
		rc = err_set(CORE_ENOMEM, NULL, "out of memory for k-means of %zu points", n);
		goto out;
	}

	for (int r = 0; r < o->restarts; r++) {
		double J = INFINITY, prev = INFINITY;
		int it = 0, conv = 0;
		size_t moved;

		if (o->init)
			memcpy(W.c, o->init, sizeof *W.c * (size_t)k * (size_t)d);
		else
			seed_plusplus(&W, o->seed, r);
		while (it < o->max_iter) {
			J = assign_step(&W, it == 0, &moved);
			hist[it++] = J;
			if (it > 1 && (moved == 0 || prev - J <= o->tol * prev)) {
				conv = 1;
				break;
			}
			if (it == o->max_iter)
				break;
			update_step(&W, sum);
			prev = J;
		}
		rin[r] = J;
		if (J < best_J || best_r < 0) {
			best_J = J;
			best_r = r;
			best_it = it;
			best_conv = conv;
			memcpy(centroids, W.c, sizeof *W.c * (size_t)k * (size_t)d);
			memcpy(best_hist, hist, sizeof *hist * (size_t)it);
			if (best_a)
				memcpy(best_a, W.a, sizeof *best_a * n);
		}
	}
	if (assign)
		memcpy(assign, best_a, sizeof *assign * n);
	if (rep) {
		rep->best_restart = best_r;
		rep->inertia = best_J;
		rep->iterations = best_it;
		rep->converged = best_conv;
		rep->history = best_hist;
		rep->restarts = o->restarts;
		rep->restart_inertia = rin;
		best_hist = NULL;
		rin = NULL;
	}
out:
	free(sum);
	free(hist);
	free(best_hist);
	free(rin);
	free(best_a);
	free(W.w);
	free(W.part);
	free(W.a);
	free(W.order);
	free(W.start);
	free(W.c);
	return rc;
}
