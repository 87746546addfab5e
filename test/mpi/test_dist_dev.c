/* test_dist_dev.c - the device All-to-All (lib/dist/dist_dev.h) under mpirun, one process per
 * device: Linear and 2DH on backend memory against the host MPI_Alltoall (dist_alltoall with
 * DIST_A2A_MPI on host copies of the same data) and against the formula that fills the send
 * buffers, byte for byte, sentinels outside the pieces included.
 *
 *   mpirun -np W test_dist_dev [BACKEND]   every check, in nodes of m = 1, 2, 4 ranks (those
 *                                          dividing W) and the host layout; BACKEND is cuda
 *                                          by default; exits 0 when all passed, else 1
 *                                          after one stderr line per failed check
 *
 * Built twice: build/test/mpi/test_dist_dev against the real CUDA runtime and NCCL (on a
 * machine with one GPU per rank), and build/emu/test_dist_dev (-DCORE_CUDA_EMU) against the
 * emulator, where the cuda backend's kernels/nccl.cu runs over test/emu/nccl_emu.cpp. When
 * the backend cannot be opened here (no GPU, a build without nvcc) every rank prints
 * "test_dist_dev: skipped: <why>" and exits 0. Under the emulator it also checks that a
 * misused round of transfers (sizes that differ, a peer out of range) is an error on every
 * rank rather than a hang: the real NCCL would hang there, so not with it. On one rank, where
 * dist_dev needs no communicator, a round of transfers with itself runs the backend's
 * collectives (real NCCL on a one-GPU machine). The parameter collectives (all-gather,
 * reduce-scatter in groups of every g dividing W, all-reduce) are checked bit for bit
 * against float sums in member order.
 */
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "common/err.h"
#include "dist/dist.h"
#include "dist/dist_dev.h"
#include "common/banned.h"

static int q, W, m, nfail, nchecks;

