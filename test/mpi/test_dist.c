/* test_dist.c - lib/dist (dist.h) under mpirun, against references of its own: the bytes
 * every exchange must deliver, computed from the formula that fills the send buffers, and
 * MPI_Alltoall called here on buffers packed here; hand-computed sums for the collectives.
 *
 *   mpirun -np W test_dist           every check, in each layout: the host's and nodes of
 *                                    m = 1, 2, 4 ranks (those dividing W); exits 0 when all
 *                                    passed, else 1 after one stderr line per failed check
 *   mpirun -np W test_dist agree     rank 1 disagrees on E: each rank prints dist_agree's
 *                                    message as a program would ("test_dist: ...") and exits 2
 *   mpirun -np W test_dist agree-rc  rank W - 1 fails: each rank prints dist_agree_rc's
 *                                    message and exits 1, none reaching the collective that
 *                                    follows (a rank that did would hang)
 *   mpirun -np W test_dist bench [LOCAL_SIZE [REPS [MAX_BYTES [NBLK]]]]
 *                                    the All-to-All benchmark (dist_bench.h), 1 KiB to
 *                                    MAX_BYTES (1 MiB) per rank by factors of 4, NBLK (1)
 *                                    blocks per piece: the table on stdout; exits 1 when an
 *                                    algorithm's output differs from MPI_Alltoall's
 *
 * Each failure line names the check and every parameter of its case, so that it can be
 * rerun alone. The last two modes let dist_open initialise MPI (and dist_close finalise it);
 * the first initialises MPI itself so as to open one dist object per layout.
 */
#include <errno.h>
#include <inttypes.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "dist/dist.h"
#include "dist/dist_bench.h"
#include "common/banned.h"

static int q, W, m, nfail, nchecks;
static int host_ranks; /* ranks whose processor name is this rank's (the hosts' layout) */

