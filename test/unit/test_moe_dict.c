/* test_moe_dict.c - the strategy dictionary, moe-dict(5): write -> read gives the same
 * dictionary back (awkward doubles, tabs and UTF-8 in the machine text included); every rule
 * of the format is refused with a detail naming the line and the problem; the lookup of a
 * capacity (exact, nearest with ties to the lower, below the first and above the last
 * bucket); the check against a run names the first field that differs; the writer refuses
 * what a reader would not give back equal, and a write that fails leaves the old file. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <float.h>
#include <locale.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/err.h"
#include "moe/moe_dict.h"
#include "testutil.h"
#include "common/banned.h"

static char dir[256];

static void setup(void)
{
	tu_mkdtemp(dir, sizeof dir, "moe_dict");
}

static void teardown(void)
{
	tu_rm_tree(dir);
}

TestSuite(moe_dict, .init = setup, .fini = teardown, .timeout = 20);

static const char *in_dir(const char *name)
{
	static char p[320];
	snprintf(p, sizeof p, "%s/%s", dir, name);
	return p;
}

static int count_files(void)
{
	DIR *dd = opendir(dir);
	struct dirent *e;
	int n = 0;

	while ((e = readdir(dd)))
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(dd);
	return n;
}

/* A dictionary of n buckets with keys 3i + 2 (caller frees e). */
static void make_dict(struct moe_dict *d, size_t n)
{
	memset(d, 0, sizeof *d);
	snprintf(d->machine, sizeof d->machine, "AMD EPYC 9654\t96 cores  host-a (caf\xc3\xa9)");
	d->W = 8;
	d->local_size = 4;
	d->E = 16;
	d->k = 2;
	d->M = 1024;
	d->H = 4096;
	d->T = 8192;
	d->R = 128;
	d->n = n;
	d->e = calloc(n, sizeof *d->e);
	for (size_t i = 0; i < n; i++) {
		d->e[i].key = 3 * (int64_t)i + 2;
		d->e[i].plan = (struct moe_plan){.r = (int)(i % 3), .d = 1 << (i % 4),
						 .a = (enum dist_a2a)(i % 3)};
		d->e[i].seconds = (double)(i + 1) / 3.0;
	}
}

static void assert_equal(const struct moe_dict *a, const struct moe_dict *b)
{
	cr_assert_str_eq(a->machine, b->machine);
	cr_assert(a->W == b->W && a->local_size == b->local_size && a->E == b->E && a->k == b->k);
	cr_assert(a->M == b->M && a->H == b->H && a->T == b->T && a->R == b->R);
	cr_assert_eq(a->n, b->n);
	for (size_t i = 0; i < a->n; i++) {
		const struct moe_dict_entry *x = &a->e[i], *y = &b->e[i];
		cr_assert(x->key == y->key && x->plan.r == y->plan.r && x->plan.d == y->plan.d &&
			  x->plan.a == y->plan.a, "entry %zu differs", i);
		cr_assert(x->seconds == y->seconds, "entry %zu: %.17g read back as %.17g", i,
			  x->seconds, y->seconds);
	}
}

/* ---- write -> read ------------------------------------------------------------------------ */

Test(moe_dict, write_then_read_gives_it_back)
{
	static const double awkward[] = {0.1, 1.0 / 3.0, 1e-300, 4.9406564584124654e-324,
					 DBL_MAX, 123456.789, 2.2250738585072014e-308};
	const size_t n = sizeof awkward / sizeof awkward[0] + 2;
	struct moe_dict d, back;
	size_t len;

	make_dict(&d, n);
	for (size_t i = 0; i + 2 < n; i++)
		d.e[i].seconds = awkward[i];
	d.e[0].key = 0;
	d.e[n - 1].key = (int64_t)1 << 53;
	d.e[n - 1].plan.r = 2147483647;
	cr_assert_eq(moe_dict_write(in_dir("d.txt"), &d), 0, "%s", err_detail());
	cr_assert_eq(moe_dict_read(in_dir("d.txt"), &back), 0, "%s", err_detail());
	assert_equal(&d, &back);
	char *text = tu_slurp(in_dir("d.txt"), &len);
	cr_assert(!strncmp(text, "moe-dict 1\n#", 12), "first lines: %.40s", text);
	cr_assert(strstr(text, "\nbucket 0 0 1 linear 0.10000000000000001\n"), "%s", text);
	free(text);
	cr_assert_eq(count_files(), 1, "a temporary file was left");
	moe_dict_free(&back);
	cr_assert(back.e == NULL && back.n == 0);
	free(d.e);
}

