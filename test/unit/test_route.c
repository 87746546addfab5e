/* test_route.c - the routing layer's math: k-means (lib/route/kmeans.h), the logistic
 * regression router and its bias correction (logreg.h), and the cluster scores
 * (clusterstats.h).
 *
 * The references are independent of the code under test:
 *  - k-means: the labels of synthetic Gaussian blobs (drawn here with rng.h), nearest
 *    centroids and inertia recomputed by brute force in double in this file;
 *  - the logistic regression: its loss written out naively here, its gradient against
 *    central finite differences of that loss, a softmax computed here;
 *  - the bias correction: a hand-worked two-class case, and the optimal transportation
 *    assignment found by enumerating every assignment of small problems (also for
 *    logreg_assign on scores given);
 *  - the router's fit with paths that no row prefers: the rows that lose least by going to
 *    each such path, chosen here by sorting, and the counts the router must then meet;
 *  - the cluster scores: numbers computed by a short independent Python script (fractions
 *    for ARI, checked against a brute-force count over all pairs of items; math.log for
 *    NMI), pasted below with the script.
 * Every failure message prints the case's parameters (seed, sizes) so it can be rerun. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/rng.h"
#include "route/clusterstats.h"
#include "route/kmeans.h"
#include "route/logreg.h"
#include "route/route.h"
#include "route/wrouter.h"
#include "common/banned.h"

TestSuite(kmeans, .timeout = 120);
TestSuite(logreg, .timeout = 120);
TestSuite(bias, .timeout = 120);
TestSuite(clusterstats, .timeout = 120);
TestSuite(rows, .timeout = 30);
/* One timeout for every suite: with suites of different timeouts, Criterion 2.4's runner
 * leaks 48 bytes now and then, which fails the binary under ASan. */

/* ---- synthetic data ------------------------------------------------------------------------ */

/* n rows of d features in G Gaussian blobs: blob g's centre has coordinates sep * N(0, 1),
 * its rows add sd * N(0, 1); row i belongs to blob i % G (labels may be NULL). */
static float *blobs(size_t n, int d, int G, double sep, double sd, uint64_t seed, uint32_t *labels)
{
	float *x = malloc(sizeof *x * n * (size_t)d), *c = malloc(sizeof *c * (size_t)G * d);
	cr_assert(x && c);
	for (size_t q = 0; q < (size_t)G * d; q++)
		c[q] = (float)(sep * rng_normal(seed, RNG_STREAM_TEST, q));
	for (size_t i = 0; i < n; i++) {
		const int g = (int)(i % (size_t)G);
		if (labels)
			labels[i] = (uint32_t)g;
		for (int j = 0; j < d; j++)
			x[i * d + j] = c[(size_t)g * d + j] +
				       (float)(sd * rng_normal(seed, RNG_STREAM_TEST,
							       1000000 + i * (size_t)d + (size_t)j));
	}
	free(c);
	return x;
}

/* Rows uniform in [0, 1)^d: no cluster structure at all. */
static float *uniform_rows(size_t n, int d, uint64_t seed)
{
	float *x = malloc(sizeof *x * n * (size_t)d);
	cr_assert(x);
	for (size_t q = 0; q < n * (size_t)d; q++)
		x[q] = rng_uniform(seed, RNG_STREAM_TEST, q);
	return x;
}

static double ref_dist2(const float *a, const float *b, int d)
{
	double s = 0.0;
	for (int j = 0; j < d; j++)
		s += ((double)a[j] - (double)b[j]) * ((double)a[j] - (double)b[j]);
	return s;
}

/* ---- k-means ------------------------------------------------------------------------------- */

Test(kmeans, recovers_well_separated_blobs)
{
	const size_t n = 600;
	const int d = 16, G = 6;
	uint32_t labels[600], assign[600];
	float cent[6 * 16];

	for (uint64_t seed = 1; seed <= 3; seed++) {
		float *x = blobs(n, d, G, 5.0, 1.0, 100 + seed, labels);
		struct kmeans_opts o = {.k = G, .restarts = 4, .max_iter = 100, .tol = 0, .seed = seed};
		struct kmeans_report rep = {0};
		struct cluster_stats s;
		cr_assert_eq(kmeans_fit(x, n, d, &o, cent, assign, &rep), 0, "seed %llu: %s",
			     (unsigned long long)seed, err_detail());
		cr_assert_eq(clusterstats_compute(assign, labels, n, G, G, &s), 0);
		cr_expect_gt(s.ari, 0.99, "seed %llu: ARI %.6f vs the blobs", (unsigned long long)seed,
			     s.ari);
		/* Independently of clusterstats: every cluster holds one blob's rows only. */
		for (int k = 0; k < G; k++) {
			int lab = -1, mixed = 0;
			for (size_t i = 0; i < n; i++)
				if (assign[i] == (uint32_t)k) {
					mixed |= lab >= 0 && lab != (int)labels[i];
					lab = (int)labels[i];
				}
			cr_expect(!mixed && lab >= 0, "seed %llu: cluster %d is %s",
				  (unsigned long long)seed, k, lab < 0 ? "empty" : "mixed");
		}
		cr_expect(rep.converged, "seed %llu: did not converge in 100 iterations",
			  (unsigned long long)seed);
		clusterstats_free(&s);
		kmeans_report_free(&rep);
		free(x);
	}
}

/* One fit, checked against brute force: each row's cluster is its nearest centroid, the
 * reported inertia is J(assign, centroids), the per-iteration inertia never rises, the best
 * restart is the lowest. */
static void check_fit(const char *what, const float *x, size_t n, int d, int k, uint64_t seed,
		      int restarts)
{
	float *cent = malloc(sizeof *cent * (size_t)k * d);
	uint32_t *assign = malloc(sizeof *assign * n);
	struct kmeans_opts o = {.k = k, .restarts = restarts, .max_iter = 300, .tol = 0, .seed = seed};
	struct kmeans_report rep = {0};
	cr_assert(cent && assign);
	cr_assert_eq(kmeans_fit(x, n, d, &o, cent, assign, &rep), 0, "%s k %d seed %llu: %s", what,
		     k, (unsigned long long)seed, err_detail());

	cr_assert(rep.iterations >= 1 && rep.iterations <= o.max_iter);
	for (int it = 1; it < rep.iterations; it++)
		cr_expect_leq(rep.history[it], rep.history[it - 1],
			      "%s k %d seed %llu: inertia rose at iteration %d: %.17g -> %.17g", what, k,
			      (unsigned long long)seed, it, rep.history[it - 1], rep.history[it]);
	cr_expect_eq(rep.history[rep.iterations - 1], rep.inertia, "%s k %d seed %llu", what, k,
		     (unsigned long long)seed);

	double J = 0.0;
	for (size_t i = 0; i < n; i++) {
		uint32_t best = 0;
		double bd = INFINITY;
		for (int c = 0; c < k; c++) {
			double t = ref_dist2(x + i * d, cent + (size_t)c * d, d);
			if (t < bd) {
				bd = t;
				best = (uint32_t)c;
			}
		}
		cr_expect_eq(assign[i], best, "%s k %d seed %llu: row %zu in cluster %u, nearest %u",
			     what, k, (unsigned long long)seed, i, assign[i], best);
		J += bd;
	}
	cr_expect(fabs(J - rep.inertia) <= 1e-9 * J, "%s k %d seed %llu: inertia %.17g, "
		  "recomputed %.17g", what, k, (unsigned long long)seed, rep.inertia, J);

	int first_min = 0;
	for (int r = 1; r < restarts; r++)
		if (rep.restart_inertia[r] < rep.restart_inertia[first_min])
			first_min = r;
	cr_expect_eq(rep.best_restart, first_min, "%s k %d seed %llu", what, k,
		     (unsigned long long)seed);
	cr_expect_eq(rep.inertia, rep.restart_inertia[first_min]);
	kmeans_report_free(&rep);
	free(cent);
	free(assign);
}

Test(kmeans, inertia_never_increases_and_matches_brute_force)
{
	float *sep = blobs(600, 16, 6, 5.0, 1.0, 7, NULL);
	float *close = blobs(800, 8, 10, 0.5, 1.0, 8, NULL); /* blobs that overlap: hard */
	float *flat = uniform_rows(1000, 5, 9);              /* no structure at all */

	for (uint64_t seed = 1; seed <= 5; seed++) {
		check_fit("separated", sep, 600, 16, 6, seed, 3);
		check_fit("separated", sep, 600, 16, 11, seed, 2);
		check_fit("overlapping", close, 800, 8, 10, seed, 3);
		check_fit("uniform", flat, 1000, 5, 3, seed, 2);
		check_fit("uniform", flat, 1000, 5, 40, seed, 2);
	}
	free(sep);
	free(close);
	free(flat);
}

