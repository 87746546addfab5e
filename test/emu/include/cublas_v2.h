/* cublas_v2.h (test/emu) - the cuBLAS calls of kernels/, on the CPU (test/emu/emu.cpp).
 *
 * Column-major, as cuBLAS: C = alpha op(A) op(B) + beta C with op(A) m x k, op(B) k x n, C m x n,
 * element (i, j) of a matrix X with leading dimension ldx at X[i + j ldx]. A sum over k in
 * float, in order; beta == 0 means C is not read (NaN there does not leak in), alpha == 0 that
 * A and B are not. The checks of real cuBLAS give CUBLAS_STATUS_INVALID_VALUE (a leading
 * dimension below the rows it must span, a negative size); an operand outside the device
 * allocation it points into, or an output that overlaps an input, stops the program.
 */
#ifndef CORE_EMU_CUBLAS_V2_H
#define CORE_EMU_CUBLAS_V2_H

#include <cuda_runtime.h>

typedef enum {
	CUBLAS_STATUS_SUCCESS = 0,
	CUBLAS_STATUS_NOT_INITIALIZED = 1,
	CUBLAS_STATUS_ALLOC_FAILED = 3,
	CUBLAS_STATUS_INVALID_VALUE = 7,
	CUBLAS_STATUS_ARCH_MISMATCH = 8,
	CUBLAS_STATUS_MAPPING_ERROR = 11,
	CUBLAS_STATUS_EXECUTION_FAILED = 13,
	CUBLAS_STATUS_INTERNAL_ERROR = 14,
	CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;

typedef enum {
	CUBLAS_OP_N = 0,
	CUBLAS_OP_T = 1,
	CUBLAS_OP_C = 2,
} cublasOperation_t;

typedef enum {
	CUBLAS_DEFAULT_MATH = 0,
	CUBLAS_TENSOR_OP_MATH = 1,
	CUBLAS_PEDANTIC_MATH = 2,
	CUBLAS_TF32_TENSOR_OP_MATH = 3,
} cublasMath_t;

typedef struct cublasContext *cublasHandle_t;

/* library_types.h's and cublas_api.h's values */
typedef enum cudaDataType_t {
	CUDA_R_32F = 0,
	CUDA_R_16BF = 14,
} cudaDataType;

typedef enum {
	CUBLAS_COMPUTE_32F = 68,
	CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
} cublasComputeType_t;

typedef enum {
	CUBLAS_GEMM_DEFAULT = -1,
} cublasGemmAlgo_t;

extern "C" {
cublasStatus_t cublasCreate_v2(cublasHandle_t *handle);
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle);
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
const char *cublasGetStatusString(cublasStatus_t status);
cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
			      cublasOperation_t transb, int m, int n, int k, const float *alpha,
			      const float *A, int lda, const float *B, int ldb, const float *beta,
			      float *C, int ldc);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
					 cublasOperation_t transb, int m, int n, int k,
					 const float *alpha, const float *A, int lda,
					 long long int strideA, const float *B, int ldb,
					 long long int strideB, const float *beta, float *C,
					 int ldc, long long int strideC, int batchCount);
/* A and B both CUDA_R_32F or both CUDA_R_16BF, C CUDA_R_32F (the kinds kernels/ uses; others
 * are CUBLAS_STATUS_NOT_SUPPORTED). The bfloat16 values are exact in float; with
 * CUBLAS_COMPUTE_32F_FAST_TF32 each float32 operand is first rounded to TF32 (10 stored
 * mantissa bits, to nearest, ties away from zero: PTX's cvt.rna.tf32.f32). */
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
					  cublasOperation_t transb, int m, int n, int k,
					  const void *alpha, const void *A, cudaDataType Atype,
					  int lda, long long int strideA, const void *B,
					  cudaDataType Btype, int ldb, long long int strideB,
					  const void *beta, void *C, cudaDataType Ctype, int ldc,
					  long long int strideC, int batchCount,
					  cublasComputeType_t computeType, cublasGemmAlgo_t algo);
}

/* as the real header: the unsuffixed names are the _v2 entry points */
#define cublasCreate cublasCreate_v2
#define cublasDestroy cublasDestroy_v2
#define cublasSetStream cublasSetStream_v2
#define cublasSgemm cublasSgemm_v2

#endif
