/* test_safetensors.c - checkpoints: round trip against the data written, files written by
 * hand byte by byte (as another tool would), and every corruption a reader must refuse.
 *
 * The references are independent of lib/safetensors.c: the written file is re-parsed here with
 * jansson and checked byte by byte against memory, crc32 values come from zlib directly or are
 * hard-coded (computed with Python's zlib), and hand-made files are laid out in this file. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>
#include <zlib.h>

#include "common/err.h"
#include "common/rng.h"
#include "io/safetensors.h"
#include "common/tensor.h"
#include "testutil.h"
#include "common/banned.h"

/* ---- scratch directory -------------------------------------------------------------------- */

static char dir[256];

static void setup(void)
{
	tu_mkdtemp(dir, sizeof dir, "safetensors");
}

static void teardown(void)
{
	tu_rm_tree(dir);
}

TestSuite(safetensors, .init = setup, .fini = teardown, .timeout = 20);

static void path_in(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", dir, name); }

/* Number of directory entries other than . and .. (temporary files left behind show here). */
static int count_files(const char *d)
{
	DIR *dd = opendir(d);
	struct dirent *e;
	int n = 0;

	cr_assert(dd, "opendir '%s'", d);
	while ((e = readdir(dd)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			n++;
	closedir(dd);
	return n;
}

static void spit(const char *path, const void *b, size_t n)
{
	FILE *fp = fopen(path, "wb");
	cr_assert(fp, "cannot create '%s'", path);
	cr_assert(fwrite(b, 1, n, fp) == n);
	cr_assert(fclose(fp) == 0);
}

/* A file made of an 8-byte length, the given header text (not padded), and data bytes. */
static void write_raw(const char *path, const char *header, const void *data, size_t ndata)
{
	size_t h = strlen(header);
	unsigned char *b = malloc(8 + h + ndata + 1);
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)((uint64_t)h >> (8 * i));
	memcpy(b + 8, header, h);
	if (ndata)
		memcpy(b + 8 + h, data, ndata);
	spit(path, b, 8 + h + ndata);
	free(b);
}

static uint32_t zcrc(const void *p, size_t n) { return (uint32_t)crc32(0L, p, (uInt)n); }

/* ---- round trip --------------------------------------------------------------------------- */

#define NT 9

struct spec {
	const char *name;
	enum dtype type;
	int ndim;
	int64_t ne[4];
};

static const struct spec specs[NT] = {
	{"wte.weight", DT_F32, 2, {7, 5}},
	{"h.0.ln_1.bias", DT_F32, 1, {5}},
	{"scalar", DT_F32, 0, {0}},
	{"half", DT_F16, 3, {2, 3, 3}},
	{"brain", DT_BF16, 4, {2, 1, 3, 2}},
	{"ints", DT_I32, 2, {3, 1}},
	{"longs", DT_I64, 1, {4}},
	{"tokens", DT_U16, 1, {11}},
	{"bytes", DT_U8, 1, {13}},
};

/* Fill with distinct bytes from Philox so that a misplaced or swapped byte is visible. */
static void fill_bytes(struct tensor *t, uint64_t salt)
{
	unsigned char *p = t->data;
	for (size_t i = 0; i < tensor_nbytes(t); i++)
		p[i] = (unsigned char)rng_u64(salt, RNG_STREAM_TEST, i);
}

static void make_set(struct tensor *ts)
{
	for (int i = 0; i < NT; i++) {
		cr_assert(tensor_alloc(&ts[i], specs[i].type, specs[i].ndim, specs[i].ne,
				       specs[i].name) == 0);
		fill_bytes(&ts[i], 1000 + (uint64_t)i);
	}
	/* Exact float values for the element-wise comparison of the first tensor. */
	float *w = ts[0].data;
	for (int i = 0; i < 35; i++)
		w[i] = (float)(i - 17) * 0.125f;
}

static void free_set(struct tensor *ts)
{
	for (int i = 0; i < NT; i++)
		tensor_free(&ts[i]);
}

static void write_set(const char *path, struct tensor *ts)
{
	const struct tensor *ptr[NT];
	const struct st_kv meta[] = {{"format", "dpc-checkpoint"}, {"kind", "path"},
				     {"step", "42"}, {"note", "quote \" and \\ and caf\xc3\xa9"}};
	for (int i = 0; i < NT; i++)
		ptr[i] = &ts[i];
	int rc = st_write(path, ptr, NT, meta, 4);
	cr_assert(rc == 0, "st_write: %d %s", rc, err_detail());
}

Test(safetensors, round_trip_element_by_element)
{
	struct tensor ts[NT], back;
	struct st_file f;
	char path[320];

	path_in(path, sizeof path, "rt.safetensors");
	make_set(ts);
	write_set(path, ts);
	cr_assert_eq(count_files(dir), 1, "temporary file left behind");

	int rc = st_open(&f, path, 1);
	cr_assert(rc == 0, "st_open: %d %s", rc, err_detail());
	cr_assert_eq(f.n, NT);
	cr_assert_str_eq(st_meta(&f, "format"), "dpc-checkpoint");
	cr_assert_str_eq(st_meta(&f, "step"), "42");
	cr_assert_str_eq(st_meta(&f, "note"), "quote \" and \\ and caf\xc3\xa9");
	cr_assert_null(st_meta(&f, "absent"));
	for (int i = 0; i < NT; i++) {
		const struct st_entry *e = st_find(&f, specs[i].name);
		cr_assert(e, "tensor '%s' missing", specs[i].name);
		cr_assert_eq(e->type, specs[i].type, "'%s' dtype", specs[i].name);
		cr_assert_eq(e->ndim, specs[i].ndim, "'%s' ndim", specs[i].name);
		for (int d = 0; d < e->ndim; d++)
			cr_assert_eq(e->ne[d], specs[i].ne[d], "'%s' dim %d", specs[i].name, d);
		cr_assert(e->has_crc, "'%s' has no crc", specs[i].name);

		cr_assert(tensor_alloc(&back, specs[i].type, specs[i].ndim, specs[i].ne, NULL) ==
			  0);
		memset(back.data, 0xAB, tensor_nbytes(&back));
		rc = st_read(&f, specs[i].name, &back);
		cr_assert(rc == 0, "st_read '%s': %d %s", specs[i].name, rc, err_detail());
		/* Element by element in the tensor's own element size. */
		size_t es = dtype_size(specs[i].type), ne = (size_t)tensor_numel(&back);
		for (size_t k = 0; k < ne; k++) {
			const char *got = (char *)back.data + k * es;
			const char *want = (char *)ts[i].data + k * es;
			cr_assert(memcmp(got, want, es) == 0,
				  "tensor '%s' (%s) element %zu differs", specs[i].name,
				  dtype_name(specs[i].type), k);
		}
		tensor_free(&back);
	}
	/* And as numbers: the values written by make_set(), computed again here. */
	cr_assert(tensor_alloc(&back, DT_F32, 2, specs[0].ne, NULL) == 0);
	cr_assert(st_read(&f, "wte.weight", &back) == 0);
	const float *bv = back.data;
	for (int k = 0; k < 35; k++)
		cr_assert(bv[k] == (float)(k - 17) * 0.125f, "wte.weight[%d] = %g, expected %g", k,
			  (double)bv[k], (double)((float)(k - 17) * 0.125f));
	tensor_free(&back);
	cr_assert_eq(st_read(&f, "nope", &back), CORE_ENOTFOUND);
	st_close(&f);
	free_set(ts);
}

/* Parse the written bytes here, with jansson, independently of st_open. */
Test(safetensors, written_bytes_follow_the_format)
{
	struct tensor ts[NT];
	char path[320];
	size_t len;

	path_in(path, sizeof path, "fmt.safetensors");
	make_set(ts);
	write_set(path, ts);
	unsigned char *b = tu_slurp(path, &len);
	uint64_t h = 0;
	for (int i = 0; i < 8; i++)
		h |= (uint64_t)b[i] << (8 * i);
	cr_assert_eq(h % 8, 0, "header length %llu not a multiple of 8", (unsigned long long)h);
	cr_assert(8 + h <= len);
	json_error_t je;
	json_t *root = json_loadb((char *)b + 8, h, 0, &je);
	cr_assert(root, "header is not json: %s", je.text);
	/* The padding is spaces only, after the closing brace. */
	size_t last = 8 + h;
	while (b[last - 1] == ' ')
		last--;
	cr_assert_eq(b[last - 1], '}');
	cr_assert(8 + h - last < 8, "more padding than needed");

	const unsigned char *data = b + 8 + h;
	size_t dsize = len - 8 - h, total = 0;
	json_t *md = json_object_get(root, "__metadata__");
	cr_assert(json_is_object(md));
	char hex[16];
	snprintf(hex, sizeof hex, "%08x", zcrc(data, dsize));
	cr_assert_str_eq(json_string_value(json_object_get(md, "crc32")), hex);
	cr_assert_str_eq(json_string_value(json_object_get(md, "kind")), "path");
	uint64_t expect_begin = 0;
	for (int i = 0; i < NT; i++) {
		json_t *e = json_object_get(root, specs[i].name);
		cr_assert(json_is_object(e), "'%s' absent", specs[i].name);
		cr_assert_str_eq(json_string_value(json_object_get(e, "dtype")),
				 dtype_name(specs[i].type));
		json_t *shape = json_object_get(e, "shape");
		cr_assert_eq(json_array_size(shape), (size_t)specs[i].ndim);
		for (int d = 0; d < specs[i].ndim; d++)
			cr_assert_eq(json_integer_value(json_array_get(shape, (size_t)d)),
				     specs[i].ne[d]);
		json_t *off = json_object_get(e, "data_offsets");
		uint64_t beg = (uint64_t)json_integer_value(json_array_get(off, 0));
		uint64_t end = (uint64_t)json_integer_value(json_array_get(off, 1));
		/* Written in the order given, back to back. */
		cr_assert_eq(beg, expect_begin, "'%s' begins at %llu", specs[i].name,
			     (unsigned long long)beg);
		cr_assert_eq(end - beg, tensor_nbytes(&ts[i]));
		cr_assert(memcmp(data + beg, ts[i].data, end - beg) == 0, "'%s' bytes differ",
			  specs[i].name);
		char key[160];
		snprintf(key, sizeof key, "crc32.%s", specs[i].name);
		snprintf(hex, sizeof hex, "%08x", zcrc(ts[i].data, end - beg));
		cr_assert_str_eq(json_string_value(json_object_get(md, key)), hex, "%s", key);
		expect_begin = end;
		total += end - beg;
	}
	cr_assert_eq(total, dsize);
	json_decref(root);
	free(b);
	free_set(ts);
}

/* ---- files written by hand ---------------------------------------------------------------- */

/* As another tool (Hugging Face, a Python script) would write it: no crc keys, metadata first,
 * header padded with spaces. a = F32 [1.5, -2.0], b = U8 [1, 2, 3]. */
static const unsigned char hand_data[11] = {0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00,
					    0x00, 0xc0, 1,    2,    3};
#define HAND_HEADER                                                                        \
	"{\"__metadata__\":{\"format\":\"pt\"},"                                               \
	"\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"                      \
	"\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}}"

Test(safetensors, reads_a_file_written_by_hand)
{
	/* 138 bytes of JSON + 6 spaces = 144: a multiple of 8, as the reference pads it. */
	const char *header = HAND_HEADER "      ";
	cr_assert_eq(strlen(header), 144, "hand-computed length is wrong");
	unsigned char file[8 + 144 + 11] = {144, 0, 0, 0, 0, 0, 0, 0};
	memcpy(file + 8, header, 144);
	memcpy(file + 152, hand_data, 11);
	char path[320];
	path_in(path, sizeof path, "hand.safetensors");
	spit(path, file, sizeof file);

	struct st_file f;
	int rc = st_open(&f, path, 1);
	cr_assert(rc == 0, "st_open: %d %s", rc, err_detail());
	cr_assert_eq(f.n, 2);
	cr_assert_eq(f.data_offset, 152);
	cr_assert_eq(f.data_size, 11);
	cr_assert_str_eq(st_meta(&f, "format"), "pt");
	cr_assert_null(st_meta(&f, "crc32"));
	const struct st_entry *e = st_find(&f, "b");
	cr_assert(e && e->begin == 8 && e->end == 11 && !e->has_crc && e->type == DT_U8);

	float av[2];
	unsigned char bv[3];
	struct tensor a, b;
	tensor_view(&a, DT_F32, 1, (int64_t[]){2}, av, NULL);
	tensor_view(&b, DT_U8, 1, (int64_t[]){3}, bv, NULL);
	cr_assert(st_read(&f, "a", &a) == 0, "%s", err_detail());
	cr_assert(st_read(&f, "b", &b) == 0, "%s", err_detail());
	cr_assert(av[0] == 1.5f && av[1] == -2.0f, "a = [%g, %g]", (double)av[0], (double)av[1]);
	cr_assert(bv[0] == 1 && bv[1] == 2 && bv[2] == 3);
	st_close(&f);
}

/* Same bytes with our crc keys; the values were computed with Python's zlib.crc32. */
Test(safetensors, hand_written_crc_keys_are_checked)
{
	const char *good = "{\"__metadata__\":{\"crc32\":\"531d447c\",\"crc32.a\":\"%s\"},"
			   "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
			   "\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}}";
	char header[512], path[320];
	char hexa[9];
	struct st_file f;

	snprintf(hexa, sizeof hexa, "%08x", zcrc(hand_data, 8));
	snprintf(header, sizeof header, good, hexa);
	path_in(path, sizeof path, "crc.safetensors");
	write_raw(path, header, hand_data, 11);
	int rc = st_open(&f, path, 1);
	cr_assert(rc == 0, "st_open: %d %s", rc, err_detail());
	cr_assert(st_find(&f, "a")->has_crc && st_find(&f, "a")->crc == zcrc(hand_data, 8));
	st_close(&f);

	/* A wrong whole-data crc is a checksum mismatch, but only when verifying. */
	snprintf(header, sizeof header, good, hexa);
	memcpy(strstr(header, "531d447c"), "531d447d", 8);
	write_raw(path, header, hand_data, 11);
	cr_assert_eq(st_open(&f, path, 0), 0);
	st_close(&f);
	cr_assert_eq(st_open(&f, path, 1), CORE_ECHECKSUM);
	cr_assert(strstr(err_detail(), "checksum mismatch"), "detail '%s'", err_detail());

	/* A crc that is not 8 hex digits, or names no tensor, is a malformed header. */
	snprintf(header, sizeof header, good, "12345");
	write_raw(path, header, hand_data, 11);
	cr_assert_eq(st_open(&f, path, 0), CORE_EFORMAT);
	snprintf(header, sizeof header, good, hexa);
	memcpy(strstr(header, "crc32.a"), "crc32.z", 7);
	write_raw(path, header, hand_data, 11);
	cr_assert_eq(st_open(&f, path, 0), CORE_EFORMAT);
	cr_assert(strstr(err_detail(), "crc32.z"), "detail '%s'", err_detail());
}

/* ---- corruption --------------------------------------------------------------------------- */

/* A small file of ours: three tensors, returned as bytes. */
static unsigned char *small_file(const char *path, size_t *len, uint64_t *hlen)
{
	struct tensor t[3];
	const struct tensor *p[3] = {&t[0], &t[1], &t[2]};
	cr_assert(tensor_alloc(&t[0], DT_F32, 2, (int64_t[]){4, 4}, "first") == 0);
	cr_assert(tensor_alloc(&t[1], DT_F32, 1, (int64_t[]){16}, "middle") == 0);
	cr_assert(tensor_alloc(&t[2], DT_U16, 1, (int64_t[]){5}, "last") == 0);
	for (int i = 0; i < 3; i++)
		fill_bytes(&t[i], 7 + (uint64_t)i);
	cr_assert(st_write(path, p, 3, NULL, 0) == 0, "%s", err_detail());
	for (int i = 0; i < 3; i++)
		tensor_free(&t[i]);
	unsigned char *b = tu_slurp(path, len);
	*hlen = 0;
	for (int i = 0; i < 8; i++)
		*hlen |= (uint64_t)b[i] << (8 * i);
	return b;
}

static void expect_open(const char *path, int verify, int code, const char *needle,
			const char *what)
{
	struct st_file f;
	int rc = st_open(&f, path, verify);
	if (rc == 0)
		st_close(&f);
	cr_assert_eq(rc, code, "%s: st_open(verify=%d) returned %d (%s), expected %d", what,
		     verify, rc, err_detail(), code);
	cr_assert(!needle || strstr(err_detail(), needle), "%s: detail '%s' lacks '%s'", what,
		  err_detail(), needle);
	cr_assert_str_eq(err_file(), path, "%s: error names '%s'", what, err_file());
	cr_assert_null(f.fp, "%s: struct not cleared", what);
}

Test(safetensors, truncated_at_several_lengths)
{
	char path[320], cut[320];
	size_t len;
	uint64_t h;

	path_in(path, sizeof path, "t.safetensors");
	path_in(cut, sizeof cut, "cut.safetensors");
	unsigned char *b = small_file(path, &len, &h);
	size_t lens[] = {0, 1, 7, 8, 9, 8 + h / 2, 8 + h - 1, 8 + h, 8 + h + 1, 8 + h + 64,
			 len - 2, len - 1};
	for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
		char what[64];
		spit(cut, b, lens[i]);
		snprintf(what, sizeof what, "file cut to %zu of %zu bytes", lens[i], len);
		expect_open(cut, 0, CORE_ETRUNC, NULL, what);
		expect_open(cut, 1, CORE_ETRUNC, NULL, what);
	}
	/* One byte more than the header accounts for is not truncation but junk. */
	unsigned char *longer = malloc(len + 1);
	memcpy(longer, b, len);
	longer[len] = 0;
	spit(cut, longer, len + 1);
	expect_open(cut, 0, CORE_EFORMAT, "after the last tensor", "one extra byte");
	free(longer);
	free(b);
}

Test(safetensors, header_length_larger_than_file)
{
	char path[320];
	size_t len;
	uint64_t h;

	path_in(path, sizeof path, "h.safetensors");
	unsigned char *b = small_file(path, &len, &h);
	uint64_t bad[] = {len - 8 + 1, len, 1ull << 40, ~0ull};
	int codes[] = {CORE_ETRUNC, CORE_ETRUNC, CORE_EFORMAT, CORE_EFORMAT};
	for (int i = 0; i < 4; i++) {
		char what[64];
		for (int k = 0; k < 8; k++)
			b[k] = (unsigned char)(bad[i] >> (8 * k));
		spit(path, b, len);
		snprintf(what, sizeof what, "header length %llu in a %zu-byte file",
			 (unsigned long long)bad[i], len);
		expect_open(path, 0, codes[i], "header length", what);
	}
	free(b);
}

Test(safetensors, bad_json)
{
	char path[320];
	size_t len;
	uint64_t h;

	path_in(path, sizeof path, "j.safetensors");
	unsigned char *b = small_file(path, &len, &h);
	b[8] = 'x'; /* the opening brace */
	spit(path, b, len);
	expect_open(path, 0, CORE_EFORMAT, "json", "first header byte replaced");
	free(b);

	const char *bad[] = {
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}",   /* unclosed */
		"[1, 2, 3]",                                                       /* not object */
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"  /* duplicate */
		"\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}",
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[3]}}",                        /* no offsets */
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[-3],\"data_offsets\":[0,3]}}", /* negative */
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[3.0],\"data_offsets\":[0,3]}}", /* real */
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[3,0]}}", /* reversed */
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,3],\"data_offsets\":[0,3]}}", /* 5-d */
		"{\"__metadata__\":{\"step\":3},"                          /* not a string */
		"\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}",
		"{\"a\":7}",
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		write_raw(path, bad[i], "abc", 3);
		expect_open(path, 0, CORE_EFORMAT, NULL, bad[i]);
	}
}