Test(moe_dict, reads_comments_blanks_tabs_and_a_last_line_without_newline)
{
	static const char text[] =
		"moe-dict 1   # magic\n"
		"\n"
		"# a comment\n"
		"  machine \t Xeon  #2   \t # the '#' starts a comment\n"
		"world\t2\nlocal-size 1\nexperts 4\nmodel-dim 8\nhidden-dim 16\ntop-k 4\n"
		"tokens 1\nwindow 1\n"
		"bucket 0 0 1 mpi 1e-3\n"
		"\tbucket  7 1 8 2dh +2.5E1   # trailing\n"
		"bucket 9 1 2 linear .5";
	struct moe_dict d;

	cr_assert_eq(moe_dict_parse(text, sizeof text - 1, "d.txt", &d), 0, "%s", err_detail());
	cr_assert_str_eq(d.machine, "Xeon");
	cr_assert(d.W == 2 && d.local_size == 1 && d.E == 4 && d.M == 8 && d.H == 16 &&
		  d.k == 4 && d.T == 1 && d.R == 1);
	cr_assert_eq(d.n, 3);
	cr_assert(d.e[0].key == 0 && d.e[0].plan.a == DIST_A2A_MPI && d.e[0].seconds == 1e-3);
	cr_assert(d.e[1].key == 7 && d.e[1].plan.r == 1 && d.e[1].plan.d == 8 &&
		  d.e[1].plan.a == DIST_A2A_2DH && d.e[1].seconds == 25.0);
	cr_assert(d.e[2].plan.a == DIST_A2A_LINEAR && d.e[2].seconds == 0.5);
	moe_dict_free(&d);
}

/* The numbers are C's whatever LC_NUMERIC the program chose. */
Test(moe_dict, numbers_ignore_the_locale)
{
	static const char *const comma[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8",
					    "fr_FR.utf8", "ru_RU.UTF-8"};
	struct moe_dict d, back;
	size_t i, len;

	for (i = 0; i < sizeof comma / sizeof comma[0]; i++)
		if (setlocale(LC_NUMERIC, comma[i]))
			break;
	if (i == sizeof comma / sizeof comma[0])
		cr_skip_test("no locale with a decimal comma is installed");
	make_dict(&d, 3);
	cr_assert_eq(moe_dict_write(in_dir("d.txt"), &d), 0, "%s", err_detail());
	char *text = tu_slurp(in_dir("d.txt"), &len);
	cr_assert(strstr(text, " 0.33333333333333331\n"), "%s", text);
	cr_assert_eq(moe_dict_read(in_dir("d.txt"), &back), 0, "%s", err_detail());
	assert_equal(&d, &back);
	setlocale(LC_NUMERIC, "C");
	moe_dict_free(&back);
	free(text);
	free(d.e);
}

/* ---- the rules of the format ---------------------------------------------------------------- */

/* A valid file up to its buckets (lines 1 to 11); KEYS replaces that part when a rule is about
 * the header. */
#define HEAD "moe-dict 1\nmachine test box\nworld 4\nlocal-size 2\nexperts 8\nmodel-dim 64\n" \
	"hidden-dim 256\ntop-k 2\ntokens 512\nwindow 128\n# buckets\n"
#define B "bucket 0 1 1 linear 0.5\n"

