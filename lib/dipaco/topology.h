/* topology.h - a DiPaCo topology made concrete: which modules exist, which paths use each,
 * and which of the model's tensors each module owns.
 *
 * The config's levels (dpc-config(5), LEVELS) split the model's tensors; level l has K_l
 * modules, or one per path. The routed levels (K >= 1) form a mixed-radix number, the last
 * level varying fastest: with R = prod K_l, path p uses at level l the digit of (p mod R),
 * and at a per-path level module p. A module is named LEVEL.E ("lower.1", "head.3").
 */
#ifndef CORE_TOPOLOGY_H
#define CORE_TOPOLOGY_H

#include <stddef.h>

#include "io/config.h"
#include "model/gpt2.h"

#define MODULE_NAME_MAX (LEVEL_NAME_MAX + 12)

struct topo_module {
	char name[MODULE_NAME_MAX];
	int level, index;
	int npaths;
	int *paths;     /* the paths that use it, ascending */
	size_t nparams; /* floats it owns */
	int nviews;     /* how many of the layout's views it owns */
};

struct topology {
	struct model_config model;
	int nlevels, npaths, nmodules;
	struct level_config levels[CONFIG_MAX_LEVELS];
	int *module_of;              /* [npaths * nlevels]: module id of path p at level l */
	struct topo_module *modules; /* by level in config order, then by index */
	struct gpt2_layout layout;   /* the model's tensors */
	int *view_level;             /* [layout.n]: the level owning each tensor */
	size_t total_params;         /* sum over modules */
};

/* Build from a validated config (config_validate has checked that the levels cover the
 * model exactly once). */
int topo_build(struct topology *t, const struct run_config *c);
void topo_free(struct topology *t);
/* Module id of path p at level l. */
static inline int topo_module_of(const struct topology *t, int p, int l)
{
	return t->module_of[(size_t)p * (size_t)t->nlevels + (size_t)l];
}
/* Module id with this name, or -1. */
int topo_find(const struct topology *t, const char *name);
/* 1 when layout view i belongs to module m's level. */
static inline int topo_owns(const struct topology *t, int m, int view)
{
	return t->view_level[view] == t->modules[m].level;
}
/* Digits needed for path and shard numbers: that of npaths - 1, at least 3. */
int topo_path_digits(const struct topology *t);

#endif