Test(safetensors, unknown_dtype_and_inconsistent_shape)
{
	char path[320];

	path_in(path, sizeof path, "d.safetensors");
	write_raw(path, "{\"a\":{\"dtype\":\"F13\",\"shape\":[2],\"data_offsets\":[0,8]}}",
		  hand_data, 8);
	expect_open(path, 0, CORE_EFORMAT, "unknown dtype 'F13'", "dtype F13");
	/* 3 floats are 12 bytes, not 8. */
	write_raw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}",
		  hand_data, 8);
	expect_open(path, 0, CORE_EFORMAT, "needs 12 bytes", "shape [3] over 8 bytes");
	/* A shape whose byte count overflows 64 bits. */
	write_raw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
			"\"data_offsets\":[0,8]}}", hand_data, 8);
	expect_open(path, 0, CORE_EFORMAT, "too large", "overflowing shape");
	/* A name as long as TENSOR_NAME_MAX does not fit a struct tensor. */
	char name[TENSOR_NAME_MAX + 1], header[512];
	memset(name, 'n', TENSOR_NAME_MAX);
	name[TENSOR_NAME_MAX] = '\0';
	snprintf(header, sizeof header,
		 "{\"%s\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", name);
	write_raw(path, header, "abc", 3);
	expect_open(path, 0, CORE_EFORMAT, "longer than", "long name");
	name[TENSOR_NAME_MAX - 1] = '\0'; /* 127 bytes: fits */
	snprintf(header, sizeof header,
		 "{\"%s\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", name);
	write_raw(path, header, "abc", 3);
	expect_open(path, 0, 0, NULL, "127-byte name");
}