Test(kmeans, same_seed_same_bits_whatever_the_threads)
{
	const size_t n = 3000; /* several blocks of rows */
	const int d = 7, k = 9;
	float *x = blobs(n, d, 12, 1.0, 1.0, 21, NULL);
	float c1[9 * 7], c2[9 * 7];
	uint32_t *a1 = malloc(sizeof *a1 * n), *a2 = malloc(sizeof *a2 * n);
	struct kmeans_opts o = {.k = k, .restarts = 3, .max_iter = 50, .tol = 1e-7, .seed = 5};
	struct kmeans_report r1 = {0}, r2 = {0};
	const int nt = omp_get_max_threads();

	omp_set_num_threads(1);
	cr_assert_eq(kmeans_fit(x, n, d, &o, c1, a1, &r1), 0);
	for (int t = 2; t <= 5; t += 3) {
		omp_set_num_threads(t);
		cr_assert_eq(kmeans_fit(x, n, d, &o, c2, a2, &r2), 0);
		cr_expect(!memcmp(c1, c2, sizeof c1), "centroids differ with %d threads", t);
		cr_expect(!memcmp(a1, a2, sizeof *a1 * n), "assignment differs with %d threads", t);
		cr_expect_eq(r1.iterations, r2.iterations);
		cr_expect(!memcmp(&r1.inertia, &r2.inertia, sizeof r1.inertia));
		cr_expect(!memcmp(r1.history, r2.history, sizeof *r1.history * (size_t)r1.iterations));
		kmeans_report_free(&r2);
	}
	omp_set_num_threads(nt);
	/* Another seed seeds elsewhere (with 9 clusters of 12 blobs the optima differ). */
	o.seed = 6;
	cr_assert_eq(kmeans_fit(x, n, d, &o, c2, NULL, NULL), 0);
	cr_expect(memcmp(c1, c2, sizeof c1), "seeds 5 and 6 gave the same centroids");
	kmeans_report_free(&r1);
	free(a1);
	free(a2);
	free(x);
}

Test(kmeans, duplicate_points_and_more_clusters_than_values)
{
	/* 10 rows with 3 distinct values, 5 clusters: two stay empty or duplicate; no error,
	 * inertia 0, every centroid one of the values. */
	float x[10 * 2], cent[5 * 2];
	uint32_t assign[10];
	struct kmeans_opts o = {.k = 5, .restarts = 2, .max_iter = 20, .tol = 0, .seed = 3};
	struct kmeans_report rep = {0};
	for (int i = 0; i < 10; i++) {
		x[2 * i] = (float)(i % 3);
		x[2 * i + 1] = (float)(10 * (i % 3));
	}
	cr_assert_eq(kmeans_fit(x, 10, 2, &o, cent, assign, &rep), 0, "%s", err_detail());
	cr_expect_eq(rep.inertia, 0.0);
	for (int c = 0; c < 5; c++) {
		int v = (int)cent[2 * c];
		cr_expect(v >= 0 && v <= 2 && cent[2 * c] == (float)v && cent[2 * c + 1] == 10.0f * v,
			  "centroid %d at (%g, %g)", c, cent[2 * c], cent[2 * c + 1]);
	}
	/* Rows on several equal centroids go to the first of them. */
	for (int i = 0; i < 10; i++) {
		uint32_t first = 0;
		while (cent[2 * first] != x[2 * i])
			first++;
		cr_expect_eq(assign[i], first, "row %d in cluster %u, its first centroid is %u", i,
			     assign[i], first);
	}
	kmeans_report_free(&rep);
}

Test(kmeans, errors)
{
	float x[4 * 5] = {0}, cent[16 * 5];
	struct kmeans_opts o = {.k = 5, .restarts = 1, .max_iter = 10, .tol = 0, .seed = 1};

	cr_expect_eq(kmeans_fit(x, 4, 5, &o, cent, NULL, NULL), CORE_EUSAGE);
	cr_expect_str_eq(err_detail(), "cannot make 5 clusters of 4 points");
	o.k = 0;
	cr_expect_eq(kmeans_fit(x, 4, 5, &o, cent, NULL, NULL), CORE_EUSAGE);
	o.k = 2;
	o.restarts = 0;
	cr_expect_eq(kmeans_fit(x, 4, 5, &o, cent, NULL, NULL), CORE_EUSAGE);
	o.restarts = 1;
	o.tol = -1;
	cr_expect_eq(kmeans_fit(x, 4, 5, &o, cent, NULL, NULL), CORE_EUSAGE);
	o.tol = 0;
	x[2 * 5 + 3] = NAN;
	cr_expect_eq(kmeans_fit(x, 4, 5, &o, cent, NULL, NULL), CORE_ENAN);
	cr_expect(strstr(err_detail(), "feature 3 of row 2"), "detail: %s", err_detail());
	x[2 * 5 + 3] = INFINITY;
	cr_expect_eq(kmeans_fit(x, 4, 5, &o, cent, NULL, NULL), CORE_ENAN);
}

/* Lloyd's iterations from given centroids, written out naively from kmeans.h: assignment
 * (ties to the lower index), stop tests, means in double in row order, an empty cluster to
 * the row farthest from its centroid among clusters of two rows or more. */
static int ref_lloyd(const float *x, size_t n, int d, int k, int max_iter, double tol, float *c,
		     uint32_t *a, double *hist)
{
	double *dist = malloc(sizeof *dist * n), *sum = malloc(sizeof *sum * (size_t)d), prev = 0;
	size_t *cnt = malloc(sizeof *cnt * (size_t)k);
	int it = 0;
	cr_assert(dist && sum && cnt);
	while (it < max_iter) {
		size_t moved = 0;
		double J = 0.0;
		for (size_t i = 0; i < n; i++) {
			uint32_t best = 0;
			double bd = INFINITY;
			for (int j = 0; j < k; j++) {
				double t = ref_dist2(x + i * d, c + (size_t)j * d, d);
				if (t < bd) {
					bd = t;
					best = (uint32_t)j;
				}
			}
			moved += it == 0 || a[i] != best;
			a[i] = best;
			dist[i] = bd;
			J += bd;
		}
		hist[it++] = J;
		if (it > 1 && (moved == 0 || prev - J <= tol * prev))
			break;
		if (it == max_iter)
			break;
		for (int j = 0; j < k; j++) {
			cnt[j] = 0;
			for (int e = 0; e < d; e++)
				sum[e] = 0.0;
			for (size_t i = 0; i < n; i++)
				if (a[i] == (uint32_t)j) {
					cnt[j]++;
					for (int e = 0; e < d; e++)
						sum[e] += x[i * d + e];
				}
			for (int e = 0; cnt[j] && e < d; e++)
				c[(size_t)j * d + e] = (float)(sum[e] / (double)cnt[j]);
		}
		for (int j = 0; j < k; j++) {
			if (cnt[j])
				continue;
			size_t best = n;
			for (size_t i = 0; i < n; i++)
				if (cnt[a[i]] >= 2 && dist[i] > 0 && (best == n || dist[i] > dist[best]))
					best = i;
			if (best == n)
				continue;
			memcpy(c + (size_t)j * d, x + best * d, sizeof *c * d);
			dist[best] = 0.0;
			cnt[a[best]]--;
			cnt[j]++;
		}
		prev = J;
	}
	free(dist);
	free(sum);
	free(cnt);
	return it;
}

/* kmeans_fit from o.init against ref_lloyd: the same assignments and centroids bit for bit
 * (means of the same rows in the same order), the same number of iterations, and inertias
 * within rounding (the distances are summed in another order). */
static void check_against_reference(const char *what, const float *x, size_t n, int d,
				    struct kmeans_opts o)
{
	const size_t kd = (size_t)o.k * d;
	float *c = malloc(sizeof *c * kd), *rc = malloc(sizeof *rc * kd);
	uint32_t *a = malloc(sizeof *a * n), *ra = malloc(sizeof *ra * n);
	double *rh = malloc(sizeof *rh * (size_t)o.max_iter);
	struct kmeans_report rep = {0};
	cr_assert(c && rc && a && ra && rh);
	memcpy(rc, o.init, sizeof *rc * kd);
	const int rit = ref_lloyd(x, n, d, o.k, o.max_iter, o.tol, rc, ra, rh);
	cr_assert_eq(kmeans_fit(x, n, d, &o, c, a, &rep), 0, "%s: %s", what, err_detail());
	cr_expect_eq(rep.iterations, rit, "%s: %d iterations, the reference %d", what,
		     rep.iterations, rit);
	cr_expect(!memcmp(c, rc, sizeof *c * kd), "%s: centroids differ from the reference", what);
	cr_expect(!memcmp(a, ra, sizeof *a * n), "%s: assignment differs from the reference", what);
	for (int it = 0; it < rit && it < rep.iterations; it++)
		cr_expect(fabs(rep.history[it] - rh[it]) <= 1e-12 * rh[it], "%s: inertia %.17g at "
			  "iteration %d, the reference %.17g", what, rep.history[it], it, rh[it]);
	kmeans_report_free(&rep);
	free(c);
	free(rc);
	free(a);
	free(ra);
	free(rh);
}

