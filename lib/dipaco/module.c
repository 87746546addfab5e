/* module.c - module checkpoints and the checks every reader of a run's files makes; see
 * module.h. */
#include "dipaco/module.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "common/err.h"
#include "io/atomicio.h"
#include "model/checkpoint.h"
#include "common/banned.h"

/* The model shape keys every checkpoint carries (as ckpt_save writes them). */
struct shape_meta {
	char l[16], c[16], h[16], t[16], v[16];
};

static void shape_meta(struct shape_meta *s, const struct model_config *mc)
{
	snprintf(s->l, sizeof s->l, "%d", mc->n_layer);
	snprintf(s->c, sizeof s->c, "%d", mc->n_embd);
	snprintf(s->h, sizeof s->h, "%d", mc->n_head);
	snprintf(s->t, sizeof s->t, "%d", mc->seq_len);
	snprintf(s->v, sizeof s->v, "%d", mc->vocab_size);
}

int module_tokenizer(const struct st_file *f, struct tokenizer_id *run)
{
	struct tokenizer_id id;
	char a[TOKENIZER_ID_LEN], b[TOKENIZER_ID_LEN];

	ERR_FORWARD(ckpt_meta_tokenizer_id(f, &id));
	if (tokenizer_id_differ(id, *run)) {
		tokenizer_id_str(&id, a);
		tokenizer_id_str(run, b);
		return err_set(CORE_EFORMAT, f->path, "trained on tokens of tokenizer %s, the "
			       "run's other files on %s", a, b);
	}
	if (id.kind != TOKENIZER_NONE)
		*run = id;
	return 0;
}

int module_writer_open(struct st_writer **w, const char *path, const struct topology *t, int m,
		       long phase, const char *config_hash, const char *init,
		       struct tokenizer_id tok)
{
	const struct topo_module *md = &t->modules[m];
	const int n = 2 * md->nviews;
	struct tensor *specs = calloc((size_t)n, sizeof *specs);
	const struct tensor **ptrs = calloc((size_t)n, sizeof *ptrs);
	char *paths = malloc((size_t)md->npaths * 8 + 1);
	int rc;

	if (!specs || !ptrs || !paths) {
		rc = err_set(CORE_ENOMEM, path, "out of memory");
		goto out;
	}
	int k = 0;
	for (int i = 0; i < t->layout.n; i++) {
		if (!topo_owns(t, m, i))
			continue;
		char name[TENSOR_NAME_MAX + 16];
		specs[k] = t->layout.views[i];
		ptrs[k] = &specs[k];
		k++;
		snprintf(name, sizeof name, MODULE_MOMENTUM_PREFIX "%s", t->layout.views[i].name);
		tensor_view(&specs[k], DT_F32, t->layout.views[i].ndim, t->layout.views[i].ne, NULL,
			    name);
		ptrs[k] = &specs[k];
		k++;
	}
	size_t off = 0;
	paths[0] = '\0';
	for (int i = 0; i < md->npaths; i++)
		off += (size_t)snprintf(paths + off, 8, "%s%d", i ? "," : "", md->paths[i]);
	char sphase[32], sindex[16];
	struct shape_meta sm;
	shape_meta(&sm, &t->model);
	snprintf(sphase, sizeof sphase, "%ld", phase);
	snprintf(sindex, sizeof sindex, "%d", md->index);
	char stok[TOKENIZER_ID_LEN];
	tokenizer_id_str(&tok, stok);
	struct st_kv meta[] = {
		{"format", CKPT_FORMAT}, {"kind", "module"}, {"module", md->name},
		{"level", t->levels[md->level].name}, {"index", sindex}, {"phase", sphase},
		{"paths", paths}, {"optimizer", "outer-momentum"}, {"n_layer", sm.l},
		{"n_embd", sm.c}, {"n_head", sm.h}, {"seq_len", sm.t}, {"vocab_size", sm.v},
		{"config_hash", config_hash}, {NULL, NULL}, {NULL, NULL},
	};
	int nmeta = (int)(sizeof meta / sizeof meta[0]) - 2;
	if (tok.kind != TOKENIZER_NONE)
		meta[nmeta++] = (struct st_kv){"tokenizer", stok};
	if (init)
		meta[nmeta++] = (struct st_kv){"init", init};
	rc = st_writer_open(w, path, ptrs, n, meta, nmeta);
out:
	free(specs);
	free(ptrs);
	free(paths);
	return rc;
}

/* "checkpoint D", or with moments "checkpoint D moments of step S": the one format. */
static int checkpoint_label(const char *path, int moments, char out[MODULE_INIT_MAX])
{
	char d[CKPT_DIGEST_CHARS + 1];
	struct ckpt_info in;

	ERR_FORWARD(ckpt_info(path, &in));
	if (moments && !in.has_optim)
		return err_set(CORE_EFORMAT, path, "holds no AdamW moments");
	ERR_FORWARD(ckpt_digest(path, d));
	if (moments)
		snprintf(out, MODULE_INIT_MAX, "checkpoint %s moments of step %ld", d, in.step);
	else
		snprintf(out, MODULE_INIT_MAX, "checkpoint %s", d);
	return 0;
}

