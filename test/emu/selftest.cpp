/* selftest.cpp - the emulator of test/emu against what CUDA, cuBLAS and CUB specify, before
 * test_backend trusts it with the cuda backend (make test-cuda-emu runs this first).
 *
 * Kernels written here for the purpose check the indices of every thread of a 3-D grid, the
 * block barrier, every shuffle (each mode, widths 32 and 8, 4- and 8-byte values, sources past
 * the segment), integer atomics and the poisoning of shared memory; host-side references check
 * cuBLAS's column-major products (each transpose, padding, alpha, beta 0 over NaN, batches) and
 * CUB's stable sort by a bit range (unsigned and signed keys). Then each misuse the emulator
 * promises to stop on is run in a child process, which must abort with the expected message:
 * a deadlock, __syncthreads after a return, a shuffle naming a lane that returned, a launch a
 * GPU refuses (more than 48 KiB of dynamic shared memory without cudaFuncSetAttribute's opt-in
 * for that kernel), a copy past an allocation. Exit status 1 and a line per failure otherwise.
 */
#include <cub/cub.cuh>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#define LAUNCH(kernel, grid, block, smem, ...)                                                  \
	emu_launch(#kernel, (const void *)(kernel), __FILE__, __LINE__, dim3(grid), dim3(block), \
		   smem, NULL, kernel, __VA_ARGS__)
#define LAUNCH_ON(stream, kernel, grid, block, ...)                                             \
	emu_launch(#kernel, (const void *)(kernel), __FILE__, __LINE__, dim3(grid), dim3(block), \
		   0, stream, kernel, __VA_ARGS__)

static int checks, failures;

#define CHECK(cond, ...)                                                                       \
	do {                                                                                   \
		checks++;                                                                      \
		if (!(cond)) {                                                                 \
			failures++;                                                            \
			fprintf(stderr, "selftest: %s:%d: ", __FILE__, __LINE__);              \
			fprintf(stderr, __VA_ARGS__);                                          \
			fputc('\n', stderr);                                                   \
		}                                                                              \
	} while (0)

template <typename T>
static T *dev(size_t n)
{
	void *p;
	if (cudaMalloc(&p, n * sizeof(T)) != cudaSuccess)
		abort();
	return (T *)p;
}

/* ---- indices, barrier, atomics, shared memory ----------------------------------------------- */

__global__ void k_ids(unsigned *out)
{
	const unsigned b = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
	const unsigned t = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
	const unsigned n = blockDim.x * blockDim.y * blockDim.z;
	out[b * n + t] += 1 + (b << 16 | t);
}

/* each thread reads its neighbour's value across a __syncthreads, twice, reusing the array */
__global__ void k_barrier(int *out)
{
	__shared__ int s[1024];
	const int t = (int)threadIdx.x, n = (int)blockDim.x;
	s[t] = t;
	__syncthreads();
	int a = s[(t + 1) % n];
	__syncthreads();
	s[t] = 2 * a;
	__syncthreads();
	out[blockIdx.x * n + t] = s[(t + n - 1) % n];
}

__global__ void k_count(const int *x, int n, unsigned *hist, unsigned long long *total)
{
	for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n;
	     i += (int)(gridDim.x * blockDim.x)) {
		atomicAdd(&hist[x[i]], 1u);
		atomicAdd(total, 1ull);
	}
}

/* what shared memory holds before the block writes it */
__global__ void k_shared_before(unsigned *out)
{
	__shared__ unsigned s[64];
	unsigned *d = (unsigned *)emu_dyn_shared();
	out[blockIdx.x * 2 * 64 + threadIdx.x] = s[threadIdx.x];
	out[blockIdx.x * 2 * 64 + 64 + threadIdx.x] = d[threadIdx.x];
	__syncthreads();
	s[threadIdx.x] = 7;
	d[threadIdx.x] = 7;
}

/* every thread writes and reads back its stride of n floats of dynamic shared memory */
__global__ void k_big_shared(float *out, int n)
{
	float *d = (float *)emu_dyn_shared();
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		d[i] = (float)i;
	__syncthreads();
	float s = 0.0f;
	for (int i = (threadIdx.x + 1) % blockDim.x; i < n; i += blockDim.x)
		s += d[i];
	out[threadIdx.x] = s;
}

