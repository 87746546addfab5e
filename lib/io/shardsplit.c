/* shardsplit.c - token file to P shard files and a manifest; see shardsplit.h.
 *
 * Why it is built this way:
 *  - Everything that can refuse (an empty or too short shard, an existing split) is decided
 *    from the assignment and the input's offsets before the first byte is written, so a
 *    refusal leaves no trace, not even a created directory.
 *  - Documents are grouped by shard with a stable counting sort and the shards are written
 *    one after the other, each writer prepared (completed, synced, closed) before the next
 *    opens: one file descriptor at a time however large P is, and the input, mapped, is
 *    read in shard order rather than kept whole in memory.
 *  - The manifest goes through afile_prepare like the shards, not file_write_atomic, which
 *    would rename at once: a full disk while writing it must leave the old split whole. It
 *    is renamed last, so a shards.json always describes files that are in place.
 */
#include "io/shardsplit.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/rng.h"
#include "io/atomicio.h"
#include "common/banned.h"

#define PROGRESS_EVERY 4096

void shard_assign_random(uint64_t seed, uint32_t paths, uint64_t ndocs, uint32_t *assign)
{
	int64_t n = (int64_t)ndocs;

#pragma omp parallel for schedule(static) if (n > 65536)
	for (int64_t d = 0; d < n; d++)
		assign[d] = (uint32_t)rng_below(seed, RNG_STREAM_SHARD, (uint64_t)d, paths);
}

static int name_digits(uint32_t paths)
{
	int k = 1;

	for (uint32_t v = paths - 1; v >= 10; v /= 10)
		k++;
	return k < 3 ? 3 : k;
}

int shard_file_name(char *buf, size_t n, uint32_t s, uint32_t paths)
{
	int k = snprintf(buf, n, "shard-%0*u.tok", name_digits(paths), s);

	if (k < 0 || (size_t)k >= n)
		return err_set(CORE_EUSAGE, NULL, "shard file name too long");
	return 0;
}

static int join(char *buf, size_t n, const char *dir, const char *name)
{
	int k = snprintf(buf, n, "%s/%s", dir, name);

	if (k < 0 || (size_t)k >= n)
		return err_set(CORE_EUSAGE, dir, "output directory name too long");
	return 0;
}

/* A name of any split's shard file: "shard-" digits ".tok". Its number and digit count. */
static int is_shard_name(const char *name, unsigned long *num, size_t *digits)
{
	const char *p = name + 6, *q = p;

	if (strncmp(name, "shard-", 6) != 0)
		return 0;
	while (*q >= '0' && *q <= '9')
		q++;
	if (q == p || q - p > 9 || strcmp(q, ".tok") != 0)
		return 0;
	*num = strtoul(p, NULL, 10);
	*digits = (size_t)(q - p);
	return 1;
}

/* Is name one of the files a split into paths shards writes? */
static int in_split(const char *name, uint32_t paths)
{
	unsigned long num;
	size_t digits;

	if (!is_shard_name(name, &num, &digits))
		return 0;
	return digits == (size_t)name_digits(paths) && num < paths;
}

/* Refuse (CORE_EIO on the smallest such name, so the message does not depend on readdir's
 * order) when outdir holds a manifest or any shard file. A missing outdir holds nothing. */
static int check_existing(const char *outdir)
{
	DIR *d = opendir(outdir);
	struct dirent *e;
	char first[256] = "", path[4096];
	unsigned long num;
	size_t digits;

	if (!d) {
		if (errno == ENOENT)
			return 0;
		return err_errno(CORE_EIO, outdir, "cannot read directory", errno);
	}
	while ((e = readdir(d))) {
		if (strcmp(e->d_name, SHARD_MANIFEST) != 0 && !is_shard_name(e->d_name, &num, &digits))
			continue;
		if (!first[0] || strcmp(e->d_name, first) < 0)
			snprintf(first, sizeof first, "%s", e->d_name);
	}
	closedir(d);
	if (!first[0])
		return 0;
	ERR_FORWARD(join(path, sizeof path, outdir, first));
	return err_set(CORE_EIO, path, "exists (use --force to replace it)");
}

/* After a forced split: remove shard files of an earlier split with another P. */
static int remove_stale(const char *outdir, uint32_t paths)
{
	DIR *d = opendir(outdir);
	struct dirent *e;
	char path[4096];
	unsigned long num;
	size_t digits;
	int rc = 0;

	if (!d)
		return err_errno(CORE_EIO, outdir, "cannot read directory", errno);
	while ((e = readdir(d))) {
		if (!is_shard_name(e->d_name, &num, &digits) || in_split(e->d_name, paths))
			continue;
		if ((rc = join(path, sizeof path, outdir, e->d_name)) < 0)
			break;
		if (unlink(path) != 0 && errno != ENOENT) {
			rc = err_errno(CORE_EIO, path, "cannot remove a shard of the earlier split",
				       errno);
			break;
		}
	}
	closedir(d);
	return rc;
}

