/* routesplit.c - shards by a router, and the routing report; see routesplit.h. */
#include "route/routesplit.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/rng.h"
#include "route/clusterstats.h"
#include "route/lm.h"
#include "route/route.h"
#include "route/routefile.h"

#include "common/banned.h"

#define BASELINE_DRAWS 20

/* The features of tf the router needs, checked against it. */
static int get_features(const struct tokfile *tf, const struct router *r, const char *rpath,
			const struct route_split_opts *o, struct features *f)
{
	if (o->features) {
		ERR_FORWARD(features_read(o->features, f));
		int rc = features_check_corpus(f, o->features, tf);
		if (!rc)
			rc = route_check_recipe(&r->r, rpath, &f->r, o->features);
		if (!rc && f->dim != r->dim)
			rc = err_set(CORE_ESHAPE, rpath, "takes %d features, '%s' has %d", r->dim,
				     o->features, f->dim);
		if (rc)
			features_free(f);
		return rc;
	}
	if (!o->model)
		return err_set(CORE_EUSAGE, NULL, "routing needs the features (--features) or the "
			       "base checkpoint to compute them (--model)");
	struct lm base;
	ERR_FORWARD(lm_open(&base, o->model, o->be, o->batch > 0 ? o->batch : 64));
	int rc = 0;
	if (strcmp(base.digest, r->r.digest))
		rc = err_set(CORE_EFORMAT, rpath, "was fitted on features of checkpoint %s, but "
			     "'%s' is %s", r->r.digest, o->model, base.digest);
	else if (base.g.cfg.n_embd != r->dim)
		rc = err_set(CORE_ESHAPE, rpath, "takes %d features, '%s' makes %d", r->dim,
			     o->model, base.g.cfg.n_embd);
	if (!rc)
		rc = route_features(&base, tf, r->r.prefix, r->r.layer, f, NULL, NULL);
	lm_close(&base);
	return rc;
}

/* Each document's label: the string under key in its metadata; labels are numbered in order
 * of first appearance into names. 0 labels when key is absent from some document. */
static int doc_labels(const struct tokfile *tf, const char *key, uint32_t *lab, json_t *names)
{
	for (uint64_t d = 0; d < tf->ndocs; d++) {
		size_t len;
		const char *m = tokfile_doc_meta(tf, d, &len);
		json_error_t je;
		json_t *o = json_loadb(m, len, 0, &je);
		json_t *v = o ? json_object_get(o, key) : NULL;
		if (!json_is_string(v)) {
			json_decref(o);
			json_array_clear(names);
			return 0;
		}
		size_t i, n = json_array_size(names);
		for (i = 0; i < n; i++)
			if (json_equal(json_array_get(names, i), v))
				break;
		if (i == n)
			json_array_append(names, v);
		lab[d] = (uint32_t)i;
		json_decref(o);
	}
	return (int)json_array_size(names);
}

/* The documents' labels under the key asked for (want), else "category", else "genre": their
 * number G (0: none) into lab, names and *key. */
static int find_labels(const struct tokfile *tf, const char *want, uint32_t *lab, json_t *names,
		       const char **key)
{
	const char *keys[] = {want, "category", "genre"};
	int G = 0;

	for (int i = want ? 0 : 1; i < 3 && !G; i++) {
		G = doc_labels(tf, keys[i], lab, names);
		*key = keys[i];
		if (want)
			break;
	}
	return G;
}

/* The label-by-shard report of the first choices, for G > 0 labels lab[] named names. */
static json_t *label_report(const struct tokfile *tf, const uint32_t *first, int P,
			    const uint32_t *lab, int G, json_t *names, const char *key)
{
	uint32_t *shuf = malloc(tf->ndocs * sizeof *shuf + 1);
	json_t *out = NULL;
	struct cluster_stats cs = {0};
	if (G > 0 && shuf && clusterstats_compute(first, lab, tf->ndocs, P, G, &cs) == 0) {
		/* random shards of the same sizes: the first choices shuffled */
		double sp = 0, sp2 = 0, sn = 0, sn2 = 0;
		uint64_t *tab = malloc((size_t)G * (size_t)P * sizeof *tab);
		for (int r = 0; tab && r < BASELINE_DRAWS; r++) {
			memcpy(shuf, first, tf->ndocs * sizeof *shuf);
			for (uint64_t i = tf->ndocs; i > 1; i--) {
				uint64_t j = rng_below((uint64_t)r, RNG_STREAM_BASELINE,
						       (uint64_t)r * tf->ndocs + i, i);
				uint32_t t = shuf[i - 1];
				shuf[i - 1] = shuf[j];
				shuf[j] = t;
			}
			clusterstats_table(shuf, lab, tf->ndocs, P, G, tab);
			double p = clusterstats_purity(tab, G, P), n = clusterstats_nmi(tab, G, P);
			sp += p, sp2 += p * p, sn += n, sn2 += n * n;
		}
		free(tab);
		const double k = BASELINE_DRAWS;
		json_t *table = json_array();
		for (int g = 0; g < G; g++) {
			json_t *row = json_array();
			for (int s = 0; s < P; s++)
				json_array_append_new(row, json_integer(
					(json_int_t)cs.table[(size_t)g * (size_t)P + (size_t)s]));
			json_array_append_new(table, row);
		}
		out = json_pack("{s:s,s:O,s:o,s:f,s:f,s:f,s:{s:i,s:f,s:f,s:f,s:f}}", "label", key,
				"labels", names, "table", table, "purity", cs.purity, "nmi", cs.nmi,
				"ari", cs.ari, "random_shards", "draws", BASELINE_DRAWS,
				"purity_mean", sp / k, "purity_sd",
				sqrt(fmax(0, sp2 / k - (sp / k) * (sp / k))), "nmi_mean", sn / k,
				"nmi_sd", sqrt(fmax(0, sn2 / k - (sn / k) * (sn / k))));
		clusterstats_free(&cs);
	}
	free(shuf);
	return out;
}

