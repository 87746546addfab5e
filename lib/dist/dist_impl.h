/* dist_impl.h - what dist_mpi.c and dist_single.c share: the geometry of an All-to-All span
 * and the checks of an exchange's arguments (dist_common.c). Private to lib/dist. */
#ifndef CORE_DIST_IMPL_H
#define CORE_DIST_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "dist/dist.h"

/* Byte offset in s->base of block b of peer p's piece (dist.h, the All-to-All), in a world
 * of W ranks; dist_a2a_check has made sure that it cannot overflow. */
static inline size_t dist_span_off(const struct dist_span *s, int W, int nblk, int p, int b,
				   size_t row_bytes)
{
	int64_t blk = s->interleaved ? (int64_t)b * W + p : (int64_t)p * nblk + b;
	return (size_t)(blk * s->rows + s->row0) * row_bytes;
}

/* Bytes from one block of a piece to the next, and from peer p's piece to peer p + 1's. */
static inline int64_t dist_span_blk_stride(const struct dist_span *s, int W, size_t row_bytes)
{
	return (s->interleaved ? (int64_t)W * s->rows : s->rows) * (int64_t)row_bytes;
}

static inline int64_t dist_span_peer_stride(const struct dist_span *s, int nblk,
					    size_t row_bytes)
{
	return (s->interleaved ? s->rows : (int64_t)nblk * s->rows) * (int64_t)row_bytes;
}

/* 1 when the span's pieces lie in peer order, each one contiguous, from base on: the
 * buffer MPI_Alltoall reads or writes itself. */
static inline int dist_span_packed(const struct dist_span *s, int nblk, int64_t n)
{
	return s->row0 == 0 && s->rows == n && (!s->interleaved || nblk == 1);
}

/* 0 when an exchange of these arguments is well formed in a world of W ranks, else
 * CORE_EUSAGE with a detail: a known algorithm, spans given with row0 + n within their rows,
 * buffers whose byte size fits a ptrdiff_t, n and row_bytes within an int (the counts of
 * MPI's datatypes), distinct buffers. *empty is set to 1 when it moves no byte. */
int dist_a2a_check(int W, enum dist_a2a a, const struct dist_span *send,
		   const struct dist_span *recv, int nblk, int64_t n, size_t row_bytes, int *empty);

/* Copy peer p's piece between a span and a contiguous piece (to_span: into the span). */
void dist_piece_copy(const struct dist_span *s, int W, int p, void *packed, int nblk, int64_t n,
		     size_t row_bytes, int to_span);

#endif