Test(kmeans, empty_cluster_reseeded_by_hand)
{
	/* On a line: A0 = -9 with 20 rows at -4.6, b0 = 0, b1 = 10, 20 rows at 10.6 and
	 * C0 = 21, from centroids -9, 0, 21. Iteration 1: A = {A0, the -4.6s}, B = {b0, b1},
	 * C = {the 10.6s, C0}; means -101/21 = -4.81, 5 and 233/21 = 11.10. Iteration 2: b0 is
	 * 4.81 from A and 5 from B, b1 1.10 from C: B is empty. Its new centroid is the row
	 * farthest from its own centroid: C0, 9.90 from C (A0 is 4.19 from A, b0 4.81).
	 * Iteration 3: C0 alone in B; iteration 4 moves nothing. Final centroids
	 * (-9 + 20 * -4.6 + 0) / 22, 21 and (10 + 20 * 10.6) / 21. */
	float x[44];
	const float init[3] = {-9.0f, 0.0f, 21.0f};
	uint32_t a[44];
	float c[3];
	struct kmeans_report rep = {0};
	x[0] = -9.0f;
	for (int i = 1; i <= 20; i++)
		x[i] = -4.6f;
	x[21] = 0.0f;
	x[22] = 10.0f;
	for (int i = 23; i <= 42; i++)
		x[i] = 10.6f;
	x[43] = 21.0f;
	struct kmeans_opts o = {.k = 3, .restarts = 1, .max_iter = 20, .tol = 0, .init = init};
	cr_assert_eq(kmeans_fit(x, 44, 1, &o, c, a, &rep), 0, "%s", err_detail());
	cr_expect_eq(rep.iterations, 4);
	cr_expect(rep.converged);
	cr_expect_eq(c[1], 21.0f, "cluster 1 re-seeded at %g, expected 21 (C0)", c[1]);
	cr_expect(fabs(c[0] - (-9.0 + 20 * (double)-4.6f) / 22) < 1e-6, "A at %.9g", c[0]);
	cr_expect(fabs(c[2] - (10.0 + 20 * (double)10.6f) / 21) < 1e-6, "C at %.9g", c[2]);
	cr_expect(a[21] == 0 && a[22] == 2 && a[43] == 1 && a[0] == 0 && a[1] == 0 && a[23] == 2,
		  "assignment of A0 b0 b1 C0: %u %u %u %u", a[0], a[21], a[22], a[43]);
	kmeans_report_free(&rep);
	check_against_reference("by hand", x, 44, 1, o);

	/* The same, mirrored, so that two rows tie for farthest: L0 = -21 (row 0) with seven
	 * rows at -11, -8, 8, seven at 11 and R0 = 21 (row 17), from -21, 0, 21. Iteration 1:
	 * L = {L0, the -11s}, M = {-8, 8}, R = {the 11s, R0}; means -12.25, 0, 12.25 (exact).
	 * Iteration 2: -8 goes to L (4.25 < 8), 8 to R: M is empty, and L0 and R0 are both
	 * 8.75 from their centroids: the lower row, L0, re-seeds M. Iteration 3: L0 alone in M;
	 * iteration 4 moves nothing. Final centroids (-77 - 8) / 8 = -10.625, -21 and
	 * (8 + 77 + 21) / 9 = 106 / 9. */
	float y[18];
	const float init2[3] = {-21.0f, 0.0f, 21.0f};
	y[0] = -21.0f;
	for (int i = 1; i <= 7; i++) {
		y[i] = -11.0f;
		y[i + 9] = 11.0f;
	}
	y[8] = -8.0f;
	y[9] = 8.0f;
	y[17] = 21.0f;
	o.init = init2;
	cr_assert_eq(kmeans_fit(y, 18, 1, &o, c, a, &rep), 0, "%s", err_detail());
	cr_expect(c[0] == -10.625f && c[1] == -21.0f && c[2] == (float)(106.0 / 9),
		  "centroids %.9g %.9g %.9g, expected -10.625 -21 %.9g", c[0], c[1], c[2],
		  106.0 / 9);
	cr_expect_eq(rep.iterations, 4);
	kmeans_report_free(&rep);
	check_against_reference("mirrored", y, 18, 1, o);
}

Test(kmeans, seeding_draws_in_proportion_to_squared_distance)
{
	/* With max_iter 1 the fit stops after the first assignment, so the centroids returned
	 * are the k-means++ seeds. 100 rows at 0, one at 1, one at 100: once a 0 is drawn, 100
	 * follows with probability 10000 / 10001 (uniform draws would take it 1 time in 101);
	 * a row on a chosen centroid (another 0) has weight 0 and is never drawn. */
	float x[102], c[2];
	int far = 0;
	for (int i = 0; i < 100; i++)
		x[i] = 0.0f;
	x[100] = 1.0f;
	x[101] = 100.0f;
	for (uint64_t seed = 1; seed <= 60; seed++) {
		struct kmeans_opts o = {.k = 2, .restarts = 1, .max_iter = 1, .tol = 0, .seed = seed};
		cr_assert_eq(kmeans_fit(x, 102, 1, &o, c, NULL, NULL), 0);
		cr_expect(c[0] != c[1], "seed %llu: the same row drawn twice (%g)",
			  (unsigned long long)seed, c[0]);
		far += (c[0] == 0.0f && c[1] == 100.0f);
	}
	cr_expect_geq(far, 55, "{0, 100} drawn in %d of 60 seedings, expected about 58", far);
}

Test(kmeans, lloyd_matches_a_naive_reference)
{
	/* Random starting centroids in the data's box leave clusters empty at the first
	 * assignment, so re-seeding is exercised many times. */
	for (uint64_t seed = 1; seed <= 20; seed++) {
		const int d = 1 + (int)(seed % 4) * 3, k = 4 + (int)(seed % 5) * 4;
		const size_t n = 150 + 40 * (seed % 3);
		float *x = blobs(n, d, 5, 3.0, 1.0, 200 + seed, NULL);
		float *init = malloc(sizeof *init * (size_t)k * d);
		char what[64];
		for (size_t q = 0; q < (size_t)k * d; q++)
			init[q] = 8.0f * (rng_uniform(300 + seed, RNG_STREAM_TEST, q) - 0.5f);
		snprintf(what, sizeof what, "seed %llu n %zu d %d k %d", (unsigned long long)seed, n,
			 d, k);
		struct kmeans_opts o = {.k = k, .restarts = 1, .max_iter = 100,
					.tol = seed % 2 ? 0 : 1e-4, .init = init};
		check_against_reference(what, x, n, d, o);
		free(init);
		free(x);
	}
}

struct ranked {
	double d;
	uint32_t i;
};

static int by_dist_then_index(const void *pa, const void *pb)
{
	const struct ranked *a = pa, *b = pb;
	if (a->d != b->d)
		return a->d < b->d ? -1 : 1;
	return a->i < b->i ? -1 : a->i > b->i;
}

Test(kmeans, nearest_matches_brute_force)
{
	const int k = 37, d = 13, rows = 200;
	float *cent = uniform_rows((size_t)k, d, 31), *x = uniform_rows((size_t)rows, d, 32);
	struct ranked ref[37];
	uint32_t idx[37];
	float dist[37];

	/* Exact ties: centroids 5 and 30 copy centroid 2. */
	memcpy(cent + 5 * d, cent + 2 * d, sizeof *cent * d);
	memcpy(cent + 30 * d, cent + 2 * d, sizeof *cent * d);
	memcpy(x, cent + 2 * d, sizeof *x * d); /* row 0 sits on them */
	for (int r = 0; r < rows; r++) {
		const float *row = x + (size_t)r * d;
		for (int c = 0; c < k; c++)
			ref[c] = (struct ranked){ref_dist2(row, cent + (size_t)c * d, d), (uint32_t)c};
		qsort(ref, (size_t)k, sizeof *ref, by_dist_then_index);
		const int tops[] = {1, 2, 5, 37};
		for (int t = 0; t < 4; t++) {
			kmeans_nearest(cent, k, d, row, tops[t], idx, dist);
			for (int q = 0; q < tops[t]; q++) {
				cr_expect_eq(idx[q], ref[q].i, "row %d topn %d place %d: %u, expected %u", r,
					     tops[t], q, idx[q], ref[q].i);
				cr_expect(fabs(dist[q] - ref[q].d) <= 1e-6 * ref[q].d,
					  "row %d place %d: %g vs %g", r, q, dist[q], ref[q].d);
			}
		}
	}
	kmeans_nearest(cent, k, d, x, 3, idx, NULL);
	cr_expect(idx[0] == 2 && idx[1] == 5 && idx[2] == 30, "ties: %u %u %u", idx[0], idx[1],
		  idx[2]);
	free(cent);
	free(x);
}

/* ---- logistic regression ------------------------------------------------------------------- */

/* The objective of logreg.h written out naively from its formula (theta = [w | b]). */
static double ref_loss(const struct logreg *m, const float *x, const uint32_t *y, size_t n,
		       double l2, const double *theta)
{
	const int k = m->k, d = m->d;
	double L = 0.0, w2 = 0.0;
	for (size_t i = 0; i < n; i++) {
		double s[8], mx = -INFINITY, se = 0.0;
		for (int c = 0; c < k; c++) {
			s[c] = theta[(size_t)k * d + c];
			for (int j = 0; j < d; j++)
				s[c] += theta[(size_t)c * d + j] *
					(((double)x[i * d + j] - m->mu[j]) / m->sd[j]);
			mx = fmax(mx, s[c]);
		}
		for (int c = 0; c < k; c++)
			se += exp(s[c] - mx);
		L += -(s[y[i]] - mx - log(se));
	}
	for (int q = 0; q < k * d; q++)
		w2 += theta[q] * theta[q];
	return L / (double)n + 0.5 * l2 * w2;
}

