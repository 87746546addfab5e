/* rundir.c - the run directory's names and its shared reading; see rundir.h. */
#include "dipaco/rundir.h"

#include <errno.h>
#include <dirent.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "io/atomicio.h"
#include "io/shardsplit.h"
#include "common/banned.h"

__attribute__((format(printf, 3, 4)))
static int name_into(char *buf, size_t n, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	int k = vsnprintf(buf, n, fmt, ap);
	va_end(ap);
	if (k < 0 || (size_t)k >= n)
		return err_set(CORE_EUSAGE, NULL, "file name too long");
	return 0;
}

int rundir_file(const struct rundir *r, const char *name, char *buf, size_t n)
{
	return name_into(buf, n, "%s/%s", r->dir, name);
}

int rundir_shard_dir(const struct rundir *r, long phase, char *buf, size_t n)
{
	for (long t = phase - 1; t >= 1; t--) {
		ERR_FORWARD(name_into(buf, n, "%s/phase-%04ld/shards/shards.json", r->dir, t));
		if (access(buf, F_OK) == 0)
			return name_into(buf, n, "%s/phase-%04ld/shards", r->dir, t);
	}
	return name_into(buf, n, "%s/shards", r->dir);
}

int rundir_shard(const struct rundir *r, long phase, int p, char *buf, size_t n)
{
	char dir[RUNDIR_PATH_MAX], name[64];
	ERR_FORWARD(rundir_shard_dir(r, phase, dir, sizeof dir));
	ERR_FORWARD(shard_file_name(name, sizeof name, (uint32_t)p, (uint32_t)r->topo.npaths));
	return name_into(buf, n, "%s/%s", dir, name);
}

int rundir_missing_module(const struct rundir *r, long phase, char *buf, size_t n)
{
	for (int m = 0; m < r->topo.nmodules; m++) {
		ERR_FORWARD(rundir_module(r, phase, m, ".safetensors", buf, n));
		if (access(buf, F_OK) != 0)
			return 1;
	}
	return 0;
}

long rundir_last_phase(const struct rundir *r)
{
	char f[RUNDIR_PATH_MAX];
	for (long t = r->cfg.dipaco.phases; t > 0; t--)
		if (rundir_missing_module(r, t, f, sizeof f) == 0)
			return t;
	return 0;
}

int rundir_split_dir(const struct rundir *r, long after, char *buf, size_t n)
{
	char path[RUNDIR_PATH_MAX];

	if (after < 0 || after >= r->cfg.dipaco.phases)
		return err_set(CORE_EUSAGE, r->dir, "has phases 1..%ld: a re-sharding goes after "
			       "phase 1 to %ld, not %ld", r->cfg.dipaco.phases,
			       r->cfg.dipaco.phases - 1, after);
	int rc = after > 0 ? rundir_missing_module(r, after, path, sizeof path) : 0;
	if (rc < 0)
		return rc;
	if (rc)
		return err_set(CORE_EUSAGE, path, "does not exist: phase %ld has not finished, "
			       "so there is nothing to re-shard after yet", after);
	for (int p = 0; p < r->topo.npaths; p++) {
		ERR_FORWARD(rundir_path_ckpt(r, after + 1, p, ".safetensors", path, sizeof path));
		if (access(path, F_OK) == 0)
			return err_set(CORE_EUSAGE, path, "exists: phase %ld has trained on the "
				       "shards it had; new shards for it would not match", after + 1);
	}
	if (after == 0)
		return name_into(buf, n, "%s/shards", r->dir);
	return name_into(buf, n, "%s/phase-%04ld/shards", r->dir, after);
}

int rundir_path_ckpt(const struct rundir *r, long phase, int p, const char *ext, char *buf,
		     size_t n)
{
	return name_into(buf, n, "%s/phase-%04ld/paths/path-%0*d%s", r->dir, phase,
			 topo_path_digits(&r->topo), p, ext);
}

int rundir_module(const struct rundir *r, long phase, int m, const char *ext, char *buf,
		  size_t n)
{
	return name_into(buf, n, "%s/phase-%04ld/modules/%s%s", r->dir, phase,
			 r->topo.modules[m].name, ext);
}

