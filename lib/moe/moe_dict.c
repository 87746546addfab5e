/* moe_dict.c - Tutel's strategy dictionary, moe-dict(5); see moe_dict.h.
 *
 * The parser works on a copy of one line at a time (at most 4096 bytes), so that fields can
 * be cut in place, and it sees every byte of the text: control characters, NUL included,
 * are refused before a line is looked at, so C string functions cannot stop early on it.
 * Numbers are read and written in the "C" numeric locale whatever the program set, so that
 * a file is the same on every machine. The writer checks the values it is given against the
 * same rules the parser enforces, which is what makes write -> read return them equal:
 * integers in decimal, SECONDS with 17 significant digits (enough for any double), and a
 * machine text that a reader gives back byte for byte (no control character, no '#', no
 * blank at either end).
 */
#include "moe/moe_dict.h"

#include <errno.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/editdist.h"
#include "common/err.h"
#include "dist/dist.h"
#include "io/atomicio.h"
#include "common/banned.h"

#define DICT_VERSION 1
#define LINE_BYTES 4096
#define INT53 ((int64_t)1 << 53)
#define FILE_MAX ((size_t)1 << 26)
#define SEPS " \t"
#define DIGITS "0123456789"

/* The header keys, in the order the writer writes them; each takes one integer in [1, hi]
 * except the machine text. */
enum key { K_MACHINE, K_WORLD, K_LOCAL, K_EXPERTS, K_MODEL, K_HIDDEN, K_TOPK, K_TOKENS, K_WINDOW,
	   NKEYS };
static const struct {
	const char *name;
	int64_t hi;
} keys[NKEYS] = {
	[K_MACHINE] = {"machine", 0},          [K_WORLD] = {"world", INT_MAX},
	[K_LOCAL] = {"local-size", INT_MAX},   [K_EXPERTS] = {"experts", INT_MAX},
	[K_MODEL] = {"model-dim", INT53},      [K_HIDDEN] = {"hidden-dim", INT53},
	[K_TOPK] = {"top-k", INT_MAX},         [K_TOKENS] = {"tokens", INT53},
	[K_WINDOW] = {"window", INT53},
};

static void header_values(const struct moe_dict *d, int64_t v[NKEYS])
{
	v[K_MACHINE] = 0;
	v[K_WORLD] = d->W;
	v[K_LOCAL] = d->local_size;
	v[K_EXPERTS] = d->E;
	v[K_MODEL] = d->M;
	v[K_HIDDEN] = d->H;
	v[K_TOPK] = d->k;
	v[K_TOKENS] = d->T;
	v[K_WINDOW] = d->R;
}

/* The rules that tie two header values together: the key at fault (the one whose value the
 * rule restricts) with the problem in msg, or -1. */
static int header_relation(const int64_t v[NKEYS], char *msg, size_t n)
{
	if (v[K_WORLD] % v[K_LOCAL]) {
		snprintf(msg, n, "local-size %lld does not divide world %lld", (long long)v[K_LOCAL],
			 (long long)v[K_WORLD]);
		return K_LOCAL;
	}
	if (v[K_TOPK] > v[K_EXPERTS]) {
		snprintf(msg, n, "top-k %lld is more than experts %lld", (long long)v[K_TOPK],
			 (long long)v[K_EXPERTS]);
		return K_TOPK;
	}
	return -1;
}

static int plan_d_ok(int64_t d)
{
	return d == 1 || d == 2 || d == 4 || d == 8;
}

/* Numbers in the "C" locale for the life of one call: *c is 0 when it cannot be had. */
static int c_numeric_begin(locale_t *c, locale_t *old, const char *path)
{
	*c = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
	if (!*c)
		return err_set(CORE_ENOMEM, path, "cannot create the C locale");
	*old = uselocale(*c);
	return 0;
}

static void c_numeric_end(locale_t c, locale_t old)
{
	uselocale(old);
	freelocale(c);
}

/* ---- parsing ------------------------------------------------------------------------------ */

struct parser {
	const char *path;
	long line;
	struct moe_dict *d;
	size_t cap;             /* entries allocated */
	int64_t v[NKEYS];       /* header values */
	long at[NKEYS];         /* line of each header key, 0 while not seen */
	long first_bucket;      /* line of the first bucket, 0 before it */
	long last_bucket;       /* line of the last one */
};