static void test_threads(void)
{
	const dim3 grid(3, 2, 2), block(5, 3, 2);
	const unsigned nb = 12, nt = 30;
	unsigned *d = dev<unsigned>(nb * nt);
	cudaMemsetAsync(d, 0, sizeof(unsigned) * nb * nt);
	LAUNCH(k_ids, grid, block, 0, d);
	std::vector<unsigned> h(nb * nt);
	cudaMemcpyAsync(h.data(), d, sizeof(unsigned) * nb * nt, cudaMemcpyDeviceToHost);
	for (unsigned b = 0; b < nb; b++)
		for (unsigned t = 0; t < nt; t++)
			CHECK(h[b * nt + t] == 1 + (b << 16 | t),
			      "k_ids: block %u thread %u wrote %#x", b, t, h[b * nt + t]);
	cudaFree(d);

	for (int n : {1, 31, 96, 1024}) {
		int *o = dev<int>(3 * (size_t)n);
		LAUNCH(k_barrier, 3, n, 0, o);
		std::vector<int> r(3 * (size_t)n);
		cudaMemcpyAsync(r.data(), o, sizeof(int) * 3 * n, cudaMemcpyDeviceToHost);
		for (int b = 0; b < 3; b++)
			for (int t = 0; t < n; t++)
				CHECK(r[b * n + t] == 2 * t,
				      "k_barrier n=%d: block %d thread %d got %d", n, b, t,
				      r[b * n + t]);
		cudaFree(o);
	}

	const int n = 10007;
	std::vector<int> x(n);
	std::vector<unsigned> want(17, 0);
	for (int i = 0; i < n; i++)
		want[x[i] = (i * 7919) % 17]++;
	int *dx = dev<int>(n);
	unsigned *hist = dev<unsigned>(17);
	unsigned long long *tot = dev<unsigned long long>(1);
	cudaMemcpyAsync(dx, x.data(), sizeof(int) * n, cudaMemcpyHostToDevice);
	cudaMemsetAsync(hist, 0, sizeof(unsigned) * 17);
	cudaMemsetAsync(tot, 0, sizeof *tot);
	LAUNCH(k_count, 7, 128, 0, dx, n, hist, tot);
	std::vector<unsigned> got(17);
	unsigned long long total;
	cudaMemcpyAsync(got.data(), hist, sizeof(unsigned) * 17, cudaMemcpyDeviceToHost);
	cudaMemcpyAsync(&total, tot, sizeof total, cudaMemcpyDeviceToHost);
	CHECK(got == want && total == (unsigned long long)n, "k_count: atomicAdd lost counts");
	cudaFree(dx);
	cudaFree(hist);
	cudaFree(tot);

	unsigned *sh = dev<unsigned>(2 * 2 * 64);
	LAUNCH(k_shared_before, 2, 64, 64 * sizeof(unsigned), sh);
	std::vector<unsigned> s(2 * 2 * 64);
	cudaMemcpyAsync(s.data(), sh, sizeof(unsigned) * s.size(), cudaMemcpyDeviceToHost);
	for (size_t i = 0; i < s.size(); i++)
		CHECK(s[i] == 0xffffffffu, "k_shared_before: element %zu of block %zu is %#x, not "
		      "the poison (static and dynamic shared memory must be refilled per block)",
		      i % 128, i / 128, s[i]);
	cudaFree(sh);

	/* cudaFuncSetAttribute: 100 KiB once opted in; past sm_90's 227 KiB is an error */
	const int nbig = 100 * 1024 / 4;
	float *ob = dev<float>(64);
	CHECK(cudaFuncSetAttribute(k_big_shared, cudaFuncAttributeMaxDynamicSharedMemorySize,
				   228 * 1024) == cudaErrorInvalidValue,
	      "cudaFuncSetAttribute: 228 KiB of dynamic shared memory accepted");
	CHECK(cudaFuncSetAttribute(k_big_shared, cudaFuncAttributeMaxDynamicSharedMemorySize,
				   nbig * 4) == cudaSuccess,
	      "cudaFuncSetAttribute: 100 KiB of dynamic shared memory refused");
	LAUNCH(k_big_shared, 1, 64, (size_t)nbig * 4, ob, nbig);
	std::vector<float> hb(64);
	cudaMemcpyAsync(hb.data(), ob, sizeof(float) * 64, cudaMemcpyDeviceToHost);
	for (int t = 0; t < 64; t++) {
		double want = 0;
		for (int i = (t + 1) % 64; i < nbig; i += 64)
			want += i;
		CHECK(fabs(hb[t] - want) <= 1e-6 * want, "k_big_shared: thread %d read %g, not %g",
		      t, (double)hb[t], want);
	}
	cudaFree(ob);
}