static void failed(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void failed(const char *fmt, ...)
{
	char line[1024];
	va_list ap;

	if (++nfail > 40)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	fprintf(stderr, "test_dist_dev: rank %d of %d, m=%d: %s\n", q, W, m, line);
}

#define CHECK(cond, ...)                                                                       \
	do {                                                                                   \
		nchecks++;                                                                     \
		if (!(cond))                                                                   \
			failed(__VA_ARGS__);                                                   \
	} while (0)

#include "a2a_cases.h"

static struct dist_span span_of(void *base, const struct xcase *c, int recv)
{
	return recv ? (struct dist_span){base, c->r.rows, c->r.row0, c->r.inter}
		    : (struct dist_span){base, c->s.rows, c->s.row0, c->s.inter};
}

/* One case: the host MPI_Alltoall on host buffers, then Linear and 2DH on device copies of
 * the same send buffer into device buffers holding the sentinel. */
static void check_case(struct dist *d, struct dist_dev *x, struct backend *be,
		       const struct xcase *c)
{
	const size_t sb = buf_bytes(c->s.rows, c), rbytes = buf_bytes(c->r.rows, c);
	unsigned char *s = malloc(sb + 1), *exp = malloc(rbytes + 1), *ref = malloc(rbytes + 1);
	unsigned char *got = malloc(rbytes + 1);
	void *ds = NULL, *dr = NULL;
	char name[256], what[96];
	int rc;

	case_name(name, sizeof name, c);
	fill_send(s, c);
	fill_expected(exp, c);
	memset(ref, SENTINEL, rbytes);
	struct dist_span hs = span_of(s, c, 0), hr = span_of(ref, c, 1);
	rc = dist_alltoall(d, DIST_A2A_MPI, &hs, &hr, c->nblk, c->n, c->rb);
	CHECK(rc == 0, "host mpi, %s: %s", name, err_detail());
	compare("host MPI_Alltoall against the formula", ref, exp, c);
	rc = be->op->alloc(be, &ds, sb);
	if (rc == 0)
		rc = be->op->alloc(be, &dr, rbytes);
	if (rc == 0)
		rc = be->op->upload(be, ds, s, sb);
	CHECK(rc == 0, "device buffers, %s: %s", name, err_detail());
	for (int a = 0; rc == 0 && a < 2; a++) {
		memset(got, SENTINEL, rbytes);
		rc = be->op->upload(be, dr, got, rbytes);
		struct dist_span ss = span_of(ds, c, 0), rs = span_of(dr, c, 1);
		if (rc == 0)
			rc = dist_dev_alltoall(x, (enum dist_a2a)a, &ss, &rs, c->nblk, c->n, c->rb);
		if (rc == 0)
			rc = be->op->sync(be);
		if (rc == 0)
			rc = be->op->download(be, got, dr, rbytes);
		CHECK(rc == 0, "device %s, %s: %s", dist_a2a_name(a), name, err_detail());
		snprintf(what, sizeof what, "device %s against the host MPI_Alltoall",
			 dist_a2a_name(a));
		compare(what, got, ref, c);
		snprintf(what, sizeof what, "device %s against the formula", dist_a2a_name(a));
		compare(what, got, exp, c);
	}
	be->op->free(be, ds);
	be->op->free(be, dr);
	free(s);
	free(exp);
	free(ref);
	free(got);
}

static void check_exchanges(struct dist *d, struct dist_dev *x, struct backend *be)
{
	static const struct {
		int64_t srows, srow0, rrows, rrow0, n;
	} slices[] = {
		{5, 0, 5, 0, 5}, /* whole blocks: packed spans when nblk = 1 */
		{7, 2, 4, 1, 3}, /* a slice of the capacity: row0 > 0, n < rows, rows differ */
		{4, 1, 3, 3, 0}, /* an empty slice: nothing moves, nothing is touched */
	};
	static const size_t row_bytes[] = {7, 4100}; /* an odd row, and rows of 1025 floats */
	const int nsl = (int)(sizeof slices / sizeof slices[0]);

	for (int i = 0; i < 2 * 2 * 2 * 2 * nsl; i++) {
		int nb = i & 1 ? 3 : 1, si = i >> 1 & 1, ri = i >> 2 & 1, sl = i / 16;
		struct xcase c = {.nblk = nb, .n = slices[sl].n, .rb = row_bytes[i >> 3 & 1],
				  .s = {slices[sl].srows, slices[sl].srow0, si},
				  .r = {slices[sl].rrows, slices[sl].rrow0, ri}};
		check_case(d, x, be, &c);
	}
	/* the layer's own layouts: [E, C, M] contiguous to [E / W, W * C, M] interleaved, and
	 * packed [W, piece] buffers on both sides (2DH's phase 4 as one transfer per node) */
	const struct xcase layer[] = {
		{2, 6, 16, {6, 0, 0}, {6, 0, 1}},
		{2, 3, 16, {6, 3, 0}, {6, 3, 1}},
		{1, 4, 36, {4, 0, 0}, {4, 0, 0}},
		{2, 4, 36, {4, 0, 0}, {4, 0, 0}},
	};
	for (size_t i = 0; i < sizeof layer / sizeof layer[0]; i++)
		check_case(d, x, be, &layer[i]);
}

/* Arguments refused before anything is queued. */
static void check_refusals(struct dist_dev *x, struct backend *be)
{
	void *a = NULL, *b = NULL;

	if (be->op->alloc(be, &a, 64) < 0 || be->op->alloc(be, &b, 64 * (size_t)W) < 0) {
		failed("refusals: no device memory: %s", err_detail());
		return;
	}
	struct dist_span s = {a, 1, 0, 0}, r = {b, 1, 0, 0}, big = {b, 1, 1, 0};
	CHECK(dist_dev_alltoall(x, DIST_A2A_MPI, &s, &r, 1, 1, 1) == CORE_EUSAGE,
	      "refusal: mpi on device memory");
	CHECK(dist_dev_alltoall(x, 3, &s, &r, 1, 1, 1) == CORE_EUSAGE, "refusal: algorithm 3");
	CHECK(dist_dev_alltoall(x, DIST_A2A_LINEAR, &s, &big, 1, 1, 1) == CORE_EUSAGE,
	      "refusal: row0 + n beyond rows");
	CHECK(dist_dev_alltoall(x, DIST_A2A_2DH, &s, &s, 1, 1, 1) == CORE_EUSAGE,
	      "refusal: send and recv overlap");
	be->op->free(be, a);
	be->op->free(be, b);
}

#ifdef CORE_CUDA_EMU
/* Misused rounds of the backend's transfers, on a world communicator of their own: an error
 * on every rank, never a hang (test/emu/nccl_emu.cpp). */
static void check_misuse(struct backend *be)
{
	unsigned char id[BACKEND_COMM_ID_BYTES];
	void *comm = NULL, *buf = NULL;
	int rc = q == 0 ? be->op->comm_unique_id(be, id) : 0;

	MPI_Bcast(id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
	if (rc == 0)
		rc = be->op->comm_open(be, &comm, id, W, q);
	if (rc == 0)
		rc = be->op->alloc(be, &buf, 64);
	CHECK(rc == 0, "misuse: a communicator: %s", err_detail());
	if (rc < 0)
		return;
	/* a ring: rank q sends 16 bytes to q + 1, which expects 8 from rank 0 */
	struct backend_xfer ring[2] = {{(q + 1) % W, 0, buf, 16},
				       {(q - 1 + W) % W, 1, (char *)buf + 32, q == 1 ? 8 : 16}};
	rc = be->op->comm_exchange(be, comm, ring, 2);
	CHECK(rc < 0, "misuse: 16 bytes sent, 8 expected: no error (rank 1 expects 8)");
	/* the right sizes: fine again */
	ring[1].bytes = 16;
	rc = be->op->comm_exchange(be, comm, ring, 2);
	CHECK(rc == 0, "misuse: a good round after a bad one: %s", err_detail());
	/* rank 0 sends to peer W */
	ring[0].peer = q == 0 ? W : ring[0].peer;
	rc = be->op->comm_exchange(be, comm, ring, 2);
	CHECK(rc < 0, "misuse: rank 0 sends to peer %d: no error", W);
	/* a send that nobody receives */
	ring[0].peer = (q + 1) % W;
	rc = be->op->comm_exchange(be, comm, ring, q == 0 ? 1 : 2);
	CHECK(rc < 0, "misuse: rank 0 does not receive: no error");
	be->op->free(be, buf);
	be->op->comm_close(be, comm);
}
#endif

/* The backend's collectives on a communicator of this rank alone: a round of transfers to
 * and from itself (a world of one opens none in dist_dev_open, so this is where a one-GPU
 * machine runs the real NCCL: loading it, a communicator, a group of send and receive). */
static void check_self_round(struct backend *be)
{
	enum { B = 4096 };
	unsigned char id[BACKEND_COMM_ID_BYTES], h[B], back[B];
	void *comm = NULL, *buf = NULL;
	int rc = be->op->comm_unique_id(be, id);

	for (int i = 0; i < B; i++)
		h[i] = (unsigned char)(i * 7 + 3);
	if (rc == 0)
		rc = be->op->comm_open(be, &comm, id, 1, 0);
	if (rc == 0)
		rc = be->op->alloc(be, &buf, 2 * B);
	if (rc == 0)
		rc = be->op->upload(be, buf, h, B);
	struct backend_xfer x[2] = {{0, 0, buf, B}, {0, 1, (char *)buf + B, B}};
	if (rc == 0)
		rc = be->op->comm_exchange(be, comm, x, 2);
	if (rc == 0)
		rc = be->op->download(be, back, (char *)buf + B, B);
	CHECK(rc == 0, "a round with itself: %s", err_detail());
	CHECK(rc < 0 || memcmp(h, back, B) == 0, "a round with itself: the bytes differ");
	be->op->free(be, buf);
	be->op->comm_close(be, comm);
}

/* A value of rank r's buffer at index k: not exact sums, so that the order of the
 * additions shows in the bits. */
static float pval(int r, size_t k)
{
	return (float)((r + 1) * 0.1234567 + (double)k * 0.0379) * (k % 3 ? 1.0f : -3.3f);
}

/* The parameter collectives in groups of every g dividing W: the all-gather byte for byte,
 * the reduce-scatter and the all-reduce bit for bit against float sums in member order
 * (dist_dev.h), the floats past each output untouched. */
static void check_params(struct dist_dev *x, struct backend *be)
{
	enum { N = 37, PAD = 3 };
	const float sentinel = -777.0f;
	float *hs = malloc(sizeof(float) * (size_t)(W * N + PAD));
	float *hr = malloc(sizeof(float) * (size_t)(W * N + PAD));
	void *ds = NULL, *dr = NULL;
	int rc = be->op->alloc(be, &ds, sizeof(float) * (size_t)(W * N + PAD));
	if (rc == 0)
		rc = be->op->alloc(be, &dr, sizeof(float) * (size_t)(W * N + PAD));
	CHECK(rc == 0 && hs && hr, "parameter collectives: allocation failed");
	if (rc < 0 || !hs || !hr)
		goto out;
	for (int g = 1; g <= W; g++) {
		if (W % g)
			continue;
		const int b0 = q / g * g, i = q % g;
		/* all-gather of N floats */
		for (size_t k = 0; k < N; k++)
			hs[k] = pval(q, k);
		for (size_t k = 0; k < (size_t)(g * N + PAD); k++)
			hr[k] = sentinel;
		be->op->upload(be, ds, hs, sizeof(float) * N);
		be->op->upload(be, dr, hr, sizeof(float) * (size_t)(g * N + PAD));
		rc = dist_dev_allgather(x, g, ds, dr, sizeof(float) * N);
		if (rc == 0)
			rc = be->op->download(be, hr, dr, sizeof(float) * (size_t)(g * N + PAD));
		CHECK(rc == 0, "allgather g=%d: %s", g, err_detail());
		int bad = 0;
		for (int j = 0; j < g; j++)
			for (size_t k = 0; k < N; k++)
				bad += hr[(size_t)j * N + k] != pval(b0 + j, k);
		for (size_t k = 0; k < PAD; k++)
			bad += hr[(size_t)g * N + k] != sentinel;
		CHECK(rc < 0 || !bad, "allgather g=%d: %d floats differ", g, bad);

		/* reduce-scatter: g*N floats in, N out: member order, float sums */
		for (size_t k = 0; k < (size_t)(g * N); k++)
			hs[k] = pval(q, k);
		for (size_t k = 0; k < N + PAD; k++)
			hr[k] = sentinel;
		be->op->upload(be, ds, hs, sizeof(float) * (size_t)(g * N));
		be->op->upload(be, dr, hr, sizeof(float) * (N + PAD));
		rc = dist_dev_reduce_scatter_f32(x, g, ds, dr, N);
		if (rc == 0)
			rc = be->op->download(be, hr, dr, sizeof(float) * (N + PAD));
		CHECK(rc == 0, "reduce_scatter g=%d: %s", g, err_detail());
		bad = 0;
		for (size_t k = 0; k < N; k++) {
			float want = pval(b0, (size_t)i * N + k);
			for (int j = 1; j < g; j++)
				want += pval(b0 + j, (size_t)i * N + k);
			bad += memcmp(&hr[k], &want, sizeof want) != 0;
		}
		for (size_t k = 0; k < PAD; k++)
			bad += hr[N + k] != sentinel;
		CHECK(rc < 0 || !bad, "reduce_scatter g=%d: %d floats differ from the sum in "
		      "member order", g, bad);
	}
	/* all-reduce over the world, in place */
	for (size_t k = 0; k < N + PAD; k++)
		hs[k] = k < N ? pval(q, k) : sentinel;
	be->op->upload(be, ds, hs, sizeof(float) * (N + PAD));
	rc = dist_dev_allreduce_f32(x, ds, N);
	if (rc == 0)
		rc = be->op->download(be, hr, ds, sizeof(float) * (N + PAD));
	CHECK(rc == 0, "allreduce: %s", err_detail());
	int bad = 0;
	for (size_t k = 0; k < N; k++) {
		float want = pval(0, k);
		for (int j = 1; j < W; j++)
			want += pval(j, k);
		bad += memcmp(&hr[k], &want, sizeof want) != 0;
	}
	for (size_t k = 0; k < PAD; k++)
		bad += hr[N + k] != sentinel;
	CHECK(rc < 0 || !bad, "allreduce: %d floats differ from the sum in rank order", bad);
	CHECK(dist_dev_reduce_scatter_f32(x, W + 1, ds, dr, N) == CORE_EUSAGE,
	      "reduce_scatter: a group size not dividing W was not refused");
out:
	be->op->free(be, ds);
	be->op->free(be, dr);
	free(hs);
	free(hr);
}

static void check_layout(struct backend *be, int local_size)
{
	struct dist *d = NULL;
	struct dist_dev *x = NULL;
	int rc = dist_open(&d, local_size);

	m = local_size;
	CHECK(rc == 0, "dist_open(%d): %s", local_size, err_detail());
	if (rc < 0)
		return;
	m = dist_local_size(d);
	rc = dist_dev_open(&x, d, be);
	CHECK(rc == 0, "dist_dev_open: %s", err_detail());
	if (rc == 0) {
		check_exchanges(d, x, be);
		check_refusals(x, be);
		CHECK((dist_dev_bytes(x) > 0) == (m > 1 && m < W),
		      "dist_dev_bytes %zu: 2DH stages exactly when 1 < m < W", dist_dev_bytes(x));
		check_params(x, be);
		dist_dev_close(x);
	}
	dist_close(d);
}

int main(int argc, char **argv)
{
	const char *name = argc > 1 ? argv[1] : "cuda";
	struct backend *be = NULL;
	int provided, rc;

	if (argc > 2) {
		fprintf(stderr, "usage: test_dist_dev [BACKEND]\n");
		return 2;
	}
	MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
	MPI_Comm_rank(MPI_COMM_WORLD, &q);
	MPI_Comm_size(MPI_COMM_WORLD, &W);
	/* one GPU per rank of a host */
	MPI_Comm host;
	int local = 0;
	MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, q, MPI_INFO_NULL, &host);
	MPI_Comm_rank(host, &local);
	MPI_Comm_free(&host);
	rc = backend_open(&be, name, &(struct backend_params){.device = local});
	int bad = rc < 0, any = 0;
	MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	if (any) {
		printf("test_dist_dev: skipped: backend '%s': %s\n", name,
		       rc < 0 ? err_detail() : "not on every rank");
		backend_close(be);
		MPI_Finalize();
		return 0;
	}
	const int sizes[] = {0, 1, 2, 4};
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
		if (sizes[i] == 0 || W % sizes[i] == 0)
			check_layout(be, sizes[i]);
	m = 0;
	if (W == 1 && be->op->comm_exchange)
		check_self_round(be);
#ifdef CORE_CUDA_EMU
	if (W > 1 && be->op->comm_exchange)
		check_misuse(be);
#endif
	backend_close(be);
	int fails = nfail, total = 0;
	MPI_Allreduce(&fails, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	if (q == 0)
		printf("test_dist_dev: %d ranks (%s): %d checks on rank 0, %d failed over all "
		       "ranks\n", W, name, nchecks, total);
	MPI_Finalize();
	return nfail ? 1 : 0;
}
