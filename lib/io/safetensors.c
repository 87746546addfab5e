/* safetensors.c - read and write checkpoints in the safetensors format; see safetensors.h.
 *
 * Layout: u64 little-endian N, N bytes of JSON (padded with spaces to a multiple of 8, as the
 * reference implementation does, so the data section starts 8-byte aligned), then the data
 * section, each tensor's bytes at [begin, end) relative to its start. A reader trusts nothing:
 * every offset is checked against the file size before a byte of data is read, the ranges
 * must tile the data section exactly (no gaps, no overlap, nothing after the last tensor), and
 * the crc32 values we store in "__metadata__" are checked when present.
 */
#include "io/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "io/atomicio.h"
#include "common/crc.h"
#include "common/err.h"
#include "common/banned.h"

/* Tensor bytes go to and from disk as they are in memory, which is the format's byte order
 * only on a little-endian host. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors.c assumes little-endian");

#define ST_HEADER_MAX 100000000ull /* the reference implementation's limit on N */
#define ST_CHUNK (1u << 20)        /* streaming read size for verification */

/* ---- helpers ------------------------------------------------------------------------------ */

static void shape_str(char *buf, size_t n, int ndim, const int64_t *ne)
{
	size_t off = 0;

	off += (size_t)snprintf(buf + off, n - off, "[");
	for (int i = 0; i < ndim && off < n; i++)
		off += (size_t)snprintf(buf + off, n - off, "%s%lld", i ? "," : "",
					(long long)ne[i]);
	if (off < n)
		snprintf(buf + off, n - off, "]");
}

static void hex32(char out[9], uint32_t v) { snprintf(out, 9, "%08x", v); }

