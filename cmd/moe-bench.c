/* moe-bench.c - run and time one Mixture-of-Experts layer on the CPU; see man/moe-bench.1.
 *
 * Thin: parse options, build a layer with libcore (lib/moe.h), time it, print a table on
 * stderr and one JSON object per measured formulation on stdout. */
#include <cblas.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/err.h"
#include "io/trace.h"
#include "moe/moe.h"
#include "common/progress.h"
#include "common/rng.h"
#include "common/banned.h"

static const char *prog = "moe-bench";

static void usage(FILE *f)
{
	fprintf(f,
"Usage: moe-bench [OPTION]...\n"
"Run and time one Mixture-of-Experts layer (forward and backward) on the CPU and print\n"
"a table on stderr and one JSON object per measured run on stdout.\n"
"\n"
"Shape:\n"
"  -T, --tokens=N           tokens per step T (default 4096)\n"
"  -M, --model-dim=N        model dimension M (default 1024)\n"
"  -H, --hidden-dim=N       expert hidden dimension H (default 4096)\n"
"  -E, --experts=N          number of experts E, >= 1 (default 16)\n"
"  -k, --top-k=N            experts per token, 1..E (default 2)\n"
"Routing:\n"
"  -c, --capacity=X         capacity setting, as Tutel: X > 0 fixed factor,\n"
"                           C = k*int(X*ceil(T/E)); 0: smallest C that drops nothing;\n"
"                           X < 0: that, capped at k*int(|X|*ceil(T/E)) (default 1.0)\n"
"      --capacity-align=N   round C up to a multiple of N (default 1)\n"
"      --bpr                batch-prioritized routing (Tutel default: off)\n"
"      --no-bpr             route tokens in their order (default)\n"
"      --gate-noise=S       add S/E * N(0,1) to the gate logits (default 0)\n"
"      --aux-loss=NAME      gshard (default) or load-importance (needs --gate-noise)\n"
"      --activation=NAME    expert activation: relu (default) or gelu\n"
"      --trace=FILE         capacity settings, one per line, one per step, replayed\n"
"                           cyclically ('#' comments and blank lines ignored)\n"
"Measurement:\n"
"      --forward-only       time the forward pass only\n"
"      --no-input-grad      backward without the input gradient (as Tutel's helloworld,\n"
"                           whose input needs no gradient)\n"
"      --only=PART          layer (default: the whole layer) or encode-decode (the\n"
"                           encode and decode kernels alone, next to a plain copy of\n"
"                           the same bytes)\n"
"      --baseline=KIND      sparse (default): the sparse layer alone; dense: also run\n"
"                           the dense GShard formulation on the same inputs\n"
"      --dense-tokens=N     run the dense baseline with N tokens instead of T (its\n"
"                           [T,E,C] tensors grow as T^2; the JSON says so)\n"
"      --dry-run            print the memory each formulation would need and exit\n"
"  -n, --iterations=N       timed steps (default 10)\n"
"  -w, --warmup=N           untimed steps first (default 2)\n"
"  -s, --seed=N             seed for parameters, inputs and gate noise (default 1)\n"
"  -t, --threads=N          OpenMP and BLAS threads (default: OMP_NUM_THREADS or all)\n"
"  -h, --help               print this help and exit\n"
"  -V, --version            print the version and exit\n"
"\n"
"OpenMP threads busy-wait between kernels (OMP_WAIT_POLICY=active, set by re-running\n"
"itself when the variable is unset): on virtual machines a sleeping thread can take a\n"
"whole timer tick to wake, which adds milliseconds to every kernel.\n"
"\n"
"Exit status: 0 success, 1 runtime failure, 2 usage error (inconsistent sizes,\n"
"k > E, E < 1, malformed trace file).\n");
}

struct opts {
	struct moe_config cfg;
	int forward_only, dense, encdec, dry_run, no_dx;
	int64_t dense_T;
	long iters, warmup, threads;
	const char *trace_path;
	double *trace;
	size_t trace_n;
};

/* Per-step samples of one run. */
struct samples {
	long n;
	double *step, *fwd, *bwd;
	struct moe_times *st;
	int64_t *dropped, *C, *rows;
};

static void samples_free(struct samples *s)
{
	free(s->step);
	free(s->fwd);
	free(s->bwd);
	free(s->st);
	free(s->dropped);
	free(s->C);
	free(s->rows);
}