Test(safetensors, overlapping_gapped_and_outside_offsets)
{
	char path[320];
	unsigned char data[16] = {0};

	path_in(path, sizeof path, "o.safetensors");
	write_raw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
			"\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
		  data, 12);
	expect_open(path, 0, CORE_EFORMAT, "overlap", "b starts inside a");
	write_raw(path, "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]},"
			"\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
		  data, 12);
	expect_open(path, 0, CORE_EFORMAT, "overlap", "same, listed in the other order");
	write_raw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
			"\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
		  data, 8);
	expect_open(path, 0, CORE_EFORMAT, "overlap", "a and b share bytes");
	write_raw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
		  data, 12);
	expect_open(path, 0, CORE_EFORMAT, "gap", "first tensor at 4");
	write_raw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
		  data, 4);
	expect_open(path, 0, CORE_ETRUNC, NULL, "offsets beyond the data");
}

Test(safetensors, wrong_shape_or_dtype_for_st_read)
{
	char path[320];
	struct tensor w, dst;
	struct st_file f;

	path_in(path, sizeof path, "s.safetensors");
	cr_assert(tensor_alloc(&w, DT_F32, 2, (int64_t[]){256, 768}, "h.0.attn.c_attn.weight") ==
		  0);
	const struct tensor *p = &w;
	cr_assert(st_write(path, &p, 1, NULL, 0) == 0, "%s", err_detail());
	tensor_free(&w);
	cr_assert(st_open(&f, path, 1) == 0, "%s", err_detail());

	cr_assert(tensor_alloc(&dst, DT_F32, 2, (int64_t[]){256, 512}, NULL) == 0);
	cr_assert_eq(st_read(&f, "h.0.attn.c_attn.weight", &dst), CORE_ESHAPE);
	cr_assert_str_eq(err_detail(),
			 "tensor 'h.0.attn.c_attn.weight' has shape [256,768], expected [256,512]");
	cr_assert_str_eq(err_file(), path);
	tensor_free(&dst);

	cr_assert(tensor_alloc(&dst, DT_F32, 1, (int64_t[]){256 * 768}, NULL) == 0);
	cr_assert_eq(st_read(&f, "h.0.attn.c_attn.weight", &dst), CORE_ESHAPE, "flattened");
	tensor_free(&dst);

	cr_assert(tensor_alloc(&dst, DT_BF16, 2, (int64_t[]){256, 768}, NULL) == 0);
	cr_assert_eq(st_read(&f, "h.0.attn.c_attn.weight", &dst), CORE_ESHAPE);
	cr_assert_str_eq(err_detail(), "tensor 'h.0.attn.c_attn.weight' is F32 [256,768], "
				       "expected BF16 [256,768]");
	tensor_free(&dst);
	st_close(&f);
}

