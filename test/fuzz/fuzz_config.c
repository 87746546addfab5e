/* fuzz_config.c - the YAML config parser (lib/io/config.c): the sections of scalar keys and
 * the levels sequence, then validation, the canonical dump and the loadable YAML of whatever
 * loaded. A failure must keep the error contract (harness.h) naming the input file; an
 * accepted config must survive the round trip (config_yaml's text loads back to the same
 * canonical dump). Seeds: corpus/config (the configs/ of the tree). */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "io/config.h"
#include "common/banned.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct run_config c, back;
	const char *path = fuzz_write("config.yaml", data, size);
	int rc;

	config_defaults(&c);
	if ((rc = config_load(&c, path)) != 0) {
		fuzz_check_error("config_load", rc, path);
		return 0;
	}
	if ((rc = config_validate(&c, path)) != 0) {
		fuzz_check_error("config_validate", rc, path);
		return 0;
	}
	size_t n = config_dump(&c, NULL, 0) + 1, m = config_yaml(&c, NULL, 0) + 1;
	char *dump = malloc(n), *yaml = malloc(m), *dump2 = malloc(n);
	if (!dump || !yaml || !dump2)
		fuzz_fail("out of memory");
	config_dump(&c, dump, n);
	config_yaml(&c, yaml, m);
	const char *again = fuzz_write("roundtrip.yaml", yaml, m - 1);
	config_defaults(&back);
	if ((rc = config_load(&back, again)) != 0)
		fuzz_fail("config_yaml's text does not load (%d):\n%s", rc, yaml);
	if (config_dump(&back, dump2, n) != n - 1 || memcmp(dump, dump2, n) != 0)
		fuzz_fail("round trip changed the config:\n%s\n--- yaml ---\n%s", dump, yaml);
	free(dump);
	free(yaml);
	free(dump2);
	fuzz_ok();
	return 0;
}
