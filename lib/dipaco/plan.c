/* plan.c - the run's task graph as text; see plan.h. */
#include "dipaco/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/banned.h"

/* File names relative to the run directory: the same functions, with dir ".". */
static struct rundir relative(const struct rundir *r)
{
	struct rundir rel = *r;
	rel.dir = (char *)".";
	return rel;
}

/* Strip "./" for tidier text. */
static const char *rel_name(const char *s)
{
	return strncmp(s, "./", 2) == 0 ? s + 2 : s;
}

/* The dependencies of train (t, p) and of outer (t, m), space-separated, into fp. */
static void train_deps(FILE *fp, const struct rundir *r, const struct rundir *rel, long t,
		       int p)
{
	char buf[RUNDIR_PATH_MAX];

	for (int l = 0; l < rel->topo.nlevels; l++) {
		rundir_module(rel, t - 1, topo_module_of(&rel->topo, p, l), ".safetensors", buf,
			      sizeof buf);
		fprintf(fp, " %s", rel_name(buf));
	}
	/* Its own latest checkpoint: of phase t-1, or of the last phase it was sampled in. */
	const long own = pathsample_last(&r->sample, t, p);
	if (own > 0) {
		rundir_path_ckpt(rel, own, p, ".safetensors", buf, sizeof buf);
		fprintf(fp, " %s", rel_name(buf));
	}
	/* Which shards phase t trains on depends on what the run directory holds (a re-sharding):
	 * looked up in the real one, written relative to it. */
	rundir_shard(r, t, p, buf, sizeof buf);
	const size_t nd = strlen(r->dir);
	fprintf(fp, " %s", strncmp(buf, r->dir, nd) == 0 && buf[nd] == '/' ? buf + nd + 1 : buf);
}

static void outer_deps(FILE *fp, const struct rundir *rel, long t, int m)
{
	char buf[RUNDIR_PATH_MAX];
	const struct topo_module *md = &rel->topo.modules[m];

	rundir_module(rel, t - 1, m, ".safetensors", buf, sizeof buf);
	fprintf(fp, " %s", rel_name(buf));
	for (int k = 0; k < md->npaths; k++) {
		if (!pathsample_trains(&rel->sample, t, md->paths[k]))
			continue;
		rundir_path_ckpt(rel, t, md->paths[k], ".safetensors", buf, sizeof buf);
		fprintf(fp, " %s", rel_name(buf));
	}
}

/* Close the memory stream (which sets *text) and hand the text over. */
static int finish(FILE *fp, char **text, char **out)
{
	int bad = ferror(fp);

	if (fclose(fp) != 0 || bad) {
		free(*text);
		*out = NULL;
		return err_set(CORE_ENOMEM, NULL, "cannot build the task list");
	}
	*out = *text;
	return 0;
}

int plan_tasks(const struct rundir *r, char **out)
{
	struct rundir rel = relative(r);
	char buf[RUNDIR_PATH_MAX], *text = NULL;
	size_t len = 0;
	FILE *fp = open_memstream(&text, &len);

	if (!fp)
		return err_set(CORE_ENOMEM, NULL, "cannot build the task list");
	for (long t = 1; t <= r->cfg.dipaco.phases; t++) {
		for (int p = 0; p < r->topo.npaths; p++) {
			if (!pathsample_trains(&r->sample, t, p))
				continue;
			rundir_path_ckpt(&rel, t, p, ".safetensors", buf, sizeof buf);
			fprintf(fp, "train %ld %d %s", t, p, rel_name(buf));
			train_deps(fp, r, &rel, t, p);
			fputc('\n', fp);
		}
		for (int m = 0; m < r->topo.nmodules; m++) {
			rundir_module(&rel, t, m, ".safetensors", buf, sizeof buf);
			fprintf(fp, "outer %ld %s %s", t, r->topo.modules[m].name, rel_name(buf));
			outer_deps(fp, &rel, t, m);
			fputc('\n', fp);
		}
	}
	return finish(fp, &text, out);
}

int plan_makefile(const struct rundir *r, const char *bin, char **out)
{
	/* make splits words at blanks and reads '#' and '$' itself: such a folder cannot be
	 * written into a Makefile faithfully. */
	if (strpbrk(bin, " \t\n#$'\"\\"))
		return err_set(CORE_EUSAGE, bin, "the programs' folder has a blank or one of # $ ' "
			       "\" \\ in its name, which a Makefile cannot hold; give another with "
			       "--bin");
	struct rundir rel = relative(r);
	const long T = r->cfg.dipaco.phases;
	char buf[RUNDIR_PATH_MAX], *text = NULL;
	size_t len = 0;
	FILE *fp = open_memstream(&text, &len);

	if (!fp)
		return err_set(CORE_ENOMEM, NULL, "cannot build the Makefile");
	fprintf(fp,
		"# The task graph of this DiPaCo run (dpc-rundir(5)), written by dpc-outer makefile.\n"
		"# Run it with: make -C RUNDIR -j WORKERS [THREADS=n] [DEVICE=cpu] [PRECISION=fp32]\n"
		"# Every output is written atomically, so a killed run resumes by running the same\n"
		"# command: make redoes only the files that do not exist.\n"
		"BIN ?= %s\nTHREADS ?= 1\nDEVICE ?= cpu\nPRECISION ?= fp32\n"
		"TRAIN = $(BIN)/dpc-train-path --run . --quiet --threads $(THREADS) --device $(DEVICE) "
		"--precision $(PRECISION)\n"
		"OUTER = $(BIN)/dpc-outer step . --quiet --threads $(THREADS)\n\n"
		".PHONY: all\n.SUFFIXES:\n.DELETE_ON_ERROR:\n\nall: metrics.jsonl\n\n",
		bin);
	for (long t = 1; t <= T; t++) {
		fprintf(fp, "# phase %ld\n", t);
		for (int p = 0; p < r->topo.npaths; p++) {
			if (!pathsample_trains(&r->sample, t, p))
				continue;
			rundir_path_ckpt(&rel, t, p, ".safetensors", buf, sizeof buf);
			fprintf(fp, "%s:", rel_name(buf));
			train_deps(fp, r, &rel, t, p);
			fprintf(fp, "\n\t$(TRAIN) --phase %ld --path-index %d\n", t, p);
		}
		for (int m = 0; m < r->topo.nmodules; m++) {
			rundir_module(&rel, t, m, ".safetensors", buf, sizeof buf);
			fprintf(fp, "%s:", rel_name(buf));
			outer_deps(fp, &rel, t, m);
			fprintf(fp, "\n\t$(OUTER) --phase %ld --module %s\n", t,
				r->topo.modules[m].name);
		}
		fputc('\n', fp);
	}
	/* through-T: every module of phase T, so phases up to T (a run re-sharded after phase
	 * T stops there: dipaco-train.sh --until T) */
	for (long t = 1; t <= T; t++) {
		fprintf(fp, ".PHONY: through-%ld\nthrough-%ld:", t, t);
		for (int m = 0; m < r->topo.nmodules; m++) {
			rundir_module(&rel, t, m, ".safetensors", buf, sizeof buf);
			fprintf(fp, " %s", rel_name(buf));
		}
		fputc('\n', fp);
	}
	fputc('\n', fp);
	fprintf(fp, "metrics.jsonl:");
	for (int m = 0; m < r->topo.nmodules; m++) {
		rundir_module(&rel, T, m, ".safetensors", buf, sizeof buf);
		fprintf(fp, " %s", rel_name(buf));
	}
	fprintf(fp, "\n\t$(BIN)/dpc-outer metrics .\n");
	return finish(fp, &text, out);
}