/* Exactly 8 lower-case hex digits, as we write them. */
static int parse_hex32(const char *s, uint32_t *out)
{
	uint32_t v = 0;

	if (strlen(s) != 8)
		return -1;
	for (int i = 0; i < 8; i++) {
		char c = s[i];
		uint32_t d;
		if (c >= '0' && c <= '9')
			d = (uint32_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			d = (uint32_t)(c - 'a' + 10);
		else
			return -1;
		v = v << 4 | d;
	}
	*out = v;
	return 0;
}

static int is_crc_key(const char *k)
{
	return strcmp(k, "crc32") == 0 || strncmp(k, "crc32.", 6) == 0;
}

/* ---- writing ------------------------------------------------------------------------------ */

static int build_header(const char *path, const struct tensor *const *ts, int n,
			const struct st_kv *meta, int nmeta, const uint32_t *crcs,
			uint32_t whole, char **out, size_t *outlen)
{
	json_t *root = json_object(), *md = json_object();
	char hex[9], key[TENSOR_NAME_MAX + 8];
	uint64_t off = 0;
	int rc = 0;

	if (!root || !md)
		goto nomem;
	/* __metadata__ first, as the reference implementation writes it. */
	if (json_object_set(root, "__metadata__", md))
		goto nomem;
	for (int i = 0; i < nmeta; i++) {
		json_t *v = json_string(meta[i].value);
		if (!v) {
			rc = err_set(CORE_EUSAGE, path, "metadata '%s' is not valid utf-8",
				     meta[i].key);
			goto out;
		}
		if (json_object_set_new(md, meta[i].key, v))
			goto nomem;
	}
	hex32(hex, whole);
	if (json_object_set_new(md, "crc32", json_string(hex)))
		goto nomem;
	for (int i = 0; i < n; i++) {
		const struct tensor *t = ts[i];
		json_t *e = json_object(), *shape = json_array(), *offs = json_array();
		uint64_t nb = tensor_nbytes(t);

		if (!e || !shape || !offs) {
			json_decref(e);
			json_decref(shape);
			json_decref(offs);
			goto nomem;
		}
		for (int d = 0; d < t->ndim; d++)
			json_array_append_new(shape, json_integer(t->ne[d]));
		json_array_append_new(offs, json_integer((json_int_t)off));
		json_array_append_new(offs, json_integer((json_int_t)(off + nb)));
		off += nb;
		json_object_set_new(e, "dtype", json_string(dtype_name(t->type)));
		json_object_set_new(e, "shape", shape);
		json_object_set_new(e, "data_offsets", offs);
		if (json_array_size(shape) != (size_t)t->ndim || json_array_size(offs) != 2 ||
		    json_object_size(e) != 3) {
			json_decref(e);
			goto nomem;
		}
		if (json_object_set_new(root, t->name, e))
			goto nomem;
		snprintf(key, sizeof key, "crc32.%s", t->name);
		hex32(hex, crcs[i]);
		if (json_object_set_new(md, key, json_string(hex)))
			goto nomem;
	}
	char *s = json_dumps(root, JSON_COMPACT);
	if (!s)
		goto nomem;
	size_t len = strlen(s);
	size_t padded = (len + 7) / 8 * 8;
	char *p = realloc(s, padded + 1);
	if (!p) {
		free(s);
		goto nomem;
	}
	memset(p + len, ' ', padded - len);
	p[padded] = '\0';
	*out = p;
	*outlen = padded;
	goto out;
nomem:
	rc = err_set(CORE_ENOMEM, path, "cannot build header");
out:
	json_decref(md);
	json_decref(root);
	return rc;
}

/* The streaming writer: the header goes out first with every crc32 as "00000000" (fixed
 * width, so the real values patch it in place at commit without moving a byte of data). */
struct st_writer {
	struct afile a;
	int n, cur;             /* tensors, the one being written (in order) */
	uint64_t *toff;         /* each tensor's offset in the file (out of order) */
	uint64_t pw_bytes;      /* bytes written out of order (atomic) */
	int pw_failed;          /* an out-of-order write failed (atomic) */
	int mode;               /* 0 none yet, 1 in order (put), 2 out of order (pwrite) */
	unsigned char *pw_crc;  /* tensors whose crc st_writer_set_crc gave */
	struct tensor *specs;   /* names, dtypes, shapes (no data) */
	uint64_t left;          /* bytes still owed to specs[cur] */
	uint32_t *crcs, whole;
	struct st_kv *meta;
	int nmeta;
	char *header;
	size_t hlen;
};

static int check_specs(const char *path, const struct tensor *const *ts, int n,
		       const struct st_kv *meta, int nmeta, int need_data)
{
	if (n < 0 || nmeta < 0 || (n > 0 && !ts) || (nmeta > 0 && !meta))
		return err_set(CORE_EUSAGE, path, "bad tensor or metadata count");
	for (int i = 0; i < n; i++) {
		const struct tensor *t = ts[i];
		if (!t)
			return err_set(CORE_EUSAGE, path, "tensor %d is null", i);
		size_t len = strnlen(t->name, TENSOR_NAME_MAX);
		if (len == 0 || len >= TENSOR_NAME_MAX)
			return err_set(CORE_EUSAGE, path, "tensor %d has no valid name", i);
		if (strcmp(t->name, "__metadata__") == 0)
			return err_set(CORE_EUSAGE, path, "tensor name '__metadata__' is reserved");
		if (t->be || !tensor_is_contiguous(t) || (unsigned)t->type >= DT_COUNT ||
		    t->ndim < 0 || t->ndim > TENSOR_MAX_DIMS)
			return err_set(CORE_EUSAGE, path,
				       "tensor '%s' is not a contiguous host tensor", t->name);
		if (need_data && !t->data && tensor_nbytes(t) > 0)
			return err_set(CORE_EUSAGE, path, "tensor '%s' has no data", t->name);
		for (int j = 0; j < i; j++)
			if (strcmp(ts[j]->name, t->name) == 0)
				return err_set(CORE_EUSAGE, path, "tensor name '%s' given twice",
					       t->name);
	}
	for (int i = 0; i < nmeta; i++) {
		if (!meta[i].key || !meta[i].value)
			return err_set(CORE_EUSAGE, path, "metadata pair %d is null", i);
		if (is_crc_key(meta[i].key))
			return err_set(CORE_EUSAGE, path, "metadata key '%s' is reserved",
				       meta[i].key);
	}
	return 0;
}

static const struct tensor *const *spec_ptrs(struct st_writer *w, const struct tensor **buf)
{
	for (int i = 0; i < w->n; i++)
		buf[i] = &w->specs[i];
	return buf;
}

/* Header text for the crcs in w (placeholders until commit). */
static int writer_header(struct st_writer *w, char **out, size_t *len)
{
	const struct tensor **ptrs = malloc(sizeof *ptrs * (size_t)(w->n ? w->n : 1));
	if (!ptrs)
		return err_set(CORE_ENOMEM, w->a.path, "cannot build header");
	int rc = build_header(w->a.path, spec_ptrs(w, ptrs), w->n, w->meta, w->nmeta, w->crcs,
			      w->whole, out, len);
	free(ptrs);
	return rc;
}

static void writer_free(struct st_writer *w)
{
	for (int i = 0; i < w->nmeta; i++) {
		free((char *)w->meta[i].key);
		free((char *)w->meta[i].value);
	}
	free(w->meta);
	free(w->toff);
	free(w->pw_crc);
	free(w->specs);
	free(w->crcs);
	free(w->header);
	free(w);
}

/* Skip finished tensors (and empty ones) so that cur is the one owed bytes, or n. */
static void writer_advance(struct st_writer *w)
{
	while (w->cur < w->n && w->left == 0) {
		w->whole = (uint32_t)crc32_combine64(w->whole, w->crcs[w->cur],
						     (z_off64_t)tensor_nbytes(&w->specs[w->cur]));
		if (++w->cur < w->n)
			w->left = tensor_nbytes(&w->specs[w->cur]);
	}
}

int st_writer_open(struct st_writer **out, const char *path, const struct tensor *const *ts,
		   int n, const struct st_kv *meta, int nmeta)
{
	struct st_writer *w;
	int rc;

	*out = NULL;
	ERR_FORWARD(check_specs(path, ts, n, meta, nmeta, 0));
	w = calloc(1, sizeof *w);
	if (!w)
		return err_set(CORE_ENOMEM, path, "out of memory");
	w->n = n;
	w->specs = calloc((size_t)(n ? n : 1), sizeof *w->specs);
	w->crcs = calloc((size_t)(n ? n : 1), sizeof *w->crcs);
	w->meta = calloc((size_t)(nmeta ? nmeta : 1), sizeof *w->meta);
	if (!w->specs || !w->crcs || !w->meta) {
		writer_free(w);
		return err_set(CORE_ENOMEM, path, "out of memory");
	}
	for (int i = 0; i < nmeta; i++, w->nmeta++) {
		w->meta[i].key = strdup(meta[i].key);
		w->meta[i].value = strdup(meta[i].value);
		if (!w->meta[i].key || !w->meta[i].value) {
			w->nmeta++;
			writer_free(w);
			return err_set(CORE_ENOMEM, path, "out of memory");
		}
	}
	for (int i = 0; i < n; i++) {
		w->specs[i] = *ts[i];
		w->specs[i].data = NULL;
		w->specs[i].owns_data = 0;
		w->crcs[i] = 0u;
	}
	w->whole = 0u;
	rc = afile_open(&w->a, path);
	if (rc) {
		writer_free(w);
		return rc;
	}
	/* The placeholder header: zero crcs, the same length as the final one. */
	rc = writer_header(w, &w->header, &w->hlen);
	unsigned char lenbuf[8];
	for (int i = 0; i < 8; i++)
		lenbuf[i] = (unsigned char)((uint64_t)w->hlen >> (8 * i));
	if (!rc)
		rc = afile_write(&w->a, lenbuf, 8);
	if (!rc)
		rc = afile_write(&w->a, w->header, w->hlen);
	if (rc) {
		afile_abort(&w->a);
		writer_free(w);
		return rc;
	}
	w->toff = calloc((size_t)(n ? n : 1), sizeof *w->toff);
	w->pw_crc = calloc((size_t)(n ? n : 1), 1);
	/* Out-of-order writes go below stdio with pwrite(2): nothing may stay buffered. */
	if (!w->toff || !w->pw_crc || fflush(w->a.fp) != 0) {
		rc = w->toff && w->pw_crc ? err_errno(CORE_EIO, path, "cannot write", errno)
					  : err_set(CORE_ENOMEM, path, "out of memory");
		afile_abort(&w->a);
		writer_free(w);
		return rc;
	}
	uint64_t at = 8 + w->hlen;
	for (int i = 0; i < n; i++) {
		w->toff[i] = at;
		at += tensor_nbytes(&w->specs[i]);
	}
	w->left = n ? tensor_nbytes(&w->specs[0]) : 0;
	writer_advance(w);
	*out = w;
	return 0;
}

int st_writer_pwrite(struct st_writer *w, int i, uint64_t off, const void *data, size_t nbytes)
{
	const unsigned char *p = data;

	if (w->mode == 1 || i < 0 || i >= w->n || off > tensor_nbytes(&w->specs[i]) ||
	    nbytes > tensor_nbytes(&w->specs[i]) - off)
		return err_set(CORE_EUSAGE, w->a.path, "out-of-order write outside tensor %d or "
			       "after writes in order", i);
	uint64_t at = w->toff[i] + off;
	size_t left = nbytes;
	while (left > 0) {
		ssize_t k = pwrite(fileno(w->a.fp), p, left, (off_t)at);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			__atomic_store_n(&w->pw_failed, 1, __ATOMIC_RELAXED);
			return err_errno(CORE_EIO, w->a.path, "cannot write", k < 0 ? errno : EIO);
		}
		p += k;
		at += (uint64_t)k;
		left -= (size_t)k;
	}
	__atomic_fetch_add(&w->pw_bytes, (uint64_t)nbytes, __ATOMIC_RELAXED);
	return 0;
}