/* The label of a fork's copied moments file. */
static int moments_label(const char *path, char out[MODULE_INIT_MAX])
{
	return checkpoint_label(path, 1, out);
}

int module_init_label(const struct module_init *src, const struct model_config *want,
		      char out[MODULE_INIT_MAX])
{
	struct ckpt_info in;
	struct st_file f;

	if (!src->from) {
		snprintf(out, MODULE_INIT_MAX, "seed %llu", (unsigned long long)src->seed);
		return 0;
	}
	ERR_FORWARD(st_open(&f, src->from, 0));
	const char *kind = st_meta(&f, "kind");
	int rc = 0;
	if (!kind || strcmp(kind, "path"))
		rc = err_set(CORE_ECONFIG, src->from, "is a %.20s checkpoint, not a model's (one "
			     "of dpc-train-path, or a path of a run)", kind ? kind : "unlabelled");
	st_close(&f);
	if (!rc)
		rc = ckpt_info(src->from, &in);
	const struct model_config *a = &in.model;
	if (!rc && src->moments && !in.has_optim)
		rc = err_set(CORE_ECONFIG, src->from, "holds no AdamW moments to start the paths "
			     "from (a checkpoint written with them, or no --moments)");
	if (!rc && !config_model_equal(a, want))
		rc = err_set(CORE_ECONFIG, src->from, "is a model of L=%d C=%d NH=%d T=%d V=%d, "
			     "the run's config says L=%d C=%d NH=%d T=%d V=%d", a->n_layer,
			     a->n_embd, a->n_head, a->seq_len, a->vocab_size, want->n_layer,
			     want->n_embd, want->n_head, want->seq_len, want->vocab_size);
	if (rc)
		return rc;
	return checkpoint_label(src->from, src->moments, out);
}

int module_write_fork_moments(const char *path, const struct module_init *src,
			      const char *label)
{
	char have[MODULE_INIT_MAX], *buf = NULL;
	struct st_file f;
	size_t n = 0;

	if (access(path, F_OK) == 0) {
		if (!src->moments)
			return err_set(CORE_ECONFIG, path, "exists: this run was made with --moments "
				       "(another run directory, or --moments)");
		ERR_FORWARD(moments_label(path, have));
		if (strcmp(have, label))
			return err_set(CORE_ECONFIG, path, "is %s, not %s (another run directory, "
				       "or remove this one)", have, label);
		return 0;
	}
	if (!src->moments)
		return 0;
	ERR_FORWARD(st_open(&f, src->from, 1)); /* the whole file's crc before it is copied */
	st_close(&f);
	int rc = file_read_regular(src->from, 0, &buf, &n);
	if (!rc)
		rc = file_write_atomic(path, buf, n);
	free(buf);
	if (!rc)
		rc = moments_label(path, have);
	if (!rc && strcmp(have, label))
		rc = err_set(CORE_EIO, src->from, "changed while it was copied to %s", path);
	return rc;
}

int module_check_init(const struct st_file *f, const char *label)
{
	const char *was = st_meta(f, "init");

	if (!was && strncmp(label, "seed ", 5) == 0)
		return 0;
	if (was && strcmp(was, label) == 0)
		return 0;
	return err_set(CORE_ECONFIG, f->path, "was initialised from %.60s, not from %s (another "
		       "run directory, or remove this one, to start from %s)",
		       was ? was : "the seeded initialisation", label,
		       strncmp(label, "seed ", 5) ? "the checkpoint" : "the seed");
}

/* View i's values from the source: the checkpoint's tensor of that name, or the seeded
 * initialisation. */
static int init_values(const struct topology *t, int i, const struct module_init *src,
		       struct st_file *ck, struct backend *be, float *buf)
{
	const struct tensor *v = &t->layout.views[i];
	struct tensor dst;

	if (!ck)
		return gpt2_init_view(&t->layout, i, be, buf, src->seed);
	tensor_view(&dst, DT_F32, v->ndim, v->ne, buf, v->name);
	ERR_FORWARD(st_read(ck, v->name, &dst));
	for (size_t k = 0, n = (size_t)tensor_numel(v); k < n; k++)
		if (!isfinite(buf[k]))
			return err_set(CORE_ENAN, ck->path, "tensor '%s' holds a non-finite value",
				       v->name);
	return 0;
}