static const struct rule {
	const char *text; /* NULL: the line-length cases, built by the test */
	int code;
	const char *detail; /* the whole detail */
} rules[] = {
	/* line 1 */
	{"", CORE_EFORMAT, "line 1: not a moe-dict file (expected 'moe-dict 1')"},
	{"\n" HEAD B, CORE_EFORMAT, "line 1: not a moe-dict file (expected 'moe-dict 1')"},
	{"# moe-dict 1\n", CORE_EFORMAT, "line 1: not a moe-dict file (expected 'moe-dict 1')"},
	{"moe-dictionary 1\n", CORE_EFORMAT, "line 1: not a moe-dict file (expected 'moe-dict 1')"},
	{"moe-dict\n", CORE_EFORMAT, "line 1: not a moe-dict file (expected 'moe-dict 1')"},
	{"moe-dict 2\n", CORE_EVERSION, "line 1: version 2 is newer than this build reads (1)"},
	{"moe-dict 0\n", CORE_EFORMAT, "line 1: version 0 does not exist (this build reads 1)"},
	{"moe-dict 01\n", CORE_EFORMAT, "line 1: version has a leading zero ('01')"},
	{"moe-dict 1.0\n", CORE_EFORMAT, "line 1: version is not an integer ('1.0')"},
	{"moe-dict 1 x\n", CORE_EFORMAT, "line 1: 'x' after the version"},
	/* bytes and lines */
	{"moe-dict 1\nmachine a\x01 b\n", CORE_EFORMAT, "line 2: control character 0x01"},
	{"moe-dict 1\nmachine a\x7f\n", CORE_EFORMAT, "line 2: control character 0x7f"},
	{"moe-dict 1\n# a\0b\n", CORE_EFORMAT, "line 2: control character 0x00"},
	{"moe-dict 1\r\n", CORE_EFORMAT, "line 1: carriage return (lines end with a newline "
					 "alone)"},
	/* keys */
	{"moe-dict 1\nmachine x\nwolrd 4\n", CORE_EFORMAT, "line 3: unknown key 'wolrd' (did you "
							 "mean 'world'?)"},
	{"moe-dict 1\nbuckets 0 1 1 linear 1\n", CORE_EFORMAT, "line 2: unknown key 'buckets' "
							       "(did you mean 'bucket'?)"},
	{"moe-dict 1\nfrobnicate 1\n", CORE_EFORMAT, "line 2: unknown key 'frobnicate'"},
	{"moe-dict 1\nworld 4\n\nworld 4\n", CORE_EFORMAT, "line 4: world again (first on line 2)"},
	{HEAD B "world 4\n", CORE_EFORMAT, "line 13: world after the first bucket (line 12): the "
					   "header comes first"},
	{"moe-dict 1\nmachine x\nworld 4\nlocal-size 2\nexperts 8\nmodel-dim 64\nhidden-dim 256\n"
	 "top-k 2\ntokens 512\n", CORE_EFORMAT, "missing key 'window'"},
	{"moe-dict 1\nworld 4\nlocal-size 2\nexperts 8\nmodel-dim 64\nhidden-dim 256\n"
	 "top-k 2\ntokens 512\nwindow 1\n" B, CORE_EFORMAT, "line 10: missing key 'machine' "
							 "before the first bucket"},
	{HEAD, CORE_EFORMAT, "no buckets"},
	{"moe-dict 1\nmachine\n", CORE_EFORMAT, "line 2: machine needs a value"},
	{"moe-dict 1\nmachine  # a comment only\n", CORE_EFORMAT, "line 2: machine needs a value"},
	{"moe-dict 1\nworld\n", CORE_EFORMAT, "line 2: world needs a value"},
	{"moe-dict 1\nworld 4 4\n", CORE_EFORMAT, "line 2: world takes one value"},
	/* integers */
	{"moe-dict 1\nworld four\n", CORE_EFORMAT, "line 2: world is not an integer ('four')"},
	{"moe-dict 1\nworld 4.0\n", CORE_EFORMAT, "line 2: world is not an integer ('4.0')"},
	{"moe-dict 1\nworld 0x4\n", CORE_EFORMAT, "line 2: world is not an integer ('0x4')"},
	{"moe-dict 1\nworld +4\n", CORE_EFORMAT, "line 2: world has a sign ('+4'): integers are "
						 "written without one"},
	{"moe-dict 1\nworld 04\n", CORE_EFORMAT, "line 2: world has a leading zero ('04')"},
	{"moe-dict 1\nworld 0\n", CORE_EFORMAT, "line 2: world 0 is less than 1"},
	{"moe-dict 1\nworld 2147483648\n", CORE_EFORMAT, "line 2: world 2147483648 is more than "
							 "2147483647"},
	{"moe-dict 1\ntokens 9007199254740993\n", CORE_EFORMAT, "line 2: tokens 9007199254740993 "
								"is more than 2^53"},
	{"moe-dict 1\ntokens 99999999999999999999\n", CORE_EFORMAT, "line 2: tokens "
								    "99999999999999999999 is more than 2^53"},
	/* relations */
	{"moe-dict 1\nmachine x\nworld 4\nlocal-size 3\nexperts 8\nmodel-dim 64\nhidden-dim 256\n"
	 "top-k 2\ntokens 512\nwindow 128\n" B, CORE_EFORMAT,
	 "line 4: local-size 3 does not divide world 4"},
	{"moe-dict 1\nmachine x\nworld 4\nlocal-size 2\ntop-k 9\nexperts 8\nmodel-dim 64\n"
	 "hidden-dim 256\ntokens 512\nwindow 128\n", CORE_EFORMAT,
	 "line 5: top-k 9 is more than experts 8"},
	/* buckets */
	{HEAD "bucket 5 1 1 linear 1\nbucket 3 1 1 linear 1\n", CORE_EFORMAT,
	 "line 13: bucket 3 after bucket 5"},
	{HEAD "bucket 5 1 1 linear 1\n# again\nbucket 5 1 1 linear 1\n", CORE_EFORMAT,
	 "line 14: bucket 5 twice (also on line 12)"},
	{HEAD "bucket 0 1 1 linear\n", CORE_EFORMAT, "line 12: bucket takes 5 values (KEY r d a "
						     "SECONDS), not 4"},
	{HEAD "bucket 0 1 1 linear 1 2\n", CORE_EFORMAT, "line 12: bucket takes 5 values (KEY r d "
							 "a SECONDS), not 6"},
	{HEAD "bucket -1 1 1 linear 1\n", CORE_EFORMAT, "line 12: bucket key has a sign ('-1'): "
							"integers are written without one"},
	{HEAD "bucket 9007199254740993 1 1 linear 1\n", CORE_EFORMAT,
	 "line 12: bucket key 9007199254740993 is more than 2^53"},
	{HEAD "bucket 0 1.5 1 linear 1\n", CORE_EFORMAT, "line 12: r is not an integer ('1.5')"},
	{HEAD "bucket 0 2147483648 1 linear 1\n", CORE_EFORMAT, "line 12: r 2147483648 is more "
								"than 2147483647"},
	{HEAD "bucket 0 1 3 linear 1\n", CORE_EFORMAT, "line 12: d is 3, not 1, 2, 4 or 8"},
	{HEAD "bucket 0 1 0 linear 1\n", CORE_EFORMAT, "line 12: d is 0, not 1, 2, 4 or 8"},
	{HEAD "bucket 0 1 16 linear 1\n", CORE_EFORMAT, "line 12: d is 16, not 1, 2, 4 or 8"},
	{HEAD "bucket 0 1 1 ring 1\n", CORE_EFORMAT, "line 12: a is 'ring', not linear, 2dh or mpi"},
	{HEAD "bucket 0 1 1 Linear 1\n", CORE_EFORMAT, "line 12: a is 'Linear', not linear, 2dh or "
						       "mpi"},
	/* seconds */
	{HEAD "bucket 0 1 1 linear 0\n", CORE_EFORMAT, "line 12: seconds is not more than 0 ('0')"},
	{HEAD "bucket 0 1 1 linear -1.5\n", CORE_EFORMAT, "line 12: seconds is not more than 0 "
							  "('-1.5')"},
	{HEAD "bucket 0 1 1 linear 1e-400\n", CORE_EFORMAT, "line 12: seconds is not more than 0 "
							    "('1e-400')"},
	{HEAD "bucket 0 1 1 linear 1e999\n", CORE_EFORMAT, "line 12: seconds is not finite "
							   "('1e999')"},
	{HEAD "bucket 0 1 1 linear inf\n", CORE_EFORMAT, "line 12: seconds is not a decimal number "
							 "('inf')"},
	{HEAD "bucket 0 1 1 linear nan\n", CORE_EFORMAT, "line 12: seconds is not a decimal number "
							 "('nan')"},
	{HEAD "bucket 0 1 1 linear 0x1p-3\n", CORE_EFORMAT, "line 12: seconds is not a decimal "
							    "number ('0x1p-3')"},
	{HEAD "bucket 0 1 1 linear 1e\n", CORE_EFORMAT, "line 12: seconds is not a decimal number "
							"('1e')"},
	{HEAD "bucket 0 1 1 linear .\n", CORE_EFORMAT, "line 12: seconds is not a decimal number "
						       "('.')"},
	{HEAD "bucket 0 1 1 linear 1,5\n", CORE_EFORMAT, "line 12: seconds is not a decimal number "
							 "('1,5')"},
	{NULL, CORE_EFORMAT, "line 12: longer than 4096 bytes"},
};