/* Per-shard counts of assign into r->shard; checks every index and every shard's size. */
static int count_shards(const struct tokfile *in, const uint32_t *assign, uint32_t paths,
			int top, struct shard_split_result *r)
{
	for (uint64_t i = 0; i < in->ndocs * (uint64_t)top; i++) {
		const uint64_t d = i / (uint64_t)top;
		uint32_t s = assign[i];
		if (s >= paths)
			return err_set(CORE_EUSAGE, in->path,
				       "document %llu assigned to shard %u of %u",
				       (unsigned long long)d, s, paths);
		for (uint64_t j = d * (uint64_t)top; j < i; j++)
			if (assign[j] == s)
				return err_set(CORE_EUSAGE, in->path, "document %llu assigned to "
					       "shard %u twice", (unsigned long long)d, s);
		r->shard[s].docs++;
		r->shard[s].tokens += in->offsets[d + 1] - in->offsets[d];
	}
	const char *hint = strcmp(r->method, "random") == 0
				   ? "use fewer shards or another seed"
				   : "the router sends no document there: refit it, or route with "
				     "--top 2";
	for (uint32_t s = 0; s < paths; s++) {
		if (r->shard[s].docs == 0 && in->ndocs < paths)
			return err_set(CORE_ESHAPE, in->path,
				       "shard %u of %u would be empty: the file has only %llu "
				       "document%s", s, paths, (unsigned long long)in->ndocs,
				       in->ndocs == 1 ? "" : "s");
		if (r->shard[s].docs == 0)
			return err_set(CORE_ESHAPE, in->path,
				       "shard %u of %u would be empty: none of the %llu documents "
				       "falls into it (%s)", s, paths, (unsigned long long)in->ndocs,
				       hint);
		if (r->shard[s].tokens < SHARD_MIN_TOKENS)
			return err_set(CORE_ESHAPE, in->path,
				       "shard %u of %u would hold %llu token%s, fewer than %d "
				       "(%s)", s, paths, (unsigned long long)r->shard[s].tokens,
				       r->shard[s].tokens == 1 ? "" : "s", SHARD_MIN_TOKENS, hint);
	}
	return 0;
}

/* Write the documents order[0 .. ndocs) of in to a new token file at path and prepare it
 * (complete and synced under its temporary name); *w is the writer, for commit or abort. */
static int write_shard(const struct tokfile *in, const char *path, const uint64_t *order,
		       uint64_t ndocs, uint32_t *wide, struct tokfile_writer **w,
		       const struct shard_split_opts *o, uint64_t *done)
{
	ERR_FORWARD(tokw_open(w, path, in->vocab));
	tokw_set_tokenizer(*w, in->tokenizer);
	for (uint64_t i = 0; i < ndocs; i++) {
		uint64_t d = order[i], t0 = in->offsets[d], n = in->offsets[d + 1] - t0;
		const uint32_t *tok;
		size_t mlen;
		const char *meta = tokfile_doc_meta(in, d, &mlen);

		if (in->width == 4) {
			tok = (const uint32_t *)in->tokens + t0;
		} else {
			for (uint64_t j = 0; j < n; j++)
				wide[j] = ((const uint16_t *)in->tokens)[t0 + j];
			tok = wide;
		}
		ERR_FORWARD(tokw_add_doc(*w, tok, n, meta, mlen));
		if (o->progress && ++*done % PROGRESS_EVERY == 0)
			o->progress(o->progress_ctx, *done, in->ndocs);
	}
	return tokw_prepare(*w);
}

/* The manifest's text, written and synced under a temporary name. */
static int prepare_manifest(const char *path, const struct shard_split_result *r,
			    struct afile *af)
{
	json_t *j = shard_manifest_json(r);
	char *text;
	int rc;

	if (!j)
		return err_set(CORE_ENOMEM, path, "cannot build the manifest");
	text = json_dumps(j, JSON_INDENT(2));
	json_decref(j);
	if (!text)
		return err_set(CORE_ENOMEM, path, "cannot build the manifest");
	rc = afile_open(af, path);
	if (rc == 0)
		rc = afile_write(af, text, strlen(text));
	if (rc == 0)
		rc = afile_write(af, "\n", 1);
	if (rc == 0)
		rc = afile_prepare(af);
	free(text);
	return rc;
}