/* ---- shuffles ------------------------------------------------------------------------------- */

/* out[i, t] for 14 shuffles i of thread t: xor 1 and 16, down 1 and 5 and 31, up 3, idx 7,
 * then width 8: xor 1, 4 and 8 (lanes 0-7 would read a later segment: their own value), down 1
 * and 5, up 3, idx 7; of an int 1000 t, and down 2 of a double t + 0.5 */
#define NSHFL 14
__global__ void k_shuffles(int *out, double *outd)
{
	const unsigned n = blockDim.x, t = threadIdx.x;
	const int v = 1000 * (int)t;
	const double w = t + 0.5;
	int r[NSHFL] = {
		__shfl_xor_sync(0xffffffffu, v, 1),     __shfl_xor_sync(0xffffffffu, v, 16),
		__shfl_down_sync(0xffffffffu, v, 1),    __shfl_down_sync(0xffffffffu, v, 5),
		__shfl_down_sync(0xffffffffu, v, 31),   __shfl_up_sync(0xffffffffu, v, 3),
		__shfl_sync(0xffffffffu, v, 7),         __shfl_xor_sync(0xffffffffu, v, 1, 8),
		__shfl_down_sync(0xffffffffu, v, 1, 8), __shfl_down_sync(0xffffffffu, v, 5, 8),
		__shfl_up_sync(0xffffffffu, v, 3, 8),   __shfl_sync(0xffffffffu, v, 7, 8),
		__shfl_xor_sync(0xffffffffu, v, 4, 8),  __shfl_xor_sync(0xffffffffu, v, 8, 8),
	};
	for (int i = 0; i < NSHFL; i++)
		out[i * n + t] = r[i];
	outd[t] = __shfl_down_sync(0xffffffffu, w, 2);
	__syncwarp();
}

static int shfl_src(int i, int lane)
{
	static const struct {
		char mode;
		int arg, width;
	} s[NSHFL] = {{'x', 1, 32}, {'x', 16, 32}, {'d', 1, 32}, {'d', 5, 32}, {'d', 31, 32},
		      {'u', 3, 32}, {'i', 7, 32}, {'x', 1, 8},   {'d', 1, 8},   {'d', 5, 8},
		      {'u', 3, 8},  {'i', 7, 8},  {'x', 4, 8},   {'x', 8, 8}};
	const int w = s[i].width, seg = lane / w * w, pos = lane % w, a = s[i].arg;
	switch (s[i].mode) {
	case 'x': return (lane ^ a) < seg + w ? lane ^ a : lane;
	case 'd': return pos + a < w ? lane + a : lane;
	case 'u': return pos >= a ? lane - a : lane;
	default: return seg + a % w;
	}
}

static void test_shuffles(void)
{
	const int n = 64;
	int *o = dev<int>(NSHFL * n);
	double *od = dev<double>(n);
	LAUNCH(k_shuffles, 1, n, 0, o, od);
	std::vector<int> r(NSHFL * n);
	std::vector<double> rd(n);
	cudaMemcpyAsync(r.data(), o, sizeof(int) * r.size(), cudaMemcpyDeviceToHost);
	cudaMemcpyAsync(rd.data(), od, sizeof(double) * n, cudaMemcpyDeviceToHost);
	for (int i = 0; i < NSHFL; i++)
		for (int t = 0; t < n; t++) {
			const int want = 1000 * (t / 32 * 32 + shfl_src(i, t % 32));
			CHECK(r[i * n + t] == want, "shuffle %d, thread %d: %d, want %d", i, t,
			      r[i * n + t], want);
		}
	for (int t = 0; t < n; t++) {
		const double want = (t % 32 + 2 < 32 ? t + 2 : t) + 0.5;
		CHECK(rd[t] == want, "double shuffle, thread %d: %g, want %g", t, rd[t], want);
	}
	cudaFree(o);
	cudaFree(od);
}

/* Runs fn with stderr sent to /dev/null: the emulator explains there each error code it
 * returns, and these are expected. */
template <typename F>
static void quietly(F fn)
{
	fflush(stderr);
	int saved = dup(2), null = open("/dev/null", O_WRONLY);
	dup2(null, 2);
	fn();
	dup2(saved, 2);
	close(null);
	close(saved);
}