int module_write_init(const char *path, const struct topology *t, int m,
		      const struct module_init *src, const char *label, const char *config_hash)
{
	struct backend *be = NULL;
	struct st_writer *w = NULL;
	struct st_file ck;
	int have_ck = 0;
	float *buf = NULL, *zero = NULL;
	size_t maxn = 0;
	int rc;

	for (int i = 0; i < t->layout.n; i++)
		if (topo_owns(t, m, i) && (size_t)tensor_numel(&t->layout.views[i]) > maxn)
			maxn = (size_t)tensor_numel(&t->layout.views[i]);
	if (src->from) {
		ERR_FORWARD(st_open(&ck, src->from, 1));
		have_ck = 1;
	}
	/* The reference of every backend draws the same numbers; the CPU one is host memory. */
	rc = backend_open(&be, "cpu", &(struct backend_params){.threads = 1});
	if (rc)
		goto out;
	buf = malloc(sizeof *buf * (maxn ? maxn : 1));
	zero = calloc(maxn ? maxn : 1, sizeof *zero);
	if (!buf || !zero) {
		rc = err_set(CORE_ENOMEM, path, "out of memory for %zu floats", maxn);
		goto out;
	}
	/* a checkpoint's modules were trained on its tokens; seeded ones on none yet */
	struct tokenizer_id tok = {0};
	if (have_ck && (rc = module_tokenizer(&ck, &tok)) == 0)
		tok = tokenizer_id_known(tok, (uint32_t)t->model.vocab_size);
	if (!rc)
		rc = module_writer_open(&w, path, t, m, 0, config_hash, label, tok);
	for (int i = 0; i < t->layout.n && !rc; i++) {
		if (!topo_owns(t, m, i))
			continue;
		size_t n = (size_t)tensor_numel(&t->layout.views[i]);
		rc = init_values(t, i, src, have_ck ? &ck : NULL, be, buf);
		if (!rc)
			rc = st_writer_put(w, buf, sizeof *buf * n);
		if (!rc)
			rc = st_writer_put(w, zero, sizeof *zero * n);
	}
	if (w) {
		if (rc)
			st_writer_abort(w);
		else
			rc = st_writer_commit(w);
	}
out:
	free(buf);
	free(zero);
	if (be)
		backend_close(be);
	if (have_ck)
		st_close(&ck);
	return rc;
}

/* Format, kind, config hash: the checks common to module and path checkpoints. */
static int check_common(const struct st_file *f, const char *kind, const char *config_hash)
{
	const char *fmt = st_meta(f, "format"), *k = st_meta(f, "kind"),
		   *h = st_meta(f, "config_hash");

	if (!fmt || strcmp(fmt, CKPT_FORMAT))
		return err_set(CORE_EFORMAT, f->path, "not a dpc checkpoint");
	if (!k || strcmp(k, kind))
		return err_set(CORE_EFORMAT, f->path, "is a %.20s checkpoint, expected a %s "
			       "checkpoint", k ? k : "unlabelled", kind);
	if (!h || strcmp(h, config_hash))
		return err_set(CORE_EFORMAT, f->path, "was made with another config (config_hash "
			       "%.20s, this run's is %s)", h ? h : "missing", config_hash);
	return 0;
}

int module_open(struct st_file *f, const char *path, const struct topology *t, int m,
		long phase, const char *config_hash, int verify)
{
	long ph;
	int rc;

	ERR_FORWARD(st_open(f, path, verify));
	rc = check_common(f, "module", config_hash);
	const char *name = st_meta(f, "module");
	if (!rc && (!name || strcmp(name, t->modules[m].name)))
		rc = err_set(CORE_EFORMAT, path, "holds module '%.40s', expected '%s'",
			     name ? name : "?", t->modules[m].name);
	if (!rc)
		rc = st_meta_long(f, "phase", 0, LONG_MAX, &ph);
	if (!rc && ph != phase)
		rc = err_set(CORE_EFORMAT, path, "is from phase %ld, expected phase %ld", ph, phase);
	if (rc)
		st_close(f);
	return rc;
}

int pathckpt_open(struct st_file *f, const char *path, int p, long phase,
		  const char *config_hash, long *step, long *tokens, int verify)
{
	long ph = 0, pi = 0, st = 0, tk = 0;
	int rc;

	ERR_FORWARD(st_open(f, path, verify));
	rc = check_common(f, "path", config_hash);
	if (!rc)
		rc = st_meta_long(f, "phase", 0, LONG_MAX, &ph);
	if (!rc && ph != phase)
		rc = err_set(CORE_EFORMAT, path, "is from phase %ld, expected phase %ld", ph, phase);
	if (!rc)
		rc = st_meta_long(f, "path", 0, LONG_MAX, &pi);
	if (!rc && pi != p)
		rc = err_set(CORE_EFORMAT, path, "is path %ld, expected path %d", pi, p);
	if (!rc)
		rc = st_meta_long(f, "step", 0, LONG_MAX, &st);
	if (!rc)
		rc = st_meta_long(f, "shard_tokens", 0, LONG_MAX, &tk);
	if (rc) {
		st_close(f);
		return rc;
	}
	if (step)
		*step = st;
	if (tokens)
		*tokens = tk;
	return 0;
}
