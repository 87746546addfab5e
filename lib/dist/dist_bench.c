/* dist_bench.c - the All-to-All benchmark; see dist_bench.h.
 *
 * Why it is measured this way: on a shared machine one preempted rank moves a single
 * timing, hence the median over repetitions; an exchange ends for the job when its slowest
 * rank is done, hence the maximum over ranks of each repetition (reduced once per size, so
 * that no reduction runs between the timed calls); a barrier before each call, so that no
 * rank's time includes waiting for a late peer's previous call; and the algorithms
 * interleaved, first one then another, so that a slow patch of the machine (another job,
 * frequency scaling) falls on all three rather than on whichever ran then. Buffers are
 * allocated once for the largest size and written before the first timing: fresh pages
 * cost more than the transfer on these machines.
 *
 * The device benchmark (dist_bench_alltoall_dev) follows the same schedule; a device exchange
 * is timed from its call to the backend's sync, since it only queues the work, and the host
 * MPI_Alltoall beside it runs on host buffers holding the same bytes.
 */
#include "dist/dist_bench.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "common/err.h"
#include "common/stats.h"
#include "dist/dist_dev.h"
#include "common/banned.h"

enum { NALG = 3 };

static const size_t default_sizes[] = {
	(size_t)1 << 10, (size_t)1 << 12, (size_t)1 << 14, (size_t)1 << 16, (size_t)1 << 18,
	(size_t)1 << 20, (size_t)1 << 22, (size_t)1 << 24, (size_t)1 << 26,
};

void dist_bench_opts_default(struct dist_bench_opts *o)
{
	*o = (struct dist_bench_opts){.warmup = 2, .reps = 10, .nblk = 1, .row_bytes = 4096};
}

/* The rows of a size: a piece of size / W bytes as nblk blocks of n rows of *rb bytes. */
static int shape(size_t size, int W, const struct dist_bench_opts *o, int64_t *n, size_t *rb)
{
	size_t blk = size / (size_t)W / (size_t)o->nblk;

	if (blk == 0)
		return err_set(CORE_EUSAGE, NULL, "%zu bytes per rank are less than one byte per "
			       "block of %d ranks x %d blocks", size, W, o->nblk);
	*rb = blk < o->row_bytes ? blk : o->row_bytes;
	if (blk / *rb > INT32_MAX)
		return err_set(CORE_EUSAGE, NULL, "%zu bytes per rank in rows of %zu bytes: too "
			       "many rows", size, *rb);
	*n = (int64_t)(blk / *rb);
	return 0;
}

/* 0 when got equals want; else CORE_EIO naming the algorithm, the size and the first
 * differing byte with the piece it belongs to (recv: interleaved, nblk blocks of n rows). */
static int verify(enum dist_a2a a, const unsigned char *got, const unsigned char *want,
		  size_t bytes, size_t size, int W, int64_t n, size_t rb)
{
	size_t i = 0;

	while (i < bytes && got[i] == want[i])
		i++;
	if (i == bytes)
		return 0;
	size_t blk = i / rb / (size_t)n;
	return err_set(CORE_EIO, NULL, "the %s all-to-all differs from MPI_Alltoall at %zu bytes "
		       "per rank: byte %zu (from rank %d, block %zu) is 0x%02x, not 0x%02x",
		       dist_a2a_name(a), size, i, (int)(blk % (size_t)W), blk / (size_t)W, got[i],
		       want[i]);
}

/* Where the algorithms run: host buffers (x NULL), or LINEAR and 2DH on the device buffers
 * ds, dr of x's backend while MPI runs on the host ones. */
struct bench {
	struct dist *d;
	struct dist_dev *x;
	struct backend *be;
	void *ds, *dr;
};

/* One exchange of algorithm a; on the device until the backend has run it. */
static int bench_round(const struct bench *b, int a, const struct dist_span *hs,
		       const struct dist_span *hr, int nblk, int64_t n, size_t rb)
{
	if (!b->x || a == DIST_A2A_MPI)
		return dist_alltoall(b->d, (enum dist_a2a)a, hs, hr, nblk, n, rb);
	struct dist_span ds = {b->ds, hs->rows, hs->row0, hs->interleaved};
	struct dist_span dr = {b->dr, hr->rows, hr->row0, hr->interleaved};
	ERR_FORWARD(dist_dev_alltoall(b->x, (enum dist_a2a)a, &ds, &dr, nblk, n, rb));
	return b->be->op->sync(b->be);
}

static int bench_run(struct bench *b, const struct dist_bench_opts *o,
		     struct dist_bench_row **rows, int *nrows)
{
	struct dist *d = b->d;
	const size_t *sizes = o->sizes ? o->sizes : default_sizes;
	const int ns = o->sizes ? o->nsizes : (int)(sizeof default_sizes / sizeof default_sizes[0]);
	const int W = dist_size(d);
	unsigned char *s = NULL, *r = NULL, *ref = NULL;
	double *t = NULL;
	struct dist_bench_row *out = NULL;
	size_t most = 0;
	int rc = 0;