Test(safetensors, one_bit_flipped_in_data)
{
	char path[320];
	size_t len;
	uint64_t h;
	struct st_file f;

	path_in(path, sizeof path, "flip.safetensors");
	unsigned char *b = small_file(path, &len, &h);
	/* first: 64 bytes at [0,64), middle: [64,128), last: [128,138). Flip bit 3 of byte 70. */
	b[8 + h + 70] ^= 0x08;
	spit(path, b, len);

	expect_open(path, 1, CORE_ECHECKSUM, "checksum mismatch", "bit flipped, verify=1");
	cr_assert(strstr(err_detail(), "'middle'"), "detail '%s' does not name the tensor",
		  err_detail());

	/* Without verification the structure is fine; the flipped tensor fails alone. */
	int rc = st_open(&f, path, 0);
	cr_assert(rc == 0, "verify=0: %d %s", rc, err_detail());
	struct tensor t;
	cr_assert(tensor_alloc(&t, DT_F32, 1, (int64_t[]){16}, NULL) == 0);
	cr_assert_eq(st_read(&f, "middle", &t), CORE_ECHECKSUM, "st_read of the flipped tensor");
	cr_assert(strstr(err_detail(), "checksum mismatch"), "detail '%s'", err_detail());
	tensor_free(&t);
	cr_assert(tensor_alloc(&t, DT_F32, 2, (int64_t[]){4, 4}, NULL) == 0);
	cr_assert_eq(st_read(&f, "first", &t), 0, "untouched tensor: %s", err_detail());
	cr_assert(memcmp(t.data, b + 8 + h, 64) == 0);
	tensor_free(&t);
	cr_assert(tensor_alloc(&t, DT_U16, 1, (int64_t[]){5}, NULL) == 0);
	cr_assert_eq(st_read(&f, "last", &t), 0, "untouched tensor: %s", err_detail());
	tensor_free(&t);
	st_close(&f);
	free(b);
}

