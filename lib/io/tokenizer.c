/* tokenizer.c - the byte tokenizer and SentencePiece models behind one interface
 * (tokenizer.h). */
#include "io/tokenizer.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "common/crc.h"
#include "common/err.h"
#include "io/atomicio.h"
#include "io/spm_shim.h"

#include "common/banned.h"

/* A SentencePiece model file is a few MiB; this bounds what a wrong path can make us read. */
#define SPM_MODEL_MAX ((size_t)1 << 30)

struct tokenizer {
	char *spec;
	uint32_t vocab;
	struct tokenizer_id id;
	struct spm_model *spm; /* NULL for the byte tokenizer */
	char *model;           /* the model file's bytes (SentencePiece) */
	size_t model_len;
};

/* ---- ids ---------------------------------------------------------------------------------- */

void tokenizer_id_str(const struct tokenizer_id *id, char buf[TOKENIZER_ID_LEN])
{
	if (id->kind == TOKENIZER_BYTE)
		snprintf(buf, TOKENIZER_ID_LEN, "byte");
	else if (id->kind == TOKENIZER_SPM)
		snprintf(buf, TOKENIZER_ID_LEN, "spm-%016" PRIx64, id->digest);
	else
		snprintf(buf, TOKENIZER_ID_LEN, "unknown");
}

int tokenizer_id_parse(const char *s, struct tokenizer_id *id)
{
	*id = (struct tokenizer_id){0};
	if (strcmp(s, "byte") == 0) {
		id->kind = TOKENIZER_BYTE;
		return 0;
	}
	if (strncmp(s, "spm-", 4) == 0 && strlen(s + 4) == 16 &&
	    strspn(s + 4, "0123456789abcdef") == 16) {
		id->kind = TOKENIZER_SPM;
		id->digest = strtoull(s + 4, NULL, 16);
		return 0;
	}
	return err_set(CORE_EFORMAT, NULL, "'%s' names no tokenizer (byte, or spm- and 16 hex "
		       "digits)", s);
}

struct tokenizer_id tokenizer_id_known(struct tokenizer_id id, uint32_t vocab)
{
	if (id.kind == TOKENIZER_NONE && vocab == 256)
		id.kind = TOKENIZER_BYTE;
	return id;
}

int tokenizer_id_differ(struct tokenizer_id a, struct tokenizer_id b)
{
	return a.kind != TOKENIZER_NONE && b.kind != TOKENIZER_NONE &&
	       (a.kind != b.kind || a.digest != b.digest);
}

/* ---- token buffers ------------------------------------------------------------------------ */

int token_buf_reserve(struct token_buf *t, uint64_t cap)
{
	if (cap <= t->cap)
		return 0;
	uint64_t c = t->cap ? t->cap : 4096;
	while (c < cap)
		c *= 2;
	if (c > SIZE_MAX / sizeof *t->tok)
		return err_set(CORE_ENOMEM, NULL, "%llu tokens do not fit in memory",
			       (unsigned long long)c);
	uint32_t *p = realloc(t->tok, (size_t)c * sizeof *p);
	if (!p)
		return err_set(CORE_ENOMEM, NULL, "out of memory for %llu tokens",
			       (unsigned long long)c);
	t->tok = p;
	t->cap = c;
	return 0;
}

void token_buf_free(struct token_buf *t)
{
	free(t->tok);
	memset(t, 0, sizeof *t);
}

/* ---- open, encode, decode ----------------------------------------------------------------- */

#ifdef CORE_HAVE_SPM
/* The largest cut <= at (and >= 1) where a UTF-8 character of s starts: no character split. */
static size_t char_start(const char *s, size_t at)
{
	while (at > 1 && ((unsigned char)s[at] & 0xc0) == 0x80)
		at--;
	return at;
}

static uint64_t model_digest(const void *bytes, size_t len)
{
	uLong a = adler32(0L, Z_NULL, 0);
	for (size_t off = 0; off < len; off += 1u << 30) { /* zlib takes uInt lengths */
		const size_t n = len - off < (1u << 30) ? len - off : (1u << 30);
		a = adler32(a, (const Bytef *)bytes + off, (uInt)n);
	}
	return (uint64_t)crc32_update(0, bytes, len) << 32 | (uint64_t)(a & 0xffffffffu);
}