void st_writer_set_crc(struct st_writer *w, int i, uint32_t crc)
{
	if (i >= 0 && i < w->n) {
		w->mode = 2;
		w->crcs[i] = crc;
		w->pw_crc[i] = 1;
	}
}

int st_writer_put(struct st_writer *w, const void *data, size_t nbytes)
{
	const unsigned char *p = data;

	if (w->mode == 2 || w->pw_bytes)
		return err_set(CORE_EUSAGE, w->a.path, "a write in order after writes out of order");
	w->mode = 1;
	while (nbytes > 0) {
		if (w->cur >= w->n)
			return err_set(CORE_EUSAGE, w->a.path, "more data than the tensors hold");
		size_t k = nbytes < w->left ? nbytes : (size_t)w->left;
		ERR_FORWARD(afile_write(&w->a, p, k));
		w->crcs[w->cur] = crc32_update(w->crcs[w->cur], p, k);
		w->left -= k;
		p += k;
		nbytes -= k;
		writer_advance(w);
	}
	return 0;
}

int st_writer_commit(struct st_writer *w)
{
	char *header = NULL;
	size_t hlen = 0;
	int rc = 0;

	if (w->mode == 2 || w->pw_bytes) {
		/* Out of order: every tensor's crc given and every byte written once. */
		uint64_t total = 0;
		w->whole = 0;
		for (int i = 0; i < w->n && !rc; i++) {
			uint64_t nb = tensor_nbytes(&w->specs[i]);
			if (!w->pw_crc[i] && nb > 0)
				rc = err_set(CORE_EUSAGE, w->a.path, "tensor '%s' has no crc",
					     w->specs[i].name);
			w->whole = (uint32_t)crc32_combine64(w->whole, w->crcs[i], (z_off64_t)nb);
			total += nb;
		}
		if (!rc && __atomic_load_n(&w->pw_failed, __ATOMIC_RELAXED))
			rc = err_set(CORE_EIO, w->a.path, "not replaced: an earlier write failed");
		if (!rc && __atomic_load_n(&w->pw_bytes, __ATOMIC_RELAXED) != total)
			rc = err_set(CORE_EUSAGE, w->a.path, "%llu of the %llu data bytes written",
				     (unsigned long long)w->pw_bytes, (unsigned long long)total);
	} else if (w->cur < w->n) {
		rc = err_set(CORE_EUSAGE, w->a.path, "tensor '%s' is missing %llu bytes",
			     w->specs[w->cur].name, (unsigned long long)w->left);
	}
	if (!rc)
		rc = writer_header(w, &header, &hlen);
	if (!rc && hlen != w->hlen)
		rc = err_set(CORE_EUSAGE, w->a.path, "header changed length");
	if (!rc)
		rc = afile_pwrite(&w->a, header, hlen, 8);
	if (!rc)
		rc = afile_commit(&w->a);
	else
		afile_abort(&w->a);
	free(header);
	writer_free(w);
	return rc;
}

