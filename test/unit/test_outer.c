/* test_outer.c - the DiPaCo outer step (lib/dipaco/outer.h, DESIGN.md "DiPaCo topology").
 *
 * The references are independent of outer.c: the formulas of outer.h written out naively in
 * this file, in double, from the float values the test itself wrote into the path
 * checkpoints (the phase-0 module's values are read back from its file), plus a few numbers
 * computed by hand. The topologies give modules shared by 1, 2, 3 and 4 paths:
 *   diloco3: lower {embed, h.0} K=1, upper {h.1, head} K=1, 3 paths (every module: 3 paths);
 *   mixed4:  lower {embed} K=1, mid {h.0-h.1} K=2, head {head} per path, 4 paths
 *            (lower.0: 4 paths, mid.0: paths 0 and 2, mid.1: 1 and 3, head.p: path p).
 * Bad input must give one error naming the file and leave no output file behind. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "common/err.h"
#include "common/rng.h"
#include "common/tensor.h"
#include "dipaco/module.h"
#include "dipaco/outer.h"
#include "dipaco/topology.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "model/gpt2.h"
#include "testutil.h"
#include "common/banned.h"

#define INIT_SEED 1234u  /* the model initialisation (phase-0 modules) */
#define NOISE_SEED 77u   /* what the "training" of each path adds */
#define MAXP 4           /* paths in the largest topology */

/* ---- scratch directory -------------------------------------------------------------------- */

static char dir[256];

static void setup(void)
{
	tu_mkdtemp(dir, sizeof dir, "outer");
}

static void teardown(void)
{
	tu_rm_tree(dir);
}

TestSuite(outer, .init = setup, .fini = teardown, .timeout = 120);

static int count_files(void)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	cr_assert(d, "opendir '%s'", dir);
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

static void sleep_seconds(double s)
{
	struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
	nanosleep(&ts, NULL);
}

