/* nccl.h (test/emu) - the part of NCCL's API that kernels/nccl.cu uses, with the real header's
 * types and values (NCCL 2.28), so that the cuda backend's device collectives compile as C++
 * against the emulator; test/emu/nccl_emu.cpp implements them over MPI, one emulated GPU per
 * MPI process. What is missing fails to compile, on purpose.
 */
#ifndef CORE_EMU_NCCL_H
#define CORE_EMU_NCCL_H

#include <stddef.h>

#include <cuda_runtime.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_VERSION_CODE 22809

typedef struct ncclComm *ncclComm_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
	char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
	ncclSuccess = 0,
	ncclUnhandledCudaError = 1,
	ncclSystemError = 2,
	ncclInternalError = 3,
	ncclInvalidArgument = 4,
	ncclInvalidUsage = 5,
	ncclRemoteError = 6,
	ncclInProgress = 7,
	ncclNumResults = 8
} ncclResult_t;

typedef enum {
	ncclInt8 = 0, ncclChar = 0,
	ncclUint8 = 1,
	ncclInt32 = 2, ncclInt = 2,
	ncclUint32 = 3,
	ncclInt64 = 4,
	ncclUint64 = 5,
	ncclFloat16 = 6, ncclHalf = 6,
	ncclFloat32 = 7, ncclFloat = 7,
	ncclFloat64 = 8, ncclDouble = 8,
	ncclBfloat16 = 9,
	ncclFloat8e4m3 = 10,
	ncclFloat8e5m2 = 11,
	ncclNumTypes = 12
} ncclDataType_t;

extern "C" {
ncclResult_t ncclGetVersion(int *version);
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
const char *ncclGetErrorString(ncclResult_t result);
const char *ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
		      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
		      ncclComm_t comm, cudaStream_t stream);
}

#endif
