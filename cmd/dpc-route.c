/* dpc-route - DiPaCo's routers: prefix features, k-means, path scores, discriminative and
 * window routers, and evaluation with test-time routing (paper section 2.4).
 *
 * Thin by design: options are parsed here, the work is in lib/route (route.h, routefile.h,
 * lm.h, kmeans.h, logreg.h). Every subcommand writes one file atomically (refusing to replace
 * one without --force) and prints a JSON summary on stdout; eval prints a table.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "cli/opt.h"
#include "common/err.h"
#include "common/jsonfmt.h"
#include "common/progress.h"
#include "common/rng.h"
#include "io/atomicio.h"
#include "io/tokfile.h"
#include "route/kmeans.h"
#include "route/generate.h"
#include "route/lm.h"
#include "route/logreg.h"
#include "route/pathset.h"
#include "route/route.h"
#include "route/routefile.h"
#include "model/sample.h"

#include "common/banned.h"

static const char prog[] = "dpc-route";

#define DEFAULT_PREFIX 32
#define DEFAULT_BATCH 16
#define MAX_WINDOWS 16

static int cmd_features(int argc, char **argv);
static int cmd_kmeans(int argc, char **argv);
static int cmd_score(int argc, char **argv);
static int cmd_fit(int argc, char **argv);
static int cmd_eval(int argc, char **argv);
static int cmd_sample(int argc, char **argv);

static const struct cli_command commands[] = {
	{ "features", "prefix features of every document, from a base checkpoint", cmd_features },
	{ "kmeans", "fit a k-means (generative) router on features", cmd_kmeans },
	{ "score", "log-likelihood of every token and document under every path", cmd_score },
	{ "fit", "fit a discriminative document router, or a window router, on scores",
	  cmd_fit },
	{ "eval", "perplexity of a DiPaCo routed once per document and every W tokens",
	  cmd_eval },
	{ "sample", "generate text from a checkpoint (temperature, top-k, top-p, KV cache)",
	  cmd_sample },
};

#define NCOMMANDS ((int)(sizeof commands / sizeof commands[0]))

static int version(void)
{
	printf("%s %s\n", prog, CORE_VERSION);
	return 0;
}

static int bad_option(const char *cmd, const struct option *longopts, char **argv, int c)
{
	char help[64];

	snprintf(help, sizeof help, "%s %s", prog, cmd);
	return cli_bad_option(prog, help, longopts, argv, c);
}

/* What ran the matrix products, once a subcommand has opened its backend: every summary then
 * names it (gemm_kernel). */
static const char *gemm_kernel;

static int print_json(json_t *j)
{
	if (j && gemm_kernel)
		json_object_set_new(j, "gemm_kernel", json_string(gemm_kernel));
	int rc = cli_print_json(j, JSON_INDENT(2));

	return rc < 0 ? cli_report(prog, rc) : 0;
}

/* ---- options every command shares ---------------------------------------------------------- */

#define COMMON_LONGOPTS                                                                            \
	{ "output", required_argument, NULL, 'o' }, { "force", no_argument, NULL, 'f' },           \
	{ "threads", required_argument, NULL, 't' }, { "device", required_argument, NULL, 'D' },  \
	{ "quiet", no_argument, NULL, 'q' }, { "help", no_argument, NULL, 'h' },                  \
	{ "version", no_argument, NULL, 'V' }
#define COMMON_SHORTOPTS ":o:ft:qhV"
#define COMMON_HELP                                                                                \
	"  -o, --output FILE     the file to write (required); an existing one is\n"              \
	"                        replaced only with --force\n"                                      \
	"  -f, --force           replace an existing output file\n"                                \
	"  -t, --threads N       OpenMP threads (default: OMP_NUM_THREADS or all cores)\n"         \
	"      --device NAME     where models run: cpu (default) or ref\n"                          \
	"  -q, --quiet           no progress line on stderr\n"                                      \
	"  -h, --help            show this help and exit\n"                                         \
	"  -V, --version         show the version and exit\n"

struct common {
	const char *out, *device;
	long threads;
	int force, quiet;
	struct backend *be;
	struct progress bar;
};

/* 1 when c was one of the shared options (handled), 0 when not, < 0: exit status negated. */
static int common_opt(struct common *co, int c, const char *arg)
{
	int rc;
	switch (c) {
	case 'o': co->out = arg; return 1;
	case 'f': co->force = 1; return 1;
	case 'q': co->quiet = 1; return 1;
	case 'D': co->device = arg; return 1;
	case 't':
		if ((rc = cli_parse_long("--threads", arg, 1, 4096, &co->threads)) < 0)
			return -cli_report(prog, rc);
		return 1;
	}
	return 0;
}

/* Before any work: an output was named and may be written. */
static int check_output(const struct common *co, const char *cmd)
{
	struct stat st;
	if (!co->out)
		return cli_usage_error(prog, "%s: --output FILE is required (see %s %s --help)", cmd,
				       prog, cmd);
	if (!co->force && stat(co->out, &st) == 0 && S_ISREG(st.st_mode))
		return cli_report(prog, err_set(CORE_EIO, co->out, "exists (use --force to "
						"replace it)"));
	return 0;
}

static int open_backend(struct common *co)
{
	int rc = backend_open(&co->be, co->device ? co->device : "cpu",
			      &(struct backend_params){.threads = (int)co->threads});
	if (rc < 0)
		return cli_report(prog, rc);
	gemm_kernel = co->be->gemm_kernel;
	return 0;
}

static void show_progress(void *ctx, uint64_t done)
{
	struct common *co = ctx;
	progress_update(&co->bar, (int64_t)done, NULL);
}

static void start_progress(struct common *co, const char *label, int64_t total)
{
	progress_init(&co->bar, label, total);
	if (co->quiet)
		co->bar.enabled = 0;
}

static int expect_args(int argc, int want, const char *cmd, const char *what)
{
	if (argc - optind != want)
		return cli_usage_error(prog, "%s: expected %s, got %d argument%s (see %s %s --help)",
				       cmd, what, argc - optind, argc - optind == 1 ? "" : "s",
				       prog, cmd);
	return 0;
}

static json_t *recipe_json(const struct recipe *r)
{
	return json_pack("{s:s,s:i,s:i}", "checkpoint_digest", r->digest, "layer", r->layer,
			 "prefix", r->prefix);
}

/* ---- features ----------------------------------------------------------------------------- */

static void features_usage(FILE *fp)
{
	fprintf(fp,
		"usage: %s features -m BASE.safetensors -o OUT [options] IN.tok\n"
		"For every document of IN.tok, the mean output of one block of the base\n"
		"checkpoint over the document's first tokens (forward only), written to OUT\n"
		"with the recipe that made it (dpc-route(5)).\n\n"
		"options:\n"
		"  -m, --model FILE      the base checkpoint (required)\n"
		"  -p, --prefix N        tokens of each document to average over (default %d;\n"
		"                        at most the model's context)\n"
		"      --layer L         the block whose output is averaged, from 0 (default:\n"
		"                        the last, before the final LayerNorm)\n"
		"  -B, --batch N         documents per forward (default 64)\n"
		COMMON_HELP,
		prog, DEFAULT_PREFIX);
}