static int open_spm(struct tokenizer *tk, const char *path)
{
	char *bytes = NULL, msg[512];
	size_t len = 0;
	ERR_FORWARD(file_read_regular(path, SPM_MODEL_MAX, &bytes, &len));
	int rc = 0;
	if (spm_shim_load(&tk->spm, bytes, len, msg, sizeof msg) < 0)
		rc = err_set(CORE_EFORMAT, path, "%s", msg);
	else if ((tk->vocab = spm_shim_vocab(tk->spm)) < 1)
		rc = err_set(CORE_EFORMAT, path, "a SentencePiece model without pieces");
	tk->id = (struct tokenizer_id){.kind = TOKENIZER_SPM, .digest = model_digest(bytes, len)};
	tk->model = bytes;
	tk->model_len = len;
	return rc;
}
#else
static int open_spm(struct tokenizer *tk, const char *path)
{
	(void)tk;
	return err_set(CORE_EUNSUPPORTED, path, "this build has no SentencePiece: install "
		       "libsentencepiece-dev (apt-get) and rebuild");
}
#endif

int tokenizer_open(struct tokenizer **out, const char *spec)
{
	*out = NULL;
	struct tokenizer *tk = calloc(1, sizeof *tk);
	if (!tk || !(tk->spec = strdup(spec))) {
		free(tk);
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the tokenizer");
	}
	int rc = 0;
	if (strcmp(spec, "byte") == 0) {
		tk->vocab = 256;
		tk->id.kind = TOKENIZER_BYTE;
	} else if (strncmp(spec, "spm:", 4) == 0 && spec[4]) {
		rc = open_spm(tk, spec + 4);
	} else {
		rc = err_set(CORE_EUSAGE, NULL, "unknown tokenizer '%s' (byte, or spm:MODEL for a "
			     "SentencePiece model file)", spec);
	}
	if (rc < 0) {
		tokenizer_close(tk);
		return rc;
	}
	*out = tk;
	return 0;
}

void tokenizer_close(struct tokenizer *tk)
{
	if (!tk)
		return;
#ifdef CORE_HAVE_SPM
	spm_shim_free(tk->spm);
#endif
	free(tk->model);
	free(tk->spec);
	free(tk);
}

const void *tokenizer_model_file(const struct tokenizer *tk, size_t *len)
{
	*len = tk->model_len;
	return tk->model;
}

int tokenizer_piece_kind(const struct tokenizer *tk, uint32_t id)
{
#ifdef CORE_HAVE_SPM
	if (tk->spm)
		return spm_shim_kind(tk->spm, id) == SPM_PIECE_BYTE ? TOKENIZER_PIECE_BYTE :
		       spm_shim_kind(tk->spm, id) == SPM_PIECE_CONTROL ? TOKENIZER_PIECE_CONTROL :
		       TOKENIZER_PIECE_TEXT;
#endif
	(void)tk;
	(void)id;
	return TOKENIZER_PIECE_BYTE;
}

float tokenizer_piece_score(const struct tokenizer *tk, uint32_t id)
{
#ifdef CORE_HAVE_SPM
	if (tk->spm)
		return spm_shim_score(tk->spm, id);
#endif
	(void)tk;
	(void)id;
	return 0.0f;
}

uint32_t tokenizer_vocab(const struct tokenizer *tk) { return tk->vocab; }
struct tokenizer_id tokenizer_get_id(const struct tokenizer *tk) { return tk->id; }
const char *tokenizer_spec(const struct tokenizer *tk) { return tk->spec; }

int tokenizer_encode(const struct tokenizer *tk, const char *text, size_t len,
		     struct token_buf *out)
{
#ifdef CORE_HAVE_SPM
	/* A long text goes to SentencePiece in pieces of at most TOKENIZER_ENCODE_PIECE bytes,
	 * so that its lattice (tens of bytes a character) stays small whatever the document.
	 * Each piece ends before a space: the models split words there (no piece holds a space
	 * but as its first character), so the tokens are those of the whole text; only a piece
	 * without a space is cut elsewhere, at a character boundary. */
	if (tk->spm) {
		char msg[512];
		size_t at = 0;
		while (at < len) {
			size_t n = len - at;
			if (n > TOKENIZER_ENCODE_PIECE) {
				size_t cut = TOKENIZER_ENCODE_PIECE;
				while (cut > 1 && text[at + cut] != ' ')
					cut--;
				if (cut == 1) /* no space: a character boundary */
					cut = char_start(text + at, TOKENIZER_ENCODE_PIECE);
				n = cut;
			}
			if (spm_shim_encode(tk->spm, text + at, n, &out->tok, &out->n, &out->cap,
					    msg, sizeof msg) < 0)
				return err_set(CORE_EFORMAT, tk->spec + 4, "%s", msg);
			at += n;
		}
		return 0;
	}
#endif
	ERR_FORWARD(token_buf_reserve(out, out->n + len));
	const unsigned char *s = (const unsigned char *)text;
	for (size_t i = 0; i < len; i++)
		out->tok[out->n + i] = s[i];
	out->n += len;
	return 0;
}

