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
#include "io/tokenizer.h"
#include "route/kmeans.h"
#include "route/generate.h"
#include "route/lm.h"
#include "route/logreg.h"
#include "route/pathset.h"
#include "route/route.h"
#include "route/routefile.h"
#include "route/wrouter.h"
#include "model/sample.h"

#include "common/banned.h"

static const char prog[] = "dpc-route";

#define DEFAULT_PREFIX 32
#define DEFAULT_BATCH 16
/* fit --transformer's defaults */
#define FIT_TR_STEPS 300
#define FIT_TR_LR 1e-3
#define FIT_TR_BATCH 8
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

#define STR_(x) #x
#define STR(x) STR_(x) /* a macro's value in a help string */

static const struct cli_opt common_opts[] = {
	{"output", 'o', 'o', CLI_ARG, "FILE", "the file to write (required); an existing one is\n"
	 "replaced only with --force"},
	{"force", 'f', 'f', CLI_FLAG, NULL, "replace an existing output file"},
	{"threads", 't', 't', CLI_ARG, "N",
	 "OpenMP threads (default: OMP_NUM_THREADS or all cores)"},
	{"device", 'D', 0, CLI_ARG, "NAME", "where models run: cpu (default) or ref"},
	{"quiet", 'q', 'q', CLI_FLAG, NULL, "no progress line on stderr"},
	{"help", 'h', 'h', CLI_FLAG, NULL, "show this help and exit"},
	{"version", 'V', 'V', CLI_FLAG, NULL, "show the version and exit"},
	CLI_OPT_END,
};

/* A command's options parsed (exit status, or PARSED: run it). */
enum { PARSED = -1 };

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

static const struct cli_opt features_opts[] = {
	{"model", 'm', 'm', CLI_ARG, "FILE", "the base checkpoint (required)"},
	{"prefix", 'p', 'p', CLI_ARG, "N", "tokens of each document to average over (default "
	 STR(DEFAULT_PREFIX) ";\nat most the model's context)"},
	{"layer", 'L', 0, CLI_ARG, "L", "the block whose output is averaged, from 0 (default:\n"
	 "the last, before the final LayerNorm)"},
	{"batch", 'B', 'B', CLI_ARG, "N", "documents per forward (default 64)"},
	CLI_OPT_END,
};
static const struct cli_opt *const features_tables[] = {features_opts, common_opts, NULL};

static void features_usage(FILE *fp)
{
	fprintf(fp,
		"usage: %s features -m BASE.safetensors -o OUT [options] IN.tok\n"
		"For every document of IN.tok, the mean output of one block of the base\n"
		"checkpoint over the document's first tokens (forward only), written to OUT\n"
		"with the recipe that made it (dpc-route(5)).\n\n"
		"options:\n",
		prog);
	cli_print_opts(fp, features_tables);
}