/* ---- cuBLAS --------------------------------------------------------------------------------- */

static float urand(unsigned *s)
{
	*s = *s * 1664525u + 1013904223u;
	return (float)(*s >> 8) / 16777216.0f - 0.5f;
}

/* One product per batch of 3, m 5 n 7 k 3, every operand 2 rows longer than it needs (its
 * padding must come back as it was); beta 0 over a C of NaN, or 0.25. */
static void gemm_case(cublasHandle_t h, int ta, int tb, int beta0, unsigned *seed)
{
	const int m = 5, n = 7, k = 3, pad = 2, batch = 3;
	/* column-major: op(A) m x k, stored k x m when transposed */
	const int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
	const int lda = ar + pad, ldb = br + pad, ldc = m + pad;
	const long long sA = (long long)lda * ac, sB = (long long)ldb * bc, sC = (long long)ldc * n;
	std::vector<float> A(sA * batch), B(sB * batch), C(sC * batch), C0, C1(sC * batch);
	for (float &x : A)
		x = urand(seed);
	for (float &x : B)
		x = urand(seed);
	for (float &x : C)
		x = beta0 ? NAN : urand(seed);
	C0 = C;
	float *dA = dev<float>(A.size()), *dB = dev<float>(B.size()), *dC = dev<float>(C.size());
	cudaMemcpyAsync(dA, A.data(), 4 * A.size(), cudaMemcpyHostToDevice);
	cudaMemcpyAsync(dB, B.data(), 4 * B.size(), cudaMemcpyHostToDevice);
	cudaMemcpyAsync(dC, C.data(), 4 * C.size(), cudaMemcpyHostToDevice);
	const float alpha = -1.5f, beta = beta0 ? 0.0f : 0.25f;
	const cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
	const cublasOperation_t ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	cublasStatus_t s = cublasSgemmStridedBatched(h, oa, ob, m, n, k, &alpha, dA, lda, sA, dB,
						     ldb, sB, &beta, dC, ldc, sC, batch);
	CHECK(s == CUBLAS_STATUS_SUCCESS, "strided batched: status %d", s);
	cudaMemcpyAsync(C.data(), dC, 4 * C.size(), cudaMemcpyDeviceToHost);
	for (int b = 0; b < batch; b++)
		for (int j = 0; j < ldc * n; j++) {
			const int i = j % ldc, c = j / ldc;
			const float *a = &A[b * sA], *bb = &B[b * sB];
			const float got = C[b * sC + j], was = C0[b * sC + j];
			if (i >= m) {
				CHECK(memcmp(&got, &was, 4) == 0, "gemm: padding of C changed");
				continue;
			}
			double want = 0;
			for (int l = 0; l < k; l++)
				want += (double)a[ta ? l + i * lda : i + l * lda] *
					bb[tb ? c + l * ldb : l + c * ldb];
			want = alpha * want + (beta0 ? 0.0 : beta * was);
			CHECK(fabs(got - want) <= 1e-5,
			      "gemm ta=%d tb=%d beta=%g batch %d (%d,%d): %g, want %g", ta, tb,
			      beta, b, i, c, got, want);
		}
	/* cublasSgemm is batch 0 of the same */
	cudaMemcpyAsync(dC, C0.data(), 4 * C0.size(), cudaMemcpyHostToDevice);
	s = cublasSgemm(h, oa, ob, m, n, k, &alpha, dA, lda, dB, ldb, &beta, dC, ldc);
	cudaMemcpyAsync(C1.data(), dC, 4 * C1.size(), cudaMemcpyDeviceToHost);
	CHECK(s == CUBLAS_STATUS_SUCCESS && memcmp(C1.data(), C.data(), 4 * (size_t)sC) == 0 &&
	      memcmp(C1.data() + sC, C0.data() + sC, 4 * (size_t)sC) == 0,
	      "cublasSgemm differs from batch 0 of the batched product");
	/* a leading dimension short of the rows: an error, as in cuBLAS */
	quietly([&] {
		s = cublasSgemm(h, oa, ob, m, n, k, &alpha, dA, ar - 1, dB, ldb, &beta, dC, ldc);
	});
	CHECK(s == CUBLAS_STATUS_INVALID_VALUE, "lda < rows gave status %d", s);
	cudaFree(dA);
	cudaFree(dB);
	cudaFree(dC);
}

