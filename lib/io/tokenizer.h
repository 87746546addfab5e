/* tokenizer.h - text to tokens and back behind one set of calls: the byte tokenizer (a token
 * is a byte, vocabulary 256) and SentencePiece models (through spm_shim.h, when the build has
 * Debian's libsentencepiece).
 *
 * A tokenizer is opened from a spec: "byte", or "spm:PATH" for a SentencePiece model file. It
 * is identified by a struct tokenizer_id, which token files (dpc-tokens(5)) and checkpoints
 * record so that every program can tell whether tokens, models and text belong together:
 *   byte            kind TOKENIZER_BYTE, digest 0                       text "byte"
 *   SentencePiece   kind TOKENIZER_SPM, digest crc32 << 32 | adler32    text "spm-" and the
 *                   of the model file's bytes (zlib's two checksums:     digest in 16 lower-
 *                   the exact model, whatever its file is called)       case hex digits
 * TOKENIZER_NONE is what files written before the record existed hold (token files of version
 * 1, checkpoints without the key): tokenizer_id_known() fills it in from the vocabulary (256:
 * the byte tokenizer, the only one there was), else it stays unknown and is not checked.
 *
 * Decoding is exact: byte tokens are the bytes; models trained by tokenizer_train keep every
 * byte of UTF-8 text (no normalisation, spaces as they are, bytes for uncovered characters),
 * so decode(encode(text)) == text. Models trained elsewhere decode as SentencePiece does.
 */
#ifndef CORE_TOKENIZER_H
#define CORE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

enum tokenizer_kind { TOKENIZER_NONE = 0, TOKENIZER_BYTE = 1, TOKENIZER_SPM = 2 };

struct tokenizer_id {
	uint32_t kind;   /* enum tokenizer_kind */
	uint64_t digest; /* TOKENIZER_SPM: crc32 << 32 | adler32 of the model file; else 0 */
};

/* Room for tokenizer_id_str's text and its NUL. */
#define TOKENIZER_ID_LEN 24

/* "byte", "spm-0123456789abcdef", or "unknown" (TOKENIZER_NONE) into buf. */
void tokenizer_id_str(const struct tokenizer_id *id, char buf[TOKENIZER_ID_LEN]);
/* The inverse for "byte" and "spm-" + 16 hex digits; CORE_EFORMAT (no file) otherwise. */
int tokenizer_id_parse(const char *s, struct tokenizer_id *id);
/* id as recorded, or for TOKENIZER_NONE the byte tokenizer when vocab is 256. */
struct tokenizer_id tokenizer_id_known(struct tokenizer_id id, uint32_t vocab);
/* 1 when both are known and differ (an unknown one matches anything). */
int tokenizer_id_differ(struct tokenizer_id a, struct tokenizer_id b);

/* A growing array of tokens. */
struct token_buf {
	uint32_t *tok;
	uint64_t n, cap;
};
int token_buf_reserve(struct token_buf *t, uint64_t cap);
void token_buf_free(struct token_buf *t);

struct tokenizer;

/* Open spec. CORE_EUSAGE for an unknown spec (naming the known ones); for spm:PATH,
 * CORE_ENOTFOUND / CORE_EIO on PATH, CORE_EFORMAT when it is not a SentencePiece model, and
 * CORE_EUNSUPPORTED in a build without SentencePiece (saying what to install). */
int tokenizer_open(struct tokenizer **tk, const char *spec);
void tokenizer_close(struct tokenizer *tk);
uint32_t tokenizer_vocab(const struct tokenizer *tk);
struct tokenizer_id tokenizer_get_id(const struct tokenizer *tk);
/* The spec it was opened with. */
const char *tokenizer_spec(const struct tokenizer *tk);

/* Append the tokens of text[0..len) to out. SentencePiece gets a long text in pieces of at
 * most TOKENIZER_ENCODE_PIECE bytes, each ending before a space, which gives the tokens of
 * the whole text for models that split words at spaces (those of tokenizer_train). */
