/* moe-profile.c - measure the best plan {r, d, a} of the distributed MoE layer for each
 * capacity bucket and write Tutel's strategy dictionary; see man/moe-profile.1.
 *
 * Run under mpirun, one process per rank, as the training will run. For each bucket
 * floor(C / R) of the capacity range, every rank runs the layer with C_g fixed at the middle
 * of the bucket under the plans the search picks: r = 0 and r = s (the ends), ternary
 * search over the divisors of s in between (the time is unimodal in r, sec. 3.4.6), and
 * for each r every pipelining degree and algorithm asked for. Step times are the slowest
 * rank's, so every rank takes the same decisions. Rank 0 writes the dictionary (moe-dict(5))
 * and the table of all trials. */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "cli/opt.h"
#include "common/err.h"
#include "common/progress.h"
#include "common/stats.h"
#include "backend/probe.h"
#include "dist/dist.h"
#include "dist/dist_model.h"
#include "io/atomicio.h"
#include "moe/moe.h"
#include "moe/moe_bench.h"
#include "moe/moe_bench_dist.h"
#include "moe/moe_dict.h"
#include "moe/moe_search.h"
#include "moe/moe_dist.h"
#include "common/banned.h"

static const char *prog = "moe-profile";

/* Keys of the long-only options: past every letter. */
enum {
	OPT_ACTIVATION = 256,
	OPT_FACTORS,
	OPT_D_VALUES,
	OPT_ALGORITHMS,
	OPT_LOCAL_SIZE,
	OPT_TRIALS,
	OPT_DEVICE,
	OPT_SIMULATE,
	OPT_INTRA,
	OPT_INTER,
	OPT_COPY,
	OPT_SIM_LOCAL_SIZE,
	OPT_MAX_WORLD,
	OPT_CONFIRM,
};

/* One table per section of --help. */
static const struct cli_opt shape_opts[] = {
	{"tokens", 'T', 'T', CLI_ARG, "N", "tokens per rank T (default 4096)"},
	{"model-dim", 'M', 'M', CLI_ARG, "N", "model dimension M (default 1024)"},
	{"hidden-dim", 'H', 'H', CLI_ARG, "N", "expert hidden dimension H (default 4096)"},
	{"experts", 'E', 'E', CLI_ARG, "N",
	 "experts E, a multiple or a divisor of W (default 16)"},
	{"top-k", 'k', 'k', CLI_ARG, "N", "experts per token (default 2)"},
	{"activation", OPT_ACTIVATION, 0, CLI_ARG, "NAME", "relu (default) or gelu"},
	CLI_OPT_END,
};
static const struct cli_opt search_opts[] = {
	{"factors", OPT_FACTORS, 0, CLI_ARG, "LO:HI",
	 "capacity factors f to cover, C = k*f*ceil(T/E) slots per\n"
	 "expert per rank (default 1:4.4, the range of Tutel's\n"
	 "fig. 1)"},
	{"window", 'R', 'R', CLI_ARG, "N", "bucket width R in slots (default 128, Tutel's)"},
	{"d-values", OPT_D_VALUES, 0, CLI_ARG, "LIST",
	 "pipelining degrees to try, from 1,2,4,8 (default all)"},
	{"algorithms", OPT_ALGORITHMS, 0, CLI_ARG, "LIST",
	 "All-to-All algorithms to try: linear,2dh (default both)"},
	{"iterations", 'n', 'n', CLI_ARG, "N",
	 "timed steps per trial (default 3; the median counts)"},
	{"warmup", 'w', 'w', CLI_ARG, "N", "untimed steps per trial (default 1)"},
	{"confirm", OPT_CONFIRM, 0, CLI_ARG, "N",
	 "rounds of interleaved trials of each bucket's 4\n"
	 "fastest plans, which decide it (default 3; 0: the\n"
	 "first pass decides)"},
	{"local-size", OPT_LOCAL_SIZE, 0, CLI_ARG, "N",
	 "ranks per node (default: from the host layout)"},
	CLI_OPT_END,
};
static const struct cli_opt sim_opts[] = {
	{"simulate", OPT_SIMULATE, 0, CLI_FLAG, NULL,
	 "fit an alpha-beta model to the exchanges measured\n"
	 "here (each level to its 2DH phase where there are\n"
	 "nodes) and predict Linear and 2DH for W up to\n"
	 "--max-world, for these links and the cluster below"},
	{"intra", OPT_INTRA, 0, CLI_ARG, "US:GBPS",
	 "cluster: latency and bandwidth within a node (2:150)"},
	{"inter", OPT_INTER, 0, CLI_ARG, "US:GBPS", "cluster: across nodes (5:25, HDR InfiniBand)"},
	{"copy", OPT_COPY, 0, CLI_ARG, "GBPS", "cluster: stride copy rate (1000)"},
	{"sim-local-size", OPT_SIM_LOCAL_SIZE, 0, CLI_ARG, "N", "cluster: ranks per node (8)"},
	{"max-world", OPT_MAX_WORLD, 0, CLI_ARG, "N", "largest W predicted (4096)"},
	CLI_OPT_END,
};
static const struct cli_opt output_opts[] = {
	{"output", 'o', 'o', CLI_ARG, "FILE", "the dictionary (required; refused if it exists)"},
	{"trials", OPT_TRIALS, 0, CLI_ARG, "FILE",
	 "every trial as a table (bucket, C, r, d, a, times)"},
	{"force", 'f', 'f', CLI_FLAG, NULL, "overwrite existing output files"},
	{"seed", 's', 's', CLI_ARG, "N", "seed for parameters and inputs (default 1)"},
	{"threads", 't', 't', CLI_ARG, "N",
	 "OpenMP and BLAS threads per rank (default:\n"
	 "OMP_NUM_THREADS)"},
	{"device", OPT_DEVICE, 0, CLI_ARG, "NAME", "cpu (default), ref or cuda (one GPU per rank)"},
	CLI_OPT_END,
};
/* The last of --help's Output section. */
static const struct cli_opt common_opts[] = {
	{"help", 'h', 'h', CLI_FLAG, NULL, "print this help and exit"},
	{"version", 'V', 'V', CLI_FLAG, NULL, "print the version and exit"},
	CLI_OPT_END,
};
/* In --help's order. */
static const struct cli_opt *const parse_tables[] = {
	shape_opts, search_opts, sim_opts, output_opts, common_opts, NULL,
};

