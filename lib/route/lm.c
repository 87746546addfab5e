/* lm.c - a checkpoint opened for routing work; see lm.h. */
#include "route/lm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/crc.h"
#include "common/err.h"
#include "io/safetensors.h"
#include "dipaco/pathtrain.h"
#include "model/checkpoint.h"
#include "model/train.h"

#include "common/banned.h"

void lm_close(struct lm *m)
{
	if (m->g.be)
		gpt2_free(&m->g);
	free(m->path);
	free(m->in);
	free(m->tg);
	free(m->out);
	memset(m, 0, sizeof *m);
}

static int alloc_batch(struct lm *m, const struct model_config *cfg, int B, const char *name);

int lm_open(struct lm *m, const char *path, struct backend *be, int B)
{
	struct ckpt_info info;
	int rc;

	memset(m, 0, sizeof *m);
	if (B < 1)
		return err_set(CORE_EUSAGE, NULL, "batch of %d windows", B);
	ERR_FORWARD(ckpt_info(path, &info));
	if (info.model.n_out)
		return err_set(CORE_EFORMAT, path, "is a window router (a head over %d paths), "
			       "not a language model", info.model.n_out);
	ERR_FORWARD(ckpt_digest(path, m->digest));
	rc = alloc_batch(m, &info.model, B, path);
	if (!rc)
		rc = gpt2_create_forward(&m->g, &info.model, B, info.model.seq_len, be);
	if (!rc)
		rc = ckpt_load(path, &m->g, CKPT_PARAMS, NULL);
	if (rc < 0) {
		lm_close(m);
		return rc;
	}
	return 0;
}

/* The buffers of a model of cfg for B windows. */
static int alloc_batch(struct lm *m, const struct model_config *cfg, int B, const char *name)
{
	const size_t S = (size_t)cfg->seq_len, C = (size_t)cfg->n_embd;
	m->B = B;
	m->path = strdup(name);
	m->in = calloc((size_t)B * S, sizeof *m->in);
	m->tg = calloc((size_t)B * S, sizeof *m->tg);
	m->out = calloc((size_t)B * S * C, sizeof *m->out);
	if (!m->path || !m->in || !m->tg || !m->out)
		return err_set(CORE_ENOMEM, name, "cannot allocate the batch buffers");
	return 0;
}

int lm_open_run(struct lm *m, const struct rundir *r, long phase, int p, struct backend *be,
		int B)
{
	char name[RUNDIR_PATH_MAX + 32], file[RUNDIR_PATH_MAX];
	uint32_t h = 0;
	int rc;

	memset(m, 0, sizeof *m);
	if (B < 1)
		return err_set(CORE_EUSAGE, NULL, "batch of %d windows", B);
	snprintf(name, sizeof name, "%s phase %ld path %d", r->dir, phase, p);
	for (int l = 0; l < r->topo.nlevels; l++) {
		char d[LM_DIGEST_CHARS + 1];
		ERR_FORWARD(rundir_module(r, phase, topo_module_of(&r->topo, p, l), ".safetensors",
					  file, sizeof file));
		ERR_FORWARD(ckpt_digest(file, d));
		h = crc32_update(h, d, LM_DIGEST_CHARS);
	}
	snprintf(m->digest, sizeof m->digest, "%08x", (unsigned)h);
	rc = alloc_batch(m, &r->cfg.model, B, name);
	if (!rc)
		rc = gpt2_create_forward(&m->g, &r->cfg.model, B, r->cfg.model.seq_len, be);
	if (!rc)
		rc = pathtrain_assemble(r, phase, p, &m->g);
	if (rc < 0)
		lm_close(m);
	return rc;
}

static int check_layer(const struct lm *m, int layer)
{
	if (layer < 0 || layer >= m->g.cfg.n_layer)
		return err_set(CORE_EUSAGE, m->path, "layer %d: the model has blocks 0..%d", layer,
			       m->g.cfg.n_layer - 1);
	return 0;
}

/* Tokens of document d's prefix: min(prefix, its length). */
static int doc_prefix(const struct tokfile *tf, uint64_t d, int prefix)
{
	const uint64_t l = tf->offsets[d + 1] - tf->offsets[d];
	return l < (uint64_t)prefix ? (int)l : prefix;
}

