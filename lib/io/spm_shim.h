/* spm_shim.h - SentencePiece (Debian's libsentencepiece, 0.1.97) behind a C interface: the
 * one C++ file of the library (spm_shim.cc), built when the library is found (HAVE_SPM; the
 * Makefile's probe says so). tokenizer.c is its only caller, and calls it only in builds
 * with CORE_HAVE_SPM; without, it says what to install.
 *
 * Errors: the functions return 0 or -1 with a one-line message in err[0..errn) (the
 * library's own words where it gives some). No function prints; SentencePiece's own logging
 * is turned off when the shim is first used.
 */
#ifndef CORE_SPM_SHIM_H
#define CORE_SPM_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct spm_model;

/* A model from its serialized bytes (the .model file's contents). */
int spm_shim_load(struct spm_model **m, const void *bytes, size_t len, char *err, size_t errn);
void spm_shim_free(struct spm_model *m);
/* Pieces in the vocabulary (ids 0 .. n-1). */
uint32_t spm_shim_vocab(const struct spm_model *m);
/* The ids of text[0..len), appended at *ids (capacity *cap, grown with realloc; *n in use). */
int spm_shim_encode(const struct spm_model *m, const char *text, size_t len, uint32_t **ids,
		    uint64_t *n, uint64_t *cap, char *err, size_t errn);
/* The text of ids[0..n) (malloc'd, NUL-ended, *len bytes). Ids must be < vocab. */
int spm_shim_decode(const struct spm_model *m, const uint32_t *ids, size_t n, char **text,
		    size_t *len, char *err, size_t errn);
/* Piece id's surface text (a view into the model; byte pieces read "<0xNN>"). */
const char *spm_shim_piece(const struct spm_model *m, uint32_t id);
/* What piece id stands for: text (U+2581 for a space), one byte ("<0xNN>"), or nothing in
 * the text (<unk>, <s>, </s>, user-unused pieces). */
enum { SPM_PIECE_TEXT, SPM_PIECE_BYTE, SPM_PIECE_CONTROL };
int spm_shim_kind(const struct spm_model *m, uint32_t id);
/* Piece id's score (a unigram model's log probability; a BPE model's merge order). */
float spm_shim_score(const struct spm_model *m, uint32_t id);

/* Train a model: next() hands out the training texts one at a time (1 = *text, *len set;
 * 0 = no more; -1 = stop with an error of the caller's). The serialized model is returned in
 * *out (malloc'd, *out_len bytes). type: "unigram" or "bpe". sample: 0 = every text, else at
 * most that many, drawn with seed. threads: the trainer's threads (the model depends on the
 * count). max_len: texts longer than this many bytes are passed over by the trainer. */
struct spm_train_args {
	const char *type;
	uint32_t vocab;
	uint64_t sample;
	uint32_t seed;
	int threads;
	uint64_t max_len;
	double character_coverage;
};
int spm_shim_train(const struct spm_train_args *a,
		   int (*next)(void *ctx, const char **text, size_t *len), void *ctx,
		   char **out, size_t *out_len, char *err, size_t errn);

#ifdef __cplusplus
}
#endif

#endif