void st_writer_abort(struct st_writer *w)
{
	if (!w)
		return;
	afile_abort(&w->a);
	writer_free(w);
}

int st_write(const char *path, const struct tensor *const *ts, int n, const struct st_kv *meta,
	     int nmeta)
{
	struct st_writer *w;

	ERR_FORWARD(check_specs(path, ts, n, meta, nmeta, 1));
	ERR_FORWARD(st_writer_open(&w, path, ts, n, meta, nmeta));
	for (int i = 0; i < n; i++) {
		int rc = st_writer_put(w, ts[i]->data, tensor_nbytes(ts[i]));
		if (rc) {
			st_writer_abort(w);
			return rc;
		}
	}
	return st_writer_commit(w);
}

/* ---- reading ------------------------------------------------------------------------------ */

void st_close(struct st_file *f)
{
	if (f->fp)
		fclose(f->fp);
	for (int i = 0; i < f->nmeta; i++) {
		free(f->meta_keys[i]);
		free(f->meta_values[i]);
	}
	free(f->meta_keys);
	free(f->meta_values);
	free(f->entries);
	free(f->path);
	memset(f, 0, sizeof *f);
}

const struct st_entry *st_find(const struct st_file *f, const char *name)
{
	for (int i = 0; i < f->n; i++)
		if (strcmp(f->entries[i].name, name) == 0)
			return &f->entries[i];
	return NULL;
}