static void usage(FILE *f)
{
	fprintf(f,
"Usage: mpirun -np W moe-profile -o DICT [OPTION]...\n"
"       mpirun -np W moe-profile --simulate [OPTION]...\n"
"Measure the distributed Mixture-of-Experts layer under every plan {r, d, a} the\n"
"search visits, for each capacity bucket floor(C/R), and write the fastest plan\n"
"of each bucket as a strategy dictionary (moe-dict(5)) for moe-bench --dict.\n"
"\n"
"Shape (as moe-bench; T is tokens per rank):\n");
	cli_print_opts(f, (const struct cli_opt *const[]){shape_opts, NULL});
	fprintf(f, "Search:\n");
	cli_print_opts(f, (const struct cli_opt *const[]){search_opts, NULL});
	fprintf(f, "Scale-out model (no dictionary; see moe-profile(1)):\n");
	cli_print_opts(f, (const struct cli_opt *const[]){sim_opts, NULL});
	fprintf(f, "Output:\n");
	cli_print_opts(f, (const struct cli_opt *const[]){output_opts, common_opts, NULL});
	fprintf(f,
"\n"
"Progress goes to stderr, one line per bucket; a JSON summary to stdout.\n"
"Exit status: 0 success, 1 runtime failure, 2 usage error.\n");
}

struct search {
	struct moe_bench_dist_opts o;
	struct moe_bench_dist_data dd;
	struct moe_search ms;
};

/* The search's measurement: the distributed layer at C under plan, its median step. */
static int measure(void *ctx, int64_t C, const struct moe_plan *plan, double *md, double *mn,
		   double *mx)
{
	struct search *s = ctx;
	struct moe_bench_dist_result r;
	s->o.capacity = C;
	s->o.plan = *plan;
	ERR_FORWARD(moe_bench_dist_run(&s->o, &s->dd, &r));
	*md = stats_median(r.step, r.n, mn, mx);
	moe_bench_dist_result_free(&r);
	return 0;
}

/* "name, N cores, host" for the dictionary's machine line. */
static void machine(char *buf, size_t n, struct dist *d)
{
	char model[256] = "unknown processor", line[512];
	FILE *f = fopen("/proc/cpuinfo", "r");
	while (f && fgets(line, sizeof line, f))
		if (strncmp(line, "model name", 10) == 0) {
			char *c = strchr(line, ':');
			if (c) {
				c += 1 + strspn(c + 1, " \t");
				c[strcspn(c, "\n")] = 0;
				snprintf(model, sizeof model, "%s", c);
			}
			break;
		}
	if (f)
		fclose(f);
	snprintf(buf, n, "%s, %ld cores, %s", model, sysconf(_SC_NPROCESSORS_ONLN), dist_host(d));
}

/* ---- --simulate: the alpha-beta model of Linear and 2DH at scale ------------------------ */

/* One timed exchange of S bytes per rank after a barrier: in v[0] the slowest rank's seconds,
 * in v[1..3] the slowest rank's 2DH phases (copies, within the node, across nodes;
 * dist_stats, zeros unless 2DH runs two levels). */