int route_split(const char *input, const struct route_split_opts *o,
		struct shard_split_result *res, json_t **report)
{
	struct tokfile tf;
	struct router r;
	struct features f = {0};
	uint32_t *assign = NULL;
	struct shard_split_opts so = o->split;
	const int top = so.top ? so.top : 1;
	int rc;

	*report = NULL;
	memset(res, 0, sizeof *res);
	ERR_FORWARD(tokfile_open(&tf, input));
	if ((rc = router_read(o->router, &r)) < 0) {
		tokfile_close(&tf);
		return rc;
	}
	if (r.kind == ROUTER_WINDOW)
		rc = err_set(CORE_EFORMAT, o->router, "is a window router (for evaluation); "
			     "shards take a document router (kmeans or logreg)");
	else if (o->want_paths > 0 && r.paths != o->want_paths)
		rc = err_set(CORE_EUSAGE, o->router, "routes to %d path%s, the run has %d", r.paths,
			     r.paths == 1 ? "" : "s", o->want_paths);
	else if (top > r.paths)
		rc = err_set(CORE_EUSAGE, o->router, "routes to %d path%s: no top %d", r.paths,
			     r.paths == 1 ? "" : "s", top);
	if (!rc)
		rc = get_features(&tf, &r, o->router, o, &f);
	if (!rc && !(assign = malloc(tf.ndocs * (size_t)top * sizeof *assign + 1)))
		rc = err_set(CORE_ENOMEM, input, "out of memory");
	for (uint64_t d = 0; !rc && d < tf.ndocs; d++)
		router_route(&r, f.x + d * (uint64_t)f.dim, top, assign + d * (uint64_t)top);
	/* the labels, read once; one asked for must be there, said before anything is written */
	uint32_t *lab = rc ? NULL : malloc(tf.ndocs * sizeof *lab + 1);
	json_t *names = json_array();
	const char *key = NULL;
	int G = 0;
	if (!rc && (!lab || !names))
		rc = err_set(CORE_ENOMEM, input, "out of memory");
	if (!rc)
		G = find_labels(&tf, o->label, lab, names, &key);
	if (!rc && o->label && !G)
		rc = err_set(CORE_EFORMAT, input, "--label %.64s: not a string field of every "
			     "document's metadata", o->label);
	so.paths = (uint32_t)r.paths;
	so.top = top;
	so.router = o->router;
	if (!rc)
		rc = shard_split_write(&tf, assign, router_kind_name(r.kind), &so, res);
	if (!rc) {
		json_t *shards = json_array(), *pairs = json_array();
		for (int s = 0; s < r.paths; s++)
			json_array_append_new(shards, json_pack("{s:I,s:I}", "docs",
				(json_int_t)res->shard[s].docs, "tokens",
				(json_int_t)res->shard[s].tokens));
		if (top == 2) {
			uint64_t *pc = calloc((size_t)r.paths * (size_t)r.paths, sizeof *pc);
			for (uint64_t d = 0; pc && d < tf.ndocs; d++) {
				uint32_t a = assign[2 * d], b = assign[2 * d + 1];
				pc[(a < b ? a : b) * (uint64_t)r.paths + (a < b ? b : a)]++;
			}
			for (int a = 0; pc && a < r.paths; a++)
				for (int b = a + 1; b < r.paths; b++)
					if (pc[(size_t)a * (size_t)r.paths + (size_t)b])
						json_array_append_new(pairs, json_pack(
							"{s:[i,i],s:I}", "shards", a, b, "docs",
							(json_int_t)pc[(size_t)a * (size_t)r.paths +
								       (size_t)b]));
			free(pc);
		}
		uint32_t *first = malloc(tf.ndocs * sizeof *first + 1);
		for (uint64_t d = 0; first && d < tf.ndocs; d++)
			first[d] = assign[d * (uint64_t)top];
		json_t *labels = first && G ? label_report(&tf, first, r.paths, lab, G, names, key)
					    : NULL;
		free(first);
		*report = json_pack("{s:s,s:s,s:i,s:i,s:I,s:o,s:o,s:o}", "router", o->router, "kind",
				    router_kind_name(r.kind), "paths", r.paths, "top", top, "docs",
				    (json_int_t)tf.ndocs, "shards", shards, "pairs", pairs,
				    "labels", labels ? labels : json_null());
	}
	free(lab);
	json_decref(names);
	free(assign);
	features_free(&f);
	router_free(&r);
	tokfile_close(&tf);
	return rc;
}