static int bad_at(const struct parser *p, long line, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int bad_at(const struct parser *p, long line, int code, const char *fmt, ...)
{
	char msg[600];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (line > 0)
		return err_set(code, p->path, "line %ld: %s", line, msg);
	return err_set(code, p->path, "%s", msg);
}

#define bad(p, ...) bad_at((p), (p)->line, CORE_EFORMAT, __VA_ARGS__)

/* The next field of *cur, cut in place, or NULL at the end of the line. */
static char *next_field(char **cur)
{
	char *s = *cur + strspn(*cur, SEPS);
	if (!*s) {
		*cur = s;
		return NULL;
	}
	char *e = s + strcspn(s, SEPS);
	if (*e)
		*e++ = '\0';
	*cur = e;
	return s;
}

/* s as an integer of the format in [lo, hi]: decimal digits, no sign, no leading zero. */
static int get_int(struct parser *p, const char *what, const char *s, int64_t lo, int64_t hi,
		   int64_t *out)
{
	size_t n = strspn(s, DIGITS);
	char *end;

	if (n == 0 || s[n]) {
		if ((s[0] == '+' || s[0] == '-') && s[1] && !s[1 + strspn(s + 1, DIGITS)])
			return bad(p, "%s has a sign ('%.40s'): integers are written without one",
				   what, s);
		return bad(p, "%s is not an integer ('%.40s')", what, s);
	}
	if (s[0] == '0' && n > 1)
		return bad(p, "%s has a leading zero ('%.40s')", what, s);
	errno = 0;
	long long v = strtoll(s, &end, 10);
	if (errno == ERANGE || end != s + n || v > INT53)
		return bad(p, "%s %.40s is more than 2^53", what, s);
	if (v < lo)
		return bad(p, "%s %lld is less than %lld", what, v, (long long)lo);
	if (v > hi)
		return bad(p, "%s %lld is more than %lld", what, v, (long long)hi);
	*out = v;
	return 0;
}

/* SECONDS: strtod's decimal syntax only (no hex, no inf or nan), finite and above 0. */
static int get_seconds(struct parser *p, const char *s, double *out)
{
	char *end;

	if (s[strspn(s, DIGITS "+-.eE")] || !strpbrk(s, DIGITS))
		return bad(p, "seconds is not a decimal number ('%.40s')", s);
	errno = 0;
	double v = strtod(s, &end);
	if (end == s || *end)
		return bad(p, "seconds is not a decimal number ('%.40s')", s);
	/* Underflow is not refused as such: 0 is, and a subnormal is a positive time. */
	if (!isfinite(v))
		return bad(p, "seconds is not finite ('%.40s')", s);
	if (!(v > 0))
		return bad(p, "seconds is not more than 0 ('%.40s')", s);
	*out = v;
	return 0;
}

static int parse_magic(struct parser *p, char *cur)
{
	char *magic = next_field(&cur), *ver = magic ? next_field(&cur) : NULL, *more;
	int64_t v;

	if (!ver || strcmp(magic, "moe-dict"))
		return bad(p, "not a moe-dict file (expected 'moe-dict %d')", DICT_VERSION);
	if ((more = next_field(&cur)))
		return bad(p, "'%.40s' after the version", more);
	ERR_FORWARD(get_int(p, "version", ver, 0, INT53, &v));
	if (v > DICT_VERSION)
		return bad_at(p, p->line, CORE_EVERSION, "version %lld is newer than this build "
			      "reads (%d)", (long long)v, DICT_VERSION);
	if (v < 1)
		return bad(p, "version 0 does not exist (this build reads %d)", DICT_VERSION);
	return 0;
}

/* Every header key seen and their relations kept; where names what comes next ("before the
 * first bucket" or "" at the end). */
static int header_complete(struct parser *p, const char *where)
{
	char msg[200];

	for (int k = 0; k < NKEYS; k++)
		if (!p->at[k])
			return bad(p, "missing key '%s'%s", keys[k].name, where);
	int k = header_relation(p->v, msg, sizeof msg);
	if (k >= 0)
		return bad_at(p, p->at[k], CORE_EFORMAT, "%s", msg);
	return 0;
}

static int parse_bucket(struct parser *p, char *cur)
{
	struct moe_dict *d = p->d;
	char *f[5], *x;
	int nf = 0;
	int64_t key = 0, r = 0, dd = 0;
	double sec = 0;

	while ((x = next_field(&cur)))
		if (nf++ < 5)
			f[nf - 1] = x;
	if (nf != 5)
		return bad(p, "bucket takes 5 values (KEY r d a SECONDS), not %d", nf);
	if (!p->first_bucket) {
		ERR_FORWARD(header_complete(p, " before the first bucket"));
		p->first_bucket = p->line;
	}
	ERR_FORWARD(get_int(p, "bucket key", f[0], 0, INT53, &key));
	if (d->n && key == d->e[d->n - 1].key)
		return bad(p, "bucket %lld twice (also on line %ld)", (long long)key,
			   p->last_bucket);
	if (d->n && key < d->e[d->n - 1].key)
		return bad(p, "bucket %lld after bucket %lld", (long long)key,
			   (long long)d->e[d->n - 1].key);
	ERR_FORWARD(get_int(p, "r", f[1], 0, INT_MAX, &r));
	ERR_FORWARD(get_int(p, "d", f[2], 0, INT53, &dd));
	if (!plan_d_ok(dd))
		return bad(p, "d is %lld, not 1, 2, 4 or 8", (long long)dd);
	int a = dist_a2a_from_name(f[3]);
	if (a < 0)
		return bad(p, "a is '%.40s', not linear, 2dh or mpi", f[3]);
	ERR_FORWARD(get_seconds(p, f[4], &sec));
	if (d->n == p->cap) {
		size_t cap = p->cap ? 2 * p->cap : 16;
		struct moe_dict_entry *e = realloc(d->e, cap * sizeof *e);
		if (!e)
			return err_set(CORE_ENOMEM, p->path, "cannot allocate %zu buckets", cap);
		d->e = e;
		p->cap = cap;
	}
	d->e[d->n++] = (struct moe_dict_entry){
		.key = key,
		.plan = {.r = (int)r, .d = (int)dd, .a = (enum dist_a2a)a},
		.seconds = sec,
	};
	p->last_bucket = p->line;
	return 0;
}

/* The machine text: what follows the key, without the blanks around it. */
static int parse_machine(struct parser *p, char *cur)
{
	char *s = cur + strspn(cur, SEPS);
	size_t n = strlen(s);

	while (n && strchr(SEPS, s[n - 1]))
		n--;
	if (!n)
		return bad(p, "machine needs a value");
	if (n >= sizeof p->d->machine)
		return bad(p, "machine text is longer than %zu bytes", sizeof p->d->machine - 1);
	memcpy(p->d->machine, s, n);
	p->d->machine[n] = '\0';
	return 0;
}

static int unknown_key(struct parser *p, const char *name)
{
	const char *best = "bucket";
	size_t dist = edit_distance(name, best);

	for (int k = 0; k < NKEYS; k++) {
		size_t e = edit_distance(name, keys[k].name);
		if (e < dist) {
			dist = e;
			best = keys[k].name;
		}
	}
	if (dist <= 2)
		return bad(p, "unknown key '%.40s' (did you mean '%s'?)", name, best);
	return bad(p, "unknown key '%.40s'", name);
}

/* One line without its newline, NUL-terminated, its comment not yet cut. */
static int parse_line(struct parser *p, char *s)
{
	char *hash = strchr(s, '#'), *cur = s, *name, *val;
	int k;

	if (hash)
		*hash = '\0';
	if (p->line == 1)
		return parse_magic(p, cur);
	if (!(name = next_field(&cur)))
		return 0;
	if (!strcmp(name, "bucket"))
		return parse_bucket(p, cur);
	for (k = 0; k < NKEYS && strcmp(name, keys[k].name); k++)
		;
	if (k == NKEYS)
		return unknown_key(p, name);
	if (p->first_bucket)
		return bad(p, "%s after the first bucket (line %ld): the header comes first",
			   name, p->first_bucket);
	if (p->at[k])
		return bad(p, "%s again (first on line %ld)", name, p->at[k]);
	p->at[k] = p->line;
	if (k == K_MACHINE)
		return parse_machine(p, cur);
	if (!(val = next_field(&cur)))
		return bad(p, "%s needs a value", name);
	if (next_field(&cur))
		return bad(p, "%s takes one value", name);
	return get_int(p, name, val, 1, keys[k].hi, &p->v[k]);
}

static int parse_text(struct parser *p, const char *text, size_t n)
{
	char buf[LINE_BYTES + 1];
	size_t pos = 0;

	for (p->line = 1; pos < n; p->line++) {
		const char *nl = memchr(text + pos, '\n', n - pos);
		size_t len = (nl ? (size_t)(nl - text) : n) - pos;

		if (len > LINE_BYTES)
			return bad(p, "longer than %d bytes", LINE_BYTES);
		for (size_t i = 0; i < len; i++) {
			unsigned char c = (unsigned char)text[pos + i];
			if (c == '\r')
				return bad(p, "carriage return (lines end with a newline alone)");
			if ((c < 0x20 && c != '\t') || c == 0x7f)
				return bad(p, "control character 0x%02x", c);
		}
		memcpy(buf, text + pos, len);
		buf[len] = '\0';
		ERR_FORWARD(parse_line(p, buf));
		pos += len + 1;
	}
	if (p->line == 1)
		return bad(p, "not a moe-dict file (expected 'moe-dict %d')", DICT_VERSION);
	p->line = 0; /* what follows is about the whole file */
	if (!p->first_bucket) {
		ERR_FORWARD(header_complete(p, ""));
		return bad(p, "no buckets");
	}
	return 0;
}

int moe_dict_parse(const char *text, size_t n, const char *path, struct moe_dict *d)
{
	struct parser p = {.path = path, .d = d};
	locale_t c, old = (locale_t)0;

	memset(d, 0, sizeof *d);
	ERR_FORWARD(c_numeric_begin(&c, &old, path));
	int rc = parse_text(&p, text, n);
	c_numeric_end(c, old);
	if (rc < 0) {
		moe_dict_free(d);
		return rc;
	}
	d->W = (int)p.v[K_WORLD];
	d->local_size = (int)p.v[K_LOCAL];
	d->E = (int)p.v[K_EXPERTS];
	d->k = (int)p.v[K_TOPK];
	d->M = p.v[K_MODEL];
	d->H = p.v[K_HIDDEN];
	d->T = p.v[K_TOKENS];
	d->R = p.v[K_WINDOW];
	return 0;
}

int moe_dict_read(const char *path, struct moe_dict *d)
{
	char *text;
	size_t n;
	int rc;

	memset(d, 0, sizeof *d);
	rc = file_read_all(path, FILE_MAX, &text, &n);
	/* The contract's one code for a file that cannot be read. */
	if (rc == CORE_ENOTFOUND)
		return err_set(CORE_EIO, path, "no such file");
	ERR_FORWARD(rc);
	rc = moe_dict_parse(text, n, path, d);
	free(text);
	return rc;
}

void moe_dict_free(struct moe_dict *d)
{
	free(d->e);
	memset(d, 0, sizeof *d);
}

/* ---- writing ------------------------------------------------------------------------------ */

/* What moe_dict_parse would refuse or read back otherwise, CORE_EUSAGE naming it. */
static int check_writable(const struct moe_dict *d, const char *path)
{
	const char *m = d->machine;
	size_t len = strnlen(m, sizeof d->machine);
	int64_t v[NKEYS];
	char msg[200];

	if (len == sizeof d->machine)
		return err_set(CORE_EUSAGE, path, "machine text is not terminated within %zu bytes",
			       sizeof d->machine);
	if (!len)
		return err_set(CORE_EUSAGE, path, "machine text is empty");
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)m[i];
		if ((c < 0x20 && c != '\t') || c == 0x7f)
			return err_set(CORE_EUSAGE, path, "machine text holds control character "
				       "0x%02x", c);
	}
	if (strchr(m, '#'))
		return err_set(CORE_EUSAGE, path, "machine text holds '#', which starts a comment");
	if (strchr(SEPS, m[0]) || strchr(SEPS, m[len - 1]))
		return err_set(CORE_EUSAGE, path, "machine text starts or ends with a blank");
	header_values(d, v);
	for (int k = K_MACHINE + 1; k < NKEYS; k++)
		if (v[k] < 1 || v[k] > keys[k].hi)
			return err_set(CORE_EUSAGE, path, "%s %lld is outside 1..%lld", keys[k].name,
				       (long long)v[k], (long long)keys[k].hi);
	if (header_relation(v, msg, sizeof msg) >= 0)
		return err_set(CORE_EUSAGE, path, "%s", msg);
	if (!d->n || !d->e)
		return err_set(CORE_EUSAGE, path, "no buckets");
	for (size_t i = 0; i < d->n; i++) {
		const struct moe_dict_entry *e = &d->e[i];
		if (e->key < 0 || e->key > INT53)
			return err_set(CORE_EUSAGE, path, "bucket %zu: key %lld is outside 0..2^53", i,
				       (long long)e->key);
		if (i && e->key <= e[-1].key)
			return err_set(CORE_EUSAGE, path, "bucket %zu: key %lld after key %lld (keys "
				       "increase)", i, (long long)e->key, (long long)e[-1].key);
		if (e->plan.r < 0)
			return err_set(CORE_EUSAGE, path, "bucket %zu: r %d is less than 0", i,
				       e->plan.r);
		if (!plan_d_ok(e->plan.d))
			return err_set(CORE_EUSAGE, path, "bucket %zu: d is %d, not 1, 2, 4 or 8", i,
				       e->plan.d);
		if ((unsigned)e->plan.a > DIST_A2A_MPI)
			return err_set(CORE_EUSAGE, path, "bucket %zu: a is %d, not an all-to-all "
				       "algorithm", i, (int)e->plan.a);
		if (!isfinite(e->seconds) || !(e->seconds > 0))
			return err_set(CORE_EUSAGE, path, "bucket %zu: seconds %g is not a finite "
				       "number above 0", i, e->seconds);
	}
	return 0;
}