static double wall(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- configs and topologies --------------------------------------------------------------- */

static void set_level(struct level_config *lv, const char *name, int modules, int embed,
		      int head, int lo, int hi)
{
	memset(lv, 0, sizeof *lv);
	snprintf(lv->name, sizeof lv->name, "%s", name);
	lv->modules = modules;
	lv->embed = embed;
	lv->head = head;
	if (lo >= 0) {
		lv->nranges = 1;
		lv->range[0].lo = lo;
		lv->range[0].hi = hi;
	}
}

static void cfg_small(struct run_config *c)
{
	config_defaults(c);
	c->model.n_layer = 2;
	c->model.n_embd = 8;
	c->model.n_head = 2;
	c->model.seq_len = 8;
	c->model.vocab_size = 16;
}

/* DiLoCo-like: every level K = 1, three paths, so every module is shared by 3 paths. */
static void cfg_diloco3(struct run_config *c)
{
	cfg_small(c);
	set_level(&c->dipaco.levels[0], "lower", 1, 1, 0, 0, 0);
	set_level(&c->dipaco.levels[1], "upper", 1, 0, 1, 1, 1);
	c->dipaco.nlevels = 2;
	c->dipaco.paths = 3;
}

/* Modules shared by 4, 2 and 1 paths (a per-path head). */
static void cfg_mixed4(struct run_config *c)
{
	cfg_small(c);
	set_level(&c->dipaco.levels[0], "lower", 1, 1, 0, -1, -1);
	set_level(&c->dipaco.levels[1], "mid", 2, 0, 0, 0, 1);
	set_level(&c->dipaco.levels[2], "head", LEVEL_PER_PATH, 0, 1, -1, -1);
	c->dipaco.nlevels = 3;
	c->dipaco.paths = 4;
}

/* ---- the fixture: a config, its topology, a model to write path checkpoints from -------- */

struct fx {
	struct run_config c;
	struct topology t;
	char hash[17];
	struct backend *be;
	struct gpt2 g;
};

static void fx_init(struct fx *f, void (*cfg)(struct run_config *))
{
	int rc;

	memset(f, 0, sizeof *f);
	cfg(&f->c);
	rc = config_validate(&f->c, "test");
	cr_assert_eq(rc, 0, "config_validate: %s", err_detail());
	rc = topo_build(&f->t, &f->c);
	cr_assert_eq(rc, 0, "topo_build: %s", err_detail());
	config_hash_all(&f->c, f->hash);
	rc = backend_open(&f->be, "cpu", &(struct backend_params){.threads = 1});
	cr_assert_eq(rc, 0, "backend_open: %s", err_detail());
	rc = gpt2_create(&f->g, &f->c.model, 1, f->c.model.seq_len, f->be);
	cr_assert_eq(rc, 0, "gpt2_create: %s", err_detail());
	cr_assert(f->be->host_visible, "the cpu backend's memory is host memory");
	cr_assert_eq(f->g.nparams, f->t.layout.nparams);
	for (int i = 0; i < f->t.layout.n; i++)
		cr_assert_eq(f->g.views[i].data, f->g.params + f->t.layout.offs[i],
			     "view %d of the model and of the layout differ", i);
}

static void fx_free(struct fx *f)
{
	gpt2_free(&f->g);
	backend_close(f->be);
	topo_free(&f->t);
}

static void fname(char *out, size_t n, const char *what, long phase, const char *who)
{
	snprintf(out, n, "%s/%s-%ld-%s.safetensors", dir, what, phase, who);
}

static void module_file(char *out, size_t n, const struct fx *f, int m, long phase)
{
	fname(out, n, "module", phase, f->t.modules[m].name);
}

static void path_file(char *out, size_t n, int p, long phase)
{
	char who[16];
	snprintf(who, sizeof who, "%d", p);
	fname(out, n, "path", phase, who);
}

/* Shard tokens of path p in phase t (all positive and distinct). */
static long tokens_of(int p, long phase) { return 100 * (p + 1) + 200 * (p == 2) + 37 * phase; }

/* Path p's parameters after phase t's "training": the initial values plus a direction
 * common to every path and one of its own, so the deltas are correlated (cosines well away
 * from 0). */
static void fill_path_values(struct fx *f, int p, long phase)
{
	cr_assert_eq(gpt2_init_params(&f->g, INIT_SEED), 0);
	for (size_t k = 0; k < f->g.nparams; k++) {
		uint64_t common = (uint64_t)phase * 1000000u + k;
		uint64_t own = ((uint64_t)phase * 16u + (uint64_t)p + 1u) * 1000000u + k;
		f->g.params[k] += 0.02f * rng_normal(NOISE_SEED, RNG_STREAM_TEST, common) +
				  0.01f * rng_normal(NOISE_SEED, RNG_STREAM_TEST, own);
	}
}

/* Save f->g as a path checkpoint with the metadata pathckpt_open checks. */
static void save_path(struct fx *f, const struct run_config *c, const char *path, long phase,
		      long path_meta, long tokens)
{
	char sphase[32], spath[32], stok[32];
	snprintf(sphase, sizeof sphase, "%ld", phase);
	snprintf(spath, sizeof spath, "%ld", path_meta);
	snprintf(stok, sizeof stok, "%ld", tokens);
	const struct st_kv extra[] = {{"phase", sphase}, {"path", spath}, {"shard_tokens", stok}};
	int rc = ckpt_save(path, &f->g, c, 10 * phase, 1, extra, 3);
	cr_assert_eq(rc, 0, "ckpt_save '%s': %s", path, err_detail());
}

/* Write path p's checkpoint of phase t; its parameters (flat, model layout) go to vals. */
static void write_path(struct fx *f, int p, long phase, float *vals)
{
	char path[512];
	path_file(path, sizeof path, p, phase);
	fill_path_values(f, p, phase);
	if (vals)
		memcpy(vals, f->g.params, sizeof *vals * f->g.nparams);
	save_path(f, &f->c, path, phase, p, tokens_of(p, phase));
}

static void write_init_modules(struct fx *f)
{
	char path[512];
	const struct module_init src = {.seed = INIT_SEED};
	for (int m = 0; m < f->t.nmodules; m++) {
		module_file(path, sizeof path, f, m, 0);
		int rc = module_write_init(path, &f->t, m, &src, "seed 1234", f->hash);
		cr_assert_eq(rc, 0, "module_write_init '%s': %s", path, err_detail());
	}
}

/* ---- module values: the owned views of module m concatenated in layout order ------------- */

/* Read module m's tensors named prefix + HF name from a file, into float and double. */
static void read_module_values(const struct fx *f, const char *path, int m, const char *prefix,
			       float *fl, double *db)
{
	struct st_file sf;
	size_t off = 0;
	int rc = st_open(&sf, path, 1);

	cr_assert_eq(rc, 0, "st_open '%s': %s", path, err_detail());
	for (int i = 0; i < f->t.layout.n; i++) {
		if (!topo_owns(&f->t, m, i))
			continue;
		const struct tensor *v = &f->t.layout.views[i];
		char name[TENSOR_NAME_MAX + 16];
		struct tensor dt;
		float *tmp = fl ? fl + off : malloc(sizeof *tmp * (size_t)tensor_numel(v));
		snprintf(name, sizeof name, "%s%s", prefix, v->name);
		tensor_view(&dt, DT_F32, v->ndim, v->ne, tmp, name);
		rc = st_read(&sf, name, &dt);
		cr_assert_eq(rc, 0, "st_read '%s' of '%s': %s", name, path, err_detail());
		for (int64_t k = 0; db && k < tensor_numel(v); k++)
			db[off + (size_t)k] = (double)tmp[k];
		if (!fl)
			free(tmp);
		off += (size_t)tensor_numel(v);
	}
	cr_assert_eq(off, f->t.modules[m].nparams);
	st_close(&sf);
}

/* Module m's part of a model-layout flat buffer, in double. */
static void gather(const struct fx *f, int m, const float *model, double *out)
{
	size_t off = 0;
	for (int i = 0; i < f->t.layout.n; i++) {
		if (!topo_owns(&f->t, m, i))
			continue;
		size_t n = (size_t)tensor_numel(&f->t.layout.views[i]);
		for (size_t k = 0; k < n; k++)
			out[off + k] = (double)model[f->t.layout.offs[i] + k];
		off += n;
	}
}

/* ---- the naive reference ------------------------------------------------------------------ */

/* One outer step of n parameters, straight from DESIGN.md / outer.h, in double:
 *   g = s * sum_i a_i (prev - theta_i);  buf = mu * buf + g;
 *   theta = prev - lr * (g + mu * buf)  (Nesterov)  or  prev - lr * buf  (heavy ball).
 * buf is updated in place; the new parameters go to out. */
static void ref_step(size_t n, int P, const double *prev, double *const *theta, const double *a,
		     double s, const struct outer_params *o, double *buf, double *out)
{
	for (size_t k = 0; k < n; k++) {
		double sum = 0.0;
		for (int i = 0; i < P; i++)
			sum += a[i] * (prev[k] - theta[i][k]);
		double g = s * sum;
		buf[k] = o->momentum * buf[k] + g;
		out[k] = prev[k] - o->lr * (o->nesterov ? g + o->momentum * buf[k] : buf[k]);
	}
}

/* Compare a module's values from a file (float) with a reference, element by element:
 * |got - ref| <= 1e-6 * max(1, |ref|). Prints every mismatch (up to 20) with its place. */
static void expect_close(const struct fx *f, int m, const char *what, const float *got,
			 const double *ref, const char *ctx)
{
	size_t off = 0;
	int bad = 0;
	for (int i = 0; i < f->t.layout.n; i++) {
		if (!topo_owns(&f->t, m, i))
			continue;
		const struct tensor *v = &f->t.layout.views[i];
		for (int64_t k = 0; k < tensor_numel(v); k++, off++) {
			double r = ref[off], gt = (double)got[off];
			double tol = 1e-6 * fmax(1.0, fabs(r));
			if (!(fabs(gt - r) <= tol)) {
				if (bad++ < 20)
					cr_log_error("%s: module %s, tensor %s%s, element %lld: got "
						     "%.9g, ref %.9g", ctx, f->t.modules[m].name,
						     what, v->name, (long long)k, gt, r);
			}
		}
	}
	cr_expect_eq(bad, 0, "%s: module %s, %s: %d elements differ from the reference", ctx,
		     f->t.modules[m].name, *what ? "momentum" : "parameters", bad);
}

static void expect_rel(double got, double ref, double rel, const char *what, const char *ctx)
{
	cr_expect(fabs(got - ref) <= rel * fmax(fabs(ref), 1e-300), "%s: %s: got %.17g, ref %.17g",
		  ctx, what, got, ref);
}

static double norm2(const double *x, size_t n)
{
	double s = 0.0;
	for (size_t k = 0; k < n; k++)
		s += x[k] * x[k];
	return sqrt(s);
}

/* The diagnostics, naively: ||prev - theta_i||, ||sum a_i (prev - theta_i)|| (and times s),
 * ||theta_new - prev|| from the values written, and the mean over all ordered pairs i != j
 * of cos(delta_i, delta_j). */
static void check_diag(const struct outer_diag *d, size_t n, int P, const double *prev,
		       double *const *theta, const double *a, double s, const float *written,
		       const char *ctx)
{
	double *delta[MAXP], *acc = calloc(n, sizeof *acc), *upd = malloc(sizeof *upd * n);

	cr_assert(acc && upd);
	cr_expect_eq(d->npaths, P, "%s: npaths", ctx);
	cr_assert(d->delta_norm, "%s: delta_norm not allocated", ctx);
	for (int i = 0; i < P; i++) {
		delta[i] = malloc(sizeof *delta[i] * n);
		cr_assert(delta[i]);
		for (size_t k = 0; k < n; k++) {
			delta[i][k] = prev[k] - theta[i][k];
			acc[k] += a[i] * delta[i][k];
		}
		char what[32];
		snprintf(what, sizeof what, "delta_norm[%d]", i);
		expect_rel(d->delta_norm[i], norm2(delta[i], n), 1e-9, what, ctx);
	}
	for (size_t k = 0; k < n; k++)
		upd[k] = (double)written[k] - prev[k];
	expect_rel(d->grad_norm, norm2(acc, n), 1e-6, "grad_norm", ctx);
	expect_rel(d->grad_norm_scaled, s * norm2(acc, n), 1e-6, "grad_norm_scaled", ctx);
	expect_rel(d->update_norm, norm2(upd, n), 1e-6, "update_norm", ctx);
	if (P < 2) {
		cr_expect(isnan(d->mean_cosine), "%s: mean_cosine %g with one path, expected NaN",
			  ctx, d->mean_cosine);
	} else {
		/* The pairwise cosines' mean weighted by the norm products |d_i| |d_j|, pair by
		 * pair: sum_{i != j} cos_ij |d_i| |d_j| / sum_{i != j} |d_i| |d_j|. */
		double sum = 0.0, wsum = 0.0;
		for (int i = 0; i < P; i++)
			for (int j = 0; j < P; j++) {
				if (i == j)
					continue;
				double dot = 0.0, w = norm2(delta[i], n) * norm2(delta[j], n);
				for (size_t k = 0; k < n; k++)
					dot += delta[i][k] * delta[j][k];
				sum += dot / w * w;
				wsum += w;
			}
		expect_rel(d->mean_cosine, sum / wsum, 1e-6, "mean_cosine", ctx);
	}
	for (int i = 0; i < P; i++)
		free(delta[i]);
	free(acc);
	free(upd);
}

/* ---- one module's step against the reference ---------------------------------------------- */

/* The reference state of one module carried across phases. */
struct mstate {
	size_t n;
	double *theta, *buf; /* buf starts at zero */
};

static void mstate_init(struct mstate *s, const struct fx *f, int m, const char *phase0)
{
	s->n = f->t.modules[m].nparams;
	s->theta = malloc(sizeof *s->theta * s->n);
	s->buf = calloc(s->n, sizeof *s->buf);
	cr_assert(s->theta && s->buf);
	read_module_values(f, phase0, m, "", NULL, s->theta);
}

static void mstate_free(struct mstate *s)
{
	free(s->theta);
	free(s->buf);
}

/* Run outer_step_module for module m of phase t (prev: phase t-1's module file, paths: the
 * phase-t path checkpoints whose values are in vals[p]), then compare the output file, its
 * momentum and the diagnostics with the reference, which advances s. */
static void step_and_check(struct fx *f, int m, long phase, const char *prev_path,
			   const char *out_path, float *const *vals, struct outer_params o,
			   struct mstate *s)
{
	const struct topo_module *md = &f->t.modules[m];
	const int P = md->npaths;
	char ppaths[MAXP][512], ctx[256];
	const char *pp[MAXP];
	double tok[MAXP], a[MAXP], *theta[MAXP];
	size_t n = md->nparams;

	cr_assert(P >= 1 && P <= MAXP);
	snprintf(ctx, sizeof ctx, "module %s (%d paths), phase %ld, lr %g mu %g nesterov %d "
		 "rescale %d reweight %d", md->name, P, phase, o.lr, o.momentum, o.nesterov,
		 o.rescale, o.reweight);
	for (int k = 0; k < P; k++) {
		path_file(ppaths[k], sizeof ppaths[k], md->paths[k], phase);
		pp[k] = ppaths[k];
		tok[k] = (double)tokens_of(md->paths[k], phase);
		theta[k] = malloc(sizeof *theta[k] * n);
		cr_assert(theta[k]);
		gather(f, m, vals[md->paths[k]], theta[k]);
	}
	outer_weights(a, tok, P, o.reweight);

	struct outer_job j = {
		.topo = &f->t, .module = m, .phase = phase, .prev_path = prev_path,
		.path_ckpts = pp, .weights = a, .out_path = out_path, .config_hash = f->hash,
		.params = o, .wait_seconds = 0,
	};
	struct outer_diag d;
	int rc = outer_step_module(&j, &d);
	cr_assert_eq(rc, 0, "%s: outer_step_module: %s", ctx, err_detail());

	/* The output is module m of phase t for this config, whole-file crc included. */
	struct st_file sf;
	rc = module_open(&sf, out_path, &f->t, m, phase, f->hash, 1);
	cr_assert_eq(rc, 0, "%s: module_open of the output: %s", ctx, err_detail());
	cr_expect_eq(sf.n, 2 * md->nviews, "%s: %d tensors in the output, expected %d", ctx,
		     sf.n, 2 * md->nviews);
	st_close(&sf);

	float *got = malloc(sizeof *got * n), *gotbuf = malloc(sizeof *gotbuf * n);
	double *ref = malloc(sizeof *ref * n);
	cr_assert(got && gotbuf && ref);
	read_module_values(f, out_path, m, "", got, NULL);
	read_module_values(f, out_path, m, MODULE_MOMENTUM_PREFIX, gotbuf, NULL);

	/* prev as the implementation sees it: the previous module file's floats. */
	double *prev = malloc(sizeof *prev * n);
	cr_assert(prev);
	read_module_values(f, prev_path, m, "", NULL, prev);
	const double sc = o.rescale ? sqrt((double)P) : 1.0;
	ref_step(n, P, s->theta, theta, a, sc, &o, s->buf, ref);
	expect_close(f, m, "", got, ref, ctx);
	expect_close(f, m, MODULE_MOMENTUM_PREFIX, gotbuf, s->buf, ctx);
	check_diag(&d, n, P, prev, theta, a, sc, got, ctx);
	memcpy(s->theta, ref, sizeof *ref * n);

	outer_diag_free(&d);
	for (int k = 0; k < P; k++)
		free(theta[k]);
	free(got);
	free(gotbuf);
	free(ref);
	free(prev);
}

/* ==== 1. the formulas on a few numbers worked by hand ====================================== */

Test(outer, weights_by_hand)
{
	double a[3];

	outer_weights(a, (double[]){1, 3}, 2, 1); /* 1/4, 3/4 */
	cr_expect_float_eq(a[0], 0.25, 1e-15);
	cr_expect_float_eq(a[1], 0.75, 1e-15);
	outer_weights(a, (double[]){1, 3}, 2, 0); /* reweight off: uniform */
	cr_expect_float_eq(a[0], 0.5, 1e-15);
	cr_expect_float_eq(a[1], 0.5, 1e-15);
	outer_weights(a, (double[]){0, 3}, 2, 1); /* a zero count: uniform */
	cr_expect_float_eq(a[0], 0.5, 1e-15);
	cr_expect_float_eq(a[1], 0.5, 1e-15);
	outer_weights(a, (double[]){100, 300, 600}, 3, 1); /* 0.1, 0.3, 0.6 */
	cr_expect_float_eq(a[0], 0.1, 1e-15);
	cr_expect_float_eq(a[1], 0.3, 1e-15);
	cr_expect_float_eq(a[2], 0.6, 1e-15);
	outer_weights(a, (double[]){100, 300, 600}, 3, 0);
	for (int i = 0; i < 3; i++)
		cr_expect_float_eq(a[i], 1.0 / 3.0, 1e-15);
	outer_weights(a, (double[]){5}, 1, 1); /* one path: weight 1 */
	cr_expect_float_eq(a[0], 1.0, 0);
}

/* prev {1, 2, -1, 0.5}; theta_1 {0.5, 2.5, -1, 0.25}, theta_2 {0, 1, -2, 0.5}, a = 1/2 each:
 *   after theta_1: acc = 0.5 * {0.5, -0.5, 0, 0.25}          = {0.25, -0.25, 0, 0.125}
 *   after theta_2: acc += 0.5 * {1, 1, 1, 0}                  = {0.75, 0.25, 0.5, 0.125}
 * (every value exact in binary). */
static const float P4[4] = {1, 2, -1, 0.5f}, T1[4] = {0.5f, 2.5f, -1, 0.25f},
		   T2[4] = {0, 1, -2, 0.5f};

Test(outer, accumulate_by_hand)
{
	double acc[4] = {0};
	const double want1[4] = {0.25, -0.25, 0, 0.125}, want2[4] = {0.75, 0.25, 0.5, 0.125};

	outer_accumulate(acc, P4, T1, 0.5, 4);
	for (int k = 0; k < 4; k++)
		cr_expect_eq(acc[k], want1[k], "acc[%d] after path 1: %g, expected %g", k, acc[k],
			     want1[k]);
	outer_accumulate(acc, P4, T2, 0.5, 4);
	for (int k = 0; k < 4; k++)
		cr_expect_eq(acc[k], want2[k], "acc[%d] after path 2: %g, expected %g", k, acc[k],
			     want2[k]);
}

static void apply_case(double scale, int nesterov, const float *want_theta,
		       const float *want_buf, const char *name)
{
	const double acc[4] = {0.75, 0.25, 0.5, 0.125};
	float buf[4] = {0, 0.5f, -1, 0}, out[4];
	const struct outer_params o = {.lr = 0.7, .momentum = 0.9, .nesterov = nesterov};

	outer_apply(out, buf, P4, acc, 4, scale, &o);
	for (int k = 0; k < 4; k++) {
		cr_expect(fabsf(out[k] - want_theta[k]) <= 1e-6f, "%s: theta[%d] = %.9g, expected "
			  "%.9g", name, k, out[k], want_theta[k]);
		cr_expect(fabsf(buf[k] - want_buf[k]) <= 1e-6f, "%s: buf[%d] = %.9g, expected %.9g",
			  name, k, buf[k], want_buf[k]);
	}
}

/* lr 0.7, mu 0.9, prev {1, 2, -1, 0.5}, acc {0.75, 0.25, 0.5, 0.125}, old buf {0, 0.5, -1, 0}:
 * Nesterov, scale 1:
 *   g = 0.75,  buf = 0.75,            theta = 1 - 0.7 (0.75 + 0.675)      = 0.0025
 *   g = 0.25,  buf = 0.45 + 0.25 = .7, theta = 2 - 0.7 (0.25 + 0.63)      = 1.384
 *   g = 0.5,   buf = -0.9 + 0.5 = -.4, theta = -1 - 0.7 (0.5 - 0.36)      = -1.098
 *   g = 0.125, buf = 0.125,           theta = 0.5 - 0.7 (0.125 + 0.1125)  = 0.33375 */
Test(outer, apply_nesterov_by_hand)
{
	apply_case(1.0, 1, (const float[]){0.0025f, 1.384f, -1.098f, 0.33375f},
		   (const float[]){0.75f, 0.7f, -0.4f, 0.125f}, "nesterov");
}

/* Heavy ball, theta = prev - lr buf, same buffers as above:
 *   1 - 0.7 * 0.75 = 0.475;  2 - 0.7 * 0.7 = 1.51;  -1 + 0.7 * 0.4 = -0.72;
 *   0.5 - 0.7 * 0.125 = 0.4125 */
Test(outer, apply_heavy_ball_by_hand)
{
	apply_case(1.0, 0, (const float[]){0.475f, 1.51f, -0.72f, 0.4125f},
		   (const float[]){0.75f, 0.7f, -0.4f, 0.125f}, "heavy ball");
}

/* Rescaled by s = sqrt(2) = 1.41421356, Nesterov:
 *   g = 0.75 s = 1.06066017, buf = 1.06066017, theta = 1 - 0.7 * 1.9 * 1.06066017 = -0.41067803
 *   g = 0.25 s = 0.35355339, buf = 0.45 + g = 0.80355339,
 *            theta = 2 - 0.7 (0.35355339 + 0.72319805) = 1.24627399
 *   g = 0.5 s = 0.70710678, buf = -0.9 + g = -0.19289322,
 *            theta = -1 - 0.7 (0.70710678 - 0.17360390) = -1.37345202
 *   g = 0.125 s = 0.17677670, buf = 0.17677670, theta = 0.5 - 0.7 * 1.9 * 0.1767767 = 0.26488700 */
Test(outer, apply_rescaled_by_hand)
{
	apply_case(sqrt(2.0), 1, (const float[]){-0.41067803f, 1.24627399f, -1.37345202f, 0.26488700f},
		   (const float[]){1.06066017f, 0.80355339f, -0.19289322f, 0.17677670f},
		   "rescale sqrt(2)");
}

/* lr 1, mu 0: theta = prev - sum a_i (prev - theta_i) = sum a_i theta_i.
 * a = {1/4, 3/4}: {0.125, 1.375, -1.75, 0.4375}; a = {1/2, 1/2}: {0.25, 1.75, -1.5, 0.375}
 * (exact in binary, so compared exactly); buf = g = prev - average. */
Test(outer, apply_lr1_mu0_is_the_weighted_average)
{
	const double as[2][2] = {{0.25, 0.75}, {0.5, 0.5}};
	const float want[2][4] = {{0.125f, 1.375f, -1.75f, 0.4375f}, {0.25f, 1.75f, -1.5f, 0.375f}};
	const struct outer_params o = {.lr = 1.0, .momentum = 0.0, .nesterov = 1};

	for (int c = 0; c < 2; c++) {
		double acc[4] = {0};
		float buf[4] = {3, 3, 3, 3}, out[4]; /* mu 0: the old buffer must not matter */
		outer_accumulate(acc, P4, T1, as[c][0], 4);
		outer_accumulate(acc, P4, T2, as[c][1], 4);
		outer_apply(out, buf, P4, acc, 4, 1.0, &o);
		for (int k = 0; k < 4; k++) {
			cr_expect_eq(out[k], want[c][k], "a = {%g, %g}: theta[%d] = %.9g, expected "
				     "%.9g", as[c][0], as[c][1], k, out[k], want[c][k]);
			cr_expect_eq(buf[k], P4[k] - want[c][k], "a = {%g, %g}: buf[%d] = %.9g", as[c][0],
				     as[c][1], k, buf[k]);
		}
	}
}

/* ==== 2. whole modules, from files ========================================================= */

/* Every module of a topology, phase 1, with each of rescale and reweight on and off. */
static void whole_modules(void (*cfg)(struct run_config *))
{
	struct fx f;
	float *vals[MAXP] = {0};
	char prev[512], out[512], tag[32];

	fx_init(&f, cfg);
	cr_assert(f.t.npaths <= MAXP);
	write_init_modules(&f);
	for (int p = 0; p < f.t.npaths; p++) {
		vals[p] = malloc(sizeof *vals[p] * f.g.nparams);
		cr_assert(vals[p]);
		write_path(&f, p, 1, vals[p]);
	}
	for (int m = 0; m < f.t.nmodules; m++)
		for (int v = 0; v < 4; v++) {
			struct outer_params o = {.lr = 0.7, .momentum = 0.9, .nesterov = 1,
						 .rescale = v & 1, .reweight = v >> 1};
			struct mstate s;
			module_file(prev, sizeof prev, &f, m, 0);
			snprintf(tag, sizeof tag, "out%d", v);
			fname(out, sizeof out, tag, 1, f.t.modules[m].name);
			mstate_init(&s, &f, m, prev);
			step_and_check(&f, m, 1, prev, out, vals, o, &s);
			mstate_free(&s);
		}
	for (int p = 0; p < f.t.npaths; p++)
		free(vals[p]);
	fx_free(&f);
}

Test(outer, topologies_have_the_modules_the_tests_assume)
{
	struct fx f;
	fx_init(&f, cfg_diloco3);
	cr_expect_eq(f.t.nmodules, 2);
	for (int m = 0; m < f.t.nmodules; m++)
		cr_expect_eq(f.t.modules[m].npaths, 3, "%s", f.t.modules[m].name);
	fx_free(&f);

	fx_init(&f, cfg_mixed4);
	const struct {
		const char *name;
		int npaths, paths[4];
	} want[] = {{"lower.0", 4, {0, 1, 2, 3}}, {"mid.0", 2, {0, 2}}, {"mid.1", 2, {1, 3}},
		    {"head.0", 1, {0}}, {"head.1", 1, {1}}, {"head.2", 1, {2}}, {"head.3", 1, {3}}};
	cr_expect_eq(f.t.nmodules, 7);
	for (size_t w = 0; w < sizeof want / sizeof want[0]; w++) {
		int m = topo_find(&f.t, want[w].name);
		cr_assert(m >= 0, "no module %s", want[w].name);
		cr_assert_eq(f.t.modules[m].npaths, want[w].npaths, "%s", want[w].name);
		for (int k = 0; k < want[w].npaths; k++)
			cr_expect_eq(f.t.modules[m].paths[k], want[w].paths[k], "%s", want[w].name);
	}
	fx_free(&f);
}

/* Module m's phase-0 file holds module m's part of the model-layout values `model`, bit for
 * bit, and zero momentum. */
static void expect_init_module(struct fx *f, int m, const float *model, const char *what)
{
	char path[512];
	size_t n = f->t.modules[m].nparams;
	double *want = malloc(sizeof *want * n), *got = malloc(sizeof *got * n),
	       *mom = malloc(sizeof *mom * n);
	cr_assert(want && got && mom);
	module_file(path, sizeof path, f, m, 0);
	gather(f, m, model, want);
	read_module_values(f, path, m, "", NULL, got);
	read_module_values(f, path, m, MODULE_MOMENTUM_PREFIX, NULL, mom);
	cr_expect(!memcmp(want, got, sizeof *got * n), "module %s: %s", f->t.modules[m].name,
		  what);
	for (size_t k = 0; k < n; k++)
		cr_expect_eq(mom[k], 0.0, "module %s: momentum %zu", f->t.modules[m].name, k);
	free(want);
	free(got);
	free(mom);
}

/* The phase-0 module holds what a whole model initialised with the same seed holds. */
Test(outer, init_module_is_the_model_init)
{
	struct fx f;

	fx_init(&f, cfg_mixed4);
	write_init_modules(&f);
	cr_assert_eq(gpt2_init_params(&f.g, INIT_SEED), 0);
	for (int m = 0; m < f.t.nmodules; m++)
		expect_init_module(&f, m, f.g.params, "initial values");
	fx_free(&f);
}

/* dpc-outer init --from: each phase-0 module holds the checkpoint's tensors of its views
 * (read by name from the checkpoint) and zero momentum. */
Test(outer, init_module_from_a_checkpoint_holds_its_tensors)
{
	struct fx f;
	char path[512], ck[512], label[MODULE_INIT_MAX];

	fx_init(&f, cfg_mixed4);
	/* the trained model: values no initialisation draws, distinct per parameter */
	for (size_t k = 0; k < f.g.nparams; k++)
		f.g.params[k] = 0.001f * (float)k - 0.5f * rng_normal(NOISE_SEED, RNG_STREAM_TEST, k);
	float *trained = malloc(sizeof *trained * f.g.nparams);
	cr_assert(trained);
	memcpy(trained, f.g.params, sizeof *trained * f.g.nparams);
	snprintf(ck, sizeof ck, "%s/trained.safetensors", dir);
	cr_assert_eq(ckpt_save(ck, &f.g, &f.c, 300, 1, NULL, 0), 0, "%s", err_detail());
	const struct module_init src = {.seed = INIT_SEED, .from = ck};
	cr_assert_eq(module_init_label(&src, &f.c.model, label), 0, "%s", err_detail());
	cr_assert(!strncmp(label, "checkpoint ", 11) && strlen(label) == 11 + 8, "%s", label);
	for (int m = 0; m < f.t.nmodules; m++) {
		module_file(path, sizeof path, &f, m, 0);
		cr_assert_eq(module_write_init(path, &f.t, m, &src, label, f.hash), 0, "%s",
			     err_detail());
		expect_init_module(&f, m, trained, "the checkpoint's values");
		struct st_file mf;
		cr_assert_eq(module_open(&mf, path, &f.t, m, 0, f.hash, 1), 0, "%s", err_detail());
		cr_expect_str_eq(st_meta(&mf, "init"), label);
		cr_expect_eq(module_check_init(&mf, label), 0);
		cr_expect_eq(module_check_init(&mf, "seed 1234"), CORE_ECONFIG,
			     "a module from a checkpoint is not the seeded initialisation");
		st_close(&mf);
	}
	free(trained);
	fx_free(&f);
}

/* A checkpoint of another shape, or a module file, is refused by name before anything is
 * written. */
Test(outer, init_from_refuses_another_shape_and_a_module_file)
{
	struct fx f, wide;
	char ck[512], mod[512], label[MODULE_INIT_MAX];

	fx_init(&f, cfg_mixed4);
	fx_init(&wide, cfg_mixed4);
	snprintf(ck, sizeof ck, "%s/other-vocab.safetensors", dir);
	struct run_config other = f.c;
	other.model.vocab_size = f.c.model.vocab_size + 1;
	gpt2_free(&wide.g);
	cr_assert_eq(gpt2_create(&wide.g, &other.model, 1, other.model.seq_len, wide.be), 0);
	cr_assert_eq(ckpt_save(ck, &wide.g, &other, 10, 0, NULL, 0), 0, "%s", err_detail());
	const struct module_init src = {.from = ck};
	cr_expect_eq(module_init_label(&src, &f.c.model, label), CORE_ECONFIG);
	cr_expect(strstr(err_detail(), "V=17") && strstr(err_detail(), "V=16"), "%s",
		  err_detail());
	write_init_modules(&f);
	module_file(mod, sizeof mod, &f, 0, 0);
	const struct module_init src2 = {.from = mod};
	cr_expect_eq(module_init_label(&src2, &f.c.model, label), CORE_ECONFIG);
	cr_expect(strstr(err_detail(), "module checkpoint"), "%s", err_detail());
	fx_free(&wide);
	fx_free(&f);
}

Test(outer, modules_shared_by_three_paths) { whole_modules(cfg_diloco3); }

Test(outer, modules_shared_by_four_two_and_one_paths) { whole_modules(cfg_mixed4); }

/* ==== 3. Nesterov (and heavy ball) over several phases ===================================== */

/* Phases 1..3: each phase's prev is the previous phase's output, momentum travels in the
 * file; the reference carries theta and buf in double through the same recurrence. */
static void phases(void (*cfg)(struct run_config *), struct outer_params o)
{
	struct fx f;
	float *vals[MAXP] = {0};
	struct mstate *s;
	char prev[512], out[512];

	fx_init(&f, cfg);
	write_init_modules(&f);
	s = calloc((size_t)f.t.nmodules, sizeof *s);
	cr_assert(s);
	for (int m = 0; m < f.t.nmodules; m++) {
		module_file(prev, sizeof prev, &f, m, 0);
		mstate_init(&s[m], &f, m, prev);
	}
	for (int p = 0; p < f.t.npaths; p++) {
		vals[p] = malloc(sizeof *vals[p] * f.g.nparams);
		cr_assert(vals[p]);
	}
	for (long t = 1; t <= 3; t++) {
		for (int p = 0; p < f.t.npaths; p++)
			write_path(&f, p, t, vals[p]);
		for (int m = 0; m < f.t.nmodules; m++) {
			module_file(prev, sizeof prev, &f, m, t - 1);
			module_file(out, sizeof out, &f, m, t);
			step_and_check(&f, m, t, prev, out, vals, o, &s[m]);
		}
	}
	for (int m = 0; m < f.t.nmodules; m++)
		mstate_free(&s[m]);
	free(s);
	for (int p = 0; p < f.t.npaths; p++)
		free(vals[p]);
	fx_free(&f);
}

Test(outer, nesterov_over_three_phases)
{
	phases(cfg_mixed4, (struct outer_params){.lr = 0.7, .momentum = 0.9, .nesterov = 1,
						 .rescale = 1, .reweight = 1});
}

Test(outer, heavy_ball_over_three_phases)
{
	phases(cfg_diloco3, (struct outer_params){.lr = 0.7, .momentum = 0.9, .nesterov = 0,
						  .rescale = 0, .reweight = 0});
}

/* A phase that trained none of a module's paths (dipaco.paths_per_phase): the module of
 * phase 2 after a step in phase 1 (so its momentum is not zero) comes out of an empty job as
 * its own parameters and momentum, bit for bit, as a verifying module of phase 2. */
Test(outer, a_module_no_path_trained_is_kept)
{
	struct fx f;
	float *vals[MAXP] = {0};
	struct mstate s;
	char prev[512], out[512];
	const struct outer_params o = {.lr = 0.7, .momentum = 0.9, .nesterov = 1, .rescale = 1,
				       .reweight = 1};
	const int m = 0, none[1] = {0};

	fx_init(&f, cfg_mixed4);
	write_init_modules(&f);
	module_file(prev, sizeof prev, &f, m, 0);
	mstate_init(&s, &f, m, prev);
	for (int p = 0; p < f.t.npaths; p++) {
		vals[p] = malloc(sizeof *vals[p] * f.g.nparams);
		cr_assert(vals[p]);
		write_path(&f, p, 1, vals[p]);
	}
	module_file(out, sizeof out, &f, m, 1);
	step_and_check(&f, m, 1, prev, out, vals, o, &s);
	module_file(prev, sizeof prev, &f, m, 1);
	module_file(out, sizeof out, &f, m, 2);
	struct outer_job j = {
		.topo = &f.t, .module = m, .phase = 2, .prev_path = prev, .paths = none,
		.npaths = 0, .out_path = out, .config_hash = f.hash, .params = o,
	};
	struct outer_diag d;
	cr_assert_eq(outer_step_module(&j, &d), 0, "%s", err_detail());
	cr_expect_eq(d.npaths, 0);
	cr_expect(d.update_norm == 0.0 && d.grad_norm == 0.0);
	outer_diag_free(&d);
	struct st_file sf;
	cr_assert_eq(module_open(&sf, out, &f.t, m, 2, f.hash, 1), 0, "%s", err_detail());
	st_close(&sf);
	const size_t n = f.t.modules[m].nparams;
	float *a = malloc(sizeof *a * n), *b = malloc(sizeof *b * n);
	cr_assert(a && b);
	for (int mom = 0; mom < 2; mom++) {
		const char *prefix = mom ? MODULE_MOMENTUM_PREFIX : "";
		read_module_values(&f, prev, m, prefix, a, NULL);
		read_module_values(&f, out, m, prefix, b, NULL);
		cr_expect_eq(memcmp(a, b, sizeof *a * n), 0, "%s changed", mom ? "momentum" :
			     "parameters");
		if (mom) {
			int nonzero = 0;
			for (size_t k = 0; k < n; k++)
				nonzero |= a[k] != 0.0f;
			cr_expect(nonzero, "phase 1's momentum is zero: the test shows nothing");
		}
	}
	free(a);
	free(b);
	mstate_free(&s);
	for (int p = 0; p < f.t.npaths; p++)
		free(vals[p]);
	fx_free(&f);
}

/* ==== 4. one path, lr 1, mu 0: the path's tensors bit for bit =============================== */

Test(outer, one_path_lr1_mu0_returns_the_path_bit_for_bit)
{
	struct fx f;
	char prev[512], out[512], pth[512];
	int checked = 0;

	fx_init(&f, cfg_mixed4);
	write_init_modules(&f);
	for (int p = 0; p < f.t.npaths; p++)
		write_path(&f, p, 1, NULL);
	for (int m = 0; m < f.t.nmodules; m++) {
		const struct topo_module *md = &f.t.modules[m];
		if (md->npaths != 1)
			continue;
		for (int rescale = 0; rescale <= 1; rescale++) { /* sqrt(1) = 1 */
			const double a = 1.0;
			const char *pp[1] = {pth};
			module_file(prev, sizeof prev, &f, m, 0);
			fname(out, sizeof out, rescale ? "outr" : "out", 1, md->name);
			path_file(pth, sizeof pth, md->paths[0], 1);
			struct outer_job j = {
				.topo = &f.t, .module = m, .phase = 1, .prev_path = prev,
				.path_ckpts = pp, .weights = &a, .out_path = out,
				.config_hash = f.hash,
				.params = {.lr = 1, .momentum = 0, .nesterov = 1, .rescale = rescale},
			};
			struct outer_diag d;
			int rc = outer_step_module(&j, &d);
			cr_assert_eq(rc, 0, "%s: %s", md->name, err_detail());
			outer_diag_free(&d);

			struct st_file fo, fp;
			cr_assert_eq(st_open(&fo, out, 1), 0);
			cr_assert_eq(st_open(&fp, pth, 1), 0);
			for (int i = 0; i < f.t.layout.n; i++) {
				if (!topo_owns(&f.t, m, i))
					continue;
				const struct tensor *v = &f.t.layout.views[i];
				struct tensor a1, a2;
				cr_assert_eq(tensor_alloc(&a1, DT_F32, v->ndim, v->ne, v->name), 0);
				cr_assert_eq(tensor_alloc(&a2, DT_F32, v->ndim, v->ne, v->name), 0);
				cr_assert_eq(st_read(&fo, v->name, &a1), 0, "%s", err_detail());
				cr_assert_eq(st_read(&fp, v->name, &a2), 0, "%s", err_detail());
				cr_expect(!memcmp(a1.data, a2.data, tensor_nbytes(v)),
					  "module %s (rescale %d), tensor %s: not the path's bits",
					  md->name, rescale, v->name);
				tensor_free(&a1);
				tensor_free(&a2);
			}
			st_close(&fo);
			st_close(&fp);
			checked++;
		}
	}
	cr_expect_eq(checked, 8, "4 per-path modules x rescale on/off");
	fx_free(&f);
}

/* ==== 5. bad input: one clear error naming the file, no output =============================== */

/* Module lower.0 of the DiLoCo topology, phase 1, all three path checkpoints good. */
struct bad {
	struct fx f;
	int m;
	char prev[512], out[512], paths[3][512];
	const char *pp[3];
	double a[3];
	struct outer_job j;
};

static void bad_setup(struct bad *b)
{
	memset(b, 0, sizeof *b);
	fx_init(&b->f, cfg_diloco3);
	write_init_modules(&b->f);
	b->m = topo_find(&b->f.t, "lower.0");
	cr_assert(b->m >= 0);
	module_file(b->prev, sizeof b->prev, &b->f, b->m, 0);
	module_file(b->out, sizeof b->out, &b->f, b->m, 1);
	for (int p = 0; p < 3; p++) {
		write_path(&b->f, p, 1, NULL);
		path_file(b->paths[p], sizeof b->paths[p], p, 1);
		b->pp[p] = b->paths[p];
		b->a[p] = 1.0 / 3;
	}
	b->j = (struct outer_job){
		.topo = &b->f.t, .module = b->m, .phase = 1, .prev_path = b->prev,
		.path_ckpts = b->pp, .weights = b->a, .out_path = b->out,
		.config_hash = b->f.hash,
		.params = {.lr = 0.7, .momentum = 0.9, .nesterov = 1},
	};
}

/* The step fails with `code`, the message names `file`, the detail mentions `word` (when not
 * NULL), and the directory holds exactly what it held before (no output, no temporary). */
static void expect_refused(struct bad *b, int code, const char *file, const char *word)
{
	int before = count_files();
	struct outer_diag d;
	char msg[1024];

	err_clear();
	int rc = outer_step_module(&b->j, &d);
	err_format(msg, sizeof msg, rc);
	cr_expect_eq(rc, code, "got %d (%s: %s), expected %d (%s)", rc, err_name(rc), msg, code,
		     err_name(code));
	cr_expect(strstr(msg, file), "message '%s' does not name '%s'", msg, file);
	if (word)
		cr_expect(strstr(err_detail(), word), "detail '%s' does not mention '%s'",
			  err_detail(), word);
	cr_expect(access(b->out, F_OK) != 0, "output '%s' exists after a failure", b->out);
	cr_expect_eq(count_files(), before, "files left behind in '%s'", dir);
	if (rc == 0)
		outer_diag_free(&d);
	fx_free(&b->f);
}

Test(outer, refuses_a_missing_path_checkpoint)
{
	struct bad b;
	bad_setup(&b);
	cr_assert_eq(unlink(b.paths[1]), 0);
	expect_refused(&b, CORE_ENOTFOUND, b.paths[1], NULL);
}

Test(outer, refuses_a_path_checkpoint_of_another_phase)
{
	struct bad b;
	bad_setup(&b);
	fill_path_values(&b.f, 1, 2);
	save_path(&b.f, &b.f.c, b.paths[1], 2, 1, 300);
	expect_refused(&b, CORE_EFORMAT, b.paths[1], "phase");
}

Test(outer, refuses_the_wrong_path_index)
{
	struct bad b;
	bad_setup(&b);
	fill_path_values(&b.f, 2, 1);
	save_path(&b.f, &b.f.c, b.paths[1], 1, 2, 300); /* path 2's file where path 1's goes */
	expect_refused(&b, CORE_EFORMAT, b.paths[1], "path");
}

Test(outer, refuses_a_path_checkpoint_of_another_config)
{
	struct bad b;
	struct run_config other;
	char h[17];

	bad_setup(&b);
	other = b.f.c;
	other.train.lr *= 2;
	config_hash_all(&other, h);
	cr_assert(strcmp(h, b.f.hash), "train.lr does not change config_hash_all");
	fill_path_values(&b.f, 1, 1);
	save_path(&b.f, &other, b.paths[1], 1, 1, 300);
	expect_refused(&b, CORE_EFORMAT, b.paths[1], "config");
}

Test(outer, refuses_a_truncated_path_checkpoint)
{
	struct bad b;
	struct stat st;

	bad_setup(&b);
	cr_assert_eq(stat(b.paths[2], &st), 0);
	cr_assert_eq(truncate(b.paths[2], st.st_size / 2), 0);
	expect_refused(&b, CORE_ETRUNC, b.paths[2], NULL);
}

/* One byte flipped in the middle of wte.weight (a tensor lower.0 owns): only the tensor's own
 * crc can see it, since the step reads tensor by tensor without whole-file verification. */
Test(outer, refuses_a_corrupted_path_checkpoint)
{
	struct bad b;
	struct st_file sf;

	bad_setup(&b);
	cr_assert_eq(st_open(&sf, b.paths[0], 0), 0);
	const struct st_entry *e = st_find(&sf, "wte.weight");
	cr_assert(e && e->has_crc);
	long pos = (long)(sf.data_offset + e->begin + (e->end - e->begin) / 2);
	st_close(&sf);
	FILE *fp = fopen(b.paths[0], "r+b");
	cr_assert(fp);
	cr_assert_eq(fseek(fp, pos, SEEK_SET), 0);
	int ch = fgetc(fp);
	cr_assert(ch != EOF);
	cr_assert_eq(fseek(fp, pos, SEEK_SET), 0);
	fputc(ch ^ 0x10, fp);
	cr_assert_eq(fclose(fp), 0);
	expect_refused(&b, CORE_ECHECKSUM, b.paths[0], NULL);
}

Test(outer, refuses_a_nan_in_a_module_tensor)
{
	struct bad b;

	bad_setup(&b);
	fill_path_values(&b.f, 2, 1);
	struct tensor *v = gpt2_find(&b.f.g, "h.0.mlp.c_fc.weight");
	cr_assert(v, "no tensor h.0.mlp.c_fc.weight");
	((float *)v->data)[5] = NAN;
	save_path(&b.f, &b.f.c, b.paths[2], 1, 2, 300);
	expect_refused(&b, CORE_ENAN, b.paths[2], "h.0.mlp.c_fc.weight");
}

Test(outer, refuses_a_prev_module_of_the_wrong_phase)
{
	struct bad b;

	bad_setup(&b);
	b.j.phase = 2; /* expects phase 1's module as prev; the file is phase 0's */
	expect_refused(&b, CORE_EFORMAT, b.prev, "phase");
}

Test(outer, refuses_another_modules_file_as_prev)
{
	struct bad b;

	bad_setup(&b);
	module_file(b.prev, sizeof b.prev, &b.f, topo_find(&b.f.t, "upper.0"), 0);
	expect_refused(&b, CORE_EFORMAT, b.prev, "lower.0");
}

/* ==== 6. waiting for path checkpoints ====================================================== */

struct waiter {
	const struct outer_job *j;
	struct outer_diag d;
	int rc;
	char file[512], detail[512];
};

static void *run_step(void *arg)
{
	struct waiter *w = arg;
	w->rc = outer_step_module(w->j, &w->d);
	snprintf(w->file, sizeof w->file, "%s", err_file());
	snprintf(w->detail, sizeof w->detail, "%s", err_detail());
	return NULL;
}

/* Path 1 appears 0.3 s after the step started: same bytes as when it was there all along. */
Test(outer, waits_for_a_path_checkpoint)
{
	struct bad b;
	char direct[512], tmp[512];
	pthread_t th;
	struct waiter w = {0};

	bad_setup(&b);
	/* The run with every file present. */
	fname(direct, sizeof direct, "direct", 1, "lower.0");
	b.j.out_path = direct;
	struct outer_diag d;
	cr_assert_eq(outer_step_module(&b.j, &d), 0, "%s", err_detail());
	outer_diag_free(&d);

	/* Path 1 moved away, then renamed back into place while the step waits. */
	snprintf(tmp, sizeof tmp, "%s/incoming.tmp", dir);
	cr_assert_eq(rename(b.paths[1], tmp), 0);
	b.j.out_path = b.out;
	b.j.wait_seconds = 20;
	w.j = &b.j;
	double t0 = wall();
	cr_assert_eq(pthread_create(&th, NULL, run_step, &w), 0);
	sleep_seconds(0.3);
	cr_assert(access(b.out, F_OK) != 0, "output written before every path was there");
	cr_assert_eq(rename(tmp, b.paths[1]), 0);
	cr_assert_eq(pthread_join(th, NULL), 0);
	double el = wall() - t0;
	cr_assert_eq(w.rc, 0, "'%s': %s", w.file, w.detail);
	cr_expect(w.d.wait_seconds >= 0.2 && w.d.wait_seconds <= el + 0.01,
		  "diag wait_seconds %g (elapsed %g)", w.d.wait_seconds, el);
	outer_diag_free(&w.d);

	size_t n1, n2;
	unsigned char *b1 = tu_slurp(direct, &n1), *b2 = tu_slurp(b.out, &n2);
	cr_expect(n1 == n2 && !memcmp(b1, b2, n1), "the output after waiting differs from the "
		  "output with every file present (%zu vs %zu bytes)", n2, n1);
	free(b1);
	free(b2);
	fx_free(&b.f);
}

Test(outer, gives_up_waiting)
{
	struct bad b;

	bad_setup(&b);
	cr_assert_eq(unlink(b.paths[2]), 0);
	b.j.wait_seconds = 0.2;
	double t0 = wall();
	int before = count_files();
	struct outer_diag d;
	int rc = outer_step_module(&b.j, &d);
	double el = wall() - t0;
	char msg[1024];
	err_format(msg, sizeof msg, rc);
	cr_expect_eq(rc, CORE_ENOTFOUND, "got %d (%s)", rc, msg);
	cr_expect(strstr(msg, b.paths[2]), "message '%s' does not name '%s'", msg, b.paths[2]);
	cr_expect(el >= 0.2 && el < 5, "gave up after %g s, limit 0.2 s", el);
	cr_expect(access(b.out, F_OK) != 0, "output exists after a failure");
	cr_expect_eq(count_files(), before, "files left behind");
	if (rc == 0)
		outer_diag_free(&d);
	fx_free(&b.f);
}
