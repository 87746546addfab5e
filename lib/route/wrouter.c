/* wrouter.c - the transformer window router: labels, fitting, opening (wrouter.h). */
#include "route/wrouter.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/progress.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "model/gpt2.h"
#include "model/train.h"
#include "common/banned.h"

void wrouter_labels(const struct scores *s, const struct tokfile *tf, int L, int32_t *labels)
{
	for (uint64_t d = 0; d < tf->ndocs; d++) {
		const uint64_t e = tf->offsets[d + 1];
		for (uint64_t k = tf->offsets[d]; k < e; k++) {
			const uint64_t end = k + (uint64_t)L < e ? k + (uint64_t)L : e;
			labels[k] = (int32_t)scores_best_path(s, k, end, NULL);
		}
	}
}

/* The largest of row [P] (the lower index on ties). */
static uint32_t argmax(const float *row, int P)
{
	uint32_t best = 0;
	for (int p = 1; p < P; p++)
		if (row[p] > row[best])
			best = (uint32_t)p;
	return best;
}

/* The router's path at every boundary of document d into out [router_boundaries]: the argmax
 * of its output at position b - 1, reading the T = seq_len tokens before b at most. One
 * forward over the document's first T tokens serves every boundary within them; the later
 * boundaries' windows (the T tokens before each) go B to a forward, B <= the model's batch.
 * logits: B * T * paths floats, in: B * T ints. */
static int doc_paths(struct gpt2 *g, int B, const struct tokfile *tf, uint64_t d, int prefix,
		     int W, float *logits, int32_t *in, uint32_t *out, uint64_t *forwarded)
{
	const uint64_t T = (uint64_t)g->cfg.seq_len;
	const int P = model_n_out(&g->cfg);
	const uint64_t s0 = tf->offsets[d], len = tf->offsets[d + 1] - s0;
	const uint64_t nb = router_boundaries(len, prefix, W);
	uint64_t m = 0;

	if (nb && router_boundary(prefix, W, 0) <= T) {
		const uint64_t n = len < T ? len : T;
		for (uint64_t j = 0; j < n; j++)
			in[j] = (int32_t)tokfile_token(tf, s0 + j);
		ERR_FORWARD(gpt2_forward_logits(g, in, 1, (int)n, logits));
		*forwarded += n;
		for (uint64_t b; m < nb && (b = router_boundary(prefix, W, m)) <= T; m++)
			out[m] = argmax(logits + (b - 1) * (uint64_t)P, P);
	}
	while (m < nb) {
		int k = 0;
		for (; k < B && m + (uint64_t)k < nb; k++) {
			const uint64_t from = router_boundary(prefix, W, m + (uint64_t)k) - T;
			for (uint64_t j = 0; j < T; j++)
				in[(uint64_t)k * T + j] = (int32_t)tokfile_token(tf, s0 + from + j);
		}
		ERR_FORWARD(gpt2_forward_logits(g, in, k, (int)T, logits));
		*forwarded += (uint64_t)k * T;
		for (int i = 0; i < k; i++)
			out[m + (uint64_t)i] = argmax(logits + ((uint64_t)i * T + T - 1) * (uint64_t)P, P);
		m += (uint64_t)k;
	}
	return 0;
}

/* The fraction of tf's boundaries at which the router's path is the label (L-token
 * window after the boundary), and how many boundaries there are. */
static int boundary_accuracy(struct gpt2 *g, const struct tokfile *tf, const int32_t *labels,
			     int prefix, int W, double *acc, uint64_t *n)
{
	const int T = g->cfg.seq_len, P = model_n_out(&g->cfg);
	uint64_t maxb = 0, ok = 0, fwd = 0;
	for (uint64_t d = 0; d < tf->ndocs; d++) {
		uint64_t nb = router_boundaries(tf->offsets[d + 1] - tf->offsets[d], prefix, W);
		maxb = nb > maxb ? nb : maxb;
	}
	const int B = g->B;
	float *logits = malloc(sizeof *logits * (size_t)B * (size_t)T * (size_t)P);
	int32_t *in = malloc(sizeof *in * (size_t)B * (size_t)T);
	uint32_t *paths = malloc(sizeof *paths * (maxb + 1));
	int rc = logits && in && paths ? 0 : err_set(CORE_ENOMEM, tf->path, "out of memory");
	*n = 0;
	for (uint64_t d = 0; d < tf->ndocs && !rc; d++) {
		const uint64_t s0 = tf->offsets[d];
		const uint64_t nb = router_boundaries(tf->offsets[d + 1] - s0, prefix, W);
		if ((rc = doc_paths(g, B, tf, d, prefix, W, logits, in, paths, &fwd)) < 0)
			break;
		for (uint64_t m = 0; m < nb; m++) {
			const uint64_t b = router_boundary(prefix, W, m);
			ok += paths[m] == (uint32_t)labels[s0 + b];
		}
		*n += nb;
	}
	*acc = *n ? (double)ok / (double)*n : NAN;
	free(logits);
	free(in);
	free(paths);
	return rc;
}