/* On failure nothing stays allocated. */
static int samples_alloc(struct samples *s, long n)
{
	memset(s, 0, sizeof *s);
	s->n = n;
	s->step = calloc((size_t)n, sizeof(double));
	s->fwd = calloc((size_t)n, sizeof(double));
	s->bwd = calloc((size_t)n, sizeof(double));
	s->st = calloc((size_t)n, sizeof(struct moe_times));
	s->dropped = calloc((size_t)n, sizeof(int64_t));
	s->C = calloc((size_t)n, sizeof(int64_t));
	s->rows = calloc((size_t)n, sizeof(int64_t));
	if (!s->step || !s->fwd || !s->bwd || !s->st || !s->dropped || !s->C || !s->rows) {
		samples_free(s);
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the timing samples");
	}
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Median of n values (sorted copy); min and max through the pointers. */
static double median(const double *v, long n, double *mn, double *mx)
{
	double *c = malloc(sizeof(double) * (size_t)n), m;
	if (!c)
		return NAN;
	memcpy(c, v, sizeof(double) * (size_t)n);
	qsort(c, (size_t)n, sizeof(double), cmp_double);
	m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
	if (mn)
		*mn = c[0];
	if (mx)
		*mx = c[n - 1];
	free(c);
	return m;
}

static double stage_median(const struct samples *s, size_t off)
{
	double *v = malloc(sizeof(double) * (size_t)s->n), m;
	if (!v)
		return NAN;
	for (long i = 0; i < s->n; i++)
		v[i] = *(const double *)((const char *)&s->st[i] + off);
	m = median(v, s->n, NULL, NULL);
	free(v);
	return m;
}

static double setting_at(const struct opts *o, long step)
{
	return o->trace ? o->trace[(size_t)step % o->trace_n] : o->cfg.capacity_setting;
}

static const char *flops_formula =
	"useful flops per step: forward 2*T*M*E (gate) + 4*R*M*H (fc1, fc2), backward twice "
	"that (less 2*R*M*H + 2*T*M*E with --no-input-grad); R = kept (token, expert) pairs = sum_e min(n_e, C); the same count for both "
	"formulations; GFLOP/s = flops / median step time";

static double step_flops(const struct opts *o, int64_t T, int64_t R)
{
	const struct moe_config *c = &o->cfg;
	double f = 2.0 * T * c->M * c->E + 4.0 * (double)R * c->M * c->H;
	if (o->forward_only)
		return f;
	/* Without the input gradient the d_disp GEMM and the gate's dx term are skipped. */
	return o->no_dx ? 3.0 * f - 2.0 * R * c->M * c->H - 2.0 * T * c->M * c->E : 3.0 * f;
}

/* One plain sgemm of the expert fc1 shape [rows, M] x [M, H], timed between the layer's
 * steps so that the layer and the reference see the same machine load. */
struct sgemm_ref {
	int64_t rows;
	float *a, *b, *d;
};

static int sgemm_ref_init(struct sgemm_ref *s, const struct moe_config *c, int64_t rows)
{
	s->rows = rows > 0 ? rows : 1;
	s->a = moe_alloc(sizeof(float) * (size_t)(s->rows * c->M));
	s->b = moe_alloc(sizeof(float) * (size_t)(c->M * c->H));
	s->d = moe_alloc(sizeof(float) * (size_t)(s->rows * c->H));
	if (!s->a || !s->b || !s->d)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the sgemm reference");
	rng_fill_normal(s->a, s->rows * c->M, 0.0f, 1.0f, 9, RNG_STREAM_TEST, 0);
	rng_fill_normal(s->b, c->M * c->H, 0.0f, 1.0f, 9, RNG_STREAM_TEST, 1u << 30);
	return 0;
}

static double sgemm_ref_time(const struct sgemm_ref *s, const struct moe_config *c)
{
	double t0 = omp_get_wtime();
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)s->rows, (int)c->H,
		    (int)c->M, 1.0f, s->a, (int)c->M, s->b, (int)c->H, 0.0f, s->d, (int)c->H);
	return omp_get_wtime() - t0;
}

static void sgemm_ref_free(struct sgemm_ref *s)
{
	free(s->a);
	free(s->b);
	free(s->d);
}

/* Median GB/s (read + written) of a plain parallel copy moving `bytes` in total. */
static double copy_rate(size_t bytes, long reps)
{
	size_t n = bytes / 2 / sizeof(float);
	float *src = moe_alloc(n * sizeof(float)), *dst = moe_alloc(n * sizeof(float));
	double *t = malloc(sizeof(double) * (size_t)(reps + 1)), rate = NAN;

	if (src && dst && t && n > 0) {
		memset(src, 1, n * sizeof(float));
		memset(dst, 0, n * sizeof(float));
		for (long i = 0; i <= reps; i++) {
			double t0 = omp_get_wtime();
#pragma omp parallel
			{
				int nt = omp_get_num_threads(), id = omp_get_thread_num();
				size_t lo = n * (size_t)id / (size_t)nt;
				size_t hi = n * (size_t)(id + 1) / (size_t)nt;
				memcpy(dst + lo, src + lo, (hi - lo) * sizeof(float));
			}
			t[i] = omp_get_wtime() - t0;
		}
		rate = 2.0 * (double)(n * sizeof(float)) / median(t + 1, reps, NULL, NULL) / 1e9;
	}
	free(src);
	free(dst);
	free(t);
	return rate;
}

static int64_t kept_rows(const struct moe_routing *r)
{
	int64_t R = 0;
	for (int e = 0; e < r->E; e++)
		R += r->used[e];
	return R;
}