static void failed(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void failed(const char *fmt, ...)
{
	char line[1024];
	va_list ap;

	if (++nfail > 40) /* the first ones say it; the count is in the summary */
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	/* one write per line, so that the lines of several ranks do not mix */
	fprintf(stderr, "test_dist: rank %d of %d, m=%d: %s\n", q, W, m, line);
}

#define CHECK(cond, ...)                                                                       \
	do {                                                                                   \
		nchecks++;                                                                     \
		if (!(cond))                                                                   \
			failed(__VA_ARGS__);                                                   \
	} while (0)

/* ---- the All-to-All ------------------------------------------------------------------- */

#include "a2a_cases.h"

/* The reference: the pieces packed here, MPI_Alltoall, unpacked over the sentinel. */
static void reference(const unsigned char *s, unsigned char *out, const struct xcase *c)
{
	const size_t blk = (size_t)c->n * c->rb, S = (size_t)c->nblk * blk;
	unsigned char *ps = malloc((size_t)W * S + 1), *pr = malloc((size_t)W * S + 1);

	memset(out, SENTINEL, buf_bytes(c->r.rows, c));
	for (int p = 0; p < W; p++)
		for (int b = 0; b < c->nblk; b++)
			memcpy(ps + p * S + b * blk, s + (size_t)(block_row(c->s.inter, c->s.rows,
					c->nblk, p, b) + c->s.row0) * c->rb, blk);
	MPI_Alltoall(ps, (int)S, MPI_BYTE, pr, (int)S, MPI_BYTE, MPI_COMM_WORLD);
	for (int p = 0; p < W; p++)
		for (int b = 0; b < c->nblk; b++)
			memcpy(out + (size_t)(block_row(c->r.inter, c->r.rows, c->nblk, p, b) +
					      c->r.row0) * c->rb, pr + p * S + b * blk, blk);
	free(ps);
	free(pr);
}


static struct dist_span span_of(void *base, const struct xcase *c, int recv)
{
	return recv ? (struct dist_span){base, c->r.rows, c->r.row0, c->r.inter}
		    : (struct dist_span){base, c->s.rows, c->s.row0, c->s.inter};
}

/* One case: every algorithm against the formula and against MPI_Alltoall. */
static void check_case(struct dist *d, const struct xcase *c)
{
	const size_t sb = buf_bytes(c->s.rows, c), rbytes = buf_bytes(c->r.rows, c);
	unsigned char *s = malloc(sb + 1), *exp = malloc(rbytes + 1), *ref = malloc(rbytes + 1);
	unsigned char *got[3];
	char name[256], what[64];

	case_name(name, sizeof name, c);
	fill_send(s, c);
	fill_expected(exp, c);
	reference(s, ref, c);
	compare("MPI_Alltoall (the test's reference) against the formula", ref, exp, c);
	struct dist_span ss = span_of(s, c, 0);
	for (int a = 0; a < 3; a++) {
		got[a] = malloc(rbytes + 1);
		memset(got[a], SENTINEL, rbytes);
		struct dist_span rs = span_of(got[a], c, 1);
		int rc = dist_alltoall(d, (enum dist_a2a)a, &ss, &rs, c->nblk, c->n, c->rb);
		CHECK(rc == 0, "dist_alltoall %s, %s: %s", dist_a2a_name(a), name, err_detail());
		snprintf(what, sizeof what, "%s against the formula", dist_a2a_name(a));
		compare(what, got[a], exp, c);
		snprintf(what, sizeof what, "%s against MPI_Alltoall", dist_a2a_name(a));
		compare(what, got[a], ref, c);
	}
	compare("2dh against linear", got[DIST_A2A_2DH], got[DIST_A2A_LINEAR], c);
	for (int a = 0; a < 3; a++)
		free(got[a]);
	free(s);
	free(exp);
	free(ref);
}

static void check_exchanges(struct dist *d)
{
	static const struct {
		int64_t srows, srow0, rrows, rrow0, n;
	} slices[] = {
		{5, 0, 5, 0, 5}, /* whole blocks: packed spans when nblk = 1 */
		{7, 2, 4, 1, 3}, /* a slice of the capacity: row0 > 0, n < rows, rows differ */
		{4, 1, 3, 3, 0}, /* an empty slice: nothing moves, nothing is touched */
	};
	static const size_t row_bytes[] = {12, 4100};
	const int nsl = (int)(sizeof slices / sizeof slices[0]);

	/* every combination: nblk 1 and 3, each side contiguous or interleaved, both row sizes,
	 * every slice */
	for (int i = 0; i < 2 * 2 * 2 * 2 * nsl; i++) {
		int nb = i & 1 ? 3 : 1, si = i >> 1 & 1, ri = i >> 2 & 1, sl = i / 16;
		struct xcase c = {.nblk = nb, .n = slices[sl].n, .rb = row_bytes[i >> 3 & 1],
				  .s = {slices[sl].srows, slices[sl].srow0, si},
				  .r = {slices[sl].rrows, slices[sl].rrow0, ri}};
		check_case(d, &c);
	}
	/* blocks of 64 KiB and more: LINEAR sends a piece that is not contiguous on both sides
	 * as one message per block */
	const struct xcase big[] = {
		{3, 17, 4100, {20, 2, 0}, {17, 0, 1}},
		{2, 16, 4096, {16, 0, 1}, {18, 1, 1}},
		{2, 16, 4096, {16, 0, 0}, {16, 0, 0}}, /* contiguous: one message */
	};
	for (size_t i = 0; i < sizeof big / sizeof big[0]; i++)
		check_case(d, &big[i]);
}

/* Several exchanges in flight on the communication thread while this thread computes;
 * one dist_wait for the last ticket; then a blocking call that must wait for a started
 * exchange before it runs. */
static void check_async(struct dist *d)
{
	enum { K = 4 };
	const struct xcase c[K] = {
		{3, 3, 12, {7, 2, 0}, {4, 1, 1}},
		{1, 5, 4100, {5, 0, 0}, {5, 0, 0}},
		{3, 2, 4100, {4, 1, 1}, {3, 0, 0}},
		{2, 4, 1000, {4, 0, 0}, {4, 0, 1}},
	};
	const enum dist_a2a alg[K] = {DIST_A2A_2DH, DIST_A2A_LINEAR, DIST_A2A_MPI, DIST_A2A_2DH};
	unsigned char *s[K], *r[K], *exp[K];
	int64_t ticket[K], last = 0;
	char name[256];
	struct dist_stats st;

	dist_stats_reset(d);
	for (int i = 0; i < K; i++) {
		s[i] = malloc(buf_bytes(c[i].s.rows, &c[i]));
		r[i] = malloc(buf_bytes(c[i].r.rows, &c[i]));
		exp[i] = malloc(buf_bytes(c[i].r.rows, &c[i]));
		fill_send(s[i], &c[i]);
		fill_expected(exp[i], &c[i]);
		memset(r[i], SENTINEL, buf_bytes(c[i].r.rows, &c[i]));
	}
	for (int i = 0; i < K; i++) {
		struct dist_span ss = span_of(s[i], &c[i], 0), rs = span_of(r[i], &c[i], 1);
		int rc = dist_alltoall_start(d, alg[i], &ss, &rs, c[i].nblk, c[i].n, c[i].rb,
					     &ticket[i]);
		case_name(name, sizeof name, &c[i]);
		CHECK(rc == 0, "dist_alltoall_start %s, %s: %s", dist_a2a_name(alg[i]), name,
		      err_detail());
		CHECK(ticket[i] > last, "async: ticket %lld after %lld", (long long)ticket[i],
		      (long long)last);
		last = ticket[i];
	}
	/* the caller's computation, overlapping the exchanges */
	double sum = 0;
	for (long i = 1; i <= 4000000; i++)
		sum += (double)(i % 1000);
	CHECK(sum == 4000.0 * 499500.0, "async: the computation beside the exchanges gave %.1f",
	      sum);
	int rc = dist_wait(d, ticket[K - 1]);
	CHECK(rc == 0, "async: dist_wait(%lld): %s", (long long)ticket[K - 1], err_detail());
	for (int i = 0; i < K; i++) {
		case_name(name, sizeof name, &c[i]);
		char what[64];
		snprintf(what, sizeof what, "async %s (ticket %lld)", dist_a2a_name(alg[i]),
			 (long long)ticket[i]);
		compare(what, r[i], exp[i], &c[i]);
		CHECK(dist_wait(d, ticket[i]) == 0, "async: dist_wait(%lld) again: %s",
		      (long long)ticket[i], err_detail());
	}
	/* a blocking collective right after a start waits for it: the data is there after */
	memset(r[1], SENTINEL, buf_bytes(c[1].r.rows, &c[1]));
	struct dist_span ss = span_of(s[1], &c[1], 0), rs = span_of(r[1], &c[1], 1);
	int64_t t, one = 1;
	CHECK(dist_alltoall_start(d, DIST_A2A_LINEAR, &ss, &rs, c[1].nblk, c[1].n, c[1].rb, &t)
	      == 0, "async: start before a blocking call: %s", err_detail());
	CHECK(dist_allreduce_i64(d, &one, 1, DIST_SUM) == 0 && one == W,
	      "async: allreduce after a start: %lld", (long long)one);
	compare("async: linear, complete when a blocking call returns", r[1], exp[1], &c[1]);
	CHECK(dist_wait(d, t) == 0, "async: dist_wait after the blocking call: %s", err_detail());
	CHECK(dist_wait(d, t + 1) == CORE_EUSAGE, "async: dist_wait of a ticket not issued");
	CHECK(dist_wait(d, 0) == CORE_EUSAGE, "async: dist_wait(0)");
	dist_stats(d, &st);
	CHECK(st.exchanges == K + 1 && st.comm_seconds > 0, "stats: %lld exchanges in %g s, "
	      "expected %d", (long long)st.exchanges, st.comm_seconds, K + 1);
	/* 2DH's phases are timed where it runs two levels, and lie inside the exchanges' time */
	const double ph = st.h2d_copy_seconds + st.h2d_intra_seconds + st.h2d_inter_seconds;
	if (m > 1 && m < W)
		CHECK(st.h2d_copy_seconds > 0 && st.h2d_intra_seconds > 0 &&
		      st.h2d_inter_seconds > 0 && ph <= st.comm_seconds,
		      "stats: 2DH phases %g + %g + %g s of %g s in all", st.h2d_copy_seconds,
		      st.h2d_intra_seconds, st.h2d_inter_seconds, st.comm_seconds);
	else
		CHECK(ph == 0, "stats: 2DH phases %g s with nodes of %d of %d ranks", ph, m, W);
	dist_stats_reset(d);
	dist_stats(d, &st);
	CHECK(st.exchanges == 0 && st.comm_seconds == 0 && st.h2d_inter_seconds == 0,
	      "stats after a reset");
	/* 2DH with nodes of 1 < m < W ranks stages, as does MPI on unpacked spans (c[2]) */
	CHECK(dist_bytes(d) > 0, "dist_bytes is 0 after staged exchanges");
	for (int i = 0; i < K; i++) {
		free(s[i]);
		free(r[i]);
		free(exp[i]);
	}
}

/* Arguments that are refused, the same way on every rank, before anything is sent. */
static void check_refusals(struct dist *d)
{
	unsigned char a[64], b[64];
	struct dist_span s = {a, 2, 0, 0}, r = {b, 2, 0, 0}, big = {b, 2, 1, 0};

	CHECK(dist_alltoall(d, 3, &s, &r, 1, 1, 1) == CORE_EUSAGE, "refusal: algorithm 3");
	CHECK(dist_alltoall(d, DIST_A2A_LINEAR, &s, &big, 1, 2, 1) == CORE_EUSAGE,
	      "refusal: row0 + n beyond rows");
	CHECK(dist_alltoall(d, DIST_A2A_LINEAR, &s, &s, 1, 1, 1) == CORE_EUSAGE,
	      "refusal: send and recv overlap");
	CHECK(dist_alltoall(d, DIST_A2A_LINEAR, &s, &r, 1, (int64_t)1 << 31, 1) == CORE_EUSAGE,
	      "refusal: 2^31 rows");
	CHECK(dist_a2a_from_name("2dh") == DIST_A2A_2DH && dist_a2a_from_name("x") == -1 &&
	      strcmp(dist_a2a_name(DIST_A2A_MPI), "mpi") == 0, "names of the algorithms");
}

/* ---- the collectives ------------------------------------------------------------------ */

static void check_groups(struct dist *d)
{
	int gs[4] = {1, 2, W, 4}, ng = W == 8 ? 4 : 3;
	enum { B = 13, N = 5 };

	for (int gi = 0; gi < ng; gi++) {
		int g = gs[gi], first = q / g * g, idx = q % g;
		unsigned char send[B], recv[8 * B + 1];
		for (int k = 0; k < B; k++)
			send[k] = (unsigned char)(q * 31 + k);
		memset(recv, SENTINEL, sizeof recv);
		int rc = dist_allgather(d, g, send, recv, B);
		CHECK(rc == 0, "allgather g=%d: %s", g, err_detail());
		int bad = recv[g * B] != SENTINEL;
		for (int i = 0; i < g; i++)
			for (int k = 0; k < B; k++)
				bad |= recv[i * B + k] != (unsigned char)((first + i) * 31 + k);
		CHECK(!bad, "allgather g=%d of %d bytes: wrong bytes", g, B);

		float fs[8 * N], fr[N + 1];
		for (int j = 0; j < g * N; j++)
			fs[j] = (float)(q * 1000 + j);
		fr[N] = -1;
		rc = dist_reduce_scatter_f32(d, g, fs, fr, N);
		CHECK(rc == 0, "reduce_scatter g=%d: %s", g, err_detail());
		for (int k = 0; k < N; k++) {
			double want = 0;
			for (int i = 0; i < g; i++)
				want += (first + i) * 1000 + idx * N + k;
			CHECK(fr[k] == (float)want, "reduce_scatter g=%d n=%d: recv[%d] = %g, "
			      "expected %g", g, N, k, fr[k], want);
		}
		CHECK(fr[N] == -1, "reduce_scatter g=%d: wrote past n", g);
	}
	unsigned char x[8], y[64];
	float f[8], h[8];
	CHECK(dist_allgather(d, 3, x, y, 1) == CORE_EUSAGE, "allgather: g=3 refused");
	CHECK(dist_allgather(d, 0, x, y, 1) == CORE_EUSAGE, "allgather: g=0 refused");
	CHECK(dist_reduce_scatter_f32(d, 2 * W, f, h, 1) == CORE_EUSAGE,
	      "reduce_scatter: g=2W refused");
	CHECK(dist_reduce_scatter_f32(d, 1, f, f, 1) == CORE_EUSAGE,
	      "reduce_scatter: in place refused");
}

static void check_reductions(struct dist *d)
{
	enum { N = 3 };
	float f[N];
	for (int k = 0; k < N; k++)
		f[k] = (float)(2 * q + k);
	CHECK(dist_allreduce_f32(d, f, N) == 0, "allreduce_f32: %s", err_detail());
	for (int k = 0; k < N; k++)
		CHECK(f[k] == (float)(W * (W - 1) + W * k), "allreduce_f32: v[%d] = %g, expected "
		      "%d", k, f[k], W * (W - 1) + W * k);

	for (int op = DIST_SUM; op <= DIST_MIN; op++) {
		int64_t v[N], want[N];
		double x[N], xw[N];
		for (int k = 0; k < N; k++) {
			for (int r = 0; r < W; r++) {
				/* increasing with the rank, decreasing, and beyond 2^32 */
				int64_t e = k == 0   ? r
					    : k == 1 ? -3 * r
						     : ((int64_t)1 << 40) + r * r;
				if (r == 0 || op == DIST_SUM)
					want[k] = r == 0 ? e : want[k] + e;
				else
					want[k] = op == DIST_MAX ? (e > want[k] ? e : want[k])
								 : (e < want[k] ? e : want[k]);
				if (r == q)
					v[k] = e;
			}
			x[k] = (double)v[k] / 4;
			xw[k] = (double)want[k] / 4;
		}
		CHECK(dist_allreduce_i64(d, v, N, op) == 0, "allreduce_i64 op %d: %s", op,
		      err_detail());
		CHECK(dist_allreduce_f64(d, x, N, op) == 0, "allreduce_f64 op %d: %s", op,
		      err_detail());
		for (int k = 0; k < N; k++) {
			CHECK(v[k] == want[k], "allreduce_i64 op %d: v[%d] = %lld, expected %lld",
			      op, k, (long long)v[k], (long long)want[k]);
			CHECK(x[k] == xw[k], "allreduce_f64 op %d: v[%d] = %g, expected %g", op, k,
			      x[k], xw[k]);
		}
	}
	int64_t v = 1;
	CHECK(dist_allreduce_i64(d, &v, 1, (enum dist_op)7) == CORE_EUSAGE,
	      "allreduce: op 7 refused");
	CHECK(dist_barrier(d) == 0, "barrier: %s", err_detail());
}

/* The same detail on every rank: gathered and compared. */
static void check_same_text(const char *what, const char *text)
{
	char mine[512] = {0}, *all = malloc(512 * (size_t)W);

	snprintf(mine, sizeof mine, "%s", text);
	MPI_Allgather(mine, 512, MPI_CHAR, all, 512, MPI_CHAR, MPI_COMM_WORLD);
	for (int r = 0; r < W; r++)
		CHECK(strcmp(all + 512 * r, mine) == 0, "%s: rank %d says '%s', this rank '%s'",
		      what, r, all + 512 * r, mine);
	free(all);
}

static void check_agree(struct dist *d)
{
	static const char *const names[] = {"M", "E", "k"};
	int64_t v[3] = {64, 8, 2};
	char want[256];
	int rc;

	CHECK(dist_agree(d, v, 3, names) == 0, "agree: equal values: %s", err_detail());
	if (W < 2)
		return;
	v[1] = q == 1 ? 4 : 8;
	rc = dist_agree(d, v, 3, names);
	CHECK(rc == CORE_EUSAGE, "agree: rank 1 passes E=4: returned %d", rc);
	CHECK(strcmp(err_detail(), "ranks disagree on E: 4 on rank 1, 8 on rank 0") == 0,
	      "agree: rank 1 passes E=4: '%s'", err_detail());
	check_same_text("agree: the detail", err_detail());
	rc = dist_agree(d, v, 3, NULL);
	CHECK(rc == CORE_EUSAGE && strcmp(err_detail(), "ranks disagree on value 1: 4 on rank 1, "
	      "8 on rank 0") == 0, "agree: unnamed values: '%s'", err_detail());
	/* the ends of int64_t, where a negation would overflow */
	int64_t e = q == 0 ? INT64_MIN : INT64_MAX;
	rc = dist_agree(d, &e, 1, names);
	snprintf(want, sizeof want, "ranks disagree on M: %" PRId64 " on rank 0, %" PRId64
		 " on rank 1", INT64_MIN, INT64_MAX);
	CHECK(rc == CORE_EUSAGE && strcmp(err_detail(), want) == 0, "agree: int64 ends: '%s'",
	      err_detail());

	CHECK(dist_agree_rc(d, 0) == 0, "agree_rc: all succeed: %s", err_detail());
	/* ranks 1 and W - 1 fail: everyone fails; the lowest is named with its message */
	rc = 0;
	if (q == 1 || q == W - 1)
		rc = err_set(CORE_EIO, "x.bin", "cannot read rank %d's file", q);
	rc = dist_agree_rc(d, rc);
	if (q == 1 || q == W - 1) {
		snprintf(want, sizeof want, "cannot read rank %d's file", q);
		CHECK(rc == CORE_EIO && strcmp(err_detail(), want) == 0 &&
		      strcmp(err_file(), "x.bin") == 0, "agree_rc: the failing rank keeps its "
		      "error: %d '%s'", rc, err_detail());
	} else {
		CHECK(rc == CORE_EIO && strcmp(err_detail(), "rank 1 failed: 'x.bin': cannot read "
		      "rank 1's file") == 0, "agree_rc: another rank's failure: %d '%s'", rc,
		      err_detail());
	}
}

/* ---- the layouts ---------------------------------------------------------------------- */

static void check_layout(int local_size)
{
	struct dist *d;
	int rc = dist_open(&d, local_size);

	m = local_size;
	CHECK(rc == 0, "dist_open(%d): %s", local_size, err_detail());
	if (rc < 0)
		return;
	m = dist_local_size(d);
	CHECK(dist_rank(d) == q && dist_size(d) == W, "rank %d of %d, MPI says %d of %d",
	      dist_rank(d), dist_size(d), q, W);
	/* the host layout: as many ranks per node as share this rank's processor name (one
	 * node on one machine; one per host of scripts/netns-cluster.sh) */
	CHECK(local_size ? m == local_size && strcmp(dist_layout_source(d), "given") == 0
			 : m == host_ranks && strcmp(dist_layout_source(d), "host") == 0,
	      "layout: local size %d from '%s'", m, dist_layout_source(d));
	CHECK(dist_have_mpi() == 1 && dist_host(d)[0], "dist_have_mpi, dist_host");
	check_exchanges(d);
	check_async(d);
	check_refusals(d);
	if (local_size == 0) {
		check_groups(d);
		check_reductions(d);
		check_agree(d);
	}
	dist_close(d);
}

/* host_ranks from every rank's MPI_Get_processor_name, independently of the
 * MPI_Comm_split_type that dist_open uses. */
static void count_host_ranks(void)
{
	char me[MPI_MAX_PROCESSOR_NAME] = {0};
	int len;
	MPI_Get_processor_name(me, &len);
	char *all = calloc((size_t)W, sizeof me);
	if (!all) {
		fprintf(stderr, "test_dist: out of memory\n");
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	MPI_Allgather(me, (int)sizeof me, MPI_CHAR, all, (int)sizeof me, MPI_CHAR, MPI_COMM_WORLD);
	host_ranks = 0;
	for (int i = 0; i < W; i++)
		host_ranks += strcmp(all + (size_t)i * sizeof me, me) == 0;
	free(all);
}

static int run_all(void)
{
	int provided;

	MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
	MPI_Comm_rank(MPI_COMM_WORLD, &q);
	MPI_Comm_size(MPI_COMM_WORLD, &W);
	count_host_ranks();
	const int sizes[] = {0, 1, 2, 4};
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
		if (sizes[i] == 0 || W % sizes[i] == 0)
			check_layout(sizes[i]);
	/* nodes that do not divide the world: refused on every rank, nothing left open */
	int bad = W == 2 ? 4 : 3;
	struct dist *d = (struct dist *)&bad;
	int rc = dist_open(&d, bad);
	char want[128];
	snprintf(want, sizeof want, "local size %d does not divide the %d ranks", bad, W);
	m = bad;
	CHECK(rc == CORE_EUSAGE && !d && strcmp(err_detail(), want) == 0,
	      "dist_open(%d): returned %d, '%s'", bad, rc, err_detail());
	check_same_text("dist_open of a local size not dividing W", err_detail());
	int fails = nfail, total = 0;
	MPI_Allreduce(&fails, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	if (q == 0)
		printf("test_dist: %d ranks: %d checks on rank 0, %d failed over all ranks\n", W,
		       nchecks, total);
	MPI_Finalize();
	return nfail ? 1 : 0;
}

/* As a program would: one stderr line, the exit status of the error. */
static int run_agree(int rc_mode)
{
	struct dist *d;
	char msg[600];
	int rc = dist_open(&d, 0);

	if (rc < 0) {
		err_format(msg, sizeof msg, rc);
		fprintf(stderr, "test_dist: %s\n", msg);
		return err_exit_status(rc);
	}
	q = dist_rank(d);
	W = dist_size(d);
	if (!rc_mode) {
		static const char *const names[] = {"M", "E"};
		int64_t v[2] = {64, q == 1 ? 4 : 8};
		rc = dist_agree(d, v, 2, names);
	} else {
		rc = q == W - 1 ? err_set(CORE_EIO, "data.bin", "cannot read: no such file") : 0;
		rc = dist_agree_rc(d, rc);
	}
	if (rc == 0) { /* the collective a failing rank skips, hanging the others */
		int64_t one = 1;
		rc = dist_allreduce_i64(d, &one, 1, DIST_SUM);
	}
	if (rc < 0) {
		err_format(msg, sizeof msg, rc);
		fprintf(stderr, "test_dist: %s\n", msg);
	}
	dist_close(d);
	return err_exit_status(rc);
}

/* The benchmark (dist_bench.h) from 1 KiB to max bytes per rank by factors of 4, its table
 * on stdout; its own check of LINEAR and 2DH against MPI_Alltoall at each size decides the
 * exit status. */
static int run_bench(int local_size, int reps, long long max, int nblk)
{
	struct dist *d;
	struct dist_bench_opts o;
	struct dist_bench_row *rows = NULL;
	size_t sizes[32];
	char msg[600];
	int nrows = 0, rc = dist_open(&d, local_size);

	if (rc == 0) {
		dist_bench_opts_default(&o);
		o.reps = reps;
		o.nblk = nblk;
		o.nsizes = 0;
		for (long long b = 1024; b <= max && o.nsizes < 32; b *= 4)
			sizes[o.nsizes++] = (size_t)b;
		o.sizes = sizes;
		rc = dist_bench_alltoall(d, &o, &rows, &nrows);
	}
	if (rc < 0) {
		err_format(msg, sizeof msg, rc);
		fprintf(stderr, "test_dist: %s\n", msg);
	} else if (dist_rank(d) == 0) {
		printf("all-to-all, %d ranks, nodes of %d (%s), %d block%s per piece, median of "
		       "%d, slowest rank\n", dist_size(d), dist_local_size(d),
		       dist_layout_source(d), nblk, nblk > 1 ? "s" : "", reps);
		printf("%12s %10s %11s %11s %11s %8s %8s %8s %7s\n", "bytes/rank", "piece",
		       "linear s", "2dh s", "mpi s", "lin GB/s", "2dh GB/s", "mpi GB/s",
		       "lin/mpi");
		for (int i = 0; i < nrows; i++) {
			const struct dist_bench_row *r = &rows[i];
			printf("%12zu %10zu %11.3e %11.3e %11.3e %8.2f %8.2f %8.2f %7.2f\n",
			       r->bytes, r->piece, r->seconds[0], r->seconds[1], r->seconds[2],
			       r->gbps[0], r->gbps[1], r->gbps[2], r->seconds[0] / r->seconds[2]);
		}
	}
	free(rows);
	dist_close(d);
	return err_exit_status(rc);
}

static int number(const char *s, long long lo, long long hi, long long *v)
{
	char *end;

	errno = 0;
	*v = strtoll(s, &end, 10);
	return errno || end == s || *end || *v < lo || *v > hi ? -1 : 0;
}

int main(int argc, char **argv)
{
	long long lsz = 0, reps = 10, max = 1 << 20, nblk = 1;

	if (argc > 1 && strcmp(argv[1], "agree") == 0)
		return run_agree(0);
	if (argc > 1 && strcmp(argv[1], "agree-rc") == 0)
		return run_agree(1);
	if (argc > 1 && strcmp(argv[1], "bench") == 0 &&
	    (argc < 3 || number(argv[2], 0, 1 << 20, &lsz) == 0) &&
	    (argc < 4 || number(argv[3], 1, 1000000, &reps) == 0) &&
	    (argc < 5 || number(argv[4], 1024, (long long)1 << 40, &max) == 0) &&
	    (argc < 6 || number(argv[5], 1, 1024, &nblk) == 0) && argc < 7)
		return run_bench((int)lsz, (int)reps, max, (int)nblk);
	if (argc > 1) {
		fprintf(stderr, "usage: test_dist [agree | agree-rc | bench [LOCAL_SIZE [REPS "
			"[MAX_BYTES [NBLK]]]]]\n");
		return 2;
	}
	return run_all();
}
