/* cpu_blas.c - choosing and loading the cpu backend's matrix-product library; cpu_blas.h says
 * what is chosen and why.
 *
 * Neither library is linked: a program links cblas.h's and dnnl.h's declarations only for
 * their types, and resolves the few entry points it calls with dlsym. OpenBLAS must be loaded
 * by us to be corrected (it reads OPENBLAS_CORETYPE in its load-time constructor), and oneDNN
 * is a 40 MB C++ library that programs which open no cpu backend need not map.
 */
#include "backend/cpu/cpu_blas.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cblas.h>
#ifdef CORE_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "common/dl_load.h"
#include "common/err.h"
#include "common/banned.h"

/* Debian's OpenMP build of OpenBLAS (the Makefile passes its folder): BLAS and our loops then
 * share libgomp's one thread pool. Without it, the loader's libopenblas.so.0. */
#ifndef CORE_OPENBLAS_DIR
#define CORE_OPENBLAS_DIR NULL
#endif
#define OPENBLAS_SONAME "libopenblas.so.0"
#define DNNL_SONAME "libdnnl.so.2"

/* ---- cpuid ---------------------------------------------------------------------------- */

#if defined(__x86_64__) || defined(__i386__)
static unsigned long long xgetbv0(void)
{
	unsigned lo, hi;
	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	return (unsigned long long)hi << 32 | lo;
}
#endif

void cpu_features_detect(struct cpu_features *f)
{
	memset(f, 0, sizeof *f);
#if defined(__x86_64__) || defined(__i386__)
	unsigned a, b, c, d, max;
	if (!__get_cpuid(0, &max, &b, &c, &d))
		return;
	/* the vendor string is EBX, EDX, ECX */
	f->amd = (b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163) || /* AuthenticAMD */
		 (b == 0x6f677948 && d == 0x6e65476e && c == 0x656e6975);   /* HygonGenuine */
	__get_cpuid(1, &a, &b, &c, &d);
	const int osxsave = c >> 27 & 1, avx = c >> 28 & 1, fma = c >> 12 & 1;
	const unsigned long long xcr0 = osxsave ? xgetbv0() : 0;
	/* XCR0: bits 1-2 xmm and ymm state; 5-7 opmask and zmm; 17-18 AMX tile config and data */
	const int os_ymm = (xcr0 & 0x6) == 0x6, os_zmm = (xcr0 & 0xe6) == 0xe6;
	const int os_tile = (xcr0 & 0x60000) == 0x60000;
	f->avx = avx && os_ymm;
	if (max < 7)
		return;
	unsigned eax7, ebx7, ecx7, edx7;
	__cpuid_count(7, 0, eax7, ebx7, ecx7, edx7);
	f->avx2_fma = f->avx && fma && (ebx7 >> 5 & 1);
	/* AVX-512 F (16), DQ (17), CD (28), BW (30), VL (31) */
	const unsigned skx = 1u << 16 | 1u << 17 | 1u << 28 | 1u << 30 | 1u << 31;
	f->avx512 = f->avx2_fma && os_zmm && (ebx7 & skx) == skx;
	if (eax7 >= 1) {
		__cpuid_count(7, 1, a, b, c, d);
		f->avx512_bf16 = f->avx512 && (a >> 5 & 1);
	}
	/* AMX-BF16 (EDX 22) and AMX-TILE (24) */
	f->amx_bf16 = os_tile && (edx7 >> 22 & 1) && (edx7 >> 24 & 1);
	(void)ecx7;
#endif
}

/* ---- OpenBLAS's cores ------------------------------------------------------------------ */

int cpu_openblas_core_level(const char *core)
{
	/* OpenBLAS 0.3.21's x86-64 core names (driver/others/dynamic.c) by the widest vectors
	 * their kernels use. */
	static const struct {
		const char *name;
		int level;
	} cores[] = {
		{"Katmai", 0},      {"Coppermine", 0},  {"Northwood", 0},    {"Prescott", 0},
		{"Banias", 0},      {"Atom", 0},        {"Core2", 0},        {"Penryn", 0},
		{"Dunnington", 0},  {"Nehalem", 0},     {"Athlon", 0},       {"Opteron", 0},
		{"Opteron_SSE3", 0},{"Barcelona", 0},   {"Nano", 0},         {"Bobcat", 0},
		{"Sandybridge", 1}, {"Bulldozer", 1},   {"Piledriver", 1},   {"Steamroller", 1},
		{"Haswell", 2},     {"Excavator", 2},   {"Zen", 2},
		{"SkylakeX", 3},    {"Cooperlake", 3},  {"SapphireRapids", 3},
	};
	for (size_t i = 0; core && i < sizeof cores / sizeof cores[0]; i++)
		if (strcasecmp(core, cores[i].name) == 0)
			return cores[i].level;
	return -1;
}

const char *cpu_openblas_correction(const struct cpu_features *f, const char *chosen)
{
	const char *best = f->avx512     ? "SkylakeX"
			   : f->avx2_fma ? (f->amd ? "Zen" : "Haswell")
			   : f->avx      ? "Sandybridge"
					 : NULL;
	const int level = cpu_openblas_core_level(chosen);
	if (!best || level < 0 || level >= cpu_openblas_core_level(best))
		return NULL;
	return best;
}

/* ---- the libraries ------------------------------------------------------------------- */

