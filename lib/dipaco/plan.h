/* plan.h - a DiPaCo run as a graph of tasks over files, for an existing engine to execute
 * (GNU make on one host, mpirun ranks, Slurm jobs): paper section 3.3's "a path of phase t+1
 * starts as soon as the modules it uses are updated", with no scheduler of our own.
 *
 * Tasks: train (phase t >= 1, path p) reads the modules path p uses from phase t-1, its own
 * latest checkpoint (of phase t-1; with dipaco.paths_per_phase, of the last phase before t
 * it trained in, none when it never has) and its shard, and writes phase-t/paths/path-p;
 * outer (phase t, module m) reads m of phase t-1 and the phase-t checkpoints of m's paths
 * (those phase t trains: possibly none), and writes phase-t/modules/m. With
 * dipaco.paths_per_phase only the paths phase t trains (r->sample) have train tasks. Phase
 * 0's modules come from dpc-outer init. Every output is written atomically, so "its file
 * exists" is "the task is done".
 */
#ifndef CORE_PLAN_H
#define CORE_PLAN_H

#include "dipaco/rundir.h"

/* The graph as a Makefile for `make -C RUNDIR -j N`: train and outer rules, an `all` target
 * ending in metrics.jsonl, and variables BIN (the programs' folder, default bin), THREADS,
 * DEVICE. Text into *out (malloc'd). */
int plan_makefile(const struct rundir *r, const char *bin, char **out);
/* The graph as lines "train T P OUT DEP..." / "outer T MODULE OUT DEP..." in an order in
 * which every task comes after the tasks it depends on; names relative to the run directory. */
int plan_tasks(const struct rundir *r, char **out);

#endif