/* The router's model: base's config with a head over the paths, initialised from the seed,
 * then every tensor but lm_head read from the base. */
static int router_model(const char *base_path, int paths, const struct train_config *tc,
			struct backend *be, struct gpt2 *g, struct model_config *mc)
{
	struct ckpt_info info;
	ERR_FORWARD(ckpt_info(base_path, &info));
	if (info.model.n_out)
		return err_set(CORE_EUSAGE, base_path, "is a window router, not a base model");
	*mc = info.model;
	mc->n_out = paths;
	ERR_FORWARD(gpt2_create(g, mc, tc->batch_size, mc->seq_len, be));
	int rc = gpt2_init_params(g, tc->seed);
	if (!rc)
		rc = ckpt_load(base_path, g, CKPT_BODY, NULL);
	if (rc)
		gpt2_free(g);
	return rc;
}

static json_t *label_counts(const int32_t *labels, uint64_t n, int paths)
{
	uint64_t *c = calloc((size_t)paths, sizeof *c);
	json_t *a = json_array();
	if (!c || !a) {
		free(c);
		json_decref(a);
		return NULL;
	}
	for (uint64_t k = 0; k < n; k++)
		c[labels[k]]++;
	for (int p = 0; p < paths; p++)
		json_array_append_new(a, json_integer((json_int_t)c[p]));
	free(c);
	return a;
}

/* The training loop: o->train.steps steps of train_step_on, the first and last losses. */
static int fit_steps(struct gpt2 *g, const struct tokfile *tf, const int32_t *labels,
		     const struct wrouter_fit_opts *o, double *first, double *last)
{
	const struct train_config *tc = &o->train;
	const size_t n = (size_t)tc->batch_size * (size_t)g->cfg.seq_len;
	int32_t *in = malloc(sizeof *in * n), *tg = malloc(sizeof *tg * n);
	struct progress pr;
	int rc = in && tg ? 0 : err_set(CORE_ENOMEM, NULL, "out of memory for the batch");

	*first = *last = NAN;
	progress_init(&pr, "fit", tc->steps);
	pr.unit = "steps";
	pr.enabled = pr.enabled && o->progress;
	for (long st = 0; st < tc->steps && !rc; st++) {
		float loss, norm;
		double lr;
		char extra[64];
		rc = train_step_on(g, tc, tf, labels, st, 0, in, tg, &loss, &norm, &lr);
		if (rc)
			break;
		if (st == 0)
			*first = loss;
		*last = loss;
		snprintf(extra, sizeof extra, "step %ld/%ld  loss %.4f", st + 1, tc->steps, loss);
		progress_update(&pr, st + 1, extra);
	}
	progress_done(&pr);
	free(in);
	free(tg);
	return rc;
}

static int save_router(const char *out, const struct gpt2 *g, const struct model_config *mc,
		       const struct wrouter_fit_opts *o, const struct scores *s,
		       const char *digest, const char *report)
{
	struct run_config rc;
	char sw[16], sl[16], spre[16];
	config_defaults(&rc);
	rc.model = *mc;
	rc.model.n_out = 0; /* the config's model is the base's; ckpt_save writes g's n_out */
	rc.train = o->train;
	snprintf(sw, sizeof sw, "%d", o->window);
	snprintf(sl, sizeof sl, "%d", o->target_len);
	snprintf(spre, sizeof spre, "%d", s->prefix);
	const struct st_kv extra[] = {
		{"router", WROUTER_KIND}, {"window", sw}, {"target_len", sl},
		{"prefix", spre}, {"base_digest", digest}, {"report", report},
	};
	return ckpt_save(out, g, &rc, o->train.steps, 0, extra, (int)(sizeof extra / sizeof extra[0]));
}

