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
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
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
#include <immintrin.h>
#endif

#include "common/dl_load.h"
#include "common/err.h"
#include "common/banned.h"

/* Debian's OpenMP build of OpenBLAS (the Makefile passes its folder): BLAS and our loops then
 * share libgomp's one thread pool. Without it, the loader's libopenblas.so.0. */
#define OPENBLAS_SONAME "libopenblas.so.0"
#ifdef CORE_OPENBLAS_DIR
static const char *const openblas_omp_path = CORE_OPENBLAS_DIR "/" OPENBLAS_SONAME;
#else
static const char *const openblas_omp_path = NULL;
#endif
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
#ifdef CORE_HAVE_DNNL
	struct {
		__typeof__(dnnl_engine_create) *engine_create;
		__typeof__(dnnl_stream_create) *stream_create;
		__typeof__(dnnl_stream_destroy) *stream_destroy;
		__typeof__(dnnl_engine_destroy) *engine_destroy;
		__typeof__(dnnl_memory_desc_init_by_strides) *md_init;
		__typeof__(dnnl_matmul_desc_init) *matmul_init;
		__typeof__(dnnl_primitive_attr_create) *attr_create;
		__typeof__(dnnl_primitive_attr_destroy) *attr_destroy;
		__typeof__(dnnl_primitive_attr_set_scratchpad_mode) *attr_scratchpad;
		__typeof__(dnnl_primitive_attr_set_output_scales) *attr_scales;
		__typeof__(dnnl_primitive_attr_set_post_ops) *attr_post_ops;
		__typeof__(dnnl_post_ops_create) *po_create;
		__typeof__(dnnl_post_ops_append_sum) *po_sum;
		__typeof__(dnnl_post_ops_destroy) *po_destroy;
		__typeof__(dnnl_primitive_desc_create) *pd_create;
		__typeof__(dnnl_primitive_desc_destroy) *pd_destroy;
		__typeof__(dnnl_primitive_desc_query_md) *pd_query_md;
		__typeof__(dnnl_memory_desc_get_size) *md_size;
		__typeof__(dnnl_primitive_create) *prim_create;
		__typeof__(dnnl_primitive_destroy) *prim_destroy;
		__typeof__(dnnl_memory_create) *mem_create;
		__typeof__(dnnl_memory_set_data_handle) *mem_set;
		__typeof__(dnnl_memory_destroy) *mem_destroy;
		__typeof__(dnnl_primitive_execute) *execute;
		__typeof__(dnnl_stream_wait) *stream_wait;
	} mm;
#endif
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
	if (openblas_omp_path) /* the OpenMP build first, by its path */
		lib = dl_load(openblas_omp_path, NULL, sym, 4, why, why_len);
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


#if defined(__x86_64__)
/* ---- bfloat16 products: oneDNN's matmul primitive ---------------------------------------
 *
 * oneDNN 2.6 has no bf16 gemm in its C API (and its fpmath_mode attribute is accepted by the
 * f32 matmul but changes nothing), so: each operand converted into a compact bf16 buffer
 * (keeping its orientation: a transpose is a stride of the memory descriptor), a matmul
 * primitive with bf16 source and weights and f32 destination, alpha as its output scale and
 * beta as a sum post-op. Compact buffers are not only the conversion's place: the AMX kernel
 * (brg:avx512_core_amx) takes dense operands only, and any padding of a leading dimension
 * drops the primitive to a jit gemm slower than fp32's. For the same reason a destination
 * whose ldc is not N is computed in a dense scratch and copied back.
 *
 * Everything is per thread (attention calls this from inside a parallel region, one product
 * per thread): engine, stream, the primitives made so far, keyed by what they bake in, their
 * memory objects, the scratch buffers. A primitive is made with OpenMP's thread count at 1
 * outside parallel regions and runs sequentially inside one (nested regions are inactive).
 */

#define BF16_CACHE 96

struct bf16_prim {
	int ta, tb, M, N, K;
	float alpha, beta;
	dnnl_primitive_t prim;
	dnnl_memory_t a, b, c, scratch;
	size_t scratch_bytes;
};

struct bf16_thread {
	int ready;
	dnnl_engine_t engine;
	dnnl_stream_t stream;
	struct bf16_prim cache[BF16_CACHE];
	int n, next; /* entries used; the next one to replace when full */
	uint16_t *ah, *bh;
	float *ct;
	void *scratch;
	size_t ah_n, bh_n, ct_n, scratch_bytes;
};

static _Thread_local struct bf16_thread bt;

static void prim_free(struct bf16_prim *e);

/* When a thread ends (OpenMP ends the threads a smaller team no longer needs): its
 * primitives, oneDNN objects and buffers. */