static void test_gemm(void)
{
	cublasHandle_t h;
	unsigned seed = 1;
	CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS, "cublasCreate");
	for (int ta = 0; ta < 2; ta++)
		for (int tb = 0; tb < 2; tb++)
			for (int beta0 = 0; beta0 < 2; beta0++)
				gemm_case(h, ta, tb, beta0, &seed);
	cublasDestroy(h);
}

/* ---- CUB ------------------------------------------------------------------------------------ */

template <typename K>
static void sort_case(const std::vector<K> &keys, int b0, int b1)
{
	const int n = (int)keys.size();
	std::vector<int> vals(n);
	for (int i = 0; i < n; i++)
		vals[i] = i;
	K *ki = dev<K>(n), *ko = dev<K>(n);
	int *vi = dev<int>(n), *vo = dev<int>(n);
	cudaMemcpyAsync(ki, keys.data(), sizeof(K) * n, cudaMemcpyHostToDevice);
	cudaMemcpyAsync(vi, vals.data(), sizeof(int) * n, cudaMemcpyHostToDevice);
	size_t bytes = 0;
	cub::DeviceRadixSort::SortPairs(NULL, bytes, (const K *)NULL, (K *)NULL, (const int *)NULL,
					(int *)NULL, n, b0, b1);
	char *tmp = dev<char>(bytes);
	size_t less = bytes - 1;
	cudaError_t e;
	quietly([&] { e = cub::DeviceRadixSort::SortPairs(tmp, less, ki, ko, vi, vo, n, b0, b1); });
	CHECK(e == cudaErrorInvalidValue, "a sort with less temp storage than asked did not fail");
	CHECK(cub::DeviceRadixSort::SortPairs(tmp, bytes, ki, ko, vi, vo, n, b0, b1) == cudaSuccess,
	      "sort failed");
	std::vector<K> gk(n);
	std::vector<int> gv(n);
	cudaMemcpyAsync(gk.data(), ko, sizeof(K) * n, cudaMemcpyDeviceToHost);
	cudaMemcpyAsync(gv.data(), vo, sizeof(int) * n, cudaMemcpyDeviceToHost);
	/* the reference: stable, by the bits of the key with the sign bit flipped */
	auto digit = [&](K k) {
		unsigned long long u = (unsigned long long)(std::make_unsigned_t<K>)k;
		if (std::is_signed_v<K>)
			u ^= 1ull << (8 * sizeof(K) - 1);
		return (u >> b0) & ((1ull << (b1 - b0)) - 1);
	};
	std::stable_sort(vals.begin(), vals.end(),
			 [&](int a, int b) { return digit(keys[a]) < digit(keys[b]); });
	bool ok = true;
	for (int i = 0; i < n; i++)
		ok &= gv[i] == vals[i] && gk[i] == keys[vals[i]];
	CHECK(ok, "SortPairs of %d %s keys by bits [%d, %d) is not the stable order", n,
	      std::is_signed_v<K> ? "signed" : "unsigned", b0, b1);
	cudaFree(ki);
	cudaFree(ko);
	cudaFree(vi);
	cudaFree(vo);
	cudaFree(tmp);
}

static void test_sort(void)
{
	std::vector<unsigned> u(1000);
	std::vector<int> s(1000);
	unsigned seed = 7;
	for (int i = 0; i < 1000; i++) {
		seed = seed * 1664525u + 1013904223u;
		u[i] = seed;
		s[i] = (int)(seed >> 3) - (1 << 28);
	}
	sort_case(u, 0, 3);
	sort_case(u, 0, 32);
	sort_case(u, 29, 32);
	sort_case(s, 0, 32);
	sort_case(s, 0, 5);
}

/* ---- what must stop the program --------------------------------------------------------- */

