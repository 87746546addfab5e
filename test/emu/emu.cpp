/* emu.cpp - the CUDA runtime, the cuBLAS calls and the CUB sort of kernels/, on the CPU, so that
 * `make test-cuda-emu` runs the cuda backend's real kernel code through test/unit/test_backend.c
 * on a machine with neither nvcc nor a GPU. It checks the kernels' logic (indexing, reductions,
 * barriers, shuffles, workspace carving, cuBLAS arguments), not the GPU's floating point: the
 * kernels are compiled by the host compiler with glibc's libm and no contraction.
 *
 * Scheduling. A launch runs its blocks one at a time. Each CUDA thread of the block is a
 * user-level thread with its own stack (taken from a pool on its first run, returned when it
 * finishes, so a kernel without barriers runs on one warm stack). A thread runs until it
 * finishes or reaches a barrier: __syncthreads for the block, __syncwarp or a shuffle for the
 * lanes of its warp named in the mask; the last to arrive releases the others. One warp at a
 * time runs, its lanes in turn, until none of them can go on; then another warp: so a warp
 * runs ahead of the others as far as the barriers let it, as on a GPU, and a missing barrier
 * between one warp's writes and another's reads shows. When nothing can run and threads are
 * left, it is a deadlock: the program stops, naming the kernel and who waits where. A switch
 * is a few instructions (x86-64: the callee-saved registers, the stack pointer, MXCSR and the
 * x87 control word, as the SysV ABI has a callee keep them); glibc's swapcontext, the fallback
 * elsewhere (or with -DCUDA_EMU_UCONTEXT), makes a system call per switch: about 9 times
 * slower on test_backend.
 *
 * Order. A GPU runs blocks and warps in no fixed order. By default each launch runs its blocks
 * in a permuted order, and at each turn picks the next warp of a block and the lane to start
 * from, pseudo-randomly from the launch's number in the process: the program is deterministic,
 * yet the same op run twice (test_backend's aligned and misaligned runs, its thread counts)
 * sees other orders, and a result that depends on the order (a race) breaks its same-bits
 * check. CUDA_EMU_ORDER=fixed runs blocks, warps and lanes in index order, to tell such a race
 * from another difference.
 *
 * CUDA's rules are checked, not assumed: a launch a GPU would refuse, __syncthreads after a
 * thread of the block returned (or a return while others wait there), a warp collective whose
 * mask leaves out the caller, names lanes that returned or do not exist, or that the lanes
 * reach with different masks or intrinsics, a shuffle reading a lane outside the mask. Memory
 * from cudaMalloc, shared memory before each block and freed memory are filled with 0xff bytes
 * (NaN, -1), so a read of something never written shows in the results. Copies, memsets, cuBLAS
 * operands and CUB's buffers must lie inside one device allocation and outputs must not overlap
 * inputs. Accesses by the kernels themselves are checked when built with SAN=1 (ASan, UBSan:
 * out of bounds, a misaligned float4).
 *
 * Environment: CUDA_EMU_ORDER=fixed (above); CUDA_EMU_SMS=N multiprocessors (default 4; grid
 * sizes of grid-stride loops follow it); CUDA_EMU_NO_DEVICE=1: cudaGetDeviceCount finds no GPU;
 * CUDA_EMU_STATS=1: at exit, per kernel, launches, threads, switches and seconds, on stderr;
 * CUDA_EMU_STREAMS=eager|late-first|late-others: when queued work runs ("streams and
 * events").
 */
#include <cub/cub.cuh>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#if defined(__x86_64__) && !defined(CUDA_EMU_UCONTEXT)
#define EMU_ASM_SWITCH 1
#else
#define EMU_ASM_SWITCH 0
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifndef EMU_ASAN
#define EMU_ASAN 0
#endif
#if EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

#define MAX_THREADS 1024
#define MAX_DYN_SHARED (48 * 1024)
#define MAX_DYN_SHARED_OPT_IN (227 * 1024) /* sm_90's per block */
#define POISON 0xff

/* ---- settings ------------------------------------------------------------------------------ */

static struct {
	int read;
	int fixed_order, sms, no_device, stats;
	int lazy; /* CUDA_EMU_STREAMS: 0 eager, 1 late-first, 2 late-others */
} cfg;

static int env_int(const char *name, int dflt, int lo, int hi)
{
	const char *s = getenv(name);
	if (!s || !*s)
		return dflt;
	char *end;
	long v = strtol(s, &end, 10);
	if (*end || v < lo || v > hi) {
		fprintf(stderr, "cuda-emu: %s='%s' is not a number in [%d, %d]\n", name, s, lo, hi);
		abort();
	}
	return (int)v;
}

static void stats_print(void);

static void settings(void)
{
	if (cfg.read)
		return;
	cfg.read = 1;
	const char *o = getenv("CUDA_EMU_ORDER");
	if (o && *o && strcmp(o, "fixed") != 0 && strcmp(o, "shuffled") != 0) {
		fprintf(stderr, "cuda-emu: CUDA_EMU_ORDER='%s': 'fixed' or 'shuffled'\n", o);
		abort();
	}
	cfg.fixed_order = o && strcmp(o, "fixed") == 0;
	cfg.sms = env_int("CUDA_EMU_SMS", 4, 1, 1024);
	cfg.no_device = env_int("CUDA_EMU_NO_DEVICE", 0, 0, 1);
	cfg.stats = env_int("CUDA_EMU_STATS", 0, 0, 1);
	const char *st = getenv("CUDA_EMU_STREAMS");
	if (st && *st && strcmp(st, "eager") != 0 && strcmp(st, "late-first") != 0 &&
	    strcmp(st, "late-others") != 0) {
		fprintf(stderr, "cuda-emu: CUDA_EMU_STREAMS='%s': 'eager', 'late-first' or "
			"'late-others'\n", st);
		abort();
	}
	cfg.lazy = !st || !*st || strcmp(st, "eager") == 0 ? 0
		   : strcmp(st, "late-first") == 0	 ? 1
							 : 2;
	if (cfg.stats)
		atexit(stats_print);
}

/* ---- the running launch, and stopping with a message that names it -------------------------- */

static struct {
	int active;
	const char *kernel, *file;
	int line;
	dim3 grid, block;
	size_t smem;
	cudaStream_t stream;
	void (*body)(void *);
	void *arg;
	unsigned nthreads;
	char *dyn; /* dynamic shared memory */
} L;

