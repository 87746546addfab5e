/* dist_common.c - the parts of dist.h that do not depend on MPI, compiled into both builds:
 * algorithm names, the clock, and the checks and copies of All-to-All spans (dist_impl.h).
 *
 * dist_time reads CLOCK_MONOTONIC rather than MPI_Wtime: it takes no dist object, so it may
 * be called before dist_open and after dist_close, where MPI_Wtime is erroneous (MPI 3.1),
 * and from any thread while the communication thread is inside MPI, which
 * MPI_THREAD_SERIALIZED forbids for every MPI call, MPI_Wtime included. Open MPI 4.1's
 * MPI_Wtime reads the same clock.
 */
#include "dist/dist_impl.h"

#include <limits.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "common/banned.h"

static const char *const a2a_names[] = {"linear", "2dh", "mpi"};

const char *dist_a2a_name(enum dist_a2a a)
{
	return (unsigned)a < sizeof a2a_names / sizeof a2a_names[0] ? a2a_names[a] : "unknown";
}

int dist_a2a_from_name(const char *name)
{
	for (int i = 0; name && i < (int)(sizeof a2a_names / sizeof a2a_names[0]); i++)
		if (strcmp(name, a2a_names[i]) == 0)
			return i;
	return -1;
}

double dist_time(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Bytes of the whole buffer a span lies in (W * nblk blocks of rows rows), or 0 with
 * CORE_EUSAGE recorded when that overflows a ptrdiff_t. */
static int span_bytes(const char *what, const struct dist_span *s, int W, int nblk, int64_t n,
		      size_t row_bytes, uint64_t *bytes)
{
	uint64_t b;

	if (s->rows < 0 || s->row0 < 0 || s->row0 > s->rows || n > s->rows - s->row0)
		return err_set(CORE_EUSAGE, NULL, "all-to-all: rows [%lld, %lld) of each block "
			       "are outside the %lld rows of the %s span", (long long)s->row0,
			       (long long)s->row0 + (long long)n, (long long)s->rows, what);
	if (__builtin_mul_overflow((uint64_t)W * (uint64_t)nblk, (uint64_t)s->rows, &b) ||
	    __builtin_mul_overflow(b, (uint64_t)row_bytes, &b) || b > PTRDIFF_MAX)
		return err_set(CORE_EUSAGE, NULL, "all-to-all: the %s buffer of %d x %d blocks "
			       "of %lld rows of %zu bytes is larger than memory", what, W, nblk,
			       (long long)s->rows, row_bytes);
	*bytes = b;
	return 0;
}

int dist_a2a_check(int W, enum dist_a2a a, const struct dist_span *send,
		   const struct dist_span *recv, int nblk, int64_t n, size_t row_bytes, int *empty)
{
	uint64_t sb = 0, rb = 0;

	*empty = 1;
	if ((unsigned)a > DIST_A2A_MPI)
		return err_set(CORE_EUSAGE, NULL, "unknown all-to-all algorithm %d", (int)a);
	if (!send || !recv)
		return err_set(CORE_EUSAGE, NULL, "all-to-all: no %s span", send ? "recv" : "send");
	if (nblk < 0 || n < 0)
		return err_set(CORE_EUSAGE, NULL, "all-to-all: negative shape (%d blocks of %lld "
			       "rows)", nblk, (long long)n);
	/* MPI counts are ints: n rows of row_bytes are the block and unit of the datatypes */
	if (n > INT_MAX || row_bytes > INT_MAX)
		return err_set(CORE_EUSAGE, NULL, "all-to-all: %lld rows of %zu bytes per block: "
			       "rows and row bytes must each be below 2^31", (long long)n,
			       row_bytes);
	ERR_FORWARD(span_bytes("send", send, W, nblk, n, row_bytes, &sb));
	ERR_FORWARD(span_bytes("recv", recv, W, nblk, n, row_bytes, &rb));
	if (nblk == 0 || n == 0 || row_bytes == 0)
		return 0;
	if (!send->base || !recv->base)
		return err_set(CORE_EUSAGE, NULL, "all-to-all: no %s buffer",
			       send->base ? "recv" : "send");
	uintptr_t s0 = (uintptr_t)send->base, r0 = (uintptr_t)recv->base;
	if (s0 < r0 + rb && r0 < s0 + sb)
		return err_set(CORE_EUSAGE, NULL, "all-to-all: the send and recv buffers overlap");
	*empty = 0;
	return 0;
}

void dist_piece_copy(const struct dist_span *s, int W, int p, void *packed, int nblk, int64_t n,
		     size_t row_bytes, int to_span)
{
	const size_t blk = (size_t)n * row_bytes;
	unsigned char *c = packed, *base = s->base;

	for (int b = 0; b < nblk; b++, c += blk) {
		unsigned char *at = base + dist_span_off(s, W, nblk, p, b, row_bytes);
		if (to_span)
			memcpy(at, c, blk);
		else
			memcpy(c, at, blk);
	}
}
