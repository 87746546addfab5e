/* corpus.h - raw documents in, token files out: readers for JSON Lines, for a .txt file and
 * for a directory of text files, the deterministic train / val / router split, the cutting of long documents into pieces, and
 * corpus_prepare() that ties them together for `dpc-shard prepare`.
 */
#ifndef CORE_CORPUS_H
#define CORE_CORPUS_H

#include <stddef.h>
#include <stdint.h>

#include "io/tokenizer.h"

/* ---- documents ---------------------------------------------------------------------------- */

struct corpus_doc {
	const char *text; /* the document's bytes (UTF-8 for JSONL; may contain NUL) */
	size_t len;
	const char *meta; /* JSON object text: the other fields, or {"file":name}; NUL-ended */
	size_t meta_len;
	uint64_t index;   /* 0-based position in the input */
};

struct corpus_reader;

/* path names a JSON Lines file, a plain text file whose name ends in ".txt", or a directory.
 * JSONL: read as a stream, so a pipe or a FIFO works (a FIFO with no writer waits for one, as
 *   cat(1) does). One JSON object per line with a string field "text"; the other fields, in their
 *   order, become the metadata (compact JSON). JSON escapes (\uXXXX, surrogate pairs, \u0000)
 *   decode to UTF-8 bytes. Lines holding only white space are skipped (they still count in
 *   line numbers). A bad line is CORE_EFORMAT on path with detail "line N: ...". A file whose
 *   first non-blank byte is not '{' is CORE_EFORMAT "not JSON Lines (...)", which says how to
 *   pass plain text instead, rather than the JSON parser's complaint about its first line.
 * .txt: a regular file whose name ends in ".txt" is one document, its bytes verbatim, with
 *   metadata {"file":"name"} (name without the directories), as in a directory. A FIFO or
 *   device named *.txt is read as JSON Lines.
 * Directory: every regular file whose name does not start with '.', in strcmp order of the
 *   names (not locale order), its bytes verbatim; metadata {"file":"name"}. Subdirectories
 *   are not descended into; FIFOs, devices and sockets there are passed over. */
int corpus_open(struct corpus_reader **r, const char *path);
/* Next document into *doc, valid until the next call: 1 = a document, 0 = end, < 0 = error. */
int corpus_next(struct corpus_reader *r, struct corpus_doc *doc);
/* How far the reader is: bytes of a JSONL or .txt file, or files of a directory. */
void corpus_progress(const struct corpus_reader *r, uint64_t *done, uint64_t *total);
void corpus_close(struct corpus_reader *r);

/* ---- split -------------------------------------------------------------------------------- */

enum corpus_split { CORPUS_SPLIT_TRAIN, CORPUS_SPLIT_VAL, CORPUS_SPLIT_ROUTER, CORPUS_NSPLITS };

#define CORPUS_VAL_FRAC 0.02     /* DiPaCo paper defaults */
#define CORPUS_ROUTER_FRAC 0.005

/* Document d goes to val when u < val_frac, to router when val_frac <= u < val_frac +
 * router_frac, else to train, with u = rng_uniform(seed, RNG_STREAM_SPLIT, d): a pure
 * function of (seed, d), so the split does not depend on the order of the calls. */
enum corpus_split corpus_split_of(uint64_t seed, uint64_t doc, double val_frac,
				  double router_frac);
/* CORE_EUSAGE unless both fractions are in [0, 1] and their sum is <= 1. */
int corpus_split_check(double val_frac, double router_frac);
/* "train", "val", "router"; the output file is OUTDIR/<name>.tok. */
const char *corpus_split_name(enum corpus_split s);
/* OUTDIR/<name>.tok into buf; CORE_EUSAGE when it does not fit. */
int corpus_split_path(char *buf, size_t n, const char *outdir, enum corpus_split s);

/* ---- chunks ------------------------------------------------------------------------------- */

/* Long documents cut into pieces of `chunk` tokens, so that a corpus of a few long documents
 * still gives the router (and validation) many documents. A document of n tokens becomes
 * n / chunk pieces of chunk tokens, plus a last piece of the remainder r = n % chunk when r is
 * at least chunk / 2 (r >= chunk - chunk / 2 in integers); a shorter remainder is appended to
 * the previous piece. So every piece holds between chunk / 2 and 1.5 * chunk tokens, except a
 * document shorter than chunk, which stays one piece (an empty one included). Piece k starts
 * at token k * chunk and ends where piece k + 1 starts, the last at n.
 * corpus_chunk_pieces: the number of pieces; 1 when chunk is 0 (no cutting). */
