/* fuzz_routefile.c - the routing layer's files (lib/route/routefile.c, dpc-route(5)): a
 * features file, a router (kmeans, logreg, window) and a scores file, each a safetensors file
 * whose metadata must agree with its tensors.
 *
 * Each input, with its crc keys recomputed first (fuzz_fix_st_crcs) so that mutations reach
 * the metadata and shape checks, is read as all three. A failure must keep the error contract
 * naming the input; an accepted file must hold what its metadata says: finite values, shapes
 * from its counts, a router's kind known, positive standard deviations, and routing a row
 * must give paths in range. Each input is also opened as a transformer window router
 * (lib/route/wrouter.h: a dpc-checkpoint whose metadata names the router and a head over
 * its paths, loaded on the ref backend): accepted, its counts are in range and its model's
 * head has a row per path. Seeds: corpus/routefile. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "backend/backend.h"
#include "route/routefile.h"
#include "route/wrouter.h"
#include "common/banned.h"

static void all_finite(const float *x, size_t n, const char *what)
{
	for (size_t i = 0; i < n; i++)
		if (!isfinite(x[i]))
			fuzz_fail("accepted a non-finite %s at %zu", what, i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t fixed_size = 0;
	uint8_t *fixed = fuzz_fix_st_crcs(data, size, &fixed_size);
	const char *path = fixed ? fuzz_write("route.st", fixed, fixed_size)
				 : fuzz_write("route.st", data, size);
	struct features f;
	struct router r;
	struct scores s;
	int rc;

	free(fixed);
	if ((rc = features_read(path, &f)) != 0) {
		fuzz_check_error("features_read", rc, path);
	} else {
		if (f.docs < 1 || f.dim < 1 || f.r.prefix < 1 || f.r.layer < 0)
			fuzz_fail("accepted features of %llu x %d", (unsigned long long)f.docs, f.dim);
		all_finite(f.x, (size_t)f.docs * (size_t)f.dim, "feature");
		features_free(&f);
	}
	if ((rc = router_read(path, &r)) != 0) {
		fuzz_check_error("router_read", rc, path);
	} else {
		if (r.paths < 1 || r.dim < 1 || (int)r.kind < 0 || r.kind > ROUTER_WINDOW)
			fuzz_fail("accepted a router of %d paths, %d features", r.paths, r.dim);
		if (r.kind == ROUTER_WINDOW && (r.window < 1 || r.context < 1))
			fuzz_fail("accepted a window router with window %d context %d", r.window,
				  r.context);
		if (r.kind != ROUTER_KMEANS)
			for (int i = 0; i < r.dim; i++)
				if (!(r.lr.sd[i] > 0))
					fuzz_fail("accepted std %g", (double)r.lr.sd[i]);
		float *row = calloc((size_t)r.dim, sizeof *row);
		uint32_t top[2] = {0, 0};
		if (!row)
			fuzz_fail("out of memory");
		router_route(&r, row, r.paths > 1 ? 2 : 1, top);
		if (top[0] >= (uint32_t)r.paths || top[1] >= (uint32_t)r.paths)
			fuzz_fail("routed to path %u / %u of %d", top[0], top[1], r.paths);
		free(row);
		router_free(&r);
	}
	static struct backend *be;
	struct wrouter w;
	if (!be && backend_open(&be, "ref", &(struct backend_params){.threads = 1}) < 0)
		fuzz_fail("cannot open the ref backend");
	if ((rc = wrouter_open(&w, path, be)) != 0) {
		fuzz_check_error("wrouter_open", rc, path);
	} else {
		if (w.paths < 1 || w.window < 1 || w.target_len < 1 || w.prefix < 0 ||
		    model_n_out(&w.g.cfg) != w.paths)
			fuzz_fail("accepted a transformer router of %d paths (head %d), window %d, "
				  "target %d, prefix %d", w.paths, model_n_out(&w.g.cfg), w.window,
				  w.target_len, w.prefix);
		wrouter_close(&w);
	}
	if ((rc = scores_read(path, &s)) != 0) {
		fuzz_check_error("scores_read", rc, path);
	} else {
		if (s.docs < 1 || s.paths < 1)
			fuzz_fail("accepted scores of %llu docs, %d paths",
				  (unsigned long long)s.docs, s.paths);
		all_finite(s.doc, (size_t)s.docs * (size_t)s.paths, "document score");
		all_finite(s.logprob, (size_t)s.tokens * (size_t)s.paths, "token score");
		scores_free(&s);
	}
	fuzz_ok();
	return 0;
}
