/* cublas_dl.c - the cuBLAS entry points the cuda backend calls, loaded with dlopen on first use
 * instead of linked.
 *
 * Linking libcublas (which pulls in its half-gigabyte libcublasLt) costs every program ~215
 * MiB of resident memory and ~80 ms at start, whether or not it ever opens the cuda device,
 * and makes the programs fail to start on a machine without the CUDA libraries. So the
 * programs link these definitions instead: each has the prototype of cublas_v2.h (included, so
 * the compiler checks them), loads libcublas.so.13 on the first call (the program's run path,
 * then LD_LIBRARY_PATH and the loader's cache, then /usr/local/cuda/lib64) and forwards.
 * When it cannot be loaded, cublasCreate returns CUBLAS_STATUS_NOT_INITIALIZED and
 * cublasGetStatusString says why, which the backend reports as its open error.
 */
#include <cublas_v2.h>
#include <pthread.h>
#include <stdio.h>

#include "common/banned.h"
#include "common/dl_load.h"

#define CUBLAS_SONAME "libcublas.so.13"

static struct {
	pthread_once_t once;
	void *lib;
	char why[512];
	cublasStatus_t (*create)(cublasHandle_t *);
	cublasStatus_t (*destroy)(cublasHandle_t);
	cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
	cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t);
	const char *(*status_string)(cublasStatus_t);
	__typeof__(cublasSgemm_v2) *sgemm;
	__typeof__(cublasSgemmStridedBatched) *sgemm_sb;
	__typeof__(cublasGemmStridedBatchedEx) *gemm_sb_ex;
} api = {.once = PTHREAD_ONCE_INIT};

static void load(void)
{
	static const struct dl_sym sym[] = {
		{"cublasCreate_v2", (void **)&api.create},
		{"cublasDestroy_v2", (void **)&api.destroy},
		{"cublasSetStream_v2", (void **)&api.set_stream},
		{"cublasSetMathMode", (void **)&api.set_math_mode},
		{"cublasGetStatusString", (void **)&api.status_string},
		{"cublasSgemm_v2", (void **)&api.sgemm},
		{"cublasSgemmStridedBatched", (void **)&api.sgemm_sb},
		{"cublasGemmStridedBatchedEx", (void **)&api.gemm_sb_ex},
	};
	api.lib = dl_load(CUBLAS_SONAME, "/usr/local/cuda/lib64", sym, sizeof sym / sizeof sym[0],
			  api.why, sizeof api.why);
}

static int loaded(void)
{
	pthread_once(&api.once, load);
	return api.lib != NULL;
}

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle)
{
	return loaded() ? api.create(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle)
{
	return loaded() ? api.destroy(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream)
{
	return loaded() ? api.set_stream(handle, stream) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
	return loaded() ? api.set_math_mode(handle, mode) : CUBLAS_STATUS_NOT_INITIALIZED;
}

const char *cublasGetStatusString(cublasStatus_t status)
{
	return loaded() ? api.status_string(status) : api.why;
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
			      cublasOperation_t transb, int m, int n, int k, const float *alpha,
			      const float *A, int lda, const float *B, int ldb, const float *beta,
			      float *C, int ldc)
{
	if (!loaded())
		return CUBLAS_STATUS_NOT_INITIALIZED;
	return api.sgemm(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
					 cublasOperation_t transb, int m, int n, int k,
					 const float *alpha, const float *A, int lda,
					 long long int strideA, const float *B, int ldb,
					 long long int strideB, const float *beta, float *C, int ldc,
					 long long int strideC, int batchCount)
{
	if (!loaded())
		return CUBLAS_STATUS_NOT_INITIALIZED;
	return api.sgemm_sb(handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb,
			    strideB, beta, C, ldc, strideC, batchCount);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
					  cublasOperation_t transb, int m, int n, int k,
					  const void *alpha, const void *A, cudaDataType Atype,
					  int lda, long long int strideA, const void *B,
					  cudaDataType Btype, int ldb, long long int strideB,
					  const void *beta, void *C, cudaDataType Ctype, int ldc,
					  long long int strideC, int batchCount,
					  cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
	if (!loaded())
		return CUBLAS_STATUS_NOT_INITIALIZED;
	return api.gemm_sb_ex(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B,
			      Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount,
			      computeType, algo);
}
