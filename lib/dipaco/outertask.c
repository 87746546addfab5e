/* outertask.c - the outer tasks of a run directory (outertask.h). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/jsonfmt.h"
#include "dipaco/outer.h"
#include "dipaco/outertask.h"
#include "io/atomicio.h"
#include "io/safetensors.h"

#include "common/banned.h"

static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

int outertask_init(const struct rundir *r, const struct module_init *src, const char *label,
		   int *written)
{
	char path[RUNDIR_PATH_MAX];

	*written = 0;
	ERR_FORWARD(rundir_make_phase(r, 0));
	for (int m = 0; m < r->topo.nmodules; m++) {
		struct st_file f;
		ERR_FORWARD(rundir_module(r, 0, m, ".safetensors", path, sizeof path));
		if (access(path, F_OK) == 0) {
			ERR_FORWARD(module_open(&f, path, &r->topo, m, 0, r->config_hash, 1));
			int rc = module_check_init(&f, label);
			st_close(&f);
			if (rc)
				return rc;
			continue;
		}
		ERR_FORWARD(module_write_init(path, &r->topo, m, src, label, r->config_hash));
		(*written)++;
	}
	return 0;
}

/* The diagnostics line of a step: written to NAME.json before the module is committed, so a
 * module never exists without its diagnostics (a step killed between the two is redone and
 * rewrites them). The line is kept for the caller. */
struct diag_ctx {
	const struct rundir *r;
	long t;
	int m;
	const int *paths; /* the paths folded (those phase t trained) */
	int npaths;
	const double *weights;
	const char *path;
	char *line;
};

static int write_diag(void *ctx, const struct outer_diag *d)
{
	struct diag_ctx *x = ctx;
	const struct topology *topo = &x->r->topo;
	const struct topo_module *md = &topo->modules[x->m];
	json_t *norms = json_array(), *users = json_array(), *ws = json_array();

	for (int k = 0; k < x->npaths; k++) {
		json_array_append_new(norms, num(d->delta_norm[k]));
		json_array_append_new(users, json_integer(x->paths[k]));
		json_array_append_new(ws, num(x->weights[k]));
	}
	json_t *j = json_pack(
		"{s:s, s:I, s:s, s:s, s:I, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:I, s:o}",
		"event", "outer", "phase", (json_int_t)x->t, "module", md->name, "level",
		topo->levels[md->level].name, "params", (json_int_t)md->nparams, "paths", users,
		"weights", ws, "delta_norms", norms, "outer_grad_norm", num(d->grad_norm),
		"outer_grad_norm_rescaled", num(d->grad_norm_scaled), "update_norm",
		num(d->update_norm), "mean_pairwise_cosine", num(d->mean_cosine), "seconds",
		num(d->seconds), "wait_seconds", num(d->wait_seconds), "read_seconds",
		num(d->read_seconds), "bytes_read", (json_int_t)d->bytes_read, "read_mb_per_s",
		num(d->read_seconds > 0 ? (double)d->bytes_read / 1e6 / d->read_seconds : NAN));
	char *line = j ? json_dumps(j, JSON_COMPACT | CORE_JSON_REAL) : NULL;
	json_decref(j);
	size_t n = line ? strlen(line) : 0;
	x->line = line ? malloc(n + 2) : NULL;
	if (!x->line) {
		free(line);
		return err_set(CORE_ENOMEM, NULL, "out of memory");
	}
	memcpy(x->line, line, n);
	memcpy(x->line + n, "\n", 2);
	free(line);
	return file_write_atomic(x->path, x->line, n + 1);
}

int outertask_step(const struct rundir *r, long t, int m, double wait, int threads,
		   struct outer_task_result *res)
{
	const struct topology *topo = &r->topo;
	const struct topo_module *md = &topo->modules[m];
	const struct dipaco_config *dc = &r->cfg.dipaco;
	char out[RUNDIR_PATH_MAX], prev[RUNDIR_PATH_MAX], diag_path[RUNDIR_PATH_MAX];
	char **ckpts = calloc((size_t)md->npaths, sizeof *ckpts);
	double *tokens = calloc((size_t)md->npaths, sizeof *tokens);
	double *weights = calloc((size_t)md->npaths, sizeof *weights);
	int *ids = calloc((size_t)md->npaths, sizeof *ids), n = 0;
	struct outer_diag d = {0};
	int rc = 0;

	*res = (struct outer_task_result){0};
	if (!ckpts || !tokens || !weights || !ids) {
		rc = err_set(CORE_ENOMEM, NULL, "out of memory");
		goto out;
	}
	rc = rundir_module(r, t, m, ".safetensors", out, sizeof out);
	if (!rc)
		rc = rundir_module(r, t, m, ".json", diag_path, sizeof diag_path);
	if (!rc)
		rc = rundir_module(r, t - 1, m, ".safetensors", prev, sizeof prev);
	if (rc)
		goto out;
	/* What a killed attempt at this step left, whether or not it got as far as the module. */
	rundir_clean_stale(out);
	rundir_clean_stale(diag_path);
	if (access(out, F_OK) == 0) {
		struct st_file f;
		rc = module_open(&f, out, topo, m, t, r->config_hash, 1);
		if (rc) {
			char detail[400];
			snprintf(detail, sizeof detail, "%s", err_detail());
			rc = err_set(rc, out, "exists but is not this step's output (%s); remove it "
				     "to redo the step", detail);
			goto out;
		}
		st_close(&f);
		res->skipped = 1;
		goto out;
	}
	/* The paths of m that phase t trained (all of them without dipaco.paths_per_phase),
	 * their weights renormalised over them. */
	for (int k = 0; k < md->npaths; k++) {
		if (!pathsample_trains(&r->sample, t, md->paths[k]))
			continue;
		ids[n] = md->paths[k];
		ckpts[n] = malloc(RUNDIR_PATH_MAX);
		if (!ckpts[n]) {
			rc = err_set(CORE_ENOMEM, NULL, "out of memory");
			goto out;
		}
		rc = rundir_path_ckpt(r, t, ids[n], ".safetensors", ckpts[n], RUNDIR_PATH_MAX);
		if (rc)
			goto out;
		tokens[n] = r->have_shards ? r->shard_tokens[ids[n]] : 0;
		n++;
	}
	outer_weights(weights, tokens, n, dc->reweight && r->have_shards);
	if (dc->reweight && !r->have_shards) {
		rc = err_set(CORE_ENOTFOUND, r->dir, "dipaco.reweight needs the shard manifest "
			     "(shards/shards.json, or phase-TTTT/shards/shards.json after a "
			     "re-sharding)");
		goto out;
	}
	rc = rundir_make_phase(r, t);
	if (rc)
		goto out;
	struct outer_job j = {
		.topo = topo, .module = m, .phase = t, .prev_path = prev, .paths = ids,
		.npaths = n, .path_ckpts = (const char *const *)ckpts, .weights = weights, .out_path = out,
		.config_hash = r->config_hash,
		.params = {dc->outer_lr, dc->outer_momentum, dc->nesterov, dc->rescale,
			   dc->reweight},
		.wait_seconds = wait, .threads = threads,
	};
	struct diag_ctx dx = {r, t, m, ids, n, weights, diag_path, NULL};
	j.before_commit = write_diag;
	j.ctx = &dx;
	rc = outer_step_module(&j, &d);
	if (rc == 0)
		res->line = dx.line;
	else
		free(dx.line);
out:
	outer_diag_free(&d);
	for (int k = 0; ckpts && k < md->npaths; k++)
		free(ckpts[k]);
	free(ckpts);
	free(ids);
	free(tokens);
	free(weights);
	return rc;
}

