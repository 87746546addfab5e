/* outer.c - one module's outer step; the formulas are in outer.h.
 *
 * Why this shape: the paths' copies of a module are folded one path at a time into a sum in
 * double, so memory does not grow with the number of paths, and the order of folding is the
 * order of the paths, never the order in which their checkpoints appeared: the result is the
 * same bits whether dpc-outer waited for the paths or found them all done. Each path's delta
 * is kept only while it is folded; the mean pairwise cosine comes from a running sum U of
 * unit deltas: sum over j < i of cos(d_i, d_j) = d_i . U_{i-1} / |d_i|.
 */
#include "dipaco/outer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/progress.h"
#include "dipaco/module.h"
#include "common/banned.h"

void outer_weights(double *a, const double *tokens, int n, int reweight)
{
	double sum = 0.0;
	int ok = reweight;

	for (int i = 0; i < n; i++) {
		if (!(tokens[i] > 0))
			ok = 0;
		sum += tokens[i];
	}
	for (int i = 0; i < n; i++)
		a[i] = ok ? tokens[i] / sum : 1.0 / n;
}

void outer_accumulate(double *acc, const float *prev, const float *theta, double a, size_t n)
{
	for (size_t k = 0; k < n; k++)
		acc[k] += a * ((double)prev[k] - (double)theta[k]);
}

void outer_apply(float *theta_out, float *buf, const float *prev, const double *acc, size_t n,
		 double scale, const struct outer_params *o)
{
	const double mu = o->momentum, lr = o->lr;

	for (size_t k = 0; k < n; k++) {
		double g = scale * acc[k];
		double b = mu * (double)buf[k] + g;
		double upd = o->nesterov ? g + mu * b : b;
		buf[k] = (float)b;
		theta_out[k] = (float)((double)prev[k] - lr * upd);
	}
}

void outer_diag_free(struct outer_diag *d)
{
	free(d->delta_norm);
	d->delta_norm = NULL;
}

/* Wait for a file to appear (rename makes it appear whole), polling: inotify does not see
 * other hosts' writes on a shared filesystem. */
static int wait_for(const char *path, double limit, double *waited)
{
	double t0 = now_seconds(), nap = 0.05;

	while (access(path, F_OK) != 0) {
		if (errno != ENOENT)
			return err_errno(CORE_EIO, path, "cannot access", errno);
		double el = now_seconds() - t0;
		if (limit == 0 || (limit > 0 && el >= limit))
			return err_set(CORE_ENOTFOUND, path, limit == 0 ? "path checkpoint does not "
				       "exist (is its training task done?)" : "path checkpoint did "
				       "not appear within %.0f s", limit);
		struct timespec ts = {(time_t)nap, (long)((nap - (double)(time_t)nap) * 1e9)};
		nanosleep(&ts, NULL);
		if (nap < 1.0)
			nap *= 2;
	}
	*waited += now_seconds() - t0;
	return 0;
}

/* Read the module's tensors (prefix + HF name) from f into dst, laid out view after view. */
static int read_module(struct st_file *f, const struct topology *t, int m, const char *prefix,
		       float *dst, uint64_t *bytes)
{
	size_t off = 0;

	for (int i = 0; i < t->layout.n; i++) {
		if (!topo_owns(t, m, i))
			continue;
		const struct tensor *v = &t->layout.views[i];
		char name[TENSOR_NAME_MAX + 16];
		struct tensor dt;
		snprintf(name, sizeof name, "%s%s", prefix, v->name);
		tensor_view(&dt, DT_F32, v->ndim, v->ne, dst + off, name);
		ERR_FORWARD(st_read(f, name, &dt));
		off += (size_t)tensor_numel(v);
		*bytes += tensor_nbytes(v);
	}
	return 0;
}

/* The first non-finite value of the module's copy in x, as a tensor name, or NULL. */
static const char *nonfinite_tensor(const struct topology *t, int m, const float *x)
{
	size_t off = 0;

	for (int i = 0; i < t->layout.n; i++) {
		if (!topo_owns(t, m, i))
			continue;
		size_t n = (size_t)tensor_numel(&t->layout.views[i]);
		for (size_t k = 0; k < n; k++)
			if (!isfinite(x[off + k]))
				return t->layout.views[i].name;
		off += n;
	}
	return NULL;
}

/* Fold path k: theta (in d) -> acc += a (prev - theta); d becomes the delta in float for the
 * cosine; returns its norm. */
