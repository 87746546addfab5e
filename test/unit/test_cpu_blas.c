/* test_cpu_blas.c - the cpu backend's choice of matrix-product library and kernel
 * (lib/backend/cpu/cpu_blas.h), and its flushing of subnormal numbers on every thread.
 *
 * The hardware cannot be faked, so the decision (which OpenBLAS core to force) is checked on
 * a table of CPU feature sets and core names; the feature detection against the kernel's own
 * reading of cpuid (/proc/cpuinfo's flags); and the loading on this machine, each test in
 * its own process (Criterion's), so that every one makes the once-per-process choice anew
 * under its own environment.
 */
#include <criterion/criterion.h>
#include <float.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_blas.h"
#include "common/err.h"

/* What the CPUs the project meets report (their cpuid, as cpu_features_detect reads it). */
static const struct cpu_features sse_only = {0};
static const struct cpu_features sandy = {.avx = 1};
static const struct cpu_features haswell = {.avx = 1, .avx2_fma = 1};
static const struct cpu_features zen3 = {.amd = 1, .avx = 1, .avx2_fma = 1};
static const struct cpu_features skx = {.avx = 1, .avx2_fma = 1, .avx512 = 1};
/* family 6 model 207: OpenBLAS 0.3.21 does not know it and picks Prescott */
static const struct cpu_features emerald = {
	.avx = 1, .avx2_fma = 1, .avx512 = 1, .avx512_bf16 = 1, .amx_bf16 = 1};
static const struct cpu_features zen4 = {
	.amd = 1, .avx = 1, .avx2_fma = 1, .avx512 = 1, .avx512_bf16 = 1};

Test(cpu_blas, openblas_core_correction_table)
{
	static const struct {
		const struct cpu_features *f;
		const char *cpu, *chosen, *want; /* want NULL: keep OpenBLAS's choice */
	} t[] = {
		{&emerald, "model 207", "Prescott", "SkylakeX"},
		{&emerald, "model 207", "PRESCOTT", "SkylakeX"}, /* names in any case */
		{&emerald, "model 207", "Haswell", "SkylakeX"},
		{&emerald, "model 207", "Sandybridge", "SkylakeX"},
		{&emerald, "model 207", "SkylakeX", NULL},
		{&emerald, "model 207", "Cooperlake", NULL},     /* same level: it knows better */
		{&emerald, "model 207", "SapphireRapids", NULL},
		{&emerald, "model 207", "GraniteRapids", NULL},  /* a newer OpenBLAS's name */
		{&emerald, "model 207", NULL, NULL},
		{&skx, "Skylake-SP", "Core2", "SkylakeX"},
		{&skx, "Skylake-SP", "SkylakeX", NULL},
		{&zen4, "Zen 4", "Zen", "SkylakeX"},
		{&zen4, "Zen 4", "Cooperlake", NULL},
		{&zen3, "Zen 3", "Zen", NULL},
		{&zen3, "Zen 3", "Haswell", NULL},             /* AVX2 both */
		{&zen3, "Zen 3", "Barcelona", "Zen"},
		{&zen3, "Zen 3", "Prescott", "Zen"},
		{&haswell, "Haswell", "Prescott", "Haswell"},
		{&haswell, "Haswell", "Sandybridge", "Haswell"},
		{&haswell, "Haswell", "Haswell", NULL},
		{&haswell, "Haswell", "Zen", NULL},
		{&sandy, "Sandy Bridge", "Nehalem", "Sandybridge"},
		{&sandy, "Sandy Bridge", "Sandybridge", NULL},
		{&sse_only, "SSE3 only", "Prescott", NULL},
		{&sse_only, "SSE3 only", "Katmai", NULL},
	};
	for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
		const char *got = cpu_openblas_correction(t[i].f, t[i].chosen);
		cr_expect((got == NULL && t[i].want == NULL) ||
			  (got && t[i].want && strcmp(got, t[i].want) == 0),
			  "%s, OpenBLAS chose %s: forced %s, expected %s", t[i].cpu,
			  t[i].chosen ? t[i].chosen : "(null)", got ? got : "nothing",
			  t[i].want ? t[i].want : "nothing");
	}
}