Test(logreg, gradient_matches_central_differences)
{
	const int k = 3, d = 4;
	const size_t n = 300; /* two blocks of rows */
	const double l2 = 0.3;
	struct logreg m;
	float *x = blobs(n, d, 3, 1.0, 2.0, 41, NULL);
	uint32_t *y = malloc(sizeof *y * n);
	const size_t np = logreg_nparam(k, d);
	double theta[15], grad[15], loss;

	cr_assert_eq(np, 15u);
	cr_assert_eq(logreg_init(&m, k, d), 0);
	for (int j = 0; j < d; j++) {
		m.mu[j] = 0.3f * (float)j - 0.2f;
		m.sd[j] = 0.5f + 0.4f * (float)j;
	}
	for (size_t i = 0; i < n; i++)
		y[i] = (uint32_t)rng_below(42, RNG_STREAM_TEST, i, (uint64_t)k);
	for (size_t q = 0; q < np; q++)
		theta[q] = 0.7 * rng_normal(43, RNG_STREAM_TEST, q);

	cr_assert_eq(logreg_loss_grad(&m, x, y, n, l2, theta, &loss, grad), 0);
	const double ref = ref_loss(&m, x, y, n, l2, theta);
	cr_expect(fabs(loss - ref) <= 1e-12 * fabs(ref), "loss %.17g, naive %.17g", loss, ref);
	double l0;
	cr_assert_eq(logreg_loss_grad(&m, x, y, n, l2, theta, &l0, NULL), 0);
	cr_expect_eq(l0, loss, "loss without the gradient differs");

	for (size_t q = 0; q < np; q++) {
		const double h = 1e-5, t0 = theta[q];
		theta[q] = t0 + h;
		const double fp = ref_loss(&m, x, y, n, l2, theta);
		theta[q] = t0 - h;
		const double fm = ref_loss(&m, x, y, n, l2, theta);
		theta[q] = t0;
		const double fd = (fp - fm) / (2 * h), err = fabs(grad[q] - fd);
		cr_expect(err <= 1e-6 * fmax(fabs(fd), 1e-2), "parameter %zu (%s): gradient %.12g, "
			  "central difference %.12g", q, q < (size_t)k * d ? "weight" : "bias", grad[q],
			  fd);
	}
	logreg_free(&m);
	free(x);
	free(y);
}

/* The fraction of rows whose top-1 prediction is their label. */
static double accuracy(const struct logreg *m, const float *x, const uint32_t *y, size_t n)
{
	size_t ok = 0;
	for (size_t i = 0; i < n; i++) {
		uint32_t p;
		logreg_predict(m, x + i * (size_t)m->d, 1, &p);
		ok += p == y[i];
	}
	return (double)ok / (double)n;
}

Test(logreg, separable_data_fitted_exactly)
{
	for (int k = 3; k <= 5; k++) {
		const int d = 6;
		const size_t n = 100 * (size_t)k;
		uint32_t *y = malloc(sizeof *y * n);
		float *x = blobs(n, d, k, 6.0, 1.0, 50 + (uint64_t)k, y);
		struct logreg m;
		struct logreg_fit_report rep = {0};

		/* The blobs are separable: check it independently, nearest centre of the labels'
		 * means classifies every row (the blob centres lie far apart). */
		cr_assert_eq(logreg_fit(&m, x, y, n, d, k, 1e-4, 500, &rep), 0, "k %d: %s", k,
			     err_detail());
		cr_expect_eq(accuracy(&m, x, y, n), 1.0, "k %d: training accuracy %.4f, loss %g, "
			     "%d iterations, %s", k, accuracy(&m, x, y, n), rep.loss, rep.iterations,
			     rep.status_text);
		cr_expect(rep.loss < 0.05, "k %d: loss %g", k, rep.loss);
		cr_expect(rep.iterations >= 1 && rep.evaluations >= rep.iterations);
		cr_expect(rep.status_text && *rep.status_text);
		for (int c = 0; c < k; c++)
			cr_expect_eq(m.bias[c], 0.0f);

		/* Probabilities: sum to one and equal a softmax computed here from the model's
		 * parameters. */
		for (size_t i = 0; i < n; i += 7) {
			const float *row = x + i * d;
			float p[5], s[5];
			double ref[5], mx = -INFINITY, se = 0.0, sum = 0.0;
			logreg_proba(&m, row, p);
			logreg_scores(&m, row, s);
			for (int c = 0; c < k; c++) {
				ref[c] = m.b[c];
				for (int j = 0; j < d; j++)
					ref[c] += (double)m.w[c * d + j] * (((double)row[j] - m.mu[j]) / m.sd[j]);
				cr_expect(fabs(s[c] - ref[c]) <= 1e-5 * fmax(1.0, fabs(ref[c])),
					  "k %d row %zu class %d: score %g, computed %g", k, i, c, s[c], ref[c]);
				mx = fmax(mx, ref[c]);
			}
			for (int c = 0; c < k; c++)
				se += exp(ref[c] - mx);
			for (int c = 0; c < k; c++) {
				sum += p[c];
				cr_expect(fabs(p[c] - exp(ref[c] - mx) / se) <= 1e-6, "k %d row %zu class %d",
					  k, i, c);
			}
			cr_expect(fabs(sum - 1.0) <= 1e-6, "k %d row %zu: probabilities sum to %.9f", k, i,
				  sum);
		}
		logreg_free(&m);
		free(x);
		free(y);
	}
}

Test(logreg, same_bits_whatever_the_threads)
{
	const int k = 4, d = 70; /* two column tiles of the gradient */
	const size_t n = 700;    /* three blocks of rows */
	uint32_t *y = malloc(sizeof *y * n);
	float *x = blobs(n, d, k, 0.3, 1.0, 61, y);
	struct logreg m1, m2;
	const int nt = omp_get_max_threads();

	omp_set_num_threads(1);
	cr_assert_eq(logreg_fit(&m1, x, y, n, d, k, 1e-2, 50, NULL), 0);
	omp_set_num_threads(4);
	cr_assert_eq(logreg_fit(&m2, x, y, n, d, k, 1e-2, 50, NULL), 0);
	cr_expect(!memcmp(m1.w, m2.w, sizeof *m1.w * (size_t)k * d), "weights differ");
	cr_expect(!memcmp(m1.b, m2.b, sizeof *m1.b * (size_t)k), "biases differ");
	cr_expect(!memcmp(m1.mu, m2.mu, sizeof *m1.mu * (size_t)d));
	cr_expect(!memcmp(m1.sd, m2.sd, sizeof *m1.sd * (size_t)d));
	uint64_t t[4] = {175, 175, 175, 175};
	omp_set_num_threads(1);
	cr_assert_eq(logreg_fit_bias(&m1, x, n, t), 0);
	omp_set_num_threads(4);
	cr_assert_eq(logreg_fit_bias(&m2, x, n, t), 0);
	cr_expect(!memcmp(m1.bias, m2.bias, sizeof *m1.bias * (size_t)k), "corrections differ");
	omp_set_num_threads(nt);
	logreg_free(&m1);
	logreg_free(&m2);
	free(x);
	free(y);
}

Test(logreg, predict_ranks_ties_to_the_lower_class)
{
	struct logreg m;
	uint32_t idx[3];
	const float row[1] = {0.5f};

	cr_assert_eq(logreg_init(&m, 3, 1), 0);
	m.b[0] = 1.0f;
	m.b[1] = 2.0f;
	m.b[2] = 2.0f;
	logreg_predict(&m, row, 3, idx);
	cr_expect(idx[0] == 1 && idx[1] == 2 && idx[2] == 0, "%u %u %u", idx[0], idx[1], idx[2]);
	m.bias[2] = 0.5f;
	logreg_predict(&m, row, 2, idx);
	cr_expect(idx[0] == 2 && idx[1] == 1, "%u %u", idx[0], idx[1]);
	m.b[0] = 2.5f; /* now 0, 1 and 2 at 2.5, 2 and 2.5 */
	logreg_predict(&m, row, 3, idx);
	cr_expect(idx[0] == 0 && idx[1] == 2 && idx[2] == 1, "%u %u %u", idx[0], idx[1], idx[2]);
	logreg_free(&m);
}

Test(logreg, standardisation_from_the_training_rows)
{
	/* Feature 0 constant (sd taken as 1), feature 1 = 0, 1, ..., 9: mean 4.5 and population
	 * sd sqrt(8.25). */
	float x[20];
	uint32_t y[10];
	struct logreg m;
	for (int i = 0; i < 10; i++) {
		x[2 * i] = 3.0f;
		x[2 * i + 1] = (float)i;
		y[i] = i >= 5;
	}
	cr_assert_eq(logreg_fit(&m, x, y, 10, 2, 2, 0.1, 100, NULL), 0, "%s", err_detail());
	cr_expect(m.mu[0] == 3.0f && m.sd[0] == 1.0f, "constant feature: mu %g sd %g", m.mu[0],
		  m.sd[0]);
	cr_expect(m.mu[1] == 4.5f && fabs(m.sd[1] - sqrt(8.25)) < 1e-6, "mu %g sd %g", m.mu[1],
		  m.sd[1]);
	cr_expect_eq(accuracy(&m, x, y, 10), 1.0);
	logreg_free(&m);
}