int moe_dict_write(const char *path, const struct moe_dict *d)
{
	char *text = NULL;
	size_t len = 0;
	int64_t v[NKEYS];
	locale_t c, old = (locale_t)0;

	ERR_FORWARD(check_writable(d, path));
	ERR_FORWARD(c_numeric_begin(&c, &old, path));
	FILE *fp = open_memstream(&text, &len);
	if (fp) {
		header_values(d, v);
		fprintf(fp, "moe-dict %d\n# Tutel strategy dictionary, see moe-dict(5); written by "
			"libcore moe_dict_write\n", DICT_VERSION);
		fprintf(fp, "%s %s\n", keys[K_MACHINE].name, d->machine);
		for (int k = K_MACHINE + 1; k < NKEYS; k++)
			fprintf(fp, "%s %lld\n", keys[k].name, (long long)v[k]);
		fprintf(fp, "# bucket KEY r d a SECONDS\n");
		for (size_t i = 0; i < d->n; i++) {
			const struct moe_dict_entry *e = &d->e[i];
			fprintf(fp, "bucket %lld %d %d %s %.17g\n", (long long)e->key, e->plan.r,
				e->plan.d, dist_a2a_name(e->plan.a), e->seconds);
		}
	}
	int bad_stream = !fp || ferror(fp);
	if (fp && fclose(fp) != 0)
		bad_stream = 1;
	c_numeric_end(c, old);
	if (bad_stream) {
		free(text);
		return err_set(CORE_ENOMEM, path, "cannot build the dictionary's text");
	}
	int rc = file_write_atomic(path, text, len);
	free(text);
	return rc;
}