static json_t *times_json(const struct samples *s)
{
	json_t *o = json_object();
	static const struct {
		const char *name;
		size_t off;
	} f[] = {
		{ "gate", offsetof(struct moe_times, gate) },
		{ "scan", offsetof(struct moe_times, scan) },
		{ "encode", offsetof(struct moe_times, encode) },
		{ "experts", offsetof(struct moe_times, experts) },
		{ "decode", offsetof(struct moe_times, decode) },
		{ "bwd_decode", offsetof(struct moe_times, bwd_decode) },
		{ "bwd_experts", offsetof(struct moe_times, bwd_experts) },
		{ "bwd_encode", offsetof(struct moe_times, bwd_encode) },
		{ "bwd_gate", offsetof(struct moe_times, bwd_gate) },
		{ "gemm_fwd", offsetof(struct moe_times, gemm_fwd) },
		{ "gemm_bwd", offsetof(struct moe_times, gemm_bwd) },
	};
	for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
		json_object_set_new(o, f[i].name, json_real(1e3 * stage_median(s, f[i].off)));
	return o;
}

static json_t *base_json(const struct opts *o, const char *impl, int64_t T)
{
	const struct moe_config *c = &o->cfg;
	json_t *j = json_object();
	json_object_set_new(j, "impl", json_string(impl));
	json_object_set_new(j, "only", json_string(o->encdec ? "encode-decode" : "layer"));
	json_object_set_new(j, "T", json_integer(T));
	json_object_set_new(j, "M", json_integer(c->M));
	json_object_set_new(j, "H", json_integer(c->H));
	json_object_set_new(j, "E", json_integer(c->E));
	json_object_set_new(j, "k", json_integer(c->k));
	if (o->trace_path)
		json_object_set_new(j, "trace", json_string(o->trace_path));
	else
		json_object_set_new(j, "capacity_setting", json_real(c->capacity_setting));
	json_object_set_new(j, "capacity_align", json_integer(c->capacity_align));
	json_object_set_new(j, "bpr", json_boolean(c->bpr));
	json_object_set_new(j, "gate_noise", json_real(c->gate_noise));
	json_object_set_new(j, "aux_loss", json_string(c->loss == MOE_LOSS_GSHARD
							       ? "gshard" : "load-importance"));
	json_object_set_new(j, "activation",
			    json_string(c->act == MOE_ACT_RELU ? "relu" : "gelu"));
	json_object_set_new(j, "forward_only", json_boolean(o->forward_only));
	json_object_set_new(j, "input_grad", json_boolean(!o->forward_only && !o->no_dx));
	json_object_set_new(j, "threads", json_integer(omp_get_max_threads()));
	json_object_set_new(j, "omp_wait_policy", json_string(getenv("OMP_WAIT_POLICY")
								   ? getenv("OMP_WAIT_POLICY")
								   : "default"));
	json_object_set_new(j, "iterations", json_integer(o->iters));
	json_object_set_new(j, "warmup", json_integer(o->warmup));
	json_object_set_new(j, "seed", json_integer((json_int_t)c->seed));
	return j;
}

/* Steps' times, drops and capacities; T and k are the run's (E is the config's). */
static void add_step_stats(json_t *j, const struct opts *o, const struct samples *s, int64_t T,
			   int k)
{
	const int fwd_only = o->forward_only;
	const int64_t per_expert = (T + o->cfg.E - 1) / o->cfg.E;
	double mn, mx, md = median(s->step, s->n, &mn, &mx);
	json_t *st = json_object();
	json_object_set_new(st, "median", json_real(1e3 * md));
	json_object_set_new(st, "min", json_real(1e3 * mn));
	json_object_set_new(st, "max", json_real(1e3 * mx));
	json_object_set_new(j, "step_ms", st);
	json_object_set_new(j, "forward_ms", json_real(1e3 * median(s->fwd, s->n, NULL, NULL)));
	if (!fwd_only)
		json_object_set_new(j, "backward_ms",
				    json_real(1e3 * median(s->bwd, s->n, NULL, NULL)));
	int64_t dsum = 0, dlast = s->dropped[s->n - 1], cmin = s->C[0], cmax = s->C[0];
	for (long i = 0; i < s->n; i++) {
		dsum += s->dropped[i];
		cmin = s->C[i] < cmin ? s->C[i] : cmin;
		cmax = s->C[i] > cmax ? s->C[i] : cmax;
	}
	json_object_set_new(j, "dropped_last", json_integer(dlast));
	json_object_set_new(j, "dropped_total", json_integer(dsum));
	json_object_set_new(j, "capacity_last", json_integer(s->C[s->n - 1]));
	json_object_set_new(j, "capacity_min", json_integer(cmin));
	json_object_set_new(j, "capacity_max", json_integer(cmax));
	/* What Tutel logs as the real-time capacity factor: C / (k * ceil(T / E)). */
	json_object_set_new(j, "capacity_factor_last",
			    json_real((double)s->C[s->n - 1] / (double)(k * per_expert)));
	json_object_set_new(j, "stage_ms", times_json(s));
}

/* One JSON object per run on a line of stdout; takes the reference. */
static int print_json(json_t *j)
{
	return cli_print_json(j, JSON_COMPACT | JSON_REAL_PRECISION(6));
}

