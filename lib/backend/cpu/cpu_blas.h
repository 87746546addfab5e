/* cpu_blas.h - the library behind the cpu backend's matrix products, chosen and loaded at run
 * time (dlopen), so that no program runs a slower kernel than its processor has. Private to
 * lib/backend/cpu.
 *
 * Why at run time: Debian 12's OpenBLAS 0.3.21 picks its kernels from a table of CPU models
 * when it is loaded, and on a model it does not know (Intel's family 6 model 207, say) falls
 * back to Prescott's SSE3 kernel: a fifth of the speed of its AVX-512 one on the same machine
 * (MACHINE.md). It reads OPENBLAS_CORETYPE once, at load, so the only way to correct it is to
 * load it ourselves: load, read the core it chose, compare with what cpuid says the CPU has,
 * and when it chose below that, unload and load again with OPENBLAS_CORETYPE set. oneDNN
 * (libdnnl) dispatches on cpuid features instead of model numbers, and its fp32 sgemm ran
 * ~10% more tokens per second than OpenBLAS's best kernel on gpt-tiny on that Xeon, so it is
 * the default where the build found it and it loads.
 *
 * The choice, once per process, on the first open of a cpu backend:
 *   CORE_CPU_BLAS=onednn|openblas   that library (an error when it cannot be loaded);
 *   else OPENBLAS_CORETYPE set      OpenBLAS with the user's core, as the user asked;
 *   else                            oneDNN when built in and loadable, else OpenBLAS with
 *                                   its core corrected as above.
 */
#ifndef CORE_CPU_BLAS_H
#define CORE_CPU_BLAS_H

#include <stdint.h>

/* What cpuid (and the OS's saved register state, XCR0) says the CPU can run. */
struct cpu_features {
	int amd;         /* AuthenticAMD or HygonGenuine: OpenBLAS names its AVX2 core "Zen" */
	int avx;         /* AVX with the OS saving ymm */
	int avx2_fma;    /* AVX2 and FMA3 */
	int avx512;      /* AVX-512 F, CD, BW, DQ and VL with the OS saving zmm (SkylakeX's set) */
	int avx512_bf16; /* AVX512_BF16 (vdpbf16ps) */
	int amx_bf16;    /* AMX tiles with bf16, the OS saving tile data */
};

void cpu_features_detect(struct cpu_features *f);

/* The instruction-set level of an OpenBLAS x86-64 core name (openblas_get_corename(), any
 * case): 0 SSE only (Prescott, Core2, Nehalem, Opteron, ...), 1 AVX (Sandybridge, Bulldozer,
 * ...), 2 AVX2 (Haswell, Zen, Excavator), 3 AVX-512 (SkylakeX, Cooperlake, SapphireRapids);
 * -1 for a name we do not know (a newer OpenBLAS's). */
int cpu_openblas_core_level(const char *core);

/* The OpenBLAS core to force on a CPU with features f when OpenBLAS chose `chosen` by itself:
 * the best core f runs (SkylakeX, Haswell or Zen, Sandybridge) when chosen is of a lower
 * level, else NULL (keep OpenBLAS's choice: it is as good, or a name we do not know). */
const char *cpu_openblas_correction(const struct cpu_features *f, const char *chosen);

/* The loaded library. sgemm is row-major C[M,N] = alpha op(A) op(B) + beta C, op transposing
 * when ta (tb) is nonzero, run on the calling thread alone when called inside an OpenMP
 * parallel region (both libraries do so) and as many ways as OpenMP's thread count outside
 * one (the caller sets it to 1 for the same bits at any thread count). */
struct cpu_blas {
	void (*sgemm)(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
		      const float *B, int ldb, float beta, float *C, int ldc);
	/* The same product with each operand rounded to bfloat16 (to nearest, ties to even) and
	 * the products summed in float32 (backend.h, BACKEND_BF16), on the calling thread
	 * alone; NULL where the library or the CPU has no such kernel (why_no_bf16 says
	 * which). Its bits depend on the shape alone. ah (bh), when not NULL, is op(A)'s
	 * (op(B)'s) bfloat16 already, as to_bf16 makes it from A's M rows of K (ta 0) or K
	 * rows of M (ta 1) (B: K rows of N, or N rows of K), those rows ldah (ldbh) elements
	 * apart (0: no padding, as to_bf16 writes them), and A (B) is not read (may be NULL).
	 * Returns 0, or CORE_ENOMEM (its workspace) having done nothing. */
	int (*gemm_bf16)(int ta, int tb, int M, int N, int K, float alpha, const float *A,
			 int lda, const float *B, int ldb, float beta, float *C, int ldc,
			 const uint16_t *ah, int ldah, const uint16_t *bh, int ldbh);
	/* dst[r * cols + c] = bf16(src[r * ld + c]), to nearest, ties to even */
	void (*to_bf16)(uint16_t *dst, const float *src, int rows, int cols, int ld);
	char why_no_bf16[128];
	/* "onednn 2.6.3 avx512_core_amx", "openblas 0.3.21 SkylakeX" */
	char kernel[96];
	/* OpenBLAS: the core it chose by itself when we replaced it ("Prescott"), else "" */
	char corrected_from[32];
	struct cpu_features cpu;
};

/* The library of this process in *out, loaded on the first call; the same answer on every
 * call. Errors (*out NULL): CORE_EUNSUPPORTED, neither library loads, or the one
 * CORE_CPU_BLAS names does not; CORE_EUSAGE, CORE_CPU_BLAS names no library. */
int cpu_blas_get(const struct cpu_blas **out);

#endif
