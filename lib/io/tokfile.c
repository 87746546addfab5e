/* tokfile.c - read and write token files; the layout is in tokfile.h and dpc-tokens(5).
 *
 * The reader trusts nothing before it is checked, in this order: magic, version, header crc,
 * sizes against the file length, body crc, then the structure (offsets, tokens < vocab). The
 * header crc comes before the sizes so that a flipped bit in a count reads as corruption, not
 * as a truncated file; the version comes before the header crc because another version may
 * lay the header out differently.
 */
#include "io/tokfile.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/crc.h"
#include "common/err.h"
#include "common/banned.h"

static const char tokfile_magic[8] = "DPCTOKS";

static void put_u32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
	uint32_t v = 0;
	for (int i = 0; i < 4; i++)
		v |= (uint32_t)p[i] << (8 * i);
	return v;
}

static uint64_t get_u64(const unsigned char *p)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

static uint32_t width_for(uint32_t vocab)
{
	return vocab <= 65536 ? 2 : 4;
}

static uint64_t round8(uint64_t n)
{
	return (n + 7) & ~(uint64_t)7;
}

/* The arrays are mapped and used in place as uint16/32/64: this build reads little-endian. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files are little-endian");

/* ---- reader ------------------------------------------------------------------------------- */

void tokfile_close(struct tokfile *tf)
{
	if (tf->map)
		munmap(tf->map, tf->maplen);
	free(tf->path);
	memset(tf, 0, sizeof *tf);
}

/* Body size from the header fields, or -1 on overflow (only a corrupted or hostile header). */
static int body_bytes(uint64_t ntokens, uint32_t width, uint64_t ndocs, uint64_t meta_bytes,
		      uint64_t *out)
{
	uint64_t tok, idx, n;

	if (__builtin_mul_overflow(ntokens, (uint64_t)width, &tok) || tok > UINT64_MAX - 7)
		return -1;
	if (ndocs == UINT64_MAX || __builtin_mul_overflow(ndocs + 1, (uint64_t)16, &idx))
		return -1;
	if (__builtin_add_overflow(round8(tok), idx, &n) ||
	    __builtin_add_overflow(n, meta_bytes, &n))
		return -1;
	*out = n;
	return 0;
}

static int check_header(const unsigned char *h, size_t flen, const char *path)
{
	size_t m = flen < sizeof tokfile_magic ? flen : sizeof tokfile_magic;

	/* A proper prefix of the magic (the empty file included) is a truncated token file. */
	if (memcmp(h, tokfile_magic, m) != 0)
		return err_set(CORE_EFORMAT, path, "not a token file");
	if (flen < TOKFILE_HEADER_BYTES)
		return err_set(CORE_ETRUNC, path,
			       "truncated file: %zu bytes, shorter than the %d-byte header", flen,
			       TOKFILE_HEADER_BYTES);
	uint32_t version = get_u32(h + 8);
	if (version != 1 && version != TOKFILE_VERSION)
		return err_set(CORE_EVERSION, path,
			       "version %u not supported (this build reads 1 to %d)", version,
			       TOKFILE_VERSION);
	uint32_t want = get_u32(h + 60);
	uint32_t got = crc32_update(0, h, 60);
	if (want != got)
		return err_set(CORE_ECHECKSUM, path,
			       "header checksum mismatch (stored %08x, computed %08x)", want, got);
	return 0;
}

/* dpc-tokens(5): a document's metadata is a JSON object in UTF-8 without NUL bytes, or
 * nothing at all (0 bytes: no metadata). The reader and the writer hold files to the same
 * rule. jansson's message is left out: it quotes the offending bytes, which may be anything. */