static void bf16_thread_free(void *p)
{
	struct bf16_thread *t = p;
	for (int i = 0; i < t->n; i++)
		prim_free(&t->cache[i]);
	if (t->stream)
		g.mm.stream_destroy(t->stream);
	if (t->engine)
		g.mm.engine_destroy(t->engine);
	free(t->ah);
	free(t->bh);
	free(t->ct);
	free(t->scratch);
	memset(t, 0, sizeof *t);
}

static pthread_key_t bf16_key;
static pthread_once_t bf16_key_once = PTHREAD_ONCE_INIT;
static void bf16_key_make(void) { pthread_key_create(&bf16_key, bf16_thread_free); }

/* dst[r * cols + c] = bf16(src[r * ld + c]): rows of a float matrix into a compact bf16 one */
__attribute__((target("avx512f,avx512bf16,avx512vl")))
static void to_bf16_rows(uint16_t *dst, const float *src, int rows, int cols, int ld)
{
	for (int r = 0; r < rows; r++) {
		const float *s = src + (size_t)r * ld;
		uint16_t *d = dst + (size_t)r * cols;
		int c = 0;
		for (; c + 16 <= cols; c += 16) {
			__m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(s + c));
			_mm256_storeu_si256((__m256i *)(d + c), (__m256i)h);
		}
		if (c < cols) {
			__mmask16 m = (__mmask16)((1u << (cols - c)) - 1);
			__m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, s + c));
			_mm256_mask_storeu_epi16(d + c, m, (__m256i)h);
		}
	}
}

static int grow(void **p, size_t *have, size_t want, size_t elem)
{
	if (want <= *have)
		return 0;
	void *q = aligned_alloc(64, (want * elem + 63) / 64 * 64);
	if (!q)
		return CORE_ENOMEM;
	free(*p);
	*p = q;
	*have = want;
	return 0;
}

static void prim_free(struct bf16_prim *e)
{
	if (e->prim)
		g.mm.prim_destroy(e->prim);
	dnnl_memory_t *m[] = {&e->a, &e->b, &e->c, &e->scratch};
	for (size_t i = 0; i < 4; i++)
		if (*m[i])
			g.mm.mem_destroy(*m[i]);
	memset(e, 0, sizeof *e);
}

static int prim_make(struct bf16_prim *e, int ta, int tb, int M, int N, int K, float alpha,
		     float beta)
{
	memset(e, 0, sizeof *e);
	const dnnl_dims_t ad = {M, K}, bd = {K, N}, cd = {M, N};
	const dnnl_dims_t as = {ta ? 1 : K, ta ? M : 1}, bs = {tb ? 1 : N, tb ? K : 1};
	const dnnl_dims_t cs = {N, 1};
	dnnl_memory_desc_t amd, bmd, cmd;
	dnnl_matmul_desc_t md;
	dnnl_primitive_attr_t attr = NULL;
	dnnl_post_ops_t po = NULL;
	dnnl_primitive_desc_t pd = NULL;
	int ok = g.mm.md_init(&amd, 2, ad, dnnl_bf16, as) == dnnl_success &&
		 g.mm.md_init(&bmd, 2, bd, dnnl_bf16, bs) == dnnl_success &&
		 g.mm.md_init(&cmd, 2, cd, dnnl_f32, cs) == dnnl_success &&
		 g.mm.matmul_init(&md, &amd, &bmd, NULL, &cmd) == dnnl_success &&
		 g.mm.attr_create(&attr) == dnnl_success &&
		 g.mm.attr_scratchpad(attr, dnnl_scratchpad_mode_user) == dnnl_success;
	if (ok && alpha != 1.0f)
		ok = g.mm.attr_scales(attr, 1, 0, &alpha) == dnnl_success;
	if (ok && beta != 0.0f)
		ok = g.mm.po_create(&po) == dnnl_success && g.mm.po_sum(po, beta) == dnnl_success &&
		     g.mm.attr_post_ops(attr, po) == dnnl_success;
	ok = ok && g.mm.pd_create(&pd, &md, attr, bt.engine, NULL) == dnnl_success &&
	     g.mm.prim_create(&e->prim, pd) == dnnl_success;
	const dnnl_memory_desc_t *smd = ok ? g.mm.pd_query_md(pd, dnnl_query_scratchpad_md, 0)
					   : NULL;
	if (ok) {
		e->scratch_bytes = smd ? g.mm.md_size(smd) : 0;
		ok = g.mm.mem_create(&e->a, &amd, bt.engine, DNNL_MEMORY_NONE) == dnnl_success &&
		     g.mm.mem_create(&e->b, &bmd, bt.engine, DNNL_MEMORY_NONE) == dnnl_success &&
		     g.mm.mem_create(&e->c, &cmd, bt.engine, DNNL_MEMORY_NONE) == dnnl_success &&
		     (!e->scratch_bytes || g.mm.mem_create(&e->scratch, smd, bt.engine,
							   DNNL_MEMORY_NONE) == dnnl_success);
	}
	if (pd)
		g.mm.pd_destroy(pd);
	if (po)
		g.mm.po_destroy(po);
	if (attr)
		g.mm.attr_destroy(attr);
	if (!ok) {
		prim_free(e);
		return CORE_ENOMEM;
	}
	e->ta = ta, e->tb = tb, e->M = M, e->N = N, e->K = K, e->alpha = alpha, e->beta = beta;
	return 0;
}

