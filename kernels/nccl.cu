/* nccl.cu - the cuda backend's device collectives (backend.h, "device collectives") over NCCL:
 * a communicator is an ncclComm_t, a round of transfers one ncclGroupStart .. ncclGroupEnd of
 * ncclSend and ncclRecv on the backend's stream (its second one between side_begin and
 * side_end).
 *
 * NCCL is not linked: lib/backend/cuda/nccl_dl.c loads libnccl.so.2 on the first call (as cublas_dl.c
 * does cuBLAS), so programs start without it and only a process that opens a communicator
 * needs it; comm_unique_id(be, NULL) asks for the version, which loads it, and turns a
 * missing library into one line (CORE_EUNSUPPORTED). Under test/emu the same source runs
 * against the emulated NCCL of test/emu/nccl_emu.cpp (MPI underneath).
 *
 * Every transfer is bytes (ncclUint8), so a count is a size_t of bytes whatever the rows hold.
 * A group whose enqueueing fails part-way is still closed with ncclGroupEnd (NCCL requires
 * the group to be ended), which then reports the first error and launches nothing.
 */
#include <nccl.h>

#include "cuda_common.cuh"

/* 0, or CORE_EIO with NCCL's text and, where NCCL kept one, its last error message. */
static int nccl_fail(ncclResult_t r, ncclComm_t comm, const char *what)
{
	if (r == ncclSuccess)
		return 0;
	const char *last = ncclGetLastError(comm);
	return err_set(CORE_EIO, NULL, "nccl: %s: %s%s%s", what, ncclGetErrorString(r),
		       last && *last ? ": " : "", last && *last ? last : "");
}

int cuda_comm_unique_id(struct backend *be, void *id)
{
	int version = 0;
	ncclResult_t r = ncclGetVersion(&version);
	if (r != ncclSuccess) {
		/* nccl_dl.c's message when libnccl.so.2 cannot be loaded */
		const char *last = ncclGetLastError(NULL);
		return err_set(CORE_EUNSUPPORTED, NULL, "nccl: %s%s%s", ncclGetErrorString(r),
			       last && *last ? ": " : "", last && *last ? last : "");
	}
	if (!id)
		return 0;
	ncclUniqueId u;
	static_assert(sizeof u == BACKEND_COMM_ID_BYTES, "NCCL's id is not BACKEND_COMM_ID_BYTES");
	ERR_FORWARD(nccl_fail(ncclGetUniqueId(&u), NULL, "making a communicator id"));
	memcpy(id, &u, sizeof u);
	return 0;
}

int cuda_comm_open(struct backend *be, void **comm, const void *id, int nranks, int rank)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	ncclUniqueId u;
	ncclComm_t k = NULL;

	*comm = NULL;
	memcpy(&u, id, sizeof u);
	/* NCCL binds the communicator to the current device */
	CUDA_TRY(cudaSetDevice(c->device), "selecting the device for NCCL");
	ERR_FORWARD(nccl_fail(ncclCommInitRank(&k, nranks, u, rank), NULL,
			      "opening a communicator"));
	*comm = k;
	return 0;
}

void cuda_comm_close(struct backend *be, void *comm)
{
	if (!comm)
		return;
	/* the transfers queued on it first */
	be->op->sync(be);
	ncclCommDestroy((ncclComm_t)comm);
}

int cuda_comm_exchange(struct backend *be, void *comm, const struct backend_xfer *x, int nx)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	ncclComm_t k = (ncclComm_t)comm;
	ncclResult_t r;

	ERR_FORWARD(nccl_fail(ncclGroupStart(), k, "starting a group"));
	r = ncclSuccess;
	for (int i = 0; i < nx && r == ncclSuccess; i++) {
		if (!x[i].bytes)
			continue;
		r = x[i].recv ? ncclRecv(x[i].buf, x[i].bytes, ncclUint8, x[i].peer, k,
					 cuda_xfer_stream(c))
			      : ncclSend(x[i].buf, x[i].bytes, ncclUint8, x[i].peer, k,
					 cuda_xfer_stream(c));
	}
	ncclResult_t e = ncclGroupEnd();
	return nccl_fail(r != ncclSuccess ? r : e, k, r != ncclSuccess ? "queueing a transfer"
								   : "a round of transfers");
}
