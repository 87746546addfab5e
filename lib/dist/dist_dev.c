/* dist_dev.c - the All-to-All on device memory (dist_dev.h): Linear and 2DH over a backend's
 * comm_exchange and copy_2d. It calls no MPI itself: the ids travel by dist_allgather, and
 * every failure that could leave ranks apart is made common with dist_agree_rc before the
 * next collective step, so that one rank's missing library or failed open makes all fail
 * rather than leave the others waiting in comm_open. Built in both builds (with dist_mpi.c
 * or dist_single.c).
 *
 * The stride copies are copy_2d calls over one block position at a time: block b of the
 * pieces for ranks l2, l2 + m, l2 + 2m, ... lies at a constant stride in the send span (m
 * times the span's peer stride, dist_impl.h), so phase 1 is m * nblk strided copies and not
 * W * nblk small ones; phase 3 is m, and the own node's part of phase 4 nblk.
 *
 * The parameter collectives use the world communicator with only the group's members as
 * peers: no communicator per group size (r changes g at every step, and opening a NCCL
 * communicator is collective and slow). Their sums are add_f32 over received copies in
 * member order, never a reduction inside the library, whose order NCCL does not promise.
 */
#include "dist/dist_dev.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "dist/dist_impl.h"
#include "common/banned.h"

enum { NID = 3, ID = BACKEND_COMM_ID_BYTES }; /* ids per rank: world, node, local index */

struct dist_dev {
	struct dist *d;
	struct backend *be;
	int q, W, m;
	void *world, *intra, *inter; /* communicators; NULL where not needed */
	void *stage[2];              /* 2DH: two buffers of cap bytes, device memory */
	size_t cap;
	void *red;                   /* the parameter collectives' receive staging */
	size_t red_cap;
	int64_t allocs;              /* staging (re)allocations */
	struct backend_xfer *x;      /* a round's transfers */
	size_t nx;
};

void dist_dev_close(struct dist_dev *x)
{
	if (!x)
		return;
	struct backend *be = x->be;
	if (be->op->comm_close) {
		be->op->comm_close(be, x->inter);
		be->op->comm_close(be, x->intra);
		be->op->comm_close(be, x->world);
	}
	be->op->free(be, x->stage[0]);
	be->op->free(be, x->stage[1]);
	be->op->free(be, x->red);
	free(x->x);
	free(x);
}

/* comm_open, then the outcome made common. */
static int open_comm(struct dist_dev *x, void **comm, const unsigned char *id, int nranks,
		     int rank)
{
	int rc = x->be->op->comm_open(x->be, comm, id, nranks, rank);
	return dist_agree_rc(x->d, rc);
}

int dist_dev_open(struct dist_dev **out, struct dist *d, struct backend *be)
{
	unsigned char mine[NID][ID], *all = NULL;
	int rc = 0;

	*out = NULL;
	struct dist_dev *x = calloc(1, sizeof *x);
	if (!x)
		rc = err_set(CORE_ENOMEM, NULL, "out of memory for the device all-to-all");
	else {
		*x = (struct dist_dev){.d = d, .be = be, .q = dist_rank(d), .W = dist_size(d),
				       .m = dist_local_size(d)};
		if (!be->op->copy_2d)
			rc = err_set(CORE_EUNSUPPORTED, NULL, "the %s backend has no strided copy",
				     be->name);
		else if (x->W > 1 && !be->op->comm_exchange)
			rc = err_set(CORE_EUNSUPPORTED, NULL, "the %s backend has no device "
				     "collectives (a device all-to-all needs one, e.g. cuda)",
				     be->name);
		else if (x->W > 1)
			rc = be->op->comm_unique_id(be, NULL); /* the library is there */
	}
	if ((rc = dist_agree_rc(d, rc)) < 0 || x->W == 1)
		goto out;

	const int q = x->q, W = x->W, m = x->m, two = m > 1 && m < W;
	memset(mine, 0, sizeof mine);
	if (q == 0)
		rc = be->op->comm_unique_id(be, mine[0]);
	if (rc == 0 && two && q % m == 0)
		rc = be->op->comm_unique_id(be, mine[1]);
	if (rc == 0 && two && q / m == 0)
		rc = be->op->comm_unique_id(be, mine[2]);
	all = malloc((size_t)W * sizeof mine);
	if (!all && rc == 0)
		rc = err_set(CORE_ENOMEM, NULL, "out of memory for %d communicator ids", W * NID);
	if ((rc = dist_agree_rc(d, rc)) < 0)
		goto out;
	if ((rc = dist_allgather(d, W, mine, all, sizeof mine)) < 0)
		goto out;
	/* the world by rank 0's id; the node by its first rank's; the local index by the id of
	 * node 0's rank of that index */
	rc = open_comm(x, &x->world, all, W, q);
	if (rc == 0 && two)
		rc = open_comm(x, &x->intra, all + (size_t)(q / m * m) * sizeof mine + ID, m, q % m);
	if (rc == 0 && two)
		rc = open_comm(x, &x->inter, all + (size_t)(q % m) * sizeof mine + 2 * ID, W / m,
			       q / m);
out:
	free(all);
	if (rc < 0) {
		dist_dev_close(x);
		return rc;
	}
	*out = x;
	return 0;
}