Test(moe_dict, every_rule_is_refused_naming_the_line)
{
	char msg[1200], want[1200];

	for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
		const struct rule *r = &rules[i];
		struct moe_dict d;
		char *text = NULL;
		size_t n;

		if (r->text) {
			n = strlen(r->text);
			/* the NUL byte case: its text goes on past the NUL */
			if (strstr(r->detail, "0x00"))
				n += strlen(r->text + n + 1) + 1;
			text = malloc(n + 1);
			memcpy(text, r->text, n + 1);
		} else {
			/* a comment line of 4097 bytes */
			n = strlen(HEAD) + 4097 + 1 + strlen(B);
			text = malloc(n + 1);
			memcpy(text, HEAD, strlen(HEAD));
			memset(text + strlen(HEAD), '#', 4097);
			memcpy(text + strlen(HEAD) + 4097, "\n" B, strlen(B) + 2);
		}
		memset(&d, 0xff, sizeof d);
		int rc = moe_dict_parse(text, n, "d.txt", &d);
		err_format(msg, sizeof msg, rc);
		snprintf(want, sizeof want, "'d.txt': %s", r->detail);
		cr_expect_eq(rc, r->code, "case %zu: rc %d, not %d: %s", i, rc, r->code, msg);
		cr_expect_str_eq(msg, want, "case %zu: %s", i, msg);
		cr_expect(d.e == NULL && d.n == 0, "case %zu: the dictionary is not empty", i);
		free(text);
	}
}