static int cmd_features(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "model", required_argument, NULL, 'm' }, { "prefix", required_argument, NULL, 'p' },
		{ "layer", required_argument, NULL, 'L' }, { "batch", required_argument, NULL, 'B' },
		COMMON_LONGOPTS, { NULL, 0, NULL, 0 },
	};
	struct common co = {0};
	const char *model = NULL;
	long prefix = DEFAULT_PREFIX, layer = -1, batch = 64;
	int c, rc;

	while ((c = getopt_long(argc, argv, COMMON_SHORTOPTS "m:p:B:", longopts, NULL)) != -1) {
		if ((rc = common_opt(&co, c, optarg)) < 0)
			return -rc;
		if (rc)
			continue;
		switch (c) {
		case 'm': model = optarg; break;
		case 'p': rc = cli_parse_long("--prefix", optarg, 1, INT_MAX, &prefix); break;
		case 'L': rc = cli_parse_long("--layer", optarg, 0, INT_MAX, &layer); break;
		case 'B': rc = cli_parse_long("--batch", optarg, 1, 4096, &batch); break;
		case 'h': features_usage(stdout); return 0;
		case 'V': return version();
		default: return bad_option("features", longopts, argv, c);
		}
		if (rc < 0)
			return cli_report(prog, rc);
	}
	if ((rc = expect_args(argc, 1, "features", "one token file")) ||
	    (rc = check_output(&co, "features")))
		return rc;
	if (!model)
		return cli_usage_error(prog, "features: --model BASE.safetensors is required");

	struct tokfile tf;
	struct lm base;
	struct features f;
	if ((rc = tokfile_open(&tf, argv[optind])) < 0)
		return cli_report(prog, rc);
	if ((rc = open_backend(&co)))
		goto close_tf;
	rc = lm_open(&base, model, co.be, (int)batch);
	if (rc < 0) {
		rc = cli_report(prog, rc);
		goto close_be;
	}
	if (layer < 0)
		layer = base.g.cfg.n_layer - 1;
	start_progress(&co, "features", (int64_t)tf.ndocs);
	const double t0 = now_seconds();
	rc = route_features(&base, &tf, (int)prefix, (int)layer, &f, show_progress, &co);
	const double secs = now_seconds() - t0;
	progress_done(&co.bar);
	if (!rc) {
		rc = features_write(co.out, &f);
		uint64_t tokens = 0;
		for (uint64_t d = 0; d < tf.ndocs; d++) {
			uint64_t l = tf.offsets[d + 1] - tf.offsets[d];
			tokens += l < (uint64_t)prefix ? l : (uint64_t)prefix;
		}
		if (!rc)
			rc = print_json(json_pack(
				"{s:s,s:s,s:I,s:i,s:o,s:I,s:f,s:f}", "output", co.out, "corpus",
				tf.path, "docs", (json_int_t)tf.ndocs, "dim", f.dim, "recipe",
				recipe_json(&f.r), "tokens", (json_int_t)tokens, "seconds", secs,
				"tokens_per_s", secs > 0 ? (double)tokens / secs : 0.0));
		else
			rc = cli_report(prog, rc);
		features_free(&f);
	} else {
		rc = cli_report(prog, rc);
	}
	lm_close(&base);
close_be:
	backend_close(co.be);
close_tf:
	tokfile_close(&tf);
	return rc;
}

/* ---- kmeans ------------------------------------------------------------------------------- */

static void kmeans_usage(FILE *fp)
{
	fprintf(fp,
		"usage: %s kmeans -k PATHS -o ROUTER [options] FEATURES\n"
		"Fit k-means with k = PATHS on the features (k-means++ initialisation, Lloyd\n"
		"iterations, several restarts, the lowest inertia kept) and write the router:\n"
		"the centroids and the feature recipe (dpc-route(5)).\n\n"
		"options:\n"
		"  -k, --paths K         number of clusters, one per path (required)\n"
		"      --restarts N      independent restarts (default 4)\n"
		"      --iters N         Lloyd iterations at most, per restart (default 100)\n"
		"      --seed N          seed of the initialisations (default 0)\n"
		"  -o, --output FILE     the router to write (required); an existing one is\n"
		"                        replaced only with --force\n"
		"  -f, --force           replace an existing output file\n"
		"  -t, --threads N       OpenMP threads (results are the same for any number)\n"
		"      --device NAME     accepted for symmetry; k-means runs on the CPU\n"
		"  -q, --quiet           accepted; k-means prints no progress\n"
		"  -h, --help            show this help and exit\n"
		"  -V, --version         show the version and exit\n",
		prog);
}

