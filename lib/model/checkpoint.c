/* checkpoint.c - GPT-2 checkpoints over lib/safetensors; see checkpoint.h. */
#include "model/checkpoint.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/crc.h"
#include "common/err.h"
#include "io/atomicio.h"
#include "io/safetensors.h"
#include "common/banned.h"

/* The three flat buffers a checkpoint holds, and the prefix of their tensors' names. */
enum { BUF_PARAMS, BUF_EXP_AVG, BUF_EXP_AVG_SQ, NBUF };
static const char *const buf_prefix[NBUF] = {"", "optim.exp_avg.", "optim.exp_avg_sq."};

static float *model_buffer(const struct gpt2 *g, int which)
{
	return which == BUF_PARAMS ? g->params : which == BUF_EXP_AVG ? g->m : g->v;
}

/* View i of g over base, a host buffer laid out as g->params, named prefix + HF name. */
static void view_over(const struct gpt2 *g, int i, float *base, int which, struct tensor *out)
{
	const struct tensor *p = &g->views[i];
	size_t off = (size_t)((const float *)p->data - g->params);
	char name[TENSOR_NAME_MAX];

	snprintf(name, sizeof name, "%s%s", buf_prefix[which], p->name);
	tensor_view(out, DT_F32, p->ndim, p->ne, base + off, name);
}

/* The host memory holding buffer `which` of g: the buffer itself when the backend's memory
 * is host memory, else a staging copy (*staged, which the caller frees; downloaded when
 * fetch is set). */
static int host_buffer(const struct gpt2 *g, int which, int fetch, float **host, float **staged)
{
	struct backend *be = g->be;
	*staged = NULL;
	if (be->host_visible) {
		*host = model_buffer(g, which);
		return 0;
	}
	*staged = malloc(sizeof(float) * g->nparams);
	if (!*staged)
		return err_set(CORE_ENOMEM, NULL, "cannot stage %zu parameters on the host",
			       g->nparams);
	*host = *staged;
	return fetch ? be->op->download(be, *staged, model_buffer(g, which),
					sizeof(float) * g->nparams)
		     : 0;
}

int ckpt_save(const char *path, const struct gpt2 *g, const struct run_config *c, long step,
	      int with_optim, const struct st_kv *extra, int nextra)
{
	if (with_optim && g->forward_only)
		return err_set(CORE_EUSAGE, path, "a forward-only model has no optimizer state");
	const int nbuf = with_optim ? NBUF : 1, n = g->nviews * nbuf;
	const struct tensor **ts = calloc((size_t)n, sizeof *ts);
	struct tensor *views = calloc((size_t)n, sizeof *views);
	float *staged[NBUF] = {NULL};
	size_t dumplen = config_dump(c, NULL, 0) + 1;
	char *dump = malloc(dumplen);
	int rc = 0;

	if (!ts || !views || !dump) {
		rc = err_set(CORE_ENOMEM, path, "out of memory");
		goto out;
	}
	config_dump(c, dump, dumplen);
	for (int w = 0; w < nbuf && rc == 0; w++) {
		float *host = NULL;
		rc = host_buffer(g, w, 1, &host, &staged[w]);
		for (int i = 0; i < g->nviews && rc == 0; i++) {
			view_over(g, i, host, w, &views[w * g->nviews + i]);
			ts[w * g->nviews + i] = &views[w * g->nviews + i];
		}
	}
	if (rc)
		goto out;

	char sstep[32], sl[16], sc[16], sh[16], st[16], sv[16], so[16], hm[17], ha[17];
	snprintf(sstep, sizeof sstep, "%ld", step);
	snprintf(sl, sizeof sl, "%d", g->cfg.n_layer);
	snprintf(sc, sizeof sc, "%d", g->cfg.n_embd);
	snprintf(sh, sizeof sh, "%d", g->cfg.n_head);
	snprintf(st, sizeof st, "%d", g->cfg.seq_len);
	snprintf(sv, sizeof sv, "%d", g->cfg.vocab_size);
	snprintf(so, sizeof so, "%d", g->cfg.n_out);
	config_hash_model(c, hm);
	config_hash_all(c, ha);
	enum { NFIXED = 12, NEXTRA_MAX = 8 };
	struct st_kv meta[NFIXED + 2 + NEXTRA_MAX] = {
		{"format", CKPT_FORMAT}, {"kind", "path"}, {"step", sstep},
		{"optimizer", with_optim ? "adamw" : "none"},
		{"n_layer", sl}, {"n_embd", sc}, {"n_head", sh}, {"seq_len", st},
		{"vocab_size", sv}, {"config_hash_model", hm}, {"config_hash", ha},
		{"config", dump},
	};
	int nmeta = NFIXED;
	if (g->cfg.n_out) /* a head over classes (read_info reads it back) */
		meta[nmeta++] = (struct st_kv){"n_out", so};
	char tok[TOKENIZER_ID_LEN];
	tokenizer_id_str(&g->cfg.tokenizer, tok);
	if (g->cfg.tokenizer.kind != TOKENIZER_NONE)
		meta[nmeta++] = (struct st_kv){"tokenizer", tok};
	if (nextra < 0 || nextra > NEXTRA_MAX) {
		rc = err_set(CORE_EUSAGE, path, "%d extra metadata pairs (at most %d)", nextra,
			     NEXTRA_MAX);
		goto out;
	}
	for (int i = 0; i < nextra; i++)
		meta[nmeta++] = extra[i];
	rc = st_write(path, ts, n, meta, nmeta);
out:
	for (int w = 0; w < NBUF; w++)
		free(staged[w]);
	free(ts);
	free(views);
	free(dump);
	return rc;
}

