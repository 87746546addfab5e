/* dist_bench.h - the All-to-All benchmark: DIST_A2A_LINEAR, DIST_A2A_2DH and DIST_A2A_MPI
 * (MPI_Alltoall itself on these buffers) timed on the same buffers, size by size.
 *
 * Collective: every rank calls it with the same options and gets the same table. Per size,
 * each rank sends W pieces (its own included) of size / W bytes, as nblk blocks of rows of
 * row_bytes, from a contiguous send buffer ([E, C, M] with nblk = E / W experts per rank)
 * into an interleaved recv buffer ([E / W, W * C, M], Tutel's layout); with nblk = 1 both
 * are plain [W, piece] buffers, so that DIST_A2A_MPI is MPI_Alltoall with no copy. Once per
 * size the outputs of LINEAR and 2DH are compared with MPI's byte for byte. Then, after the
 * warm-up rounds (which also grow the staging memory), each repetition runs the three
 * algorithms in turn, starting with a different one each time, each after a barrier; a
 * repetition's time is the slowest rank's, and a size's figure the median over repetitions.
 * Nothing is printed.
 */
#ifndef CORE_DIST_BENCH_H
#define CORE_DIST_BENCH_H

#include <stddef.h>

#include "dist/dist.h"

struct dist_bench_opts {
	const size_t *sizes; /* bytes each rank sends (= receives), all pieces; NULL: the default
			      * list, 1 KiB to 64 MiB by factors of 4 */
	int nsizes;
	int warmup;          /* untimed rounds of each algorithm per size */
	int reps;            /* timed repetitions (>= 1) */
	int nblk;            /* blocks per piece (experts per rank), >= 1 */
	size_t row_bytes;    /* bytes per row (M floats: 4 M); smaller when a piece is smaller */
};

/* warmup 2, reps 10, nblk 1, row_bytes 4096, the default sizes. */
void dist_bench_opts_default(struct dist_bench_opts *o);

struct dist_bench_row {
	size_t bytes;      /* bytes each rank sent: W pieces of nblk * n * row_bytes */
	size_t piece;      /* bytes from one rank to another */
	double seconds[3]; /* by enum dist_a2a: the median over repetitions of the slowest rank */
	double gbps[3];    /* bytes / seconds / 1e9 */
};

/* Run the benchmark; *rows (free() it) gets *nrows rows, one per size, in the order given.
 * CORE_EUSAGE for bad options (the same on every rank), CORE_EIO when an algorithm's output
 * differs from MPI_Alltoall's (on every rank, naming the first differing rank, algorithm and
 * byte), the errors of dist_alltoall, CORE_ENOMEM. */
int dist_bench_alltoall(struct dist *d, const struct dist_bench_opts *o,
			struct dist_bench_row **rows, int *nrows);

struct dist_dev;
struct backend;

/* The same benchmark on device memory (dist_dev.h): seconds[DIST_A2A_LINEAR] and
 * seconds[DIST_A2A_2DH] time dist_dev_alltoall on backend buffers up to the backend's sync
 * (the exchange is queued, so its time is until it is done), and seconds[DIST_A2A_MPI] is
 * the host MPI_Alltoall on host copies of the same data (dist_alltoall, the baseline: what
 * a program without device collectives would do, less its device to host copies). Once per
 * size both device outputs are downloaded and compared with the host MPI's, byte for byte.
 * Errors as dist_bench_alltoall's, and the backend's. */
int dist_bench_alltoall_dev(struct dist *d, struct dist_dev *x, struct backend *be,
			    const struct dist_bench_opts *o, struct dist_bench_row **rows,
			    int *nrows);

#endif