const char *st_meta(const struct st_file *f, const char *key)
{
	for (int i = 0; i < f->nmeta; i++)
		if (strcmp(f->meta_keys[i], key) == 0)
			return f->meta_values[i];
	return NULL;
}

int st_meta_long(const struct st_file *f, const char *key, long lo, long hi, long *out)
{
	const char *s = st_meta(f, key);
	char *end;

	if (!s)
		return err_set(CORE_EFORMAT, f->path, "metadata key '%s' missing", key);
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return err_set(CORE_EFORMAT, f->path, "metadata '%s' = '%s' is not valid", key, s);
	*out = v;
	return 0;
}

/* A JSON integer in [0, 2^63). */
static int get_uint(const json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return -1;
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

static int parse_entry(const char *path, const char *name, const json_t *v, struct st_entry *e)
{
	const json_t *dt, *shape, *offs;
	uint64_t numel = 1, nbytes;

	memset(e, 0, sizeof *e);
	if (strlen(name) >= TENSOR_NAME_MAX)
		return err_set(CORE_EFORMAT, path, "tensor name '%.40s...' longer than %d bytes",
			       name, TENSOR_NAME_MAX - 1);
	memcpy(e->name, name, strlen(name) + 1);
	if (!json_is_object(v))
		return err_set(CORE_EFORMAT, path, "header entry '%s' is not an object", name);
	dt = json_object_get(v, "dtype");
	shape = json_object_get(v, "shape");
	offs = json_object_get(v, "data_offsets");
	if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs))
		return err_set(CORE_EFORMAT, path,
			       "tensor '%s' lacks dtype, shape or data_offsets", name);
	int type = dtype_from_name(json_string_value(dt));
	if (type < 0)
		return err_set(CORE_EFORMAT, path, "tensor '%s' has unknown dtype '%.20s'", name,
			       json_string_value(dt));
	e->type = (enum dtype)type;
	if (json_array_size(shape) > TENSOR_MAX_DIMS)
		return err_set(CORE_EFORMAT, path, "tensor '%s' has %zu dimensions, at most %d",
			       name, json_array_size(shape), TENSOR_MAX_DIMS);
	e->ndim = (int)json_array_size(shape);
	int64_t nonzero = 1; /* product of the sizes other than 0: every tensor_numel on the
			      * way to a shape must fit int64 too, whatever a 0 makes of the total */
	for (int d = 0; d < e->ndim; d++) {
		uint64_t s;
		if (get_uint(json_array_get(shape, (size_t)d), &s) < 0)
			return err_set(CORE_EFORMAT, path,
				       "tensor '%s': shape is not a list of sizes", name);
		if (__builtin_mul_overflow(numel, s, &numel) || s > (uint64_t)INT64_MAX ||
		    (s && __builtin_mul_overflow(nonzero, (int64_t)s, &nonzero)))
			return err_set(CORE_EFORMAT, path, "tensor '%s': shape too large", name);
		e->ne[d] = (int64_t)s;
	}
	if (__builtin_mul_overflow(numel, (uint64_t)dtype_size(e->type), &nbytes))
		return err_set(CORE_EFORMAT, path, "tensor '%s': shape too large", name);
	if (json_array_size(offs) != 2 || get_uint(json_array_get(offs, 0), &e->begin) < 0 ||
	    get_uint(json_array_get(offs, 1), &e->end) < 0 || e->end < e->begin)
		return err_set(CORE_EFORMAT, path, "tensor '%s': bad data_offsets", name);
	if (e->end - e->begin != nbytes) {
		char sh[96];
		shape_str(sh, sizeof sh, e->ndim, e->ne);
		return err_set(CORE_EFORMAT, path,
			       "tensor '%s': %s %s needs %llu bytes, data_offsets give %llu", name,
			       dtype_name(e->type), sh, (unsigned long long)nbytes,
			       (unsigned long long)(e->end - e->begin));
	}
	return 0;
}

static int cmp_range(const void *a, const void *b)
{
	const struct st_entry *x = *(const struct st_entry *const *)a;
	const struct st_entry *y = *(const struct st_entry *const *)b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	return (x->end > y->end) - (x->end < y->end);
}