__global__ void k_deadlock(int *x)
{
	if (threadIdx.x % 32 < 16)
		__syncthreads();
	else
		x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

__global__ void k_return_then_sync(int *x)
{
	if (threadIdx.x == 5)
		return;
	__syncthreads();
	x[threadIdx.x] = 1;
}

__global__ void k_shfl_after_return(int *x)
{
	if (threadIdx.x % 32 >= 16)
		return;
	x[threadIdx.x] = __shfl_down_sync(0xffffffffu, (int)threadIdx.x, 1);
}

__global__ void k_nothing(int *x)
{
	x[0] = 0;
}

/* ---- streams and events (CUDA_EMU_STREAMS) ------------------------------------------------ */

__global__ void k_set(int *x, int n, int v)
{
	for (int i = (int)threadIdx.x; i < n; i += (int)blockDim.x)
		x[i] = v;
}

/* The end of a stream test: its memory, event and streams freed, eager again. */
static void streams_done(cudaStream_t s[2], cudaEvent_t e, int *x, int *y)
{
	cudaFree(x);
	cudaFree(y);
	cudaEventDestroy(e);
	cudaStreamDestroy(s[0]);
	cudaStreamDestroy(s[1]);
	emu_streams_mode("eager");
}

/* Stream a writes x (value v), stream b copies x to y, with or without waiting for a's event;
 * returns y[0] after the device is synchronized. a and b: 0 the older stream, 1 the newer. */
static int two_streams(const char *mode, int writer, int wait, int v)
{
	emu_streams_mode(mode);
	cudaStream_t s[2];
	cudaEvent_t e;
	cudaStreamCreateWithFlags(&s[0], cudaStreamNonBlocking);
	cudaStreamCreateWithFlags(&s[1], cudaStreamNonBlocking);
	cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
	int *x = dev<int>(64), *y = dev<int>(64), h = -1;
	cudaMemsetAsync(x, 0, 64 * sizeof(int), s[writer]);
	cudaDeviceSynchronize();
	LAUNCH_ON(s[writer], k_set, 1, 32, x, 64, v);
	cudaEventRecord(e, s[writer]);
	if (wait)
		cudaStreamWaitEvent(s[!writer], e, 0);
	cudaMemcpyAsync(y, x, 64 * sizeof(int), cudaMemcpyDeviceToDevice, s[!writer]);
	cudaDeviceSynchronize(); /* both streams, in the mode's order */
	cudaMemcpyAsync(&h, y + 63, sizeof h, cudaMemcpyDeviceToHost, s[!writer]);
	streams_done(s, e, x, y);
	return h;
}

static void test_streams(void)
{
	static const char *const modes[] = {"eager", "late-first", "late-others"};
	/* with the wait, every mode and either writer: the copy sees the write */
	for (int m = 0; m < 3; m++)
		for (int w = 0; w < 2; w++)
			CHECK(two_streams(modes[m], w, 1, 5) == 5,
			      "%s, writer stream %d, with the wait: the copy missed the write",
			      modes[m], w);
	/* without it, eager hides the missing dependency; for each writer one of the late modes
	 * runs the copy first, so it shows */
	for (int w = 0; w < 2; w++) {
		CHECK(two_streams("eager", w, 0, 5) == 5, "eager, writer %d: not in call order", w);
		int shown = (two_streams("late-first", w, 0, 5) != 5) +
			    (two_streams("late-others", w, 0, 5) != 5);
		CHECK(shown == 1, "writer stream %d without the wait: shown in %d of the 2 late "
		      "modes, want 1", w, shown);
	}

	/* late-first: launch arguments and host sources are taken at the call; the event's stream
	 * is drained exactly up to the record; cudaEventQuery tells what has run */
	emu_streams_mode("late-first");
	cudaStream_t s[2];
	cudaEvent_t e;
	cudaStreamCreateWithFlags(&s[0], cudaStreamNonBlocking);
	cudaStreamCreateWithFlags(&s[1], cudaStreamNonBlocking);
	cudaEventCreate(&e);
	int *x = dev<int>(64), *y = dev<int>(64), h[64];
	int v = 1;
	for (int i = 0; i < 64; i++)
		h[i] = 3;
	cudaMemcpyAsync(x, h, sizeof h, cudaMemcpyHostToDevice, s[0]);
	h[40] = 4; /* after the call: not copied */
	LAUNCH_ON(s[0], k_set, 1, 32, y, 64, v);
	v = 2;
	cudaEventRecord(e, s[0]);
	CHECK(cudaEventQuery(e) == cudaErrorNotReady, "late-first: an event queued behind work is ready");
	LAUNCH_ON(s[0], k_set, 1, 32, x, 32, v); /* after the record */
	cudaStreamWaitEvent(s[1], e, 0);
	cudaMemcpyAsync(y + 32, x, 32 * sizeof(int), cudaMemcpyDeviceToDevice, s[1]);
	cudaStreamSynchronize(s[1]);
	CHECK(cudaEventQuery(e) == cudaSuccess, "late-first: a reached event is not ready");
	cudaMemcpyAsync(h, y, sizeof h, cudaMemcpyDeviceToHost, s[1]);
	CHECK(h[0] == 1 && h[31] == 1, "late-first: the launch saw %d, not its argument at the call",
	      h[0]);
	CHECK(h[32] == 3 && h[63] == 3, "late-first: the waiting stream saw %d, not what the "
	      "event's stream held at the record (3)", h[32]);
	cudaMemcpyAsync(h, x, sizeof h, cudaMemcpyDeviceToHost, s[0]);
	CHECK(h[0] == 2 && h[40] == 3, "late-first: x holds %d %d, want 2 3 (the copy took the host "
	      "buffer at the call)", h[0], h[40]);
	/* synchronizing one stream runs that stream's work and what it waits for, no more */
	LAUNCH_ON(s[0], k_set, 1, 32, y, 64, 7);
	cudaEventRecord(e, s[0]);
	cudaStreamSynchronize(s[1]);
	CHECK(cudaEventQuery(e) == cudaErrorNotReady, "late-first: synchronizing one stream ran "
	      "another's work");
	cudaEventSynchronize(e);
	CHECK(cudaEventQuery(e) == cudaSuccess,
	      "late-first: cudaEventSynchronize left it unreached");
	streams_done(s, e, x, y);
}

/* Runs fn in a child, which must abort with a message containing want. */
template <typename F>
static void must_stop(const char *what, const char *want, F fn)
{
	int fd[2];
	checks++;
	if (pipe(fd) != 0)
		abort();
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		dup2(fd[1], 2);
		close(fd[0]);
		fn();
		_exit(0);
	}
	close(fd[1]);
	std::string msg;
	char buf[512];
	ssize_t r;
	while ((r = read(fd[0], buf, sizeof buf)) > 0)
		msg.append(buf, (size_t)r);
	close(fd[0]);
	int st = 0;
	waitpid(pid, &st, 0);
	if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGABRT || msg.find(want) == std::string::npos) {
		failures++;
		fprintf(stderr, "selftest: %s: want an abort saying '%s', got status %#x and "
			"'%s'\n", what, want, st, msg.c_str());
	}
}

