/* nccl_emu.cpp - NCCL's point-to-point API (test/emu/include/nccl.h) over MPI, so that the cuda
 * backend's device collectives (kernels/nccl.cu) and the All-to-All built on them
 * (lib/dist/dist_dev.c) run under mpirun on a machine without GPUs: each MPI process is one
 * rank with one emulated GPU, whose "device memory" is host memory (emu.cpp).
 *
 * ncclGetUniqueId makes an id that names its maker (world rank, a count). ncclCommInitRank is a
 * rendezvous over MPI_COMM_WORLD: every world rank must call it at the same point (each with
 * the id of the communicator it joins), so the processes open their communicators in the
 * same order, as NCCL's users do; the ids are gathered and the world is split by id, with the
 * NCCL rank as the key. A group (ncclGroupStart .. ncclGroupEnd, or a lone call, on one
 * stream) records its sends and receives; ncclGroupEnd checks them with the peers at once and
 * queues the transfers on the group's stream (emu.cpp's emu_enqueue), where they run with
 * MPI_Isend, MPI_Irecv and a wait: at once by default, or when something needs them under
 * CUDA_EMU_STREAMS=late-first or late-others. Every rank of the communicator takes part in every group (as in an
 * All-to-All).
 *
 * Misuse is an error on every rank of the communicator, not a hang: before anything moves,
 * the ranks exchange the sizes of what each sends to each, and a send whose size differs
 * from the matching receive's (k-th send of a to b against the k-th receive of b from a), a
 * send without a receive or the reverse, a peer outside the communicator, a buffer that is
 * not device memory, an unknown stream or a group over two communicators fails the group on
 * every rank (ncclInvalidUsage or ncclInvalidArgument where it was found, ncclRemoteError on
 * the others), with a line on stderr and the text in ncclGetLastError. Real NCCL checks the
 * peer and the arguments, and mostly hangs on a mismatch.
 *
 * Built without MPI (no mpicc), every call returns ncclSystemError: "built without MPI".
 */
#include <cuda_runtime.h>
#include <nccl.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <vector>

#if EMU_NCCL_MPI
/* MPI's C API only: not its C++ bindings, which would want libmpi_cxx */
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

static char last_error[512];

__attribute__((format(printf, 1, 2), unused)) static void say(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(last_error, sizeof last_error, fmt, ap);
	va_end(ap);
	fprintf(stderr, "nccl-emu: %s\n", last_error);
}

extern "C" const char *ncclGetErrorString(ncclResult_t r)
{
	switch (r) { /* NCCL 2.28's texts */
	case ncclSuccess: return "no error";
	case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
	case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
	case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
	case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
	case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
	case ncclRemoteError: return "remote process exited or there was a network error";
	case ncclInProgress: return "NCCL operation in progress";
	default: return "unknown result code";
	}
}

extern "C" const char *ncclGetLastError(ncclComm_t comm)
{
	return last_error;
}

#if !EMU_NCCL_MPI

static ncclResult_t no_mpi(void)
{
	snprintf(last_error, sizeof last_error, "the emulated NCCL was built without MPI");
	return ncclSystemError;
}

extern "C" {
ncclResult_t ncclGetVersion(int *version) { return no_mpi(); }
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) { return no_mpi(); }
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
	return no_mpi();
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) { return no_mpi(); }
ncclResult_t ncclGroupStart(void) { return no_mpi(); }
ncclResult_t ncclGroupEnd(void) { return no_mpi(); }
ncclResult_t ncclSend(const void *b, size_t n, ncclDataType_t t, int peer, ncclComm_t comm,
		      cudaStream_t s)
{
	return no_mpi();
}
ncclResult_t ncclRecv(void *b, size_t n, ncclDataType_t t, int peer, ncclComm_t comm,
		      cudaStream_t s)
{
	return no_mpi();
}
}

#else

struct ncclComm {
	MPI_Comm c;
	int rank, nranks;
};

struct op {
	int recv, peer;
	void *buf;
	size_t bytes;
};

static struct {
	int depth;
	ncclComm_t comm;        /* the group's communicator (the first op's) */
	cudaStream_t stream;    /* and stream */
	std::vector<op> ops;
	ncclResult_t err;       /* the first misuse found while recording */
} group;

static const char id_magic[8] = {'n', 'c', 'c', 'l', '-', 'e', 'm', 'u'};

static ncclResult_t need_mpi(void)
{
	int up = 0, down = 0;
	MPI_Initialized(&up);
	MPI_Finalized(&down);
	if (up && !down)
		return ncclSuccess;
	say("the emulated NCCL runs over MPI: MPI is not initialised");
	return ncclSystemError;
}

extern "C" ncclResult_t ncclGetVersion(int *version)
{
	ncclResult_t r = need_mpi();
	if (r == ncclSuccess)
		*version = NCCL_VERSION_CODE;
	return r;
}