Test(cpu_blas, openblas_core_levels)
{
	cr_expect_eq(cpu_openblas_core_level("Prescott"), 0);
	cr_expect_eq(cpu_openblas_core_level("Nehalem"), 0);
	cr_expect_eq(cpu_openblas_core_level("Sandybridge"), 1);
	cr_expect_eq(cpu_openblas_core_level("Haswell"), 2);
	cr_expect_eq(cpu_openblas_core_level("zen"), 2);
	cr_expect_eq(cpu_openblas_core_level("SkylakeX"), 3);
	cr_expect_eq(cpu_openblas_core_level("SapphireRapids"), 3);
	cr_expect_eq(cpu_openblas_core_level("Unknown"), -1);
	cr_expect_eq(cpu_openblas_core_level(""), -1);
}

/* 1 when /proc/cpuinfo's first "flags" line has every flag of the space-separated list */
static int cpuinfo_has(const char *line, const char *flags)
{
	char want[256], pad[4096];
	snprintf(want, sizeof want, "%s", flags);
	snprintf(pad, sizeof pad, " %s ", line);
	for (char *f = strtok(want, " "); f; f = strtok(NULL, " ")) {
		char key[64];
		snprintf(key, sizeof key, " %s ", f);
		if (!strstr(pad, key))
			return 0;
	}
	return 1;
}

Test(cpu_blas, features_agree_with_the_kernel)
{
	FILE *fp = fopen("/proc/cpuinfo", "r");
	if (!fp)
		cr_skip_test("no /proc/cpuinfo to compare with");
	char line[4096] = "", *flags = NULL;
	while (fgets(line, sizeof line, fp))
		if (strncmp(line, "flags", 5) == 0 && (flags = strchr(line, ':'))) {
			flags++;
			flags[strcspn(flags, "\n")] = 0;
			break;
		}
	fclose(fp);
	if (!flags)
		cr_skip_test("/proc/cpuinfo has no flags line (not x86?)");
	struct cpu_features f;
	cpu_features_detect(&f);
	/* Linux lists a flag only when the OS also saves its registers */
	cr_expect_eq(f.avx, cpuinfo_has(flags, "avx"), "avx: %d", f.avx);
	cr_expect_eq(f.avx2_fma, cpuinfo_has(flags, "avx avx2 fma"), "avx2+fma: %d", f.avx2_fma);
	cr_expect_eq(f.avx512, cpuinfo_has(flags, "avx512f avx512cd avx512bw avx512dq avx512vl"),
		     "avx512: %d", f.avx512);
	cr_expect_eq(f.avx512_bf16, f.avx512 && cpuinfo_has(flags, "avx512_bf16"),
		     "avx512_bf16: %d", f.avx512_bf16);
	cr_expect_eq(f.amx_bf16, cpuinfo_has(flags, "amx_bf16 amx_tile"), "amx_bf16: %d",
		     f.amx_bf16);
}

/* The kernel a cpu backend opened in this process runs. */
static const char *opened_kernel(void)
{
	struct backend *be = NULL;
	int rc = backend_open(&be, "cpu", NULL);
	cr_assert_eq(rc, 0, "backend_open: %s", err_detail());
	static char kernel[96];
	snprintf(kernel, sizeof kernel, "%s", be->gemm_kernel);
	backend_close(be);
	return kernel;
}

/* OpenBLAS as installed, without OPENBLAS_CORETYPE: whatever it picked by itself, the core
 * that runs is of the level this CPU has (on family 6 model 207, Prescott corrected to
 * SkylakeX), and the environment is as it was. */
Test(cpu_blas, openblas_runs_the_cpus_level)
{
	setenv("CORE_CPU_BLAS", "openblas", 1);
	unsetenv("OPENBLAS_CORETYPE");
	const char *k = opened_kernel();
	cr_assert(strncmp(k, "openblas ", 9) == 0, "kernel '%s'", k);
	const char *core = strrchr(k, ' ') + 1;
	struct cpu_features f;
	cpu_features_detect(&f);
	const char *best = f.avx512 ? "SkylakeX" : f.avx2_fma ? (f.amd ? "Zen" : "Haswell")
			   : f.avx ? "Sandybridge" : "Prescott";
	cr_expect_geq(cpu_openblas_core_level(core), cpu_openblas_core_level(best),
		      "kernel '%s' on a CPU that runs %s", k, best);
	cr_expect_null(getenv("OPENBLAS_CORETYPE"), "the environment was left changed");
	const struct cpu_blas *b;
	cr_assert_eq(cpu_blas_get(&b), 0);
	if (b->corrected_from[0])
		cr_log_info("OpenBLAS chose %s by itself; %s runs", b->corrected_from, core);
}

