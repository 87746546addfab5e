/* fuzz_trace.c - the capacity trace reader (lib/io/trace.c): one finite number per line,
 * blank lines and '#' comments skipped, anything else an error naming the file and line.
 *
 * A failure must keep the error contract naming the input file. An accepted trace is
 * checked against the input, line by line (lines end at '\n' only; a NUL byte is a character
 * like any other): as many values as lines that hold something other than white space and do
 * not start with '#', every value finite, and none of those lines holding a NUL byte (a
 * reader that stops at it would take "1.0\0garbage" for 1.0). Seeds: corpus/trace. */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "io/trace.h"
#include "common/banned.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *path = fuzz_write("trace.txt", data, size);
	double *v;
	size_t n;
	int rc;

	if ((rc = trace_read(path, &v, &n)) != 0) {
		fuzz_check_error("trace_read", rc, path);
		return 0;
	}
	size_t want = 0, line = 0;
	for (size_t i = 0; i < size; line++) {
		const uint8_t *nl = memchr(data + i, '\n', size - i);
		size_t end = nl ? (size_t)(nl - data) : size, s = i;
		while (s < end && isspace(data[s]))
			s++;
		if (s < end && data[s] != '#') {
			want++;
			if (memchr(data + s, '\0', end - s))
				fuzz_fail("accepted line %zu, which holds a NUL byte", line + 1);
		}
		i = end + 1;
	}
	if (n != want)
		fuzz_fail("accepted %zu values from a trace of %zu value lines", n, want);
	for (size_t i = 0; i < n; i++)
		if (!isfinite(v[i]))
			fuzz_fail("accepted value %zu, %g, which is not finite", i, v[i]);
	free(v);
	fuzz_ok();
	return 0;
}