static struct bf16_prim *prim_get(int ta, int tb, int M, int N, int K, float alpha,
				  float beta)
{
	for (int i = 0; i < bt.n; i++) {
		struct bf16_prim *e = &bt.cache[i];
		if (e->M == M && e->N == N && e->K == K && e->ta == ta && e->tb == tb &&
		    e->alpha == alpha && e->beta == beta)
			return e;
	}
	struct bf16_prim *e = &bt.cache[bt.n < BF16_CACHE ? bt.n++ : bt.next++ % BF16_CACHE];
	prim_free(e);
	/* Made for one thread, inside a parallel region too: a primitive partitions its work
	 * for the thread count OpenMP reports when it is made (which inside a region is the
	 * count a nested region would get, not 1), runs those parts one after the other
	 * inside a region, and sums K differently for different partitions. */
	const int threads = omp_get_max_threads();
	if (threads != 1)
		omp_set_num_threads(1);
	int rc = prim_make(e, ta, tb, M, N, K, alpha, beta);
	if (threads != 1)
		omp_set_num_threads(threads);
	return rc < 0 ? NULL : e;
}

/* rows of cols bfloat16 values, ld apart at src, into dst without padding */
static void pack_bf16_rows(uint16_t *dst, const uint16_t *src, int rows, int cols, int ld)
{
	for (int r = 0; r < rows; r++)
		memcpy(dst + (size_t)r * cols, src + (size_t)r * ld, sizeof *dst * (size_t)cols);
}

static int dnnl_gemm_bf16(int ta, int tb, int M, int N, int K, float alpha, const float *A,
			  int lda, const float *B, int ldb, float beta, float *C, int ldc,
			  const uint16_t *ah, int ldah, const uint16_t *bh, int ldbh)
{
	if (M <= 0 || N <= 0)
		return 0;
	if (K <= 0) { /* C = beta C (no product), as sgemm */
		for (int i = 0; i < M; i++)
			for (int j = 0; j < N; j++)
				C[(size_t)i * ldc + j] = beta != 0.0f ? beta * C[(size_t)i * ldc + j]
								      : 0.0f;
		return 0;
	}
	if (!bt.ready) {
		if (g.mm.engine_create(&bt.engine, dnnl_cpu, 0) != dnnl_success ||
		    g.mm.stream_create(&bt.stream, bt.engine, dnnl_stream_default_flags) !=
			    dnnl_success)
			return CORE_ENOMEM;
		bt.ready = 1;
		pthread_once(&bf16_key_once, bf16_key_make);
		pthread_setspecific(bf16_key, &bt);
	}
	const size_t na = (size_t)M * K, nb = (size_t)K * N, nc = ldc == N ? 0 : (size_t)M * N;
	/* op(A) [M,K] is A's M rows of K (ta 0) or its K rows of M (ta 1); B likewise */
	const int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
	const int apack = ah && ldah && ldah != ac, bpack = bh && ldbh && ldbh != bc;
	struct bf16_prim *e = prim_get(ta, tb, M, N, K, alpha, beta);
	if (!e || ((!ah || apack) && grow((void **)&bt.ah, &bt.ah_n, na, 2) < 0) ||
	    ((!bh || bpack) && grow((void **)&bt.bh, &bt.bh_n, nb, 2) < 0) ||
	    grow((void **)&bt.ct, &bt.ct_n, nc, 4) < 0 ||
	    grow(&bt.scratch, &bt.scratch_bytes, e->scratch_bytes, 1) < 0)
		return CORE_ENOMEM;
	if (!ah)
		to_bf16_rows(bt.ah, A, ar, ac, lda);
	else if (apack)
		pack_bf16_rows(bt.ah, ah, ar, ac, ldah);
	if (!bh)
		to_bf16_rows(bt.bh, B, br, bc, ldb);
	else if (bpack)
		pack_bf16_rows(bt.bh, bh, br, bc, ldbh);
	if (apack)
		ah = bt.ah;
	if (bpack)
		bh = bt.bh;
	float *c = C;
	if (nc) {
		c = bt.ct;
		for (int i = 0; beta != 0.0f && i < M; i++)
			memcpy(c + (size_t)i * N, C + (size_t)i * ldc, sizeof(float) * (size_t)N);
	}
	g.mm.mem_set(e->a, ah ? (void *)ah : bt.ah);
	g.mm.mem_set(e->b, bh ? (void *)bh : bt.bh);
	g.mm.mem_set(e->c, c);
	dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e->a}, {DNNL_ARG_WEIGHTS, e->b},
				   {DNNL_ARG_DST, e->c}, {DNNL_ARG_SCRATCHPAD, e->scratch}};
	if (e->scratch)
		g.mm.mem_set(e->scratch, bt.scratch);
	if (g.mm.execute(e->prim, bt.stream, e->scratch ? 4 : 3, args) != dnnl_success ||
	    g.mm.stream_wait(bt.stream) != dnnl_success)
		return CORE_ENOMEM;
	for (int i = 0; nc && i < M; i++)
		memcpy(C + (size_t)i * ldc, c + (size_t)i * N, sizeof(float) * (size_t)N);
	return 0;
}