/* A line of exactly 4096 bytes is not too long; a parse stops at n, not at a NUL. */
Test(moe_dict, line_length_limit_and_buffer_end)
{
	size_t h = strlen(HEAD), n = h + 4096 + 1 + strlen(B);
	char *text = malloc(n + 8);
	struct moe_dict d;

	memcpy(text, HEAD, h);
	memset(text + h, '#', 4096);
	memcpy(text + h + 4096, "\n" B, strlen(B) + 1);
	memcpy(text + n, "garbage", 8);
	cr_assert_eq(moe_dict_parse(text, n, NULL, &d), 0, "%s", err_detail());
	cr_assert_eq(d.n, 1);
	moe_dict_free(&d);
	free(text);
}

Test(moe_dict, machine_text_longer_than_511_bytes_is_refused)
{
	char text[1024], msg[1200];
	struct moe_dict d;
	int k = snprintf(text, sizeof text, "moe-dict 1\nmachine ");

	memset(text + k, 'x', 511);
	snprintf(text + k + 511, sizeof text - (size_t)k - 511, "\n%s", &HEAD[11]);
	cr_assert_eq(moe_dict_parse(text, strlen(text), "d.txt", &d), CORE_EFORMAT);
	err_format(msg, sizeof msg, CORE_EFORMAT);
	cr_assert(strstr(msg, "line 3: machine again"), "%s", msg); /* 511 fit */
	memset(text + k, 'x', 512);
	snprintf(text + k + 512, sizeof text - (size_t)k - 512, "\nworld 1\n");
	cr_assert_eq(moe_dict_parse(text, strlen(text), "d.txt", &d), CORE_EFORMAT);
	cr_assert_str_eq(err_detail(), "line 2: machine text is longer than 511 bytes");
}

Test(moe_dict, read_names_the_file)
{
	struct moe_dict d;
	FILE *fp = fopen(in_dir("bad.txt"), "w");

	cr_assert(fp);
	fputs("moe-dict 1\nworld 4\nworld 4\n", fp);
	fclose(fp);
	cr_assert_eq(moe_dict_read(in_dir("bad.txt"), &d), CORE_EFORMAT);
	cr_assert_str_eq(err_file(), in_dir("bad.txt"));
	cr_assert_str_eq(err_detail(), "line 3: world again (first on line 2)");
	cr_assert_eq(moe_dict_read(in_dir("none.txt"), &d), CORE_EIO);
	cr_assert_str_eq(err_file(), in_dir("none.txt"));
	cr_assert(d.e == NULL && d.n == 0);
}

/* ---- lookup ---------------------------------------------------------------------------------- */