static int cmd_kmeans(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "paths", required_argument, NULL, 'k' }, { "restarts", required_argument, NULL, 'r' },
		{ "iters", required_argument, NULL, 'i' }, { "seed", required_argument, NULL, 's' },
		COMMON_LONGOPTS, { NULL, 0, NULL, 0 },
	};
	struct common co = {0};
	long k = 0, restarts = 4, iters = 100, seed = 0;
	int c, rc;

	while ((c = getopt_long(argc, argv, COMMON_SHORTOPTS "k:", longopts, NULL)) != -1) {
		if ((rc = common_opt(&co, c, optarg)) < 0)
			return -rc;
		if (rc)
			continue;
		switch (c) {
		case 'k': rc = cli_parse_long("--paths", optarg, 1, ROUTE_MAX_PATHS, &k); break;
		case 'r': rc = cli_parse_long("--restarts", optarg, 1, 1000, &restarts); break;
		case 'i': rc = cli_parse_long("--iters", optarg, 1, 100000, &iters); break;
		case 's': rc = cli_parse_long("--seed", optarg, 0, LONG_MAX, &seed); break;
		case 'h': kmeans_usage(stdout); return 0;
		case 'V': return version();
		default: return bad_option("kmeans", longopts, argv, c);
		}
		if (rc < 0)
			return cli_report(prog, rc);
	}
	if ((rc = expect_args(argc, 1, "kmeans", "one features file")) ||
	    (rc = check_output(&co, "kmeans")))
		return rc;
	if (!k)
		return cli_usage_error(prog, "kmeans: --paths K is required");
	if (co.threads)
		omp_set_num_threads((int)co.threads);

	struct features f;
	struct router r = {0};
	struct kmeans_report rep = {0};
	if ((rc = features_read(argv[optind], &f)) < 0)
		return cli_report(prog, rc);
	if (f.docs < (uint64_t)k) {
		rc = cli_report(prog, err_set(CORE_ESHAPE, argv[optind], "%llu documents cannot "
					      "make %ld clusters", (unsigned long long)f.docs, k));
		features_free(&f);
		return rc;
	}
	r.kind = ROUTER_KMEANS;
	r.paths = (int)k;
	r.dim = f.dim;
	r.r = f.r;
	r.centroids = malloc((size_t)k * (size_t)f.dim * sizeof(float));
	uint32_t *assign = malloc(f.docs * sizeof *assign);
	const struct kmeans_opts o = {.k = (int)k, .restarts = (int)restarts,
				      .max_iter = (int)iters, .tol = 0, .seed = (uint64_t)seed};
	const double t0 = now_seconds();
	rc = !r.centroids || !assign ? err_set(CORE_ENOMEM, argv[optind], "out of memory")
				     : kmeans_fit(f.x, f.docs, f.dim, &o, r.centroids, assign, &rep);
	const double secs = now_seconds() - t0;
	json_t *sizes = json_array();
	if (!rc) {
		uint64_t *n = calloc((size_t)k, sizeof *n);
		for (uint64_t d = 0; n && d < f.docs; d++)
			n[assign[d]]++;
		for (long i = 0; n && i < k; i++)
			json_array_append_new(sizes, json_integer((json_int_t)n[i]));
		free(n);
		json_t *rj = json_pack("{s:s,s:I,s:i,s:f,s:i,s:i,s:O}", "features", argv[optind],
				       "docs", (json_int_t)f.docs, "restarts", (int)restarts,
				       "inertia", rep.inertia, "iterations", rep.iterations,
				       "best_restart", rep.best_restart, "sizes", sizes);
		r.report = rj ? json_dumps(rj, JSON_COMPACT) : NULL;
		rc = router_write(co.out, &r);
		if (!rc)
			rc = print_json(json_pack("{s:s,s:s,s:o,s:f}", "output", co.out, "kind",
						  "kmeans", "report", rj, "seconds", secs));
		else
			json_decref(rj), rc = cli_report(prog, rc);
	} else {
		rc = cli_report(prog, rc);
	}
	json_decref(sizes);
	kmeans_report_free(&rep);
	free(assign);
	router_free(&r);
	features_free(&f);
	return rc;
}

/* ---- paths: a run's phase, or checkpoints ------------------------------------------------- */

#define PATHSET_LONGOPTS                                                                           \
	{ "run", required_argument, NULL, 'R' }, { "phase", required_argument, NULL, 'T' },        \
	{ "path", required_argument, NULL, 'P' }
#define PATHSET_HELP                                                                               \
	"      --run RUNDIR      the paths of a DiPaCo run, assembled from its modules\n"           \
	"      --phase T         ... after phase T's outer step (default: the last phase\n"        \
	"                        whose modules all exist)\n"                                       \
	"      --path CKPT       a path checkpoint instead (repeatable, in path order)\n"

static int pathset_opt(struct pathset *ps, int c, const char *arg)
{
	int rc;
	switch (c) {
	case 'R': ps->run = arg; return 1;
	case 'P':
		if (ps->nfiles == PATHSET_MAX_FILES)
			return -cli_usage_error(prog, "--path: at most %d", PATHSET_MAX_FILES);
		ps->files[ps->nfiles++] = arg;
		return 1;
	case 'T':
		if ((rc = cli_parse_long("--phase", arg, 0, 1000000, &ps->phase)) < 0)
			return -cli_report(prog, rc);
		return 1;
	}
	return 0;
}

/* --early-stop's report on stderr, a line per path as its phase is found. */
static void report_best(void *ctx, int p, long best, const double *loss, long T)
{
	(void)ctx;
	fprintf(stderr, "dpc-route: early stopping: path %d at phase %ld (held-out loss", p, best);
	for (long t = 0; t < T; t++)
		fprintf(stderr, " %.4f", loss[t]);
	fprintf(stderr, " after phases 1..%ld)\n", T);
}

/* Open the paths; an error is reported (the exit status is returned). */
static int open_paths(struct pathset *ps, const struct common *co, int B, const char *cmd)
{
	if (ps->early && !co->quiet)
		ps->on_best = report_best;
	int rc = pathset_open(ps, co->be, B, cmd);
	return rc < 0 ? cli_report(prog, rc) : 0;
}

/* ---- score -------------------------------------------------------------------------------- */

static void score_usage(FILE *fp)
{
	fprintf(fp,
		"usage: %s score (--run RUNDIR [--phase T] | --path CKPT...) -o SCORES\n"
		"                 [options] IN.tok\n"
		"Log-likelihood of every token of IN.tok under every path, and each document's\n"
		"sum from position PREFIX on (what a discriminative router learns from), into\n"
		"SCORES (dpc-route(5)). Documents longer than the model's context are run in\n"
		"consecutive windows of the context.\n\n"
		"options:\n"
		PATHSET_HELP
		"  -p, --prefix N        tokens each document starts with that are not counted\n"
		"                        in its sum (default %d)\n"
		"  -B, --batch N         context windows per forward (default %d)\n"
		COMMON_HELP,
		prog, DEFAULT_PREFIX, DEFAULT_BATCH);
}

