/* fuzz_config.c - libFuzzer harness for the YAML config parser (lib/io/config.c): the
 * sections of scalar keys and the levels sequence, then validation, the canonical dump and
 * the loadable YAML of whatever loaded. Build and run (clang with libFuzzer):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -std=c11 -D_GNU_SOURCE -Ilib \
 *     test/fuzz/fuzz_config.c lib/io/config.c lib/io/atomicio.c lib/common/err.c \
 *     $(pkg-config --cflags --libs yaml-0.1) -o /tmp/fuzz_config
 *   /tmp/fuzz_config -max_total_time=120 configs/
 * A crash, a sanitizer report or a failed round trip (config_yaml's text loads back to the
 * same canonical dump) stops it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char path[64];
	struct run_config c, back;

	if (!path[0])
		snprintf(path, sizeof path, "/tmp/fuzz_config.%d.yaml", (int)getpid());
	FILE *fp = fopen(path, "wb");
	if (!fp)
		abort();
	fwrite(data, 1, size, fp);
	fclose(fp);
	config_defaults(&c);
	if (config_load(&c, path) != 0 || config_validate(&c, path) != 0)
		return 0;
	size_t n = config_dump(&c, NULL, 0) + 1, m = config_yaml(&c, NULL, 0) + 1;
	char *dump = malloc(n), *yaml = malloc(m), *dump2 = malloc(n);
	config_dump(&c, dump, n);
	config_yaml(&c, yaml, m);
	fp = fopen(path, "wb");
	fwrite(yaml, 1, m - 1, fp);
	fclose(fp);
	config_defaults(&back);
	if (config_load(&back, path) != 0 || config_dump(&back, dump2, n) != n - 1 ||
	    memcmp(dump, dump2, n) != 0) {
		fprintf(stderr, "round trip failed:\n%s\n--- yaml ---\n%s\n", dump, yaml);
		abort();
	}
	free(dump);
	free(yaml);
	free(dump2);
	return 0;
}