int shard_split_write(const struct tokfile *in, const uint32_t *assign, const char *method,
		      const struct shard_split_opts *o, struct shard_split_result *r)
{
	struct tokfile_writer **w = NULL;
	struct afile manifest = { 0 };
	uint64_t *start = NULL, *order = NULL, maxlen = 0, done = 0;
	uint32_t *wide = NULL, P = o->paths, s;
	char name[64], path[4096];
	int rc;
	char made[PATH_MAX] = "";

	const int top = o->top ? o->top : 1;
	memset(r, 0, sizeof *r);
	if (P < 1 || P > SHARD_MAX_PATHS)
		return err_set(CORE_EUSAGE, NULL, "number of shards %u is outside [1, %d]", P,
			       SHARD_MAX_PATHS);
	if (top > 2 || (uint32_t)top > P)
		return err_set(CORE_EUSAGE, NULL, "each document in %d of %u shards: 1 or 2, at "
			       "most the number of shards", top, P);
	r->shard = calloc(P, sizeof *r->shard);
	r->source = strdup(in->path);
	if (!r->shard || !r->source) {
		rc = err_set(CORE_ENOMEM, in->path, "out of memory");
		goto out;
	}
	r->source_crc = in->crc;
	if (o->router && !(r->router = strdup(o->router))) {
		rc = err_set(CORE_ENOMEM, in->path, "out of memory");
		goto out;
	}
	r->method = method;
	r->seed = o->seed;
	r->top = top;
	r->paths = P;
	r->vocab = in->vocab;
	r->docs = in->ndocs;
	r->tokens = in->ntokens;
	if ((rc = count_shards(in, assign, P, top, r)) < 0)
		goto out;
	if (!o->force && (rc = check_existing(o->outdir)) < 0)
		goto out;

	/* Stable counting sort: order[start[s] .. start[s + 1]) are shard s's documents in
	 * input order. */
	start = calloc((size_t)P + 1, sizeof *start);
	order = malloc((in->ndocs ? in->ndocs * (uint64_t)top : 1) * sizeof *order);
	w = calloc(P, sizeof *w);
	for (uint64_t d = 0; d < in->ndocs; d++)
		if (in->offsets[d + 1] - in->offsets[d] > maxlen)
			maxlen = in->offsets[d + 1] - in->offsets[d];
	wide = malloc((in->width == 2 && maxlen ? maxlen : 1) * sizeof *wide);
	if (!start || !order || !w || !wide) {
		rc = err_set(CORE_ENOMEM, in->path, "out of memory");
		goto out;
	}
	for (s = 0; s < P; s++)
		start[s + 1] = start[s] + r->shard[s].docs;
	for (uint64_t i = 0; i < in->ndocs * (uint64_t)top; i++)
		order[start[assign[i]]++] = i / (uint64_t)top;
	for (s = P; s > 0; s--) /* start[] was advanced to each shard's end; shift it back */
		start[s] = start[s - 1];
	start[0] = 0;

	if ((rc = dir_make(o->outdir, made, sizeof made)) < 0)
		goto out;
	for (s = 0; s < P; s++) {
		if ((rc = shard_file_name(name, sizeof name, s, P)) < 0 ||
		    (rc = join(path, sizeof path, o->outdir, name)) < 0)
			goto out;
		rc = write_shard(in, path, order + start[s], start[s + 1] - start[s], wide, &w[s],
				 o, &done);
		if (rc < 0)
			goto out;
	}
	if ((rc = join(path, sizeof path, o->outdir, SHARD_MANIFEST)) < 0 ||
	    (rc = prepare_manifest(path, r, &manifest)) < 0)
		goto out;
	if (o->progress)
		o->progress(o->progress_ctx, done, in->ndocs);

	/* Everything is complete on disk; now the renames, the manifest last. */
	for (s = 0; s < P; s++) {
		rc = tokw_commit(w[s]);
		w[s] = NULL;
		if (rc < 0)
			goto out;
	}
	if ((rc = afile_commit(&manifest)) < 0)
		goto out;
	if (o->force)
		rc = remove_stale(o->outdir, P);
out:
	for (s = 0; w && s < P; s++)
		tokw_abort(w[s]);
	afile_abort(&manifest);
	/* Folders made for outputs that never came are removed again (if still empty). */
	if (rc < 0)
		dir_unmake(o->outdir, made);
	free(w);
	free(wide);
	free(order);
	free(start);
	if (rc < 0)
		shard_split_result_free(r);
	return rc;
}

int shard_split_random(const char *input, const struct shard_split_opts *o,
		       struct shard_split_result *r)
{
	struct tokfile tf;
	uint32_t *assign;
	int rc;