static void print_table(const char *impl, const struct samples *s, double gflops, size_t bytes)
{
	double mn, mx, md = median(s->step, s->n, &mn, &mx);
	fprintf(stderr, "%-7s step %9.2f ms (min %.2f, max %.2f)  %8.1f GFLOP/s  %8.1f MiB  "
		"C %lld  dropped %lld\n", impl, 1e3 * md, 1e3 * mn, 1e3 * mx, gflops,
		(double)bytes / 1048576.0, (long long)s->C[s->n - 1],
		(long long)s->dropped[s->n - 1]);
	fprintf(stderr, "        gate %.2f  scan %.2f  encode %.2f  experts %.2f  decode %.2f",
		1e3 * stage_median(s, offsetof(struct moe_times, gate)),
		1e3 * stage_median(s, offsetof(struct moe_times, scan)),
		1e3 * stage_median(s, offsetof(struct moe_times, encode)),
		1e3 * stage_median(s, offsetof(struct moe_times, experts)),
		1e3 * stage_median(s, offsetof(struct moe_times, decode)));
	fprintf(stderr, " | bwd decode %.2f  experts %.2f  encode %.2f  gate %.2f (ms)\n",
		1e3 * stage_median(s, offsetof(struct moe_times, bwd_decode)),
		1e3 * stage_median(s, offsetof(struct moe_times, bwd_experts)),
		1e3 * stage_median(s, offsetof(struct moe_times, bwd_encode)),
		1e3 * stage_median(s, offsetof(struct moe_times, bwd_gate)));
}

struct data {
	struct moe_params p, g;
	float *x, *y, *dy, *dx;
};

static int data_alloc(struct data *d, const struct moe_config *cfg, int64_t T)
{
	memset(d, 0, sizeof *d);
	ERR_FORWARD(moe_params_alloc(&d->p, cfg));
	ERR_FORWARD(moe_params_alloc(&d->g, cfg));
	moe_params_init(&d->p, cfg, cfg->seed);
	size_t n = (size_t)(T * cfg->M);
	d->x = moe_alloc(n * sizeof(float));
	d->y = moe_alloc(n * sizeof(float));
	d->dy = moe_alloc(n * sizeof(float));
	d->dx = moe_alloc(n * sizeof(float));
	if (!d->x || !d->y || !d->dy || !d->dx)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the inputs");
	rng_fill_normal(d->x, (int64_t)n, 0.0f, 1.0f, cfg->seed, RNG_STREAM_TEST, 0);
	rng_fill_normal(d->dy, (int64_t)n, 0.0f, 1.0f, cfg->seed, RNG_STREAM_TEST, 1ull << 40);
	return 0;
}

static void data_free(struct data *d)
{
	moe_params_free(&d->p);
	moe_params_free(&d->g);
	free(d->x);
	free(d->y);
	free(d->dy);
	free(d->dx);
}