Test(moe_dict, lookup_exact_nearest_and_outside)
{
	struct moe_dict d;
	int exact;

	make_dict(&d, 4); /* keys 2 5 8 11, R = 128 */
	d.e[3].key = 12;  /* keys 2 5 8 12 */
	static const struct {
		int64_t C, key;
		int exact;
	} cases[] = {
		{2 * 128, 2, 1},   {5 * 128 + 127, 5, 1}, {8 * 128 + 1, 8, 1}, {12 * 128, 12, 1},
		{3 * 128, 2, 0},   /* 3: 2 is nearer than 5 */
		{4 * 128 + 127, 5, 0}, /* 4: 5 is nearer */
		{10 * 128, 8, 0},  /* 10: 8 and 12 as near: the lower */
		{11 * 128, 12, 0}, /* 11: 12 is nearer */
		{0, 2, 0},         {127, 2, 0},          {-1, 2, 0},          {INT64_MIN, 2, 0},
		{13 * 128, 12, 0}, {INT64_MAX, 12, 0},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		exact = -1;
		const struct moe_dict_entry *e = moe_dict_lookup(&d, cases[i].C, &exact);
		cr_assert(e, "C=%lld: no entry", (long long)cases[i].C);
		cr_expect_eq(e->key, cases[i].key, "C=%lld: key %lld, not %lld",
			     (long long)cases[i].C, (long long)e->key, (long long)cases[i].key);
		cr_expect_eq(exact, cases[i].exact, "C=%lld: exact %d", (long long)cases[i].C, exact);
	}
	/* One bucket answers everything; exact may be NULL. */
	d.n = 1;
	d.R = 1;
	cr_assert_eq(moe_dict_lookup(&d, 2, NULL), &d.e[0]);
	cr_assert_eq(moe_dict_lookup(&d, 1000, &exact), &d.e[0]);
	cr_assert_eq(exact, 0);
	free(d.e);
}

/* ---- check against a run --------------------------------------------------------------------- */

Test(moe_dict, check_names_the_first_field_that_differs)
{
	static const struct {
		int W, E;
		int64_t M, H;
		int k;
		const char *msg;
	} cases[] = {
		{2, 16, 1024, 4096, 2, "'d.txt': measured for W=8 ranks, this run has W=2"},
		{8, 4, 1024, 4096, 2, "'d.txt': measured for E=16 experts, this run has E=4"},
		{8, 16, 512, 4096, 2, "'d.txt': measured for model dim M=1024, this run has M=512"},
		{8, 16, 1024, 2048, 2, "'d.txt': measured for hidden dim H=4096, this run has "
				       "H=2048"},
		{8, 16, 1024, 4096, 1, "'d.txt': measured for top-k k=2, this run has k=1"},
		{1, 1, 1, 1, 1, "'d.txt': measured for W=8 ranks, this run has W=1"},
	};
	struct moe_dict d;
	char msg[1200];

	make_dict(&d, 1);
	cr_assert_eq(moe_dict_check(&d, "d.txt", 8, 16, 1024, 4096, 2), 0);
	/* what it does not check */
	d.local_size = 1;
	d.T = 1;
	cr_assert_eq(moe_dict_check(&d, "d.txt", 8, 16, 1024, 4096, 2), 0);
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		int rc = moe_dict_check(&d, "d.txt", cases[i].W, cases[i].E, cases[i].M, cases[i].H,
					cases[i].k);
		err_format(msg, sizeof msg, rc);
		cr_expect_eq(rc, CORE_EUSAGE, "case %zu", i);
		cr_expect_str_eq(msg, cases[i].msg, "case %zu", i);
	}
	free(d.e);
}

/* ---- the writer's refusals and failures ------------------------------------------------------- */