void rundir_clean_stale(const char *out)
{
	/* By name in out's folder, not by glob(3): a run directory may hold '*' or '['. */
	const char *slash = strrchr(out, '/');
	char dir[RUNDIR_PATH_MAX], prefix[RUNDIR_PATH_MAX], path[2 * RUNDIR_PATH_MAX];
	DIR *d;
	struct dirent *e;

	if (snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - out) : 1,
		     slash ? out : ".") >= (int)sizeof dir ||
	    snprintf(prefix, sizeof prefix, "%s.tmp.", slash ? slash + 1 : out) >=
		    (int)sizeof prefix)
		return;
	if (!(d = opendir(dir[0] ? dir : "/")))
		return;
	while ((e = readdir(d)))
		if (!strncmp(e->d_name, prefix, strlen(prefix)) &&
		    snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path)
			unlink(path);
	closedir(d);
}

static int make_dir(const char *path)
{
	if (mkdir(path, 0777) == 0 || errno == EEXIST) {
		struct stat st;
		if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
			return 0;
		return err_set(CORE_EIO, path, "exists and is not a directory");
	}
	return err_errno(CORE_EIO, path, "cannot create directory", errno);
}

int rundir_make_phase(const struct rundir *r, long phase)
{
	char buf[RUNDIR_PATH_MAX];

	ERR_FORWARD(name_into(buf, sizeof buf, "%s/phase-%04ld", r->dir, phase));
	ERR_FORWARD(make_dir(buf));
	ERR_FORWARD(name_into(buf, sizeof buf, "%s/phase-%04ld/paths", r->dir, phase));
	ERR_FORWARD(make_dir(buf));
	ERR_FORWARD(name_into(buf, sizeof buf, "%s/phase-%04ld/modules", r->dir, phase));
	return make_dir(buf);
}

/* The shards' manifest (shard_manifest_read, its one reader). */
int rundir_read_shards(struct rundir *r, long phase, int need)
{
	char dir[RUNDIR_PATH_MAX], path[RUNDIR_PATH_MAX];
	uint64_t *tokens = NULL;
	uint32_t P = 0;

	free(r->shard_tokens);
	r->shard_tokens = NULL;
	r->have_shards = 0;
	ERR_FORWARD(rundir_shard_dir(r, phase, dir, sizeof dir));
	ERR_FORWARD(name_into(path, sizeof path, "%s/%s", dir, SHARD_MANIFEST));
	if (!need && access(path, F_OK) != 0)
		return 0;
	ERR_FORWARD(shard_manifest_read(dir, &P, &tokens));
	int rc = 0;
	if (P != (uint32_t)r->topo.npaths)
		rc = err_set(CORE_ECONFIG, path, "holds %u shards, the config has %d paths", P,
			     r->topo.npaths);
	else if (!(r->shard_tokens = calloc((size_t)P, sizeof *r->shard_tokens)))
		rc = err_set(CORE_ENOMEM, path, "out of memory");
	for (uint32_t p = 0; !rc && p < P; p++)
		r->shard_tokens[p] = (double)tokens[p];
	r->have_shards = !rc;
	free(tokens);
	return rc;
}

/* RUNDIR_SAMPLED, when it exists, against the config's draw: the same bytes. */
static int check_sample(const struct rundir *r)
{
	char path[RUNDIR_PATH_MAX], *have = NULL, *want = NULL;
	size_t nhave = 0, nwant = 0;

	ERR_FORWARD(rundir_file(r, RUNDIR_SAMPLED, path, sizeof path));
	int rc = file_read_all(path, 0, &have, &nhave);
	if (rc == CORE_ENOTFOUND)
		return 0;
	ERR_FORWARD(rc);
	if (pathsample_all(&r->sample))
		rc = err_set(CORE_ECONFIG, path, "exists, but the config trains every path in "
			     "every phase (no dipaco.paths_per_phase below the %d paths)",
			     r->topo.npaths);
	else if (!(rc = pathsample_text(&r->sample, &want, &nwant)) &&
		 (nhave != nwant || memcmp(have, want, nwant)))
		rc = err_set(CORE_ECONFIG, path, "is not the config's draw of paths "
			     "(dipaco.paths_per_phase %d of %d paths, train.seed %" PRIu64 ", %ld "
			     "phases); it belongs to another config", r->sample.N, r->sample.P,
			     r->sample.seed, r->sample.phases);
	free(have);
	free(want);
	return rc;
}