/* ---- failed writes ------------------------------------------------------------------------ */

Test(safetensors, failed_write_into_missing_directory)
{
	char path[320], old[320];
	size_t len, len2;
	uint64_t h;

	path_in(old, sizeof old, "keep.safetensors");
	unsigned char *before = small_file(old, &len, &h);
	snprintf(path, sizeof path, "%s/no-such-dir/keep.safetensors", dir);
	struct tensor t;
	cr_assert(tensor_alloc(&t, DT_F32, 1, (int64_t[]){8}, "x") == 0);
	const struct tensor *p = &t;
	int rc = st_write(path, &p, 1, NULL, 0);
	cr_assert_eq(rc, CORE_EIO, "st_write into a missing directory returned %d", rc);
	cr_assert_str_eq(err_file(), path);
	cr_assert_eq(count_files(dir), 1, "something was created next to the old file");
	unsigned char *after = tu_slurp(old, &len2);
	cr_assert(len == len2 && memcmp(before, after, len) == 0, "old file changed");
	tensor_free(&t);
	free(before);
	free(after);
}

/* A write that fails half way (file size limit: works as root, unlike a read-only directory)
 * must leave the existing target as it was and no temporary file behind. */
Test(safetensors, failed_write_midway_keeps_the_old_file)
{
	char path[320];
	size_t len, len2;
	uint64_t h;

	path_in(path, sizeof path, "target.safetensors");
	unsigned char *before = small_file(path, &len, &h);
	signal(SIGXFSZ, SIG_IGN); /* get EFBIG instead of being killed */
	struct rlimit rl = {.rlim_cur = 4096, .rlim_max = RLIM_INFINITY};
	cr_assert(setrlimit(RLIMIT_FSIZE, &rl) == 0);

	struct tensor t;
	cr_assert(tensor_alloc(&t, DT_F32, 1, (int64_t[]){1 << 18}, "big") == 0);
	const struct tensor *p = &t;
	int rc = st_write(path, &p, 1, NULL, 0);
	cr_assert_eq(rc, CORE_EIO, "st_write past the size limit returned %d (%s)", rc,
		     err_detail());
	cr_assert_str_eq(err_file(), path);
	cr_assert_eq(count_files(dir), 1, "temporary file left behind");
	unsigned char *after = tu_slurp(path, &len2);
	cr_assert(len == len2 && memcmp(before, after, len) == 0, "old file changed");
	struct st_file f;
	cr_assert_eq(st_open(&f, path, 1), 0, "old file no longer verifies: %s", err_detail());
	st_close(&f);
	tensor_free(&t);
	free(before);
	free(after);
}