/* The sparse layer, whole (forward, backward). */
static int run_layer(const struct opts *o, struct data *d)
{
	const struct moe_config *c = &o->cfg;
	struct moe_layer *l = NULL;
	struct samples s;
	int rc;

	struct sgemm_ref ref = { 0 };
	double *ref_t;

	ERR_FORWARD(samples_alloc(&s, o->iters));
	ref_t = calloc((size_t)o->iters, sizeof(double));
	rc = moe_layer_init(&l, c);
	if (rc == 0 && !ref_t)
		rc = err_set(CORE_ENOMEM, NULL, "cannot allocate the timing samples");
	for (long i = 0; rc == 0 && i < o->warmup + o->iters; i++) {
		double t0 = omp_get_wtime(), t1, t2;
		rc = moe_forward(l, &d->p, d->x, d->y, c->T, c->k, setting_at(o, i), (uint64_t)i);
		t1 = omp_get_wtime();
		if (rc == 0 && !o->forward_only)
			rc = moe_backward(l, &d->p, d->x, d->dy, o->no_dx ? NULL : d->dx, &d->g,
					  0.01f);
		t2 = omp_get_wtime();
		if (rc < 0)
			continue;
		const struct moe_routing *r = moe_layer_routing(l);
		if (!ref.a) /* the reference shape: the mean kept rows per expert */
			rc = sgemm_ref_init(&ref, c, (kept_rows(r) + c->E / 2) / c->E);
		if (rc < 0 || i < o->warmup)
			continue;
		long j = i - o->warmup;
		s.step[j] = t2 - t0;
		s.fwd[j] = t1 - t0;
		s.bwd[j] = t2 - t1;
		s.st[j] = *moe_layer_times(l);
		s.dropped[j] = r->dropped;
		s.C[j] = r->C;
		s.rows[j] = kept_rows(r);
		ref_t[j] = sgemm_ref_time(&ref, c);
	}
	if (rc < 0)
		goto out;
	uint64_t rss = peak_rss_bytes();
	double R = 0.0, fl, md = median(s.step, s.n, NULL, NULL);
	for (long i = 0; i < s.n; i++)
		R += (double)s.rows[i] / (double)s.n;
	fl = step_flops(o, c->T, (int64_t)R);
	/* Expert GEMM rate inside the layer (time inside its sgemm calls) against one plain
	 * sgemm of the expert shape; non-GEMM = step time outside the expert sgemm calls,
	 * median over the steps. */
	double ex = stage_median(&s, offsetof(struct moe_times, gemm_fwd));
	double bex = stage_median(&s, offsetof(struct moe_times, gemm_bwd));
	double ex_rate = 4.0 * R * c->M * c->H / ex / 1e9;
	double bex_rate = o->forward_only ? NAN
					  : (o->no_dx ? 6.0 : 8.0) * R * c->M * c->H / bex / 1e9;
	int64_t rows = ref.rows;
	double ref_rate = 2.0 * rows * c->M * c->H / median(ref_t, s.n, NULL, NULL) / 1e9;
	for (long i = 0; i < s.n; i++)
		ref_t[i] = s.step[i] - s.st[i].gemm_fwd - s.st[i].gemm_bwd;
	double nongemm = median(ref_t, s.n, NULL, NULL);
	json_t *j = base_json(o, "sparse", c->T);
	add_step_stats(j, o, &s, c->T, c->k);
	json_object_set_new(j, "flops_per_step", json_real(fl));
	json_object_set_new(j, "gflops", json_real(fl / md / 1e9));
	json_object_set_new(j, "flops_formula", json_string(flops_formula));
	json_object_set_new(j, "kept_rows_mean", json_real(R));
	json_object_set_new(j, "peak_rss_bytes", json_integer((json_int_t)rss));
	json_object_set_new(j, "layer_bytes_peak",
			    json_integer((json_int_t)moe_layer_peak_bytes(l)));
	json_object_set_new(j, "dense_bytes_analytic",
			    json_integer((json_int_t)moe_dense_bytes(c, c->T, c->k, s.C[s.n - 1],
								     !o->forward_only)));
	json_object_set_new(j, "expert_fwd_gflops", json_real(ex_rate));
	if (!o->forward_only)
		json_object_set_new(j, "expert_bwd_gflops", json_real(bex_rate));
	json_object_set_new(j, "sgemm_gflops", json_real(ref_rate));
	json_object_set_new(j, "sgemm_shape", json_pack("[I,I,I]", (json_int_t)rows,
							(json_int_t)c->M, (json_int_t)c->H));
	json_object_set_new(j, "expert_fwd_to_sgemm", json_real(ex_rate / ref_rate));
	if (!o->forward_only)
		json_object_set_new(j, "expert_bwd_to_sgemm", json_real(bex_rate / ref_rate));
	json_object_set_new(j, "non_gemm_ms", json_real(1e3 * nongemm));
	print_table("sparse", &s, fl / md / 1e9, moe_layer_peak_bytes(l));
	fprintf(stderr, "        expert GEMMs %.1f GFLOP/s fwd, %.1f bwd; plain sgemm "
		"[%lld,%lld]x[%lld,%lld] %.1f GFLOP/s (ratio %.2f); non-GEMM %.2f ms\n",
		ex_rate, bex_rate, (long long)rows, (long long)c->M, (long long)c->M,
		(long long)c->H, ref_rate, ex_rate / ref_rate, 1e3 * nongemm);
	rc = print_json(j);
out:
	moe_layer_free(l);
	samples_free(&s);
	sgemm_ref_free(&ref);
	free(ref_t);
	return rc;
}

/* Encode and decode alone (the experts are the identity: decode reads the encode output),
 * next to a plain copy of the same number of bytes. */