static int cmd_score(int argc, char **argv)
{
	static const struct option longopts[] = {
		PATHSET_LONGOPTS, { "prefix", required_argument, NULL, 'p' },
		{ "batch", required_argument, NULL, 'B' }, COMMON_LONGOPTS, { NULL, 0, NULL, 0 },
	};
	struct common co = {0};
	struct pathset ps = {.phase = -1};
	long prefix = DEFAULT_PREFIX, batch = DEFAULT_BATCH;
	int c, rc;

	while ((c = getopt_long(argc, argv, COMMON_SHORTOPTS "p:B:", longopts, NULL)) != -1) {
		if ((rc = common_opt(&co, c, optarg)) < 0 || (!rc && (rc = pathset_opt(&ps, c, optarg)) < 0))
			return -rc;
		if (rc)
			continue;
		switch (c) {
		case 'p': rc = cli_parse_long("--prefix", optarg, 1, INT_MAX, &prefix); break;
		case 'B': rc = cli_parse_long("--batch", optarg, 1, 4096, &batch); break;
		case 'h': score_usage(stdout); return 0;
		case 'V': return version();
		default: return bad_option("score", longopts, argv, c);
		}
		if (rc < 0)
			return cli_report(prog, rc);
	}
	if ((rc = expect_args(argc, 1, "score", "one token file")) ||
	    (rc = check_output(&co, "score")))
		return rc;

	struct tokfile tf;
	struct scores s;
	if ((rc = tokfile_open(&tf, argv[optind])) < 0)
		return cli_report(prog, rc);
	if ((rc = open_backend(&co)))
		goto close_tf;
	if ((rc = open_paths(&ps, &co, (int)batch, "score")))
		goto close;
	start_progress(&co, "score", (int64_t)tf.ndocs * ps.n);
	const double t0 = now_seconds();
	rc = route_score(ps.lm, ps.n, &tf, (int)prefix, &s, show_progress, &co);
	const double secs = now_seconds() - t0;
	progress_done(&co.bar);
	if (rc < 0) {
		rc = cli_report(prog, rc);
		goto close;
	}
	s.digests = pathset_digests(&ps);
	s.source = pathset_source(&ps);
	rc = !s.digests || !s.source ? CORE_ENOMEM : scores_write(co.out, &s);
	if (!rc) {
		/* each document's best path, counted */
		json_t *best = json_array();
		int *n = calloc((size_t)ps.n, sizeof *n);
		for (uint64_t d = 0; n && d < tf.ndocs; d++) {
			int b = 0;
			for (int p = 1; p < ps.n; p++)
				if (s.doc[d * (uint64_t)ps.n + (uint64_t)p] >
				    s.doc[d * (uint64_t)ps.n + (uint64_t)b])
					b = p;
			n[b]++;
		}
		for (int p = 0; n && p < ps.n; p++)
			json_array_append_new(best, json_integer(n[p]));
		free(n);
		rc = print_json(json_pack("{s:s,s:s,s:s,s:i,s:I,s:I,s:o,s:f,s:f}", "output", co.out,
					  "corpus", tf.path, "source", s.source, "paths", ps.n,
					  "docs", (json_int_t)tf.ndocs, "tokens",
					  (json_int_t)tf.ntokens, "best_path_counts", best,
					  "seconds", secs, "tokens_per_s",
					  secs > 0 ? (double)tf.ntokens * ps.n / secs : 0.0));
	} else {
		rc = cli_report(prog, rc);
	}
	scores_free(&s);
close:
	pathset_close(&ps);
	backend_close(co.be);
close_tf:
	tokfile_close(&tf);
	return rc;
}

/* ---- fit ---------------------------------------------------------------------------------- */

static void fit_usage(FILE *fp)
{
	fprintf(fp,
		"usage: %s fit --scores SCORES --features FEATURES -o ROUTER [options]\n"
		"                IN.tok\n"
		"       %s fit --scores SCORES --window W -m BASE -o ROUTER [options] IN.tok\n"
		"Fit a router on the paths' scores of IN.tok (the router split; dpc-route\n"
		"score). The first form is the discriminative document router (DiPaCo 2.4.2):\n"
		"each document is labelled with its best path, a multinomial logistic regression\n"
		"(L2, L-BFGS) learns the labels from the prefix features, then an extra bias\n"
		"makes the predicted path counts match the labels' (each path at least\n"
		"--min-share of an even share, so that none is starved). The second form is a window router for\n"
		"re-routing every W tokens at evaluation (DiPaCo 2.4.3): at each boundary b =\n"
		"PREFIX + m W it predicts the best path for the next W tokens from the base\n"
		"model's features of the text before b. Train and held-out accuracy and the\n"
		"per-path counts before and after the bias are printed and kept in the router.\n\n"
		"options:\n"
		"      --scores FILE     the paths' scores of IN.tok (required)\n"
		"      --features FILE   prefix features of IN.tok (document router)\n"
		"      --window W        fit a window router for re-routing every W tokens\n"
		"  -m, --model FILE      the base checkpoint (window router)\n"
		"      --layer L         the block whose output makes window features (default:\n"
		"                        the last)\n"
		"      --context N       tokens before a boundary averaged for its features\n"
		"                        (default: the scores' prefix)\n"
		"      --l2 X            L2 penalty on the weights (default 0.1)\n"
		"      --holdout F       fraction of rows held out to report accuracy on\n"
		"                        (default 0.2; the router kept is refitted on all)\n"
		"      --iters N         L-BFGS iterations at most (default 500)\n"
		"      --min-share F     the bias correction gives every path at least F times\n"
		"                        an even share of the rows (default 0.5 for a document\n"
		"                        router, 0 for a window router)\n"
		"      --correction      keep the bias correction in the router written (the\n"
		"                        default for a document router, which makes shards)\n"
		"      --no-correction   write the plain argmax router (the default for a window\n"
		"                        router, which only evaluates: the most accurate one);\n"
		"                        the report shows the correction's effect either way\n"
		"      --seed N          seed of the held-out draw (default 0)\n"
		COMMON_HELP,
		prog, prog);
}

