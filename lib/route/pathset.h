/* pathset.h - the paths a routing command reads: the paths of a DiPaCo run assembled from
 * its modules after one phase (or, early-stopped, each path at its own best phase up to it),
 * or path checkpoints given one by one. Open on one backend, all of one model shape.
 */
#ifndef CORE_ROUTE_PATHSET_H
#define CORE_ROUTE_PATHSET_H

#include "backend/backend.h"
#include "dipaco/rundir.h"
#include "route/lm.h"

#define PATHSET_MAX_FILES 4096

struct pathset {
	/* what to open, set by the caller */
	const char *run;  /* a run directory, or NULL */
	long phase;       /* with run: after this phase's outer step; -1: the last phase whose
			   * modules all exist */
	int early;        /* with run: each path at the phase of its lowest held-out loss in
			   * 1..phase (dipaco.holdout) */
	const char *files[PATHSET_MAX_FILES]; /* or path checkpoints, in path order */
	int nfiles;
	/* with early: called for each path as its phase is found, with its held-out loss after
	 * phases 1..T (may be NULL) */
	void (*on_best)(void *ctx, int path, long best, const double *loss, long T);
	void *ctx;

	/* what pathset_open gives */
	struct rundir r;
	int have_run;
	long *best;       /* with early: each path's phase */
	struct lm *lm;    /* [n] */
	int n;
};

/* Open every path for batches of B windows on be. cmd names the command in usage errors
 * (CORE_EUSAGE: neither or both of run and files, phase with files, early without run, a
 * phase outside the run's). On error what was opened stays for pathset_close. */
int pathset_open(struct pathset *ps, struct backend *be, int B, const char *cmd);
void pathset_close(struct pathset *ps);

/* The paths' digests, comma-separated (caller frees; NULL when out of memory). */
char *pathset_digests(const struct pathset *ps);
/* "run RUNDIR phase T", "run RUNDIR early-stopped by phase T at phases a,b,...", or
 * "paths CKPT CKPT ..." (caller frees; NULL when out of memory). */
char *pathset_source(const struct pathset *ps);

#endif