int64_t dist_dev_allocs(const struct dist_dev *x)
{
	return x->allocs;
}

size_t dist_dev_bytes(const struct dist_dev *x)
{
	return 2 * x->cap + x->red_cap;
}

/* Room for k transfers in x->x. */
static int xfer_room(struct dist_dev *x, size_t k)
{
	if (x->nx >= k)
		return 0;
	struct backend_xfer *p = realloc(x->x, k * sizeof *p);
	if (!p)
		return err_set(CORE_ENOMEM, NULL, "out of memory for %zu transfers", k);
	x->x = p;
	x->nx = k;
	return 0;
}

static int stage_grow(struct dist_dev *x, size_t bytes)
{
	if (x->cap >= bytes)
		return 0;
	struct backend *be = x->be;
	be->op->free(be, x->stage[0]);
	be->op->free(be, x->stage[1]);
	x->stage[0] = x->stage[1] = NULL;
	x->cap = 0;
	ERR_FORWARD(be->op->alloc(be, &x->stage[0], bytes));
	ERR_FORWARD(be->op->alloc(be, &x->stage[1], bytes));
	x->cap = bytes;
	x->allocs++;
	return 0;
}

static int red_grow(struct dist_dev *x, size_t bytes)
{
	if (x->red_cap >= bytes)
		return 0;
	struct backend *be = x->be;
	be->op->free(be, x->red);
	x->red = NULL;
	x->red_cap = 0;
	ERR_FORWARD(be->op->alloc(be, &x->red, bytes));
	x->red_cap = bytes;
	x->allocs++;
	return 0;
}

/* 1 when each piece of the span is contiguous: its blocks back to back. */
static int piece_contiguous(const struct dist_span *s, int W, int nblk, int64_t n, size_t rb)
{
	return nblk == 1 || dist_span_blk_stride(s, W, rb) == n * (int64_t)rb;
}

/* Every piece's blocks from one span to another, block by block (copy_2d over blocks). */
static int piece_copy(struct dist_dev *x, const struct dist_span *dst, int pd,
		      const struct dist_span *src, int ps, int nblk, int64_t n, size_t rb)
{
	struct backend *be = x->be;
	const int W = x->W;
	return be->op->copy_2d(be, (char *)dst->base + dist_span_off(dst, W, nblk, pd, 0, rb),
			       (size_t)dist_span_blk_stride(dst, W, rb),
			       (const char *)src->base + dist_span_off(src, W, nblk, ps, 0, rb),
			       (size_t)dist_span_blk_stride(src, W, rb), (size_t)n * rb,
			       (size_t)nblk);
}

static int a2a_linear(struct dist_dev *x, const struct dist_span *s, const struct dist_span *r,
		      int nb, int64_t n, size_t rb)
{
	struct backend *be = x->be;
	const int W = x->W, q = x->q;
	const size_t blk = (size_t)n * rb;
	/* one transfer per piece, or per block; the same cut on both ends (dist_dev.h) */
	const int per = piece_contiguous(s, W, nb, n, rb) && piece_contiguous(r, W, nb, n, rb)
				? 1 : nb;
	const size_t chunk = (size_t)nb / (size_t)per * blk;
	size_t k = 0;

	ERR_FORWARD(piece_copy(x, r, q, s, q, nb, n, rb));
	if (W == 1)
		return 0;
	ERR_FORWARD(xfer_room(x, 2 * (size_t)(W - 1) * (size_t)per));
	for (int i = 1; i < W; i++) {
		int p = (q + i) % W;
		for (int b = 0; b < per; b++)
			x->x[k++] = (struct backend_xfer){
				p, 0, (char *)s->base + dist_span_off(s, W, nb, p, b, rb), chunk};
	}
	for (int i = 1; i < W; i++) {
		int p = (q - i + W) % W;
		for (int b = 0; b < per; b++)
			x->x[k++] = (struct backend_xfer){
				p, 1, (char *)r->base + dist_span_off(r, W, nb, p, b, rb), chunk};
	}
	return be->op->comm_exchange(be, x->world, x->x, (int)k);
}