#define TOKENIZER_ENCODE_PIECE ((size_t)1 << 20)
int tokenizer_encode(const struct tokenizer *tk, const char *text, size_t len,
		     struct token_buf *out);
/* The text of tok[0..n) into *text (malloc'd, NUL-ended, *len bytes: a byte text may hold
 * NULs). CORE_EFORMAT for a token outside the vocabulary. */
int tokenizer_decode(const struct tokenizer *tk, const uint32_t *tok, size_t n, char **text,
		     size_t *len);
/* Surface text of one token for listings: a byte tokenizer's byte, a SentencePiece piece. */
const char *tokenizer_piece(const struct tokenizer *tk, uint32_t id, char buf[8]);
/* The bytes token id adds to a text, for writing tokens out one at a time as they are drawn:
 * its byte (the byte tokenizer, a byte piece), a piece's text with U+2581 as a space, nothing
 * for control pieces. Into buf[0..TOKENIZER_TOKEN_MAX); returns the length. For the models
 * tokenizer_train writes, the bytes of a sequence's tokens, one after the other, are its
 * tokenizer_decode (a model with a dummy prefix or normalisation differs from it). */
#define TOKENIZER_TOKEN_MAX 256
size_t tokenizer_token_bytes(const struct tokenizer *tk, uint32_t id,
			     char buf[TOKENIZER_TOKEN_MAX]);

/* For writing a tokenizer out in other formats (tokenizer_hf.h): the SentencePiece model
 * file's bytes (NULL for the byte tokenizer), what a piece is, and its score. */
const void *tokenizer_model_file(const struct tokenizer *tk, size_t *len);
enum { TOKENIZER_PIECE_TEXT, TOKENIZER_PIECE_BYTE, TOKENIZER_PIECE_CONTROL };
int tokenizer_piece_kind(const struct tokenizer *tk, uint32_t id);
float tokenizer_piece_score(const struct tokenizer *tk, uint32_t id);

/* 0 when tokens recorded as made by `have` (from file) belong to tk; else CORE_EUSAGE on file
 * naming both ("tokenizer spm-..., not the one given (byte)"). */
int tokenizer_check(const struct tokenizer *tk, struct tokenizer_id have, uint32_t have_vocab,
		    const char *file);

/* The tokenizer of tokens (or of a model trained on them) recorded as `have` in file, of
 * vocabulary `vocab`, into *tk: spec when given (a --tokenizer option), checked as
 * tokenizer_check does; else the byte tokenizer when that is what file records; else NULL
 * when !required, and when required CORE_EUSAGE on file: "made with tokenizer spm-..., a
 * vocabulary of 4096: give its model with --tokenizer spm:MODEL". */
int tokenizer_for(const char *spec, struct tokenizer_id have, uint32_t vocab, const char *file,
		  int required, struct tokenizer **tk);

/* ---- training a SentencePiece model ------------------------------------------------------- */

struct tokenizer_train_opts {
	const char *type;   /* "unigram" (default when NULL) or "bpe" */
	uint32_t vocab;     /* pieces, 260 .. 1 << 20 (3 specials + 256 bytes + at least 1) */
	uint64_t sample;    /* 0: every text; else at most this many, drawn with seed */
	uint32_t seed;
	int threads;        /* the trainer's threads: the model depends on the count */
	uint64_t max_len;   /* texts longer than this (bytes) are cut into pieces of it */
	double coverage;    /* character_coverage, (0, 1] */
};

/* Train a model on the texts next() hands out (1 = *text and *len set, 0 = no more, < 0 = a
 * CORE_E* code of the caller's, returned as it is) and write it to out atomically (nothing
 * there on failure). Needs SentencePiece (CORE_EUNSUPPORTED); CORE_EUSAGE for bad options;
 * the trainer's refusals (a vocabulary larger than the texts allow) are CORE_EFORMAT on out's
 * source, quoting it. *id: the model's id (may be NULL). */
int tokenizer_train(const char *out, const struct tokenizer_train_opts *o,
		    int (*next)(void *ctx, const char **text, size_t *len), void *ctx,
		    struct tokenizer_id *id);

#endif