/* The "section.key: value" lines of a "config" metadata text (config_dump's) that start with
 * prefix, applied to c as overrides "section.key=value" (a value in double quotes loses
 * them). */
static int meta_config(const char *text, const char *prefix, const char *path,
		       struct run_config *c)
{
	char line[256];
	const size_t np = strlen(prefix);

	for (const char *p = text; p && *p;) {
		const char *nl = strchr(p, '\n'), *end = nl ? nl : p + strlen(p);
		size_t n = (size_t)(end - p);
		if (n < sizeof line && strncmp(p, prefix, np) == 0) {
			memcpy(line, p, n);
			line[n] = '\0';
			char *colon = strstr(line, ": ");
			if (colon) {
				*colon = '=';
				memmove(colon + 1, colon + 2, strlen(colon + 2) + 1);
				size_t vl = strlen(colon + 1);
				if (vl >= 2 && colon[1] == '"' && colon[vl] == '"') {
					colon[vl] = '\0';
					memmove(colon + 1, colon + 2, vl - 1);
				}
				if (config_set(c, line) < 0)
					return err_set(CORE_EFORMAT, path, "its config metadata: %s",
						       err_detail());
			}
		}
		p = nl ? nl + 1 : NULL;
	}
	return 0;
}

int ckpt_meta_tokenizer_id(const struct st_file *f, struct tokenizer_id *id)
{
	const char *t = st_meta(f, "tokenizer");

	*id = (struct tokenizer_id){0};
	if (t && tokenizer_id_parse(t, id) < 0)
		return err_set(CORE_EFORMAT, f->path, "metadata tokenizer '%.40s' is not byte or "
			       "spm- and 16 hex digits", t);
	return 0;
}

int ckpt_meta_tokenizer(const struct st_file *f, struct model_config *m)
{
	ERR_FORWARD(ckpt_meta_tokenizer_id(f, &m->tokenizer));
	if (m->tokenizer.kind == TOKENIZER_BYTE && m->vocab_size != 256)
		return err_set(CORE_EFORMAT, f->path, "metadata tokenizer byte with a vocabulary of "
			       "%d", m->vocab_size);
	m->tokenizer = tokenizer_id_known(m->tokenizer, (uint32_t)m->vocab_size);
	return 0;
}

static int read_info(struct st_file *f, struct ckpt_info *info)
{
	const char *fmt = st_meta(f, "format");
	long v[5];
	static const char *const keys[5] = {"n_layer", "n_embd", "n_head", "seq_len",
					    "vocab_size"};

	if (!fmt || strcmp(fmt, CKPT_FORMAT) != 0)
		return err_set(CORE_EFORMAT, f->path, "not a dpc checkpoint (metadata format is %s%s%s)",
			       fmt ? "'" : "", fmt ? fmt : "missing", fmt ? "'" : "");
	for (int i = 0; i < 5; i++)
		ERR_FORWARD(st_meta_long(f, keys[i], 1, INT_MAX, &v[i]));
	info->model = (struct model_config){.n_layer = (int)v[0], .n_embd = (int)v[1], .n_head = (int)v[2],
					     .seq_len = (int)v[3], .vocab_size = (int)v[4]};
	const char *text = st_meta(f, "config");
	if (text && strstr(text, "\nmoe.experts: ")) { /* an MoE model: its moe section */
		struct run_config c;
		config_defaults(&c);
		ERR_FORWARD(meta_config(text, "moe.", f->path, &c));
		info->model.moe = c.model.moe;
	}
	if (st_meta(f, "n_out")) { /* a head over classes, not the vocabulary: a window router */
		long no;
		ERR_FORWARD(st_meta_long(f, "n_out", 1, INT_MAX, &no));
		info->model.n_out = (int)no;
	}
	ERR_FORWARD(ckpt_meta_tokenizer(f, &info->model));
	ERR_FORWARD(st_meta_long(f, "step", 0, 1L << 62, &info->step));
	const char *opt = st_meta(f, "optimizer");
	info->has_optim = opt && strcmp(opt, "adamw") == 0;
	const char *h = st_meta(f, "config_hash_model");
	snprintf(info->config_hash_model, sizeof info->config_hash_model, "%s", h ? h : "");
	return 0;
}

