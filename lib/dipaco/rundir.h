/* rundir.h - a DiPaCo run directory (dpc-rundir(5)): names of its files and what every
 * program reads from it before it does anything.
 *
 *   RUNDIR/config.yaml                      the run's config (config_yaml text)
 *   RUNDIR/shards/shards.json               shard manifest (dpc-shard split)
 *   RUNDIR/shards/shard-PPP.tok             path p's shard
 *   RUNDIR/phase-TTTT/shards/               shards of phases after T, when the run was
 *                                           re-sharded after phase T (same layout)
 *   RUNDIR/val.tok                          optional validation tokens
 *   RUNDIR/phase-TTTT/modules/NAME.safetensors  module checkpoints after phase t's outer
 *                                           step (phase 0: the initialisation)
 *   RUNDIR/phase-TTTT/modules/NAME.json     that step's diagnostics (one JSON line)
 *   RUNDIR/phase-0000/moments.safetensors   init --from --moments: the source checkpoint,
 *                                           whose AdamW moments phase 1's paths start from
 *   RUNDIR/phase-TTTT/paths/path-PPP.safetensors  path p trained in phase t (t >= 1)
 *   RUNDIR/phase-TTTT/paths/path-PPP.jsonl  that training's metrics
 *   RUNDIR/sampled.json                     which paths train in each phase, with
 *                                           dipaco.paths_per_phase (pathsample.h)
 *   RUNDIR/Makefile                         the task graph (dpc-outer makefile)
 *   RUNDIR/metrics.jsonl                    every phase's metrics in order (dpc-outer metrics)
 */
#ifndef CORE_RUNDIR_H
#define CORE_RUNDIR_H

#include <stddef.h>

#include "dipaco/pathsample.h"
#include "dipaco/topology.h"
#include "io/config.h"

#define RUNDIR_PATH_MAX 4096

struct rundir {
	char *dir;
	struct run_config cfg;
	struct topology topo;
	char config_hash[17];
	long tau;           /* inner steps per phase */
	int have_shards;    /* a shard manifest read (rundir_read_shards) */
	double *shard_tokens; /* [npaths], from that manifest */
	struct path_sample sample; /* which paths train in which phase (every path, every
				    * phase, without dipaco.paths_per_phase) */
};

/* The copy of the fork's checkpoint whose moments phase 1 starts from (dpc-outer init
 * --from CKPT --moments), relative to RUNDIR. */
#define RUNDIR_FORK_MOMENTS "phase-0000/moments.safetensors"

/* The record of the paths each phase trains (dipaco.paths_per_phase), relative to RUNDIR. */
#define RUNDIR_SAMPLED "sampled.json"

/* Load dir/config.yaml (validated) and build its topology and its draw of paths; the shard
 * manifest too when it exists (need_shards: it must). A RUNDIR_SAMPLED that is not the
 * config's draw byte for byte (or exists in a run without sampling) is CORE_ECONFIG naming
 * it. */
int rundir_open(struct rundir *r, const char *dir, int need_shards);
void rundir_close(struct rundir *r);

/* Create dir (and its shards/ folder) holding c's config.yaml. An existing config.yaml is
 * accepted when it holds the same config (same config_hash), so creation can be re-run;
 * another config there is an error naming the file. */
int rundir_create(const char *dir, const struct run_config *c);

/* File names (NUL-terminated into buf of n bytes; CORE_EUSAGE when it does not fit). */
/* The folder of the shards phase t trains on: RUNDIR/phase-TTTT/shards for the latest T < t
 * that holds a shards.json (the run was re-sharded after phase T, by a router fitted on
 * phase T's paths), else RUNDIR/shards. */
int rundir_shard_dir(const struct rundir *r, long phase, char *buf, size_t n);
int rundir_shard(const struct rundir *r, long phase, int p, char *buf, size_t n);
/* Where a split of the run's training tokens goes (dpc-shard split --run): RUNDIR/shards
 * for the first phases (after = 0), else RUNDIR/phase-TTTT/shards, the shards of the phases
 * after T (a re-sharding after phase T: 1 <= T < dipaco.phases, and phase T's modules all
 * written). Either way no path of the first phase to train on them may exist yet (it
 * trained on other shards): CORE_EUSAGE naming what is wrong. */
int rundir_split_dir(const struct rundir *r, long after, char *buf, size_t n);
/* Read the manifest of the shards phase t trains on into shard_tokens (rundir_open reads
 * phase 1's); with need = 0 a missing manifest leaves have_shards 0. */
int rundir_read_shards(struct rundir *r, long phase, int need);
int rundir_path_ckpt(const struct rundir *r, long phase, int p, const char *ext, char *buf,
		     size_t n);
int rundir_module(const struct rundir *r, long phase, int m, const char *ext, char *buf,
		  size_t n);
int rundir_file(const struct rundir *r, const char *name, char *buf, size_t n);
/* 1 with the first of phase t's module checkpoints that does not exist in buf, 0 when all
 * do (the phase's outer step is done), < 0 on error. */
int rundir_missing_module(const struct rundir *r, long phase, char *buf, size_t n);
/* The last phase whose every module checkpoint exists; 0 when none has. */
long rundir_last_phase(const struct rundir *r);
/* Remove what a killed attempt at writing out left: its temporary files out.tmp.* (see
 * atomicio.h). Only the task that owns out may call it: a run gives every output one task. */
void rundir_clean_stale(const char *out);
/* Write RUNDIR_SAMPLED (atomically) when the run samples its paths and it does not exist
 * yet: dpc-outer init, makefile and tasks do, the first to need it. */
int rundir_write_sample(const struct rundir *r);
/* mkdir -p of phase-TTTT/paths and phase-TTTT/modules. */
int rundir_make_phase(const struct rundir *r, long phase);

#endif
