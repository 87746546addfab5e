/* dist.h - ranks, nodes and the collectives of the distributed MoE layer (Tutel, arXiv
 * 2206.03382, sec. 3.4.2, 3.4.4, 3.4.5, 3.4.8), over MPI.
 *
 * No MPI type appears here: a build without MPI compiles lib/dist/dist_single.c instead of
 * dist_mpi.c, where a world is one rank, every collective is a copy, an exchange started
 * with dist_alltoall_start runs at once, and dist_open refuses (CORE_EUNSUPPORTED) to run
 * as one of several processes started by mpirun.
 *
 * The world is W ranks grouped into nodes of m consecutive ranks (rank q = node * m +
 * local). m comes from the host layout (MPI_Comm_split_type SHARED; every node must then
 * hold the same number of ranks, numbered consecutively) or is given (local_size > 0) to
 * simulate nodes on one host; it divides W.
 *
 * Groups: the collectives over "groups of g" act within each run of g consecutive ranks
 * [q / g * g, q / g * g + g), g dividing W; g = W is the world, g = 1 is a copy. Members
 * take part in group order.
 *
 * Threads: the caller's thread makes every blocking call. The asynchronous exchanges
 * (dist_alltoall_start) run in order on one communication thread of the dist object, the
 * CPU's counterpart of a CUDA communication stream, so that they progress while the caller
 * computes; a blocking call first waits for every started exchange. MPI is initialised
 * with MPI_THREAD_SERIALIZED (required).
 *
 * Errors: CORE_EUSAGE for bad arguments (the same on every rank, so every rank reports it);
 * CORE_EIO with MPI's error text when MPI fails (communicators return errors instead of
 * aborting), after which the object is good only for dist_close; CORE_EUNSUPPORTED for
 * more than one rank without MPI; CORE_ENOMEM.
 * A collective that one rank skips hangs the others: callers check that ranks agree (sizes,
 * configuration) with dist_agree before the first exchange.
 */
#ifndef CORE_DIST_H
#define CORE_DIST_H

#include <stddef.h>
#include <stdint.h>

struct dist; /* opaque */

/* 1 when built with MPI, 0 otherwise. */
int dist_have_mpi(void);
/* Whether a launcher started this process, from its environment alone (no MPI needed): the
 * first of Open MPI's (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE), MPICH Hydra's and Slurm
 * PMI2's (PMI_RANK, PMI_SIZE) and PMIx under srun (PMIX_RANK, SLURM_NTASKS) that holds a
 * rank below a size >= 1: 1 with them in *rank and *size, else 0 with 0 and 1. The one
 * "under mpirun?" test of every program (lib/dist/launcher.c). */
int dist_launcher(long *rank, long *size);

/* Join the world (MPI_Init_thread unless MPI is initialised already; MPI_Finalize in
 * dist_close then belongs to whoever initialised it). local_size: 0 = the host layout
 * (CORE_EUSAGE when the hosts do not hold equal runs of consecutive ranks), m > 0 = nodes
 * of m consecutive ranks (CORE_EUSAGE when m does not divide W). *out is NULL on failure,
 * and MPI is finalised again if dist_open initialised it. */
int dist_open(struct dist **out, int local_size);
/* Wait for started exchanges, free everything, finalise MPI if dist_open initialised it. */
void dist_close(struct dist *d);

int dist_rank(const struct dist *d);       /* q in [0, W) */
int dist_size(const struct dist *d);       /* W */
int dist_local_size(const struct dist *d); /* m */
/* "host" (MPI_Comm_split_type) or "given" (local_size > 0). */
const char *dist_layout_source(const struct dist *d);
/* The processor name of this rank (MPI_Get_processor_name), for reports. */
const char *dist_host(const struct dist *d);

/* ---- agreement ---------------------------------------------------------------------- */

/* Every rank passes n values; returns 0 when all ranks passed the same ones, else
 * CORE_EUSAGE on every rank, with the same detail on every rank: the first differing index
 * i by names[i] (names may be NULL: "value i"), the lowest and the highest value over ranks
 * and the lowest rank holding each: "ranks disagree on E: 4 on rank 1, 8 on rank 0". */
int dist_agree(struct dist *d, const int64_t *v, int n, const char *const *names);
/* An error on some ranks becomes an error on all: every rank passes its rc (0 or CORE_E*);
 * returns 0 when all were 0, else on the ranks that failed their own rc (detail kept) and
 * on the others the lowest failing rank's code, with its message after "rank R failed: "
 * ("rank 3 failed: 'data.bin': cannot read: ..."), so that every rank says why and exits
 * with the same status. */
int dist_agree_rc(struct dist *d, int rc);

/* ---- small collectives (world) --------------------------------------------------------- */

enum dist_op { DIST_SUM = 0, DIST_MAX = 1, DIST_MIN = 2 };
int dist_allreduce_i64(struct dist *d, int64_t *v, int n, enum dist_op op); /* in place */
int dist_allreduce_f64(struct dist *d, double *v, int n, enum dist_op op);  /* in place */
int dist_barrier(struct dist *d);
/* A barrier that gives up after seconds (CORE_EIO "ranks did not meet within N s"), for a
 * program about to exit with an error: mpirun kills every rank as soon as one exits
 * non-zero, so each rank waits, after printing its line, for the others to print theirs,
 * and a rank whose peers are stuck elsewhere still exits. */
