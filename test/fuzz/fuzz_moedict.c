/* fuzz_moedict.c - the strategy dictionary reader and writer (lib/moe/moe_dict.c,
 * moe-dict(5)).
 *
 * Each input is read twice: from a file (moe_dict_read) and from a buffer of exactly its
 * bytes (moe_dict_parse, so that a parser reading past its end, or stopping at a NUL byte,
 * is caught by the sanitizers or by the two disagreeing). Both must give the same result. A
 * failure must keep the error contract naming the input. An accepted dictionary must keep
 * the format's invariants (header values in range and related, keys increasing, plans
 * valid, times finite and positive), must be written back by moe_dict_write and read again
 * equal, pass moe_dict_check against its own shape, and look up each of its keys exactly.
 * Seeds: corpus/moedict. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "common/err.h"
#include "moe/moe_dict.h"
#include "common/banned.h"

static void same(const struct moe_dict *a, const struct moe_dict *b, const char *what)
{
	if (strcmp(a->machine, b->machine))
		fuzz_fail("%s: machine '%s', not '%s'", what, b->machine, a->machine);
	if (a->W != b->W || a->local_size != b->local_size || a->E != b->E || a->k != b->k ||
	    a->M != b->M || a->H != b->H || a->T != b->T || a->R != b->R)
		fuzz_fail("%s: the header differs", what);
	if (a->n != b->n)
		fuzz_fail("%s: %zu buckets, not %zu", what, b->n, a->n);
	for (size_t i = 0; i < a->n; i++) {
		const struct moe_dict_entry *x = &a->e[i], *y = &b->e[i];
		if (x->key != y->key || x->plan.r != y->plan.r || x->plan.d != y->plan.d ||
		    x->plan.a != y->plan.a || x->seconds != y->seconds)
			fuzz_fail("%s: bucket %zu differs (key %lld, %.17g s; key %lld, %.17g s)", what,
				  i, (long long)x->key, x->seconds, (long long)y->key, y->seconds);
	}
}

static void invariants(const struct moe_dict *d)
{
	const int64_t max = (int64_t)1 << 53;

	if (!d->machine[0] || strlen(d->machine) >= sizeof d->machine)
		fuzz_fail("accepted a machine text of %zu bytes", strlen(d->machine));
	if (d->W < 1 || d->local_size < 1 || d->W % d->local_size || d->E < 1 || d->k < 1 ||
	    d->k > d->E)
		fuzz_fail("accepted W=%d local-size=%d E=%d k=%d", d->W, d->local_size, d->E, d->k);
	if (d->M < 1 || d->H < 1 || d->T < 1 || d->R < 1 || d->M > max || d->H > max ||
	    d->T > max || d->R > max)
		fuzz_fail("accepted M=%lld H=%lld T=%lld R=%lld", (long long)d->M, (long long)d->H,
			  (long long)d->T, (long long)d->R);
	if (d->n < 1 || !d->e)
		fuzz_fail("accepted a dictionary without buckets");
	for (size_t i = 0; i < d->n; i++) {
		const struct moe_dict_entry *e = &d->e[i];
		if (e->key < 0 || e->key > max || (i && e->key <= e[-1].key))
			fuzz_fail("accepted bucket %zu with key %lld", i, (long long)e->key);
		if (e->plan.r < 0 || (e->plan.d != 1 && e->plan.d != 2 && e->plan.d != 4 &&
				      e->plan.d != 8) || (unsigned)e->plan.a > DIST_A2A_MPI)
			fuzz_fail("accepted bucket %zu with plan r=%d d=%d a=%d", i, e->plan.r,
				  e->plan.d, (int)e->plan.a);
		if (!isfinite(e->seconds) || !(e->seconds > 0))
			fuzz_fail("accepted bucket %zu with %g seconds", i, e->seconds);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *path = fuzz_write("dict.txt", data, size);
	struct moe_dict d, p, back;
	int rc, rp;
	/* the exact bytes, in a buffer of their own (libFuzzer's may be followed by more) */
	char *buf = malloc(size ? size : 1);

	if (!buf)
		fuzz_fail("out of memory");
	memcpy(buf, data, size);
	rp = moe_dict_parse(buf, size, path, &p);
	free(buf);
	if (rp)
		fuzz_check_error("moe_dict_parse", rp, path);
	if ((rc = moe_dict_read(path, &d)) != 0) {
		fuzz_check_error("moe_dict_read", rc, path);
		if (rp != rc)
			fuzz_fail("moe_dict_read gave %d, moe_dict_parse %d", rc, rp);
		return 0;
	}
	if (rp)
		fuzz_fail("moe_dict_read accepted what moe_dict_parse refused (%d)", rp);
	same(&d, &p, "parse");
	moe_dict_free(&p);
	invariants(&d);
	if ((rc = moe_dict_check(&d, path, d.W, d.E, d.M, d.H, d.k)) != 0)
		fuzz_fail("moe_dict_check refused its own shape (%d)", rc);
	for (size_t i = 0; i < d.n && d.e[i].key <= INT64_MAX / d.R; i++) {
		int exact = 0;
		const struct moe_dict_entry *e = moe_dict_lookup(&d, d.e[i].key * d.R, &exact);
		if (e != &d.e[i] || !exact)
			fuzz_fail("lookup of bucket %lld found another", (long long)d.e[i].key);
	}
	const char *out = fuzz_path("dict-out.txt");
	if ((rc = moe_dict_write(out, &d)) != 0)
		fuzz_fail("moe_dict_write refused what moe_dict_read accepted (%d): %s", rc,
			  err_detail());
	if ((rc = moe_dict_read(out, &back)) != 0)
		fuzz_fail("cannot read back what moe_dict_write wrote (%d): %s", rc, err_detail());
	same(&d, &back, "write -> read");
	moe_dict_free(&back);
	moe_dict_free(&d);
	fuzz_ok();
	return 0;
}