static int check_meta(int code, const char *path, uint64_t d, const char *meta, size_t len)
{
	json_error_t je;
	json_t *o;

	if (len == 0)
		return 0;
	if (memchr(meta, '\0', len))
		return err_set(code, path, "metadata of document %llu contains a NUL byte",
			       (unsigned long long)d);
	/* JSON_ALLOW_NUL: a string may hold \u0000, written escaped, as the corpus reader does. */
	o = json_loadb(meta, len, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &je);
	if (!o)
		return err_set(code, path,
			       "metadata of document %llu is not valid JSON (at byte %d of %zu)",
			       (unsigned long long)d, je.position, len);
	int obj = json_is_object(o);
	json_decref(o);
	if (!obj)
		return err_set(code, path, "metadata of document %llu is not a JSON object",
			       (unsigned long long)d);
	return 0;
}

static int check_structure(struct tokfile *tf)
{
	const uint64_t *o = tf->offsets, *m = tf->meta_offsets;
	uint64_t meta_bytes = m[tf->ndocs];

	if (o[0] != 0 || o[tf->ndocs] != tf->ntokens)
		return err_set(CORE_EFORMAT, tf->path,
			       "document offsets span [%llu, %llu], expected [0, %llu]",
			       (unsigned long long)o[0], (unsigned long long)o[tf->ndocs],
			       (unsigned long long)tf->ntokens);
	for (uint64_t d = 0; d < tf->ndocs; d++)
		if (o[d + 1] < o[d])
			return err_set(CORE_EFORMAT, tf->path,
				       "document %llu has a negative length",
				       (unsigned long long)d);
	if (m[0] != 0)
		return err_set(CORE_EFORMAT, tf->path, "metadata offsets do not start at 0");
	for (uint64_t d = 0; d < tf->ndocs; d++)
		if (m[d + 1] < m[d] || m[d + 1] > meta_bytes)
			return err_set(CORE_EFORMAT, tf->path,
				       "metadata of document %llu out of order",
				       (unsigned long long)d);
	for (uint64_t d = 0; d < tf->ndocs; d++)
		ERR_FORWARD(check_meta(CORE_EFORMAT, tf->path, d, tf->meta + m[d],
				       (size_t)(m[d + 1] - m[d])));
	/* 16-bit tokens under a vocabulary of 65536 are all valid: no scan needed. */
	uint64_t scan = tf->width == 2 && tf->vocab >= 65536 ? 0 : tf->ntokens;
	for (uint64_t i = 0; i < scan; i++) {
		uint32_t t = tokfile_token(tf, i);
		if (t >= tf->vocab)
			return err_set(CORE_EFORMAT, tf->path,
				       "token %u at position %llu is outside the vocabulary "
				       "of %u", t, (unsigned long long)i, tf->vocab);
	}
	/* Padding after the tokens must be zero, so that equal corpora give equal files. */
	const unsigned char *pad = (const unsigned char *)tf->tokens + tf->ntokens * tf->width;
	for (const unsigned char *p = pad; p < (const unsigned char *)tf->offsets; p++)
		if (*p)
			return err_set(CORE_EFORMAT, tf->path, "nonzero padding after the tokens");
	return 0;
}

static int map_file(struct tokfile *tf, const char *path)
{
	struct stat st;
	int fd, rc = file_open_regular(path, &fd, &st);

	if (rc == CORE_ENOTFOUND)
		return err_errno(CORE_EIO, path, "cannot open", ENOENT);
	if (rc < 0)
		return rc;
	tf->maplen = (size_t)st.st_size;
	if (tf->maplen > 0) {
		void *m = mmap(NULL, tf->maplen, PROT_READ, MAP_PRIVATE, fd, 0);
		if (m == MAP_FAILED) {
			int e = errno;
			close(fd);
			return err_errno(CORE_EIO, path, "cannot map", e);
		}
		tf->map = m;
	}
	close(fd);
	return 0;
}