static double fold(double *acc, float *d, const float *U, const float *prev, double a, size_t n,
		   double *dot)
{
	double n2 = 0.0, dp = 0.0;

	for (size_t k = 0; k < n; k++) {
		double dd = (double)prev[k] - (double)d[k];
		acc[k] += a * dd;
		n2 += dd * dd;
		dp += dd * (double)U[k];
		d[k] = (float)dd;
	}
	*dot = dp;
	return sqrt(n2);
}

int outer_step_module(const struct outer_job *j, struct outer_diag *d)
{
	const struct topology *t = j->topo;
	const struct topo_module *md = &t->modules[j->module];
	const size_t n = md->nparams;
	const int P = md->npaths;
	struct st_file pf = {0};
	struct st_writer *w = NULL;
	float *prev = malloc(sizeof *prev * (n ? n : 1));
	float *dl = malloc(sizeof *dl * (n ? n : 1));
	float *U = calloc(n ? n : 1, sizeof *U);
	double *acc = calloc(n ? n : 1, sizeof *acc);
	double t0 = now_seconds(), cos_sum = 0.0;
	int rc, have_prev = 0;

	memset(d, 0, sizeof *d);
	d->npaths = P;
	d->delta_norm = calloc((size_t)P, sizeof *d->delta_norm);
	if (!prev || !dl || !U || !acc || !d->delta_norm) {
		rc = err_set(CORE_ENOMEM, j->out_path, "out of memory for module %s (%zu "
			     "parameters)", md->name, n);
		goto out;
	}
	rc = module_open(&pf, j->prev_path, t, j->module, j->phase - 1, j->config_hash, 0);
	if (rc)
		goto out;
	have_prev = 1;
	rc = read_module(&pf, t, j->module, "", prev, &d->bytes_read);
	if (rc)
		goto out;

	for (int k = 0; k < P; k++) {
		struct st_file f;
		double dot;
		const char *bad;
		rc = wait_for(j->path_ckpts[k], j->wait_seconds, &d->wait_seconds);
		if (!rc)
			rc = pathckpt_open(&f, j->path_ckpts[k], md->paths[k], j->phase,
					   j->config_hash, NULL, NULL, 0);
		if (rc)
			goto out;
		rc = read_module(&f, t, j->module, "", dl, &d->bytes_read);
		st_close(&f);
		if (rc)
			goto out;
		if ((bad = nonfinite_tensor(t, j->module, dl))) {
			rc = err_set(CORE_ENAN, j->path_ckpts[k], "tensor '%s' holds a non-finite "
				     "value", bad);
			goto out;
		}
		double norm = fold(acc, dl, U, prev, j->weights[k], n, &dot);
		d->delta_norm[k] = norm;
		if (norm > 0) {
			cos_sum += dot / norm;
			for (size_t i = 0; i < n; i++)
				U[i] += (float)((double)dl[i] / norm);
		}
	}

	double g2 = 0.0;
	for (size_t i = 0; i < n; i++)
		g2 += acc[i] * acc[i];
	const double scale = j->params.rescale ? sqrt((double)P) : 1.0;
	d->grad_norm = sqrt(g2);
	d->grad_norm_scaled = scale * d->grad_norm;
	d->mean_cosine = P >= 2 ? 2.0 * cos_sum / ((double)P * (P - 1)) : NAN;

	/* dl and U are free now: the old momentum goes into dl, the new parameters into U. */
	rc = read_module(&pf, t, j->module, MODULE_MOMENTUM_PREFIX, dl, &d->bytes_read);
	if (!rc)
		rc = module_writer_open(&w, j->out_path, t, j->module, j->phase, j->config_hash);
	size_t off = 0;
	double u2 = 0.0;
	for (int i = 0; i < t->layout.n && !rc; i++) {
		if (!topo_owns(t, j->module, i))
			continue;
		size_t nv = (size_t)tensor_numel(&t->layout.views[i]);
		outer_apply(U + off, dl + off, prev + off, acc + off, nv, scale, &j->params);
		for (size_t k = 0; k < nv; k++) {
			double du = (double)U[off + k] - (double)prev[off + k];
			u2 += du * du;
		}
		rc = st_writer_put(w, U + off, sizeof(float) * nv);
		if (!rc)
			rc = st_writer_put(w, dl + off, sizeof(float) * nv);
		off += nv;
	}
	d->update_norm = sqrt(u2);
	if (w) {
		if (rc)
			st_writer_abort(w);
		else
			rc = st_writer_commit(w);
	}
	d->seconds = now_seconds() - t0;
out:
	if (have_prev)
		st_close(&pf);
	free(prev);
	free(dl);
	free(U);
	free(acc);
	if (rc)
		outer_diag_free(d);
	return rc;
}