Test(safetensors, write_refuses_bad_arguments)
{
	char path[320];
	struct tensor a, b;

	path_in(path, sizeof path, "bad.safetensors");
	cr_assert(tensor_alloc(&a, DT_F32, 1, (int64_t[]){2}, "same") == 0);
	cr_assert(tensor_alloc(&b, DT_F32, 1, (int64_t[]){2}, "same") == 0);
	const struct tensor *p[2] = {&a, &b};
	cr_assert_eq(st_write(path, p, 2, NULL, 0), CORE_EUSAGE, "duplicate names");
	const struct st_kv meta = {"crc32", "00000000"};
	cr_assert_eq(st_write(path, p, 1, &meta, 1), CORE_EUSAGE, "reserved metadata key");
	cr_assert_eq(count_files(dir), 0);
	tensor_free(&a);
	tensor_free(&b);
}

Test(safetensors, empty_file_and_missing_file)
{
	char path[320];
	struct st_file f;

	path_in(path, sizeof path, "empty.safetensors");
	cr_assert_eq(st_write(path, NULL, 0, NULL, 0), 0, "%s", err_detail());
	cr_assert_eq(st_open(&f, path, 1), 0, "%s", err_detail());
	cr_assert_eq(f.n, 0);
	cr_assert_str_eq(st_meta(&f, "crc32"), "00000000");
	st_close(&f);
	st_close(&f); /* twice is harmless */
	path_in(path, sizeof path, "absent.safetensors");
	expect_open(path, 0, CORE_ENOTFOUND, NULL, "missing file");
}