static int cmd_fit(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "scores", required_argument, NULL, 'S' }, { "features", required_argument, NULL, 'F' },
		{ "window", required_argument, NULL, 'W' }, { "model", required_argument, NULL, 'm' },
		{ "layer", required_argument, NULL, 'L' }, { "context", required_argument, NULL, 'c' },
		{ "l2", required_argument, NULL, 'l' }, { "holdout", required_argument, NULL, 'H' },
		{ "iters", required_argument, NULL, 'i' }, { "seed", required_argument, NULL, 's' },
		{ "min-share", required_argument, NULL, 'M' }, { "correction", no_argument, NULL, 'C' },
		{ "no-correction", no_argument, NULL, 'N' }, COMMON_LONGOPTS, { NULL, 0, NULL, 0 },
	};
	struct common co = {0};
	const char *scores_path = NULL, *feat_path = NULL, *model = NULL;
	long window = 0, layer = -1, context = 0, iters = 500, seed = 0;
	struct route_fit_opts fo = {.l2 = 0.1, .holdout = 0.2, .min_share = -1, .correct = -1};
	int c, rc;

	while ((c = getopt_long(argc, argv, COMMON_SHORTOPTS "m:", longopts, NULL)) != -1) {
		if ((rc = common_opt(&co, c, optarg)) < 0)
			return -rc;
		if (rc)
			continue;
		switch (c) {
		case 'S': scores_path = optarg; break;
		case 'F': feat_path = optarg; break;
		case 'm': model = optarg; break;
		case 'W': rc = cli_parse_long("--window", optarg, 1, INT_MAX, &window); break;
		case 'L': rc = cli_parse_long("--layer", optarg, 0, INT_MAX, &layer); break;
		case 'c': rc = cli_parse_long("--context", optarg, 1, INT_MAX, &context); break;
		case 'l': rc = cli_parse_double("--l2", optarg, 0, 1e6, &fo.l2); break;
		case 'H': rc = cli_parse_double("--holdout", optarg, 0, 0.9, &fo.holdout); break;
		case 'M': rc = cli_parse_double("--min-share", optarg, 0, 1, &fo.min_share); break;
		case 'C': fo.correct = 1; break;
		case 'N': fo.correct = 0; break;
		case 'i': rc = cli_parse_long("--iters", optarg, 1, 1000000, &iters); break;
		case 's': rc = cli_parse_long("--seed", optarg, 0, LONG_MAX, &seed); break;
		case 'h': fit_usage(stdout); return 0;
		case 'V': return version();
		default: return bad_option("fit", longopts, argv, c);
		}
		if (rc < 0)
			return cli_report(prog, rc);
	}
	if ((rc = expect_args(argc, 1, "fit", "one token file")) ||
	    (rc = check_output(&co, "fit")))
		return rc;
	if (!scores_path)
		return cli_usage_error(prog, "fit: --scores FILE is required");
	if (window ? !model || feat_path : !feat_path || model)
		return cli_usage_error(prog, "fit: a document router takes --features, a window "
				       "router --window W and --model BASE (see %s fit --help)",
				       prog);
	fo.max_iter = (int)iters;
	if (co.threads)
		omp_set_num_threads((int)co.threads);
	if (fo.min_share < 0)
		fo.min_share = window ? 0.0 : 0.5;
	if (fo.correct < 0)
		fo.correct = !window;
	fo.seed = (uint64_t)seed;

	struct tokfile tf;
	struct scores s;
	struct features f = {0};
	struct lm base = {0};
	struct router r = {0};
	float *x = NULL;
	uint32_t *y = NULL;
	uint64_t n = 0;
	int have_base = 0;

	if ((rc = tokfile_open(&tf, argv[optind])) < 0)
		return cli_report(prog, rc);
	if ((rc = scores_read(scores_path, &s)) < 0) {
		tokfile_close(&tf);
		return cli_report(prog, rc);
	}
	rc = scores_check_corpus(&s, scores_path, &tf);
	if (!rc && !window) {
		rc = features_read(feat_path, &f);
		if (!rc)
			rc = features_check_corpus(&f, feat_path, &tf);
		if (!rc && f.r.prefix != s.prefix)
			rc = err_set(CORE_EFORMAT, feat_path, "features of %d-token prefixes, but "
				     "the scores count from token %d", f.r.prefix, s.prefix);
		if (!rc)
			rc = route_doc_rows(&s, &f, &tf, &x, &y, &n);
		r.kind = ROUTER_LOGREG;
		r.dim = f.dim;
		r.r = f.r;
	} else if (!rc) {
		if ((rc = open_backend(&co))) {
			co.be = NULL;
			goto out; /* reported */
		}
		if ((rc = lm_open(&base, model, co.be, DEFAULT_BATCH)) == 0)
			have_base = 1;
		if (!rc) {
			if (layer < 0)
				layer = base.g.cfg.n_layer - 1;
			if (!context)
				context = s.prefix ? s.prefix : DEFAULT_PREFIX;
			start_progress(&co, "window features", (int64_t)tf.ndocs);
			rc = route_window_rows(&s, &base, &tf, (int)layer, (int)context,
					       (int)window, &x, &y, &n, show_progress, &co);
			progress_done(&co.bar);
		}
		r.kind = ROUTER_WINDOW;
		r.dim = 2 * base.g.cfg.n_embd;
		memcpy(r.r.digest, base.digest, sizeof r.r.digest);
		r.r.layer = (int)layer;
		r.r.prefix = s.prefix;
		r.window = (int)window;
		r.context = (int)context;
	}
	if (!rc && n < 2)
		rc = err_set(CORE_ESHAPE, tf.path, "%llu %s to fit on: too few (a longer router "
			     "split, or a shorter prefix or window)", (unsigned long long)n,
			     window ? "windows" : "documents");
	r.paths = s.paths;
	const double t0 = now_seconds();
	if (!rc)
		rc = route_fit_logreg(x, y, n, r.dim, r.paths, &fo, &r.lr, &r.report);
	const double secs = now_seconds() - t0;
	if (!rc)
		rc = router_write(co.out, &r);
	if (!rc) {
		json_error_t je;
		rc = print_json(json_pack("{s:s,s:s,s:i,s:I,s:o,s:f}", "output", co.out, "kind",
					  router_kind_name(r.kind), "paths", r.paths, "rows",
					  (json_int_t)n, "report", json_loads(r.report, 0, &je),
					  "seconds", secs));
	} else if (rc < 0) {
		rc = cli_report(prog, rc);
	}
out:
	free(x);
	free(y);
	router_free(&r);
	features_free(&f);
	if (have_base)
		lm_close(&base);
	if (co.be)
		backend_close(co.be);
	scores_free(&s);
	tokfile_close(&tf);
	return rc;
}

/* ---- eval --------------------------------------------------------------------------------- */

static void eval_usage(FILE *fp)
{
	fprintf(fp,
		"usage: %s eval (--run RUNDIR [--phase T] | --path CKPT...) -m BASE\n"
		"                --router ROUTER [--window-router WROUTER...] [options] IN.tok\n"
		"Perplexity of the paths on IN.tok over every token from position PREFIX on\n"
		"(the router's prefix, or --score-from's), routing once per document with ROUTER,\n"
		"then for each\n"
		"window router re-routing every W tokens: window m >= 1 goes to the path the\n"
		"window router predicts from the text before it. A switch recomputes the\n"
		"context on the new path: that path runs the current context window from its\n"
		"start. Prints a table; --json FILE writes it as JSON too.\n\n"
		"options:\n"
		PATHSET_HELP
		"  -m, --model FILE      the base checkpoint the routers' features come from\n"
		"      --router FILE     the document router (kmeans or logreg; required unless\n"
		"                        there is one path)\n"
		"      --window-router FILE  a window router (repeatable, up to %d)\n"
		"      --score-from N    score tokens from position N of each document on (not\n"
		"                        before the router's prefix; default: the prefix, %d for\n"
		"                        one path without a router): the same N scores every\n"
		"                        model on the same tokens\n"
		"      --early-stop      with --run: each path at the phase (1..T) of its lowest\n"
		"                        loss on its shard's held-out tail (the paper's early\n"
		"                        stopping; the run needs dipaco.holdout or\n"
		"                        dipaco.early_stop_every > 0)\n"
		"      --json FILE       also write the table as JSON to FILE\n"
		"  -B, --batch N         context windows per forward (default %d)\n"
		"  -t, --threads N       OpenMP threads (default: OMP_NUM_THREADS or all cores)\n"
		"      --device NAME     where models run: cpu (default) or ref\n"
		"  -q, --quiet           no progress line on stderr\n"
		"  -h, --help            show this help and exit\n"
		"  -V, --version         show the version and exit\n",
		prog, MAX_WINDOWS, DEFAULT_PREFIX, DEFAULT_BATCH);
}

static json_t *mode_json(const struct route_eval_mode *m, const struct route_eval_mode *doc,
			 uint64_t docs)
{
	const double loss = m->tokens ? m->nll / (double)m->tokens : NAN;
	return json_pack("{s:s,s:i,s:f,s:f,s:I,s:I,s:I,s:I,s:f,s:f,s:f}", "routing",
			 m->window ? "window" : "document", "window", m->window, "loss", loss,
			 "perplexity", exp(loss), "tokens", (json_int_t)m->tokens, "forwarded",
			 (json_int_t)m->forwarded, "base_tokens", (json_int_t)m->base_tokens,
			 "switches", (json_int_t)m->switches, "switches_per_doc",
			 docs ? (double)m->switches / (double)docs : 0.0, "seconds", m->seconds,
			 "cost_vs_document",
			 doc->seconds > 0 ? m->seconds / doc->seconds : 0.0);
}