static struct {
	pthread_once_t once;
	struct cpu_blas blas;
	int rc;          /* 0, or the error to report on every call */
	char why[512];
	void *lib;
	/* OpenBLAS */
	__typeof__(cblas_sgemm) *cblas_sgemm;
	/* oneDNN */
	int (*dnnl_sgemm)(char, char, long long, long long, long long, float, const float *,
			  long long, const float *, long long, float, float *, long long);
} g = {.once = PTHREAD_ONCE_INIT};

static void openblas_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A,
			   int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
	g.cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
		      M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void *openblas_open(char *(**corename)(void), char *why, size_t why_len)
{
	void (*set_threads)(int) = NULL;
	char *(*config)(void) = NULL;
	const struct dl_sym sym[] = {
		{"cblas_sgemm", (void **)&g.cblas_sgemm},
		{"openblas_get_corename", (void **)corename},
		{"openblas_get_config", (void **)&config},
		{"openblas_set_num_threads", (void **)&set_threads},
	};
	void *lib = NULL;
	if (CORE_OPENBLAS_DIR) /* the OpenMP build first, by its path */
		lib = dl_load(CORE_OPENBLAS_DIR "/" OPENBLAS_SONAME, NULL, sym, 4, why, why_len);
	if (!lib)
		lib = dl_load(OPENBLAS_SONAME, NULL, sym, 4, why, why_len);
	if (lib) {
		/* one thread inside: sgemm() in backend_cpu.c splits products itself */
		set_threads(1);
		/* "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Prescott MAX_THREADS=64" */
		char version[32] = "?";
		sscanf(config(), "OpenBLAS %31s", version);
		snprintf(g.blas.kernel, sizeof g.blas.kernel, "openblas %s %s", version,
			 (*corename)());
	}
	return lib;
}

static int load_openblas(void)
{
	char *(*corename)(void) = NULL;
	void *lib = openblas_open(&corename, g.why, sizeof g.why);
	if (!lib)
		return CORE_EUNSUPPORTED;
	const char *user = getenv("OPENBLAS_CORETYPE");
	const char *better = user && *user ? NULL : cpu_openblas_correction(&g.blas.cpu, corename());
	if (better) {
		/* Loaded again it runs its constructor again, now reading our choice. The
		 * environment is put back as it was, so that child processes see the user's. */
		snprintf(g.blas.corrected_from, sizeof g.blas.corrected_from, "%s", corename());
		dlclose(lib);
		setenv("OPENBLAS_CORETYPE", better, 1);
		lib = openblas_open(&corename, g.why, sizeof g.why);
		unsetenv("OPENBLAS_CORETYPE");
		if (!lib)
			return CORE_EUNSUPPORTED;
	}
	g.lib = lib;
	g.blas.sgemm = openblas_sgemm;
	return 0;
}

#ifdef CORE_HAVE_DNNL
static void dnnl_sgemm_rm(int ta, int tb, int M, int N, int K, float alpha, const float *A,
			  int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
	g.dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static const char *dnnl_isa_name(int isa)
{
	switch (isa) {
	case dnnl_cpu_isa_sse41: return "sse41";
	case dnnl_cpu_isa_avx: return "avx";
	case dnnl_cpu_isa_avx2: return "avx2";
	case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
	case dnnl_cpu_isa_avx512_core: return "avx512_core";
	case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
	case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
	case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
	default: return "isa?";
	}
}

static int load_dnnl(void)
{
	const dnnl_version_t *(*version)(void) = NULL;
	dnnl_cpu_isa_t (*isa)(void) = NULL;
	const struct dl_sym sym[] = {
		{"dnnl_sgemm", (void **)&g.dnnl_sgemm},
		{"dnnl_version", (void **)&version},
		{"dnnl_get_effective_cpu_isa", (void **)&isa},
	};
	g.lib = dl_load(DNNL_SONAME, NULL, sym, sizeof sym / sizeof sym[0], g.why, sizeof g.why);
	if (!g.lib)
		return CORE_EUNSUPPORTED;
	const dnnl_version_t *v = version();
	snprintf(g.blas.kernel, sizeof g.blas.kernel, "onednn %d.%d.%d %s", v->major, v->minor,
		 v->patch, dnnl_isa_name((int)isa()));
	g.blas.sgemm = dnnl_sgemm_rm;
	return 0;
}
#else
static int load_dnnl(void)
{
	snprintf(g.why, sizeof g.why, "this binary was built without oneDNN (libdnnl-dev)");
	return CORE_EUNSUPPORTED;
}
#endif

static void load(void)
{
	cpu_features_detect(&g.blas.cpu);
	const char *want = getenv("CORE_CPU_BLAS");
	const char *coretype = getenv("OPENBLAS_CORETYPE");
	if (want && *want) {
		if (strcmp(want, "onednn") == 0) {
			g.rc = load_dnnl();
		} else if (strcmp(want, "openblas") == 0) {
			g.rc = load_openblas();
		} else {
			g.rc = CORE_EUSAGE;
			snprintf(g.why, sizeof g.why, "CORE_CPU_BLAS='%s': not a library (onednn, "
				 "openblas)", want);
		}
		return;
	}
	if ((coretype && *coretype) || load_dnnl() < 0)
		g.rc = load_openblas();
}

int cpu_blas_get(const struct cpu_blas **out)
{
	pthread_once(&g.once, load);
	*out = g.rc < 0 ? NULL : &g.blas;
	return g.rc < 0 ? err_set(g.rc, NULL, "cpu backend: %s", g.why) : 0;
}