int ckpt_info(const char *path, struct ckpt_info *info)
{
	struct st_file f;

	/* The header and metadata only: ckpt_load verifies the data when it reads it. */
	ERR_FORWARD(st_open(&f, path, 0));
	int rc = read_info(&f, info);
	st_close(&f);
	return rc;
}

int ckpt_digest(const char *path, char out[CKPT_DIGEST_CHARS + 1])
{
	struct st_file f;
	uint32_t h = 0;
	int n = 0;

	ERR_FORWARD(st_open(&f, path, 0));
	for (int i = 0; i < f.n; i++) {
		const struct st_entry *e = &f.entries[i];
		if (strncmp(e->name, "optim.", 6) == 0 || strncmp(e->name, "outer.", 6) == 0)
			continue;
		if (!e->has_crc) {
			st_close(&f);
			return err_set(CORE_EFORMAT, path, "tensor '%s' has no crc32", e->name);
		}
		unsigned char b[4] = {(unsigned char)e->crc, (unsigned char)(e->crc >> 8),
				      (unsigned char)(e->crc >> 16), (unsigned char)(e->crc >> 24)};
		h = crc32_update(h, b, 4);
		n++;
	}
	st_close(&f);
	if (!n)
		return err_set(CORE_EFORMAT, path, "no parameter tensors");
	snprintf(out, CKPT_DIGEST_CHARS + 1, "%08x", (unsigned)h);
	return 0;
}

int ckpt_train_config(const char *path, struct train_config *out)
{
	struct st_file f;
	struct run_config c;

	ERR_FORWARD(st_open(&f, path, 0));
	const char *text = st_meta(&f, "config");
	int rc = text ? 0 : err_set(CORE_EFORMAT, path, "no 'config' metadata");
	config_defaults(&c);
	if (rc == 0)
		rc = meta_config(text, "train.", path, &c);
	st_close(&f);
	*out = c.train;
	return rc;
}

int ckpt_load(const char *path, struct gpt2 *g, int what, long *step)
{
	struct backend *be = g->be;
	struct st_file f;
	struct ckpt_info info;
	float *staged = NULL;
	int rc;

	ERR_FORWARD(st_open(&f, path, 1));
	rc = read_info(&f, &info);
	if (rc)
		goto out;
	struct model_config shape = info.model;
	if (what & CKPT_BODY) /* the head's rows aside */
		shape.n_out = g->cfg.n_out;
	if (!config_model_equal(&shape, &g->cfg)) {
		rc = err_set(CORE_ESHAPE, path,
			     "model is L=%d C=%d NH=%d T=%d V=%d out=%d, config says L=%d C=%d "
			     "NH=%d T=%d V=%d out=%d",
			     info.model.n_layer, info.model.n_embd, info.model.n_head,
			     info.model.seq_len, info.model.vocab_size, model_n_out(&info.model),
			     g->cfg.n_layer, g->cfg.n_embd, g->cfg.n_head, g->cfg.seq_len,
			     g->cfg.vocab_size, model_n_out(&g->cfg));
		goto out;
	}
	if ((what & CKPT_BODY) && (what & ~CKPT_BODY)) {
		rc = err_set(CORE_EUSAGE, path, "ckpt_load: CKPT_BODY goes alone");
		goto out;
	}
	if ((what & CKPT_MOMENTS) && g->forward_only) {
		rc = err_set(CORE_EUSAGE, path, "no optimizer state to load into a forward-only "
			     "model");
		goto out;
	}
	if ((what & CKPT_MOMENTS) && !info.has_optim) {
		rc = err_set(CORE_EFORMAT, path, "checkpoint has no optimizer state");
		goto out;
	}
	const int body = (what & CKPT_BODY) != 0;
	for (int w = 0; w < NBUF && !rc; w++) {
		float *host = NULL;
		if (!(what & (w == BUF_PARAMS ? CKPT_PARAMS | CKPT_BODY : CKPT_MOMENTS)))
			continue;
		free(staged);
		rc = host_buffer(g, w, body, &host, &staged); /* the head kept: fetched first */
		for (int i = 0; i < g->nviews && !rc; i++) {
			struct tensor t;
			view_over(g, i, host, w, &t);
			if (!body || strcmp(t.name, "lm_head.weight"))
				rc = st_read(&f, t.name, &t);
		}
		if (!rc && staged)
			rc = be->op->upload(be, model_buffer(g, w), staged,
					    sizeof(float) * g->nparams);
	}
	if (!rc && step)
		*step = info.step;
out:
	free(staged);
	st_close(&f);
	return rc;
}

