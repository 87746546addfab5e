/* wrouter.h - the paper's window router (section 7.2.2): a transformer fine-tuned from the
 * base model as a sequence transducer. It is the base's GPT-2 with lm_head replaced by a head
 * over the P paths (model_config.n_out = P); at every position i of a document it reads
 * tokens 0..i and predicts the best path for the next L tokens, i+1 .. min(i + L, length),
 * the path of the largest summed log-likelihood in a score file (route_score) of the router
 * split. Re-routing every W tokens takes, at boundary b, its prediction at position b - 1
 * for the window [b, b + W); with L = W its target there is the linear window router's label
 * of that boundary (route_window_labels).
 *
 * Training goes through the model code of dpc-train-path (train_step_on: the same batch
 * sampling from the concatenated token stream, AdamW, cosine schedule, clipping), the
 * targets being the labels of the positions instead of the next tokens. The blocks,
 * embeddings and ln_f start as the base's; the head as GPT-2's initialisation (N(0, 0.02))
 * from the train seed.
 *
 * The router file is a dpc-checkpoint (dpc-checkpoint(5)) of that model, parameters only,
 * with metadata n_out (P), router "transformer", window (W), target_len (L), prefix
 * (the scores' prefix: the first boundary is prefix + W), base_digest (ckpt_digest of the
 * base) and report (what fitting it printed, JSON text).
 */
#ifndef CORE_ROUTE_WROUTER_H
#define CORE_ROUTE_WROUTER_H

#include <stdint.h>

#include "backend/backend.h"
#include "io/config.h"
#include "io/tokfile.h"
#include "route/routefile.h"

#define WROUTER_KIND "transformer"
#define WROUTER_BATCH 8 /* windows per forward when evaluating (wrouter_doc_paths) */

/* labels[k] for every token k of tf: the path (0..s->paths-1) of the largest sum of
 * s->logprob over tokens k .. min(k + L, end of k's document) - 1, summed in double in
 * token order; ties to the lower path. */
void wrouter_labels(const struct scores *s, const struct tokfile *tf, int L, int32_t *labels);

struct wrouter_fit_opts {
	int window;               /* W: the re-routing period it is fitted for (>= 1) */
	int target_len;           /* L (>= 1) */
	struct train_config train; /* steps, batch_size, lr, schedule, AdamW, clip, seed */
	int progress;             /* draw a progress line on a terminal */
};

/* Fit a window router from the base checkpoint on tf (the scores' corpus: s checked
 * against it by the caller) and write it to out. *report: JSON text (caller frees) with
 * steps, the first and last training losses, the labels' counts per path, and at every
 * boundary prefix + m W of tf the accuracy of the router's prediction against the label
 * (in-sample). */
int wrouter_fit(const char *base_path, const struct scores *s, const struct tokfile *tf,
		const struct wrouter_fit_opts *o, struct backend *be, const char *out,
		char **report);

/* A window router opened for evaluation and sampling: its model (forward only, batch 1)
 * and what its file says. */
struct wrouter {
	struct gpt2 g; /* zeroed until opened */
	int paths, window, target_len, prefix;
	char base_digest[LM_DIGEST_CHARS + 1];
	char *report;
	float *logits; /* [WROUTER_BATCH, seq_len, paths] */
	int32_t *in;   /* [WROUTER_BATCH, seq_len] */
};

/* 1 if path is a transformer window router (a dpc-checkpoint with router "transformer"),
 * 0 if it is not one (another kind of file), < 0 when it cannot be read. */
int wrouter_is(const char *path);
int wrouter_open(struct wrouter *w, const char *path, struct backend *be);
void wrouter_close(struct wrouter *w);
/* The router's path at every boundary prefix + m W (m >= 1) before the end of document d
 * of tf, into out [one per boundary]: the argmax of its output at position b - 1, reading
 * at most the seq_len tokens before b (one forward over the document's first seq_len tokens
 * serves the boundaries within them; the later ones' windows go WROUTER_BATCH to a
 * forward). *forwarded grows by the tokens run through the router. */
int wrouter_doc_paths(struct wrouter *w, const struct tokfile *tf, uint64_t d, int prefix,
		      int W, uint32_t *out, uint64_t *forwarded);
/* The path for the window starting at b of a text tok[0..b) (b >= 1): the argmax of the
 * router's output at position b - 1 reading the seq_len tokens before b at most, one
 * forward as wrouter_doc_paths does. */
int wrouter_text_path(struct wrouter *w, const uint32_t *tok, uint64_t b, uint32_t *path);
/* The same from a key/value cache on the router's model (gpt2_decoder_open on &w->g) that
 * holds positions [0, dec->pos) of the text: tokens dec->pos .. b - 1 fed, one position
 * each, and the path from the logits at b - 1. pos < b <= seq_len (beyond, the context is
 * the last seq_len tokens: wrouter_text_path). */
int wrouter_cached_path(struct wrouter *w, struct gpt2_decoder *dec, const int32_t *tok,
			uint64_t b, uint32_t *path);
/* --window-router FILE as eval and sample take it: a transformer router (opened on be,
 * kind ROUTER_TRANSFORMER, r->tr owned) or a linear window router file (router_read);
 * another kind of router is CORE_EFORMAT naming the file. */
int wrouter_open_window(const char *path, struct backend *be, struct router *r);

#endif
