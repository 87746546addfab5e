/* tokenizer_hf.c - tokenizer.json, tokenizer_config.json and tokenizer.model for a Hugging
 * Face model directory; what each holds is in tokenizer_hf.h. */
#include "io/tokenizer_hf.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "io/atomicio.h"
#include "common/banned.h"

/* ---- what the SentencePiece model says about itself ----------------------------------------
 * The settings that decide how text is encoded live in the model file (a protocol buffer,
 * sentencepiece_model.proto) and nowhere in the library's C++ interface, so they are read from
 * its bytes: ModelProto field 2 (trainer_spec) and field 3 (normalizer_spec), each a message of
 * varints and strings. Fields left out take the .proto's defaults. */

struct spm_spec {
	int model_type;             /* TrainerSpec 3: 1 unigram, 2 BPE, 3 word, 4 char */
	int split_by_whitespace;    /* TrainerSpec 22, default true */
	int whitespace_as_suffix;   /* TrainerSpec 24, default false */
	int byte_fallback;          /* TrainerSpec 35, default false */
	char normalizer[32];        /* NormalizerSpec 1 */
	int add_dummy_prefix;       /* NormalizerSpec 3, default true */
	int remove_extra_ws;        /* NormalizerSpec 4, default true */
	int escape_ws;              /* NormalizerSpec 5, default true */
};

struct pb {
	const unsigned char *p, *end;
};

static int pb_varint(struct pb *b, uint64_t *v)
{
	*v = 0;
	for (int s = 0; s < 64 && b->p < b->end; s += 7) {
		unsigned char c = *b->p++;
		*v |= (uint64_t)(c & 0x7f) << s;
		if (!(c & 0x80))
			return 0;
	}
	return -1;
}

/* The next field: its number, wire type (*wire: 0 varint, 1 and 5 fixed, 2 length-delimited),
 * a varint's value in *v, a length-delimited field's bytes in *sub. */
static int pb_field(struct pb *b, uint32_t *field, int *wire, uint64_t *v, struct pb *sub)
{
	uint64_t key, n;
	*v = 0;
	*sub = (struct pb){b->p, b->p};
	if (pb_varint(b, &key) < 0)
		return -1;
	*field = (uint32_t)(key >> 3);
	*wire = (int)(key & 7);
	switch (key & 7) {
	case 0:
		return pb_varint(b, v);
	case 1:
		n = 8;
		break;
	case 5:
		n = 4;
		break;
	case 2:
		if (pb_varint(b, &n) < 0)
			return -1;
		break;
	default:
		return -1; /* groups: not in this format */
	}
	if (n > (uint64_t)(b->end - b->p))
		return -1;
	sub->p = b->p;
	sub->end = b->p + n;
	b->p += n;
	return 0;
}

static int spm_read_spec(const void *bytes, size_t len, struct spm_spec *s)
{
	*s = (struct spm_spec){.model_type = 1, .split_by_whitespace = 1, .add_dummy_prefix = 1,
			       .remove_extra_ws = 1, .escape_ws = 1};
	struct pb top = {bytes, (const unsigned char *)bytes + len}, sub, in;
	uint32_t f, g;
	uint64_t v, w;
	int tw, iw;

	while (top.p < top.end) {
		if (pb_field(&top, &f, &tw, &v, &sub) < 0)
			return -1;
		if ((f != 2 && f != 3) || tw != 2)
			continue;
		while (sub.p < sub.end) {
			if (pb_field(&sub, &g, &iw, &w, &in) < 0)
				return -1;
			if (f == 3 && g == 1 && iw == 2) {
				snprintf(s->normalizer, sizeof s->normalizer, "%.*s",
					 (int)(in.end - in.p < 31 ? in.end - in.p : 31),
					 (const char *)in.p);
				continue;
			}
			if (iw != 0) /* the settings read here are all varints */
				continue;
			if (f == 2 && g == 3) s->model_type = w > 4 ? 0 : (int)w;
			else if (f == 2 && g == 22) s->split_by_whitespace = w != 0;
			else if (f == 2 && g == 24) s->whitespace_as_suffix = w != 0;
			else if (f == 2 && g == 35) s->byte_fallback = w != 0;
			else if (f == 3 && g == 3) s->add_dummy_prefix = w != 0;
			else if (f == 3 && g == 4) s->remove_extra_ws = w != 0;
			else if (f == 3 && g == 5) s->escape_ws = w != 0;
		}
	}
	return 0;
}

/* 1 when s is UTF-8 (what JSON strings hold): no stray continuation bytes, no overlong forms,
 * no surrogates, nothing above U+10FFFF. */