[[noreturn]] __attribute__((format(printf, 1, 2))) static void die(const char *fmt, ...)
{
	va_list ap;
	fflush(stdout);
	fputs("cuda-emu: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	if (L.active)
		fprintf(stderr, "\n  in kernel %s launched at %s:%d, grid (%u,%u,%u) "
			"block (%u,%u,%u), dynamic shared %zu; at block (%u,%u,%u) thread "
			"(%u,%u,%u)", L.kernel, L.file, L.line, L.grid.x, L.grid.y, L.grid.z,
			L.block.x, L.block.y, L.block.z, L.smem, blockIdx.x, blockIdx.y, blockIdx.z,
			threadIdx.x, threadIdx.y, threadIdx.z);
	fputc('\n', stderr);
	abort();
}

/* A check of an API's arguments that real CUDA or cuBLAS answers with an error code: said on
 * stderr (the backend's own message may not name the argument), then returned. */
__attribute__((format(printf, 1, 2))) static void warn(const char *fmt, ...)
{
	va_list ap;
	fputs("cuda-emu: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* ---- device memory ----------------------------------------------------------------------- */

static std::map<uintptr_t, size_t> allocs; /* base -> bytes asked for */

/* The allocation holding p, or allocs.end(). */
static std::map<uintptr_t, size_t>::const_iterator alloc_of(const void *p)
{
	uintptr_t a = (uintptr_t)p;
	auto it = allocs.upper_bound(a);
	if (it == allocs.begin())
		return allocs.end();
	--it;
	return a < it->first + (it->second ? it->second : 1) ? it : allocs.end();
}

static bool is_device(const void *p)
{
	return alloc_of(p) != allocs.end();
}

/* Stops unless [p, p + bytes) lies inside one allocation (bytes > 0). */
static void need_device(const void *p, size_t bytes, const char *what)
{
	auto it = alloc_of(p);
	if (it == allocs.end())
		die("%s: %p (%zu bytes) is not device memory", what, p, bytes);
	if ((uintptr_t)p + bytes > it->first + it->second)
		die("%s: [%p, +%zu bytes) runs %zu bytes past the end of its allocation [%p, +%zu)",
		    what, p, bytes, (size_t)((uintptr_t)p + bytes - it->first - it->second),
		    (void *)it->first, it->second);
}

static bool overlap(const void *a, size_t na, const void *b, size_t nb)
{
	uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
	return na && nb && x < y + nb && y < x + na;
}

/* ---- streams and events ------------------------------------------------------------------
 * CUDA_EMU_STREAMS=eager (the default): work queued on a stream runs when it is queued, so every
 * stream is in call order with every other. That hides a missing dependency between two
 * streams, which the two other modes show. late-first: work queued on the first stream made
 * (the oldest one alive: the cuda backend's own, in a process with one backend) waits in the
 * stream's queue until something needs it, and no more of it runs than is needed: work of
 * another stream that waits for one of its events (cudaStreamWaitEvent) runs it exactly up to
 * where the event was recorded; the host runs it to the end by synchronizing that stream,
 * destroying it or copying from it to host memory, up to an event by synchronizing the event,
 * and every stream to its end by cudaDeviceSynchronize or cudaFree. Work on every other stream
 * runs when it is queued, after pulling what it waits for. late-others: the reverse (the
 * first stream at once, the others when needed). So in one mode or the other, work that reads
 * what another stream writes without waiting for that stream's event runs before the write,
 * and shows in the results (memory never written is poisoned), work that overwrites what
 * another stream still reads runs before the read, and a host that waits for one stream where
 * it needed two sees the other's work undone. Launch arguments, host sources of copies and the
 * scalars of cuBLAS are taken when the work is queued, as CUDA takes them. cudaEventQuery
 * answers cudaErrorNotReady for an event whose stream has not run that far (and a late
 * stream runs only when waited for: a loop polling an event would never end). The legacy
 * stream 0 is ordered with every stream here, which it is not with the non-blocking streams
 * of the backend: work on it while such a stream exists stops the program in the late modes.
 * The emulated NCCL's transfers run when their stream's work does, so in the late modes the
 * ranks of a communicator must wait for the device at the same points (as the programs do),
 * or one rank's transfers wait for the other's forever. */

struct work {
	std::function<void()> run; /* empty: a wait */
	cudaStream_t wait_s;       /* a wait: for wait_s to have run wait_n items */
	uint64_t wait_n;
};
struct CUstream_st {
	unsigned flags;
	std::deque<work> q;
	uint64_t queued, done; /* items queued and run so far */
	int draining;
};
struct CUevent_st {
	int recorded;
	unsigned flags;
	cudaStream_t s; /* where it was last recorded, and the stream's queued count then */
	uint64_t n;
};
static std::set<cudaStream_t> streams;
static std::vector<cudaStream_t> stream_order; /* as they were made */
static std::set<cudaEvent_t> events;

static bool stream_ok(cudaStream_t s)
{
	return !s || streams.count(s);
}

/* Run s's queue until it has run n items. */
static void drain_to(cudaStream_t s, uint64_t n)
{
	if (!s)
		return;
	if (s->done >= n)
		return;
	if (s->draining) /* cannot happen: a wait names work queued before it */
		die("two streams wait for each other: the wait can never be met");
	s->draining = 1;
	while (s->done < n) {
		work w = std::move(s->q.front());
		s->q.pop_front();
		if (w.run)
			w.run();
		else
			drain_to(w.wait_s, w.wait_n);
		s->done++;
	}
	s->draining = 0;
}

/* Is work on s run when it is queued? */
static bool runs_at_once(cudaStream_t s)
{
	return !cfg.lazy || !s || (s == stream_order[0]) == (cfg.lazy == 2);
}

static void drain_all(void)
{
	if (!cfg.lazy)
		return;
	for (cudaStream_t s : stream_order)
		drain_to(s, s->queued);
}

/* The legacy stream in a late mode: CUDA orders it with the blocking streams only. */
static void legacy_use(const char *what)
{
	for (cudaStream_t s : stream_order)
		if (s->flags & cudaStreamNonBlocking)
			die("%s on the legacy stream 0 while the non-blocking stream %p exists: "
			    "CUDA does not order the two (CUDA_EMU_STREAMS=%s)", what, (void *)s,
			    cfg.lazy == 1 ? "late-first" : "late-others");
	drain_all();
}

void emu_enqueue(cudaStream_t s, std::function<void()> fn)
{
	settings();
	if (!cfg.lazy) {
		fn();
		return;
	}
	if (!s) { /* the legacy stream: after everything (no non-blocking stream exists) */
		legacy_use("work");
		fn();
		return;
	}
	s->q.push_back(work{std::move(fn), NULL, 0});
	s->queued++;
	if (runs_at_once(s))
		drain_to(s, s->queued);
}

void emu_streams_mode(const char *mode)
{
	settings();
	drain_all();
	cfg.lazy = strcmp(mode, "late-first") == 0 ? 1 : strcmp(mode, "late-others") == 0 ? 2 : 0;
}

/* ---- the runtime ------------------------------------------------------------------------- */

extern "C" {

cudaError_t cudaGetDeviceCount(int *count)
{
	settings();
	*count = cfg.no_device ? 0 : 1;
	return cfg.no_device ? cudaErrorNoDevice : cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
	settings();
	return device == 0 && !cfg.no_device ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
	settings();
	if (device != 0 || cfg.no_device)
		return cudaErrorInvalidDevice;
	memset(prop, 0, sizeof *prop);
	snprintf(prop->name, sizeof prop->name, "CPU emulation (test/emu), %d SMs", cfg.sms);
	prop->totalGlobalMem = (size_t)16 << 30;
	prop->sharedMemPerBlock = MAX_DYN_SHARED;
	prop->warpSize = 32;
	prop->maxThreadsPerBlock = MAX_THREADS;
	prop->multiProcessorCount = cfg.sms;
	prop->major = 9;
	prop->minor = 0;
	return cudaSuccess;
}

/* A launch the GPU would refuse stops the program instead, so there is never an error to
 * return here. */
cudaError_t cudaGetLastError(void)
{
	return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t error)
{
	switch (error) {
	case cudaSuccess: return "no error";
	case cudaErrorInvalidValue: return "invalid argument";
	case cudaErrorMemoryAllocation: return "out of memory";
	case cudaErrorInvalidConfiguration: return "invalid configuration argument";
	case cudaErrorInvalidPitchValue: return "invalid pitch argument";
	case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
	case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient";
	case cudaErrorNoDevice: return "no CUDA-capable device is detected";
	case cudaErrorInvalidDevice: return "invalid device ordinal";
	case cudaErrorInvalidResourceHandle: return "invalid resource handle";
	case cudaErrorNotReady: return "device not ready";
	}
	return "unknown error";
}

/* 256-byte aligned as cudaMalloc's, filled with 0xff bytes: device memory starts undefined. */
cudaError_t cudaMalloc(void **ptr, size_t bytes)
{
	*ptr = NULL;
	if (L.active)
		die("cudaMalloc inside a kernel");
	if (!bytes)
		return cudaSuccess;
	size_t rounded = (bytes + 255) & ~(size_t)255;
	if (rounded < bytes)
		return cudaErrorMemoryAllocation;
	void *p = aligned_alloc(256, rounded);
	if (!p)
		return cudaErrorMemoryAllocation;
	memset(p, POISON, rounded);
	allocs[(uintptr_t)p] = bytes;
	*ptr = p;
	return cudaSuccess;
}

cudaError_t cudaFree(void *ptr)
{
	if (L.active)
		die("cudaFree inside a kernel");
	if (!ptr)
		return cudaSuccess;
	drain_all(); /* cudaFree waits for the device */
	auto it = allocs.find((uintptr_t)ptr);
	if (it == allocs.end()) {
		warn("cudaFree(%p): not the start of a device allocation", ptr);
		return cudaErrorInvalidValue;
	}
	memset(ptr, POISON, it->second); /* a later read of it shows, until it is reused */
	allocs.erase(it);
	free(ptr);
	return cudaSuccess;
}

/* A copy to host memory returns when it is done (as CUDA's to pageable memory does), after
 * the work queued before it; a copy from host memory takes the source when it is called. */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
			    cudaStream_t stream)
{
	if (!stream_ok(stream)) {
		warn("cudaMemcpyAsync: %p is not a stream", (void *)stream);
		return cudaErrorInvalidResourceHandle;
	}
	if (!bytes)
		return cudaSuccess;
	const bool dd = is_device(dst), sd = is_device(src);
	static const char *const kname[] = {"HostToHost", "HostToDevice", "DeviceToHost",
					    "DeviceToDevice", "Default"};
	bool want_dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
	bool want_sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
	if ((unsigned)kind > cudaMemcpyDefault)
		return cudaErrorInvalidMemcpyDirection;
	if (kind != cudaMemcpyDefault && (dd != want_dd || sd != want_sd)) {
		warn("cudaMemcpyAsync(%p, %p, %zu, cudaMemcpy%s): the destination is %s memory, "
		     "the source %s memory", dst, src, bytes, kname[kind], dd ? "device" : "host",
		     sd ? "device" : "host");
		return cudaErrorInvalidValue;
	}
	if (dd)
		need_device(dst, bytes, "cudaMemcpyAsync destination");
	if (sd)
		need_device(src, bytes, "cudaMemcpyAsync source");
	if (overlap(dst, bytes, src, bytes))
		die("cudaMemcpyAsync(%p, %p, %zu): the ranges overlap", dst, src, bytes);
	if (!dd) { /* after the stream's work before it, no more */
		settings();
		if (stream)
			drain_to(stream, stream->queued);
		else if (cfg.lazy)
			legacy_use("a copy to host memory");
		memcpy(dst, src, bytes);
	} else if (!sd) {
		std::vector<char> h((const char *)src, (const char *)src + bytes);
		emu_enqueue(stream, [dst, h = std::move(h)] { memcpy(dst, h.data(), h.size()); });
	} else {
		emu_enqueue(stream, [=] { memcpy(dst, src, bytes); });
	}
	return cudaSuccess;
}

/* Device to device only (what kernels/ asks for); every row inside one allocation on each
 * side, no row of the destination overlapping a row of the source. */
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
			      size_t width, size_t height, enum cudaMemcpyKind kind,
			      cudaStream_t stream)
{
	if (!stream_ok(stream)) {
		warn("cudaMemcpy2DAsync: %p is not a stream", (void *)stream);
		return cudaErrorInvalidResourceHandle;
	}
	if (kind != cudaMemcpyDeviceToDevice) {
		warn("cudaMemcpy2DAsync: kind %d: the emulator has device to device only", kind);
		return cudaErrorInvalidMemcpyDirection;
	}
	if (dpitch < width || spitch < width) {
		warn("cudaMemcpy2DAsync: pitches %zu and %zu below the width %zu", dpitch, spitch,
		     width);
		return cudaErrorInvalidPitchValue;
	}
	if (!width || !height)
		return cudaSuccess;
	const size_t dspan = (height - 1) * dpitch + width, sspan = (height - 1) * spitch + width;
	need_device(dst, dspan, "cudaMemcpy2DAsync destination");
	need_device(src, sspan, "cudaMemcpy2DAsync source");
	for (size_t i = 0; i < height; i++)
		for (size_t j = 0; overlap(dst, dspan, src, sspan) && j < height; j++)
			if (overlap((char *)dst + i * dpitch, width, (const char *)src + j * spitch,
				    width))
				die("cudaMemcpy2DAsync: row %zu of the destination overlaps row %zu "
				    "of the source", i, j);
	emu_enqueue(stream, [=] {
		for (size_t i = 0; i < height; i++)
			memcpy((char *)dst + i * dpitch, (const char *)src + i * spitch, width);
	});
	return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream)
{
	if (!stream_ok(stream)) {
		warn("cudaMemsetAsync: %p is not a stream", (void *)stream);
		return cudaErrorInvalidResourceHandle;
	}
	if (!bytes)
		return cudaSuccess;
	if (!is_device(dst)) {
		warn("cudaMemsetAsync(%p, %d, %zu): not device memory", dst, value, bytes);
		return cudaErrorInvalidValue;
	}
	need_device(dst, bytes, "cudaMemsetAsync");
	emu_enqueue(stream, [=] { memset(dst, value, bytes); });
	return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags)
{
	*stream = new CUstream_st{flags, {}, 0, 0, 0};
	streams.insert(*stream);
	stream_order.push_back(*stream);
	return cudaSuccess;
}

/* Priorities as an sm_90's (0 least, -5 greatest); they change nothing here. */
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
	*least = 0;
	*greatest = -5;
	return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *stream, unsigned flags, int priority)
{
	if (priority < -5 || priority > 0)
		return cudaErrorInvalidValue;
	return cudaStreamCreateWithFlags(stream, flags);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
	if (!stream || !streams.count(stream))
		return cudaErrorInvalidResourceHandle;
	drain_to(stream, stream->queued); /* its work still runs, as on a GPU */
	for (cudaStream_t o : stream_order) /* waits for it are met now */
		for (work &w : o->q)
			if (w.wait_s == stream)
				w.wait_s = NULL;
	streams.erase(stream);
	stream_order.erase(std::find(stream_order.begin(), stream_order.end(), stream));
	for (cudaEvent_t e : events)
		if (e->s == stream)
			e->s = NULL; /* reached: its stream ran everything */
	delete stream;
	return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
	if (!stream_ok(stream))
		return cudaErrorInvalidResourceHandle;
	settings();
	if (stream)
		drain_to(stream, stream->queued); /* that stream and what it waits for, no more */
	else if (cfg.lazy)
		legacy_use("cudaStreamSynchronize");
	return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
	drain_all();
	return cudaSuccess;
}

/* Work queued on stream after this waits until the event's stream has run what was queued
 * on it before the event's last record (nothing: an event never recorded). */
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags)
{
	if (!stream_ok(stream) || !events.count(event))
		return cudaErrorInvalidResourceHandle;
	if (flags)
		return cudaErrorInvalidValue;
	settings();
	if (!cfg.lazy || !event->recorded || !event->s)
		return cudaSuccess;
	if (!stream) { /* the legacy stream waits now */
		legacy_use("cudaStreamWaitEvent");
		return cudaSuccess;
	}
	if (event->s == stream)
		return cudaSuccess; /* its own earlier work: in order anyway */
	stream->q.push_back(work{{}, event->s, event->n});
	stream->queued++;
	if (runs_at_once(stream))
		drain_to(stream, stream->queued);
	return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags)
{
	if (flags & ~(unsigned)cudaEventDisableTiming)
		return cudaErrorInvalidValue;
	*event = new CUevent_st{0, flags, NULL, 0};
	events.insert(*event);
	return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
	return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
	if (!events.erase(event))
		return cudaErrorInvalidResourceHandle;
	delete event;
	return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
	if (!events.count(event) || !stream_ok(stream))
		return cudaErrorInvalidResourceHandle;
	settings();
	if (!stream && cfg.lazy)
		legacy_use("cudaEventRecord");
	event->recorded = 1;
	event->s = cfg.lazy ? stream : NULL;
	event->n = stream ? stream->queued : 0;
	return cudaSuccess;
}