static int run_encdec(const struct opts *o, struct data *d)
{
	const struct moe_config *c = &o->cfg;
	const int64_t M = c->M, T = c->T;
	struct moe_layer *l = NULL;
	struct samples s;
	float *disp = NULL, *dscore = NULL;
	size_t disp_bytes = 0;
	double bytes_sum = 0.0;
	int rc;

	ERR_FORWARD(samples_alloc(&s, o->iters));
	rc = moe_layer_init(&l, c);
	dscore = malloc(sizeof(float) * (size_t)(c->k * T));
	if (rc == 0 && !dscore)
		rc = err_set(CORE_ENOMEM, NULL, "cannot allocate the score gradients");
	for (long i = 0; rc == 0 && i < o->warmup + o->iters; i++) {
		rc = moe_route(l, d->p.wg, d->x, T, c->k, setting_at(o, i), (uint64_t)i);
		if (rc < 0)
			break;
		const struct moe_routing *r = moe_layer_routing(l);
		size_t need = sizeof(float) * (size_t)(c->E * r->C * M);
		if (need > disp_bytes) {
			free(disp);
			disp = moe_alloc(need);
			disp_bytes = need;
			if (!disp) {
				rc = err_set(CORE_ENOMEM, NULL, "cannot allocate %zu bytes", need);
				break;
			}
		}
		struct moe_times tm = { 0 };
		double t0 = omp_get_wtime(), t1, t2, t3, t4;
		moe_encode(r, d->x, disp, M);
		t1 = omp_get_wtime();
		moe_decode(r, disp, d->y, M);
		t2 = omp_get_wtime();
		t3 = t4 = t2;
		if (!o->forward_only) {
			moe_decode_backward(r, d->dy, disp, disp, dscore, M);
			t3 = omp_get_wtime();
			moe_encode_backward(r, disp, d->dx, M);
			t4 = omp_get_wtime();
		}
		if (i < o->warmup)
			continue;
		long j = i - o->warmup;
		tm.encode = t1 - t0;
		tm.decode = t2 - t1;
		tm.bwd_decode = t3 - t2;
		tm.bwd_encode = t4 - t3;
		s.st[j] = tm;
		s.step[j] = t4 - t0;
		s.fwd[j] = t2 - t0;
		s.bwd[j] = t4 - t2;
		s.dropped[j] = r->dropped;
		s.C[j] = r->C;
		/* Bytes moved: encode reads T rows, writes E*C rows; decode reads R rows, writes
		 * T rows; decode backward reads T + R rows (dy, eo), writes E*C; encode backward
		 * reads R rows, writes T rows. Scores and metadata are not counted. */
		double R = (double)kept_rows(r), EC = (double)c->E * (double)r->C;
		double rows = ((double)T + EC) + (R + T);
		if (!o->forward_only)
			rows += ((double)T + R + EC) + (R + T);
		bytes_sum += rows * M * sizeof(float);
	}
	if (rc < 0)
		goto out;
	double bytes = bytes_sum / (double)o->iters;
	double md = median(s.step, s.n, NULL, NULL);
	double cp = copy_rate((size_t)bytes, o->iters > 3 ? o->iters : 3);
	uint64_t rss = peak_rss_bytes();
	json_t *j = base_json(o, "sparse", T);
	add_step_stats(j, o, &s, T, c->k);
	json_object_set_new(j, "bytes_moved", json_real(bytes));
	json_object_set_new(j, "bytes_formula", json_string(
		"rows of M floats read + written: encode T + E*C, decode R + T, decode backward "
		"T + R + E*C, encode backward R + T; R = kept choices"));
	json_object_set_new(j, "encdec_gbps", json_real(bytes / md / 1e9));
	json_object_set_new(j, "copy_gbps", json_real(cp));
	json_object_set_new(j, "copy_ms", json_real(1e3 * bytes / cp / 1e9));
	json_object_set_new(j, "time_over_copy", json_real(md / (bytes / cp / 1e9)));
	json_object_set_new(j, "peak_rss_bytes", json_integer((json_int_t)rss));
	size_t lb = moe_layer_peak_bytes(l) + disp_bytes + sizeof(float) * (size_t)(c->k * T);
	json_object_set_new(j, "layer_bytes_peak", json_integer((json_int_t)lb));
	json_object_set_new(j, "dense_bytes_analytic",
			    json_integer((json_int_t)moe_dense_bytes(c, T, c->k, s.C[s.n - 1],
								     !o->forward_only)));
	print_table("encdec", &s, 0.0, lb);
	fprintf(stderr, "        %.1f MB moved: %.2f GB/s; plain copy of the same bytes %.2f GB/s "
		"(%.2f ms); ratio %.2f\n", bytes / 1e6, bytes / md / 1e9, cp,
		1e3 * bytes / cp / 1e9, md / (bytes / cp / 1e9));
	rc = print_json(j);
out:
	free(disp);
	free(dscore);
	moe_layer_free(l);
	samples_free(&s);
	return rc;
}

/* The dense GShard formulation on the first dense_T tokens of the same inputs. */
static int run_dense(const struct opts *o, struct data *d)
{
	const struct moe_config *c = &o->cfg;
	const int64_t T = o->dense_T;
	struct samples s;
	size_t peak = 0;
	int rc = 0;

	ERR_FORWARD(samples_alloc(&s, o->iters));
	for (long i = 0; rc == 0 && i < o->warmup + o->iters; i++) {
		struct moe_times tm;
		int64_t dropped, C;
		float aux;
		double t0 = omp_get_wtime();
		rc = moe_dense_step(c, &d->p, d->x, d->y, T, c->k, setting_at(o, i), (uint64_t)i,
				    d->dy, d->dx, o->forward_only ? NULL : &d->g, 0.01f, &dropped,
				    &C, &aux, &tm, &peak);
		double t1 = omp_get_wtime();
		if (rc < 0 || i < o->warmup)
			continue;
		long j = i - o->warmup;
		s.step[j] = t1 - t0;
		s.fwd[j] = tm.gate + tm.scan + tm.encode + tm.experts + tm.decode;
		s.bwd[j] = s.step[j] - s.fwd[j];
		s.st[j] = tm;
		s.dropped[j] = dropped;
		s.C[j] = C;
		/* Same useful-flop count as the sparse layer: kept pairs, not E*C. */
		s.rows[j] = (int64_t)c->k * T - dropped;
	}
	if (rc == 0) {
		uint64_t rss = peak_rss_bytes();
		double R = 0.0, md = median(s.step, s.n, NULL, NULL);
		for (long i = 0; i < s.n; i++)
			R += (double)s.rows[i] / (double)s.n;
		double fl = step_flops(o, T, (int64_t)R);
		json_t *j = base_json(o, "dense", T);
		/* The dense formulation always computes the input gradient. */
		json_object_set_new(j, "input_grad", json_boolean(!o->forward_only));
		if (T != c->T)
			json_object_set_new(j, "note", json_string(
				"dense run with fewer tokens (--dense-tokens): its [T,E,C] tensors "
				"grow as T^2"));
		add_step_stats(j, o, &s, T, c->k);
		json_object_set_new(j, "flops_per_step", json_real(fl));
		json_object_set_new(j, "gflops", json_real(fl / md / 1e9));
		json_object_set_new(j, "flops_formula", json_string(flops_formula));
		json_object_set_new(j, "peak_rss_bytes", json_integer((json_int_t)rss));
		json_object_set_new(j, "layer_bytes_peak", json_integer((json_int_t)peak));
		print_table("dense", &s, fl / md / 1e9, peak);
		rc = print_json(j);
	}
	samples_free(&s);
	return rc;
}