/* The ranges must tile [0, data_size): sorted by begin, each starts where the last ended. */
static int check_coverage(struct st_file *f, const char *path)
{
	const struct st_entry **by = NULL;
	uint64_t pos = 0;
	int rc = 0;

	if (f->n > 0) {
		by = malloc(sizeof *by * (size_t)f->n);
		if (!by)
			return err_set(CORE_ENOMEM, path, "cannot allocate");
		for (int i = 0; i < f->n; i++)
			by[i] = &f->entries[i];
		qsort(by, (size_t)f->n, sizeof *by, cmp_range);
	}
	for (int i = 0; i < f->n; i++) {
		const struct st_entry *e = by[i];
		if (e->begin < pos) {
			rc = err_set(CORE_EFORMAT, path, "tensors '%s' and '%s' overlap",
				     by[i - 1]->name, e->name);
			goto out;
		}
		if (e->begin > pos) {
			rc = err_set(CORE_EFORMAT, path, "gap of %llu bytes before tensor '%s'",
				     (unsigned long long)(e->begin - pos), e->name);
			goto out;
		}
		pos = e->end;
	}
	if (pos > f->data_size)
		rc = err_set(CORE_ETRUNC, path, "truncated file: data section has %llu bytes, "
			     "header needs %llu",
			     (unsigned long long)f->data_size, (unsigned long long)pos);
	else if (pos < f->data_size)
		rc = err_set(CORE_EFORMAT, path, "%llu bytes after the last tensor",
			     (unsigned long long)(f->data_size - pos));
out:
	free(by);
	return rc;
}

static int parse_metadata(struct st_file *f, const char *path, const json_t *md)
{
	const char *k;
	json_t *v;

	if (!json_is_object(md))
		return err_set(CORE_EFORMAT, path, "__metadata__ is not an object");
	size_t n = json_object_size(md);
	f->meta_keys = calloc(n ? n : 1, sizeof *f->meta_keys);
	f->meta_values = calloc(n ? n : 1, sizeof *f->meta_values);
	if (!f->meta_keys || !f->meta_values)
		return err_set(CORE_ENOMEM, path, "cannot allocate metadata");
	json_object_foreach((json_t *)md, k, v) {
		if (!json_is_string(v))
			return err_set(CORE_EFORMAT, path, "metadata '%s' is not a string", k);
		f->meta_keys[f->nmeta] = strdup(k);
		f->meta_values[f->nmeta] = strdup(json_string_value(v));
		f->nmeta++;
		if (!f->meta_keys[f->nmeta - 1] || !f->meta_values[f->nmeta - 1])
			return err_set(CORE_ENOMEM, path, "cannot allocate metadata");
		if (strncmp(k, "crc32.", 6) == 0) {
			struct st_entry *e = (struct st_entry *)st_find(f, k + 6);
			if (!e)
				return err_set(CORE_EFORMAT, path, "'%s' names no tensor", k);
			if (parse_hex32(json_string_value(v), &e->crc) < 0)
				return err_set(CORE_EFORMAT, path, "'%s' is not 8 hex digits", k);
			e->has_crc = 1;
		} else if (strcmp(k, "crc32") == 0) {
			uint32_t c;
			if (parse_hex32(json_string_value(v), &c) < 0)
				return err_set(CORE_EFORMAT, path, "'crc32' is not 8 hex digits");
		}
	}
	return 0;
}

static int read_at(struct st_file *f, void *buf, size_t n, uint64_t off)
{
	if (fseeko(f->fp, (off_t)off, SEEK_SET) != 0)
		return err_errno(CORE_EIO, f->path, "cannot seek", errno);
	if (fread(buf, 1, n, f->fp) != n) {
		if (ferror(f->fp))
			return err_errno(CORE_EIO, f->path, "cannot read", errno);
		return err_set(CORE_ETRUNC, f->path, "truncated file: it ends before byte %llu",
			       (unsigned long long)(off + n));
	}
	return 0;
}

/* Stream the data section once, computing each tensor's crc32 (entries tile the section, so
 * visiting them in offset order reads every byte exactly once) and the whole-section crc32. */