int dist_barrier_timeout(struct dist *d, double seconds);
/* Wall time in seconds (CLOCK_MONOTONIC, the clock of Open MPI's MPI_Wtime: callable from
 * any thread, before dist_open and after dist_close, where MPI_Wtime may not be). */
double dist_time(void);

/* ---- parameters: all-gather and reduce-scatter in groups of g (see Groups) -------------- */

/* recv[i * bytes .. (i+1) * bytes) = member i's send, for the g members of this rank's
 * group; recv holds g * bytes. g = 1: a copy. */
int dist_allgather(struct dist *d, int g, const void *send, void *recv, size_t bytes);
/* recv[n] = sum over the g members of their send[(my index in the group) * n .. + n),
 * float; send holds g * n. In place (send == recv) is not allowed. g = 1: a copy. */
int dist_reduce_scatter_f32(struct dist *d, int g, const float *send, float *recv, size_t n);
/* v[n] summed over the world, in place (the gate's gradient). */
int dist_allreduce_f32(struct dist *d, float *v, size_t n);

/* ---- the All-to-All (sec. 3.4.5, 3.4.8) ----------------------------------------------------
 *
 * Each rank exchanges one piece with every rank (itself included, by a local copy). A piece
 * between this rank and peer p is nblk blocks, each n rows of row_bytes; where they lie in
 * a buffer is a span:
 *   block b of peer p starts at row  (p * nblk + b) * rows + row0   (interleaved = 0)
 *                                    (b * W + p) * rows + row0      (interleaved = 1)
 * of base (rows of row_bytes), and the piece takes rows [row0, row0 + n) of each block.
 * So a send buffer [E, C, M] with E / W experts per rank is spans of nblk = E / W
 * contiguous blocks of C rows, and a receive buffer laid out [E / W, W * C, M] for the
 * experts (Tutel's flexible layout) is the interleaved span of the same shape; row0 and n
 * select a slice of the capacity dimension (pipelining, sec. 3.4.4).
 * After the call, the recv span's piece of peer p holds p's send-span piece for this rank,
 * byte for byte, whatever the algorithm:
 *   DIST_A2A_LINEAR  one message each way with every peer (non-blocking sends and receives
 *                    with derived datatypes over the spans: no staging copy), or one per
 *                    block for blocks of 64 KiB or more when a piece is not contiguous on
 *                    both sides (shared-memory MPI copies only contiguous messages once);
 *   DIST_A2A_2DH     Tutel's four phases: a stride copy aligning by local destination, an
 *                    exchange within the node (m messages), a stride copy aligning by
 *                    destination node, an exchange across nodes (W / m messages m times
 *                    larger) received straight into the recv span; staging memory is kept
 *                    and reused (dist_bytes);
 *   DIST_A2A_MPI     MPI_Alltoall on packed copies of the spans: the reference, and the
 *                    baseline of the benchmark.
 * CORE_EUSAGE, before anything is sent, when the buffers of the send and recv spans overlap,
 * when row0 + n exceeds a span's rows, or when n or row_bytes is 2^31 or more (MPI's int
 * counts). All ranks pass the same nblk, n, row_bytes and algorithm (not checked: a
 * mismatch is MPI's error or a hang). */
enum dist_a2a { DIST_A2A_LINEAR = 0, DIST_A2A_2DH = 1, DIST_A2A_MPI = 2 };
const char *dist_a2a_name(enum dist_a2a a);  /* "linear", "2dh", "mpi" */
int dist_a2a_from_name(const char *name);    /* -1 when unknown */

struct dist_span {
	void *base;
	int64_t rows;    /* rows per block in this buffer */
	int64_t row0;    /* first row of the piece within each block */
	int interleaved; /* see above */
};

int dist_alltoall(struct dist *d, enum dist_a2a a, const struct dist_span *send,
		  const struct dist_span *recv, int nblk, int64_t n, size_t row_bytes);
/* The same exchange, queued on the communication thread; *ticket identifies it (tickets
 * count up from 1). The buffers must stay untouched until dist_wait returns for this
 * ticket or a later one. Bad arguments fail here, before anything is queued. */
int dist_alltoall_start(struct dist *d, enum dist_a2a a, const struct dist_span *send,
			const struct dist_span *recv, int nblk, int64_t n, size_t row_bytes,
			int64_t *ticket);
/* Wait until the exchange with this ticket and every one before it are done; returns the
 * first error among them (again at every later wait: after a failed exchange, those queued
 * behind it are not run). CORE_EUSAGE for a ticket not issued. */
int dist_wait(struct dist *d, int64_t ticket);

/* Exchange accounting since the last dist_stats_reset: seconds spent inside All-to-All
 * exchanges (blocking ones and those of the communication thread), and their number; and
 * of 2DH exchanges with two levels (nodes of 1 < m < W), the seconds of its phases: the two
 * stride copies, the exchange within the node and the one across nodes (what moe-profile
 * --simulate fits each link level to). */
struct dist_stats {
	double comm_seconds;
	int64_t exchanges;
	double h2d_copy_seconds, h2d_intra_seconds, h2d_inter_seconds;
};
void dist_stats(const struct dist *d, struct dist_stats *s);
void dist_stats_reset(struct dist *d);
/* Bytes of staging memory the object holds now (2DH, packed MPI copies). */
size_t dist_bytes(const struct dist *d);

#endif