static int time_one(struct dist *d, enum dist_a2a a, struct dist_span *sp,
		    struct dist_span *rp, int64_t rows, double v[4])
{
	struct dist_stats st;
	ERR_FORWARD(dist_barrier(d));
	dist_stats_reset(d);
	double t0 = dist_time();
	ERR_FORWARD(dist_alltoall(d, a, sp, rp, 1, rows, 64));
	v[0] = dist_time() - t0;
	dist_stats(d, &st);
	v[1] = st.h2d_copy_seconds;
	v[2] = st.h2d_intra_seconds;
	v[3] = st.h2d_inter_seconds;
	return dist_allreduce_f64(d, v, 4, DIST_MAX);
}

/* Timed reps per size in --simulate (a pair of exchanges each, plus one to warm up) */
#define SIM_REPS 21

struct pair_times {
	double linear, h2d;   /* medians of the slowest rank's seconds */
	double phase[3];      /* medians of 2DH's phases (time_one) */
	int h2d_faster, reps; /* the reps in which 2DH beat the Linear exchange next to it */
};

/* Linear and 2DH on S bytes per rank, in pairs: each rep times both, one after the other, the
 * order alternating, so that a slow spell of the machine (other ranks on the cores) falls
 * on both alike and each pair's comparison is fair. A first pair warms up and is dropped;
 * reps <= 31. */
static int time_pair(struct dist *d, void *snd, void *rcv, size_t S, int reps,
		     struct pair_times *pt)
{
	const int64_t rows = (int64_t)(S / (size_t)dist_size(d) / 64);
	struct dist_span sp = {.base = snd, .rows = rows}, rp = {.base = rcv, .rows = rows};
	double t[5][32];
	pt->h2d_faster = 0;
	pt->reps = reps;
	for (int i = 0; i <= reps; i++) {
		double l[4], h[4];
		for (int k = 0; k < 2; k++) {
			const int lin = (k == 0) == (i % 2 == 0);
			ERR_FORWARD(time_one(d, lin ? DIST_A2A_LINEAR : DIST_A2A_2DH, &sp, &rp, rows,
					     lin ? l : h));
		}
		t[0][i] = l[0];
		for (int k = 0; k < 4; k++)
			t[k + 1][i] = h[k];
		pt->h2d_faster += i > 0 && h[0] < l[0];
	}
	pt->linear = stats_median(t[0] + 1, reps, NULL, NULL);
	pt->h2d = stats_median(t[1] + 1, reps, NULL, NULL);
	for (int k = 0; k < 3; k++)
		pt->phase[k] = stats_median(t[k + 2] + 1, reps, NULL, NULL);
	return 0;
}

/* The median over reps of the slowest rank's time of a barrier entered right after another:
 * what synchronising the W ranks once costs here (the skew of their start, plus the
 * barrier's own messages), zero bytes moved. */
static int time_sync(struct dist *d, int reps, double *sec)
{
	double t[32];
	for (int i = 0; i <= reps; i++) {
		ERR_FORWARD(dist_barrier(d));
		double t0 = dist_time();
		ERR_FORWARD(dist_barrier(d));
		double v = dist_time() - t0;
		ERR_FORWARD(dist_allreduce_f64(d, &v, 1, DIST_MAX));
		t[i] = v;
	}
	*sec = stats_median(t + 1, reps, NULL, NULL);
	return 0;
}

struct simopts {
	struct dist_net cluster;
	int maxw;
};

/* GB/s of seconds per byte, 0 for a rate too high to measure (a fit clamped at 0) */
static double gbps(double sec_per_byte) { return sec_per_byte > 0 ? 1e-9 / sec_per_byte : 0; }

static json_t *link_json(const struct dist_link *l)
{
	return json_pack("{s:f, s:f}", "alpha_us", 1e6 * l->alpha, "gbps", gbps(l->beta));
}

static void sim_table(const char *what, const struct dist_net *net, int maxw, int q)
{
	static const double mib[] = {1, 32, 256};
	for (int i = 0; i < 3; i++) {
		const double S = mib[i] * 1048576.0;
		const int cross = dist_model_crossover(net, S, maxw);
		json_t *pts = json_array();
		if (q == 0) {
			fprintf(stderr, "%s, %g MiB per rank, nodes of %d:", what, mib[i], net->m);
			if (cross)
				fprintf(stderr, " 2DH ahead from W=%d\n", cross);
			else
				fprintf(stderr, " Linear ahead up to W=%d\n", maxw);
			fprintf(stderr, "  %8s %12s %12s %8s\n", "W", "linear ms", "2dh ms", "speedup");
		}
		for (long n = net->m > 1 ? 2L * net->m : 2; n <= maxw; n *= 2) {
			const double l = dist_model_linear(net, (int)n, S);
			const double h = dist_model_2dh(net, (int)n, S);
			if (q == 0)
				fprintf(stderr, "  %8ld %12.3f %12.3f %8.2f\n", n, 1e3 * l, 1e3 * h, l / h);
			json_array_append_new(pts, json_pack("{s:I, s:f, s:f}", "W", (json_int_t)n,
							     "linear_ms", 1e3 * l, "2dh_ms", 1e3 * h));
		}
		json_t *j = json_pack("{s:s, s:s, s:f, s:i, s:o, s:o, s:f, s:o, s:o}", "run",
				      "simulate", "model", what, "mib_per_rank", mib[i],
				      "local_size", net->m, "intra", link_json(&net->intra),
				      "inter", link_json(&net->inter), "copy_gbps",
				      gbps(net->copy), "crossover_W",
				      cross ? json_integer(cross) : json_null(), "points", pts);
		if (q == 0)
			cli_print_json(j, JSON_COMPACT);
		else
			json_decref(j);
	}
}