/* A core the user forces is the core that runs, even a slower one. */
Test(cpu_blas, openblas_coretype_of_the_user_is_respected)
{
	struct cpu_features f;
	cpu_features_detect(&f);
	if (!f.avx2_fma)
		cr_skip_test("this CPU has no AVX2: Haswell cannot be forced");
	unsetenv("CORE_CPU_BLAS");
	setenv("OPENBLAS_CORETYPE", "Haswell", 1);
	const char *k = opened_kernel();
	cr_expect(strncmp(k, "openblas ", 9) == 0 && strstr(k, " Haswell"), "kernel '%s'", k);
	cr_expect_str_eq(getenv("OPENBLAS_CORETYPE"), "Haswell");
}

Test(cpu_blas, default_names_its_kernel)
{
	unsetenv("CORE_CPU_BLAS");
	unsetenv("OPENBLAS_CORETYPE");
	const char *k = opened_kernel();
	cr_expect(strncmp(k, "onednn ", 7) == 0 || strncmp(k, "openblas ", 9) == 0,
		  "kernel '%s'", k);
	cr_log_info("default kernel: %s", k);
}

Test(cpu_blas, unknown_library_is_a_usage_error)
{
	setenv("CORE_CPU_BLAS", "mkl", 1);
	struct backend *be = NULL;
	int rc = backend_open(&be, "cpu", NULL);
	cr_expect_eq(rc, CORE_EUSAGE, "rc %d", rc);
	cr_expect_null(be);
	cr_expect(strstr(err_detail(), "CORE_CPU_BLAS='mkl'") != NULL, "%s", err_detail());
}

/* ---- subnormals ------------------------------------------------------------------------ */

/* 1 when the bits of f are not those of +0 or -0. Not f != 0: this thread compares with
 * denormals-are-zero set once a cpu backend is open, so a subnormal would compare equal. */
static int nonzero_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	return (u & 0x7fffffffu) != 0;
}

/* OpenMP's pool started before any backend is opened, its threads with the floating-point
 * state they were born with (subnormals kept), as in a program that ran a parallel region of
 * its own first: the backend must flush on each of them, not only on the threads it makes. */
static void start_pool(int threads)
{
	volatile int ran = 0;
#pragma omp parallel num_threads(threads)
	{
#pragma omp atomic
		ran++;
	}
	cr_assert_eq(ran, threads);
}

/* y += x with y = 0 and x subnormal, over enough elements that every thread adds its own
 * part: DAZ reads x as zero (and FTZ would flush x + 0), so every y stays 0. Without them
 * y = x exactly. */
static void check_add_flushes(int threads)
{
	struct backend *be = NULL;
	start_pool(threads);
	cr_assert_eq(backend_open(&be, "cpu", &(struct backend_params){.threads = threads}), 0);
	const size_t n = (size_t)1 << 20;
	float *x, *y;
	cr_assert_eq(be->op->alloc(be, (void **)&x, n * sizeof(float)), 0);
	cr_assert_eq(be->op->alloc(be, (void **)&y, n * sizeof(float)), 0);
	const float sub = FLT_MIN / 1024.0f; /* 2^-136, a subnormal */
	for (size_t i = 0; i < n; i++) {
		x[i] = sub;
		y[i] = 0.0f;
	}
	cr_assert_eq(be->op->add_f32(be, y, x, n), 0);
	size_t kept = 0, first = n;
	for (size_t i = 0; i < n; i++)
		if (nonzero_bits(y[i])) {
			kept++;
			if (first == n)
				first = i;
		}
	cr_expect_eq(kept, 0, "%d threads: %zu of %zu sums kept a subnormal (first at %zu of "
		     "thread share %zu)", threads, kept, n, first, first / (n / (size_t)threads));
	be->op->free(be, x);
	be->op->free(be, y);
	backend_close(be);
}

Test(cpu_blas, subnormals_flushed_on_every_thread_elementwise)
{
	check_add_flushes(4);
	check_add_flushes(2);
	check_add_flushes(1);
}

/* A product whose every result is subnormal (64 terms of 2^-70 * 2^-70 = 2^-140 each, 2^-134
 * in all), large enough that sgemm splits it over the threads: each block flushes to zero. */
