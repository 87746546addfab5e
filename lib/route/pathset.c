/* pathset.c - the paths a routing command reads (pathset.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "dipaco/pathtrain.h"
#include "route/pathset.h"

#include "common/banned.h"

/* Each path's phase of lowest loss on its shard's held-out tail. */
static int pathset_early(struct pathset *ps, struct backend *be)
{
	const long T = ps->phase;
	double *loss = malloc(sizeof *loss * (size_t)T);
	int rc = 0;

	ps->best = calloc((size_t)ps->r.topo.npaths, sizeof *ps->best);
	if (!loss || !ps->best) {
		free(loss);
		return err_set(CORE_ENOMEM, NULL, "out of memory for early stopping");
	}
	for (int p = 0; p < ps->r.topo.npaths && !rc; p++) {
		rc = pathtrain_best_phase(&ps->r, T, p, be, loss, &ps->best[p]);
		if (!rc && ps->on_best)
			ps->on_best(ps->ctx, p, ps->best[p], loss, T);
	}
	free(loss);
	return rc;
}

int pathset_open(struct pathset *ps, struct backend *be, int B, const char *cmd)
{
	int n;
	if (!!ps->run == !!ps->nfiles)
		return err_set(CORE_EUSAGE, NULL, "%s: give the paths with --run RUNDIR or with "
			       "--path CKPT (one of them)", cmd);
	if (ps->nfiles && ps->phase >= 0)
		return err_set(CORE_EUSAGE, NULL, "%s: --phase goes with --run, not with --path",
			       cmd);
	if (ps->early && !ps->run)
		return err_set(CORE_EUSAGE, NULL, "%s: --early-stop picks phases of a run: it goes "
			       "with --run, not with --path", cmd);
	if (ps->run) {
		ERR_FORWARD(rundir_open(&ps->r, ps->run, 0));
		ps->have_run = 1;
		if (ps->phase == 0 || ps->phase > ps->r.cfg.dipaco.phases)
			return err_set(CORE_EUSAGE, NULL, "%s: --phase %ld is outside the run's "
				       "phases 1..%ld", cmd, ps->phase, ps->r.cfg.dipaco.phases);
		if (ps->phase < 0)
			ps->phase = rundir_last_phase(&ps->r);
		if (ps->phase == 0)
			return err_set(CORE_ENOTFOUND, ps->run, "no phase has all its modules yet "
				       "(nothing trained)");
		n = ps->r.topo.npaths;
	} else {
		n = ps->nfiles;
	}
	if (ps->early)
		ERR_FORWARD(pathset_early(ps, be));
	ps->lm = calloc((size_t)n, sizeof *ps->lm);
	if (!ps->lm)
		return err_set(CORE_ENOMEM, NULL, "out of memory for %d paths", n);
	for (int p = 0; p < n; p++) {
		int rc = ps->run ? lm_open_run(&ps->lm[p], &ps->r, ps->best ? ps->best[p] :
					       ps->phase, p, be, B)
				 : lm_open(&ps->lm[p], ps->files[p], be, B);
		if (rc < 0)
			return rc;
		ps->n = p + 1;
		if (p && !config_model_equal(&ps->lm[p].g.cfg, &ps->lm[0].g.cfg))
			return err_set(CORE_ESHAPE, ps->lm[p].path, "has another model shape than "
				       "'%s'", ps->lm[0].path);
	}
	return 0;
}

void pathset_close(struct pathset *ps)
{
	for (int i = 0; ps->lm && i < ps->n; i++)
		lm_close(&ps->lm[i]);
	free(ps->lm);
	free(ps->best);
	if (ps->have_run)
		rundir_close(&ps->r);
	ps->lm = NULL;
	ps->best = NULL;
	ps->n = 0;
	ps->have_run = 0;
}

char *pathset_digests(const struct pathset *ps)
{
	const size_t n = (size_t)ps->n * (LM_DIGEST_CHARS + 1) + 1;
	char *s = malloc(n);
	size_t off = 0;
	if (!s)
		return NULL;
	s[0] = 0;
	for (int p = 0; p < ps->n; p++)
		off += (size_t)snprintf(s + off, n - off, "%s%s", p ? "," : "", ps->lm[p].digest);
	return s;
}

char *pathset_source(const struct pathset *ps)
{
	size_t n = 64 + (ps->run ? strlen(ps->run) : 0) + (ps->best ? 24 * (size_t)ps->n : 0), off;
	for (int p = 0; p < ps->nfiles; p++)
		n += strlen(ps->files[p]) + 1;
	char *s = malloc(n);
	if (!s)
		return NULL;
	if (ps->run && ps->best) {
		off = (size_t)snprintf(s, n, "run %s early-stopped by phase %ld at phases", ps->run,
				       ps->phase);
		for (int p = 0; p < ps->n; p++)
			off += (size_t)snprintf(s + off, n - off, "%s%ld", p ? "," : " ", ps->best[p]);
		return s;
	}
	if (ps->run) {
		snprintf(s, n, "run %s phase %ld", ps->run, ps->phase);
		return s;
	}
	off = (size_t)snprintf(s, n, "paths");
	for (int p = 0; p < ps->nfiles; p++)
		off += (size_t)snprintf(s + off, n - off, " %s", ps->files[p]);
	return s;
}