/* A checkpoint must be a regular file: a FIFO without a writer is refused at once (a blocking
 * open would wait here forever), and so is a directory or a device. */
Test(safetensors, fifo_and_other_non_files_are_refused_at_once)
{
	char path[320];

	path_in(path, sizeof path, "in.fifo");
	cr_assert_eq(mkfifo(path, 0600), 0);
	expect_open(path, 1, CORE_EIO, "is a FIFO, not a regular file", "a FIFO");
	cr_assert_str_eq(err_detail(), "is a FIFO, not a regular file");
	expect_open(dir, 1, CORE_EIO, "is a directory, not a regular file", "a directory");
	expect_open("/dev/null", 1, CORE_EIO, "is a character device, not a regular file",
		    "/dev/null");
}

/* ---- the streaming writer ----------------------------------------------------------------- */

/* The set's bytes concatenated in order, as one stream the writer is fed in pieces. */
static unsigned char *concat_set(struct tensor *ts, size_t *len)
{
	size_t n = 0;
	for (int i = 0; i < NT; i++)
		n += tensor_nbytes(&ts[i]);
	unsigned char *b = malloc(n + 1), *p = b;
	for (int i = 0; i < NT; i++) {
		memcpy(p, ts[i].data, tensor_nbytes(&ts[i]));
		p += tensor_nbytes(&ts[i]);
	}
	*len = n;
	return b;
}

static int open_writer(struct st_writer **w, const char *path, struct tensor *ts)
{
	const struct tensor *ptr[NT];
	const struct st_kv meta[] = {{"format", "dpc-checkpoint"}, {"kind", "path"},
				     {"step", "42"}, {"note", "quote \" and \\ and caf\xc3\xa9"}};
	for (int i = 0; i < NT; i++)
		ptr[i] = &ts[i];
	return st_writer_open(w, path, ptr, NT, meta, 4);
}

/* Pieces of 1, 3, 7 and 64 bytes cross every tensor boundary; the file must equal the one
 * written whole (whose bytes written_bytes_follow_the_format checks against the format). */
Test(safetensors, streamed_in_pieces_equals_whole)
{
	struct tensor ts[NT];
	char whole[512], streamed[512];
	size_t n, lw, ls;

	make_set(ts);
	path_in(whole, sizeof whole, "whole.safetensors");
	write_set(whole, ts);
	unsigned char *ref = tu_slurp(whole, &lw), *data = concat_set(ts, &n);
	static const size_t pieces[] = {1, 3, 7, 64};
	for (size_t k = 0; k < sizeof pieces / sizeof pieces[0]; k++) {
		struct st_writer *w;
		path_in(streamed, sizeof streamed, "streamed.safetensors");
		cr_assert(open_writer(&w, streamed, ts) == 0, "%s", err_detail());
		for (size_t off = 0; off < n; off += pieces[k]) {
			size_t m = n - off < pieces[k] ? n - off : pieces[k];
			cr_assert(st_writer_put(w, data + off, m) == 0, "%s", err_detail());
		}
		cr_assert(st_writer_commit(w) == 0, "%s", err_detail());
		unsigned char *got = tu_slurp(streamed, &ls);
		cr_expect_eq(ls, lw, "piece %zu: length %zu, want %zu", pieces[k], ls, lw);
		cr_expect(ls == lw && memcmp(got, ref, lw) == 0, "piece %zu: bytes differ",
			  pieces[k]);
		free(got);
	}
	free(ref);
	free(data);
	free_set(ts);
}