static int open_checked(struct tokfile *tf, const char *path)
{
	static const unsigned char empty[1];
	const unsigned char *h;
	uint64_t body;

	ERR_FORWARD(map_file(tf, path));
	h = tf->map ? tf->map : empty;
	ERR_FORWARD(check_header(h, tf->maplen, path));

	tf->vocab = get_u32(h + 12);
	tf->ndocs = get_u64(h + 16);
	tf->ntokens = get_u64(h + 24);
	tf->width = get_u32(h + 32);
	tf->crc = get_u32(h + 36);
	uint64_t meta_bytes = get_u64(h + 40);

	if (tf->vocab == 0 || tf->width != width_for(tf->vocab))
		return err_set(CORE_EFORMAT, path, "token width %u does not fit vocabulary size %u",
			       tf->width, tf->vocab);
	tf->version = get_u32(h + 8);
	if (tf->version == 1) {
		for (int i = 48; i < 60; i++)
			if (h[i])
				return err_set(CORE_EFORMAT, path,
					       "reserved header bytes are not zero");
	} else {
		tf->tokenizer.kind = get_u32(h + 48);
		tf->tokenizer.digest = get_u64(h + 52);
		if (tf->tokenizer.kind > TOKENIZER_SPM)
			return err_set(CORE_EFORMAT, path, "unknown tokenizer kind %u",
				       tf->tokenizer.kind);
		if (tf->tokenizer.kind != TOKENIZER_SPM && tf->tokenizer.digest)
			return err_set(CORE_EFORMAT, path, "a tokenizer digest without a "
				       "SentencePiece tokenizer");
		if (tf->tokenizer.kind == TOKENIZER_BYTE && tf->vocab != 256)
			return err_set(CORE_EFORMAT, path, "the byte tokenizer with a vocabulary "
				       "of %u", tf->vocab);
	}
	tf->tokenizer = tokenizer_id_known(tf->tokenizer, tf->vocab);
	if (body_bytes(tf->ntokens, tf->width, tf->ndocs, meta_bytes, &body) != 0 ||
	    body > UINT64_MAX - TOKFILE_HEADER_BYTES)
		return err_set(CORE_EFORMAT, path, "header sizes overflow");
	uint64_t want = TOKFILE_HEADER_BYTES + body;
	if ((uint64_t)tf->maplen < want)
		return err_set(CORE_ETRUNC, path, "truncated file: %zu bytes, header says %llu",
			       tf->maplen, (unsigned long long)want);
	if ((uint64_t)tf->maplen > want)
		return err_set(CORE_EFORMAT, path, "%llu bytes of trailing garbage",
			       (unsigned long long)((uint64_t)tf->maplen - want));

	uint32_t crc = (uint32_t)crc32_update(0, h + TOKFILE_HEADER_BYTES, (size_t)body);
	if (crc != tf->crc)
		return err_set(CORE_ECHECKSUM, path,
			       "body checksum mismatch (stored %08x, computed %08x)", tf->crc, crc);

	const unsigned char *p = h + TOKFILE_HEADER_BYTES;
	tf->tokens = p;
	p += round8(tf->ntokens * tf->width);
	tf->offsets = (const uint64_t *)(const void *)p;
	p += 8 * (tf->ndocs + 1);
	tf->meta_offsets = (const uint64_t *)(const void *)p;
	p += 8 * (tf->ndocs + 1);
	tf->meta = (const char *)p;
	if (tf->meta_offsets[tf->ndocs] != meta_bytes)
		return err_set(CORE_EFORMAT, path, "metadata offsets end at %llu, header says %llu",
			       (unsigned long long)tf->meta_offsets[tf->ndocs],
			       (unsigned long long)meta_bytes);
	return check_structure(tf);
}

int tokfile_open(struct tokfile *tf, const char *path)
{
	memset(tf, 0, sizeof *tf);
	/* Set before the checks: check_structure() names the file through tf->path. */
	tf->path = strdup(path);
	if (!tf->path)
		return err_set(CORE_ENOMEM, path, "out of memory");
	int rc = open_checked(tf, path);
	if (rc < 0) {
		tokfile_close(tf);
		return rc;
	}
	return 0;
}

