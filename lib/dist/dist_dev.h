/* dist_dev.h - the MoE layer's All-to-All (dist.h) on device memory, one process per device:
 * DIST_A2A_LINEAR and DIST_A2A_2DH written over a backend's device collectives (backend.h:
 * comm_exchange, copy_2d; on cuda, NCCL) instead of MPI, with the communicator ids carried
 * over the dist object's MPI world.
 *
 * A dist_dev joins a dist object (the ranks, the nodes of m ranks) to a backend (this
 * process's device). dist_dev_open opens, on every rank at once, the communicators the
 * algorithms need: the world (Linear), and for 2DH with nodes of 1 < m < W ranks one per
 * node (its m ranks, by local index) and one per local index (its W / m ranks, one per
 * node, by node), in that order; rank 0, each node's first rank and node 0's ranks make the
 * ids, and one all-gather over the world hands them out. A world of one rank (dist_single.c,
 * or mpirun -np 1) opens no communicator and needs no collectives: an exchange is a copy.
 *
 * dist_dev_alltoall has dist_alltoall's span semantics exactly (dist.h, "the All-to-All"),
 * with the spans' bases in backend memory, and gives the same bytes:
 *   DIST_A2A_LINEAR  one round of transfers with every peer (comm_exchange over the world):
 *                    a piece as one transfer when it is contiguous in both spans, else one
 *                    transfer per block (each block is contiguous); the own piece by
 *                    copy_2d;
 *   DIST_A2A_2DH     Tutel's four phases on device staging memory (kept, dist_dev_bytes):
 *                    stride copies by local destination (copy_2d, one per local index and
 *                    block), a round within the node (one transfer of W / m pieces per local
 *                    peer), stride copies by destination node, a round across nodes (the m
 *                    pieces for each node's ranks, received straight into the recv span: as
 *                    one transfer when they lie there back to back, one per piece when each
 *                    piece is contiguous, else one per block); m = 1 or m = W is LINEAR;
 *   DIST_A2A_MPI     CORE_EUSAGE: MPI's own All-to-All runs on host memory (dist_alltoall).
 * The exchange is queued on the backend's queue behind the ops before it and is complete when
 * the backend has run past it (be->op->sync, or a download): the call returns once it is
 * queued, and the buffers are the backend's until then. Called between the backend's
 * side_begin and side_end (backend.h) it is queued on the second queue instead (its copies
 * and transfers follow the switch), and complete at that queue's mark (side_wait). The
 * checks of dist_alltoall (CORE_EUSAGE before anything is queued) apply.
 *
 * Unlike the MPI algorithms, whose derived datatypes let each rank describe its own spans,
 * the transfers here must be cut alike on both ends: all ranks pass the same nblk, n,
 * row_bytes and algorithm, and spans of the same shape (rows, row0, interleaved; the bases
 * are each rank's own), as the MoE layer does. Not checked: a mismatch is the backend's
 * error (the emulated NCCL reports it) or a hang (NCCL's).
 *
 * Errors: CORE_EUNSUPPORTED from dist_dev_open, on every rank, when a world of more than one
 * rank has a backend without device collectives (cpu, ref) or one whose library is missing
 * (libnccl.so.2), with the reason; the backend's errors; CORE_ENOMEM.
 */
#ifndef CORE_DIST_DEV_H
#define CORE_DIST_DEV_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "dist/dist.h"

struct dist_dev; /* opaque */

/* Collective over d's world: *out NULL on failure, the same failure on every rank. d and be
 * must outlive the dist_dev. */
int dist_dev_open(struct dist_dev **out, struct dist *d, struct backend *be);
/* Waits for queued exchanges, closes the communicators, frees the staging memory. */
void dist_dev_close(struct dist_dev *x);

int dist_dev_alltoall(struct dist_dev *x, enum dist_a2a a, const struct dist_span *send,
		      const struct dist_span *recv, int nblk, int64_t n, size_t row_bytes);

/* ---- parameters: dist.h's all-gather, reduce-scatter and all-reduce on device memory ----
 *
 * The semantics of dist_allgather, dist_reduce_scatter_f32 (groups of g consecutive ranks,
 * see dist.h, "Groups") and dist_allreduce_f32 (the world), with send, recv and v in
 * backend memory: one round of comm_exchange over the world communicator whose transfers
 * name only the members of this rank's group (no communicator per group), queued on the
 * backend's queue like dist_dev_alltoall (complete at the next sync or download).
 * The sums are deterministic: each rank receives the members' contributions into device
 * staging memory (kept, dist_dev_bytes) and adds them with the backend's add_f32 in member
 * order 0, 1, .., g - 1, so an all-reduce gives the same bits on every rank, and a
 * reduce-scatter the same bits whatever the backend (float additions in that order; the
 * host's MPI reductions may order them otherwise: equal to rounding, not to the bit).
 * The all-reduce sends the whole vector to every rank (W - 1 transfers of n floats each
 * way, W n floats of staging): meant for the gate's gradient (M E floats), not for large
 * vectors. All ranks pass the same g and sizes; g divides W (CORE_EUSAGE otherwise, on every
 * rank alike). g = 1: a copy (all-gather) or a copy of this rank's own part. */
int dist_dev_allgather(struct dist_dev *x, int g, const void *send, void *recv, size_t bytes);
int dist_dev_reduce_scatter_f32(struct dist_dev *x, int g, const float *send, float *recv,
				size_t n);
int dist_dev_allreduce_f32(struct dist_dev *x, float *v, size_t n);

/* Bytes of device staging memory held now (2DH, the parameter collectives' sums). */
size_t dist_dev_bytes(const struct dist_dev *x);
/* Staging (re)allocations so far: staging grows to the largest call and is kept. */
int64_t dist_dev_allocs(const struct dist_dev *x);

#endif