/* Tutel's 2DH (arXiv 2206.03382, sec. 3.4.5, Algorithm 2), as dist_mpi.c's a2a_2dh: N = W / m
 * nodes, this rank local index l of node v, S the bytes of a piece; A and B staging of W * S.
 *   1. A[l2][j] = our piece for rank j*m + l2;
 *   2. within the node, A[l2] (N pieces) to local rank l2; B[l2] from it;
 *   3. A[j][l2] = B[l2][j];
 *   4. across nodes, A[j] (m pieces) to node j; from node i, the pieces of ranks i*m ..
 *      i*m + m - 1 for us, into the recv span. */
static int a2a_2dh(struct dist_dev *x, const struct dist_span *s, const struct dist_span *r,
		   int nb, int64_t n, size_t rb)
{
	struct backend *be = x->be;
	const int W = x->W, m = x->m, N = W / m, v = x->q / m, l = x->q % m;
	const size_t blk = (size_t)n * rb, S = (size_t)nb * blk;
	const size_t sps = (size_t)dist_span_peer_stride(s, nb, rb);
	const size_t rps = (size_t)dist_span_peer_stride(r, nb, rb);
	size_t k = 0;

	ERR_FORWARD(stage_grow(x, (size_t)W * S));
	ERR_FORWARD(xfer_room(x, 2 * (size_t)W * (size_t)nb));
	char *A = x->stage[0], *B = x->stage[1];

	/* phase 1: block b of the pieces for ranks l2, l2 + m, ... at m peer strides */
	for (int l2 = 0; l2 < m; l2++)
		for (int b = 0; b < nb; b++)
			ERR_FORWARD(be->op->copy_2d(
				be, A + (size_t)l2 * N * S + (size_t)b * blk, S,
				(const char *)s->base + dist_span_off(s, W, nb, l2, b, rb),
				(size_t)m * sps, blk, (size_t)N));
	/* phase 2 */
	for (int i = 1; i < m; i++) {
		int p = (l + i) % m;
		x->x[k++] = (struct backend_xfer){p, 0, A + (size_t)p * N * S, (size_t)N * S};
	}
	for (int i = 1; i < m; i++) {
		int p = (l - i + m) % m;
		x->x[k++] = (struct backend_xfer){p, 1, B + (size_t)p * N * S, (size_t)N * S};
	}
	ERR_FORWARD(be->op->copy(be, B + (size_t)l * N * S, A + (size_t)l * N * S, (size_t)N * S));
	ERR_FORWARD(be->op->comm_exchange(be, x->intra, x->x, (int)k));
	/* phase 3 */
	for (int l2 = 0; l2 < m; l2++)
		ERR_FORWARD(be->op->copy_2d(be, A + (size_t)l2 * S, (size_t)m * S,
					    B + (size_t)l2 * N * S, S, S, (size_t)N));
	/* phase 4: the m pieces from node i as one transfer when they lie back to back in the
	 * recv span, one per piece when each is contiguous, else one per block */
	const int pc = piece_contiguous(r, W, nb, n, rb);
	const size_t chunk = pc && rps == S ? (size_t)m * S : pc ? S : blk;
	const size_t per = (size_t)m * S / chunk;
	k = 0;
	for (int i = 1; i < N; i++) {
		int p = (v + i) % N;
		for (size_t c = 0; c < per; c++)
			x->x[k++] = (struct backend_xfer){p, 0, A + (size_t)p * m * S + c * chunk,
							  chunk};
	}
	for (int i = 1; i < N; i++) {
		int p = (v - i + N) % N;
		/* chunk c: piece c / (S / chunk) of node p, block c % nb when cut by block */
		for (size_t c = 0; c < per; c++) {
			int rank = p * m + (int)(c * chunk / S), b = chunk == blk ? (int)(c % nb) : 0;
			x->x[k++] = (struct backend_xfer){
				p, 1, (char *)r->base + dist_span_off(r, W, nb, rank, b, rb), chunk};
		}
	}
	for (int b = 0; b < nb; b++)
		ERR_FORWARD(be->op->copy_2d(be, (char *)r->base + dist_span_off(r, W, nb, v * m, b, rb),
					    rps, A + (size_t)v * m * S + (size_t)b * blk, S, blk,
					    (size_t)m));
	return be->op->comm_exchange(be, x->inter, x->x, (int)k);
}

int dist_dev_alltoall(struct dist_dev *x, enum dist_a2a a, const struct dist_span *send,
		      const struct dist_span *recv, int nblk, int64_t n, size_t row_bytes)
{
	int empty;

	ERR_FORWARD(dist_a2a_check(x->W, a, send, recv, nblk, n, row_bytes, &empty));
	if (a == DIST_A2A_MPI)
		return err_set(CORE_EUSAGE, NULL, "the mpi all-to-all runs on host memory, not on "
			       "the %s backend's", x->be->name);
	if (empty)
		return 0;
	if (a == DIST_A2A_2DH && x->m > 1 && x->m < x->W)
		return a2a_2dh(x, send, recv, nblk, n, row_bytes);
	return a2a_linear(x, send, recv, nblk, n, row_bytes);
}