int lm_prefix_features(struct lm *m, const struct tokfile *tf, uint64_t d0, uint64_t n,
		       int prefix, int layer, float *out,
		       void (*progress)(void *ctx, uint64_t done), void *ctx)
{
	const int C = m->g.cfg.n_embd;
	ERR_FORWARD(check_layer(m, layer));
	ERR_FORWARD(train_check_tokens(tf, &m->g.cfg));
	if (prefix < 1 || prefix > m->g.cfg.seq_len)
		return err_set(CORE_EUSAGE, m->path, "prefix of %d tokens: the model's context is "
			       "1..%d", prefix, m->g.cfg.seq_len);
	for (uint64_t b0 = 0; b0 < n; b0 += (uint64_t)m->B) {
		const int nb = (int)(n - b0 < (uint64_t)m->B ? n - b0 : (uint64_t)m->B);
		int T = 0;
		for (int i = 0; i < nb; i++) {
			const uint64_t d = d0 + b0 + (uint64_t)i, s = tf->offsets[d];
			const int len = doc_prefix(tf, d, prefix);
			T = len > T ? len : T;
			/* past a short document's end: padding, which the causal mask keeps out of
			 * the positions that are averaged */
			for (int j = 0; j < prefix; j++)
				m->in[(size_t)i * (size_t)prefix + (size_t)j] =
					j < len ? (int32_t)tokfile_token(tf, s + (uint64_t)j) : 0;
		}
		if (T > 0) {
			/* rows of prefix tokens, all of them run: batch [nb, prefix] */
			ERR_FORWARD(gpt2_forward_hidden(&m->g, m->in, nb, prefix, layer, m->out));
		}
		for (int i = 0; i < nb; i++) {
			float *o = out + (size_t)(b0 + (uint64_t)i) * (size_t)C;
			const float *h = m->out + (size_t)i * (size_t)prefix * (size_t)C;
			const int len = doc_prefix(tf, d0 + b0 + (uint64_t)i, prefix);
			for (int c = 0; c < C; c++) {
				double s = 0;
				for (int j = 0; j < len; j++)
					s += h[(size_t)j * (size_t)C + (size_t)c];
				o[c] = len ? (float)(s / len) : 0.0f;
			}
		}
		if (progress)
			progress(ctx, b0 + (uint64_t)nb);
	}
	return 0;
}

/* Run the windows of document d whose need[w] is set (all when need is NULL): hidden = 0
 * for log-probabilities (inputs [wS, wS + n), targets one further), 1 for block layer's output.
 * *forwarded (may be NULL) grows by the tokens run. */
static int run_windows(struct lm *m, const struct tokfile *tf, uint64_t d, int hidden,
		       int layer, const unsigned char *need, float *out, uint64_t *forwarded)
{
	const uint64_t s0 = tf->offsets[d], len = tf->offsets[d + 1] - s0;
	const uint64_t S = (uint64_t)m->g.cfg.seq_len, C = (uint64_t)m->g.cfg.n_embd;
	/* positions run: 0..len-2 as inputs for log-probabilities, 0..len-1 for hidden states */
	const uint64_t npos = hidden ? len : (len ? len - 1 : 0);
	const uint64_t nwin = (npos + S - 1) / S;
	uint64_t w = 0;

	while (w < nwin) {
		uint64_t win[64], nb = 0;
		const uint64_t cap = (uint64_t)m->B < 64 ? (uint64_t)m->B : 64;
		for (; w < nwin && nb < cap; w++)
			if (!need || need[w])
				win[nb++] = w;
		if (!nb)
			break;
		/* one window: its own length; several: padded to S (causal, so padding at the end
		 * changes nothing before it) */
		const uint64_t last = npos - win[0] * S < S ? npos - win[0] * S : S;
		const int T = nb == 1 ? (int)last : (int)S;
		for (uint64_t i = 0; i < nb; i++) {
			const uint64_t start = win[i] * S;
			for (uint64_t j = 0; j < (uint64_t)T; j++) {
				const uint64_t p = start + j;
				const int ok = p < npos;
				m->in[i * (uint64_t)T + j] = ok ? (int32_t)tokfile_token(tf, s0 + p) : 0;
				m->tg[i * (uint64_t)T + j] =
					ok && !hidden ? (int32_t)tokfile_token(tf, s0 + p + 1) : 0;
			}
		}
		if (hidden) {
			ERR_FORWARD(gpt2_forward_hidden(&m->g, m->in, (int)nb, T, layer, m->out));
		} else {
			ERR_FORWARD(gpt2_forward(&m->g, m->in, m->tg, (int)nb, T, NULL));
			ERR_FORWARD(gpt2_losses(&m->g, m->out));
		}
		for (uint64_t i = 0; i < nb; i++) {
			const uint64_t start = win[i] * S;
			const uint64_t cnt = npos - start < (uint64_t)T ? npos - start : (uint64_t)T;
			const float *o = m->out + i * (uint64_t)T * (hidden ? C : 1);
			if (forwarded)
				*forwarded += cnt;
			if (hidden)
				memcpy(out + start * C, o, sizeof(float) * cnt * C);
			else
				for (uint64_t j = 0; j < cnt; j++)
					out[start + j + 1] = -o[j];
		}
	}
	return 0;
}

int lm_doc_logprobs(struct lm *m, const struct tokfile *tf, uint64_t d, const unsigned char *need,
		    float *out, uint64_t *forwarded)
{
	ERR_FORWARD(train_check_tokens(tf, &m->g.cfg));
	if (tf->offsets[d + 1] > tf->offsets[d])
		out[0] = 0.0f;
	return run_windows(m, tf, d, 0, 0, need, out, forwarded);
}

int lm_doc_hidden(struct lm *m, const struct tokfile *tf, uint64_t d, int layer, float *out,
		  uint64_t *forwarded)
{
	ERR_FORWARD(check_layer(m, layer));
	ERR_FORWARD(train_check_tokens(tf, &m->g.cfg));
	return run_windows(m, tf, d, 1, layer, NULL, out, forwarded);
}