/* The matmul primitive's entry points, and whether this CPU runs bf16 products at all. */
static void load_dnnl_bf16(void)
{
	const struct dl_sym sym[] = {
		{"dnnl_engine_create", (void **)&g.mm.engine_create},
		{"dnnl_stream_create", (void **)&g.mm.stream_create},
		{"dnnl_stream_destroy", (void **)&g.mm.stream_destroy},
		{"dnnl_engine_destroy", (void **)&g.mm.engine_destroy},
		{"dnnl_memory_desc_init_by_strides", (void **)&g.mm.md_init},
		{"dnnl_matmul_desc_init", (void **)&g.mm.matmul_init},
		{"dnnl_primitive_attr_create", (void **)&g.mm.attr_create},
		{"dnnl_primitive_attr_destroy", (void **)&g.mm.attr_destroy},
		{"dnnl_primitive_attr_set_scratchpad_mode", (void **)&g.mm.attr_scratchpad},
		{"dnnl_primitive_attr_set_output_scales", (void **)&g.mm.attr_scales},
		{"dnnl_primitive_attr_set_post_ops", (void **)&g.mm.attr_post_ops},
		{"dnnl_post_ops_create", (void **)&g.mm.po_create},
		{"dnnl_post_ops_append_sum", (void **)&g.mm.po_sum},
		{"dnnl_post_ops_destroy", (void **)&g.mm.po_destroy},
		{"dnnl_primitive_desc_create", (void **)&g.mm.pd_create},
		{"dnnl_primitive_desc_destroy", (void **)&g.mm.pd_destroy},
		{"dnnl_primitive_desc_query_md", (void **)&g.mm.pd_query_md},
		{"dnnl_memory_desc_get_size", (void **)&g.mm.md_size},
		{"dnnl_primitive_create", (void **)&g.mm.prim_create},
		{"dnnl_primitive_destroy", (void **)&g.mm.prim_destroy},
		{"dnnl_memory_create", (void **)&g.mm.mem_create},
		{"dnnl_memory_set_data_handle", (void **)&g.mm.mem_set},
		{"dnnl_memory_destroy", (void **)&g.mm.mem_destroy},
		{"dnnl_primitive_execute", (void **)&g.mm.execute},
		{"dnnl_stream_wait", (void **)&g.mm.stream_wait},
	};
	if (!g.blas.cpu.avx512_bf16) {
		snprintf(g.blas.why_no_bf16, sizeof g.blas.why_no_bf16,
			 "this CPU has no AVX512_BF16 instructions");
		return;
	}
	for (size_t i = 0; i < sizeof sym / sizeof sym[0]; i++)
		if (!(*sym[i].slot = dlsym(g.lib, sym[i].name))) {
			snprintf(g.blas.why_no_bf16, sizeof g.blas.why_no_bf16, "%s has no %s",
				 DNNL_SONAME, sym[i].name);
			return;
		}
	g.blas.gemm_bf16 = dnnl_gemm_bf16;
	g.blas.to_bf16 = to_bf16_rows;
}

#else
static void load_dnnl_bf16(void)
{
	snprintf(g.blas.why_no_bf16, sizeof g.blas.why_no_bf16,
		 "the bf16 products are built for x86-64 only");
}
#endif

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
	load_dnnl_bf16();
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
	/* until oneDNN says otherwise */
	snprintf(g.blas.why_no_bf16, sizeof g.blas.why_no_bf16, "%s",
#ifdef CORE_HAVE_DNNL
		 "the matrix products run on OpenBLAS, which has no bf16 kernel here (unset "
		 "CORE_CPU_BLAS and OPENBLAS_CORETYPE for oneDNN's)"
#else
		 "this binary was built without oneDNN (libdnnl-dev)"
#endif
	);
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