static bool reached(cudaEvent_t e)
{
	return !e->s || e->s->done >= e->n;
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
	if (!events.count(event))
		return cudaErrorInvalidResourceHandle;
	return reached(event) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
	if (!events.count(event))
		return cudaErrorInvalidResourceHandle;
	if (event->s)
		drain_to(event->s, event->n);
	return cudaSuccess;
}

/* No device time to measure: 0 ms between two recorded events. */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
	if (!events.count(start) || !events.count(end) || !start->recorded || !end->recorded ||
	    (start->flags | end->flags) & cudaEventDisableTiming)
		return cudaErrorInvalidResourceHandle;
	if (!reached(start) || !reached(end))
		return cudaErrorNotReady;
	*ms = 0.0f;
	return cudaSuccess;
}

} /* extern "C" */

int emu_is_device_range(const void *p, size_t bytes)
{
	auto it = alloc_of(p);
	return it != allocs.end() && (uintptr_t)p + bytes <= it->first + it->second;
}

int emu_is_stream(cudaStream_t s)
{
	return stream_ok(s);
}

/* ---- user-level threads ---------------------------------------------------------------------
 * emu_fiber_switch(save, load): push the callee-saved registers and the floating-point control
 * words, store the stack pointer in *save, continue on the stack load (popping what it saved
 * there). A fresh stack is laid out as if it had been saved, with fiber_main as the return
 * address. */