Test(logreg, errors)
{
	float x[6] = {1, 2, 3, 4, 5, 6};
	uint32_t y[3] = {0, 1, 2};
	struct logreg m;

	cr_expect_eq(logreg_fit(&m, x, y, 3, 2, 2, 0.1, 10, NULL), CORE_EUSAGE);
	cr_expect(strstr(err_detail(), "label 2 of row 2"), "detail: %s", err_detail());
	cr_expect(!m.w && !m.mu && m.k == 0, "model not zeroed after a failure");
	cr_expect_eq(logreg_fit(&m, x, y, 3, 2, 1, 0.1, 10, NULL), CORE_EUSAGE);
	cr_expect_eq(logreg_fit(&m, x, y, 3, 2, 3, -1.0, 10, NULL), CORE_EUSAGE);
	cr_expect_eq(logreg_fit(&m, x, y, 3, 2, 3, 0.1, 0, NULL), CORE_EUSAGE);
	x[3] = NAN;
	cr_expect_eq(logreg_fit(&m, x, y, 3, 2, 3, 0.1, 10, NULL), CORE_ENAN);
	cr_expect(strstr(err_detail(), "feature 1 of row 1"), "detail: %s", err_detail());
}

/* ---- bias correction ----------------------------------------------------------------------- */

static void counts_of(const struct logreg *m, const float *x, size_t n, uint64_t *cnt)
{
	memset(cnt, 0, sizeof *cnt * (size_t)m->k);
	for (size_t i = 0; i < n; i++) {
		uint32_t p;
		logreg_predict(m, x + i * (size_t)m->d, 1, &p);
		cnt[p]++;
	}
}

Test(bias, two_classes_by_hand)
{
	/* s_0(x) = 0, s_1(x) = x on the rows -3, -1, 1, 3: row i goes to class 1 when
	 * x_i + bias_1 - bias_0 > 0. Targets (3, 1): only x = 3 in class 1, so the difference
	 * delta = bias_1 - bias_0 lies in (-3, -1); the largest margin takes its midpoint -2, and
	 * mean zero gives (1, -1). Targets (1, 3): delta in (1, 3), so (-1, 1). Targets (2, 2):
	 * delta in (-1, 1), so (0, 0). */
	const float x[4] = {-3, -1, 1, 3};
	const struct {
		uint64_t t[2];
		float bias0;
	} cases[] = {{{3, 1}, 1.0f}, {{1, 3}, -1.0f}, {{2, 2}, 0.0f}};
	struct logreg m;
	uint64_t cnt[2];

	cr_assert_eq(logreg_init(&m, 2, 1), 0);
	m.w[1] = 1.0f;
	for (int q = 0; q < 3; q++) {
		m.bias[0] = m.bias[1] = 99.0f; /* not read */
		cr_assert_eq(logreg_fit_bias(&m, x, 4, cases[q].t), 0, "%s", err_detail());
		cr_expect(fabsf(m.bias[0] - cases[q].bias0) <= 1e-6f &&
			  fabsf(m.bias[1] + cases[q].bias0) <= 1e-6f,
			  "targets (%llu, %llu): bias (%.9g, %.9g), expected (%g, %g)",
			  (unsigned long long)cases[q].t[0], (unsigned long long)cases[q].t[1],
			  m.bias[0], m.bias[1], cases[q].bias0, -cases[q].bias0);
		counts_of(&m, x, 4, cnt);
		cr_expect(cnt[0] == cases[q].t[0] && cnt[1] == cases[q].t[1], "counts %llu %llu",
			  (unsigned long long)cnt[0], (unsigned long long)cnt[1]);
	}
	/* Everything to one class. */
	const uint64_t all0[2] = {4, 0}, all1[2] = {0, 4};
	cr_assert_eq(logreg_fit_bias(&m, x, 4, all0), 0);
	counts_of(&m, x, 4, cnt);
	cr_expect(cnt[0] == 4 && cnt[1] == 0);
	cr_assert_eq(logreg_fit_bias(&m, x, 4, all1), 0);
	counts_of(&m, x, 4, cnt);
	cr_expect(cnt[0] == 0 && cnt[1] == 4);
	logreg_free(&m);
}

Test(bias, rescues_a_starved_class)
{
	/* Four overlapping classes of 700, 200, 70 and 30 rows: the plain classifier hardly
	 * ever predicts the small ones; the correction must give each a quarter. */
	const int k = 4, d = 2;
	const size_t sizes[4] = {700, 200, 70, 30}, n = 1000;
	float *x = malloc(sizeof *x * n * d);
	uint32_t *y = malloc(sizeof *y * n);
	struct logreg m;
	uint64_t cnt[4];
	const uint64_t target[4] = {250, 250, 250, 250};
	size_t i = 0;

	for (int c = 0; c < k; c++)
		for (size_t r = 0; r < sizes[c]; r++, i++) {
			y[i] = (uint32_t)c;
			x[i * d] = 0.8f * (float)c + rng_normal(71, RNG_STREAM_TEST, 2 * i);
			x[i * d + 1] = 0.4f * (float)(c % 2) + rng_normal(71, RNG_STREAM_TEST, 2 * i + 1);
		}
	cr_assert_eq(logreg_fit(&m, x, y, n, d, k, 1e-3, 200, NULL), 0, "%s", err_detail());
	counts_of(&m, x, n, cnt);
	cr_assert(cnt[3] < 100 && cnt[2] < 100, "the premise: classes 2 and 3 starved, counts "
		  "%llu %llu %llu %llu", (unsigned long long)cnt[0], (unsigned long long)cnt[1],
		  (unsigned long long)cnt[2], (unsigned long long)cnt[3]);
	cr_assert_eq(logreg_fit_bias(&m, x, n, target), 0, "%s", err_detail());
	counts_of(&m, x, n, cnt);
	for (int c = 0; c < k; c++)
		cr_expect(cnt[c] + 1 >= target[c] && cnt[c] <= target[c] + 1,
			  "class %d: %llu rows, target %llu (bias %g %g %g %g)", c,
			  (unsigned long long)cnt[c], (unsigned long long)target[c], m.bias[0],
			  m.bias[1], m.bias[2], m.bias[3]);
	/* Uneven targets, one of them zero. */
	const uint64_t t2[4] = {100, 0, 600, 300};
	cr_assert_eq(logreg_fit_bias(&m, x, n, t2), 0);
	counts_of(&m, x, n, cnt);
	for (int c = 0; c < k; c++)
		cr_expect(cnt[c] + 1 >= t2[c] && cnt[c] <= t2[c] + 1, "class %d: %llu rows, target %llu",
			  c, (unsigned long long)cnt[c], (unsigned long long)t2[c]);
	logreg_free(&m);
	free(x);
	free(y);
}

/* The best total logit over every assignment of the n rows with counts t (k^n of them),
 * the second best, and the best assignment. */
static void brute_optimum(const double *s, int n, int k, const uint64_t *t, uint32_t *best,
			  double *v1, double *v2)
{
	uint32_t a[10] = {0};
	long total = 1;
	*v1 = *v2 = -INFINITY;
	for (int i = 0; i < n; i++)
		total *= k;
	for (long code = 0; code < total; code++) {
		long c = code;
		uint64_t cnt[4] = {0};
		double v = 0.0;
		for (int i = 0; i < n; i++, c /= k) {
			a[i] = (uint32_t)(c % k);
			cnt[a[i]]++;
			v += s[i * k + (int)a[i]];
		}
		int ok = 1;
		for (int q = 0; q < k; q++)
			ok &= cnt[q] == t[q];
		if (!ok)
			continue;
		if (v > *v1) {
			*v2 = *v1;
			*v1 = v;
			memcpy(best, a, sizeof *a * (size_t)n);
		} else if (v > *v2) {
			*v2 = v;
		}
	}
}