static int verify_data(struct st_file *f)
{
	const char *want = st_meta(f, "crc32");
	const struct st_entry **by = NULL;
	unsigned char *buf = NULL;
	uint32_t whole = 0u, expect = 0;
	const char *bad = NULL;
	int any = want != NULL, rc = 0;

	for (int i = 0; i < f->n; i++)
		any |= f->entries[i].has_crc;
	if (!any)
		return 0; /* not our file: the structure was all there was to check */
	by = malloc(sizeof *by * (size_t)(f->n ? f->n : 1));
	buf = malloc(ST_CHUNK);
	if (!by || !buf) {
		rc = err_set(CORE_ENOMEM, f->path, "cannot allocate");
		goto out;
	}
	for (int i = 0; i < f->n; i++)
		by[i] = &f->entries[i];
	qsort(by, (size_t)f->n, sizeof *by, cmp_range);
	if (fseeko(f->fp, (off_t)f->data_offset, SEEK_SET) != 0) {
		rc = err_errno(CORE_EIO, f->path, "cannot seek", errno);
		goto out;
	}
	for (int i = 0; i < f->n; i++) {
		const struct st_entry *e = by[i];
		uint64_t left = e->end - e->begin;
		uint32_t c = 0u;
		while (left > 0) {
			size_t k = left < ST_CHUNK ? (size_t)left : ST_CHUNK;
			if (fread(buf, 1, k, f->fp) != k) {
				if (ferror(f->fp))
					rc = err_errno(CORE_EIO, f->path, "cannot read", errno);
				else
					rc = err_set(CORE_ETRUNC, f->path,
						     "truncated file: it ends inside tensor '%s'",
						     e->name);
				goto out;
			}
			c = crc32_update(c, buf, k);
			left -= k;
		}
		whole = (uint32_t)crc32_combine64(whole, c, (z_off64_t)(e->end - e->begin));
		if (e->has_crc && c != e->crc && !bad)
			bad = e->name;
	}
	if (want) {
		parse_hex32(want, &expect); /* format checked by parse_metadata */
		if (whole != expect) {
			rc = err_set(CORE_ECHECKSUM, f->path,
				     "checksum mismatch: data crc32 %08x, header says %s%s%s%s",
				     whole, want, bad ? " (tensor '" : "", bad ? bad : "",
				     bad ? "')" : "");
			goto out;
		}
	}
	if (bad)
		rc = err_set(CORE_ECHECKSUM, f->path, "checksum mismatch in tensor '%s'", bad);
out:
	free(by);
	free(buf);
	return rc;
}

/* The 8-byte length and the header bytes after it (malloc'd into *header, *hlen long), with
 * the length checked against the file size; sets the data section's offset and size. */
static int read_header(struct st_file *f, uint64_t fsize, char **header, uint64_t *hlen)
{
	unsigned char lenbuf[8];
	uint64_t n = 0;

	if (fsize < 8)
		return err_set(CORE_ETRUNC, f->path, "truncated file: %llu bytes, less than the "
			       "8-byte header length", (unsigned long long)fsize);
	ERR_FORWARD(read_at(f, lenbuf, 8, 0));
	for (int i = 0; i < 8; i++)
		n |= (uint64_t)lenbuf[i] << (8 * i);
	if (memcmp(lenbuf, "DPCTOKS", 8) == 0)
		return err_set(CORE_EFORMAT, f->path, "not a safetensors file: a token file "
			       "(dpc-tokens(5))");
	if (n < 2 || n > ST_HEADER_MAX)
		return err_set(CORE_EFORMAT, f->path, "not a safetensors file (its first 8 bytes "
			       "give a header length of %llu)", (unsigned long long)n);
	if (n > fsize - 8)
		return err_set(CORE_ETRUNC, f->path, "truncated file: header length %llu exceeds "
			       "file size %llu", (unsigned long long)n, (unsigned long long)fsize);
	f->data_offset = 8 + n;
	f->data_size = fsize - f->data_offset;
	*header = malloc((size_t)n);
	if (!*header)
		return err_set(CORE_ENOMEM, f->path, "cannot allocate header");
	*hlen = n;
	return read_at(f, *header, (size_t)n, 8);
}

/* The header's JSON: the tensor entries (their byte ranges covering the data section
 * exactly) and the metadata. */