int tokenizer_decode(const struct tokenizer *tk, const uint32_t *tok, size_t n, char **text,
		     size_t *len)
{
	*text = NULL;
	*len = 0;
	for (size_t i = 0; i < n; i++)
		if (tok[i] >= tk->vocab)
			return err_set(CORE_EFORMAT, NULL, "token %u at position %zu is outside the "
				       "vocabulary of %u (%s)", tok[i], i, tk->vocab, tk->spec);
#ifdef CORE_HAVE_SPM
	if (tk->spm) {
		char msg[512];
		if (spm_shim_decode(tk->spm, tok, n, text, len, msg, sizeof msg) < 0)
			return err_set(CORE_EFORMAT, tk->spec + 4, "%s", msg);
		return 0;
	}
#endif
	char *s = malloc(n + 1);
	if (!s)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the text of %zu tokens", n);
	for (size_t i = 0; i < n; i++)
		s[i] = (char)tok[i];
	s[n] = 0;
	*text = s;
	*len = n;
	return 0;
}

size_t tokenizer_token_bytes(const struct tokenizer *tk, uint32_t id,
			     char buf[TOKENIZER_TOKEN_MAX])
{
#ifdef CORE_HAVE_SPM
	if (tk->spm) {
		if (id >= tk->vocab)
			return 0;
		const char *p = spm_shim_piece(tk->spm, id);
		switch (spm_shim_kind(tk->spm, id)) {
		case SPM_PIECE_BYTE: {
			unsigned v = 0;
			if (sscanf(p, "<0x%2X>", &v) != 1)
				return 0;
			buf[0] = (char)v;
			return 1;
		}
		case SPM_PIECE_CONTROL:
			return 0;
		default:
			break;
		}
		size_t n = 0;
		for (; *p && n < TOKENIZER_TOKEN_MAX; p++) {
			if ((unsigned char)p[0] == 0xe2 && (unsigned char)p[1] == 0x96 &&
			    (unsigned char)p[2] == 0x81) { /* U+2581 LOWER ONE EIGHTH BLOCK */
				buf[n++] = ' ';
				p += 2;
			} else {
				buf[n++] = *p;
			}
		}
		return n;
	}
#endif
	buf[0] = (char)id;
	return 1;
}

const char *tokenizer_piece(const struct tokenizer *tk, uint32_t id, char buf[8])
{
#ifdef CORE_HAVE_SPM
	if (tk->spm)
		return id < tk->vocab ? spm_shim_piece(tk->spm, id) : "";
#endif
	buf[0] = (char)id;
	buf[1] = 0;
	return buf;
}

int tokenizer_check(const struct tokenizer *tk, struct tokenizer_id have, uint32_t have_vocab,
		    const char *file)
{
	const struct tokenizer_id h = tokenizer_id_known(have, have_vocab);
	char a[TOKENIZER_ID_LEN], b[TOKENIZER_ID_LEN];
	tokenizer_id_str(&h, a);
	tokenizer_id_str(&tk->id, b);
	const int same = strcmp(tk->spec, b) == 0; /* "byte" */
	if (tokenizer_id_differ(h, tk->id))
		return err_set(CORE_EUSAGE, file, "tokenizer %s, not the one given (%s%s%s)", a,
			       tk->spec, same ? "" : ", which is ", same ? "" : b);
	if (have_vocab != tk->vocab)
		return err_set(CORE_EUSAGE, file, "a vocabulary of %u, the tokenizer given (%s) has "
			       "%u", have_vocab, tk->spec, tk->vocab);
	return 0;
}

int tokenizer_for(const char *spec, struct tokenizer_id have, uint32_t vocab, const char *file,
		  int required, struct tokenizer **tk)
{
	const struct tokenizer_id h = tokenizer_id_known(have, vocab);
	char id[TOKENIZER_ID_LEN];

	*tk = NULL;
	if (spec) {
		ERR_FORWARD(tokenizer_open(tk, spec));
		int rc = tokenizer_check(*tk, h, vocab, file);
		if (rc < 0) {
			tokenizer_close(*tk);
			*tk = NULL;
		}
		return rc;
	}
	if (h.kind == TOKENIZER_BYTE)
		return tokenizer_open(tk, "byte");
	if (!required)
		return 0;
	tokenizer_id_str(&h, id);
	return err_set(CORE_EUSAGE, file, "made with %s%s, a vocabulary of %u: give its model "
		       "with --tokenizer spm:MODEL", h.kind ? "tokenizer " : "an unknown tokenizer",
		       h.kind ? id : "", vocab);
}