Test(safetensors, streamed_short_or_long_is_refused_and_leaves_nothing)
{
	struct tensor ts[NT];
	char path[512];
	size_t n;
	struct st_writer *w;

	make_set(ts);
	unsigned char *data = concat_set(ts, &n);
	path_in(path, sizeof path, "short.safetensors");
	cr_assert(open_writer(&w, path, ts) == 0);
	cr_assert(st_writer_put(w, data, n - 1) == 0);
	err_clear();
	cr_expect_eq(st_writer_commit(w), CORE_EUSAGE);
	cr_expect(strstr(err_detail(), "'bytes' is missing 1 bytes"), "%s", err_detail());
	cr_expect_eq(count_files(dir), 0, "nothing left after a short stream");

	path_in(path, sizeof path, "long.safetensors");
	cr_assert(open_writer(&w, path, ts) == 0);
	cr_assert(st_writer_put(w, data, n) == 0);
	cr_expect_eq(st_writer_put(w, data, 1), CORE_EUSAGE);
	st_writer_abort(w);
	cr_expect_eq(count_files(dir), 0, "nothing left after an aborted stream");
	free(data);
	free_set(ts);
}

/* Out of order: each tensor's bytes in 5-byte pieces written last piece first, crcs given
 * from zlib: the file must equal the one written whole. */
Test(safetensors, written_out_of_order_equals_whole)
{
	struct tensor ts[NT];
	char whole[512], path[512];
	size_t lw, ls;
	struct st_writer *w;

	make_set(ts);
	path_in(whole, sizeof whole, "whole.safetensors");
	write_set(whole, ts);
	unsigned char *ref = tu_slurp(whole, &lw);
	path_in(path, sizeof path, "pieces.safetensors");
	cr_assert(open_writer(&w, path, ts) == 0, "%s", err_detail());
	for (int i = NT - 1; i >= 0; i--) {
		size_t nb = tensor_nbytes(&ts[i]);
		for (size_t off = (nb ? (nb - 1) / 5 * 5 : 0); nb > 0; off -= 5) {
			size_t m = nb - off < 5 ? nb - off : 5;
			cr_assert(st_writer_pwrite(w, i, off, (unsigned char *)ts[i].data + off, m) == 0,
				  "%s", err_detail());
			if (off == 0)
				break;
		}
		st_writer_set_crc(w, i, zcrc(ts[i].data, nb));
	}
	cr_assert(st_writer_commit(w) == 0, "%s", err_detail());
	unsigned char *got = tu_slurp(path, &ls);
	cr_expect(ls == lw && memcmp(got, ref, lw) == 0, "out-of-order file differs (%zu vs %zu "
		  "bytes)", ls, lw);
	free(got);
	free(ref);
	free_set(ts);
}

Test(safetensors, out_of_order_gaps_and_mixing_are_refused)
{
	struct tensor ts[NT];
	char path[512];
	struct st_writer *w;

	make_set(ts);
	path_in(path, sizeof path, "gap.safetensors");
	cr_assert(open_writer(&w, path, ts) == 0);
	for (int i = 0; i < NT; i++) {
		size_t nb = tensor_nbytes(&ts[i]), skip = i == 0 ? 4 : 0; /* wte's first float */
		cr_assert(st_writer_pwrite(w, i, skip, (unsigned char *)ts[i].data + skip,
					   nb - skip) == 0);
		st_writer_set_crc(w, i, zcrc(ts[i].data, nb));
	}
	cr_expect_eq(st_writer_put(w, ts[0].data, 4), CORE_EUSAGE, "put after pwrite");
	err_clear();
	cr_expect_eq(st_writer_commit(w), CORE_EUSAGE, "a 4-byte gap is refused");
	cr_expect(strstr(err_detail(), "data bytes written"), "%s", err_detail());
	cr_expect_eq(count_files(dir), 0, "nothing left after a refused commit");

	cr_assert(open_writer(&w, path, ts) == 0);
	cr_expect_eq(st_writer_pwrite(w, 0, tensor_nbytes(&ts[0]) - 2, ts[0].data, 4), CORE_EUSAGE,
		     "a write past the tensor's end");
	st_writer_abort(w);
	free_set(ts);
}
