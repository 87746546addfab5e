/* cuda_runtime.h (test/emu) - the part of CUDA C++ and of the CUDA runtime that kernels/ uses,
 * so that the cuda backend compiles as plain C++ and its kernels run on the CPU (test/emu/emu.cpp,
 * `make test-cuda-emu`). It checks the kernels' logic, not the GPU's floating point.
 *
 * A launch (CUDA_LAUNCH in kernels/cuda_common.cuh) becomes emu_launch(): the blocks of the grid
 * run one after another, each CUDA thread of a block a user-level thread with its own stack;
 * __syncthreads, __syncwarp and the shuffles are barriers at which a thread waits for the others
 * (emu.cpp). Since one block runs at a time, __shared__ variables are function statics, put in
 * one section that is poisoned (0xff bytes) before every block, like device memory from
 * cudaMalloc, so that a read of something never written shows. (GCC 12 drops the section of a
 * static in a function template, so those are not poisoned when built by g++; clang++ keeps it:
 * make CXX=clang++ test-cuda-emu.)
 *
 * Only what kernels/ needs is here, with CUDA's semantics; what is missing fails to compile, on
 * purpose. There is no atomicAdd on floats: the backend promises none (determinism).
 */
#ifndef CORE_EMU_CUDA_RUNTIME_H
#define CORE_EMU_CUDA_RUNTIME_H

#ifndef __cplusplus
#error "test/emu/include is for compiling kernels/*.cu as C++"
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

/* ---- CUDA C++ ------------------------------------------------------------------------------ */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __shared__ static __attribute__((section("emu_shared")))
/* __restrict__ is a GNU C++ keyword already, with the same meaning */

struct uint3 {
	unsigned x, y, z;
};

struct dim3 {
	unsigned x, y, z;
	constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

struct alignas(16) float4 {
	float x, y, z, w;
};

static inline float4 make_float4(float x, float y, float z, float w)
{
	return float4{x, y, z, w};
}

struct alignas(16) uint4 {
	unsigned x, y, z, w;
};

static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w)
{
	return uint4{x, y, z, w};
}

/* The running thread's indices, set by the scheduler whenever it resumes a thread. */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
static constexpr int warpSize = 32;

/* Device functions of CUDA's math library that are not C's. IEEE operations in C++ round
 * correctly, and the emulator is built with -ffp-contract=off, so a*b+c is never fused. */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }

static inline unsigned __umulhi(unsigned a, unsigned b)
{
	return (unsigned)(((unsigned long long)a * b) >> 32);
}

static inline unsigned __float_as_uint(float f)
{
	unsigned u;
	memcpy(&u, &f, sizeof u);
	return u;
}

static inline float __uint_as_float(unsigned u)
{
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

static inline int min(int a, int b) { return a < b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b)
{
	return a < b ? a : b;
}
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long max(unsigned long long a, unsigned long long b)
{
	return a > b ? a : b;
}

/* Integer atomics: one thread runs at a time and only a barrier switches threads, so a plain
 * read-modify-write is atomic. */
static inline int atomicAdd(int *p, int v)
{
	int o = *p;
	*p = o + v;
	return o;
}

static inline unsigned atomicAdd(unsigned *p, unsigned v)
{
	unsigned o = *p;
	*p = o + v;
	return o;
}

static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v)
{
	unsigned long long o = *p;
	*p = o + v;
	return o;
}

/* ---- barriers and shuffles (emu.cpp) ------------------------------------------------------
 * Exact CUDA semantics: every lane named in mask must reach the same intrinsic with the same
 * mask (else the emulator stops, naming the kernel); a lane reads the value of its source lane
 * at that call. __shfl_down_sync / __shfl_up_sync / __shfl_xor_sync: a source past the lane's
 * segment of width lanes gives the lane its own value. */

enum emu_shfl_mode { EMU_SHFL_IDX, EMU_SHFL_UP, EMU_SHFL_DOWN, EMU_SHFL_XOR };

void emu_syncthreads(void);
void emu_syncwarp(unsigned mask);
unsigned long long emu_shfl(unsigned mask, unsigned long long bits, int mode, int arg,
			    int width);

static inline void __syncthreads(void)
{
	emu_syncthreads();
}

static inline void __syncwarp(unsigned mask = 0xffffffffu)
{
	emu_syncwarp(mask);
}

template <typename T>
static inline T emu_shfl_t(unsigned mask, T v, int mode, int arg, int width)
{
	static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "8 bytes at most");
	unsigned long long b = 0;
	memcpy(&b, &v, sizeof v);
	b = emu_shfl(mask, b, mode, arg, width);
	T r;
	memcpy(&r, &b, sizeof r);
	return r;
}

template <typename T>
static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
	return emu_shfl_t(mask, v, EMU_SHFL_IDX, src, width);
}

template <typename T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
	return emu_shfl_t(mask, v, EMU_SHFL_UP, (int)delta, width);
}

