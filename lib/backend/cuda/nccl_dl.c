/* nccl_dl.c - the NCCL entry points the cuda backend calls (kernels/nccl.cu), loaded with dlopen
 * on first use instead of linked, for the reasons of cublas_dl.c: a program that never opens a
 * communicator neither pays for libnccl at start nor needs it installed.
 *
 * Each definition has nccl.h's prototype (included, so the compiler checks them), loads
 * libnccl.so.2 on the first call (the program's run path, LD_LIBRARY_PATH and the loader's
 * cache, then /usr/local/cuda/lib64) and forwards. When it cannot be loaded every call
 * returns ncclSystemError, and ncclGetErrorString says why in one line ("cannot load
 * libnccl.so.2 (...)"), which the backend reports when a communicator is first asked for.
 */
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>

#include "common/banned.h"
#include "common/dl_load.h"

#define NCCL_SONAME "libnccl.so.2"

static struct {
	pthread_once_t once;
	void *lib;
	char why[512];
	__typeof__(ncclGetVersion) *get_version;
	__typeof__(ncclGetUniqueId) *get_unique_id;
	__typeof__(ncclCommInitRank) *init_rank;
	__typeof__(ncclCommDestroy) *destroy;
	__typeof__(ncclGetErrorString) *error_string;
	__typeof__(ncclGetLastError) *last_error;
	__typeof__(ncclGroupStart) *group_start;
	__typeof__(ncclGroupEnd) *group_end;
	__typeof__(ncclSend) *send;
	__typeof__(ncclRecv) *recv;
} api = {.once = PTHREAD_ONCE_INIT};

static void load(void)
{
	static const struct dl_sym sym[] = {
		{"ncclGetVersion", (void **)&api.get_version},
		{"ncclGetUniqueId", (void **)&api.get_unique_id},
		{"ncclCommInitRank", (void **)&api.init_rank},
		{"ncclCommDestroy", (void **)&api.destroy},
		{"ncclGetErrorString", (void **)&api.error_string},
		{"ncclGetLastError", (void **)&api.last_error},
		{"ncclGroupStart", (void **)&api.group_start},
		{"ncclGroupEnd", (void **)&api.group_end},
		{"ncclSend", (void **)&api.send},
		{"ncclRecv", (void **)&api.recv},
	};
	api.lib = dl_load(NCCL_SONAME, "/usr/local/cuda/lib64", sym, sizeof sym / sizeof sym[0],
			  api.why, sizeof api.why);
}

static int loaded(void)
{
	pthread_once(&api.once, load);
	return api.lib != NULL;
}

ncclResult_t ncclGetVersion(int *version)
{
	return loaded() ? api.get_version(version) : ncclSystemError;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
	return loaded() ? api.get_unique_id(uniqueId) : ncclSystemError;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
	return loaded() ? api.init_rank(comm, nranks, commId, rank) : ncclSystemError;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
	return loaded() ? api.destroy(comm) : ncclSystemError;
}

const char *ncclGetErrorString(ncclResult_t result)
{
	return loaded() ? api.error_string(result) : api.why;
}

const char *ncclGetLastError(ncclComm_t comm)
{
	return loaded() ? api.last_error(comm) : "";
}

ncclResult_t ncclGroupStart(void)
{
	return loaded() ? api.group_start() : ncclSystemError;
}

ncclResult_t ncclGroupEnd(void)
{
	return loaded() ? api.group_end() : ncclSystemError;
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
		      ncclComm_t comm, cudaStream_t stream)
{
	if (!loaded())
		return ncclSystemError;
	return api.send(sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
		      ncclComm_t comm, cudaStream_t stream)
{
	if (!loaded())
		return ncclSystemError;
	return api.recv(recvbuff, count, datatype, peer, comm, stream);
}