static int utf8_valid(const unsigned char *s)
{
	while (*s) {
		unsigned c = *s++, n = c < 0x80 ? 0 : c >= 0xc2 && c < 0xe0 ? 1 :
				       c >= 0xe0 && c < 0xf0 ? 2 : c >= 0xf0 && c < 0xf5 ? 3 : 9;
		if (n == 9)
			return 0;
		unsigned cp = n == 0 ? c : c & (0x3fu >> n);
		for (unsigned k = 0; k < n; k++, s++) {
			if ((*s & 0xc0) != 0x80)
				return 0;
			cp = cp << 6 | (*s & 0x3fu);
		}
		if ((n == 2 && (cp < 0x800 || (cp >= 0xd800 && cp < 0xe000))) ||
		    (n == 3 && (cp < 0x10000 || cp > 0x10ffff)))
			return 0;
	}
	return 1;
}

struct piece_ref {
	const char *s;
	uint32_t id;
};

static int ref_cmp(const void *a, const void *b)
{
	return strcmp(((const struct piece_ref *)a)->s, ((const struct piece_ref *)b)->s);
}

/* Every piece once (a tokenizer.json vocabulary maps text to one id): CORE_EFORMAT naming the
 * first repeated one. */
static int unique_pieces(const struct tokenizer *tk, const char *model)
{
	const uint32_t V = tokenizer_vocab(tk);
	struct piece_ref *r = malloc(sizeof *r * (V ? V : 1));
	char buf[8];
	int rc = 0;

	if (!r)
		return err_set(CORE_ENOMEM, model, "out of memory");
	for (uint32_t i = 0; i < V; i++)
		r[i] = (struct piece_ref){tokenizer_piece(tk, i, buf), i};
	qsort(r, V, sizeof *r, ref_cmp);
	for (uint32_t i = 1; i < V && !rc; i++)
		if (strcmp(r[i - 1].s, r[i].s) == 0)
			rc = err_set(CORE_EFORMAT, model, "pieces %u and %u are the same text",
				     r[i - 1].id < r[i].id ? r[i - 1].id : r[i].id,
				     r[i - 1].id < r[i].id ? r[i].id : r[i - 1].id);
	free(r);
	return rc;
}

/* 0 when the model encodes as our tokenizer.json says; else CORE_EUNSUPPORTED naming why, or
 * CORE_EFORMAT for pieces no tokenizer.json can hold. */
static int spm_exportable(const struct tokenizer *tk, struct spm_spec *s)
{
	size_t len;
	const void *bytes = tokenizer_model_file(tk, &len);
	const char *model = tokenizer_spec(tk) + 4, *why = NULL;

	if (spm_read_spec(bytes, len, s) < 0)
		return err_set(CORE_EFORMAT, model, "a SentencePiece model whose settings cannot be "
			       "read");
	if (s->model_type != 1 && s->model_type != 2)
		why = "a word or character model";
	else if (strcmp(s->normalizer, "identity") != 0)
		why = "a normalisation other than identity";
	else if (s->add_dummy_prefix)
		why = "a dummy prefix";
	else if (s->remove_extra_ws)
		why = "extra whitespace removed";
	else if (!s->escape_ws || !s->split_by_whitespace || s->whitespace_as_suffix)
		why = "whitespace handled otherwise";
	else if (!s->byte_fallback)
		why = "no byte fallback";
	if (why)
		return err_set(CORE_EUNSUPPORTED, model, "a SentencePiece model with %s: a "
			       "tokenizer.json would not encode as it does (models of dpc-shard "
			       "tokenizer train can be written)", why);
	char buf[8];
	for (uint32_t i = 0; i < tokenizer_vocab(tk); i++) {
		const char *p = tokenizer_piece(tk, i, buf);
		if (!utf8_valid((const unsigned char *)p))
			return err_set(CORE_EFORMAT, model, "piece %u is not UTF-8", i);
		if (!isfinite(tokenizer_piece_score(tk, i)))
			return err_set(CORE_EFORMAT, model, "piece %u has a score of %g", i,
				       (double)tokenizer_piece_score(tk, i));
		if (s->model_type == 2 && strchr(p, ' ')) /* merges are "left right" */
			return err_set(CORE_EUNSUPPORTED, model, "BPE piece %u holds a space: its "
				       "merges cannot be written", i);
	}
	return unique_pieces(tk, model);
}

/* ---- tokenizer.json ------------------------------------------------------------------------ */

static json_t *added_token(uint32_t id, const char *content)
{
	return json_pack("{s:I,s:s,s:b,s:b,s:b,s:b,s:b}", "id", (json_int_t)id, "content",
			 content, "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
			 "special", 1);
}

/* GPT-2's byte-to-symbol table (its bytes_to_unicode): the printable bytes stand for
 * themselves, the others for U+0100 onwards in byte order; as UTF-8 into out[3]. */