int rundir_write_sample(const struct rundir *r)
{
	char path[RUNDIR_PATH_MAX], *text = NULL;
	size_t n = 0;

	if (pathsample_all(&r->sample))
		return 0;
	ERR_FORWARD(rundir_file(r, RUNDIR_SAMPLED, path, sizeof path));
	if (access(path, F_OK) == 0) /* rundir_open checked it */
		return 0;
	ERR_FORWARD(pathsample_text(&r->sample, &text, &n));
	int rc = file_write_atomic(path, text, n);
	free(text);
	return rc;
}

int rundir_open(struct rundir *r, const char *dir, int need_shards)
{
	char path[RUNDIR_PATH_MAX];
	int rc;

	memset(r, 0, sizeof *r);
	r->dir = strdup(dir);
	if (!r->dir)
		return err_set(CORE_ENOMEM, dir, "out of memory");
	rc = rundir_file(r, "config.yaml", path, sizeof path);
	if (!rc && access(path, F_OK) != 0)
		rc = err_set(CORE_ENOTFOUND, dir, "is not a run directory (no config.yaml; create "
			     "one with dpc-outer init)");
	if (!rc)
		rc = config_load_with(&r->cfg, path, NULL, 0);
	else
		config_defaults(&r->cfg);
	if (!rc) {
		rc = topo_build(&r->topo, &r->cfg);
		if (rc) {
			char detail[512];
			snprintf(detail, sizeof detail, "%s", err_detail());
			rc = err_set(rc, path, "%s", detail);
		}
	}
	if (rc) {
		free(r->dir);
		memset(r, 0, sizeof *r);
		return rc;
	}
	config_hash_all(&r->cfg, r->config_hash);
	r->tau = config_inner_steps(&r->cfg);
	rc = pathsample_init(&r->sample, r->topo.npaths, r->cfg.dipaco.paths_per_phase,
			     r->cfg.train.seed, r->cfg.dipaco.phases);
	if (!rc)
		rc = check_sample(r);
	if (!rc)
		rc = rundir_read_shards(r, 1, need_shards);
	if (rc)
		rundir_close(r);
	return rc;
}

void rundir_close(struct rundir *r)
{
	pathsample_free(&r->sample);
	topo_free(&r->topo);
	free(r->shard_tokens);
	free(r->dir);
	memset(r, 0, sizeof *r);
}

int rundir_create(const char *dir, const struct run_config *c)
{
	char path[RUNDIR_PATH_MAX], h[17];
	size_t n = config_yaml(c, NULL, 0) + 1;
	char *text = malloc(n);
	int rc;

	if (!text)
		return err_set(CORE_ENOMEM, dir, "out of memory");
	config_yaml(c, text, n);
	rc = make_dir(dir);
	if (!rc)
		rc = name_into(path, sizeof path, "%s/shards", dir);
	if (!rc)
		rc = make_dir(path);
	if (!rc)
		rc = name_into(path, sizeof path, "%s/config.yaml", dir);
	if (!rc && access(path, F_OK) == 0) {
		struct run_config old;
		config_defaults(&old);
		rc = config_load(&old, path);
		if (!rc) {
			config_hash_all(&old, h);
			char mine[17];
			config_hash_all(c, mine);
			if (strcmp(h, mine))
				rc = err_set(CORE_ECONFIG, path, "holds another config (config_hash "
					     "%s, this one's is %s); use another run directory", h,
					     mine);
		}
		free(text);
		return rc;
	}
	if (!rc)
		rc = file_write_atomic(path, text, strlen(text));
	free(text);
	return rc;
}