static int cmd_eval(int argc, char **argv)
{
	static const struct option longopts[] = {
		PATHSET_LONGOPTS, { "model", required_argument, NULL, 'm' },
		{ "router", required_argument, NULL, 'r' },
		{ "window-router", required_argument, NULL, 'w' },
		{ "json", required_argument, NULL, 'J' }, { "batch", required_argument, NULL, 'B' },
		{ "score-from", required_argument, NULL, 'S' },
		{ "early-stop", no_argument, NULL, 'E' }, COMMON_LONGOPTS, { NULL, 0, NULL, 0 },
	};
	struct common co = {0};
	struct pathset ps = {.phase = -1};
	const char *model = NULL, *router_path = NULL, *json_path = NULL, *wpaths[MAX_WINDOWS];
	long batch = DEFAULT_BATCH, score_from = 0;
	int nw = 0, c, rc;

	while ((c = getopt_long(argc, argv, COMMON_SHORTOPTS "m:B:", longopts, NULL)) != -1) {
		if ((rc = common_opt(&co, c, optarg)) < 0 || (!rc && (rc = pathset_opt(&ps, c, optarg)) < 0))
			return -rc;
		if (rc)
			continue;
		switch (c) {
		case 'm': model = optarg; break;
		case 'r': router_path = optarg; break;
		case 'w':
			if (nw == MAX_WINDOWS)
				return cli_usage_error(prog, "eval: at most %d window routers",
						       MAX_WINDOWS);
			wpaths[nw++] = optarg;
			break;
		case 'J': json_path = optarg; break;
		case 'B': rc = cli_parse_long("--batch", optarg, 1, 4096, &batch); break;
		case 'S': rc = cli_parse_long("--score-from", optarg, 1, INT_MAX, &score_from); break;
		case 'E': ps.early = 1; break;
		case 'h': eval_usage(stdout); return 0;
		case 'V': return version();
		default: return bad_option("eval", longopts, argv, c);
		}
		if (rc < 0)
			return cli_report(prog, rc);
	}
	if ((rc = expect_args(argc, 1, "eval", "one token file")))
		return rc;
	if (co.out)
		return cli_usage_error(prog, "eval: the table goes to stdout (and --json FILE); "
				       "there is no --output");
	if (!model)
		return cli_usage_error(prog, "eval: --model BASE.safetensors is required");

	struct tokfile tf;
	struct lm base = {0};
	struct router doc = {0}, win[MAX_WINDOWS];
	const struct router *wp[MAX_WINDOWS];
	struct route_eval_mode modes[MAX_WINDOWS + 1];
	int nread = 0, have_doc = 0, have_base = 0;

	memset(win, 0, sizeof win);
	if ((rc = tokfile_open(&tf, argv[optind])) < 0)
		return cli_report(prog, rc);
	if (router_path && (rc = router_read(router_path, &doc)) == 0)
		have_doc = 1;
	for (int i = 0; !rc && i < nw; i++) {
		if ((rc = router_read(wpaths[i], &win[i])) == 0)
			nread = i + 1;
		if (!rc && win[i].kind != ROUTER_WINDOW)
			rc = err_set(CORE_EFORMAT, wpaths[i], "is a %s router, not a window router",
				     router_kind_name(win[i].kind));
		wp[i] = &win[i];
	}
	if (!rc && have_doc && doc.kind == ROUTER_WINDOW)
		rc = err_set(CORE_EFORMAT, router_path, "is a window router; --router takes a "
			     "document router (kmeans or logreg)");
	if (rc < 0) {
		rc = cli_report(prog, rc);
		goto out;
	}
	if ((rc = open_backend(&co)))
		goto out;
	if ((rc = open_paths(&ps, &co, (int)batch, "eval")))
		goto out;
	if ((rc = lm_open(&base, model, co.be, (int)batch)) == 0)
		have_base = 1;
	if (!rc)
		rc = route_check_routers(&doc, &have_doc, router_path, win, wpaths, nw, &base,
					 model, ps.n, DEFAULT_PREFIX, "eval");
	/* one path without a router: nothing is read before the first token scored */
	if (!rc && !router_path && !nw && score_from && score_from < doc.r.prefix)
		doc.r.prefix = (int)score_from;
	if (rc < 0) {
		rc = cli_report(prog, rc);
		goto out;
	}
	if (rc)
		goto out;
	if (score_from && score_from < doc.r.prefix) {
		rc = cli_usage_error(prog, "eval: --score-from %ld is before the router's prefix "
				     "%d: the tokens the router reads are not scored", score_from,
				     doc.r.prefix);
		goto out;
	}
	start_progress(&co, "eval", (int64_t)tf.ndocs * (nw + 1));
	rc = route_evaluate(ps.lm, ps.n, &base, &doc, wp, nw, &tf, (int)score_from, modes,
			    show_progress, &co);
	progress_done(&co.bar);
	if (rc < 0) {
		rc = cli_report(prog, rc);
		goto out;
	}
	json_t *rows = json_array();
	printf("%-22s %10s %10s %10s %10s %10s %8s\n", "routing", "ppl", "loss", "tokens",
	       "switches/doc", "forwarded", "cost");
	for (int i = 0; i <= nw; i++) {
		const struct route_eval_mode *m = &modes[i];
		char name[32];
		const double loss = m->tokens ? m->nll / (double)m->tokens : NAN;
		if (m->window)
			snprintf(name, sizeof name, "every %d tokens", m->window);
		else
			snprintf(name, sizeof name, "once per document");
		printf("%-22s %10.4f %10.5f %10llu %12.2f %10.3f %7.2fx\n", name, exp(loss), loss,
		       (unsigned long long)m->tokens,
		       tf.ndocs ? (double)m->switches / (double)tf.ndocs : 0.0,
		       m->tokens ? (double)m->forwarded / (double)m->tokens : 0.0,
		       modes[0].seconds > 0 ? m->seconds / modes[0].seconds : 0.0);
		json_array_append_new(rows, mode_json(m, &modes[0], tf.ndocs));
	}
	printf("(forwarded: tokens run through the paths per token scored; cost: wall time\n"
	       " against routing once per document, base-model features included)\n");
	fflush(stdout);
	char *src = pathset_source(&ps);
	json_t *j = json_pack("{s:s,s:s,s:I,s:i,s:i,s:i,s:I,s:s,s:o}", "corpus", tf.path,
			      "source", src ? src : "", "docs", (json_int_t)tf.ndocs, "paths", ps.n,
			      "prefix", doc.r.prefix, "score_from",
			      score_from ? (int)score_from : doc.r.prefix, "tokens",
			      (json_int_t)modes[0].tokens, "router", router_path ? router_path : "",
			      "modes", rows);
	free(src);
	if (json_path) {
		char *text = j ? json_dumps(j, JSON_INDENT(2) | CORE_JSON_REAL) : NULL;
		rc = text ? file_write_atomic(json_path, text, strlen(text)) : CORE_ENOMEM;
		free(text);
		if (rc < 0)
			rc = cli_report(prog, rc);
	}
	json_decref(j);
out:
	if (have_base)
		lm_close(&base);
	pathset_close(&ps);
	if (co.be)
		backend_close(co.be);
	if (have_doc)
		router_free(&doc);
	for (int i = 0; i < nread; i++)
		router_free(&win[i]);
	tokfile_close(&tf);
	return rc;
}

