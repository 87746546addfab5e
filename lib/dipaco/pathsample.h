/* pathsample.h - which paths train in each phase when paths outnumber workers
 * (dipaco.paths_per_phase: N of the P paths; DiPaCo paper section 2.6.2: "sample a subset of
 * the paths to train at each start of inner optimisation, cycling through the paths over
 * the outer phases").
 *
 * The draw: one permutation pi of 0..P-1 for the whole run, Fisher-Yates from train.seed
 * (for i = P-1 down to 1, j = rng_below(seed, RNG_STREAM_PATHS, i, i + 1), swap pi[i] and
 * pi[j]); phase t (1-based) trains pi[((t-1) N + i) mod P] for i < N. The phases walk round
 * the cycle pi, N paths at a time.
 *
 * The guarantee: every window of E = ceil(P/N) consecutive phases trains every path (it
 * covers E N >= P consecutive places of the cycle), and after t phases each path has
 * trained floor(tN/P) or ceil(tN/P) times. Why one permutation and not a fresh one per
 * round of E phases: with fresh ones, a window that straddles two rounds can miss a path
 * (the tail of one round and the head of the next may hold the same paths), so the gap
 * between two visits grows to 2E - 1 phases; and when N divides P no draw at all can renew
 * itself, since every window of P/N phases holding each path exactly once forces phase
 * t + P/N to train phase t's paths.
 *
 * Without sampling (N = 0, the key absent, or N = P) every path trains in every phase.
 */
#ifndef CORE_PATHSAMPLE_H
#define CORE_PATHSAMPLE_H

#include <stddef.h>
#include <stdint.h>

struct path_sample {
	int P, N;         /* N == P: every path, every phase */
	long phases;      /* for the record */
	uint64_t seed;
	int *order;       /* [P] pi, NULL without sampling */
	int *pos;         /* [P] the place of each path in pi */
};

/* The draw for P paths, N per phase (0: every path), phases 1..phases; zeroed s on error. */
int pathsample_init(struct path_sample *s, int P, int N, uint64_t seed, long phases);
void pathsample_free(struct path_sample *s);
/* 1 when every path trains in every phase. */
static inline int pathsample_all(const struct path_sample *s)
{
	return s->order == NULL;
}
/* 1 when path p trains in phase t >= 1. */
int pathsample_trains(const struct path_sample *s, long t, int p);
/* The latest phase before t in which path p trained; 0 when none (t - 1 without sampling). */
long pathsample_last(const struct path_sample *s, long t, int p);
/* Phase t's paths, ascending, into out[N]; returns how many (N, or P without sampling). */
int pathsample_phase(const struct path_sample *s, long t, int *out);
/* The run's record of the draw (dpc-rundir(5), RUNDIR/sampled.json), one JSON object:
 * {"paths": P, "paths_per_phase": N, "seed": S, "order": [pi], "phases": [[phase 1's
 * paths], ...]} with the order and each phase on a line of its own; malloc'd text, its
 * length in *len. */
int pathsample_text(const struct path_sample *s, char **out, size_t *len);

#endif
