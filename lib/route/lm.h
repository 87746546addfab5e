/* lm.h - a checkpoint opened for routing work: forward only, over whole documents.
 *
 * Routing needs three things from a GPT-2 checkpoint, never a backward:
 *   - prefix features: the mean output of one block over a document's first tokens (the base
 *     model's, DiPaCo section 2.4.1);
 *   - per-token log-likelihoods of a document under a path (the scores a discriminative
 *     router learns from, and the evaluation's);
 *   - one block's output at every position of a document (the window router's features).
 * A document longer than the model's context (seq_len = S) is run in consecutive windows of S
 * tokens: window w holds the tokens [w S, (w + 1) S), and a token's context is the tokens
 * before it in its window. So token j of a document is predicted from tokens
 * [floor((j - 1) / S) S, j): every token but the first is predicted, each window's first
 * prediction from one token of context. The windows of one document share a forward (up to
 * B, at most 64, at a time); prefix features batch B documents.
 */
#ifndef CORE_ROUTE_LM_H
#define CORE_ROUTE_LM_H

#include <stddef.h>
#include <stdint.h>

#include "dipaco/rundir.h"
#include "io/tokfile.h"
#include "model/checkpoint.h"
#include "model/gpt2.h"

#define LM_DIGEST_CHARS CKPT_DIGEST_CHARS /* hex digits of ckpt_digest */

struct lm {
	struct gpt2 g; /* forward only (gpt2_create_forward) */
	char *path;
	char digest[LM_DIGEST_CHARS + 1];
	int B;         /* windows per forward */
	int32_t *in, *tg;
	float *out;    /* B * S * C floats: hidden states or per-position losses */
};

/* Open the checkpoint at path on be, for batches of B windows of the model's seq_len. */
int lm_open(struct lm *m, const char *path, struct backend *be, int B);
/* Path p of a DiPaCo run, assembled from its modules after phase `phase`'s outer step; its
 * digest is the crc32 of its module files' digests (ckpt_digest) in level order. */
int lm_open_run(struct lm *m, const struct rundir *r, long phase, int p, struct backend *be,
		int B);
void lm_close(struct lm *m);


/* The mean output of block `layer` over the first min(prefix, length) tokens of each of
 * documents [d0, d0 + n) of tf, into out [n, C] (an empty document gets zeros). prefix <=
 * seq_len. progress (may be NULL) is called after every batch with the documents done. */
int lm_prefix_features(struct lm *m, const struct tokfile *tf, uint64_t d0, uint64_t n,
		       int prefix, int layer, float *out,
		       void (*progress)(void *ctx, uint64_t done), void *ctx);

/* log p(token j | its context) for the positions j of document d into out [len] (out[0] = 0:
 * the first token is not predicted). need (NULL: all) says which windows to run: need[w] for
 * w < ceil((len - 1) / seq_len); positions of windows not run are left as they were.
 * *forwarded (may be NULL) grows by the tokens run through the model. */
int lm_doc_logprobs(struct lm *m, const struct tokfile *tf, uint64_t d, const unsigned char *need,
		    float *out, uint64_t *forwarded);

/* Block `layer`'s output at every position of document d into out [len, C]. */
int lm_doc_hidden(struct lm *m, const struct tokfile *tf, uint64_t d, int layer, float *out,
		  uint64_t *forwarded);

#endif