	*rows = NULL;
	*nrows = 0;
	if (ns < 1 || o->reps < 1 || o->warmup < 0 || o->nblk < 1 || o->row_bytes < 1)
		return err_set(CORE_EUSAGE, NULL, "all-to-all benchmark: %d sizes, %d repetitions, "
			       "%d warm-up rounds, %d blocks, rows of %zu bytes", ns, o->reps,
			       o->warmup, o->nblk, o->row_bytes);
	for (int i = 0; i < ns; i++) {
		int64_t n = 0;
		size_t rb = 0;
		ERR_FORWARD(shape(sizes[i], W, o, &n, &rb));
		size_t bytes = (size_t)W * (size_t)o->nblk * (size_t)n * rb;
		most = bytes > most ? bytes : most;
	}
	s = malloc(most);
	r = malloc(most);
	ref = malloc(most);
	t = malloc(sizeof *t * NALG * (size_t)o->reps);
	out = calloc((size_t)ns, sizeof *out);
	if (!s || !r || !ref || !t || !out) {
		rc = err_set(CORE_ENOMEM, NULL, "out of memory for the all-to-all benchmark's 3 "
			     "buffers of %zu bytes", most);
		goto out;
	}
	/* every page written once, and a different byte almost everywhere */
	uint32_t x = 2463534242u ^ (uint32_t)dist_rank(d) * 2654435761u;
	for (size_t i = 0; i < most; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		s[i] = (unsigned char)x;
	}
	memset(r, 0, most);
	memset(ref, 0, most);
	if (b->x) { /* the same bytes on the device */
		rc = b->be->op->alloc(b->be, &b->ds, most);
		if (rc == 0)
			rc = b->be->op->alloc(b->be, &b->dr, most);
		if (rc == 0)
			rc = b->be->op->upload(b->be, b->ds, s, most);
		if ((rc = dist_agree_rc(d, rc)) < 0)
			goto out;
	}

	for (int i = 0; i < ns; i++) {
		int64_t n = 0;
		size_t rb = 0;
		shape(sizes[i], W, o, &n, &rb);
		const size_t bytes = (size_t)W * (size_t)o->nblk * (size_t)n * rb;
		struct dist_span ss = {s, n, 0, 0}, rs = {r, n, 0, 1}, fs = {ref, n, 0, 1};

		/* the check, which is also the first warm-up round */
		rc = dist_alltoall(d, DIST_A2A_MPI, &ss, &fs, o->nblk, n, rb);
		for (int a = 0; a < NALG && rc == 0; a++) {
			if (a == DIST_A2A_MPI)
				continue;
			memset(r, 0, bytes);
			if (b->x)
				rc = b->be->op->memset(b->be, b->dr, 0, bytes);
			if (rc == 0)
				rc = bench_round(b, a, &ss, &rs, o->nblk, n, rb);
			if (rc == 0 && b->x)
				rc = b->be->op->download(b->be, r, b->dr, bytes);
			if (rc == 0)
				rc = verify((enum dist_a2a)a, r, ref, bytes, sizes[i], W, n, rb);
		}
		if ((rc = dist_agree_rc(d, rc)) < 0)
			goto out;
		for (int w = 0; w < o->warmup; w++)
			for (int a = 0; a < NALG; a++)
				if ((rc = bench_round(b, a, &ss, &rs, o->nblk, n, rb)) < 0)
					goto out;
		for (int k = 0; k < o->reps; k++)
			for (int j = 0; j < NALG; j++) {
				int a = (k + j) % NALG;
				if ((rc = dist_barrier(d)) < 0)
					goto out;
				double t0 = dist_time();
				if ((rc = bench_round(b, a, &ss, &rs, o->nblk, n, rb)) < 0)
					goto out;
				t[(size_t)a * (size_t)o->reps + (size_t)k] = dist_time() - t0;
			}
		if ((rc = dist_allreduce_f64(d, t, NALG * o->reps, DIST_MAX)) < 0)
			goto out;
		out[i].bytes = bytes;
		out[i].piece = bytes / (size_t)W;
		for (int a = 0; a < NALG; a++) {
			out[i].seconds[a] = stats_median(t + (size_t)a * (size_t)o->reps, o->reps,
							 NULL, NULL);
			out[i].gbps[a] = (double)bytes / out[i].seconds[a] / 1e9;
		}
	}
	*rows = out;
	*nrows = ns;
	out = NULL;
out:
	if (b->x) {
		b->be->op->free(b->be, b->ds);
		b->be->op->free(b->be, b->dr);
	}
	free(s);
	free(r);
	free(ref);
	free(t);
	free(out);
	return rc;
}

int dist_bench_alltoall(struct dist *d, const struct dist_bench_opts *o,
			struct dist_bench_row **rows, int *nrows)
{
	struct bench b = {.d = d};
	return bench_run(&b, o, rows, nrows);
}

int dist_bench_alltoall_dev(struct dist *d, struct dist_dev *x, struct backend *be,
			    const struct dist_bench_opts *o, struct dist_bench_row **rows,
			    int *nrows)
{
	struct bench b = {.d = d, .x = x, .be = be};
	return bench_run(&b, o, rows, nrows);
}