	memset(r, 0, sizeof *r);
	if (o->paths < 1 || o->paths > SHARD_MAX_PATHS)
		return err_set(CORE_EUSAGE, NULL, "number of shards %u is outside [1, %d]",
			       o->paths, SHARD_MAX_PATHS);
	ERR_FORWARD(tokfile_open(&tf, input));
	assign = malloc((tf.ndocs ? tf.ndocs : 1) * sizeof *assign);
	if (!assign) {
		tokfile_close(&tf);
		return err_set(CORE_ENOMEM, input, "out of memory");
	}
	shard_assign_random(o->seed, o->paths, tf.ndocs, assign);
	rc = shard_split_write(&tf, assign, "random", o, r);
	free(assign);
	tokfile_close(&tf);
	return rc;
}

int shard_manifest_read(const char *dir, uint32_t *paths, uint64_t **tokens)
{
	char path[4096], name[64];
	json_error_t je;
	int rc = 0;

	*paths = 0;
	*tokens = NULL;
	ERR_FORWARD(join(path, sizeof path, dir, SHARD_MANIFEST));
	if (access(path, F_OK) != 0)
		return err_set(CORE_ENOTFOUND, path, "no shard manifest (make the shards with "
			       "dpc-shard split)");
	json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return err_set(CORE_EFORMAT, path, "line %d: %.200s", je.line, je.text);
	json_t *sh = json_object_get(root, "shards"), *np = json_object_get(root, "paths");
	if (!json_is_array(sh) || !json_is_integer(np) || json_integer_value(np) < 1 ||
	    json_integer_value(np) > SHARD_MAX_PATHS ||
	    json_array_size(sh) != (size_t)json_integer_value(np)) {
		json_decref(root);
		return err_set(CORE_EFORMAT, path, "not a shard manifest (no 'paths' and 'shards' "
			       "of that length)");
	}
	const uint32_t P = (uint32_t)json_integer_value(np);
	uint64_t *tk = calloc(P, sizeof *tk);
	if (!tk)
		rc = err_set(CORE_ENOMEM, path, "out of memory");
	for (uint32_t s = 0; !rc && s < P; s++) {
		json_t *e = json_array_get(sh, s), *t = json_object_get(e, "tokens");
		const char *f = json_string_value(json_object_get(e, "file"));
		rc = shard_file_name(name, sizeof name, s, P);
		if (!rc && (!json_is_integer(t) || json_integer_value(t) < SHARD_MIN_TOKENS))
			rc = err_set(CORE_EFORMAT, path, "shard %u has no valid 'tokens'", s);
		else if (!rc && (!f || strcmp(f, name) != 0))
			rc = err_set(CORE_EFORMAT, path, "shard %u is '%.64s', not '%s'", s,
				     f ? f : "(no file)", name);
		else if (!rc)
			tk[s] = (uint64_t)json_integer_value(t);
	}
	json_decref(root);
	if (rc) {
		free(tk);
		return rc;
	}
	*paths = P;
	*tokens = tk;
	return 0;
}

json_t *shard_manifest_json(const struct shard_split_result *r)
{
	json_t *shards = json_array();
	char crc[16], name[64];

	if (!shards)
		return NULL;
	for (uint32_t s = 0; s < r->paths; s++) {
		if (shard_file_name(name, sizeof name, s, r->paths) < 0 ||
		    json_array_append_new(shards, json_pack("{s:s,s:I,s:I}", "file", name, "docs",
							    (json_int_t)r->shard[s].docs,
							    "tokens",
							    (json_int_t)r->shard[s].tokens)) < 0) {
			json_decref(shards);
			return NULL;
		}
	}
	snprintf(crc, sizeof crc, "%08x", r->source_crc);
	/* "o" takes the reference to shards, also when the pack fails. */
	json_t *j = json_pack("{s:s,s:s,s:s,s:I,s:I,s:o}", "source", r->source, "source_crc",
			      crc, "method", r->method, "seed", (json_int_t)r->seed, "paths",
			      (json_int_t)r->paths, "shards", shards);
	/* Fields of routed splits only, so that a random split's manifest stays as it was. */
	if (j && r->top > 1 && json_object_set_new(j, "top", json_integer(r->top)) < 0)
		goto fail;
	if (j && r->router && json_object_set_new(j, "router", json_string(r->router)) < 0)
		goto fail;
	return j;
fail:
	json_decref(j);
	return NULL;
}

void shard_split_result_free(struct shard_split_result *r)
{
	free(r->router);
	free(r->source);
	free(r->shard);
	memset(r, 0, sizeof *r);
}