uint64_t corpus_chunk_pieces(uint64_t ntokens, uint64_t chunk);
/* The metadata of piece `chunk` of the source document `doc` (0-based index in the input):
 * the source's metadata meta[0..len), a JSON object, with "doc": doc and "chunk": chunk added
 * at the end, as compact JSON. *out is malloc'ed and NUL-ended, *out_len its length. A source
 * object that already has a "doc" or "chunk" field, or metadata that is not a JSON object,
 * is CORE_EFORMAT on file (may be NULL), naming the document. */
int corpus_chunk_meta(const char *file, const char *meta, size_t len, uint64_t doc,
		      uint64_t chunk, char **out, size_t *out_len);

/* ---- prepare ------------------------------------------------------------------------------ */

struct corpus_prepare_opts {
	const char *input;     /* .jsonl file, .txt file or directory */
	const char *outdir;    /* created (one level) when missing */
	const char *tokenizer; /* spec for tokenizer_open (tokenizer.h) */
	uint64_t seed;
	double val_frac, router_frac;
	/* 0: each source document is one document of its split. >= 2: each is cut into pieces
	 * of about this many tokens (corpus_chunk_pieces), each written as a document with the
	 * metadata of corpus_chunk_meta; 1 is CORE_EUSAGE. */
	uint64_t chunk;
	/* Called after each document with corpus_progress()'s figures; may be NULL. */
	void (*progress)(void *ctx, uint64_t done, uint64_t total);
	void *progress_ctx;
};

struct corpus_split_stats {
	uint64_t docs;    /* documents written to the split's file: pieces, with chunking */
	uint64_t sources; /* source documents of the input in the split (= docs without chunking) */
	uint64_t tokens;
};

struct corpus_prepare_result {
	struct corpus_split_stats split[CORPUS_NSPLITS];
	uint32_t vocab;
	struct tokenizer_id tokenizer;
};

/* Read every document, tokenize it, cut it into pieces when o->chunk asks, and append it to
 * the token file of its split. The split is decided per source document (corpus_split_of of
 * its index in the input) before any cutting, so the pieces of one document all land in one
 * split: nothing of a val or router document leaks into train.
 * The three files are written through atomicio, completed and synced only after the whole
 * input was read and checked, and renamed into place only once all three are complete. So an
 * error leaves the old outputs (or none) in place, never a partial file, nor a mix of old and
 * new (short of a failing rename). Errors found once the input is read, which write nothing:
 *  - an input without a single document (an empty file or directory, /dev/null):
 *    CORE_EFORMAT "holds no documents" on o->input;
 *  - a val (router) split that received no source document although o->val_frac
 *    (o->router_frac) is above 0: CORE_EFORMAT on o->input naming the empty split, the number
 *    of documents of the input and the remedies. A fraction of 0 asks for an empty split.
 * Existing outputs are replaced: refusing to overwrite is the caller's decision. */
int corpus_prepare(const struct corpus_prepare_opts *o, struct corpus_prepare_result *res);

/* ---- tokenizer ---------------------------------------------------------------------------- */

struct corpus_tokenizer_opts {
	const char *input; /* as corpus_open */
	struct tokenizer_train_opts train;
	/* 1: only the source documents corpus_prepare puts in train.tok with this seed and these
	 * fractions (so that no val or router text shapes the vocabulary); 0: every document */
	int train_split;
	uint64_t seed;
	double val_frac, router_frac;
	void (*progress)(void *ctx, uint64_t done, uint64_t total); /* may be NULL */
	void *progress_ctx;
};

struct corpus_tokenizer_result {
	uint64_t docs, bytes; /* the documents trained on and their bytes */
	struct tokenizer_id id;
};

/* Train a SentencePiece model on the documents of o->input (tokenizer_train) and write it to
 * out atomically. CORE_EFORMAT "holds no documents" when none was handed to the trainer. */
int corpus_train_tokenizer(const char *out, const struct corpus_tokenizer_opts *o,
			   struct corpus_tokenizer_result *res);

#endif