int wrouter_fit(const char *base_path, const struct scores *s, const struct tokfile *tf,
		const struct wrouter_fit_opts *o, struct backend *be, const char *out,
		char **report)
{
	struct gpt2 g;
	struct model_config mc;
	char digest[LM_DIGEST_CHARS + 1];
	double first, last, acc;
	uint64_t nb;
	json_t *j = NULL;

	*report = NULL;
	if (o->window < 1 || o->target_len < 1)
		return err_set(CORE_EUSAGE, NULL, "window %d and target length %d must be >= 1",
			       o->window, o->target_len);
	ERR_FORWARD(ckpt_digest(base_path, digest));
	ERR_FORWARD(router_model(base_path, s->paths, &o->train, be, &g, &mc));
	int32_t *labels = malloc(sizeof *labels * (tf->ntokens + 1));
	int rc = labels ? 0 : err_set(CORE_ENOMEM, tf->path, "out of memory for the labels");
	if (!rc)
		rc = train_check_data(tf, &mc);
	if (!rc) {
		wrouter_labels(s, tf, o->target_len, labels);
		labels[tf->ntokens] = 0;
		rc = fit_steps(&g, tf, labels, o, &first, &last);
	}
	if (!rc)
		rc = boundary_accuracy(&g, tf, labels, s->prefix, o->window, &acc, &nb);
	if (!rc) {
		j = json_pack("{s:I,s:i,s:i,s:f,s:f,s:I,s:f,s:o}", "steps",
			      (json_int_t)o->train.steps, "window", o->window, "target_len",
			      o->target_len, "first_loss", first, "last_loss", last, "boundaries",
			      (json_int_t)nb, "boundary_accuracy", isfinite(acc) ? acc : -1.0,
			      "label_counts", label_counts(labels, tf->ntokens, s->paths));
		if (!j || !(*report = json_dumps(j, JSON_COMPACT)))
			rc = err_set(CORE_ENOMEM, NULL, "cannot build the report");
	}
	if (!rc)
		rc = save_router(out, &g, &mc, o, s, digest, *report);
	json_decref(j);
	free(labels);
	gpt2_free(&g);
	if (rc) {
		free(*report);
		*report = NULL;
	}
	return rc;
}

int wrouter_is(const char *path)
{
	struct st_file f;
	ERR_FORWARD(st_open(&f, path, 0));
	const char *fmt = st_meta(&f, "format"), *kind = st_meta(&f, "router");
	int is = fmt && !strcmp(fmt, CKPT_FORMAT) && kind && !strcmp(kind, WROUTER_KIND);
	st_close(&f);
	return is;
}

static int read_meta(struct wrouter *w, const char *path)
{
	struct st_file f;
	long v[4];
	static const char *const keys[4] = {"n_out", "window", "target_len", "prefix"};
	ERR_FORWARD(st_open(&f, path, 0));
	int rc = 0;
	for (int i = 0; i < 4 && !rc; i++)
		rc = st_meta_long(&f, keys[i], i == 3 ? 0 : 1, i == 0 ? ROUTE_MAX_PATHS : INT32_MAX,
				  &v[i]);
	const char *dg = st_meta(&f, "base_digest"), *rep = st_meta(&f, "report");
	if (!rc && (!dg || strlen(dg) != LM_DIGEST_CHARS))
		rc = err_set(CORE_EFORMAT, path, "no base_digest of %d hex digits",
			     LM_DIGEST_CHARS);
	if (!rc) {
		w->paths = (int)v[0];
		w->window = (int)v[1];
		w->target_len = (int)v[2];
		w->prefix = (int)v[3];
		snprintf(w->base_digest, sizeof w->base_digest, "%s", dg);
		if (rep && !(w->report = strdup(rep)))
			rc = err_set(CORE_ENOMEM, path, "out of memory");
	}
	st_close(&f);
	return rc;
}