/* --dry-run: route once to learn C, then print the analytic memory of both formulations. */
static int run_dry(const struct opts *o, struct data *d)
{
	const struct moe_config *c = &o->cfg;
	struct moe_layer *l = NULL;
	int rc = moe_layer_init(&l, c);

	if (rc == 0)
		rc = moe_route(l, d->p.wg, d->x, c->T, c->k, setting_at(o, 0), 0);
	if (rc == 0) {
		const struct moe_routing *r = moe_layer_routing(l);
		size_t sp = moe_layer_bytes_for(c, c->T, c->k, r->C, !o->forward_only);
		size_t dn = moe_dense_bytes(c, o->dense_T, c->k, r->C, !o->forward_only);
		json_t *j = base_json(o, "dry-run", c->T);
		json_object_set_new(j, "capacity", json_integer(r->C));
		json_object_set_new(j, "dropped", json_integer(r->dropped));
		json_object_set_new(j, "sparse_bytes_analytic", json_integer((json_int_t)sp));
		json_object_set_new(j, "dense_T", json_integer(o->dense_T));
		json_object_set_new(j, "dense_bytes_analytic", json_integer((json_int_t)dn));
		json_object_set_new(j, "sparse_below_dense",
				    json_real(1.0 - (double)sp / (double)dn));
		fprintf(stderr, "dry run: C %lld; sparse layer %.1f MiB, dense formulation "
			"%.1f MiB (T=%lld): %.1f%% below\n", (long long)r->C, sp / 1048576.0,
			dn / 1048576.0, (long long)o->dense_T, 100.0 * (1.0 - (double)sp / dn));
		rc = print_json(j);
	}
	moe_layer_free(l);
	return rc;
}