Test(bias, argmax_is_the_optimal_transport_assignment)
{
	int checked = 0;

	for (uint64_t trial = 0; trial < 60; trial++) {
		const int k = trial % 2 ? 4 : 3, n = k == 3 ? 9 : 8, d = 3;
		struct logreg m;
		float x[9 * 3];
		double s[9 * 4], v1, v2;
		uint32_t best[10], p;
		uint64_t t[4] = {0};

		cr_assert_eq(logreg_init(&m, k, d), 0);
		for (int q = 0; q < k * d; q++)
			m.w[q] = 1.5f * rng_normal(80 + trial, RNG_STREAM_TEST, (uint64_t)q);
		for (int c = 0; c < k; c++)
			m.b[c] = rng_normal(80 + trial, RNG_STREAM_TEST, 100 + (uint64_t)c);
		for (int q = 0; q < n * d; q++)
			x[q] = rng_normal(80 + trial, RNG_STREAM_TEST, 200 + (uint64_t)q);
		for (int i = 0; i < n; i++) /* random targets, zeros allowed */
			t[rng_below(80 + trial, RNG_STREAM_TEST, 300 + (uint64_t)i, (uint64_t)k)]++;
		/* The logits as logreg.h defines them, computed here. */
		for (int i = 0; i < n; i++)
			for (int c = 0; c < k; c++) {
				double v = m.b[c];
				for (int j = 0; j < d; j++)
					v += (double)m.w[c * d + j] * (double)x[i * d + j];
				s[i * k + c] = (double)(float)v;
			}
		brute_optimum(s, n, k, t, best, &v1, &v2);
		cr_assert_eq(logreg_fit_bias(&m, x, (size_t)n, t), 0, "trial %llu: %s",
			     (unsigned long long)trial, err_detail());
		if (v1 - v2 < 1e-4) { /* two optima, or nearly: no unique answer to compare */
			logreg_free(&m);
			continue;
		}
		checked++;
		for (int i = 0; i < n; i++) {
			logreg_predict(&m, x + i * d, 1, &p);
			cr_expect_eq(p, best[i], "trial %llu (k %d, targets %llu %llu %llu %llu): row %d "
				     "goes to %u, the optimum to %u", (unsigned long long)trial, k,
				     (unsigned long long)t[0], (unsigned long long)t[1],
				     (unsigned long long)t[2], (unsigned long long)t[3], i, p, best[i]);
		}
		logreg_free(&m);
	}
	cr_expect_geq(checked, 50, "only %d of 60 trials had a unique optimum", checked);
}

Test(bias, assign_on_scores_is_the_optimal_transport_assignment)
{
	int checked = 0;

	for (uint64_t trial = 0; trial < 60; trial++) {
		const int k = trial % 2 ? 4 : 3, n = k == 3 ? 9 : 8;
		float f[9 * 4];
		double s[9 * 4], v1, v2, v = 0.0;
		uint32_t best[10], a[10];
		uint64_t t[4] = {0}, cnt[4] = {0};

		for (int q = 0; q < n * k; q++) {
			f[q] = 4.0f * rng_normal(300 + trial, RNG_STREAM_TEST, (uint64_t)q);
			s[q] = f[q];
		}
		for (int i = 0; i < n; i++)
			t[rng_below(300 + trial, RNG_STREAM_TEST, 100 + (uint64_t)i, (uint64_t)k)]++;
		brute_optimum(s, n, k, t, best, &v1, &v2);
		cr_assert_eq(logreg_assign(f, (size_t)n, k, t, a), 0, "trial %llu: %s",
			     (unsigned long long)trial, err_detail());
		for (int i = 0; i < n; i++) {
			cr_assert_lt(a[i], (uint32_t)k);
			cnt[a[i]]++;
			v += s[i * k + (int)a[i]];
		}
		for (int c = 0; c < k; c++)
			cr_expect_eq(cnt[c], t[c], "trial %llu: class %d has %llu rows, not %llu",
				     (unsigned long long)trial, c, (unsigned long long)cnt[c],
				     (unsigned long long)t[c]);
		cr_expect(v >= v1 - 1e-5 * (1 + fabs(v1)), "trial %llu: total %.9g, the optimum %.9g",
			  (unsigned long long)trial, v, v1);
		if (v1 - v2 < 1e-4)
			continue;
		checked++;
		for (int i = 0; i < n; i++)
			cr_expect_eq(a[i], best[i], "trial %llu: row %d in class %u, the optimum's %u",
				     (unsigned long long)trial, i, a[i], best[i]);
	}
	cr_expect_geq(checked, 50, "only %d of 60 trials had a unique optimum", checked);
	const uint64_t t2[2] = {1, 1};
	const float bad[4] = {0, 1, NAN, 2};
	uint32_t a2[2];
	cr_expect_eq(logreg_assign(bad, 2, 2, t2, a2), CORE_ENAN);
	const uint64_t t3[2] = {1, 2};
	cr_expect_eq(logreg_assign(bad, 2, 2, t3, a2), CORE_EUSAGE);
}

/* The fit of a document router when two of four paths are no row's best: the rows are two
 * clusters (feature 0 at +-3), the first 20 best on path 0, the others on path 1; path 2
 * loses g_i (a feature of the row) against path 0 on the first cluster and much more on
 * the second, path 3 the same on the second cluster. With min_share 0.5 every path must get
 * at least floor(40 * 0.5 / 4) = 5 rows. The labels fitted must give path 2 the five rows of
 * the first cluster of least g and path 3 those of the second (found here by sorting), and
 * the router kept must meet the targets exactly: before the labels were floored, paths 2
 * and 3 had equal logits and the correction left one of them without a row. */
Test(bias, paths_no_row_prefers_get_the_rows_that_lose_least)
{
	enum { N = 40, K = 4, D = 2 };
	float x[N * D], score[N * K];
	uint32_t y[N];

	for (int i = 0; i < N; i++) {
		const int second = i >= N / 2;
		const float g = 0.05f + 2.0f * rng_uniform(7, RNG_STREAM_TEST, (uint64_t)i);
		x[i * D] = second ? -3.0f : 3.0f;
		x[i * D + 1] = g;
		float *sc = score + i * K;
		sc[0] = second ? -9.0f : -1.0f;
		sc[1] = second ? -1.0f : -9.0f;
		sc[2] = second ? -20.0f : -1.0f - g;
		sc[3] = second ? -1.0f - g : -20.0f;
		y[i] = (uint32_t)second;
	}
	const struct route_fit_opts o = {.l2 = 0.01, .holdout = 0.0, .min_share = 0.5,
					 .correct = 1, .max_iter = 500, .seed = 0};
	struct logreg m;
	char *rep = NULL;
	cr_assert_eq(route_fit_logreg(x, y, score, N, D, K, &o, &m, &rep), 0, "%s", err_detail());

	/* the five rows of least g in each cluster, by sorting (selection, N is small) */
	uint32_t want[N];
	for (int half = 0; half < 2; half++) {
		int taken[N / 2] = {0};
		for (int i = 0; i < N / 2; i++)
			want[half * N / 2 + i] = (uint32_t)half;
		for (int r = 0; r < 5; r++) {
			int b = -1;
			for (int i = 0; i < N / 2; i++)
				if (!taken[i] && (b < 0 || x[(half * N / 2 + i) * D + 1] <
							   x[(half * N / 2 + b) * D + 1]))
					b = i;
			taken[b] = 1;
			want[half * N / 2 + b] = (uint32_t)(2 + half);
		}
	}
	json_error_t je;
	json_t *j = json_loads(rep, 0, &je);
	cr_assert(j, "report not JSON: %s", rep);
	cr_expect_eq(json_integer_value(json_object_get(j, "relabelled")), 10, "%s", rep);
	const json_t *tg = json_object_get(j, "target_counts");
	const json_t *pa = json_object_get(j, "predicted_after");
	const json_t *lc = json_object_get(j, "label_counts");
	const json_t *bc = json_object_get(j, "best_path_counts");
	for (int p = 0; p < K; p++) {
		const json_int_t t = json_integer_value(json_array_get(tg, (size_t)p));
		cr_expect_eq(t, p < 2 ? 15 : 5, "path %d's target %lld: %s", p, (long long)t, rep);
		cr_expect_eq(json_integer_value(json_array_get(pa, (size_t)p)), t,
			     "path %d: the router sends %lld rows, its target is %lld: %s", p,
			     (long long)json_integer_value(json_array_get(pa, (size_t)p)),
			     (long long)t, rep);
		cr_expect_eq(json_integer_value(json_array_get(lc, (size_t)p)), t, "%s", rep);
		cr_expect_eq(json_integer_value(json_array_get(bc, (size_t)p)), p < 2 ? 20 : 0,
			     "%s", rep);
	}
	json_decref(j);
	for (int i = 0; i < N; i++) {
		uint32_t p;
		logreg_predict(&m, x + i * D, 1, &p);
		cr_expect_eq(p, want[i], "row %d (g %.3f): path %u, the floored optimum's %u", i,
			     x[i * D + 1], p, want[i]);
	}
	free(rep);
	logreg_free(&m);
}

Test(bias, errors)
{
	const float x[4] = {-3, -1, 1, 3};
	const uint64_t few[2] = {1, 2}, many[2] = {3, UINT64_MAX};
	struct logreg m;

	cr_assert_eq(logreg_init(&m, 2, 1), 0);
	m.bias[0] = 7.0f;
	cr_expect_eq(logreg_fit_bias(&m, x, 4, few), CORE_EUSAGE);
	cr_expect_eq(logreg_fit_bias(&m, x, 4, many), CORE_EUSAGE);
	cr_expect_eq(m.bias[0], 7.0f, "bias changed by a failed correction");
	logreg_free(&m);
}

/* ---- cluster scores ------------------------------------------------------------------------ */