int wrouter_open(struct wrouter *w, const char *path, struct backend *be)
{
	struct ckpt_info info;
	memset(w, 0, sizeof *w);
	int rc = wrouter_is(path);
	if (rc == 0)
		return err_set(CORE_EFORMAT, path, "not a transformer window router");
	ERR_FORWARD(rc < 0 ? rc : 0);
	ERR_FORWARD(read_meta(w, path));
	rc = ckpt_info(path, &info);
	if (!rc && info.model.n_out != w->paths)
		rc = err_set(CORE_EFORMAT, path, "a head over %d classes for %d paths",
			     model_n_out(&info.model), w->paths);
	if (!rc)
		rc = gpt2_create_forward(&w->g, &info.model, WROUTER_BATCH, info.model.seq_len, be);
	if (!rc)
		rc = ckpt_load(path, &w->g, CKPT_PARAMS, NULL);
	const size_t T = (size_t)info.model.seq_len;
	if (!rc) {
		w->logits = malloc(sizeof *w->logits * WROUTER_BATCH * T * (size_t)w->paths);
		w->in = malloc(sizeof *w->in * WROUTER_BATCH * T);
		if (!w->logits || !w->in)
			rc = err_set(CORE_ENOMEM, path, "out of memory");
	}
	if (rc)
		wrouter_close(w);
	return rc;
}

int wrouter_doc_paths(struct wrouter *w, const struct tokfile *tf, uint64_t d, int prefix,
		      int W, uint32_t *out, uint64_t *forwarded)
{
	return doc_paths(&w->g, WROUTER_BATCH, tf, d, prefix, W, w->logits, w->in, out, forwarded);
}

int wrouter_text_path(struct wrouter *w, const uint32_t *tok, uint64_t b, uint32_t *path)
{
	const uint64_t T = (uint64_t)w->g.cfg.seq_len, from = b > T ? b - T : 0;
	if (b < 1)
		return err_set(CORE_EUSAGE, NULL, "a window router reads the text before its "
			       "boundary: none before position 0");
	for (uint64_t j = from; j < b; j++)
		w->in[j - from] = (int32_t)tok[j];
	ERR_FORWARD(gpt2_forward_logits(&w->g, w->in, 1, (int)(b - from), w->logits));
	*path = argmax(w->logits + (b - from - 1) * (uint64_t)w->paths, w->paths);
	return 0;
}

int wrouter_cached_path(struct wrouter *w, struct gpt2_decoder *dec, const int32_t *tok,
			uint64_t b, uint32_t *path)
{
	if (b < 1 || b > (uint64_t)w->g.cfg.seq_len || (uint64_t)dec->pos >= b)
		return err_set(CORE_EUSAGE, NULL, "the router's cache holds %d positions: it "
			       "cannot give the path at boundary %llu", dec->pos,
			       (unsigned long long)b);
	while ((uint64_t)dec->pos < b)
		ERR_FORWARD(gpt2_decoder_step(dec, tok[dec->pos],
					      (uint64_t)dec->pos + 1 == b ? w->logits : NULL));
	*path = argmax(w->logits, w->paths);
	return 0;
}

void wrouter_close(struct wrouter *w)
{
	gpt2_free(&w->g);
	free(w->report);
	free(w->logits);
	free(w->in);
	memset(w, 0, sizeof *w);
}

int wrouter_open_window(const char *path, struct backend *be, struct router *r)
{
	int is = wrouter_is(path);
	if (is < 0)
		return is;
	if (!is) {
		ERR_FORWARD(router_read(path, r));
		if (r->kind == ROUTER_WINDOW)
			return 0;
		const char *kind = router_kind_name(r->kind);
		router_free(r);
		return err_set(CORE_EFORMAT, path, "is a %s router, not a window router", kind);
	}
	memset(r, 0, sizeof *r);
	struct wrouter *w = calloc(1, sizeof *w);
	if (!w)
		return err_set(CORE_ENOMEM, path, "out of memory");
	int rc = wrouter_open(w, path, be);
	if (rc < 0) {
		free(w);
		return rc;
	}
	*r = (struct router){.kind = ROUTER_TRANSFORMER, .paths = w->paths, .window = w->window,
			     .r = {.layer = -1, .prefix = w->prefix}, .tr = w,
			     .tr_close = wrouter_close};
	memcpy(r->r.digest, w->base_digest, sizeof r->r.digest);
	r->report = w->report; /* the router's now */
	w->report = NULL;
	return 0;
}
