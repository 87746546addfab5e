/* harness.c - the scratch files, the error contract and the outcome; see harness.h.
 *
 * Every path is created once per process and reused for every input, so that a run of
 * millions of inputs writes over the same few files; what was created is removed at exit
 * (and by replay when an input aborts; not after a crash under libFuzzer, which leaves by
 * _exit: the directory under $TMPDIR is then the one thing left behind). */
#include "harness.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <zlib.h>

#include "common/err.h"
#include "common/banned.h"

#define FUZZ_MAX_PATHS 16

char fuzz_outcome[1024];

static char scratch[256];
static struct {
	char name[64];
	char path[320];
} made[FUZZ_MAX_PATHS];
static int nmade;

static void print_escaped(FILE *fp, const char *s)
{
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '\n')
			fputs("\\n", fp);
		else if (c < 0x20 || c == 0x7f)
			fprintf(fp, "\\x%02x", c);
		else
			fputc(c, fp);
	}
}

void fuzz_fail(const char *fmt, ...)
{
	char msg[2048];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	fputs("fuzz: ", stderr);
	print_escaped(stderr, msg);
	fputc('\n', stderr);
	fflush(stderr);
	abort();
}

/* unlink and rmdir only: async-signal-safe, for replay's signal handler. */
void fuzz_cleanup(void)
{
	for (int i = nmade - 1; i >= 0; i--)
		if (unlink(made[i].path) != 0)
			rmdir(made[i].path);
	if (scratch[0])
		rmdir(scratch);
}

