/* topology.c - levels to modules and paths; see topology.h. */
#include "dipaco/topology.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/banned.h"

/* The level owning a tensor, from its Hugging Face name: embed, h.N, head. */
static int owner_of(const struct level_config *lv, int nlevels, const char *name)
{
	int block = -1, embed = 0, head = 0;

	if (!strcmp(name, "wte.weight") || !strcmp(name, "wpe.weight"))
		embed = 1;
	else if (!strncmp(name, "ln_f.", 5) || !strcmp(name, "lm_head.weight"))
		head = 1;
	else if (sscanf(name, "h.%d.", &block) != 1)
		return -1;
	for (int l = 0; l < nlevels; l++) {
		if ((embed && lv[l].embed) || (head && lv[l].head))
			return l;
		for (int r = 0; block >= 0 && r < lv[l].nranges; r++)
			if (block >= lv[l].range[r].lo && block <= lv[l].range[r].hi)
				return l;
	}
	return -1;
}

int topo_build(struct topology *t, const struct run_config *c)
{
	int rc = 0;
	long R = 1;

	memset(t, 0, sizeof *t);
	t->model = c->model;
	t->nlevels = config_levels(c, t->levels);
	for (int l = 0; l < t->nlevels; l++)
		if (t->levels[l].modules != LEVEL_PER_PATH)
			R *= t->levels[l].modules;
	t->npaths = c->dipaco.paths ? c->dipaco.paths : (int)R;
	if (R < 1 || R > 65536 || t->npaths % R)
		return err_set(CORE_ECONFIG, NULL, "%d paths is not a multiple of the %ld module "
			       "combinations of the levels", t->npaths, R);
	for (int l = 0; l < t->nlevels; l++)
		t->nmodules += t->levels[l].modules == LEVEL_PER_PATH ? t->npaths :
			       t->levels[l].modules;

	ERR_FORWARD(gpt2_layout(&c->model, &t->layout));
	t->module_of = calloc((size_t)t->npaths * (size_t)t->nlevels, sizeof *t->module_of);
	t->modules = calloc((size_t)t->nmodules, sizeof *t->modules);
	t->view_level = calloc((size_t)t->layout.n, sizeof *t->view_level);
	if (!t->module_of || !t->modules || !t->view_level) {
		rc = err_set(CORE_ENOMEM, NULL, "out of memory for the topology");
		goto fail;
	}

	/* Modules level by level; first[l] is level l's first module id. */
	int first[CONFIG_MAX_LEVELS], id = 0;
	for (int l = 0; l < t->nlevels; l++) {
		int K = t->levels[l].modules == LEVEL_PER_PATH ? t->npaths : t->levels[l].modules;
		first[l] = id;
		for (int e = 0; e < K; e++, id++) {
			struct topo_module *m = &t->modules[id];
			snprintf(m->name, sizeof m->name, "%s.%d", t->levels[l].name, e);
			m->level = l;
			m->index = e;
		}
	}
	for (int p = 0; p < t->npaths; p++) {
		long q = p % R, stride = R;
		for (int l = 0; l < t->nlevels; l++) {
			int K = t->levels[l].modules, e;
			if (K == LEVEL_PER_PATH) {
				e = p;
			} else {
				stride /= K;
				e = (int)((q / stride) % K);
			}
			t->module_of[(size_t)p * t->nlevels + l] = first[l] + e;
			t->modules[first[l] + e].npaths++;
		}
	}
	for (int m = 0; m < t->nmodules; m++) {
		t->modules[m].paths = calloc((size_t)(t->modules[m].npaths ? t->modules[m].npaths : 1),
					     sizeof(int));
		if (!t->modules[m].paths) {
			rc = err_set(CORE_ENOMEM, NULL, "out of memory for the topology");
			goto fail;
		}
		t->modules[m].npaths = 0;
	}
	for (int p = 0; p < t->npaths; p++)
		for (int l = 0; l < t->nlevels; l++) {
			struct topo_module *m = &t->modules[topo_module_of(t, p, l)];
			m->paths[m->npaths++] = p;
		}

	size_t per_level[CONFIG_MAX_LEVELS] = {0};
	int views_per_level[CONFIG_MAX_LEVELS] = {0};
	for (int i = 0; i < t->layout.n; i++) {
		int l = owner_of(t->levels, t->nlevels, t->layout.views[i].name);
		if (l < 0) {
			rc = err_set(CORE_ECONFIG, NULL, "no level owns tensor '%s'",
				     t->layout.views[i].name);
			goto fail;
		}
		t->view_level[i] = l;
		per_level[l] += (size_t)tensor_numel(&t->layout.views[i]);
		views_per_level[l]++;
	}
	for (int m = 0; m < t->nmodules; m++) {
		struct topo_module *md = &t->modules[m];
		if (md->npaths == 0) {
			rc = err_set(CORE_ECONFIG, NULL, "module %s is used by no path (%d paths)",
				     md->name, t->npaths);
			goto fail;
		}
		md->nparams = per_level[md->level];
		md->nviews = views_per_level[md->level];
		t->total_params += md->nparams;
	}
	return 0;
fail:
	topo_free(t);
	return rc;
}

void topo_free(struct topology *t)
{
	for (int m = 0; t->modules && m < t->nmodules; m++)
		free(t->modules[m].paths);
	free(t->modules);
	free(t->module_of);
	free(t->view_level);
	gpt2_layout_free(&t->layout);
	memset(t, 0, sizeof *t);
}

int topo_find(const struct topology *t, const char *name)
{
	for (int m = 0; m < t->nmodules; m++)
		if (!strcmp(t->modules[m].name, name))
			return m;
	return -1;
}

int topo_path_digits(const struct topology *t)
{
	int d = 1;
	for (long v = t->npaths - 1; v >= 10; v /= 10)
		d++;
	return d < 3 ? 3 : d;
}