Test(cpu_blas, subnormals_flushed_on_every_thread_in_products)
{
	const int threads[] = {3, 2, 1};
	for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
		struct backend *be = NULL;
		start_pool(threads[t]);
		cr_assert_eq(backend_open(&be, "cpu",
					  &(struct backend_params){.threads = threads[t]}), 0);
		const int M = 2048, N = 128, K = 64;
		float *a, *b, *c;
		cr_assert_eq(be->op->alloc(be, (void **)&a, sizeof(float) * M * K), 0);
		cr_assert_eq(be->op->alloc(be, (void **)&b, sizeof(float) * K * N), 0);
		cr_assert_eq(be->op->alloc(be, (void **)&c, sizeof(float) * M * N), 0);
		const float tiny = 0x1p-70f;
		for (int i = 0; i < M * K; i++)
			a[i] = tiny;
		for (int i = 0; i < K * N; i++)
			b[i] = tiny;
		for (int i = 0; i < M * N; i++)
			c[i] = 1.0f;
		cr_assert_eq(be->op->gemm(be, 0, 0, M, N, K, 1.0f, a, K, b, N, 0.0f, c, N), 0);
		int kept = 0, first = -1;
		for (int i = 0; i < M * N; i++)
			if (nonzero_bits(c[i]) && kept++ == 0)
				first = i;
		cr_expect_eq(kept, 0, "%d threads: %d of %d products kept a nonzero (first at "
			     "row %d: %g)", threads[t], kept, M * N, first / N,
			     first >= 0 ? (double)c[first] : 0.0);
		be->op->free(be, a);
		be->op->free(be, b);
		be->op->free(be, c);
		backend_close(be);
	}
}

/* ---- bfloat16 products ------------------------------------------------------------------ */

/* The same bits at any thread count, on shapes of a gpt-tiny step that sgemm splits: forward
 * (NN), the input gradient (NT) and the weight gradient (TN, K = B*T, where oneDNN's AMX
 * kernel blocks K by the block's shape: only a split fixed by the shape keeps the bits). */
Test(cpu_blas, bf16_products_same_bits_at_any_thread_count, .timeout = 60)
{
	const struct cpu_blas *b;
	cr_assert_eq(cpu_blas_get(&b), 0);
	if (!b->gemm_bf16)
		cr_skip_test("no bf16 products here: %s", b->why_no_bf16);
	static const int shapes[][5] = {
		{0, 0, 2048, 768, 256}, {0, 1, 2048, 256, 1024}, {1, 0, 256, 768, 2048},
		{1, 0, 1024, 256, 2048}, {0, 0, 100, 3000, 70}};
	const size_t big = (size_t)2048 * 1024;
	float *A = malloc(4 * big), *B = malloc(4 * big), *C[3];
	cr_assert(A && B);
	for (size_t i = 0; i < big; i++) {
		A[i] = (float)((i * 2654435761u % 2001) / 1000.0 - 1.0);
		B[i] = (float)((i * 40503u % 1999) / 999.0 - 1.0);
	}
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		const int ta = shapes[s][0], tb = shapes[s][1], M = shapes[s][2], N = shapes[s][3];
		const int K = shapes[s][4];
		for (int t = 0; t < 3; t++) {
			struct backend *be = NULL;
			cr_assert_eq(backend_open(&be, "cpu", &(struct backend_params){
				.threads = t + 1, .precision = BACKEND_BF16}), 0, "%s", err_detail());
			C[t] = malloc(sizeof(float) * (size_t)M * N);
			cr_assert(C[t]);
			cr_assert_eq(be->op->gemm(be, ta, tb, M, N, K, 1.0f, A, ta ? M : K, B,
						  tb ? K : N, 0.0f, C[t], N), 0);
			backend_close(be);
		}
		for (int t = 1; t < 3; t++)
			cr_expect(memcmp(C[0], C[t], sizeof(float) * (size_t)M * N) == 0,
				  "ta %d tb %d M %d N %d K %d: %d threads differ from 1", ta, tb, M,
				  N, K, t + 1);
		for (int t = 0; t < 3; t++)
			free(C[t]);
	}
	free(A);
	free(B);
}

/* Where bf16 cannot run, backend_open refuses it in one line that says why (exit 2 in the
 * programs); forced here through OpenBLAS, which has no bf16 kernel in this backend. */
Test(cpu_blas, bf16_refused_with_the_reason)
{
	setenv("CORE_CPU_BLAS", "openblas", 1);
	struct backend *be = NULL;
	int rc = backend_open(&be, "cpu", &(struct backend_params){.precision = BACKEND_BF16});
	cr_expect_eq(rc, CORE_EUSAGE, "rc %d", rc);
	cr_expect_null(be);
	cr_expect(strstr(err_detail(), "bf16") && strstr(err_detail(), "OpenBLAS") &&
		  !strchr(err_detail(), '\n'), "%s", err_detail());
}