Test(moe_dict, write_refuses_what_would_not_read_back)
{
	static const struct {
		const char *machine; /* NULL: keep */
		int what;            /* which value to spoil (below) */
		const char *detail;
	} cases[] = {
		{"a\nb", 0, "machine text holds control character 0x0a"},
		{"a\x1b[2Jb", 0, "machine text holds control character 0x1b"},
		{"a\rb", 0, "machine text holds control character 0x0d"},
		{"host #3", 0, "machine text holds '#', which starts a comment"},
		{" host", 0, "machine text starts or ends with a blank"},
		{"host\t", 0, "machine text starts or ends with a blank"},
		{"", 0, "machine text is empty"},
		{NULL, 1, "bucket 2: key 4 after key 5 (keys increase)"},
		{NULL, 2, "bucket 1: key 5 after key 5 (keys increase)"},
		{NULL, 3, "bucket 0: d is 3, not 1, 2, 4 or 8"},
		{NULL, 4, "bucket 1: a is 7, not an all-to-all algorithm"},
		{NULL, 5, "bucket 2: seconds nan is not a finite number above 0"},
		{NULL, 6, "bucket 0: seconds 0 is not a finite number above 0"},
		{NULL, 7, "local-size 3 does not divide world 8"},
		{NULL, 8, "top-k 17 is more than experts 16"},
		{NULL, 9, "no buckets"},
		{NULL, 10, "window 0 is outside 1..9007199254740992"},
		{NULL, 11, "bucket 0: r -1 is less than 0"},
		{NULL, 12, "bucket 3: key 9007199254740993 is outside 0..2^53"},
		{NULL, 13, "machine text is not terminated within 512 bytes"},
	};
	char msg[1200], want[1200];

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		struct moe_dict d;
		make_dict(&d, 4); /* keys 2 5 8 11 */
		if (cases[i].machine)
			snprintf(d.machine, sizeof d.machine, "%s", cases[i].machine);
		switch (cases[i].what) {
		case 1: d.e[2].key = 4; break;
		case 2: d.e[0].key = 5; break;
		case 3: d.e[0].plan.d = 3; break;
		case 4: d.e[1].plan.a = (enum dist_a2a)7; break;
		case 5: d.e[2].seconds = NAN; break;
		case 6: d.e[0].seconds = 0; break;
		case 7: d.local_size = 3; break;
		case 8: d.k = 17; break;
		case 9: d.n = 0; break;
		case 10: d.R = 0; break;
		case 11: d.e[0].plan.r = -1; break;
		case 12: d.e[3].key = ((int64_t)1 << 53) + 1; break;
		case 13: memset(d.machine, 'x', sizeof d.machine); break;
		}
		int rc = moe_dict_write(in_dir("d.txt"), &d);
		err_format(msg, sizeof msg, rc);
		snprintf(want, sizeof want, "'%s': %s", in_dir("d.txt"), cases[i].detail);
		cr_expect_eq(rc, CORE_EUSAGE, "case %zu: %s", i, msg);
		cr_expect_str_eq(msg, want, "case %zu: %s", i, msg);
		cr_expect_eq(access(in_dir("d.txt"), F_OK), -1, "case %zu wrote a file", i);
		free(d.e);
	}
}

Test(moe_dict, write_into_a_missing_directory_fails_naming_the_file)
{
	struct moe_dict d;
	char path[320];

	make_dict(&d, 2);
	snprintf(path, sizeof path, "%s/no/such/dir/d.txt", dir);
	int rc = moe_dict_write(path, &d);
	cr_assert_eq(rc, CORE_EIO, "rc %d: %s", rc, err_detail());
	cr_assert_str_eq(err_file(), path);
	cr_assert_eq(count_files(), 0);
	free(d.e);
}

/* A write that fails (here: past RLIMIT_FSIZE, which binds root too) leaves the old file as it
 * was and no temporary file. */
Test(moe_dict, a_failed_write_leaves_the_old_file)
{
	struct moe_dict d;
	size_t n0, n1;

	make_dict(&d, 2);
	cr_assert_eq(moe_dict_write(in_dir("d.txt"), &d), 0, "%s", err_detail());
	char *before = tu_slurp(in_dir("d.txt"), &n0);
	free(d.e);
	make_dict(&d, 5000);
	signal(SIGXFSZ, SIG_IGN); /* a write past the limit fails with EFBIG instead */
	struct rlimit rl = {4096, 4096};
	cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
	int rc = moe_dict_write(in_dir("d.txt"), &d);
	cr_assert_eq(rc, CORE_EIO, "rc %d: %s", rc, err_detail());
	cr_assert_str_eq(err_file(), in_dir("d.txt"));
	char *after = tu_slurp(in_dir("d.txt"), &n1);
	cr_assert(n0 == n1 && !memcmp(before, after, n0), "the old file was changed");
	cr_assert_eq(count_files(), 1, "a temporary file was left");
	free(before);
	free(after);
	free(d.e);
}