#if EMU_ASM_SWITCH
extern "C" void emu_fiber_switch(void **save, void *load);
asm(".text\n"
    ".globl emu_fiber_switch\n"
    ".hidden emu_fiber_switch\n"
    ".type emu_fiber_switch, @function\n"
    ".p2align 4\n"
    "emu_fiber_switch:\n"
    "	pushq %rbp\n"
    "	pushq %rbx\n"
    "	pushq %r12\n"
    "	pushq %r13\n"
    "	pushq %r14\n"
    "	pushq %r15\n"
    "	subq $8, %rsp\n"
    "	stmxcsr (%rsp)\n"
    "	fnstcw 4(%rsp)\n"
    "	movq %rsp, (%rdi)\n"
    "	movq %rsi, %rsp\n"
    "	ldmxcsr (%rsp)\n"
    "	fldcw 4(%rsp)\n"
    "	addq $8, %rsp\n"
    "	popq %r15\n"
    "	popq %r14\n"
    "	popq %r13\n"
    "	popq %r12\n"
    "	popq %rbx\n"
    "	popq %rbp\n"
    "	ret\n"
    ".size emu_fiber_switch, .-emu_fiber_switch\n");
#endif

enum fiber_state : uint8_t { F_READY, F_RUN, F_BARRIER, F_WARP, F_DONE };

struct fiber {
	void *sp;      /* saved stack pointer while not running */
	char *stack;   /* top of its stack; NULL until it first runs */
	uint3 idx;     /* threadIdx */
	uint8_t state;
#if !EMU_ASM_SWITCH
	ucontext_t uc;
#endif
#if EMU_ASAN
	void *fake;
#endif
};

/* ASan needs bigger frames; a guard page under each stack turns an overflow into a fault. */
static const size_t STACK_BYTES = EMU_ASAN ? (size_t)1 << 20 : (size_t)128 << 10;
static std::vector<char *> stack_pool;
static size_t page_bytes;