const char *tokfile_doc_meta(const struct tokfile *tf, uint64_t d, size_t *len)
{
	*len = (size_t)(tf->meta_offsets[d + 1] - tf->meta_offsets[d]);
	return tf->meta + tf->meta_offsets[d];
}

/* ---- writer ------------------------------------------------------------------------------- */

struct tokfile_writer {
	struct afile af;
	uint32_t vocab, width;
	uint32_t crc; /* of the body written so far */
	uint64_t ntokens;
	uint64_t *offsets, *meta_offsets; /* ndocs + 1 each */
	uint64_t ndocs, cap;
	char *meta;
	size_t meta_len, meta_cap;
	unsigned char *buf; /* conversion buffer for one chunk of tokens */
	int prepared;       /* tokw_prepare succeeded: complete and synced, not yet renamed */
	struct tokenizer_id tokenizer;
};

#define TOKW_CHUNK 65536

static int tokw_body(struct tokfile_writer *w, const void *p, size_t n)
{
	ERR_FORWARD(afile_write(&w->af, p, n));
	w->crc = crc32_update(w->crc, p, n);
	return 0;
}

static void tokw_free(struct tokfile_writer *w)
{
	free(w->offsets);
	free(w->meta_offsets);
	free(w->meta);
	free(w->buf);
	free(w);
}

int tokw_open(struct tokfile_writer **out, const char *path, uint32_t vocab)
{
	static const unsigned char zero[TOKFILE_HEADER_BYTES];
	struct tokfile_writer *w;
	int rc;

	*out = NULL;
	if (vocab == 0)
		return err_set(CORE_EUSAGE, path, "vocabulary size must be at least 1");
	w = calloc(1, sizeof *w);
	if (!w)
		return err_set(CORE_ENOMEM, path, "out of memory");
	w->vocab = vocab;
	w->width = width_for(vocab);
	w->crc = 0u;
	w->cap = 1024;
	w->offsets = malloc(w->cap * sizeof *w->offsets);
	w->meta_offsets = malloc(w->cap * sizeof *w->meta_offsets);
	w->buf = malloc((size_t)TOKW_CHUNK * 4);
	if (!w->offsets || !w->meta_offsets || !w->buf) {
		tokw_free(w);
		return err_set(CORE_ENOMEM, path, "out of memory");
	}
	w->offsets[0] = w->meta_offsets[0] = 0;
	rc = afile_open(&w->af, path);
	if (rc < 0) {
		tokw_free(w);
		return rc;
	}
	/* Placeholder header, patched by tokw_commit once the counts are known. */
	rc = afile_write(&w->af, zero, sizeof zero);
	if (rc < 0) {
		tokw_abort(w);
		return rc;
	}
	*out = w;
	return 0;
}

void tokw_set_tokenizer(struct tokfile_writer *w, struct tokenizer_id id)
{
	w->tokenizer = id;
}