/* Per byte of a stride copy from 2DH's copy phases, t_i = 2 S_i c: the mean over sizes of
 * t_i / (2 S_i), each size weighing alike. */
static double fit_copy(const double *S, const double *t, int k)
{
	double c = 0;
	for (int i = 0; i < k; i++)
		c += t[i] / (2.0 * S[i]) / k;
	return c;
}

/* Fit the link levels to exchanges measured here, check the model against Linear and 2DH
 * measured at this W, then predict these links and the cluster's up to maxw. Nodes of
 * 1 < m < W (real hosts, or --local-size): each level is fitted to its own 2DH phase (the
 * exchange within the node, the one across nodes) and the copy rate to its copies; one node
 * (or nodes of one rank): one level from Linear, serving as both, and the copy rate of the
 * backend. */
static int simulate(struct dist *d, struct backend *be, const struct simopts *so)
{
	const int W = dist_size(d), q = dist_rank(d), m = dist_local_size(d);
	const int two = m > 1 && m < W;
	static const double kib[] = {1, 4, 16, 64, 256, 1024, 4096, 16384};
	double S[8], tl[8], th[8], pc[8], pi[8], po[8], sync = 0;
	struct pair_times pt[8];
	int rc = 0, ns = 0;

	if (W >= 2) {
		const size_t maxb = (size_t)(kib[7] * 1024);
		void *a = NULL, *b = NULL;
		if (backend_alloc_zero(be, &a, maxb) < 0 || backend_alloc_zero(be, &b, maxb) < 0)
			rc = err_set(CORE_ENOMEM, NULL, "cannot allocate the exchange buffers");
		/* sizes of at least one 64-byte row per peer */
		rc = time_sync(d, SIM_REPS, &sync);
		for (int i = 0; i < 8 && rc == 0; i++) {
			if (kib[i] * 1024 < 64.0 * W)
				continue;
			S[ns] = kib[i] * 1024;
			rc = time_pair(d, a, b, (size_t)S[ns], SIM_REPS, &pt[ns]);
			tl[ns] = pt[ns].linear;
			th[ns] = pt[ns].h2d;
			pc[ns] = pt[ns].phase[0];
			pi[ns] = pt[ns].phase[1];
			po[ns] = pt[ns].phase[2];
			ns++;
		}
		be->op->free(be, a);
		be->op->free(be, b);
		if (rc < 0)
			return rc;
		struct dist_net here = {.m = m};
		if (two) {
			if (dist_model_fit(S, pi, ns, m, &here.intra) < 0 ||
			    dist_model_fit(S, po, ns, W / m, &here.inter) < 0)
				return err_set(CORE_EUSAGE, NULL, "the exchange times do not "
					       "determine the links");
			here.copy = fit_copy(S, pc, ns);
		} else {
			if (dist_model_fit(S, tl, ns, W, &here.intra) < 0)
				return err_set(CORE_EUSAGE, NULL, "the exchange times do not "
					       "determine a link");
			here.inter = here.intra;
			const double gbps = probe_copy_gbps(be, (size_t)(64 << 20), 5);
			here.copy = 2.0 / (gbps * 1e9);
		}
		json_t *pts = json_array();
		if (q == 0) {
			if (two)
				fprintf(stderr, "measured at W=%d (nodes of %d, %s): two link levels "
					"fitted to 2DH's phases: within a node alpha %.2f us, %.2f GB/s; "
					"across nodes alpha %.2f us, %.2f GB/s; stride copy %.2f GB/s "
					"(bytes copied)\n", W, m, dist_layout_source(d),
					1e6 * here.intra.alpha, gbps(here.intra.beta),
					1e6 * here.inter.alpha, gbps(here.inter.beta), gbps(here.copy));
			else
				/* On one host both levels are the same memory: Linear's messages share
				 * it (the fitted line, (W-1)(alpha + S/W beta)), where the model's two
				 * levels would run side by side. */
				fprintf(stderr, "measured at W=%d (nodes of %d, %s): one link level "
					"fitted, alpha %.2f us, %.2f GB/s; stride copy %.2f GB/s (bytes "
					"copied)\n", W, m, dist_layout_source(d), 1e6 * here.intra.alpha,
					gbps(here.intra.beta), gbps(here.copy));
			fprintf(stderr, "a barrier after a barrier: %.1f us (median of %d)\n",
				1e6 * sync, SIM_REPS);
			fprintf(stderr, "  %10s %12s %12s %12s %12s %12s\n", "KiB/rank", "linear ms",
				"model", "2dh ms", "model", "2dh faster");
		}
		for (int i = 0; i < ns; i++) {
			const double lm = two ? dist_model_linear(&here, W, S[i])
					      : (W - 1) * (here.intra.alpha + S[i] / W * here.intra.beta);
			const double hm = dist_model_2dh(&here, W, S[i]);
			if (q == 0)
				fprintf(stderr, "  %10.0f %12.3f %12.3f %12.3f %12.3f %9d/%-2d\n",
					S[i] / 1024, 1e3 * tl[i], 1e3 * lm, 1e3 * th[i], 1e3 * hm,
					pt[i].h2d_faster, pt[i].reps);
			json_array_append_new(pts, json_pack("{s:f, s:f, s:f, s:f, s:f, s:[f, f, f], "
				"s:i, s:i}", "kib_per_rank", S[i] / 1024, "linear_ms", 1e3 * tl[i],
				"linear_model_ms", 1e3 * lm, "2dh_ms", 1e3 * th[i], "2dh_model_ms",
				1e3 * hm, "2dh_phases_ms", 1e3 * pc[i], 1e3 * pi[i], 1e3 * po[i],
				"2dh_faster_reps", pt[i].h2d_faster, "reps", pt[i].reps));
		}
		json_t *j = json_pack("{s:s, s:i, s:i, s:s, s:i, s:o, s:o, s:f, s:f, s:o}", "run",
				      "simulate-fit", "W", W, "local_size", m, "layout",
				      dist_layout_source(d), "levels", two ? 2 : 1, "intra",
				      link_json(&here.intra), "inter", link_json(&here.inter),
				      "copy_gbps", gbps(here.copy), "sync_us", 1e6 * sync,
				      "points", pts);
		if (q == 0)
			cli_print_json(j, JSON_COMPACT);
		else
			json_decref(j);
		sim_table(two ? "the measured nodes' links" : "this host's links", &here, so->maxw, q);
	} else if (q == 0) {
		fprintf(stderr, "one rank: nothing to measure (run under mpirun -np W >= 2 to fit "
			"this host's links); the cluster model only\n");
	}
	sim_table("cluster", &so->cluster, so->maxw, q);
	return 0;
}