/* ---- sample ------------------------------------------------------------------------------ */

static void sample_usage(FILE *fp)
{
	fprintf(fp,
		"usage: %s sample -m MODEL.safetensors [options] [PROMPT]\n"
		"       %s sample (--run RUNDIR [--phase T] | --path CKPT...) -m BASE\n"
		"                --router ROUTER [--window-router WROUTER] [options] [PROMPT]\n"
		"Generate text from a checkpoint of the byte tokenizer's vocabulary (256): the\n"
		"continuation of PROMPT ('-': read from standard input; none: a newline) goes to\n"
		"standard output as it is drawn. From a DiPaCo, each token comes from the path the\n"
		"routers choose, as eval routes: ROUTER on the prompt (its first PREFIX tokens),\n"
		"again when the text reaches PREFIX tokens, and with WROUTER at every window\n"
		"boundary PREFIX + m W; a switch feeds the context to the new path.\n\n"
		"options:\n"
		"  -m, --model FILE      the checkpoint (required); with --run or --path, the base\n"
		"                        checkpoint the routers' features come from\n"
		PATHSET_HELP
		"      --router FILE     the document router (required unless there is one path)\n"
		"      --window-router FILE  a window router: re-route every W tokens\n"
		"  -n, --tokens N        tokens to generate (default 256)\n"
		"      --temperature X   softmax temperature; 0 is greedy (default 1.0)\n"
		"      --top-k K         draw among the K most likely tokens only (default 0: all)\n"
		"      --top-p P         then among the fewest whose probability reaches P\n"
		"                        (nucleus sampling; default 1.0: all)\n"
		"  -s, --seed N          the draws' seed: the same seed gives the same text (default 1)\n"
		"      --no-cache        a full forward over the context for every token instead of\n"
		"                        the key/value cache (the same text, slower: for comparison)\n"
		"  -t, --threads N       OpenMP threads (default 1 with the cache, whose ops are one\n"
		"                        row each; else OMP_NUM_THREADS or all cores)\n"
		"      --device NAME     where the model runs: cpu (default), ref or cuda\n"
		"  -q, --quiet           no summary line on stderr\n"
		"  -h, --help            show this help and exit\n"
		"  -V, --version         show the version and exit\n"
		"\nPast the model's context the oldest half of it is dropped and the rest fed again.\n",
		prog, prog);
}

/* The prompt: argv text, or standard input for "-". */
static int read_prompt(const char *arg, char **out, size_t *len)
{
	if (strcmp(arg, "-") != 0) {
		*len = strlen(arg);
		*out = strdup(arg);
		return *out ? 0 : err_set(CORE_ENOMEM, NULL, "out of memory");
	}
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap);
	while (buf) {
		size_t got = fread(buf + n, 1, cap - n, stdin);
		n += got;
		if (got == 0)
			break;
		if (n == cap) {
			char *b = realloc(buf, cap *= 2);
			if (!b)
				free(buf);
			buf = b;
		}
	}
	if (!buf)
		return err_set(CORE_ENOMEM, NULL, "out of memory for the prompt");
	if (ferror(stdin)) {
		free(buf);
		return err_set(CORE_EIO, "<stdin>", "cannot read the prompt");
	}
	*out = buf;
	*len = n;
	return 0;
}

/* Routing while sampling from a DiPaCo: the routers, the base model they read, and the
 * log of the paths chosen. */
struct sample_route {
	struct lm base;
	struct router doc, win;
	int have_base, have_doc, have_win;
	char log[512];  /* "2@0 0@128 ...": path @ position, as chosen */
	size_t loglen;
};

static int emit_byte(void *ctx, int32_t tok)
{
	(void)ctx;
	unsigned char ch = (unsigned char)tok;
	if (fwrite(&ch, 1, 1, stdout) != 1 || fflush(stdout) != 0)
		return err_errno(CORE_EIO, "<stdout>", "cannot write the text", errno);
	return 0;
}

static void log_path(void *ctx, int path, uint64_t at)
{
	struct sample_route *sr = ctx;
	if (sr->loglen < sizeof sr->log - 32)
		sr->loglen += (size_t)snprintf(sr->log + sr->loglen, sizeof sr->log - sr->loglen,
					       "%s%d@%llu", sr->loglen ? " " : "", path,
					       (unsigned long long)at);
}