static char *stack_get(void)
{
	if (!stack_pool.empty()) {
		char *s = stack_pool.back();
		stack_pool.pop_back();
		return s;
	}
	if (!page_bytes)
		page_bytes = (size_t)sysconf(_SC_PAGESIZE);
	char *base = (char *)mmap(NULL, page_bytes + STACK_BYTES, PROT_READ | PROT_WRITE,
				  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (base == MAP_FAILED || mprotect(base, page_bytes, PROT_NONE) != 0)
		die("cannot map a thread stack of %zu bytes", STACK_BYTES);
	return base + page_bytes + STACK_BYTES;
}

static void stack_put(char *top)
{
#if EMU_ASAN
	/* the finished thread's last frame never returned: clear what ASan marked in it */
	__asan_unpoison_memory_region(top - STACK_BYTES, STACK_BYTES);
#endif
	stack_pool.push_back(top);
}

static fiber fib[MAX_THREADS];
static unsigned cur; /* the running fiber */
#if EMU_ASM_SWITCH
static void *sched_sp;
static uint64_t fp_control; /* MXCSR and x87 control word for fresh threads */
#else
static ucontext_t sched_uc;
#endif
#if EMU_ASAN
static void *sched_fake;
static const void *sched_bottom;
static size_t sched_size;
#endif

[[noreturn]] static void fiber_main(void);

static void fiber_prepare(fiber &f)
{
	f.stack = stack_get();
#if EMU_ASM_SWITCH
	uintptr_t *sp = (uintptr_t *)f.stack;
	*--sp = 0;                      /* fiber_main's return address: it never returns */
	*--sp = (uintptr_t)fiber_main;  /* where emu_fiber_switch returns to */
	for (int i = 0; i < 6; i++)
		*--sp = 0;              /* rbp rbx r12 r13 r14 r15 */
	*--sp = fp_control;
	f.sp = sp;
#else
	if (getcontext(&f.uc) != 0)
		die("getcontext failed");
	f.uc.uc_stack.ss_sp = f.stack - STACK_BYTES;
	f.uc.uc_stack.ss_size = STACK_BYTES;
	f.uc.uc_link = NULL;
	makecontext(&f.uc, (void (*)(void))fiber_main, 0);
#endif
}

/* scheduler -> fiber f, until it yields or finishes */
static void switch_to(fiber &f)
{
#if EMU_ASAN
	__sanitizer_start_switch_fiber(&sched_fake, f.stack - STACK_BYTES, STACK_BYTES);
#endif
#if EMU_ASM_SWITCH
	emu_fiber_switch(&sched_sp, f.sp);
#else
	swapcontext(&sched_uc, &f.uc);
#endif
#if EMU_ASAN
	__sanitizer_finish_switch_fiber(sched_fake, NULL, NULL);
#endif
}

/* fiber f -> scheduler; returns when f is resumed */
static void yield(fiber &f)
{
#if EMU_ASAN
	__sanitizer_start_switch_fiber(&f.fake, sched_bottom, sched_size);
#endif
#if EMU_ASM_SWITCH
	emu_fiber_switch(&f.sp, sched_sp);
#else
	swapcontext(&f.uc, &sched_uc);
#endif
#if EMU_ASAN
	__sanitizer_finish_switch_fiber(f.fake, &sched_bottom, &sched_size);
#endif
}

/* ---- one block: the threads that can run, the barriers ------------------------------------ */

enum wkind : uint8_t { W_SYNCWARP, W_SHFL_IDX, W_SHFL_UP, W_SHFL_DOWN, W_SHFL_XOR };
static const char *const wkind_name[] = {"__syncwarp", "__shfl_sync", "__shfl_up_sync",
					 "__shfl_down_sync", "__shfl_xor_sync"};

struct warp_state {
	unsigned exist;   /* lanes that are threads of the block */
	unsigned exited;  /* lanes that returned */
	unsigned mask;    /* of the collective being gathered, while arrived != 0 */
	unsigned arrived; /* lanes waiting at it */
	unsigned gen;     /* collectives completed */
	uint8_t kind;
	unsigned long long slot[2][32]; /* shuffle values, by the parity of gen */
};

static warp_state warps[MAX_THREADS / 32];
static unsigned ready_lanes[MAX_THREADS / 32]; /* per warp, the lanes that can run */
static unsigned ready_warps;                    /* the warps with such lanes */
static unsigned bar_wait[MAX_THREADS], bar_n;  /* at __syncthreads, in arrival order */
static unsigned n_done;
static unsigned long long n_switches;

static void make_ready(unsigned t)
{
	fib[t].state = F_READY;
	ready_lanes[t >> 5] |= 1u << (t & 31);
	ready_warps |= 1u << (t >> 5);
}

static void need_kernel(const char *what)
{
	if (!L.active)
		die("%s outside a kernel", what);
}

void emu_syncthreads(void)
{
	need_kernel("__syncthreads");
	if (n_done)
		die("__syncthreads after %u thread(s) of the block returned: every thread of the "
		    "block must reach it", n_done);
	bar_wait[bar_n++] = cur;
	if (bar_n == L.nthreads) {
		for (unsigned i = 0; i + 1 < bar_n; i++)
			make_ready(bar_wait[i]);
		bar_n = 0;
		return;
	}
	fib[cur].state = F_BARRIER;
	yield(fib[cur]);
}

/* Lane cur of its warp arrives at a collective of kind over mask, with value bits; returns once
 * every lane of mask has arrived, with the generation whose slots hold their values. */
static unsigned warp_collective(unsigned mask, uint8_t kind, unsigned long long bits)
{
	const unsigned lane = cur & 31, bit = 1u << lane;
	warp_state &w = warps[cur >> 5];
	if (!(mask & bit))
		die("%s with mask %#x, which leaves out the calling lane %u", wkind_name[kind],
		    mask, lane);
	if (mask & ~w.exist)
		die("%s with mask %#x names lanes %#x past the block's last thread",
		    wkind_name[kind], mask, mask & ~w.exist);
	if (mask & w.exited)
		die("%s with mask %#x names lanes %#x that returned: every lane named must "
		    "reach it", wkind_name[kind], mask, mask & w.exited);
	if (w.arrived) {
		if (w.mask != mask || w.kind != kind)
			die("lane %u reaches %s with mask %#x while lanes %#x wait at %s with "
			    "mask %#x", lane, wkind_name[kind], mask, w.arrived, wkind_name[w.kind],
			    w.mask);
	} else {
		w.mask = mask;
		w.kind = kind;
	}
	const unsigned gen = w.gen;
	w.slot[gen & 1][lane] = bits;
	w.arrived |= bit;
	if (w.arrived == mask) {
		w.arrived = 0;
		w.gen++;
		for (unsigned m = mask & ~bit; m; m &= m - 1)
			make_ready((cur & ~31u) + (unsigned)__builtin_ctz(m));
	} else {
		fib[cur].state = F_WARP;
		yield(fib[cur]);
	}
	return gen;
}

void emu_syncwarp(unsigned mask)
{
	need_kernel("__syncwarp");
	warp_collective(mask, W_SYNCWARP, 0);
}

unsigned long long emu_shfl(unsigned mask, unsigned long long bits, int mode, int arg, int width)
{
	const uint8_t kind = (uint8_t)(W_SHFL_IDX + mode);
	need_kernel(wkind_name[kind]);
	if (width < 1 || width > 32 || (width & (width - 1)))
		die("%s with width %d: a power of two up to 32", wkind_name[kind], width);
	const unsigned gen = warp_collective(mask, kind, bits);
	const int lane = (int)(cur & 31), seg = lane & ~(width - 1), pos = lane & (width - 1);
	int src = lane;
	switch (mode) {
	case EMU_SHFL_IDX: src = seg + (arg & (width - 1)); break;
	case EMU_SHFL_UP: src = pos - arg >= 0 ? lane - arg : lane; break;
	case EMU_SHFL_DOWN: src = pos + arg < width ? lane + arg : lane; break;
	case EMU_SHFL_XOR: src = lane ^ (arg & 31); src = src < seg + width ? src : lane; break;
	}
	if (!(mask >> src & 1))
		die("%s: lane %d reads lane %d, which is not in the mask %#x", wkind_name[kind],
		    lane, src, mask);
	return warps[cur >> 5].slot[gen & 1][src];
}

[[noreturn]] static void thread_exit(void)
{
	fiber &f = fib[cur];
	const unsigned lane = cur & 31;
	warp_state &w = warps[cur >> 5];
	if (bar_n)
		die("a thread returned while %u thread(s) wait at __syncthreads: every thread of "
		    "the block must reach it", bar_n);
	if (w.arrived && (w.mask >> lane & 1))
		die("lane %u returned while lanes %#x wait for it at %s with mask %#x: every lane "
		    "named must reach it", lane, w.arrived, wkind_name[w.kind], w.mask);
	w.exited |= 1u << lane;
	f.state = F_DONE;
	n_done++;
#if EMU_ASAN
	__sanitizer_start_switch_fiber(NULL, sched_bottom, sched_size);
#endif
#if EMU_ASM_SWITCH
	emu_fiber_switch(&f.sp, sched_sp);
#else
	setcontext(&sched_uc);
#endif
	__builtin_unreachable();
}

[[noreturn]] static void fiber_main(void)
{
#if EMU_ASAN
	__sanitizer_finish_switch_fiber(NULL, &sched_bottom, &sched_size);
#endif
	L.body(L.arg);
	thread_exit();
}

/* Statics of the kernels' __shared__ variables, all in this section. */
extern "C" char __start_emu_shared[] __attribute__((weak));
extern "C" char __stop_emu_shared[] __attribute__((weak));

static void deadlock(void)
{
	std::string who;
	char buf[200];
	if (bar_n) {
		snprintf(buf, sizeof buf, "; %u at __syncthreads", bar_n);
		who += buf;
	}
	for (unsigned w = 0; w < (L.nthreads + 31) / 32; w++)
		if (warps[w].arrived) {
			snprintf(buf, sizeof buf, "; warp %u: lanes %#x at %s with mask %#x", w,
				 warps[w].arrived, wkind_name[warps[w].kind], warps[w].mask);
			who += buf;
		}
	die("deadlock: %u of the block's %u threads wait and none can run%s",
	    L.nthreads - n_done, L.nthreads, who.c_str());
}

static uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* The lanes of warp w in the mask m, one after another, from lane `from` on (cyclically). */
static void run_lanes(unsigned w, unsigned m, unsigned from)
{
	const unsigned rot = (m >> from) | (from ? m << (32 - from) : 0);
	for (unsigned r = rot; r; r &= r - 1) {
		const unsigned t = 32 * w + ((from + (unsigned)__builtin_ctz(r)) & 31);
		fiber &f = fib[t];
		if (!f.stack)
			fiber_prepare(f);
		cur = t;
		threadIdx = f.idx;
		f.state = F_RUN;
		n_switches++;
		switch_to(f);
		if (f.state == F_DONE) {
			stack_put(f.stack);
			f.stack = NULL;
		}
	}
}

/* Block b of the launch. A warp, once picked, runs until none of its lanes can (all wait or
 * have returned), as a GPU lets a warp run ahead of the others: a missing barrier between one
 * warp's writes and another's reads of shared memory then shows. The next warp is the lowest
 * that can run (rng NULL) or one drawn from rng, whose lanes start at a drawn lane. */
static void run_block(unsigned long long b, uint64_t *rng)
{
	const unsigned long long gx = L.grid.x, gy = L.grid.y;
	blockIdx = uint3{(unsigned)(b % gx), (unsigned)(b / gx % gy), (unsigned)(b / (gx * gy))};
	threadIdx = uint3{0, 0, 0};
	char *sh0 = __start_emu_shared, *sh1 = __stop_emu_shared;
	if (sh1 > sh0)
		memset(sh0, POISON, (size_t)(sh1 - sh0));
	if (L.smem)
		memset(L.dyn, POISON, L.smem);
	const unsigned n = L.nthreads;
	for (unsigned w = 0; w < (n + 31) / 32; w++) {
		warp_state &ws = warps[w];
		ws.exist = n - 32 * w >= 32 ? ~0u : (1u << (n - 32 * w)) - 1;
		ws.exited = ws.arrived = ws.mask = ws.gen = 0;
		ready_lanes[w] = 0;
	}
	bar_n = n_done = 0;
	ready_warps = 0;
	for (unsigned t = 0; t < n; t++)
		make_ready(t);
	while (ready_warps) {
		unsigned w = (unsigned)__builtin_ctz(ready_warps);
		if (rng) {
			unsigned m = ready_warps, k = (unsigned)(splitmix(rng) % (unsigned)
							       __builtin_popcount(ready_warps));
			while (k--)
				m &= m - 1;
			w = (unsigned)__builtin_ctz(m);
		}
		while (ready_lanes[w]) {
			const unsigned m = ready_lanes[w];
			ready_lanes[w] = 0; /* lanes released meanwhile run in the next round */
			run_lanes(w, m, rng ? (unsigned)(splitmix(rng) & 31) : 0);
		}
		ready_warps &= ~(1u << w);
	}
	if (n_done < n)
		deadlock();
}

/* ---- statistics (CUDA_EMU_STATS=1) --------------------------------------------------------- */

struct kstat {
	unsigned long long launches, blocks, threads, switches;
	double seconds;
};
static std::map<std::string, kstat> kstats;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void stats_print(void)
{
	std::vector<std::pair<double, std::string>> by;
	double total = 0;
	for (auto &k : kstats) {
		by.push_back({k.second.seconds, k.first});
		total += k.second.seconds;
	}
	std::sort(by.rbegin(), by.rend());
	fprintf(stderr, "cuda-emu: pid %d: %.3f s in kernels\n", (int)getpid(), total);
	for (auto &p : by) {
		const kstat &k = kstats[p.second];
		fprintf(stderr, "cuda-emu: %9.3f s %8llu launches %10llu blocks %12llu threads "
			"%12llu switches  %s\n", k.seconds, k.launches, k.blocks, k.threads,
			k.switches, p.second.c_str());
	}
}

/* ---- launches ---------------------------------------------------------------------------- */

void *emu_dyn_shared(void)
{
	need_kernel("dynamic shared memory");
	return L.dyn;
}

static unsigned long long gcd(unsigned long long a, unsigned long long b)
{
	while (b) {
		unsigned long long t = a % b;
		a = b;
		b = t;
	}
	return a;
}

/* Each kernel's limit set by cudaFuncSetAttribute (absent: MAX_DYN_SHARED). */
static std::map<const void *, int> &smem_limits(void)
{
	static std::map<const void *, int> m;
	return m;
}

cudaError_t emu_func_set_attribute(const void *func, enum cudaFuncAttribute attr, int value)
{
	if (!func || attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
	    value > MAX_DYN_SHARED_OPT_IN)
		return cudaErrorInvalidValue;
	smem_limits()[func] = value;
	return cudaSuccess;
}

static void call_body(void *fn)
{
	(*static_cast<std::function<void()> *>(fn))();
}

/* Runs a launch that emu_launch_fn checked: every block, every thread. */
static void run_launch(const char *kernel, const char *file, int line, dim3 grid, dim3 block,
		       size_t smem, cudaStream_t stream, std::function<void()> *call)
{
	static unsigned long long launches;
	if (L.active)
		die("kernel %s launched at %s:%d from inside a kernel", kernel, file, line);
	L.kernel = kernel;
	L.file = file;
	L.line = line;
	L.grid = grid;
	L.block = block;
	L.smem = smem;
	L.stream = stream;
	const unsigned long long nt = (unsigned long long)block.x * block.y * block.z;
	const double t0 = cfg.stats ? now() : 0.0;
	const unsigned long long sw0 = n_switches;
	L.body = call_body;
	L.arg = call;
	L.nthreads = (unsigned)nt;
	L.dyn = (char *)malloc(smem ? smem : 1);
	if (!L.dyn)
		die("cannot allocate %zu bytes of dynamic shared memory", smem);
	blockDim = block;
	gridDim = grid;
#if EMU_ASM_SWITCH
	uint32_t mxcsr;
	uint16_t fpucw;
	asm volatile("stmxcsr %0" : "=m"(mxcsr));
	asm volatile("fnstcw %0" : "=m"(fpucw));
	fp_control = mxcsr | (uint64_t)fpucw << 32;
#endif
	for (unsigned t = 0; t < L.nthreads; t++) {
		fib[t].idx = uint3{t % block.x, t / block.x % block.y, t / (block.x * block.y)};
		fib[t].stack = NULL;
	}
	L.active = 1;

	/* blocks in the order b -> (a b + c) mod nb, a coprime to nb: a permutation */
	const unsigned long long nb = (unsigned long long)grid.x * grid.y * grid.z;
	uint64_t rng = 0x5eed0000ull + launches++;
	unsigned long long a = 1, c = 0;
	if (!cfg.fixed_order && nb > 1) {
		c = splitmix(&rng) % nb;
		do
			a = 1 + splitmix(&rng) % (nb - 1);
		while (gcd(a, nb) != 1);
	}
	for (unsigned long long i = 0; i < nb; i++)
		run_block((unsigned long long)(((unsigned __int128)a * i + c) % nb),
			  cfg.fixed_order ? NULL : &rng);

	L.active = 0;
	free(L.dyn);
	L.dyn = NULL;
	threadIdx = blockIdx = uint3{0, 0, 0};
	if (cfg.stats) {
		kstat &k = kstats[kernel];
		k.launches++;
		k.blocks += nb;
		k.threads += nb * nt;
		k.switches += n_switches - sw0;
		k.seconds += now() - t0;
	}
}

void emu_launch_fn(const char *kernel, const void *func, const char *file, int line, dim3 grid,
		   dim3 block, size_t smem, cudaStream_t stream, std::function<void()> call)
{
	settings();
	if (L.active)
		die("kernel %s launched at %s:%d from inside a kernel", kernel, file, line);
	const unsigned long long nt = (unsigned long long)block.x * block.y * block.z;
	if (!block.x || !block.y || !block.z || block.x > 1024 || block.y > 1024 || block.z > 64 ||
	    nt > MAX_THREADS)
		die("kernel %s launched at %s:%d with block (%u,%u,%u): a GPU runs 1 to 1024 "
		    "threads per block (x, y up to 1024, z up to 64)", kernel, file, line, block.x,
		    block.y, block.z);
	if (!grid.x || !grid.y || !grid.z || grid.x > 0x7fffffffu || grid.y > 65535 ||
	    grid.z > 65535)
		die("kernel %s launched at %s:%d with grid (%u,%u,%u): x must be 1 to 2^31-1, y "
		    "and z 1 to 65535", kernel, file, line, grid.x, grid.y, grid.z);
	auto lim = smem_limits().find(func);
	size_t smem_max = lim == smem_limits().end() ? MAX_DYN_SHARED : (size_t)lim->second;
	if (smem > smem_max)
		die("kernel %s launched at %s:%d with %zu bytes of dynamic shared memory: more "
		    "than %zu needs cudaFuncSetAttribute (up to 227 KiB)", kernel, file, line, smem,
		    smem_max);
	if (!stream_ok(stream))
		die("kernel %s launched at %s:%d on %p, which is not a stream", kernel, file, line,
		    (void *)stream);
	emu_enqueue(stream, [=, call = std::move(call)]() mutable {
		run_launch(kernel, file, line, grid, block, smem, stream, &call);
	});
}

/* ---- cuBLAS -------------------------------------------------------------------------------- */

struct cublasContext {
	cudaStream_t stream;
	cublasMath_t mode;
};
static std::set<cublasHandle_t> handles;

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle)
{
	*handle = new cublasContext{NULL, CUBLAS_DEFAULT_MATH};
	handles.insert(*handle);
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle)
{
	if (!handles.erase(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	delete handle;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream)
{
	if (!handles.count(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (!stream_ok(stream))
		return CUBLAS_STATUS_INVALID_VALUE;
	handle->stream = stream;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
	if (!handles.count(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	handle->mode = mode;
	return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t status)
{
	switch (status) {
	case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
	case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
	case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
	case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
	case CUBLAS_STATUS_ARCH_MISMATCH:
		return "an absent device architectural feature is required";
	case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
	case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
	case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
	case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
	}
	return "unknown error";
}

} /* extern "C" */

/* Elements a column-major rows x cols operand with leading dimension ld spans. */
static size_t cm_span(int rows, int cols, int ld)
{
	return rows && cols ? (size_t)(cols - 1) * (size_t)ld + (size_t)rows : 0;
}

/* How a product reads its operands: float32 as it is, float32 rounded to TF32, bfloat16. */
enum operand_kind { OPERAND_F32, OPERAND_TF32, OPERAND_BF16 };

static float tf32_rna(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7f800000u) != 0x7f800000u) /* finite: round the 13 dropped bits, ties away */
		u = (u + 0x1000u) & ~0x1fffu;
	memcpy(&f, &u, 4);
	return f;
}

static inline float operand(const void *base, size_t i, operand_kind kind)
{
	switch (kind) {
	case OPERAND_BF16: return __bfloat162float(((const __nv_bfloat16 *)base)[i]);
	case OPERAND_TF32: return tf32_rna(((const float *)base)[i]);
	default: return ((const float *)base)[i];
	}
}

static cublasStatus_t gemm(const char *what, cublasHandle_t h, cublasOperation_t ta,
			   cublasOperation_t tb, int m, int n, int k, const float *alpha,
			   const void *A, int lda, long long sA, const void *B, int ldb,
			   long long sB, const float *beta, float *C, int ldc, long long sC,
			   int batch, operand_kind kind = OPERAND_F32)
{
	const size_t es = kind == OPERAND_BF16 ? 2 : 4; /* bytes per operand element */
	if (!handles.count(h))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (L.active)
		die("%s inside a kernel", what);
	const int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
	const int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
	const char *bad = NULL;
	if ((unsigned)ta > CUBLAS_OP_C || (unsigned)tb > CUBLAS_OP_C)
		bad = "transa or transb is not an operation";
	else if (m < 0 || n < 0 || k < 0 || batch < 0)
		bad = "a negative size";
	else if (lda < (ar > 1 ? ar : 1))
		bad = "lda below the rows of A";
	else if (ldb < (br > 1 ? br : 1))
		bad = "ldb below the rows of B";
	else if (ldc < (m > 1 ? m : 1))
		bad = "ldc below the rows of C";
	if (bad) {
		warn("%s(trans %d %d, m %d n %d k %d, lda %d ldb %d ldc %d, batch %d): %s: "
		     "CUBLAS_STATUS_INVALID_VALUE", what, ta, tb, m, n, k, lda, ldb, ldc, batch,
		     bad);
		return CUBLAS_STATUS_INVALID_VALUE;
	}
	if (m == 0 || n == 0 || batch == 0)
		return CUBLAS_STATUS_SUCCESS;
	if (is_device(alpha) || is_device(beta))
		die("%s: alpha or beta in device memory, but the pointer mode is host", what);
	const float al = *alpha, be = *beta;
	const bool read_ab = al != 0.0f && k > 0, read_c = be != 0.0f;
	const size_t nA = cm_span(ar, ac, lda), nB = cm_span(br, bc, ldb), nC = cm_span(m, n, ldc);
	if (batch > 1 && (size_t)(sC < 0 ? -sC : sC) < nC)
		die("%s: the %d outputs overlap (strideC %lld, each spans %zu floats)", what, batch,
		    sC, nC);
	for (int b = 0; b < batch; b++) {
		const char *a = (const char *)A + b * sA * (long long)es;
		const char *bb = (const char *)B + b * sB * (long long)es;
		float *c = C + b * sC;
		char where[80];
		snprintf(where, sizeof where, "%s, batch %d: C", what, b);
		need_device(c, sizeof(float) * nC, where);
		if (read_ab) {
			snprintf(where, sizeof where, "%s, batch %d: A", what, b);
			need_device(a, es * nA, where);
			snprintf(where, sizeof where, "%s, batch %d: B", what, b);
			need_device(bb, es * nB, where);
			if (overlap(c, sizeof(float) * nC, a, es * nA) ||
			    overlap(c, sizeof(float) * nC, bb, es * nB))
				die("%s, batch %d: C overlaps A or B", what, b);
		}
	}
	emu_enqueue(h->stream, [=] {
		for (int b = 0; b < batch; b++) {
			const char *a = (const char *)A + b * sA * (long long)es;
			const char *bb = (const char *)B + b * sB * (long long)es;
			float *c = C + b * sC;
			for (int j = 0; j < n; j++)
				for (int i = 0; i < m; i++) {
					float s = 0.0f;
					if (read_ab)
						for (int l = 0; l < k; l++) {
							const float x = operand(
								a, ta == CUBLAS_OP_N
									   ? i + (size_t)l * lda
									   : l + (size_t)i * lda,
								kind);
							const float y = operand(
								bb, tb == CUBLAS_OP_N
									    ? l + (size_t)j * ldb
									    : j + (size_t)l * ldb,
								kind);
							s += x * y;
						}
					float &out = c[i + (size_t)j * ldc];
					out = read_c ? al * s + be * out : al * s;
				}
		}
	});
	return CUBLAS_STATUS_SUCCESS;
}

extern "C" {

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
			      cublasOperation_t transb, int m, int n, int k, const float *alpha,
			      const float *A, int lda, const float *B, int ldb, const float *beta,
			      float *C, int ldc)
{
	return gemm("cublasSgemm", handle, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb, 0,
		    beta, C, ldc, 0, 1);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
					 cublasOperation_t transb, int m, int n, int k,
					 const float *alpha, const float *A, int lda,
					 long long int strideA, const float *B, int ldb,
					 long long int strideB, const float *beta, float *C,
					 int ldc, long long int strideC, int batchCount)
{
	return gemm("cublasSgemmStridedBatched", handle, transa, transb, m, n, k, alpha, A, lda,
		    strideA, B, ldb, strideB, beta, C, ldc, strideC, batchCount);
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
	const char *what = "cublasGemmStridedBatchedEx";
	operand_kind kind;
	if (Atype != Btype || Ctype != CUDA_R_32F || algo != CUBLAS_GEMM_DEFAULT)
		kind = (operand_kind)-1;
	else if (Atype == CUDA_R_16BF && computeType == CUBLAS_COMPUTE_32F)
		kind = OPERAND_BF16;
	else if (Atype == CUDA_R_32F && computeType == CUBLAS_COMPUTE_32F)
		kind = OPERAND_F32;
	else if (Atype == CUDA_R_32F && computeType == CUBLAS_COMPUTE_32F_FAST_TF32)
		kind = OPERAND_TF32;
	else
		kind = (operand_kind)-1;
	if ((int)kind < 0) {
		warn("%s: types A %d B %d C %d, compute %d, algo %d: CUBLAS_STATUS_NOT_SUPPORTED "
		     "(not emulated)", what, Atype, Btype, Ctype, computeType, algo);
		return CUBLAS_STATUS_NOT_SUPPORTED;
	}
	return gemm(what, handle, transa, transb, m, n, k, (const float *)alpha, A, lda, strideA,
		    B, ldb, strideB, (const float *)beta, (float *)C, ldc, strideC, batchCount,
		    kind);
}

} /* extern "C" */

/* ---- CUB --------------------------------------------------------------------------------- */

size_t emu_sort_temp_bytes(long long n)
{
	return 16 * (size_t)(n > 0 ? n : 0) + 256;
}

cudaError_t emu_sort_check(void *tmp, size_t tmp_bytes, const void *keys_in, void *keys_out,
			   size_t key_size, const void *values_in, void *values_out,
			   size_t value_size, long long n, int begin_bit, int end_bit,
			   cudaStream_t stream)
{
	const char *what = "cub::DeviceRadixSort::SortPairs";
	if (L.active)
		die("%s inside a kernel", what);
	if (!stream_ok(stream)) {
		warn("%s: %p is not a stream", what, (void *)stream);
		return cudaErrorInvalidResourceHandle;
	}
	if (n < 0 || begin_bit < 0 || end_bit > (int)(8 * key_size) || begin_bit >= end_bit) {
		warn("%s: %lld items, bits [%d, %d) of %zu-byte keys", what, n, begin_bit, end_bit,
		     key_size);
		return cudaErrorInvalidValue;
	}
	const size_t need = emu_sort_temp_bytes(n);
	if (tmp_bytes < need) {
		warn("%s: temp_storage_bytes %zu, less than the %zu its query gave for %lld items",
		     what, tmp_bytes, need, n);
		return cudaErrorInvalidValue;
	}
	need_device(tmp, need, "cub::DeviceRadixSort::SortPairs temp storage");
	if (!n)
		return cudaSuccess;
	const size_t nk = key_size * (size_t)n, nv = value_size * (size_t)n;
	need_device(keys_in, nk, "cub::DeviceRadixSort::SortPairs keys in");
	need_device(keys_out, nk, "cub::DeviceRadixSort::SortPairs keys out");
	need_device(values_in, nv, "cub::DeviceRadixSort::SortPairs values in");
	need_device(values_out, nv, "cub::DeviceRadixSort::SortPairs values out");
	const struct {
		const void *p;
		size_t n;
		const char *name;
	} in[] = {{keys_in, nk, "the keys in"}, {values_in, nv, "the values in"},
		  {tmp, need, "the temp storage"}, {keys_out, nk, "the keys out"}};
	for (const auto &i : in) {
		if (i.p != keys_out && overlap(keys_out, nk, i.p, i.n))
			die("%s: the keys out overlap %s", what, i.name);
		if (overlap(values_out, nv, i.p, i.n))
			die("%s: the values out overlap %s", what, i.name);
	}
	return cudaSuccess;
}