/* The rows of a table as (assign, label) pairs. */
static size_t unroll(const uint64_t *t, int G, int K, uint32_t *assign, uint32_t *labels)
{
	size_t n = 0;
	for (int g = 0; g < G; g++)
		for (int k = 0; k < K; k++)
			for (uint64_t r = 0; r < t[g * K + k]; r++, n++) {
				/* interleave a little so the order is not the table's */
				assign[n] = (uint32_t)k;
				labels[n] = (uint32_t)g;
			}
	return n;
}

/* Expected values from this script (python3 cs.py '[[3,1,0],[1,2,1],[0,1,3]]'):
 *   from fractions import Fraction as F; from math import log, sqrt, comb; import itertools
 *   T = <table>; items = [(g, k) for g in ... for k in ... for _ in range(T[g][k])]
 *   ARI: tp, fp, fn, tn counted over itertools.combinations(items, 2) (same label / same
 *        shard), ari = F(2*(tp*tn - fn*fp), (tp+fn)*(fn+tn) + (tp+fp)*(fp+tn)), asserted
 *        equal to Hubert-Arabie's (idx - E) / ((sa + sb)/2 - E) in fractions;
 *   NMI: sum T/n log(n T / (a b)) / sqrt(H(a) H(b)) with math.log;
 *   purity: F(sum of column maxima, n).
 * Table 1 [[3,1,0],[1,2,1],[0,1,3]]: purity 2/3, ARI 23/144, NMI 0.34329545178566134.
 * Table 2 [[5,0,2,0],[1,0,0,4]] (an empty shard): purity 11/12, ARI 40/97,
 *   NMI 0.5476627732761845. */
Test(clusterstats, hand_computed_tables)
{
	const struct {
		int G, K;
		uint64_t t[12];
		double purity, ari, nmi;
	} cases[] = {
		{3, 3, {3, 1, 0, 1, 2, 1, 0, 1, 3}, 2.0 / 3, 23.0 / 144, 0.34329545178566134},
		{2, 4, {5, 0, 2, 0, 1, 0, 0, 4}, 11.0 / 12, 40.0 / 97, 0.5476627732761845},
	};
	for (int q = 0; q < 2; q++) {
		uint32_t assign[12], labels[12];
		struct cluster_stats s;
		size_t n = unroll(cases[q].t, cases[q].G, cases[q].K, assign, labels);
		cr_assert_eq(clusterstats_compute(assign, labels, n, cases[q].K, cases[q].G, &s), 0);
		for (int e = 0; e < cases[q].G * cases[q].K; e++)
			cr_expect_eq(s.table[e], cases[q].t[e], "case %d entry %d", q, e);
		cr_expect_eq(s.n, 12u);
		cr_expect(fabs(s.purity - cases[q].purity) <= 1e-15, "case %d purity %.17g", q,
			  s.purity);
		cr_expect(fabs(s.ari - cases[q].ari) <= 1e-15, "case %d ARI %.17g, expected %.17g", q,
			  s.ari, cases[q].ari);
		cr_expect(fabs(s.nmi - cases[q].nmi) <= 1e-13, "case %d NMI %.17g, expected %.17g", q,
			  s.nmi, cases[q].nmi);
		/* The table functions on the table directly, and symmetry of NMI and ARI. */
		uint64_t tr[12];
		for (int g = 0; g < cases[q].G; g++)
			for (int k = 0; k < cases[q].K; k++)
				tr[k * cases[q].G + g] = cases[q].t[g * cases[q].K + k];
		cr_expect(fabs(clusterstats_ari(tr, cases[q].K, cases[q].G) - s.ari) <= 1e-15);
		cr_expect(fabs(clusterstats_nmi(tr, cases[q].K, cases[q].G) - s.nmi) <= 1e-13);
		clusterstats_free(&s);
	}
}

Test(clusterstats, perfect_agreement_and_independence)
{
	const size_t n = 20000;
	uint32_t *a = malloc(sizeof *a * n), *l = malloc(sizeof *l * n);
	struct cluster_stats s;

	/* The same partition under other names: 1, 1, 1. */
	for (size_t i = 0; i < n; i++) {
		l[i] = (uint32_t)rng_below(91, RNG_STREAM_TEST, i, 5);
		a[i] = (l[i] * 3 + 2) % 5;
	}
	cr_assert_eq(clusterstats_compute(a, l, n, 5, 5, &s), 0);
	cr_expect(s.purity == 1.0 && fabs(s.nmi - 1.0) <= 1e-12 && s.ari == 1.0,
		  "purity %.17g NMI %.17g ARI %.17g", s.purity, s.nmi, s.ari);
	clusterstats_free(&s);

	/* Independent labellings: ARI about 0 (its spread here is about 1e-4), NMI small. */
	for (size_t i = 0; i < n; i++)
		a[i] = (uint32_t)rng_below(92, RNG_STREAM_TEST, i, 6);
	cr_assert_eq(clusterstats_compute(a, l, n, 6, 5, &s), 0);
	cr_expect(fabs(s.ari) < 2e-3, "ARI of independent labels %.6g", s.ari);
	cr_expect(s.nmi < 2e-3, "NMI of independent labels %.6g", s.nmi);
	cr_expect(s.purity < 0.25, "purity %.6g", s.purity);
	clusterstats_free(&s);
	free(a);
	free(l);
}

Test(clusterstats, conventions_of_degenerate_partitions)
{
	uint32_t one[6] = {0, 0, 0, 0, 0, 0}, two[6] = {0, 1, 0, 1, 2, 2}, id[6] = {0, 1, 2, 3, 4, 5};
	struct cluster_stats s;

	cr_assert_eq(clusterstats_compute(one, one, 6, 1, 1, &s), 0);
	cr_expect(s.purity == 1.0 && s.nmi == 1.0 && s.ari == 1.0, "single clusters: %g %g %g",
		  s.purity, s.nmi, s.ari);
	clusterstats_free(&s);
	/* One side a single cluster: NMI 0, ARI 0 (every pair together on one side only). */
	cr_assert_eq(clusterstats_compute(two, one, 6, 3, 1, &s), 0);
	cr_expect(s.purity == 1.0 && s.nmi == 0.0 && s.ari == 0.0, "one single: %g %g %g",
		  s.purity, s.nmi, s.ari);
	clusterstats_free(&s);
	cr_assert_eq(clusterstats_compute(one, two, 6, 1, 3, &s), 0);
	cr_expect(fabs(s.purity - 1.0 / 3) <= 1e-15 && s.nmi == 0.0 && s.ari == 0.0);
	clusterstats_free(&s);
	/* Both all singletons: the same partition; ARI's denominator is 0, defined 1. */
	cr_assert_eq(clusterstats_compute(id, id, 6, 6, 6, &s), 0);
	cr_expect(s.purity == 1.0 && fabs(s.nmi - 1.0) <= 1e-12 && s.ari == 1.0, "%g %g %g",
		  s.purity, s.nmi, s.ari);
	clusterstats_free(&s);
}

Test(clusterstats, errors)
{
	uint32_t a[3] = {0, 1, 2}, l[3] = {0, 0, 1};
	struct cluster_stats s;

	cr_expect_eq(clusterstats_compute(a, l, 3, 2, 2, &s), CORE_EUSAGE);
	cr_expect(strstr(err_detail(), "shard 2 of row 2"), "detail: %s", err_detail());
	cr_expect(!s.table);
	cr_expect_eq(clusterstats_compute(a, l, 3, 3, 1, &s), CORE_EUSAGE);
	cr_expect(strstr(err_detail(), "label 1 of row 2"), "detail: %s", err_detail());
	cr_expect_eq(clusterstats_compute(a, l, 0, 3, 2, &s), CORE_EUSAGE);
	cr_expect_eq(clusterstats_compute(a, l, 3, 0, 2, &s), CORE_EUSAGE);
}

/* ---- the rows routers are fitted on, by hand ----------------------------------------------- */

/* Four documents of 9, 5, 2 and 12 tokens, three paths, prefix 2; every token's log-prob -1
 * but where set below. */
#define R_DOCS 4
#define R_TOK 28
#define R_P 3
static const uint64_t r_off[R_DOCS + 1] = {0, 9, 14, 16, 28};

static void rows_fixture(struct tokfile *tf, struct scores *s, float *lp, float *doc)
{
	*tf = (struct tokfile){.path = "<hand>", .vocab = 256, .width = 4, .ndocs = R_DOCS,
			       .ntokens = R_TOK, .offsets = r_off};
	for (int i = 0; i < R_TOK * R_P; i++)
		lp[i] = -1.0f;
#define LP(t, p) lp[(t) * R_P + (p)]
	/* d0, W = 3: window [5, 8) goes to path 2 by its sum over all three tokens (path 1
	 * leads over the first two, path 0 if token 4 were counted) */
	LP(5, 1) = LP(6, 1) = -0.5f, LP(7, 1) = -3.0f;
	LP(5, 2) = LP(6, 2) = LP(7, 2) = -0.9f;
	LP(4, 0) = 0.0f;
	/* window [8, 9) is cut at the document's end: a tie, path 0 (path 1 if it ran on into
	 * d1's tokens 9 and 10) */
	LP(9, 1) = LP(10, 1) = 0.0f;
	/* d3 from token 16: windows [21, 24) path 1, [24, 27) path 2, [27, 28) path 1 */
	LP(21, 1) = LP(22, 1) = LP(23, 1) = -0.1f;
	LP(24, 2) = LP(25, 2) = LP(26, 2) = -0.2f;
	LP(27, 1) = -0.5f;
#undef LP
	/* per document: d0 a tie of paths 1 and 2, d1 path 2, d2 (too short) path 2, d3 path 0 */
	const float d[R_DOCS * R_P] = {-5, -4, -4, -1, -2, -0.5f, 0, 0, 10, 0, -1, -2};
	memcpy(doc, d, sizeof d);
	*s = (struct scores){.docs = R_DOCS, .tokens = R_TOK, .paths = R_P, .prefix = 2,
			     .logprob = lp, .doc = doc};
}

