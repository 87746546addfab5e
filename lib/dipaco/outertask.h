/* outertask.h - the outer tasks of a run directory (dpc-outer init and step): phase 0's
 * module initialisation, and the outer step of module m after phase t's paths, with its
 * diagnostics. The counterparts of pathtrain.h's path task.
 */
#ifndef CORE_OUTERTASK_H
#define CORE_OUTERTASK_H

#include "dipaco/module.h"
#include "dipaco/rundir.h"

/* Phase 0: each module's initialisation from src (the seed, or a checkpoint's tensors),
 * labelled label (module_init_label), one module in memory at a time. A module file that
 * exists, verifies and came from the same source is kept (one from another source is
 * CORE_EUSAGE naming it); *written counts those written. */
int outertask_init(const struct rundir *r, const struct module_init *src, const char *label,
		   int *written);

struct outer_task_result {
	int skipped; /* the module existed and verified as this step's output: nothing done */
	char *line;  /* else the step's diagnostics (one JSON line with its newline, as written
		      * to phase-TTTT/modules/NAME.json before the module); caller frees */
};

/* The outer step of module m after phase t (outer.h's outer_step_module on the paths that
 * use m and that phase t trained, weighted by their shard tokens renormalised over them
 * when dipaco.reweight; none: the module is kept as it was), waiting up to wait seconds
 * for path checkpoints, on threads threads (0: all). What a killed attempt left is removed
 * first; a module file that exists but is not this step's output is an error naming it. */
int outertask_step(const struct rundir *r, long t, int m, double wait, int threads,
		   struct outer_task_result *res);

#endif