template <typename T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
	return emu_shfl_t(mask, v, EMU_SHFL_DOWN, (int)delta, width);
}

template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
	return emu_shfl_t(mask, v, EMU_SHFL_XOR, lane_mask, width);
}

/* ---- the runtime ------------------------------------------------------------------------- */

enum cudaError {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
	cudaErrorInvalidConfiguration = 9,
	cudaErrorInvalidPitchValue = 12,
	cudaErrorInvalidMemcpyDirection = 21,
	cudaErrorInsufficientDriver = 35,
	cudaErrorNoDevice = 100,
	cudaErrorInvalidDevice = 101,
	cudaErrorInvalidResourceHandle = 400,
	cudaErrorNotReady = 600,
};
typedef enum cudaError cudaError_t;

/* cudaFuncSetAttribute: only the opt-in to more than 48 KiB of dynamic shared memory. */
enum cudaFuncAttribute {
	cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

enum cudaMemcpyKind {
	cudaMemcpyHostToHost = 0,
	cudaMemcpyHostToDevice = 1,
	cudaMemcpyDeviceToHost = 2,
	cudaMemcpyDeviceToDevice = 3,
	cudaMemcpyDefault = 4,
};

#define cudaStreamDefault 0x00u
#define cudaStreamNonBlocking 0x01u
#define cudaEventDefault 0x00u
#define cudaEventDisableTiming 0x02u

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;

struct cudaDeviceProp {
	char name[256];
	size_t totalGlobalMem;
	size_t sharedMemPerBlock;
	int warpSize;
	int maxThreadsPerBlock;
	int multiProcessorCount;
	int major, minor;
};

extern "C" {
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t error);

cudaError_t cudaMalloc(void **ptr, size_t bytes);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
			    cudaStream_t stream = 0);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
			      size_t width, size_t height, enum cudaMemcpyKind kind,
			      cudaStream_t stream = 0);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream = 0);

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *stream, unsigned flags, int priority);
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);
cudaError_t cudaDeviceSynchronize(void);

cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = 0);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
}

template <typename T>
static inline cudaError_t cudaMalloc(T **ptr, size_t bytes)
{
	return cudaMalloc((void **)ptr, bytes);
}

/* As CUDA's: a kernel's limit on the dynamic shared memory of its launches, from 48 KiB up to
 * what an sm_90 block may have (227 KiB); more is cudaErrorInvalidValue. */
cudaError_t emu_func_set_attribute(const void *func, enum cudaFuncAttribute attr, int value);
template <typename T>
static inline cudaError_t cudaFuncSetAttribute(T *func, enum cudaFuncAttribute attr, int value)
{
	return emu_func_set_attribute((const void *)func, attr, value);
}

/* ---- the emulator's side of a launch ----------------------------------------------------- */

/* Checks the launch at once, and stops the program, naming the kernel and where it was
 * launched, on a configuration a GPU would refuse (block of 0 or more than 1024 threads,
 * grid.y or grid.z past 65535, more dynamic shared memory than 48 KiB or the limit
 * cudaFuncSetAttribute gave func); then queues it on stream (emu_enqueue): call (one CUDA
 * thread's call of the kernel) runs for every thread of every block, and the program stops on
 * a deadlock, or a barrier or shuffle used against CUDA's rules. */
void emu_launch_fn(const char *kernel, const void *func, const char *file, int line, dim3 grid,
		   dim3 block, size_t smem, cudaStream_t stream, std::function<void()> call);

/* The arguments are evaluated and copied at the launch, as CUDA does, so that a launch queued
 * on a stream that runs later (CUDA_EMU_STREAMS=late-first, late-others) sees the values of the launch. */
template <typename K, typename... A>
static inline void emu_launch(const char *name, const void *func, const char *file, int line,
			      dim3 grid, dim3 block, size_t smem, cudaStream_t stream, K kernel,
			      A &&...args)
{
	emu_launch_fn(name, func, file, line, grid, block, smem, stream,
		      [kernel, t = std::make_tuple(std::decay_t<A>(std::forward<A>(args))...)] {
			      std::apply(kernel, t);
		      });
}

/* Work on stream: run now, or when something needs it (CUDA_EMU_STREAMS; emu.cpp, "streams and
 * events"). For the copies, sorts and transfers the emulator itself queues, after checking
 * their arguments. */
void emu_enqueue(cudaStream_t stream, std::function<void()> work);
/* For test/emu/selftest: CUDA_EMU_STREAMS from now on ("eager", "late-first", "late-others"),
 * after draining what is queued. */
void emu_streams_mode(const char *mode);

/* The running launch's dynamic shared memory (its smem bytes, poisoned before each block). */
void *emu_dyn_shared(void);

/* For the emulated NCCL (nccl_emu.cpp): 1 when [p, p + bytes) lies inside one device
 * allocation, and when s is a stream (or 0). */
int emu_is_device_range(const void *p, size_t bytes);
int emu_is_stream(cudaStream_t s);

#endif
