/* fuzz_manifest.c - the shard manifest of a DiPaCo run directory (RUNDIR/shards/shards.json,
 * dpc-rundir(5)), read by shard_manifest_read (lib/io/shardsplit.c, its one reader) through
 * rundir_open with a fixed, valid config.yaml of 4 paths, which also checks the count.
 *
 * A failure must keep the error contract naming the manifest. An accepted manifest gives
 * one token count of at least 2 per path. Seeds: corpus/manifest. */
#include <string.h>

#include "harness.h"
#include "dipaco/rundir.h"
#include "common/banned.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *dir;
	struct rundir r;
	int rc;

	if (!dir) {
		fuzz_write("run/config.yaml", fuzz_levels_yaml, strlen(fuzz_levels_yaml));
		dir = fuzz_path("run");
	}
	const char *path = fuzz_write("run/shards/shards.json", data, size);
	if ((rc = rundir_open(&r, dir, 1)) != 0) {
		fuzz_check_error("rundir_open", rc, path);
		return 0;
	}
	if (!r.have_shards || r.topo.npaths != 4)
		fuzz_fail("accepted a manifest without shards for the 4 paths");
	for (int p = 0; p < r.topo.npaths; p++)
		if (!(r.shard_tokens[p] >= 2))
			fuzz_fail("accepted %g tokens for shard %d", r.shard_tokens[p], p);
	rundir_close(&r);
	fuzz_ok();
	return 0;
}
