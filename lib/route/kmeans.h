/* kmeans.h - k-means of document features, the unsupervised half of DiPaCo's routing
 * (Douillard et al., "DiPaCo: Distributed Path Composition", 2024, section 2.4.1: documents
 * are clustered on their features and each cluster is a shard).
 *
 * Features are n rows of d floats, x[i * d + j]. For centroids c_1..c_k the inertia of an
 * assignment a is
 *     J(a, c) = sum_i || x_i - c_{a(i)} ||^2
 * (squared distances accumulated in double from float inputs). kmeans_fit minimises it by
 * Lloyd's iterations from k-means++ seeds (Arthur and Vassilvitskii, SODA 2007):
 *   seeding   the first centroid is a uniform draw among the rows, each next one a row drawn
 *             with probability proportional to its squared distance to the nearest centroid
 *             chosen so far (D^2 sampling); a row equal to a chosen centroid is never drawn
 *             unless every row is (then the draw is uniform);
 *   iteration an assignment step (each row to its nearest centroid, ties to the lower
 *             index) followed, unless the fit stops there, by an update step (each centroid
 *             to the mean of its rows, summed in double in row order and rounded to float
 *             once). A centroid left without rows is moved onto the row farthest from its own
 *             centroid (ties: the lower row) among clusters of two rows or more, one empty
 *             centroid after another in index order.
 * The fit stops after the assignment step that changes no row, or whose inertia is within
 * tol of the previous one relatively ((J_prev - J) <= tol * J_prev, so with tol 0 when the
 * inertia did not go down), or after the max_iter-th.
 * It always stops after an assignment step, so the centroids returned are the ones the
 * assignment returned was made against: assign[i] is kmeans_nearest's first answer for row
 * i, and the inertia reported is J(assign, centroids).
 *
 * Each restart r = 0..restarts-1 starts from o->init when it is given, else seeds from its
 * own draws (stream RNG_STREAM_KMEANS, index
 * r << 32 | draw); the restart of lowest final inertia is kept (ties: the lower restart).
 * The inertia after each assignment step never increases in exact arithmetic (the update and
 * the re-seeding of an empty cluster can only lower it); rounding the means to float can
 * raise it by about n d (2^-24 |x|)^2 at most, far below anything a step changes.
 *
 * Work is spread over OpenMP threads row by row, and every sum over rows is taken in a fixed
 * order (blocks of a fixed number of rows, then the blocks in order; means over a cluster's
 * rows in row order), so the result is the same bits for a given seed whatever the thread
 * count.
 */
#ifndef CORE_KMEANS_H
#define CORE_KMEANS_H

#include <stddef.h>
#include <stdint.h>

struct kmeans_opts {
	int k;          /* clusters, >= 1 */
	int restarts;   /* independent seedings, >= 1 */
	int max_iter;   /* assignment steps per restart, >= 1 */
	double tol;     /* relative inertia change that counts as converged, >= 0 */
	uint64_t seed;
	const float *init; /* NULL: k-means++; else k * d starting centroids for every restart
			    * (a warm start, or a trajectory a test can follow by hand) */
};

/* What the fit did. Free with kmeans_report_free (a zeroed report frees nothing). */
struct kmeans_report {
	int best_restart;         /* the restart kept, 0-based */
	double inertia;           /* its final inertia J(assign, centroids) */
	int iterations;           /* its assignment steps, 1..max_iter */
	int converged;            /* 1: it stopped because no row moved or by tol; 0: max_iter */
	double *history;          /* [iterations] its inertia after each assignment step */
	int restarts;             /* entries of restart_inertia */
	double *restart_inertia;  /* [restarts] every restart's final inertia */
};

/* Cluster x (n rows of d floats) into o->k clusters: centroids[k * d] and, when assign is not
 * NULL, assign[n] (the cluster of each row), and when rep is not NULL the report (filled on
 * success only). Errors: CORE_EUSAGE for k < 1, d < 1, restarts < 1, max_iter < 1, a
 * negative or non-finite tol, and n < k ("cannot make k clusters of n points"); CORE_ENAN
 * for a feature or an init value that is not finite (naming its row and column);
 * CORE_ENOMEM. */
int kmeans_fit(const float *x, size_t n, int d, const struct kmeans_opts *o, float *centroids,
	       uint32_t *assign, struct kmeans_report *rep);
void kmeans_report_free(struct kmeans_report *rep);

/* The topn nearest of the k centroids (k * d floats) to the row x, by squared Euclidean
 * distance in double, ascending, ties to the lower index: idx[topn] and, when dist2 is not
 * NULL, their squared distances rounded to float. 1 <= topn <= k. */
void kmeans_nearest(const float *centroids, int k, int d, const float *x, int topn,
		    uint32_t *idx, float *dist2);

#endif