static int cmd_sample(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "model", required_argument, NULL, 'm' }, { "tokens", required_argument, NULL, 'n' },
		{ "temperature", required_argument, NULL, 'X' },
		{ "top-k", required_argument, NULL, 'K' }, { "top-p", required_argument, NULL, 'Y' },
		{ "seed", required_argument, NULL, 's' }, { "no-cache", no_argument, NULL, 'N' },
		PATHSET_LONGOPTS, { "router", required_argument, NULL, 'r' },
		{ "window-router", required_argument, NULL, 'w' },
		COMMON_LONGOPTS, { NULL, 0, NULL, 0 },
	};
	struct common co = {0};
	struct pathset ps = {.phase = -1};
	struct sample_route sr = {0};
	const char *model = NULL, *router_path = NULL, *win_path = NULL;
	long ntok = 256, topk = 0, seed = 1;
	double temp = 1.0, topp = 1.0;
	int nocache = 0, c, rc;

	while ((c = getopt_long(argc, argv, COMMON_SHORTOPTS "m:n:s:", longopts, NULL)) != -1) {
		if ((rc = common_opt(&co, c, optarg)) < 0)
			return -rc;
		if (rc)
			continue;
		if ((rc = pathset_opt(&ps, c, optarg)) < 0)
			return -rc;
		if (rc)
			continue;
		rc = 0;
		switch (c) {
		case 'm': model = optarg; break;
		case 'n': rc = cli_parse_long("--tokens", optarg, 0, 1L << 30, &ntok); break;
		case 'X': rc = cli_parse_double("--temperature", optarg, 0.0, 1e6, &temp); break;
		case 'K': rc = cli_parse_long("--top-k", optarg, 0, INT_MAX, &topk); break;
		case 'Y': rc = cli_parse_double("--top-p", optarg, 1e-9, 1.0, &topp); break;
		case 's': rc = cli_parse_long("--seed", optarg, 0, LONG_MAX, &seed); break;
		case 'N': nocache = 1; break;
		case 'r': router_path = optarg; break;
		case 'w': win_path = optarg; break;
		case 'h': sample_usage(stdout); return 0;
		case 'V': return version();
		default: return bad_option("sample", longopts, argv, c);
		}
		if (rc < 0)
			return cli_report(prog, rc);
	}
	const int dipaco = ps.run || ps.nfiles;
	if (argc - optind > 1)
		return cli_usage_error(prog, "sample: expected at most one prompt, got %d arguments "
				       "(quote the prompt; see %s sample --help)", argc - optind, prog);
	if (co.out || co.force)
		return cli_usage_error(prog, "sample: the text goes to standard output; there is no "
				       "--output");
	if (!model)
		return cli_usage_error(prog, dipaco ? "sample: --model BASE.safetensors is required: "
				       "the base model the routers read" : "sample: --model FILE "
				       "is required (see %s sample --help)", prog);
	if (!dipaco && (router_path || win_path || ps.phase >= 0))
		return cli_usage_error(prog, "sample: %s routes the paths of a DiPaCo: it needs "
				       "--run RUNDIR or --path CKPT", router_path ? "--router" :
				       win_path ? "--window-router" : "--phase");
	char *prompt = NULL;
	size_t plen = 0;
	if ((rc = read_prompt(optind < argc ? argv[optind] : "\n", &prompt, &plen)) < 0)
		return cli_report(prog, rc);
	if (plen == 0) { /* an empty prompt starts from a newline, as no prompt does */
		free(prompt);
		prompt = strdup("\n");
		plen = 1;
		if (!prompt)
			return cli_report(prog, err_set(CORE_ENOMEM, NULL, "out of memory"));
	}
	/* one row per op: on the cached path threads only add synchronisation (measured:
	 * 2950 tokens/s on one thread, 73 on two, gpt-tiny on 2 cores) */
	if (!co.threads && !nocache)
		co.threads = 1;
	if ((rc = open_backend(&co)) != 0) {
		free(prompt);
		return rc;
	}
	struct lm m;
	struct lm *models = &m; /* the models drawn from: one checkpoint, or the paths */
	int nmodels = 1, opened = 0;
	if (dipaco) {
		if ((rc = open_paths(&ps, &co, 1, "sample")) != 0)
			goto out;
		models = ps.lm;
		nmodels = ps.n;
		if (router_path && (rc = router_read(router_path, &sr.doc)) == 0)
			sr.have_doc = 1;
		if (!rc && win_path && (rc = router_read(win_path, &sr.win)) == 0) {
			sr.have_win = 1;
			if (sr.win.kind != ROUTER_WINDOW)
				rc = err_set(CORE_EFORMAT, win_path, "is a %s router, not a window "
					     "router", router_kind_name(sr.win.kind));
		}
		if (!rc && sr.have_doc && sr.doc.kind == ROUTER_WINDOW)
			rc = err_set(CORE_EFORMAT, router_path, "is a window router; --router takes "
				     "a document router (kmeans or logreg)");
		if (!rc && (rc = lm_open(&sr.base, model, co.be, 1)) == 0)
			sr.have_base = 1;
		if (!rc) {
			const char *wp[1] = {win_path};
			rc = route_check_routers(&sr.doc, &sr.have_doc, router_path, &sr.win,
						 wp, sr.have_win, &sr.base, model, ps.n,
						 DEFAULT_PREFIX, "sample");
		}
		if (!rc && sr.base.g.cfg.vocab_size != models[0].g.cfg.vocab_size)
			rc = err_set(CORE_ESHAPE, model, "has a vocabulary of %d, the paths %d",
				     sr.base.g.cfg.vocab_size, models[0].g.cfg.vocab_size);
	} else {
		rc = lm_open(&m, model, co.be, 1);
		opened = rc == 0;
	}
	if (rc == 0 && models[0].g.cfg.vocab_size != 256)
		rc = err_set(CORE_EUSAGE, models[0].path, "vocabulary of %d: text in and out needs "
			     "the byte tokenizer's 256", models[0].g.cfg.vocab_size);
	int32_t *ptok = rc == 0 ? malloc(sizeof *ptok * plen) : NULL;
	if (rc == 0 && !ptok)
		rc = err_set(CORE_ENOMEM, NULL, "out of memory");
	for (size_t i = 0; ptok && i < plen; i++)
		ptok[i] = (unsigned char)prompt[i];
	const struct gen_route rt = {.base = &sr.base, .doc = &sr.doc,
				     .win = sr.have_win ? &sr.win : NULL};
	const struct gen_opts go = {
		.so = {.temperature = temp, .top_k = (int)topk, .top_p = topp},
		.seed = (uint64_t)seed, .tokens = ntok, .nocache = nocache};
	const struct gen_sink sink = {.emit = emit_byte, .path = log_path, .ctx = &sr};
	struct gen_stats st = {0};
	if (rc == 0)
		rc = route_generate(models, nmodels, dipaco ? &rt : NULL, ptok, plen, &go, &sink,
				    &st);
	free(ptok);
	if (rc == 0 && !co.quiet) {
		const double gen = st.t_total - st.t_prompt;
		fprintf(stderr, "\n%s sample: %ld tokens in %.2f s: %.1f tokens/s after a %zu-token "
			"prompt (%.3f s), %s; seed %ld\n", prog, ntok, st.t_total,
			ntok > 0 && gen > 0 ? (double)ntok / gen : 0.0, plen, st.t_prompt,
			nocache ? "no cache" : "key/value cache", seed);
		if (dipaco)
			fprintf(stderr, "%s sample: %d paths, routed %s; path@position: %s%s (%ld "
				"switches)\n", prog, nmodels, sr.have_win ? "every window" :
				"once per document", sr.log, sr.loglen >= sizeof sr.log - 32 ?
				" ..." : "", st.switches);
	}
out:
	if (opened)
		lm_close(&m);
	pathset_close(&ps);
	if (sr.have_base)
		lm_close(&sr.base);
	if (sr.have_doc)
		router_free(&sr.doc);
	if (sr.have_win)
		router_free(&sr.win);
	free(prompt);
	backend_close(co.be);
	return rc < 0 ? cli_report(prog, rc) : rc;
}

int main(int argc, char **argv)
{
	return cli_dispatch(prog, CORE_VERSION, commands, NCOMMANDS,
			    "'dpc-route COMMAND --help' describes one command. See dpc-route(1) and the\n"
			    "formats in dpc-route(5).\n", argc, argv);
}