Test(rows, window_labels_by_hand)
{
	struct tokfile tf;
	struct scores s;
	float lp[R_TOK * R_P], doc[R_DOCS * R_P];
	rows_fixture(&tf, &s, lp, doc);
	cr_assert_eq(route_window_count(&tf, 2, 3), 5, "boundaries 5, 8 | none | none | 5, 8, 11");
	uint32_t y[5];
	route_window_labels(&s, &tf, 3, y);
	const uint32_t want[5] = {2, 0, 1, 2, 1};
	for (int i = 0; i < 5; i++)
		cr_expect_eq(y[i], want[i], "window %d: path %u, by hand %u", i, y[i], want[i]);
	/* W = 10: only d3 has a boundary (12), past its end: none */
	cr_expect_eq(route_window_count(&tf, 2, 10), 0);
	/* W = 1 on d1 (5 tokens): boundaries 3 and 4 */
	cr_expect_eq(route_window_count(&tf, 2, 1), 6 + 2 + 0 + 9);
}

/* The transformer window router's labels with L = 3: at token k, the path of the largest
 * sum over [k, min(k + 3, the document's end)), worked out by hand from the fixture. */
Test(rows, transformer_labels_by_hand)
{
	struct tokfile tf;
	struct scores s;
	float lp[R_TOK * R_P], doc[R_DOCS * R_P];
	rows_fixture(&tf, &s, lp, doc);
	int32_t y[R_TOK];
	wrouter_labels(&s, &tf, 3, y);
	static const struct {
		int k, path;
		const char *why;
	} want[] = {
		{0, 0, "[0, 3) all -3: a tie, the lower path"},
		{3, 0, "[3, 6): -2, -2.5, -2.9"},
		{4, 0, "[4, 7): -2, -2, -2.8: the tie to the lower path"},
		{5, 2, "[5, 8): -3, -4, -2.7"},
		{6, 2, "[6, 9): -3, -4.5, -2.8"},
		{7, 2, "[7, 9) cut at the end: -2, -4, -1.9"},
		{8, 0, "[8, 9): a tie (path 1 if it ran on into d1)"},
		{9, 1, "d1 [9, 12): -3, -1, -3"},
		{13, 0, "d1's last token: a tie"},
		{21, 1, "d3 [21, 24): -3, -0.3, -3"},
		{23, 2, "[23, 26): -3, -2.1, -1.4"},
		{26, 2, "[26, 28): -2, -1.5, -1.2"},
		{27, 1, "[27, 28): -1, -0.5, -1"},
	};
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
		cr_expect_eq(y[want[i].k], want[i].path, "token %d: path %d, by hand %d (%s)",
			     want[i].k, y[want[i].k], want[i].path, want[i].why);
}

Test(rows, doc_rows_by_hand)
{
	struct tokfile tf;
	struct scores s;
	float lp[R_TOK * R_P], doc[R_DOCS * R_P];
	rows_fixture(&tf, &s, lp, doc);
	float fx[R_DOCS * 2] = {1, 2, 3, 4, 5, 6, 7, 8};
	const struct features f = {.docs = R_DOCS, .dim = 2, .x = fx};
	float *x, *sc;
	uint32_t *y;
	uint64_t n;
	cr_assert_eq(route_doc_rows(&s, &f, &tf, &x, &y, &sc, &n), 0, "%s", err_detail());
	cr_assert_eq(n, 3, "d2 has no token past the prefix: %llu rows", (unsigned long long)n);
	const uint32_t want_y[3] = {1, 2, 0};
	const float want_x[6] = {1, 2, 3, 4, 7, 8};
	for (int i = 0; i < 3; i++)
		cr_expect_eq(y[i], want_y[i], "row %d: path %u, by hand %u", i, y[i], want_y[i]);
	for (int i = 0; i < 6; i++)
		cr_expect_eq(x[i], want_x[i], "x[%d] = %g, by hand %g", i, x[i], want_x[i]);
	const int docs[3] = {0, 1, 3}; /* the rows' documents: their doc_logprob rows */
	for (int i = 0; i < 3; i++)
		for (int p = 0; p < R_P; p++)
			cr_expect_eq(sc[i * R_P + p], doc[docs[i] * R_P + p],
				     "score of row %d path %d: %g, doc %d's %g", i, p,
				     sc[i * R_P + p], docs[i], doc[docs[i] * R_P + p]);
	free(x);
	free(y);
	free(sc);
}

Test(rows, window_boundaries_by_hand)
{
	/* prefix 8, W 16: boundaries at 24, 40, 56, ... before the end */
	static const struct {
		uint64_t n, count, last;
	} want[] = {{0, 0, 0}, {23, 0, 0}, {24, 0, 24}, {25, 1, 24}, {39, 1, 24},
		    {40, 1, 40}, {41, 2, 40}, {100, 5, 88}};
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
		cr_expect_eq(router_boundaries(want[i].n, 8, 16), want[i].count,
			     "a document of %llu tokens: %llu boundaries, by hand %llu",
			     (unsigned long long)want[i].n,
			     (unsigned long long)router_boundaries(want[i].n, 8, 16),
			     (unsigned long long)want[i].count);
		cr_expect_eq(router_last_boundary(want[i].n, 8, 16), want[i].last,
			     "position %llu: last boundary %llu, by hand %llu",
			     (unsigned long long)want[i].n,
			     (unsigned long long)router_last_boundary(want[i].n, 8, 16),
			     (unsigned long long)want[i].last);
	}
	cr_expect_eq(router_boundary(8, 16, 0), 24);
	cr_expect_eq(router_boundary(8, 16, 4), 88);
	cr_expect_eq(router_last_boundary(100, 8, 0), 0, "no window router, no boundary");
}

/* route_kmeans: two clumps far apart, found by hand: centroids (0, 0.5) and (10, 10.5), two
 * documents each; the report's JSON says so; fewer documents than clusters is CORE_ESHAPE
 * naming the features. */
Test(kmeans, route_kmeans_by_hand)
{
	float x[] = {0, 0, 0, 1, 10, 10, 10, 11};
	struct features f = {.r = {.layer = 3, .prefix = 16}, .docs = 4, .dim = 2, .x = x};
	const struct kmeans_opts o = {.k = 2, .restarts = 3, .max_iter = 50, .seed = 7};
	struct router r;

	cr_assert_eq(route_kmeans(&f, "f.st", &o, &r), 0, "%s", err_detail());
	cr_expect_eq(r.kind, ROUTER_KMEANS);
	cr_expect_eq(r.paths, 2);
	cr_expect_eq(r.dim, 2);
	cr_expect_eq(r.r.layer, 3);
	cr_expect_eq(r.r.prefix, 16);
	const int lo = r.centroids[0] < 5 ? 0 : 1;
	const float want[2][2] = {{0, 0.5f}, {10, 10.5f}};
	for (int j = 0; j < 2; j++) {
		cr_expect_float_eq(r.centroids[lo * 2 + j], want[0][j], 1e-6);
		cr_expect_float_eq(r.centroids[(1 - lo) * 2 + j], want[1][j], 1e-6);
	}
	json_t *j = json_loads(r.report, 0, NULL);
	cr_assert(j, "report is not JSON: %s", r.report);
	cr_expect_str_eq(json_string_value(json_object_get(j, "features")), "f.st");
	cr_expect_eq(json_integer_value(json_object_get(j, "docs")), 4);
	cr_expect_eq(json_integer_value(json_object_get(j, "restarts")), 3);
	/* inertia: each point 0.5 from its centroid, squared, four times */
	cr_expect_float_eq(json_real_value(json_object_get(j, "inertia")), 1.0, 1e-6);
	json_t *sizes = json_object_get(j, "sizes");
	cr_expect_eq(json_array_size(sizes), 2);
	cr_expect_eq(json_integer_value(json_array_get(sizes, 0)), 2);
	cr_expect_eq(json_integer_value(json_array_get(sizes, 1)), 2);
	json_decref(j);
	router_free(&r);

	const struct kmeans_opts o5 = {.k = 5, .restarts = 1, .max_iter = 10};
	cr_expect_eq(route_kmeans(&f, "f.st", &o5, &r), CORE_ESHAPE);
	cr_expect_str_eq(err_file(), "f.st");
	cr_expect(strstr(err_detail(), "4 documents cannot make 5 clusters"), "%s", err_detail());
	router_free(&r);
}