extern "C" ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
	static uint64_t made;
	int q = 0;

	if (need_mpi() != ncclSuccess)
		return ncclSystemError;
	MPI_Comm_rank(MPI_COMM_WORLD, &q);
	memset(id, 0, sizeof *id);
	uint64_t v[3] = {(uint64_t)q, ++made, (uint64_t)getpid()};
	memcpy(id->internal, id_magic, sizeof id_magic);
	memcpy(id->internal + sizeof id_magic, v, sizeof v);
	return ncclSuccess;
}

extern "C" ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
	int q = 0, W = 0, color = 0, size = 0;
	MPI_Comm c = MPI_COMM_NULL;

	*comm = NULL;
	if (need_mpi() != ncclSuccess)
		return ncclSystemError;
	MPI_Comm_rank(MPI_COMM_WORLD, &q);
	MPI_Comm_size(MPI_COMM_WORLD, &W);
	/* the rendezvous: every world rank's id; this one's communicator is named by the lowest
	 * world rank holding the same id */
	std::vector<ncclUniqueId> all((size_t)W);
	MPI_Allgather(&id, (int)sizeof id, MPI_BYTE, all.data(), (int)sizeof id, MPI_BYTE,
		      MPI_COMM_WORLD);
	while (memcmp(&all[(size_t)color], &id, sizeof id) != 0)
		color++;
	int valid = memcmp(id.internal, id_magic, sizeof id_magic) == 0;
	MPI_Comm_split(MPI_COMM_WORLD, color, rank, &c);
	MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
	MPI_Comm_size(c, &size);
	/* every member checks every member's (nranks, rank) */
	std::vector<int> nr(2 * (size_t)size);
	int mine[2] = {nranks, rank};
	MPI_Allgather(mine, 2, MPI_INT, nr.data(), 2, MPI_INT, c);
	std::vector<int> seen((size_t)size, 0);
	ncclResult_t r = ncclSuccess;
	for (int i = 0; i < size && r == ncclSuccess; i++) {
		int n = nr[2 * (size_t)i], k = nr[2 * (size_t)i + 1];
		if (n != size) {
			say("ncclCommInitRank: %d processes joined the communicator of this id, one "
			    "of them for %d ranks", size, n);
			r = ncclInvalidArgument;
		} else if (k < 0 || k >= n || seen[(size_t)k]++) {
			say("ncclCommInitRank: rank %d of %d is %s", k, n,
			    k < 0 || k >= n ? "out of range" : "taken twice");
			r = ncclInvalidArgument;
		}
	}
	if (r == ncclSuccess && !valid) {
		say("ncclCommInitRank: the id was not made by ncclGetUniqueId");
		r = ncclInvalidArgument;
	}
	if (r != ncclSuccess) {
		MPI_Comm_free(&c);
		return r;
	}
	*comm = new ncclComm{c, rank, nranks};
	return ncclSuccess;
}

extern "C" ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
	if (!comm)
		return ncclSuccess;
	cudaDeviceSynchronize(); /* the transfers queued on it */
	int down = 0;
	MPI_Finalized(&down);
	if (!down)
		MPI_Comm_free(&comm->c);
	delete comm;
	return ncclSuccess;
}

extern "C" ncclResult_t ncclGroupStart(void)
{
	group.depth++;
	return ncclSuccess;
}

static size_t type_size(ncclDataType_t t)
{
	static const size_t sz[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
	return (unsigned)t < ncclNumTypes ? sz[t] : 0;
}

static ncclResult_t run_group(void);

static ncclResult_t record(int recv, void *buf, size_t count, ncclDataType_t t, int peer,
			   ncclComm_t comm, cudaStream_t s)
{
	const char *what = recv ? "ncclRecv" : "ncclSend";
	ncclResult_t r = ncclSuccess;

	if (!comm) {
		say("%s: no communicator", what);
		return ncclInvalidArgument; /* no group to fail: there is no communicator */
	}
	size_t ts = type_size(t);
	if (!ts) {
		say("%s: unknown datatype %d", what, (int)t);
		r = ncclInvalidArgument;
	} else if (peer < 0 || peer >= comm->nranks) {
		say("%s: peer %d is out of range for a communicator of %d ranks", what, peer,
		    comm->nranks);
		r = ncclInvalidArgument;
	} else if (count && !emu_is_device_range(buf, count * ts)) {
		say("%s: %p (%zu bytes) is not device memory", what, buf, count * ts);
		r = ncclInvalidArgument;
	} else if (!emu_is_stream(s)) {
		say("%s: %p is not a stream", what, (void *)s);
		r = ncclInvalidArgument;
	} else if (group.comm && group.comm != comm) {
		say("%s: the emulator runs one communicator per group", what);
		r = ncclInvalidUsage;
	} else if (group.comm && group.stream != s) {
		say("%s: the emulator runs a group on one stream", what);
		r = ncclInvalidUsage;
	}
	group.comm = comm;
	group.stream = s;
	if (r != ncclSuccess) {
		if (group.err == ncclSuccess)
			group.err = r;
	} else {
		group.ops.push_back(op{recv, peer, buf, count * ts});
	}
	/* outside a group a call is a group of one; the group's failure is this call's */
	if (group.depth == 0) {
		ncclResult_t e = run_group();
		return r != ncclSuccess ? r : e;
	}
	return r;
}

extern "C" ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype,
				 int peer, ncclComm_t comm, cudaStream_t stream)
{
	return record(0, (void *)sendbuff, count, datatype, peer, comm, stream);
}