/* ---- use ---------------------------------------------------------------------------------- */

int moe_dict_check(const struct moe_dict *d, const char *path, int W, int E, int64_t M,
		   int64_t H, int k)
{
	if (d->W != W)
		return err_set(CORE_EUSAGE, path, "measured for W=%d ranks, this run has W=%d", d->W,
			       W);
	if (d->E != E)
		return err_set(CORE_EUSAGE, path, "measured for E=%d experts, this run has E=%d",
			       d->E, E);
	if (d->M != M)
		return err_set(CORE_EUSAGE, path, "measured for model dim M=%lld, this run has "
			       "M=%lld", (long long)d->M, (long long)M);
	if (d->H != H)
		return err_set(CORE_EUSAGE, path, "measured for hidden dim H=%lld, this run has "
			       "H=%lld", (long long)d->H, (long long)H);
	if (d->k != k)
		return err_set(CORE_EUSAGE, path, "measured for top-k k=%d, this run has k=%d", d->k,
			       k);
	return 0;
}

const struct moe_dict_entry *moe_dict_lookup(const struct moe_dict *d, int64_t C, int *exact)
{
	size_t lo = 0, hi = d->n;

	if (exact)
		*exact = 0;
	if (!d->n || d->R < 1)
		return NULL;
	const int64_t key = C / d->R - (C % d->R < 0); /* floor, for a negative C too */
	while (lo < hi) { /* the first entry with a key >= key */
		size_t mid = lo + (hi - lo) / 2;
		if (d->e[mid].key < key)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < d->n && d->e[lo].key == key) {
		if (exact)
			*exact = 1;
		return &d->e[lo];
	}
	if (lo == 0)
		return &d->e[0];
	if (lo == d->n)
		return &d->e[d->n - 1];
	/* Both neighbours lie in [0, 2^53] around key: no overflow. Ties go to the lower. */
	const struct moe_dict_entry *below = &d->e[lo - 1], *above = &d->e[lo];
	return key - below->key <= above->key - key ? below : above;
}
