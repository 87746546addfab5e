/* fuzz_override.c - command-line overrides of a config (config_set, "section.key=value", as
 * `-s` gives them) and the cross-field checks after them (config_validate).
 *
 * The input is a list of assignments separated by NUL bytes (an argument can hold any byte
 * but NUL). When the first one is "@levels", the overrides apply over a DiPaCo config with
 * levels (harness.c) instead of the defaults, so that validation of levels against the
 * overridden model is reached too. Each failure must keep the error contract (an override
 * names no file: one line, the code recorded); an accepted config must survive the round trip
 * through config_yaml as in fuzz_config. Seeds: corpus/override. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "io/config.h"
#include "common/banned.h"

#define MAX_ASSIGN 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct run_config c, back;
	char *text = malloc(size + 1);
	int rc;

	if (!text)
		fuzz_fail("out of memory");
	memcpy(text, data, size);
	text[size] = '\0';
	config_defaults(&c);

	const char *s = text, *end = text + size;
	if (size >= 8 && memcmp(text, "@levels", 8) == 0) {
		const char *base = fuzz_write("levels.yaml", fuzz_levels_yaml,
					      strlen(fuzz_levels_yaml));
		if ((rc = config_load(&c, base)) != 0)
			fuzz_fail("the base config with levels does not load (%d)", rc);
		s += 8;
	}
	/* size + 1 bytes end in NUL, so every piece is a string; an empty piece is an empty
	 * argument, which is an override like any other (a malformed one). */
	for (int i = 0; i < MAX_ASSIGN && s < end; i++) {
		if ((rc = config_set(&c, s)) != 0) {
			fuzz_check_error("config_set", rc, NULL);
			free(text);
			return 0;
		}
		s += strlen(s) + 1;
	}
	free(text);
	const char *path = fuzz_path("overridden.yaml");
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
	fuzz_write("overridden.yaml", yaml, m - 1);
	config_defaults(&back);
	if ((rc = config_load(&back, path)) != 0)
		fuzz_fail("config_yaml's text does not load (%d):\n%s", rc, yaml);
	if (config_dump(&back, dump2, n) != n - 1 || memcmp(dump, dump2, n) != 0)
		fuzz_fail("round trip changed the config:\n%s\n--- yaml ---\n%s", dump, yaml);
	free(dump);
	free(yaml);
	free(dump2);
	fuzz_ok();
	return 0;
}