/* ---- parameters ----------------------------------------------------------------------------
 *
 * One round over the world communicator whose peers are the group's members: the k-th send
 * to a peer matches its k-th receive from us, and here each pair exchanges at most one
 * message each way per round, so the matching holds whatever the order of the entries. */

static int group_check(const struct dist_dev *x, int g)
{
	if (g < 1 || x->W % g)
		return err_set(CORE_EUSAGE, NULL, "group size %d does not divide %d ranks", g,
			       x->W);
	return 0;
}

int dist_dev_allgather(struct dist_dev *x, int g, const void *send, void *recv, size_t bytes)
{
	struct backend *be = x->be;
	ERR_FORWARD(group_check(x, g));
	const int b0 = x->q / g * g, i = x->q % g;
	size_t k = 0;

	if (!bytes)
		return 0;
	ERR_FORWARD(be->op->copy(be, (char *)recv + (size_t)i * bytes, send, bytes));
	if (g == 1)
		return 0;
	ERR_FORWARD(xfer_room(x, 2 * (size_t)g));
	for (int j = 0; j < g; j++)
		if (j != i)
			x->x[k++] = (struct backend_xfer){b0 + j, 0, (void *)send, bytes};
	for (int j = 0; j < g; j++)
		if (j != i)
			x->x[k++] = (struct backend_xfer){b0 + j, 1, (char *)recv + (size_t)j * bytes,
							  bytes};
	return be->op->comm_exchange(be, x->world, x->x, (int)k);
}

/* out[n] = the sum over members j = 0 .. g - 1 of part(j), in that order: part(mine) is
 * own, the others lie at x->red + j * n (received there). */
static int sum_parts(struct dist_dev *x, int g, int mine, const float *own, float *out,
		     size_t n)
{
	struct backend *be = x->be;
	const float *red = x->red;
	for (int j = 0; j < g; j++) {
		const float *part = j == mine ? own : red + (size_t)j * n;
		if (j == 0)
			ERR_FORWARD(be->op->copy(be, out, part, n * sizeof(float)));
		else
			ERR_FORWARD(be->op->add_f32(be, out, part, n));
	}
	return 0;
}

int dist_dev_reduce_scatter_f32(struct dist_dev *x, int g, const float *send, float *recv,
				size_t n)
{
	struct backend *be = x->be;
	ERR_FORWARD(group_check(x, g));
	const int b0 = x->q / g * g, i = x->q % g;
	const size_t bytes = n * sizeof(float);
	size_t k = 0;

	if (!n)
		return 0;
	if (g == 1)
		return be->op->copy(be, recv, send, bytes);
	ERR_FORWARD(red_grow(x, (size_t)g * bytes));
	ERR_FORWARD(xfer_room(x, 2 * (size_t)g));
	/* member j's part of our send to j; member j's part for us into red slot j */
	for (int j = 0; j < g; j++)
		if (j != i)
			x->x[k++] = (struct backend_xfer){b0 + j, 0, (void *)(send + (size_t)j * n),
							  bytes};
	for (int j = 0; j < g; j++)
		if (j != i)
			x->x[k++] = (struct backend_xfer){b0 + j, 1, (float *)x->red + (size_t)j * n,
							  bytes};
	ERR_FORWARD(be->op->comm_exchange(be, x->world, x->x, (int)k));
	return sum_parts(x, g, i, send + (size_t)i * n, recv, n);
}

int dist_dev_allreduce_f32(struct dist_dev *x, float *v, size_t n)
{
	struct backend *be = x->be;
	const int W = x->W, q = x->q;
	const size_t bytes = n * sizeof(float);
	size_t k = 0;

	if (!n || W == 1)
		return 0;
	/* slot q holds a copy of v: the sum reads v's old value while writing v */
	ERR_FORWARD(red_grow(x, (size_t)W * bytes));
	ERR_FORWARD(xfer_room(x, 2 * (size_t)W));
	float *own = (float *)x->red + (size_t)q * n;
	ERR_FORWARD(be->op->copy(be, own, v, bytes));
	for (int j = 0; j < W; j++)
		if (j != q)
			x->x[k++] = (struct backend_xfer){j, 0, own, bytes};
	for (int j = 0; j < W; j++)
		if (j != q)
			x->x[k++] = (struct backend_xfer){j, 1, (float *)x->red + (size_t)j * n, bytes};
	ERR_FORWARD(be->op->comm_exchange(be, x->world, x->x, (int)k));
	return sum_parts(x, W, q, own, v, n);
}