/* ---- training ----------------------------------------------------------------------------- */

#ifdef CORE_HAVE_SPM
/* The caller's texts cut into pieces of at most max_len bytes, each cut after the last
 * newline (else space) before the limit, else at a UTF-8 character boundary. */
struct cutter {
	int (*next)(void *ctx, const char **text, size_t *len);
	void *ctx;
	uint64_t max_len;
	const char *rest;
	size_t rest_len;
	int rc; /* the caller's error, returned by tokenizer_train */
};

static int cut_next(void *arg, const char **text, size_t *len)
{
	struct cutter *c = arg;
	while (c->rest_len == 0) {
		int rc = c->next(c->ctx, &c->rest, &c->rest_len);
		if (rc <= 0) {
			c->rc = rc;
			return rc < 0 ? -1 : 0;
		}
	}
	size_t n = c->rest_len;
	if (n > c->max_len) {
		const char *s = c->rest;
		size_t cut = 0;
		for (size_t i = c->max_len; i > c->max_len / 2 && !cut; i--)
			if (s[i - 1] == '\n')
				cut = i;
		for (size_t i = c->max_len; i > c->max_len / 2 && !cut; i--)
			if (s[i - 1] == ' ')
				cut = i;
		if (!cut)
			cut = char_start(s, c->max_len);
		n = cut;
	}
	*text = c->rest;
	*len = n;
	c->rest += n;
	c->rest_len -= n;
	return 1;
}
#endif

int tokenizer_train(const char *out, const struct tokenizer_train_opts *o,
		    int (*next)(void *ctx, const char **text, size_t *len), void *ctx,
		    struct tokenizer_id *id)
{
	const char *type = o->type ? o->type : "unigram";
	if (strcmp(type, "unigram") != 0 && strcmp(type, "bpe") != 0)
		return err_set(CORE_EUSAGE, NULL, "model type '%s': unigram or bpe", type);
	if (o->vocab < 260 || o->vocab > (1u << 20))
		return err_set(CORE_EUSAGE, NULL, "a vocabulary of %u: from 260 (3 special pieces, "
			       "256 bytes and one more) to %u", o->vocab, 1u << 20);
	if (!(o->coverage > 0 && o->coverage <= 1))
		return err_set(CORE_EUSAGE, NULL, "character coverage %g: in (0, 1]", o->coverage);
	if (o->threads < 1 || o->max_len < 16 || o->max_len > (1u << 30))
		return err_set(CORE_EUSAGE, NULL, "threads %d, text pieces of %llu bytes: at least "
			       "1 and 16", o->threads, (unsigned long long)o->max_len);
#ifdef CORE_HAVE_SPM
	struct cutter c = {.next = next, .ctx = ctx, .max_len = o->max_len};
	const struct spm_train_args a = {
		.type = type, .vocab = o->vocab, .sample = o->sample, .seed = o->seed,
		.threads = o->threads, .max_len = o->max_len, .character_coverage = o->coverage};
	char *model = NULL, msg[1024];
	size_t len = 0;
	if (spm_shim_train(&a, cut_next, &c, &model, &len, msg, sizeof msg) < 0)
		return c.rc < 0 ? c.rc : err_set(CORE_EFORMAT, out, "%s", msg);
	if (c.rc < 0) {
		free(model);
		return c.rc;
	}
	struct afile f;
	int rc = afile_open(&f, out);
	if (rc == 0) {
		if ((rc = afile_write(&f, model, len)) == 0)
			rc = afile_commit(&f); /* aborts itself on failure */
		else
			afile_abort(&f);
	}
	if (rc == 0 && id)
		*id = (struct tokenizer_id){.kind = TOKENIZER_SPM, .digest = model_digest(model, len)};
	free(model);
	return rc;
#else
	(void)next;
	(void)ctx;
	(void)id;
	return err_set(CORE_EUNSUPPORTED, out, "this build has no SentencePiece: install "
		       "libsentencepiece-dev (apt-get) and rebuild");
#endif
}