static int cmd_features(int argc, char **argv)
{
	struct cli_parser parser;
	struct common co = {0};
	const char *model = NULL;
	long prefix = DEFAULT_PREFIX, layer = -1, batch = 64;
	int c, rc;

	if ((rc = cli_parser_init(&parser, prog, "features", features_tables)) < 0)
		return cli_report(prog, rc);
	while ((c = cli_next(&parser, argc, argv)) != -1) {
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
		default: return 2; /* CLI_BAD: reported */
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

static const struct cli_opt kmeans_opts[] = {
	{"paths", 'k', 'k', CLI_ARG, "K", "number of clusters, one per path (required)"},
	{"restarts", 'r', 0, CLI_ARG, "N", "independent restarts (default 4)"},
	{"iters", 'i', 0, CLI_ARG, "N", "Lloyd iterations at most, per restart (default 100)"},
	{"seed", 's', 0, CLI_ARG, "N", "seed of the initialisations (default 0)"},
	CLI_OPT_END,
};
static const struct cli_opt *const kmeans_tables[] = {kmeans_opts, common_opts, NULL};
/* the shared options in kmeans, which runs on the CPU and prints no progress */
static const struct cli_opt kmeans_says[] = {
	{.name = "output", .help = "the router to write (required); an existing one is\n"
	 "replaced only with --force"},
	{.name = "threads", .help = "OpenMP threads (results are the same for any number)"},
	{.name = "device", .help = "accepted for symmetry; k-means runs on the CPU"},
	{.name = "quiet", .help = "accepted; k-means prints no progress"},
	CLI_OPT_END,
};

static void kmeans_usage(FILE *fp)
{
	fprintf(fp,
		"usage: %s kmeans -k PATHS -o ROUTER [options] FEATURES\n"
		"Fit k-means with k = PATHS on the features (k-means++ initialisation, Lloyd\n"
		"iterations, several restarts, the lowest inertia kept) and write the router:\n"
		"the centroids and the feature recipe (dpc-route(5)).\n\n"
		"options:\n",
		prog);
	cli_print_opts_saying(fp, kmeans_tables, kmeans_says);
}

static int cmd_kmeans(int argc, char **argv)
{
	struct cli_parser parser;
	struct common co = {0};
	long k = 0, restarts = 4, iters = 100, seed = 0;
	int c, rc;

	if ((rc = cli_parser_init(&parser, prog, "kmeans", kmeans_tables)) < 0)
		return cli_report(prog, rc);
	while ((c = cli_next(&parser, argc, argv)) != -1) {
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
		default: return 2; /* CLI_BAD: reported */
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
	if ((rc = features_read(argv[optind], &f)) < 0)
		return cli_report(prog, rc);
	const struct kmeans_opts o = {.k = (int)k, .restarts = (int)restarts,
				      .max_iter = (int)iters, .tol = 0, .seed = (uint64_t)seed};
	const double t0 = now_seconds();
	rc = route_kmeans(&f, argv[optind], &o, &r);
	const double secs = now_seconds() - t0;
	if (!rc)
		rc = router_write(co.out, &r);
	if (!rc)
		rc = print_json(json_pack("{s:s,s:s,s:o,s:f}", "output", co.out, "kind", "kmeans",
					  "report", json_loads(r.report, 0, NULL), "seconds", secs));
	else
		rc = cli_report(prog, rc);
	router_free(&r);
	features_free(&f);
	return rc;
}

/* ---- paths: a run's phase, or checkpoints ------------------------------------------------- */

static const struct cli_opt pathset_opts[] = {
	{"run", 'R', 0, CLI_ARG, "RUNDIR", "the paths of a DiPaCo run, assembled from its modules"},
	{"phase", 'T', 0, CLI_ARG, "T", "... after phase T's outer step (default: the last phase\n"
	 "whose modules all exist)"},
	{"path", 'P', 0, CLI_ARG, "CKPT", "a path checkpoint instead (repeatable, in path order)"},
	CLI_OPT_END,
};

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

static const struct cli_opt score_opts[] = {
	{"prefix", 'p', 'p', CLI_ARG, "N", "tokens each document starts with that are not counted\n"
	 "in its sum (default " STR(DEFAULT_PREFIX) ")"},
	{"batch", 'B', 'B', CLI_ARG, "N", "context windows per forward (default "
	 STR(DEFAULT_BATCH) ")"},
	CLI_OPT_END,
};
static const struct cli_opt *const score_tables[] = {pathset_opts, score_opts, common_opts, NULL};

static void score_usage(FILE *fp)
{
	fprintf(fp,
		"usage: %s score (--run RUNDIR [--phase T] | --path CKPT...) -o SCORES\n"
		"                 [options] IN.tok\n"
		"Log-likelihood of every token of IN.tok under every path, and each document's\n"
		"sum from position PREFIX on (what a discriminative router learns from), into\n"
		"SCORES (dpc-route(5)). Documents longer than the model's context are run in\n"
		"consecutive windows of the context.\n\n"
		"options:\n",
		prog);
	cli_print_opts(fp, score_tables);
}

static int cmd_score(int argc, char **argv)
{
	struct cli_parser parser;
	struct common co = {0};
	struct pathset ps = {.phase = -1};
	long prefix = DEFAULT_PREFIX, batch = DEFAULT_BATCH;
	int c, rc;

	if ((rc = cli_parser_init(&parser, prog, "score", score_tables)) < 0)
		return cli_report(prog, rc);
	while ((c = cli_next(&parser, argc, argv)) != -1) {
		if ((rc = common_opt(&co, c, optarg)) < 0 ||
		    (!rc && (rc = pathset_opt(&ps, c, optarg)) < 0))
			return -rc;
		if (rc)
			continue;
		switch (c) {
		case 'p': rc = cli_parse_long("--prefix", optarg, 1, INT_MAX, &prefix); break;
		case 'B': rc = cli_parse_long("--batch", optarg, 1, 4096, &batch); break;
		case 'h': score_usage(stdout); return 0;
		case 'V': return version();
		default: return 2; /* CLI_BAD: reported */
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

static const struct cli_opt fit_opts[] = {
	{"scores", 'S', 0, CLI_ARG, "FILE", "the paths' scores of IN.tok (required)"},
	{"features", 'F', 0, CLI_ARG, "FILE", "prefix features of IN.tok (document router)"},
	{"window", 'W', 0, CLI_ARG, "W", "fit a window router for re-routing every W tokens"},
	{"model", 'm', 'm', CLI_ARG, "FILE", "the base checkpoint (window router)"},
	{"layer", 'L', 0, CLI_ARG, "L", "the block whose output makes window features (default:\n"
	 "the last)"},
	{"context", 'c', 0, CLI_ARG, "N", "tokens before a boundary averaged for its features\n"
	 "(default: the scores' prefix)"},
	{"l2", 'l', 0, CLI_ARG, "X", "L2 penalty on the weights (default 0.1)"},
	{"holdout", 'H', 0, CLI_ARG, "F", "fraction of rows held out to report accuracy on\n"
	 "(default 0.2; the router kept is refitted on all)"},
	{"iters", 'i', 0, CLI_ARG, "N", "L-BFGS iterations at most (default 500)"},
	{"min-share", 'M', 0, CLI_ARG, "F",
	 "the bias correction gives every path at least F times\n"
	 "an even share of the rows (default 0.5 for a document\n"
	 "router, 0 for a window router)"},
	{"correction", 'C', 0, CLI_FLAG, NULL,
	 "keep the bias correction in the router written (the\n"
	 "default for a document router, which makes shards)"},
	{"no-correction", 'N', 0, CLI_FLAG, NULL,
	 "write the plain argmax router (the default for a window\n"
	 "router, which only evaluates: the most accurate one);\n"
	 "the report shows the correction's effect either way"},
	{"seed", 's', 0, CLI_ARG, "N", "seed of the held-out draw, and the transformer's batches\n"
	 "and head (default 0)"},
	CLI_OPT_END,
};
static const struct cli_opt fit_tr_opts[] = {
	{"transformer", 'T', 0, CLI_FLAG, NULL, "the paper's window router (with --window and\n"
	 "--model): the base model with a head over the paths,\n"
	 "fine-tuned on the scores as dpc-train-path trains"},
	{"target-len", 'E', 0, CLI_ARG, "L", "its target at a position: the best path for the next\n"
	 "L tokens (default: W)"},
	{"steps", 'P', 0, CLI_ARG, "N", "its training steps (default " STR(FIT_TR_STEPS) ")"},
	{"lr", 'R', 0, CLI_ARG, "X", "its peak learning rate (default " STR(FIT_TR_LR) ")"},
	{"batch", 'B', 0, CLI_ARG, "N", "its sequences per step (default " STR(FIT_TR_BATCH) ")"},
	CLI_OPT_END,
};
static const struct cli_opt *const fit_tables[] = {fit_opts, fit_tr_opts, common_opts, NULL};

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
		"options:\n",
		prog, prog);
	cli_print_opts(fp, fit_tables);
}

struct fit_args {
	struct common co;
	const char *scores_path, *feat_path, *model, *in;
	long window, layer, context, iters, seed;
	struct route_fit_opts fo;
	int transformer;
	long target_len, steps, batch;
	double lr;
	int linear_key, tr_key; /* the last option given of each mode's own (0: none) */
};

/* The long name of fit's option key. */
static const char *fit_opt_name(int key)
{
	for (int i = 0; fit_tables[i]; i++)
		for (const struct cli_opt *o = fit_tables[i]; o->name; o++)
			if (o->key == key)
				return o->name;
	return "?";
}

static int fit_parse(struct fit_args *a, int argc, char **argv)
{
	struct cli_parser parser;
	int c, rc;

	*a = (struct fit_args){.layer = -1, .iters = 500,
			       .fo = {.l2 = 0.1, .holdout = 0.2, .min_share = -1, .correct = -1},
			       .steps = FIT_TR_STEPS, .lr = FIT_TR_LR, .batch = FIT_TR_BATCH};
	if ((rc = cli_parser_init(&parser, prog, "fit", fit_tables)) < 0)
		return cli_report(prog, rc);
	while ((c = cli_next(&parser, argc, argv)) != -1) {
		if ((rc = common_opt(&a->co, c, optarg)) < 0)
			return -rc;
		if (rc)
			continue;
		if (strchr("LclHMCNi", c))
			a->linear_key = c;
		if (strchr("EPRB", c))
			a->tr_key = c;
		switch (c) {
		case 'S': a->scores_path = optarg; break;
		case 'F': a->feat_path = optarg; break;
		case 'm': a->model = optarg; break;
		case 'W': rc = cli_parse_long("--window", optarg, 1, INT_MAX, &a->window); break;
		case 'L': rc = cli_parse_long("--layer", optarg, 0, INT_MAX, &a->layer); break;
		case 'c': rc = cli_parse_long("--context", optarg, 1, INT_MAX, &a->context); break;
		case 'l': rc = cli_parse_double("--l2", optarg, 0, 1e6, &a->fo.l2); break;
		case 'H': rc = cli_parse_double("--holdout", optarg, 0, 0.9, &a->fo.holdout); break;
		case 'M':
			rc = cli_parse_double("--min-share", optarg, 0, 1, &a->fo.min_share);
			break;
		case 'C': a->fo.correct = 1; break;
		case 'N': a->fo.correct = 0; break;
		case 'i': rc = cli_parse_long("--iters", optarg, 1, 1000000, &a->iters); break;
		case 's': rc = cli_parse_long("--seed", optarg, 0, LONG_MAX, &a->seed); break;
		case 'T': a->transformer = 1; break;
		case 'E':
			rc = cli_parse_long("--target-len", optarg, 1, INT_MAX, &a->target_len);
			break;
		case 'P': rc = cli_parse_long("--steps", optarg, 1, 100000000, &a->steps); break;
		case 'R': rc = cli_parse_double("--lr", optarg, 1e-9, 10, &a->lr); break;
		case 'B': rc = cli_parse_long("--batch", optarg, 1, 65536, &a->batch); break;
		case 'h': fit_usage(stdout); return 0;
		case 'V': return version();
		default: return 2; /* CLI_BAD: reported */
		}
		if (rc < 0)
			return cli_report(prog, rc);
	}
	if ((rc = expect_args(argc, 1, "fit", "one token file")) ||
	    (rc = check_output(&a->co, "fit")))
		return rc;
	if (!a->scores_path)
		return cli_usage_error(prog, "fit: --scores FILE is required");
	if (a->transformer && (!a->window || !a->model || a->feat_path))
		return cli_usage_error(prog, "fit: --transformer is a window router: it takes "
				       "--window W and --model BASE, not --features");
	if (a->window ? !a->model || a->feat_path : !a->feat_path || a->model)
		return cli_usage_error(prog, "fit: a document router takes --features, a window "
				       "router --window W and --model BASE (see %s fit --help)",
				       prog);
	if (a->transformer && a->linear_key)
		return cli_usage_error(prog, "fit: --%s is for the linear routers, not "
				       "--transformer", fit_opt_name(a->linear_key));
	if (!a->transformer && a->tr_key)
		return cli_usage_error(prog, "fit: --%s is for --transformer only",
				       fit_opt_name(a->tr_key));
	a->in = argv[optind];
	a->fo.max_iter = (int)a->iters;
	if (a->fo.min_share < 0)
		a->fo.min_share = a->window ? 0.0 : 0.5;
	if (a->fo.correct < 0)
		a->fo.correct = !a->window;
	a->fo.seed = (uint64_t)a->seed;
	return PARSED;
}

/* What fit reads and makes: the rows x (features) and y (best paths) the router learns. */
struct fit_data {
	struct tokfile tf;
	struct scores s;
	struct features f;
	struct lm base;
	struct router r;
	float *x, *score;
	uint32_t *y;
	uint64_t n;
	int have_base;
};

/* A document router's rows: each document's prefix features and best path. */
static int fit_doc_rows(const struct fit_args *a, struct fit_data *d)
{
	int rc = features_read(a->feat_path, &d->f);

	if (!rc)
		rc = features_check_corpus(&d->f, a->feat_path, &d->tf);
	if (!rc && d->f.r.prefix != d->s.prefix)
		rc = err_set(CORE_EFORMAT, a->feat_path, "features of %d-token prefixes, but "
			     "the scores count from token %d", d->f.r.prefix, d->s.prefix);
	if (!rc)
		rc = route_doc_rows(&d->s, &d->f, &d->tf, &d->x, &d->y, &d->score, &d->n);
	d->r.kind = ROUTER_LOGREG;
	d->r.dim = d->f.dim;
	d->r.r = d->f.r;
	return rc;
}

/* A window router's rows: at each boundary, the base model's features of the text before it
 * and the best path for the next window. > 0: reported. */
static int fit_window_rows(struct fit_args *a, struct fit_data *d)
{
	int rc;

	if ((rc = open_backend(&a->co))) {
		a->co.be = NULL;
		return rc; /* reported */
	}
	if ((rc = lm_open(&d->base, a->model, a->co.be, DEFAULT_BATCH)) == 0)
		d->have_base = 1;
	if (!rc) {
		if (a->layer < 0)
			a->layer = d->base.g.cfg.n_layer - 1;
		if (!a->context)
			a->context = d->s.prefix ? d->s.prefix : DEFAULT_PREFIX;
		start_progress(&a->co, "window features", (int64_t)d->tf.ndocs);
		rc = route_window_rows(&d->s, &d->base, &d->tf, (int)a->layer, (int)a->context,
				       (int)a->window, &d->x, &d->y, &d->score, &d->n, show_progress,
				       &a->co);
		progress_done(&a->co.bar);
	}
	d->r.kind = ROUTER_WINDOW;
	d->r.dim = 2 * d->base.g.cfg.n_embd;
	memcpy(d->r.r.digest, d->base.digest, sizeof d->r.r.digest);
	d->r.r.layer = (int)a->layer;
	d->r.r.prefix = d->s.prefix;
	d->r.window = (int)a->window;
	d->r.context = (int)a->context;
	return rc;
}

/* The transformer window router (wrouter.h), fitted and written by the library; > 0:
 * reported. */
static int fit_transformer(struct fit_args *a, struct fit_data *d)
{
	struct run_config c;
	char *report = NULL;
	int rc;

	config_defaults(&c);
	struct wrouter_fit_opts wo = {
		.window = (int)a->window, .progress = !a->co.quiet, .train = c.train,
		.target_len = (int)(a->target_len ? a->target_len : a->window)};
	wo.train.steps = a->steps;
	wo.train.lr = a->lr;
	wo.train.batch_size = (int)a->batch;
	wo.train.warmup_steps = a->steps / 10;
	wo.train.seed = (uint64_t)a->seed;
	if ((rc = open_backend(&a->co))) {
		a->co.be = NULL;
		return rc;
	}
	const double t0 = now_seconds();
	rc = wrouter_fit(a->model, &d->s, &d->tf, &wo, a->co.be, a->co.out, &report);
	if (rc < 0)
		return cli_report(prog, rc);
	json_error_t je;
	rc = print_json(json_pack("{s:s,s:s,s:i,s:o,s:f}", "output", a->co.out, "kind",
				  WROUTER_KIND, "paths", d->s.paths, "report",
				  json_loads(report, 0, &je), "seconds", now_seconds() - t0));
	free(report);
	return rc;
}

static int fit_run(struct fit_args *a)
{
	struct fit_data d = {0};
	int rc;

	if (a->co.threads)
		omp_set_num_threads((int)a->co.threads);
	if ((rc = tokfile_open(&d.tf, a->in)) < 0)
		return cli_report(prog, rc);
	if ((rc = scores_read(a->scores_path, &d.s)) < 0) {
		tokfile_close(&d.tf);
		return cli_report(prog, rc);
	}
	rc = scores_check_corpus(&d.s, a->scores_path, &d.tf);
	if (!rc && a->transformer) {
		rc = fit_transformer(a, &d);
		goto out;
	}
	if (!rc)
		rc = a->window ? fit_window_rows(a, &d) : fit_doc_rows(a, &d);
	if (!rc && d.n < 2)
		rc = err_set(CORE_ESHAPE, d.tf.path, "%llu %s to fit on: too few (a longer router "
			     "split, or a shorter prefix or window)", (unsigned long long)d.n,
			     a->window ? "windows" : "documents");
	d.r.paths = d.s.paths;
	const double t0 = now_seconds();
	if (!rc)
		rc = route_fit_logreg(d.x, d.y, d.score, d.n, d.r.dim, d.r.paths, &a->fo, &d.r.lr,
				      &d.r.report);
	const double secs = now_seconds() - t0;
	if (!rc)
		rc = router_write(a->co.out, &d.r);
	if (!rc) {
		json_error_t je;
		rc = print_json(json_pack("{s:s,s:s,s:i,s:I,s:o,s:f}", "output", a->co.out, "kind",
					  router_kind_name(d.r.kind), "paths", d.r.paths, "rows",
					  (json_int_t)d.n, "report", json_loads(d.r.report, 0, &je),
					  "seconds", secs));
	} else if (rc < 0) {
		rc = cli_report(prog, rc);
	}
out:
	free(d.x);
	free(d.y);
	free(d.score);
	router_free(&d.r);
	features_free(&d.f);
	if (d.have_base)
		lm_close(&d.base);
	if (a->co.be)
		backend_close(a->co.be);
	scores_free(&d.s);
	tokfile_close(&d.tf);
	return rc;
}

static int cmd_fit(int argc, char **argv)
{
	struct fit_args a;
	int rc = fit_parse(&a, argc, argv);

	return rc == PARSED ? fit_run(&a) : rc;
}

/* ---- eval --------------------------------------------------------------------------------- */

static const struct cli_opt eval_opts[] = {
	{"model", 'm', 'm', CLI_ARG, "FILE", "the base checkpoint the routers' features come from"},
	{"router", 'r', 0, CLI_ARG, "FILE",
	 "the document router (kmeans or logreg; required unless\nthere is one path)"},
	{"window-router", 'w', 0, CLI_ARG, "FILE", "a window router (repeatable, up to "
	 STR(MAX_WINDOWS) ")"},
	{"score-from", 'S', 0, CLI_ARG, "N",
	 "score tokens from position N of each document on (not\n"
	 "before the router's prefix; default: the prefix, " STR(DEFAULT_PREFIX) " for\n"
	 "one path without a router): the same N scores every\n"
	 "model on the same tokens"},
	{"early-stop", 'E', 0, CLI_FLAG, NULL,
	 "with --run: each path at the phase (1..T) of its lowest\n"
	 "loss on its shard's held-out tail (the paper's early\n"
	 "stopping; the run needs dipaco.holdout or\n"
	 "dipaco.early_stop_every > 0)"},
	{"json", 'J', 0, CLI_ARG, "FILE", "also write the table as JSON to FILE"},
	{"batch", 'B', 'B', CLI_ARG, "N", "context windows per forward (default "
	 STR(DEFAULT_BATCH) ")"},
	{"tokenizer", 'T' + 256, 0, CLI_ARG, "SPEC", "IN.tok's tokenizer (checked), for the loss per\n"
	 "byte of the text scored: spm:MODEL (the byte\n"
	 "tokenizer's need none)"},
	CLI_OPT_END,
};
static const struct cli_opt *const eval_tables[] = {pathset_opts, eval_opts, common_opts, NULL};
/* eval writes no file: --output is refused, --force ignored */
static const struct cli_opt eval_says[] = {{.name = "output"}, {.name = "force"}, CLI_OPT_END};

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
		"options:\n",
		prog);
	cli_print_opts_saying(fp, eval_tables, eval_says);
}

static json_t *mode_json(const struct route_eval_mode *m, const struct route_eval_mode *doc,
			 uint64_t docs)
{
	const double loss = m->tokens ? m->nll / (double)m->tokens : NAN;
	return json_pack("{s:s,s:s,s:i,s:f,s:f,s:I,s:I,s:I,s:I,s:f,s:f,s:f}", "routing",
			 m->window ? "window" : "document", "window_router",
			 !m->window ? "" : m->transformer ? "transformer" : "logreg", "window",
			 m->window, "loss", loss,
			 "perplexity", exp(loss), "tokens", (json_int_t)m->tokens, "forwarded",
			 (json_int_t)m->forwarded, "base_tokens", (json_int_t)m->base_tokens,
			 "switches", (json_int_t)m->switches, "switches_per_doc",
			 docs ? (double)m->switches / (double)docs : 0.0, "seconds", m->seconds,
			 "cost_vs_document",
			 doc->seconds > 0 ? m->seconds / doc->seconds : 0.0);
}

struct eval_args {
	struct common co;
	struct pathset ps;
	const char *model, *router_path, *json_path, *wpaths[MAX_WINDOWS], *in, *tokenizer;
	long batch, score_from;
	int nw;
};

/* The bytes of text the tokens scored stand for: every token from position `from` on of each
 * document longer than that, each its bytes under tk (a byte; a piece's text). *tokens: how
 * many, which must be eval's own count. */
static int scored_bytes(const struct tokfile *tf, const struct tokenizer *tk, uint64_t from,
			uint64_t *bytes, uint64_t *tokens)
{
	const uint32_t V = tokenizer_vocab(tk);
	uint16_t *len = malloc(sizeof *len * V);
	char buf[TOKENIZER_TOKEN_MAX];

	if (!len)
		return err_set(CORE_ENOMEM, tf->path, "out of memory");
	for (uint32_t i = 0; i < V; i++)
		len[i] = (uint16_t)tokenizer_token_bytes(tk, i, buf);
	*bytes = *tokens = 0;
	for (uint64_t d = 0; d < tf->ndocs; d++)
		for (uint64_t j = tf->offsets[d] + from; j < tf->offsets[d + 1]; j++) {
			*bytes += len[tokfile_token(tf, j)];
			++*tokens;
		}
	free(len);
	return 0;
}

static int eval_parse(struct eval_args *a, int argc, char **argv)
{
	struct cli_parser parser;
	int c, rc;

	*a = (struct eval_args){.ps = {.phase = -1}, .batch = DEFAULT_BATCH};
	if ((rc = cli_parser_init(&parser, prog, "eval", eval_tables)) < 0)
		return cli_report(prog, rc);
	while ((c = cli_next(&parser, argc, argv)) != -1) {
		if ((rc = common_opt(&a->co, c, optarg)) < 0 ||
		    (!rc && (rc = pathset_opt(&a->ps, c, optarg)) < 0))
			return -rc;
		if (rc)
			continue;
		switch (c) {
		case 'm': a->model = optarg; break;
		case 'r': a->router_path = optarg; break;
		case 'w':
			if (a->nw == MAX_WINDOWS)
				return cli_usage_error(prog, "eval: at most %d window routers",
						       MAX_WINDOWS);
			a->wpaths[a->nw++] = optarg;
			break;
		case 'J': a->json_path = optarg; break;
		case 'T' + 256: a->tokenizer = optarg; break;
		case 'B': rc = cli_parse_long("--batch", optarg, 1, 4096, &a->batch); break;
		case 'S':
			rc = cli_parse_long("--score-from", optarg, 1, INT_MAX, &a->score_from);
			break;
		case 'E': a->ps.early = 1; break;
		case 'h': eval_usage(stdout); return 0;
		case 'V': return version();
		default: return 2; /* CLI_BAD: reported */
		}
		if (rc < 0)
			return cli_report(prog, rc);
	}
	if ((rc = expect_args(argc, 1, "eval", "one token file")))
		return rc;
	if (a->co.out)
		return cli_usage_error(prog, "eval: the table goes to stdout (and --json FILE); "
				       "there is no --output");
	if (!a->model)
		return cli_usage_error(prog, "eval: --model BASE.safetensors is required");
	a->in = argv[optind];
	return PARSED;
}

/* The table of modes (document routing, then each window router's) on stdout, and with
 * --json in a file. */
static int eval_report(const struct eval_args *a, const struct tokfile *tf,
		       const struct tokenizer *tk, int prefix, const struct route_eval_mode *modes)
{
	int rc = 0;
	json_t *rows = json_array();
	const uint64_t from = a->score_from ? (uint64_t)a->score_from : (uint64_t)prefix;
	uint64_t bytes = 0, counted = 0;

	/* nats per byte: the bytes of text the scored tokens stand for */
	if (tk)
		rc = scored_bytes(tf, tk, from, &bytes, &counted);
	if (!rc && tk && counted != modes[0].tokens)
		rc = err_set(CORE_EFORMAT, tf->path, "eval scored %llu tokens, the count of its "
			     "documents from position %llu is %llu", (unsigned long long)
			     modes[0].tokens, (unsigned long long)from, (unsigned long long)counted);
	if (rc < 0) {
		json_decref(rows);
		return cli_report(prog, rc);
	}
	printf("%-22s %10s %10s %10s %10s %10s %8s %10s\n", "routing", "ppl", "loss", "tokens",
	       "switches/doc", "forwarded", "cost", "nats/byte");
	for (int i = 0; i <= a->nw; i++) {
		const struct route_eval_mode *m = &modes[i];
		char name[32];
		const double loss = m->tokens ? m->nll / (double)m->tokens : NAN;
		if (m->window)
			snprintf(name, sizeof name, "every %d tokens%s", m->window,
				 m->transformer ? ", tr." : "");
		else
			snprintf(name, sizeof name, "once per document");
		const double per_byte = bytes ? m->nll / (double)bytes : NAN;
		printf("%-22s %10.4f %10.5f %10llu %12.2f %10.3f %7.2fx %10.5f\n", name, exp(loss),
		       loss, (unsigned long long)m->tokens,
		       tf->ndocs ? (double)m->switches / (double)tf->ndocs : 0.0,
		       m->tokens ? (double)m->forwarded / (double)m->tokens : 0.0,
		       modes[0].seconds > 0 ? m->seconds / modes[0].seconds : 0.0, per_byte);
		json_t *row = mode_json(m, &modes[0], tf->ndocs);
		json_object_set_new(row, "nats_per_byte", bytes ? json_real(per_byte) : json_null());
		json_array_append_new(rows, row);
	}
	printf("(forwarded: tokens run through the paths per token scored; cost: wall time\n"
	       " against routing once per document, base-model features included; tr.: the\n"
	       " transformer window router; nats/byte: %s)\n", bytes ?
	       "the loss over the bytes of text the tokens\n scored stand for" :
	       "give --tokenizer spm:MODEL for the loss per byte");
	fflush(stdout);
	char *src = pathset_source(&a->ps);
	char tid[TOKENIZER_ID_LEN];
	tokenizer_id_str(&tf->tokenizer, tid);
	json_t *j = json_pack("{s:s,s:s,s:I,s:i,s:i,s:i,s:I,s:o,s:s,s:s,s:o}", "corpus",
			      tf->path, "source", src ? src : "", "docs", (json_int_t)tf->ndocs,
			      "paths", a->ps.n, "prefix", prefix, "score_from",
			      a->score_from ? (int)a->score_from : prefix, "tokens",
			      (json_int_t)modes[0].tokens, "bytes",
			      bytes ? json_integer((json_int_t)bytes) : json_null(), "tokenizer",
			      tid, "router", a->router_path ? a->router_path : "", "modes", rows);
	free(src);
	if (a->json_path) {
		char *text = j ? json_dumps(j, JSON_INDENT(2) | CORE_JSON_REAL) : NULL;
		rc = text ? file_write_atomic(a->json_path, text, strlen(text)) : CORE_ENOMEM;
		free(text);
		if (rc < 0)
			rc = cli_report(prog, rc);
	}
	json_decref(j);
	return rc;
}

static int eval_run(struct eval_args *a)
{
	struct pathset *ps = &a->ps;
	struct tokfile tf;
	struct lm base = {0};
	struct router doc = {0}, win[MAX_WINDOWS];
	const struct router *wp[MAX_WINDOWS];
	struct route_eval_mode modes[MAX_WINDOWS + 1];
	int nread = 0, have_doc = 0, have_base = 0, rc;
	struct tokenizer *tk = NULL;

	memset(win, 0, sizeof win);
	if ((rc = tokfile_open(&tf, a->in)) < 0)
		return cli_report(prog, rc);
	/* for the bytes of the text scored; none known (no column) for SentencePiece tokens
	 * without --tokenizer */
	if ((rc = tokenizer_for(a->tokenizer, tf.tokenizer, tf.vocab, tf.path, 0, &tk)) < 0) {
		tokenizer_close(tk);
		tokfile_close(&tf);
		return cli_report(prog, rc);
	}
	if (a->router_path && (rc = router_read(a->router_path, &doc)) == 0)
		have_doc = 1;
	if (!rc && (rc = open_backend(&a->co)))
		goto out;
	for (int i = 0; !rc && i < a->nw; i++) {
		if ((rc = wrouter_open_window(a->wpaths[i], a->co.be, &win[i])) == 0)
			nread = i + 1;
		wp[i] = &win[i];
	}
	if (!rc && have_doc && doc.kind == ROUTER_WINDOW)
		rc = err_set(CORE_EFORMAT, a->router_path, "is a window router; --router takes a "
			     "document router (kmeans or logreg)");
	if (rc < 0) {
		rc = cli_report(prog, rc);
		goto out;
	}
	if ((rc = open_paths(ps, &a->co, (int)a->batch, "eval")))
		goto out;
	if ((rc = lm_open(&base, a->model, a->co.be, (int)a->batch)) == 0)
		have_base = 1;
	if (!rc)
		rc = route_check_routers(&doc, &have_doc, a->router_path, win, a->wpaths, a->nw,
					 &base, a->model, ps->n, DEFAULT_PREFIX, "eval");
	/* one path without a router: nothing is read before the first token scored */
	if (!rc && !a->router_path && !a->nw && a->score_from && a->score_from < doc.r.prefix)
		doc.r.prefix = (int)a->score_from;
	if (rc < 0) {
		rc = cli_report(prog, rc);
		goto out;
	}
	if (rc)
		goto out;
	if (a->score_from && a->score_from < doc.r.prefix) {
		rc = cli_usage_error(prog, "eval: --score-from %ld is before the router's prefix "
				     "%d: the tokens the router reads are not scored",
				     a->score_from, doc.r.prefix);
		goto out;
	}
	start_progress(&a->co, "eval", (int64_t)tf.ndocs * (a->nw + 1));
	rc = route_evaluate(ps->lm, ps->n, &base, &doc, wp, a->nw, &tf, (int)a->score_from, modes,
			    show_progress, &a->co);
	progress_done(&a->co.bar);
	if (rc < 0) {
		rc = cli_report(prog, rc);
		goto out;
	}
	rc = eval_report(a, &tf, tk, doc.r.prefix, modes);
out:
	if (have_base)
		lm_close(&base);
	pathset_close(ps);
	for (int i = 0; i < nread; i++) /* a transformer router's model lives on the backend */
		router_free(&win[i]);
	if (a->co.be)
		backend_close(a->co.be);
	if (have_doc)
		router_free(&doc);
	tokenizer_close(tk);
	tokfile_close(&tf);
	return rc;
}

static int cmd_eval(int argc, char **argv)
{
	struct eval_args a;
	int rc = eval_parse(&a, argc, argv);

	return rc == PARSED ? eval_run(&a) : rc;
}

/* ---- sample ------------------------------------------------------------------------------ */

static const struct cli_opt sample_model_opts[] = {
	{"model", 'm', 'm', CLI_ARG, "FILE",
	 "the checkpoint (required); with --run or --path, the base\n"
	 "checkpoint the routers' features come from"},
	CLI_OPT_END,
};
static const struct cli_opt sample_route_opts[] = {
	{"router", 'r', 0, CLI_ARG, "FILE",
	 "the document router (required unless there is one path)"},
	{"window-router", 'w', 0, CLI_ARG, "FILE", "a window router: re-route every W tokens"},
	CLI_OPT_END,
};
static const struct cli_opt sample_opts[] = {
	{"tokens", 'n', 'n', CLI_ARG, "N", "tokens to generate (default 256)"},
	{"temperature", 'X', 0, CLI_ARG, "X", "softmax temperature; 0 is greedy (default 1.0)"},
	{"top-k", 'K', 0, CLI_ARG, "K",
	 "draw among the K most likely tokens only (default 0: all)"},
	{"top-p", 'Y', 0, CLI_ARG, "P", "then among the fewest whose probability reaches P\n"
	 "(nucleus sampling; default 1.0: all)"},
	{"seed", 's', 's', CLI_ARG, "N",
	 "the draws' seed: the same seed gives the same text (default 1)"},
	{"no-cache", 'N', 0, CLI_FLAG, NULL,
	 "a full forward over the context for every token instead of\n"
	 "the key/value cache (the same text, slower: for comparison)"},
	{"tokenizer", 'J', 0, CLI_ARG, "SPEC", "the models' tokenizer: byte, or spm:MODEL for\n"
	 "models trained on SentencePiece tokens (checked against\n"
	 "the checkpoints; default: byte, for models of bytes)"},
	CLI_OPT_END,
};
static const struct cli_opt *const sample_tables[] = {
	sample_model_opts, pathset_opts, sample_route_opts, sample_opts, common_opts, NULL};
/* sample writes no file (--output is refused) and runs one row at a time */
static const struct cli_opt sample_says[] = {
	{.name = "output"},
	{.name = "force"},
	{.name = "threads", .help = "OpenMP threads (default 1 with the cache, whose ops are one\n"
	 "row each; else OMP_NUM_THREADS or all cores)"},
	{.name = "device", .help = "where the model runs: cpu (default), ref or cuda"},
	{.name = "quiet", .help = "no summary line on stderr"},
	CLI_OPT_END,
};

static void sample_usage(FILE *fp)
{
	fprintf(fp,
		"usage: %s sample -m MODEL.safetensors [options] [PROMPT]\n"
		"       %s sample (--run RUNDIR [--phase T] | --path CKPT...) -m BASE\n"
		"                --router ROUTER [--window-router WROUTER] [options] [PROMPT]\n"
		"Generate text from a checkpoint: PROMPT ('-': read from standard input; none: a\n"
		"newline) is encoded with the models' tokenizer (--tokenizer), and the\n"
		"continuation goes to standard output as it is drawn, token by token. From a DiPaCo, each token comes from the path the\n"
		"routers choose, as eval routes: ROUTER on the prompt (its first PREFIX tokens),\n"
		"again when the text reaches PREFIX tokens, and with WROUTER at every window\n"
		"boundary PREFIX + m W; a switch feeds the context to the new path.\n\n"
		"options:\n",
		prog, prog);
	cli_print_opts_saying(fp, sample_tables, sample_says);
	fprintf(fp, "\nPast the model's context the oldest half of it is dropped and the rest fed "
		"again.\n");
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
	struct tokenizer *tk; /* the models' tokenizer: prompt in, tokens out */
};

static int emit_token(void *ctx, int32_t tok)
{
	const struct sample_route *sr = ctx;
	char buf[TOKENIZER_TOKEN_MAX];
	size_t n = tokenizer_token_bytes(sr->tk, (uint32_t)tok, buf);
	if ((n && fwrite(buf, 1, n, stdout) != n) || fflush(stdout) != 0)
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

struct sample_args {
	struct common co;
	struct pathset ps;
	const char *model, *router_path, *win_path, *prompt, *tokenizer;
	long ntok, topk, seed;
	double temp, topp;
	int nocache, dipaco;
};

static int sample_parse(struct sample_args *a, int argc, char **argv)
{
	struct cli_parser parser;
	int c, rc;

	*a = (struct sample_args){.ps = {.phase = -1}, .ntok = 256, .seed = 1, .temp = 1.0,
				  .topp = 1.0};
	if ((rc = cli_parser_init(&parser, prog, "sample", sample_tables)) < 0)
		return cli_report(prog, rc);
	while ((c = cli_next(&parser, argc, argv)) != -1) {
		if ((rc = common_opt(&a->co, c, optarg)) < 0)
			return -rc;
		if (rc)
			continue;
		if ((rc = pathset_opt(&a->ps, c, optarg)) < 0)
			return -rc;
		if (rc)
			continue;
		rc = 0;
		switch (c) {
		case 'm': a->model = optarg; break;
		case 'n': rc = cli_parse_long("--tokens", optarg, 0, 1L << 30, &a->ntok); break;
		case 'X': rc = cli_parse_double("--temperature", optarg, 0.0, 1e6, &a->temp); break;
		case 'K': rc = cli_parse_long("--top-k", optarg, 0, INT_MAX, &a->topk); break;
		case 'Y': rc = cli_parse_double("--top-p", optarg, 1e-9, 1.0, &a->topp); break;
		case 's': rc = cli_parse_long("--seed", optarg, 0, LONG_MAX, &a->seed); break;
		case 'N': a->nocache = 1; break;
		case 'r': a->router_path = optarg; break;
		case 'w': a->win_path = optarg; break;
		case 'J': a->tokenizer = optarg; break;
		case 'h': sample_usage(stdout); return 0;
		case 'V': return version();
		default: return 2; /* CLI_BAD: reported */
		}
		if (rc < 0)
			return cli_report(prog, rc);
	}
	a->dipaco = a->ps.run || a->ps.nfiles;
	if (argc - optind > 1)
		return cli_usage_error(prog, "sample: expected at most one prompt, got %d "
				       "arguments (quote the prompt; see %s sample --help)",
				       argc - optind, prog);
	if (a->co.out || a->co.force)
		return cli_usage_error(prog, "sample: the text goes to standard output; there is "
				       "no --output");
	if (!a->model)
		return cli_usage_error(prog, a->dipaco ? "sample: --model BASE.safetensors is "
				       "required: the base model the routers read" : "sample: "
				       "--model FILE is required (see %s sample --help)", prog);
	if (!a->dipaco && (a->router_path || a->win_path || a->ps.phase >= 0))
		return cli_usage_error(prog, "sample: %s routes the paths of a DiPaCo: it needs "
				       "--run RUNDIR or --path CKPT", a->router_path ? "--router" :
				       a->win_path ? "--window-router" : "--phase");
	a->prompt = optind < argc ? argv[optind] : "\n";
	return PARSED;
}

/* The paths of a DiPaCo, its routers and the base model they read; > 0: reported. */
static int sample_open_dipaco(struct sample_args *a, struct sample_route *sr)
{
	int rc;

	if ((rc = open_paths(&a->ps, &a->co, 1, "sample")) != 0)
		return rc;
	if (a->router_path && (rc = router_read(a->router_path, &sr->doc)) == 0)
		sr->have_doc = 1;
	if (!rc && a->win_path &&
	    (rc = wrouter_open_window(a->win_path, a->co.be, &sr->win)) == 0)
		sr->have_win = 1;
	if (!rc && sr->have_doc && sr->doc.kind == ROUTER_WINDOW)
		rc = err_set(CORE_EFORMAT, a->router_path, "is a window router; --router takes "
			     "a document router (kmeans or logreg)");
	if (!rc && (rc = lm_open(&sr->base, a->model, a->co.be, 1)) == 0)
		sr->have_base = 1;
	if (!rc) {
		const char *wp[1] = {a->win_path};
		rc = route_check_routers(&sr->doc, &sr->have_doc, a->router_path, &sr->win, wp,
					 sr->have_win, &sr->base, a->model, a->ps.n,
					 DEFAULT_PREFIX, "sample");
	}
	if (!rc && sr->base.g.cfg.vocab_size != a->ps.lm[0].g.cfg.vocab_size)
		rc = err_set(CORE_ESHAPE, a->model, "has a vocabulary of %d, the paths %d",
			     sr->base.g.cfg.vocab_size, a->ps.lm[0].g.cfg.vocab_size);
	return rc;
}

/* The tokenizer of the models (and the base the routers read) into sr->tk: --tokenizer,
 * checked against what each was trained on, else the byte tokenizer when that is theirs. */
static int sample_tokenizer(const struct sample_args *a, const struct lm *models, int n,
			    struct sample_route *sr)
{
	const struct model_config *m0 = &models[0].g.cfg;

	ERR_FORWARD(tokenizer_for(a->tokenizer, m0->tokenizer, (uint32_t)m0->vocab_size,
				  models[0].path, 1, &sr->tk));
	for (int i = 1; i < n; i++)
		ERR_FORWARD(tokenizer_check(sr->tk, models[i].g.cfg.tokenizer,
					    (uint32_t)models[i].g.cfg.vocab_size, models[i].path));
	if (sr->have_base)
		ERR_FORWARD(tokenizer_check(sr->tk, sr->base.g.cfg.tokenizer,
					    (uint32_t)sr->base.g.cfg.vocab_size, sr->base.path));
	return 0;
}

/* The summary lines on stderr after the text. */
static void sample_summary(const struct sample_args *a, const struct sample_route *sr,
			   const struct gen_stats *st, int nmodels, size_t plen)
{
	const double gen = st->t_total - st->t_prompt;

	fprintf(stderr, "\n%s sample: %ld tokens in %.2f s: %.1f tokens/s after a %zu-token "
		"prompt (%.3f s), %s; seed %ld\n", prog, a->ntok, st->t_total,
		a->ntok > 0 && gen > 0 ? (double)a->ntok / gen : 0.0, plen, st->t_prompt,
		a->nocache ? "no cache" : "key/value cache", a->seed);
	if (a->dipaco)
		fprintf(stderr, "%s sample: %d paths, routed %s; path@position: %s%s (%ld "
			"switches)\n", prog, nmodels, sr->have_win ? "every window" :
			"once per document", sr->log, sr->loglen >= sizeof sr->log - 32 ?
			" ..." : "", st->switches);
}

static int sample_run(struct sample_args *a)
{
	struct sample_route sr = {0};
	char *prompt = NULL;
	size_t plen = 0;
	int rc;

	if ((rc = read_prompt(a->prompt, &prompt, &plen)) < 0)
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
	if (!a->co.threads && !a->nocache)
		a->co.threads = 1;
	if ((rc = open_backend(&a->co)) != 0) {
		free(prompt);
		return rc;
	}
	struct lm m;
	struct lm *models = &m; /* the models drawn from: one checkpoint, or the paths */
	int nmodels = 1, opened = 0;
	if (a->dipaco) {
		if ((rc = sample_open_dipaco(a, &sr)) > 0)
			goto out;
		models = a->ps.lm;
		nmodels = a->ps.n;
	} else {
		rc = lm_open(&m, a->model, a->co.be, 1);
		opened = rc == 0;
	}
	if (rc == 0)
		rc = sample_tokenizer(a, models, nmodels, &sr);
	struct token_buf pt = {0};
	if (rc == 0)
		rc = tokenizer_encode(sr.tk, prompt, plen, &pt);
	plen = pt.n;
	int32_t *ptok = rc == 0 ? malloc(sizeof *ptok * (plen ? plen : 1)) : NULL;
	if (rc == 0 && !ptok)
		rc = err_set(CORE_ENOMEM, NULL, "out of memory");
	for (size_t i = 0; ptok && i < plen; i++)
		ptok[i] = (int32_t)pt.tok[i];
	token_buf_free(&pt);
	const struct gen_route rt = {.base = &sr.base, .doc = &sr.doc,
				     .win = sr.have_win ? &sr.win : NULL};
	const struct gen_opts go = {
		.so = {.temperature = a->temp, .top_k = (int)a->topk, .top_p = a->topp},
		.seed = (uint64_t)a->seed, .tokens = a->ntok, .nocache = a->nocache};
	const struct gen_sink sink = {.emit = emit_token, .path = log_path, .ctx = &sr};
	struct gen_stats st = {0};
	if (rc == 0)
		rc = route_generate(models, nmodels, a->dipaco ? &rt : NULL, ptok, plen, &go,
				    &sink, &st);
	free(ptok);
	if (rc == 0 && !a->co.quiet)
		sample_summary(a, &sr, &st, nmodels, plen);
out:
	if (opened)
		lm_close(&m);
	pathset_close(&a->ps);
	if (sr.have_base)
		lm_close(&sr.base);
	if (sr.have_doc)
		router_free(&sr.doc);
	if (sr.have_win)
		router_free(&sr.win);
	tokenizer_close(sr.tk);
	free(prompt);
	backend_close(a->co.be);
	return rc < 0 ? cli_report(prog, rc) : rc;
}

static int cmd_sample(int argc, char **argv)
{
	struct sample_args a;
	int rc = sample_parse(&a, argc, argv);

	return rc == PARSED ? sample_run(&a) : rc;
}

int main(int argc, char **argv)
{
	return cli_dispatch(prog, CORE_VERSION, commands, NCOMMANDS,
			    "'dpc-route COMMAND --help' describes one command. See dpc-route(1) and the\n"
			    "formats in dpc-route(5).\n", argc, argv);
}