int main(int argc, char **argv)
{
	static const struct option lopts[] = {
		{ "tokens", required_argument, NULL, 'T' },
		{ "model-dim", required_argument, NULL, 'M' },
		{ "hidden-dim", required_argument, NULL, 'H' },
		{ "experts", required_argument, NULL, 'E' },
		{ "top-k", required_argument, NULL, 'k' },
		{ "capacity", required_argument, NULL, 'c' },
		{ "capacity-align", required_argument, NULL, 1001 },
		{ "bpr", no_argument, NULL, 1002 },
		{ "no-bpr", no_argument, NULL, 1003 },
		{ "gate-noise", required_argument, NULL, 1004 },
		{ "aux-loss", required_argument, NULL, 1005 },
		{ "activation", required_argument, NULL, 1006 },
		{ "trace", required_argument, NULL, 1007 },
		{ "forward-only", no_argument, NULL, 1008 },
		{ "only", required_argument, NULL, 1009 },
		{ "baseline", required_argument, NULL, 1010 },
		{ "dense-tokens", required_argument, NULL, 1011 },
		{ "dry-run", no_argument, NULL, 1012 },
		{ "no-input-grad", no_argument, NULL, 1013 },
		{ "iterations", required_argument, NULL, 'n' },
		{ "warmup", required_argument, NULL, 'w' },
		{ "seed", required_argument, NULL, 's' },
		{ "threads", required_argument, NULL, 't' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 }
	};
	struct opts o = { .iters = 10, .warmup = 2 };
	struct data d;
	long T = 4096, M = 1024, H = 4096, E = 16, k = 2, align = 1, seed = 1;
	long dense_T = 0;
	double x = 1.0, noise = 0.0;
	int bpr = 0, act = MOE_ACT_RELU, loss = MOE_LOSS_GSHARD, c, rc = 0;

	memset(&d, 0, sizeof d);
	/* The wait policy is read when the OpenMP runtime loads, before main: set it and run
	 * again. If exec fails the run goes on with the default policy. */
	if (!getenv("OMP_WAIT_POLICY")) {
		setenv("OMP_WAIT_POLICY", "active", 1);
		execv("/proc/self/exe", argv);
	}
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":T:M:H:E:k:c:n:w:s:t:hV", lopts, NULL)) != -1) {
		switch (c) {
		case 'T': rc = cli_parse_long("--tokens", optarg, 1, 1L << 30, &T); break;
		case 'M': rc = cli_parse_long("--model-dim", optarg, 1, 1L << 20, &M); break;
		case 'H': rc = cli_parse_long("--hidden-dim", optarg, 1, 1L << 20, &H); break;
		case 'E': rc = cli_parse_long("--experts", optarg, 1, 1L << 16, &E); break;
		case 'k': rc = cli_parse_long("--top-k", optarg, 1, 1L << 16, &k); break;
		case 'c': rc = cli_parse_double("--capacity", optarg, -1e6, 1e6, &x); break;
		case 1001:
			rc = cli_parse_long("--capacity-align", optarg, 1, 1L << 20, &align);
			break;
		case 1002: bpr = 1; break;
		case 1003: bpr = 0; break;
		case 1004: rc = cli_parse_double("--gate-noise", optarg, 0.0, 1e6, &noise); break;
		case 1005:
			if (!strcmp(optarg, "gshard"))
				loss = MOE_LOSS_GSHARD;
			else if (!strcmp(optarg, "load-importance"))
				loss = MOE_LOSS_LOAD_IMPORTANCE;
			else
				return cli_usage_error(prog, "option '--aux-loss': unknown loss '%s' "
						       "(gshard, load-importance)", optarg);
			break;
		case 1006:
			if (!strcmp(optarg, "relu"))
				act = MOE_ACT_RELU;
			else if (!strcmp(optarg, "gelu"))
				act = MOE_ACT_GELU;
			else
				return cli_usage_error(prog, "option '--activation': unknown "
						       "activation '%s' (relu, gelu)", optarg);
			break;
		case 1007: o.trace_path = optarg; break;
		case 1008: o.forward_only = 1; break;
		case 1009:
			if (!strcmp(optarg, "layer"))
				o.encdec = 0;
			else if (!strcmp(optarg, "encode-decode"))
				o.encdec = 1;
			else
				return cli_usage_error(prog, "option '--only': unknown part '%s' "
						       "(layer, encode-decode)", optarg);
			break;
		case 1010:
			if (!strcmp(optarg, "sparse"))
				o.dense = 0;
			else if (!strcmp(optarg, "dense"))
				o.dense = 1;
			else
				return cli_usage_error(prog, "option '--baseline': unknown kind '%s' "
						       "(sparse, dense)", optarg);
			break;
		case 1011:
			rc = cli_parse_long("--dense-tokens", optarg, 1, 1L << 30, &dense_T);
			break;
		case 1012: o.dry_run = 1; break;
		case 1013: o.no_dx = 1; break;
		case 'n': rc = cli_parse_long("--iterations", optarg, 1, 1L << 30, &o.iters); break;
		case 'w': rc = cli_parse_long("--warmup", optarg, 0, 1L << 30, &o.warmup); break;
		case 's': rc = cli_parse_long("--seed", optarg, 0, 1L << 62, &seed); break;
		case 't': rc = cli_parse_long("--threads", optarg, 1, 4096, &o.threads); break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("moe-bench %s\n", CORE_VERSION);
			return 0;
		default:
			return cli_bad_option(prog, prog, lopts, argv, c);
		}
		if (rc < 0)
			return cli_report(prog, rc);
	}
	if (optind < argc)
		return cli_usage_error(prog, "unexpected argument '%s'", argv[optind]);
	moe_config_default(&o.cfg, T, M, H, (int)E);
	o.cfg.k = (int)k;
	o.cfg.capacity_setting = x;
	o.cfg.capacity_align = (int)align;
	o.cfg.bpr = bpr;
	o.cfg.gate_noise = (float)noise;
	o.cfg.act = (enum moe_act)act;
	o.cfg.loss = (enum moe_loss)loss;
	o.cfg.seed = (uint64_t)seed;
	rc = moe_config_check(&o.cfg);
	if (rc < 0)
		return cli_report(prog, rc);
	if (dense_T > T)
		return cli_usage_error(prog, "option '--dense-tokens': %ld is above T = %ld",
				       dense_T, T);
	o.dense_T = dense_T ? dense_T : T;
	if (o.trace_path) {
		rc = trace_read(o.trace_path, &o.trace, &o.trace_n);
		if (rc < 0)
			return cli_report(prog, rc);
	}
	if (o.threads > 0) {
		omp_set_num_threads((int)o.threads);
		openblas_set_num_threads((int)o.threads);
	}

	rc = data_alloc(&d, &o.cfg, T);
	if (rc == 0 && o.dry_run)
		rc = run_dry(&o, &d);
	else if (rc == 0 && o.encdec)
		rc = run_encdec(&o, &d);
	else if (rc == 0)
		rc = run_layer(&o, &d);
	if (rc == 0 && o.dense && !o.dry_run) {
		/* Refuse a dense run that cannot fit rather than thrash the machine. */
		size_t need = moe_dense_bytes(&o.cfg, o.dense_T, o.cfg.k,
					      (int64_t)o.cfg.k * o.dense_T, !o.forward_only);
		long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
		double phys = (double)pages * (double)psz;
		if (o.cfg.capacity_setting > 0.0 && !o.trace) {
			int64_t cv = moe_capacity_fixed(o.cfg.E, o.dense_T, o.cfg.k,
							o.cfg.capacity_setting);
			need = moe_dense_bytes(&o.cfg, o.dense_T, o.cfg.k, cv, !o.forward_only);
		}
		if ((double)need > 0.6 * phys)
			rc = err_set(CORE_ENOMEM, NULL, "the dense formulation needs %.1f GiB at "
				     "T=%lld (more than 60%% of memory); use --dense-tokens or "
				     "--dry-run", need / 1073741824.0, (long long)o.dense_T);
		else
			rc = run_dense(&o, &d);
	}
	data_free(&d);
	free(o.trace);
	if (rc < 0)
		return cli_report(prog, rc);
	return 0;
}