int tokw_add_doc(struct tokfile_writer *w, const uint32_t *tokens, uint64_t n,
		 const char *meta_json, size_t meta_len)
{
	const char *path = w->af.path;

	ERR_FORWARD(check_meta(CORE_EUSAGE, path, w->ndocs, meta_json, meta_len));
	if (w->ndocs + 1 == w->cap) {
		uint64_t cap = w->cap * 2;
		uint64_t *o = realloc(w->offsets, cap * sizeof *o);
		if (o)
			w->offsets = o;
		uint64_t *m = realloc(w->meta_offsets, cap * sizeof *m);
		if (m)
			w->meta_offsets = m;
		if (!o || !m)
			return err_set(CORE_ENOMEM, path, "out of memory");
		w->cap = cap;
	}
	if (w->meta_len + meta_len > w->meta_cap) {
		size_t cap = w->meta_cap ? w->meta_cap : 4096;
		while (cap < w->meta_len + meta_len)
			cap *= 2;
		char *m = realloc(w->meta, cap);
		if (!m)
			return err_set(CORE_ENOMEM, path, "out of memory");
		w->meta = m;
		w->meta_cap = cap;
	}
	for (uint64_t i = 0; i < n; i += TOKW_CHUNK) {
		size_t k = n - i < TOKW_CHUNK ? (size_t)(n - i) : TOKW_CHUNK;
		for (size_t j = 0; j < k; j++) {
			uint32_t t = tokens[i + j];
			if (t >= w->vocab)
				return err_set(CORE_EUSAGE, path,
					       "token %u of document %llu is outside "
					       "the vocabulary of %u",
					       t, (unsigned long long)w->ndocs, w->vocab);
			if (w->width == 2)
				((uint16_t *)(void *)w->buf)[j] = (uint16_t)t;
			else
				((uint32_t *)(void *)w->buf)[j] = t;
		}
		ERR_FORWARD(tokw_body(w, w->buf, k * w->width));
	}
	if (meta_len)
		memcpy(w->meta + w->meta_len, meta_json, meta_len);
	w->meta_len += meta_len;
	w->ntokens += n;
	w->ndocs++;
	w->offsets[w->ndocs] = w->ntokens;
	w->meta_offsets[w->ndocs] = w->meta_len;
	return 0;
}

static int tokw_finish(struct tokfile_writer *w)
{
	static const unsigned char zero[8];
	unsigned char h[TOKFILE_HEADER_BYTES];
	uint64_t tok = w->ntokens * w->width;

	if (w->tokenizer.kind > TOKENIZER_SPM ||
	    (w->tokenizer.kind == TOKENIZER_BYTE && w->vocab != 256))
		return err_set(CORE_EUSAGE, w->af.path, "tokenizer kind %u with a vocabulary of %u",
			       w->tokenizer.kind, w->vocab);
	ERR_FORWARD(tokw_body(w, zero, (size_t)(round8(tok) - tok)));
	ERR_FORWARD(tokw_body(w, w->offsets, (w->ndocs + 1) * sizeof *w->offsets));
	ERR_FORWARD(tokw_body(w, w->meta_offsets, (w->ndocs + 1) * sizeof *w->meta_offsets));
	if (w->meta_len)
		ERR_FORWARD(tokw_body(w, w->meta, w->meta_len));

	memset(h, 0, sizeof h);
	memcpy(h, tokfile_magic, sizeof tokfile_magic);
	put_u32(h + 8, TOKFILE_VERSION);
	put_u32(h + 12, w->vocab);
	put_u64(h + 16, w->ndocs);
	put_u64(h + 24, w->ntokens);
	put_u32(h + 32, w->width);
	put_u32(h + 36, w->crc);
	put_u64(h + 40, w->meta_len);
	put_u32(h + 48, w->tokenizer.kind);
	put_u64(h + 52, w->tokenizer.kind == TOKENIZER_SPM ? w->tokenizer.digest : 0);
	put_u32(h + 60, crc32_update(0, h, 60));
	return afile_pwrite(&w->af, h, sizeof h, 0);
}

int tokw_prepare(struct tokfile_writer *w)
{
	int rc = 0;

	if (!w->prepared) {
		rc = tokw_finish(w);
		if (rc == 0)
			rc = afile_prepare(&w->af);
		w->prepared = rc == 0;
	}
	return rc;
}

int tokw_commit(struct tokfile_writer *w)
{
	int rc = tokw_prepare(w);

	if (rc < 0) {
		tokw_abort(w);
		return rc;
	}
	rc = afile_commit(&w->af);
	tokw_free(w);
	return rc;
}

void tokw_abort(struct tokfile_writer *w)
{
	if (!w)
		return;
	afile_abort(&w->af);
	tokw_free(w);
}