extern "C" ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
				 ncclComm_t comm, cudaStream_t stream)
{
	return record(1, recvbuff, count, datatype, peer, comm, stream);
}

extern "C" ncclResult_t ncclGroupEnd(void)
{
	if (group.depth == 0) {
		say("ncclGroupEnd without ncclGroupStart");
		return ncclInvalidUsage;
	}
	if (--group.depth > 0)
		return ncclSuccess;
	return run_group();
}

/* The recorded group: sizes checked on every rank, then moved. */
static ncclResult_t run_group(void)
{
	ncclComm_t comm = group.comm;
	cudaStream_t stream = group.stream;
	std::vector<op> ops;
	ncclResult_t r = group.err;

	ops.swap(group.ops);
	group.comm = NULL;
	group.err = ncclSuccess;
	if (!comm)
		return r;
	const int n = comm->nranks;
	/* what this rank sends to each peer, in order, and what each peer sends to it */
	std::vector<int> scount((size_t)n, 0), rcount((size_t)n, 0), sdisp((size_t)n, 0),
		rdisp((size_t)n, 0);
	for (const op &o : ops)
		if (!o.recv)
			scount[(size_t)o.peer]++;
	MPI_Alltoall(scount.data(), 1, MPI_INT, rcount.data(), 1, MPI_INT, comm->c);
	int ns = 0, nr = 0;
	for (int p = 0; p < n; p++) {
		sdisp[(size_t)p] = ns;
		rdisp[(size_t)p] = nr;
		ns += scount[(size_t)p];
		nr += rcount[(size_t)p];
	}
	std::vector<uint64_t> ssize((size_t)ns + 1), rsize((size_t)nr + 1);
	std::vector<int> fill((size_t)n, 0);
	for (const op &o : ops)
		if (!o.recv) {
			int p = o.peer;
			ssize[(size_t)(sdisp[(size_t)p] + fill[(size_t)p]++)] = o.bytes;
		}
	MPI_Alltoallv(ssize.data(), scount.data(), sdisp.data(), MPI_UINT64_T, rsize.data(),
		      rcount.data(), rdisp.data(), MPI_UINT64_T, comm->c);
	/* each receive against the matching send of its peer */
	std::fill(fill.begin(), fill.end(), 0);
	for (const op &o : ops) {
		if (!o.recv || r != ncclSuccess)
			continue;
		int p = o.peer, k = fill[(size_t)p]++;
		if (k >= rcount[(size_t)p]) {
			say("receive %d from rank %d (%zu bytes): rank %d sends only %d to rank %d", k,
			    p, o.bytes, p, rcount[(size_t)p], comm->rank);
			r = ncclInvalidUsage;
		} else if (rsize[(size_t)(rdisp[(size_t)p] + k)] != o.bytes) {
			say("receive %d from rank %d is %zu bytes, rank %d sends %llu", k, p, o.bytes,
			    p, (unsigned long long)rsize[(size_t)(rdisp[(size_t)p] + k)]);
			r = ncclInvalidUsage;
		} else if (o.bytes > (size_t)INT32_MAX) {
			say("a transfer of %zu bytes: the emulator moves at most 2^31 - 1", o.bytes);
			r = ncclInvalidUsage;
		}
	}
	for (int p = 0; p < n && r == ncclSuccess; p++)
		if (fill[(size_t)p] < rcount[(size_t)p]) {
			say("rank %d sends %d transfers to rank %d, which receives %d", p,
			    rcount[(size_t)p], comm->rank, fill[(size_t)p]);
			r = ncclInvalidUsage;
		}
	/* one rank's misuse fails the group everywhere */
	int bad = r != ncclSuccess, any = 0;
	MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm->c);
	if (any) {
		if (r == ncclSuccess) {
			snprintf(last_error, sizeof last_error, "a peer failed the group");
			r = ncclRemoteError;
		}
		return r;
	}
	/* the transfers themselves run in stream order (emu.cpp: at once, or when something needs
	 * them; every rank runs the same program, so the groups meet) */
	emu_enqueue(stream, [comm, ops = std::move(ops)] {
		std::vector<MPI_Request> req(ops.size());
		size_t k = 0;
		for (const op &o : ops)
			if (o.recv)
				MPI_Irecv(o.buf, (int)o.bytes, MPI_BYTE, o.peer, 0, comm->c,
					  &req[k++]);
		for (const op &o : ops)
			if (!o.recv)
				MPI_Isend(o.buf, (int)o.bytes, MPI_BYTE, o.peer, 0, comm->c,
					  &req[k++]);
		if (MPI_Waitall((int)k, req.data(), MPI_STATUSES_IGNORE) != MPI_SUCCESS) {
			say("MPI_Waitall failed in a group's transfers");
			abort();
		}
	});
	return ncclSuccess;
}

#endif