static int parse_header(struct st_file *f, const char *header, uint64_t hlen)
{
	json_error_t jerr;
	json_t *root = json_loadb(header, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
	int rc = 0;

	if (!root)
		return err_set(CORE_EFORMAT, f->path, "bad json in header at byte %d: %s",
			       jerr.position, jerr.text);
	if (!json_is_object(root)) {
		rc = err_set(CORE_EFORMAT, f->path, "header is not a json object");
		goto out;
	}
	size_t n = json_object_size(root);
	f->entries = calloc(n ? n : 1, sizeof *f->entries);
	if (!f->entries) {
		rc = err_set(CORE_ENOMEM, f->path, "cannot allocate");
		goto out;
	}
	const char *k;
	json_t *v;
	json_object_foreach(root, k, v) {
		if (strcmp(k, "__metadata__") == 0)
			continue;
		rc = parse_entry(f->path, k, v, &f->entries[f->n]);
		if (rc < 0)
			goto out;
		f->n++;
	}
	/* Names are unique: JSON_REJECT_DUPLICATES refused repeated keys. */
	rc = check_coverage(f, f->path);
	json_t *md = json_object_get(root, "__metadata__");
	if (rc == 0 && md)
		rc = parse_metadata(f, f->path, md);
out:
	json_decref(root);
	return rc;
}

int st_open(struct st_file *f, const char *path, int verify)
{
	char *header = NULL;
	struct stat st;
	uint64_t hlen = 0;
	int fd, rc = 0;

	memset(f, 0, sizeof *f);
	f->path = strdup(path);
	if (!f->path)
		return err_set(CORE_ENOMEM, path, "cannot allocate");
	/* A checkpoint must be a regular file: a FIFO is refused, not waited on. */
	rc = file_open_regular(path, &fd, &st);
	if (rc < 0)
		goto fail;
	f->fp = fdopen(fd, "rb");
	if (!f->fp) {
		rc = err_errno(CORE_EIO, path, "cannot open", errno);
		close(fd);
		goto fail;
	}
	rc = read_header(f, (uint64_t)st.st_size, &header, &hlen);
	if (rc == 0)
		rc = parse_header(f, header, hlen);
	if (rc == 0 && verify)
		rc = verify_data(f);
	if (rc < 0)
		goto fail;
	free(header);
	return 0;
fail:
	free(header);
	st_close(f);
	return rc;
}

int st_lookup(const struct st_file *f, const char *name, enum dtype type, int ndim,
	      const int64_t *ne, const struct st_entry **out)
{
	const struct st_entry *e = st_find(f, name);

	if (!e)
		return err_set(CORE_ENOTFOUND, f->path, "no tensor '%s'", name);
	int same = type == e->type && ndim == e->ndim;
	for (int d = 0; same && d < e->ndim; d++)
		same = ne[d] == e->ne[d];
	if (!same) {
		char have[96], want[96];
		shape_str(have, sizeof have, e->ndim, e->ne);
		shape_str(want, sizeof want, ndim, ne);
		if (type == e->type)
			return err_set(CORE_ESHAPE, f->path,
				       "tensor '%s' has shape %s, expected %s", name, have, want);
		return err_set(CORE_ESHAPE, f->path, "tensor '%s' is %s %s, expected %s %s", name,
			       dtype_name(e->type), have, dtype_name(type), want);
	}
	*out = e;
	return 0;
}

int st_read_raw(struct st_file *f, const struct st_entry *e, uint64_t off, void *dst, size_t n)
{
	unsigned char *p = dst;
	uint64_t at = f->data_offset + e->begin + off;

	if (off > e->end - e->begin || n > e->end - e->begin - off)
		return err_set(CORE_EUSAGE, f->path, "read past the end of tensor '%s'", e->name);
	while (n > 0) {
		ssize_t k = pread(fileno(f->fp), p, n, (off_t)at);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return err_errno(CORE_EIO, f->path, "cannot read", errno);
		if (k == 0)
			return err_set(CORE_ETRUNC, f->path, "truncated file: it ends before byte "
				       "%llu", (unsigned long long)(at + n));
		p += k;
		at += (uint64_t)k;
		n -= (size_t)k;
	}
	return 0;
}

int st_read(struct st_file *f, const char *name, struct tensor *dst)
{
	const struct st_entry *e;

	ERR_FORWARD(st_lookup(f, name, dst->type, dst->ndim, dst->ne, &e));
	if (dst->be || !tensor_is_contiguous(dst) || (!dst->data && e->end > e->begin))
		return err_set(CORE_EUSAGE, f->path, "tensor '%s': destination is not a "
			       "contiguous host tensor", name);
	size_t nb = (size_t)(e->end - e->begin);
	if (nb == 0)
		return 0;
	ERR_FORWARD(read_at(f, dst->data, nb, f->data_offset + e->begin));
	if (e->has_crc && (uint32_t)crc32_update(0, dst->data, nb) != e->crc)
		return err_set(CORE_ECHECKSUM, f->path, "checksum mismatch in tensor '%s'", name);
	return 0;
}