const char *fuzz_path(const char *name)
{
	for (int i = 0; i < nmade; i++)
		if (strcmp(made[i].name, name) == 0)
			return made[i].path;
	if (!scratch[0]) {
		const char *tmp = getenv("TMPDIR");
		snprintf(scratch, sizeof scratch, "%s/fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
		if (!mkdtemp(scratch))
			fuzz_fail("cannot make a scratch directory '%s': %s", scratch,
				  strerror(errno));
		atexit(fuzz_cleanup);
	}
	/* Parent folders of name ("run/shards/x") are made and remembered first, so that
	 * remove_made, going backwards, empties each folder before removing it. */
	const char *slash = strrchr(name, '/');
	if (slash) {
		char parent[64];
		snprintf(parent, sizeof parent, "%.*s", (int)(slash - name), name);
		const char *p = fuzz_path(parent);
		if (mkdir(p, 0700) != 0 && errno != EEXIST)
			fuzz_fail("cannot make '%s': %s", p, strerror(errno));
	}
	if (nmade == FUZZ_MAX_PATHS || strlen(name) >= sizeof made[0].name)
		fuzz_fail("too many scratch paths, or '%s' too long", name);
	snprintf(made[nmade].name, sizeof made[nmade].name, "%s", name);
	snprintf(made[nmade].path, sizeof made[nmade].path, "%s/%s", scratch, name);
	return made[nmade++].path;
}

const char *fuzz_write(const char *name, const void *data, size_t size)
{
	const char *path = fuzz_path(name);
	FILE *fp = fopen(path, "wb");

	if (!fp || (size && fwrite(data, 1, size, fp) != size) || fclose(fp) != 0)
		fuzz_fail("cannot write the input to '%s': %s", path, strerror(errno));
	return path;
}

void fuzz_ok(void)
{
	snprintf(fuzz_outcome, sizeof fuzz_outcome, "ok");
	err_clear();
}

void fuzz_check_error(const char *call, int rc, const char *file)
{
	char msg[1024];

	if (rc >= 0 || strcmp(err_name(rc), "unknown error") == 0)
		fuzz_fail("%s returned %d, not 0 or a negative CORE_E* code", call, rc);
	err_format(msg, sizeof msg, rc);
	snprintf(fuzz_outcome, sizeof fuzz_outcome, "%s", msg);
	if (!err_detail()[0])
		fuzz_fail("%s returned %d (%s) without recording a detail", call, rc, err_name(rc));
	if (file && strcmp(err_file(), file) != 0)
		fuzz_fail("%s failed (%s) naming the file '%s', not the input '%s'", call, msg,
			  err_file(), file);
	/* err_format gives "'FILE': detail" only when the code recorded is the code returned;
	 * otherwise a bare name ("malformed file") that says neither which file nor why. */
	size_t n = file ? strlen(file) : 0;
	if (file ? strncmp(msg, "'", 1) != 0 || strncmp(msg + 1, file, n) != 0 ||
			   strncmp(msg + 1 + n, "': ", 3) != 0
		 : strcmp(msg, err_detail()) != 0)
		fuzz_fail("%s returned %d (%s) but recorded another error: '%s'", call, rc,
			  err_name(rc), msg);
	/* One line, and nothing a terminal would act on: no control character at all. */
	for (const char *p = msg; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			fuzz_fail("%s: the message holds control character 0x%02x: %s", call,
				  (unsigned char)*p, msg);
	err_clear();
}

const char fuzz_levels_yaml[] =
	"model:\n"
	"  n_layer: 4\n"
	"  n_embd: 16\n"
	"  n_head: 2\n"
	"  seq_len: 8\n"
	"  vocab_size: 256\n"
	"train:\n"
	"  steps: 40\n"
	"dipaco:\n"
	"  phases: 4\n"
	"  inner_steps: 10\n"
	"levels:\n"
	"  - name: lower\n"
	"    owns: embed h.0-1\n"
	"    modules: 2\n"
	"  - name: upper\n"
	"    owns: h.2-3 head\n"
	"    modules: 2\n";

static void set_hex(json_t *md, const char *key, uint32_t crc)
{
	char hex[9];
	snprintf(hex, sizeof hex, "%08x", crc);
	json_object_set_new(md, key, json_string(hex));
}

uint8_t *fuzz_fix_st_crcs(const uint8_t *data, size_t size, size_t *out_size)
{
	uint64_t n = 0;
	json_error_t je;

	if (size < 8)
		return NULL;
	for (int i = 0; i < 8; i++)
		n |= (uint64_t)data[i] << (8 * i);
	if (n < 2 || n > size - 8)
		return NULL;
	json_t *root = json_loadb((const char *)data + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
	json_t *md = json_object_get(root, "__metadata__");
	if (!json_is_object(md)) {
		json_decref(root);
		return NULL;
	}
	const uint8_t *body = data + 8 + n;
	size_t blen = size - 8 - (size_t)n;
	const char *k;
	json_t *v, *tmp;
	int fixed = 0;
	json_object_foreach_safe(md, tmp, k, v) {
		if (strcmp(k, "crc32") == 0) {
			set_hex(md, k, (uint32_t)crc32(0, body, (uInt)blen));
			fixed = 1;
		} else if (strncmp(k, "crc32.", 6) == 0) {
			json_t *offs = json_object_get(json_object_get(root, k + 6), "data_offsets");
			json_t *b = json_array_get(offs, 0), *e = json_array_get(offs, 1);
			if (!json_is_integer(b) || !json_is_integer(e))
				continue;
			json_int_t lo = json_integer_value(b), hi = json_integer_value(e);
			if (lo < 0 || hi < lo || (uint64_t)hi > blen)
				continue;
			set_hex(md, k, (uint32_t)crc32(0, body + lo, (uInt)(hi - lo)));
			fixed = 1;
		}
	}
	char *text = fixed ? json_dumps(root, JSON_COMPACT) : NULL;
	json_decref(root);
	if (!text)
		return NULL;
	size_t hlen = strlen(text);
	uint8_t *out = malloc(8 + hlen + blen);
	if (!out)
		fuzz_fail("out of memory");
	for (int i = 0; i < 8; i++)
		out[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
	memcpy(out + 8, text, hlen);
	memcpy(out + 8 + hlen, body, blen);
	free(text);
	*out_size = 8 + hlen + blen;
	return out;
}