/* "A:B" (form names it in errors) into two numbers, a in [alo, ahi] and b in [blo, bhi]. */
static int parse_pair(const char *opt, const char *arg, const char *form, double alo,
		      double ahi, double blo, double bhi, double *a, double *b)
{
	char first[64];
	const char *colon = strchr(arg, ':');
	if (!colon || (size_t)(colon - arg) >= sizeof first)
		return err_set(CORE_EUSAGE, NULL, "option '%s': '%s' is not %s", opt, arg, form);
	memcpy(first, arg, (size_t)(colon - arg));
	first[colon - arg] = 0;
	ERR_FORWARD(cli_parse_double(opt, first, alo, ahi, a));
	return cli_parse_double(opt, colon + 1, blo, bhi, b);
}

/* "ALPHA_US:GBPS" into a link. */
static int parse_link(const char *opt, const char *arg, struct dist_link *l)
{
	double us, gbps;
	ERR_FORWARD(parse_pair(opt, arg, "ALPHA_US:GBPS", 0.0, 1e6, 1e-6, 1e6, &us, &gbps));
	l->alpha = us * 1e-6;
	l->beta = 1.0 / (gbps * 1e9);
	return 0;
}

/* "1,2,4" into out (values checked by the caller's table); returns the count or -1. */
static int parse_list(const char *opt, const char *arg, const char *const *names, int n,
		      int *out, int max)
{
	char tmp[128];
	int m = 0;
	snprintf(tmp, sizeof tmp, "%s", arg);
	for (char *save = NULL, *tok = strtok_r(tmp, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		int i = 0;
		while (i < n && strcmp(tok, names[i]) != 0)
			i++;
		if (i == n || m == max) {
			err_set(CORE_EUSAGE, NULL, "option '%s': '%s' is not one of the values "
				"allowed", opt, tok);
			return -1;
		}
		for (int j = 0; j < m; j++)
			if (out[j] == i) {
				err_set(CORE_EUSAGE, NULL, "option '%s': '%s' is given twice", opt, tok);
				return -1;
			}
		out[m++] = i;
	}
	if (m == 0)
		err_set(CORE_EUSAGE, NULL, "option '%s': empty list", opt);
	return m ? m : -1;
}

static int run(struct search *s, const char *out, const char *trials_path, double flo,
	       double fhi, int64_t R, struct dist *d)
{
	const struct moe_config *c = &s->o.cfg;
	/* The capacities the layer gives these factors: k * int(f * ceil(T / E)). */
	const int64_t clo = moe_capacity_fixed(c->E, c->T, c->k, flo);
	const int64_t chi = moe_capacity_fixed(c->E, c->T, c->k, fhi);
	const int64_t klo = clo / R, khi = chi / R, q = dist_rank(d);
	struct moe_dict dict = {0};
	const double t0 = now_seconds();

	dict.W = dist_size(d);
	dict.local_size = dist_local_size(d);
	dict.E = c->E;
	dict.k = c->k;
	dict.M = c->M;
	dict.H = c->H;
	dict.T = c->T;
	dict.R = R;
	machine(dict.machine, sizeof dict.machine, d);
	dict.e = calloc((size_t)(khi - klo + 1), sizeof *dict.e);
	if (!dict.e)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the dictionary");
	/* With one node, or one rank per node, 2DH is Linear (dist.h): trying both would let
	 * noise pick a name. */
	const int m = dist_local_size(d);
	if ((m == 1 || m == dist_size(d)) && s->ms.na == 2) {
		s->ms.na = 1;
		s->ms.alist[0] = DIST_A2A_LINEAR;
		if (q == 0)
			fprintf(stderr, "%s: nodes of %d of %d ranks: 2dh is linear here, only linear "
				"is tried (--local-size simulates nodes)\n", prog, m, dist_size(d));
	}
	int rc = moe_bench_dist_data_init(&s->dd, &s->o);
	s->ms.measure = measure;
	s->ms.ctx = s;
	if (rc == 0 && (s->ms.nr = moe_plan_rs(moe_dist_layer_place(s->dd.l), s->ms.rs, 64)) < 1)
		rc = err_set(CORE_ESHAPE, NULL, "no plan fits the layer's placement");
	if (rc == 0 && q == 0)
		fprintf(stderr, "%s: W=%d ranks (nodes of %d, %s), E=%d, M=%lld, H=%lld, k=%d, "
			"T=%lld per rank; C %lld..%lld: buckets %lld..%lld of R=%lld\n", prog,
			dict.W, dict.local_size, dist_layout_source(d), c->E, (long long)c->M,
			(long long)c->H, c->k, (long long)c->T, (long long)clo, (long long)chi,
			(long long)klo, (long long)khi, (long long)R);
	for (int64_t key = klo; key <= khi && rc == 0; key++) {
		/* The middle of the bucket; its lower half is empty below one slot. */
		const int64_t C = key * R + R / 2 > 0 ? key * R + R / 2 : 1;
		int nt = 0;
		rc = moe_search_bucket(&s->ms, key, C, &dict.e[dict.n], &nt);
		if (rc == 0 && q == 0) {
			char p[48];
			const struct moe_plan *b = &dict.e[dict.n].plan;
			if (b->r == 0)
				snprintf(p, sizeof p, "r=0");
			else
				snprintf(p, sizeof p, "r=%d d=%d %s", b->r, b->d, dist_a2a_name(b->a));
			fprintf(stderr, "%s: bucket %lld (%lld/%lld, C=%lld): %s %.2f ms, %d trials, "
				"%.0f s elapsed\n", prog, (long long)key, (long long)(key - klo + 1),
				(long long)(khi - klo + 1), (long long)C, p,
				1e3 * dict.e[dict.n].seconds, nt, now_seconds() - t0);
		}
		dict.n++;
	}
	if (rc == 0 && q == 0) {
		rc = moe_dict_write(out, &dict);
		if (rc == 0 && trials_path)
			rc = moe_search_write_trials(trials_path, &s->ms);
		if (rc == 0)
			rc = cli_print_json(json_pack("{s:s, s:i, s:i, s:I, s:I, s:I, s:f, s:s}",
						      "dict", out, "W", dict.W, "local_size",
						      dict.local_size, "buckets", (json_int_t)dict.n,
						      "trials", (json_int_t)s->ms.nt, "window",
						      (json_int_t)R, "seconds", now_seconds() - t0,
						      "gemm_kernel", s->o.be->gemm_kernel),
					    JSON_COMPACT);
	}
	/* The files are rank 0's: the others learn whether it managed. */
	rc = dist_agree_rc(d, rc);
	moe_bench_dist_data_free(&s->dd);
	moe_dict_free(&dict);
	return rc;
}

/* Report rc, wait for the other ranks to report theirs (mpirun kills every rank once one
 * exits non-zero), close the world; the exit status. */
static int finish(struct dist *d, int rc)
{
	int st = rc < 0 ? cli_report(prog, rc) : 0;
	if (rc < 0 && d)
		dist_barrier_timeout(d, 10.0);
	dist_close(d);
	return st;
}

/* The command line, parsed. */
struct args {
	long T, M, H, E, k, R, iters, warm, local, seed, threads;
	double flo, fhi;
	int act, force, sim;
	struct simopts so;
	const char *out, *trials, *device;
};

/* Parse into *a, the plans to try (--d-values, --algorithms) into *ms: the exit status when
 * the program ends here (--help, --version, a usage error), or -1 to run. */
static int parse(int argc, char **argv, struct args *a, struct moe_search *ms)
{
	static const char *const dnames[] = {"1", "2", "4", "8"};
	static const char *const anames[] = {"linear", "2dh"};
	struct cli_parser p;
	double gbps;
	long v;
	int c, rc = cli_parser_init(&p, prog, NULL, parse_tables);

	if (rc < 0)
		return cli_report(prog, rc);
	while ((c = cli_next(&p, argc, argv)) != -1) {
		switch (c) {
		case 'T': rc = cli_parse_long("--tokens", optarg, 1, 1L << 30, &a->T); break;
		case 'M': rc = cli_parse_long("--model-dim", optarg, 1, 1L << 20, &a->M); break;
		case 'H': rc = cli_parse_long("--hidden-dim", optarg, 1, 1L << 20, &a->H); break;
		case 'E': rc = cli_parse_long("--experts", optarg, 1, 1L << 16, &a->E); break;
		case 'k': rc = cli_parse_long("--top-k", optarg, 1, 1L << 16, &a->k); break;
		case OPT_ACTIVATION:
			a->act = moe_act_from_name(optarg);
			if (a->act < 0)
				rc = err_set(CORE_EUSAGE, NULL, "option '--activation': unknown "
					     "activation '%s' (%s)", optarg, moe_act_names());
			break;
		case OPT_FACTORS:
			rc = parse_pair("--factors", optarg, "LO:HI", 1e-3, 1e3, 1e-3, 1e3, &a->flo,
					&a->fhi);
			if (rc == 0 && a->fhi < a->flo)
				rc = err_set(CORE_EUSAGE, NULL, "option '--factors': %g is below %g",
					     a->fhi, a->flo);
			break;
		case 'R': rc = cli_parse_long("--window", optarg, 1, 1L << 30, &a->R); break;
		case OPT_D_VALUES:
			/* the names' indices, then the degrees they name */
			ms->nd = parse_list("--d-values", optarg, dnames, 4, ms->dlist, 4);
			rc = ms->nd < 0 ? CORE_EUSAGE : 0;
			for (int i = 0; i < ms->nd; i++)
				ms->dlist[i] = 1 << ms->dlist[i];
			break;
		case OPT_ALGORITHMS:
			ms->na = parse_list("--algorithms", optarg, anames, 2, ms->alist, 2);
			rc = ms->na < 0 ? CORE_EUSAGE : 0;
			break;
		case 'n': rc = cli_parse_long("--iterations", optarg, 1, 1L << 20, &a->iters); break;
		case 'w': rc = cli_parse_long("--warmup", optarg, 0, 1L << 20, &a->warm); break;
		case OPT_CONFIRM: {
			long n = 0;
			rc = cli_parse_long("--confirm", optarg, 0, 1000, &n);
			ms->confirm = (int)n;
			break;
		}
		case OPT_LOCAL_SIZE:
			rc = cli_parse_long("--local-size", optarg, 1, 1L << 20, &a->local);
			break;
		case 'o': a->out = optarg; break;
		case OPT_TRIALS: a->trials = optarg; break;
		case 'f': a->force = 1; break;
		case 's': rc = cli_parse_long("--seed", optarg, 0, 1L << 62, &a->seed); break;
		case 't': rc = cli_parse_long("--threads", optarg, 1, 4096, &a->threads); break;
		case OPT_DEVICE: a->device = optarg; break;
		case OPT_SIMULATE: a->sim = 1; break;
		case OPT_INTRA: rc = parse_link("--intra", optarg, &a->so.cluster.intra); break;
		case OPT_INTER: rc = parse_link("--inter", optarg, &a->so.cluster.inter); break;
		case OPT_COPY:
			if ((rc = cli_parse_double("--copy", optarg, 1e-6, 1e6, &gbps)) == 0)
				a->so.cluster.copy = 1.0 / (gbps * 1e9);
			break;
		case OPT_SIM_LOCAL_SIZE:
			if ((rc = cli_parse_long("--sim-local-size", optarg, 1, 1L << 20, &v)) == 0)
				a->so.cluster.m = (int)v;
			break;
		case OPT_MAX_WORLD:
			if ((rc = cli_parse_long("--max-world", optarg, 2, 1L << 24, &v)) == 0)
				a->so.maxw = (int)v;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("moe-profile %s\n", CORE_VERSION);
			return 0;
		default: /* CLI_BAD, reported */
			return 2;
		}
		if (rc < 0)
			return cli_report(prog, rc);
	}
	if (optind < argc)
		return cli_usage_error(prog, "unexpected argument '%s'", argv[optind]);
	if (!a->out && !a->sim)
		return cli_usage_error(prog, "-o FILE is required: where the dictionary goes (see "
				       "moe-profile --help)");
	if ((a->out || a->trials) && a->sim)
		return cli_usage_error(prog, "--simulate predicts exchange times and writes no "
				       "dictionary: not with %s", a->out ? "-o" : "--trials");
	if (a->sim && strcmp(a->device, "cpu") != 0 && strcmp(a->device, "ref") != 0)
		return cli_usage_error(prog, "option '--device': --simulate times the host "
				       "All-to-All (cpu or ref), not '%s'", a->device);
	return -1;
}

/* --simulate: the exit status. */
static int simulate_main(const struct args *a)
{
	struct dist *d = NULL;
	struct backend *be = NULL;
	int rc = dist_open(&d, (int)a->local);

	if (rc == 0)
		rc = backend_open(&be, a->device,
				  &(struct backend_params){.threads = (int)a->threads});
	if (rc == 0)
		rc = simulate(d, be, &a->so);
	backend_close(be);
	return finish(d, rc);
}

/* The dictionary: the layer a gives, measured under the plans of s->ms; the exit status. */
static int profile(const struct args *a, struct search *s)
{
	const char *paths[] = {a->out, a->trials};
	int rc;

	for (int i = 0; i < 2; i++)
		if (paths[i] && !a->force && access(paths[i], F_OK) == 0)
			return cli_usage_error(prog, "'%s' exists: refusing to overwrite it without "
					       "--force", paths[i]);
	moe_config_default(&s->o.cfg, a->T, a->M, a->H, (int)a->E);
	s->o.cfg.k = (int)a->k;
	s->o.cfg.act = (enum moe_act)a->act;
	s->o.cfg.seed = (uint64_t)a->seed;
	rc = moe_config_check(&s->o.cfg);
	if (rc < 0)
		return cli_report(prog, rc);
	s->o.iters = a->iters;
	s->o.aux_weight = MOE_BENCH_AUX_WEIGHT;
	s->o.warmup = a->warm;
	s->o.input_grad = 1;
	for (int i = 0; i < 2; i++)
		if (paths[i] && (rc = cli_make_parents(paths[i])) < 0)
			return cli_report(prog, rc);

	struct dist *d = NULL;
	struct backend *be = NULL;
	rc = dist_open(&d, (int)a->local);
	/* one GPU per rank of a node */
	if (rc == 0)
		rc = backend_open(&be, a->device, &(struct backend_params){
			.threads = (int)a->threads, .device = dist_rank(d) % dist_local_size(d)});
	if (rc == 0) {
		struct moe_dist_place pl;
		rc = moe_dist_place(&pl, &s->o.cfg, dist_size(d), dist_rank(d));
	}
	if (rc == 0) {
		s->o.be = be;
		s->o.d = d;
		rc = run(s, a->out, a->trials, a->flo, a->fhi, a->R, d);
	}
	moe_search_free(&s->ms);
	backend_close(be);
	return finish(d, rc);
}

int main(int argc, char **argv)
{
	/* The cluster --simulate predicts by default: nodes of 8 GPUs on NVLink (2 us, 150 GB/s
	 * per message stream), HDR InfiniBand across nodes (5 us, 25 GB/s: 200 Gb/s, Tutel's
	 * fig. 16), stride copies at 1000 GB/s (HBM). Illustrative, not measured. */
	struct args a = {
		.T = 4096, .M = 1024, .H = 4096, .E = 16, .k = 2, .R = 128, .iters = 3, .warm = 1,
		.seed = 1, .flo = 1.0, .fhi = 4.4, .act = MOE_ACT_RELU, .device = "cpu",
		.so = {.cluster = {.intra = {2e-6, 1.0 / 150e9}, .inter = {5e-6, 1.0 / 25e9},
				   .copy = 1.0 / 1000e9, .m = 8},
		       .maxw = 4096},
	};
	struct search s = {.ms = {.nd = 4, .dlist = {1, 2, 4, 8}, .na = 2, .alist = {0, 1},
				  .confirm = 3}};
	int rc = parse(argc, argv, &a, &s.ms);

	if (rc >= 0)
		return rc;
	return a.sim ? simulate_main(&a) : profile(&a, &s);
}