int ckpt_export_hf(const char *ckpt, const char *dir, struct backend *be)
{
	struct ckpt_info info;
	struct gpt2 g;
	char path[4096];
	int rc;

	ERR_FORWARD(ckpt_info(ckpt, &info));
	if (info.model.n_out)
		return err_set(CORE_EUSAGE, ckpt, "a window router (a head over %d paths), not a "
			       "language model: GPT-2 has no such head to export",
			       info.model.n_out);
	if (info.model.moe.experts)
		return err_set(CORE_EUSAGE, ckpt, "a Mixture-of-Experts model (%d experts): "
			       "GPT-2 has no MoE blocks to export them as", info.model.moe.experts);
	ERR_FORWARD(gpt2_create_forward(&g, &info.model, 1, 1, be));
	const struct tensor **ts = calloc((size_t)g.nviews, sizeof *ts);
	struct tensor *views = calloc((size_t)g.nviews, sizeof *views);
	float *host = NULL, *staged = NULL;
	rc = ts && views ? 0 : err_set(CORE_ENOMEM, ckpt, "out of memory");
	if (!rc)
		rc = ckpt_load(ckpt, &g, CKPT_PARAMS, NULL);
	if (!rc)
		rc = host_buffer(&g, BUF_PARAMS, 1, &host, &staged);
	for (int i = 0; i < g.nviews && !rc; i++) {
		const struct tensor *p = &g.views[i];
		char name[TENSOR_NAME_MAX];
		size_t off = (size_t)((const float *)p->data - g.params);
		if ((size_t)snprintf(name, sizeof name, "%s%s", strcmp(p->name, "lm_head.weight") == 0
				     ? "" : "transformer.", p->name) >= sizeof name) {
			rc = err_set(CORE_EUSAGE, ckpt, "tensor name '%s' too long", p->name);
			break;
		}
		tensor_view(&views[i], DT_F32, p->ndim, p->ne, host + off, name);
		ts[i] = &views[i];
	}
	static const struct st_kv meta[] = {{"format", "pt"}};
	if (!rc && (size_t)snprintf(path, sizeof path, "%s/model.safetensors", dir) >= sizeof path)
		rc = err_set(CORE_EUSAGE, dir, "path too long");
	if (!rc)
		rc = st_write(path, ts, g.nviews, meta, 1);
	if (!rc) {
		const struct model_config *m = &info.model;
		char *json = NULL;
		/* GPT2Config's keys (transformers' configuration_gpt2.py); "gelu_new" is GPT-2's
		 * tanh approximation */
		int n = asprintf(&json,
			"{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
			"  \"vocab_size\": %d,\n  \"n_positions\": %d,\n  \"n_ctx\": %d,\n"
			"  \"n_embd\": %d,\n  \"n_layer\": %d,\n  \"n_head\": %d,\n"
			"  \"n_inner\": null,\n  \"activation_function\": \"gelu_new\",\n"
			"  \"layer_norm_epsilon\": 1e-05,\n  \"resid_pdrop\": 0.0,\n"
			"  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n"
			"  \"scale_attn_weights\": true,\n  \"scale_attn_by_inverse_layer_idx\": false,\n"
			"  \"reorder_and_upcast_attn\": false,\n  \"tie_word_embeddings\": false,\n"
			"  \"bos_token_id\": null,\n  \"eos_token_id\": null,\n"
			"  \"torch_dtype\": \"float32\",\n  \"dpc_step\": %ld\n}\n",
			m->vocab_size, m->seq_len, m->seq_len, m->n_embd, m->n_layer, m->n_head,
			info.step);
		if (n < 0)
			rc = err_set(CORE_ENOMEM, dir, "out of memory");
		else if ((size_t)snprintf(path, sizeof path, "%s/config.json", dir) >= sizeof path)
			rc = err_set(CORE_EUSAGE, dir, "path too long");
		else
			rc = file_write_atomic(path, json, (size_t)n);
		free(json);
	}
	free(staged);
	free(ts);
	free(views);
	gpt2_free(&g);
	return rc;
}