static void byte_symbol(unsigned b, char out[3])
{
	unsigned cp = b, n = 0;
	if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
		for (unsigned k = 0; k < b; k++)
			if (!((k >= 33 && k <= 126) || (k >= 161 && k <= 172) || k >= 174))
				n++;
		cp = 256 + n;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		out[1] = 0;
	} else {
		out[0] = (char)(0xc0 | cp >> 6);
		out[1] = (char)(0x80 | (cp & 0x3f));
		out[2] = 0;
	}
}

static json_t *byte_tokenizer_json(void)
{
	json_t *vocab = json_object();
	char sym[3];
	for (unsigned b = 0; b < 256 && vocab; b++) {
		byte_symbol(b, sym);
		if (json_object_set_new(vocab, sym, json_integer(b)) < 0) {
			json_decref(vocab);
			vocab = NULL;
		}
	}
	if (!vocab)
		return NULL;
	return json_pack(
		"{s:s,s:n,s:n,s:[],s:n,s:{s:s,s:b,s:b,s:b},s:n,s:{s:s,s:b,s:b,s:b},"
		"s:{s:s,s:n,s:n,s:n,s:n,s:b,s:b,s:b,s:o,s:[]}}",
		"version", "1.0", "truncation", "padding", "added_tokens", "normalizer",
		"pre_tokenizer", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0,
		"use_regex", 0, "post_processor",
		"decoder", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0,
		"use_regex", 0,
		"model", "type", "BPE", "dropout", "unk_token", "continuing_subword_prefix",
		"end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 0, "ignore_merges", 0, "vocab",
		vocab, "merges");
}


static int find_piece(const struct piece_ref *refs, size_t n, const char *s, uint32_t *id)
{
	const struct piece_ref key = {s, 0}, *r = bsearch(&key, refs, n, sizeof *refs, ref_cmp);
	if (r)
		*id = r->id;
	return r != NULL;
}

struct merge {
	float score;
	uint32_t piece, left, right;
};

/* transformers' order: the merged piece's score, highest first, then the parts' ids */
static int merge_cmp(const void *a, const void *b)
{
	const struct merge *x = a, *y = b;
	if (x->score != y->score)
		return x->score > y->score ? -1 : 1;
	if (x->piece != y->piece)
		return x->piece < y->piece ? -1 : 1;
	if (x->left != y->left)
		return x->left < y->left ? -1 : 1;
	return x->right < y->right ? -1 : x->right > y->right;
}

/* BPE merges of the text pieces: every split of a piece into two pieces, at a character
 * boundary. */
static json_t *bpe_merges(const struct tokenizer *tk, const struct piece_ref *refs, size_t nref)
{
	const uint32_t V = tokenizer_vocab(tk);
	struct merge *m = NULL;
	size_t n = 0, cap = 0;
	char buf[8], left[TOKENIZER_TOKEN_MAX * 4];

	for (uint32_t i = 0; i < V; i++) {
		if (tokenizer_piece_kind(tk, i) != TOKENIZER_PIECE_TEXT)
			continue;
		const char *p = tokenizer_piece(tk, i, buf);
		const size_t len = strlen(p);
		if (len >= sizeof left)
			continue;
		for (size_t k = 1; k < len; k++) {
			uint32_t a, b;
			if (((unsigned char)p[k] & 0xc0) == 0x80) /* inside a character */
				continue;
			memcpy(left, p, k);
			left[k] = 0;
			if (!find_piece(refs, nref, left, &a) || !find_piece(refs, nref, p + k, &b))
				continue;
			if (n == cap) {
				struct merge *g = realloc(m, (cap = cap ? 2 * cap : 1024) * sizeof *m);
				if (!g) {
					free(m);
					return NULL;
				}
				m = g;
			}
			m[n++] = (struct merge){tokenizer_piece_score(tk, i), i, a, b};
		}
	}
	if (n) /* no merges at all: qsort wants an array */
		qsort(m, n, sizeof *m, merge_cmp);
	json_t *arr = json_array();
	for (size_t k = 0; k < n && arr; k++) {
		char *s = NULL;
		if (asprintf(&s, "%s %s", tokenizer_piece(tk, m[k].left, buf),
			     tokenizer_piece(tk, m[k].right, buf)) < 0 ||
		    json_array_append_new(arr, json_string(s)) < 0) {
			json_decref(arr);
			arr = NULL;
		}
		free(s);
	}
	free(m);
	return arr;
}