static void test_misuse(void)
{
	int *x = dev<int>(1024);
	must_stop("deadlock", "deadlock", [&] { LAUNCH(k_deadlock, 1, 64, 0, x); });
	must_stop("__syncthreads after a return", "every thread of the block must reach it",
		  [&] { LAUNCH(k_return_then_sync, 1, 64, 0, x); });
	must_stop("a shuffle naming a returned lane", "every lane named must reach it",
		  [&] { LAUNCH(k_shfl_after_return, 1, 32, 0, x); });
	must_stop("a block of 1025 threads", "1 to 1024 threads",
		  [&] { LAUNCH(k_nothing, 1, 1025, 0, x); });
	must_stop("grid.y 65536", "y and z 1 to 65535",
		  [&] { LAUNCH(k_nothing, dim3(1, 65536), 32, 0, x); });
	must_stop("49 KiB of dynamic shared memory", "dynamic shared memory",
		  [&] { LAUNCH(k_nothing, 1, 32, 49 * 1024, x); });
	must_stop("49 KiB of dynamic shared memory after a limit set for another kernel",
		  "dynamic shared memory", [&] {
			  cudaFuncSetAttribute(k_deadlock,
					       cudaFuncAttributeMaxDynamicSharedMemorySize,
					       64 * 1024);
			  LAUNCH(k_nothing, 1, 32, 49 * 1024, x);
		  });
	must_stop("a copy past an allocation", "past the end of its allocation",
		  [&] { cudaMemcpyAsync(x + 600, x, 2048, cudaMemcpyDeviceToDevice); });
	must_stop("the legacy stream beside a non-blocking one, late", "CUDA does not order", [&] {
		emu_streams_mode("late-first");
		cudaStream_t st;
		cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
		LAUNCH(k_nothing, 1, 32, 0, x);
	});
	cudaFree(x);
}

int main(void)
{
	test_threads();
	test_shuffles();
	test_gemm();
	test_sort();
	test_streams();
	test_misuse();
	if (failures) {
		fprintf(stderr, "selftest: %d of %d checks of the emulator FAILED\n", failures,
			checks);
		return 1;
	}
	fprintf(stderr, "test/emu selftest: %d checks of the emulator against CUDA's, cuBLAS's and "
		"CUB's semantics passed\n", checks);
	return 0;
}