static json_t *spm_tokenizer_json(const struct tokenizer *tk, const struct spm_spec *spec)
{
	const uint32_t V = tokenizer_vocab(tk);
	json_t *added = json_array(), *vocab = spec->model_type == 1 ? json_array() : json_object();
	struct piece_ref *refs = calloc(V, sizeof *refs);
	char buf[8];
	int64_t unk = -1;
	int ok = added && vocab && refs;

	for (uint32_t i = 0; i < V && ok; i++) {
		const char *p = tokenizer_piece(tk, i, buf);
		refs[i] = (struct piece_ref){p, i};
		if (tokenizer_piece_kind(tk, i) == TOKENIZER_PIECE_CONTROL) {
			ok = json_array_append_new(added, added_token(i, p)) == 0;
			if (unk < 0 && strcmp(p, "<unk>") == 0)
				unk = i;
		}
		if (ok && spec->model_type == 1) /* [piece, score] in id order */
			ok = json_array_append_new(vocab, json_pack("[s,f]", p,
				(double)tokenizer_piece_score(tk, i))) == 0;
		else if (ok) /* piece: id */
			ok = json_object_set_new(vocab, p, json_integer(i)) == 0;
	}
	json_t *model = NULL;
	if (ok && spec->model_type == 1) {
		model = json_pack("{s:s,s:o,s:o,s:b}", "type", "Unigram", "unk_id",
				  unk >= 0 ? json_integer(unk) : json_null(), "vocab", vocab,
				  "byte_fallback", 1);
		vocab = NULL;
	} else if (ok) {
		qsort(refs, V, sizeof *refs, ref_cmp);
		json_t *merges = bpe_merges(tk, refs, V);
		model = merges ? json_pack("{s:s,s:n,s:o,s:n,s:n,s:b,s:b,s:b,s:o,s:o}", "type",
					   "BPE", "dropout", "unk_token",
					   unk >= 0 ? json_string("<unk>") : json_null(),
					   "continuing_subword_prefix", "end_of_word_suffix",
					   "fuse_unk", 1, "byte_fallback", 1, "ignore_merges", 0,
					   "vocab", vocab, "merges", merges) : NULL;
		vocab = NULL;
	}
	free(refs);
	json_decref(vocab);
	if (!model) {
		json_decref(added);
		return NULL;
	}
	return json_pack(
		"{s:s,s:n,s:n,s:o,s:n,s:{s:s,s:s,s:s,s:b},s:n,"
		"s:{s:s,s:[{s:s,s:{s:s},s:s},{s:s},{s:s}]},s:o}",
		"version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer",
		"pre_tokenizer", "type", "Metaspace", "replacement", "\xe2\x96\x81",
		"prepend_scheme", "never", "split", 1, "post_processor",
		"decoder", "type", "Sequence", "decoders", "type", "Replace", "pattern", "String",
		"\xe2\x96\x81", "content", " ", "type", "ByteFallback", "type", "Fuse",
		"model", model);
}

/* ---- the files ----------------------------------------------------------------------------- */

int tokenizer_hf_files(const struct tokenizer *tk, const char *names[TOKENIZER_HF_MAX_FILES])
{
	size_t len;
	names[0] = "tokenizer.json";
	names[1] = "tokenizer_config.json";
	names[2] = "tokenizer.model";
	return tokenizer_model_file(tk, &len) ? 3 : 2;
}

static int write_json(const char *dir, const char *name, json_t *j)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	if (!j)
		return err_set(CORE_ENOMEM, path, "cannot build the JSON");
	char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(j);
	if (!text)
		return err_set(CORE_ENOMEM, path, "cannot build the JSON");
	size_t n = strlen(text);
	text[n] = '\n'; /* json_dumps' NUL becomes the last line's end */
	int rc = file_write_atomic(path, text, n + 1);
	free(text);
	return rc;
}

int tokenizer_hf_write(const struct tokenizer *tk, const char *dir, int max_len)
{
	struct spm_spec spec;
	size_t len;
	const void *model = tokenizer_model_file(tk, &len);
	json_t *tj;

	if (model) {
		ERR_FORWARD(spm_exportable(tk, &spec));
		tj = spm_tokenizer_json(tk, &spec);
	} else {
		tj = byte_tokenizer_json();
	}
	ERR_FORWARD(write_json(dir, "tokenizer.json", tj));
	json_t *cfg = model ?
		json_pack("{s:s,s:i,s:s,s:s,s:s,s:b,s:b,s:b}", "tokenizer_class",
			  "PreTrainedTokenizerFast", "model_max_length", max_len, "unk_token",
			  "<unk>", "bos_token", "<s>", "eos_token", "</s>", "add_bos_token", 0,
			  "add_eos_token", 0, "clean_up_tokenization_spaces", 0) :
		json_pack("{s:s,s:i,s:b}", "tokenizer_class", "PreTrainedTokenizerFast",
			  "model_max_length", max_len, "clean_up_tokenization_spaces", 0);
	ERR_FORWARD(write_json(dir, "tokenizer_config.json", cfg));
	if (model) {
		char path[4096];
		snprintf(path, sizeof path, "%s/tokenizer.model", dir);
		ERR_FORWARD(file_write_atomic(path, model, len));
	}
	return 0;
}
