/* harness.h - what the fuzz harnesses of test/fuzz share: a scratch file for each input (the
 * parsers read paths, not buffers), the error contract every failure must keep, and the
 * outcome of the last input for `replay -v`.
 *
 * The contract (lib/common/err.h): a failing call returns a negative CORE_E* code; err_file()
 * is the file it concerns (the input file, exactly as the caller named it); err_format() of
 * that code is "'FILE': detail", one line without control characters. A broken contract,
 * like a broken invariant of an accepted input, is reported on stderr and abort()s, which
 * libFuzzer records as a crash and the replay as a failure. Each harness is one fuzz_NAME.c defining LLVMFuzzerTestOneInput;
 * it is linked either with libFuzzer (`make fuzz`) or with replay.c (`make test`).
 */
#ifndef FUZZ_HARNESS_H
#define FUZZ_HARNESS_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* NAME inside this process's scratch directory (made on first use under $TMPDIR, removed at
 * exit). The same NAME gives the same path for the life of the process. */
const char *fuzz_path(const char *name);
/* Write size bytes to fuzz_path(name), replacing it; returns the path. Aborts on failure. */
const char *fuzz_write(const char *name, const void *data, size_t size);
/* Remove the scratch directory and what is in it now (also at exit). Async-signal-safe. */
void fuzz_cleanup(void);

/* Check the error contract of `call`, which returned rc on file (NULL when the input is no
 * file, as for a command-line override: then only the code and the one line are checked).
 * Records the message as the outcome. Clears the error state before the next call. */
void fuzz_check_error(const char *call, int rc, const char *file);
/* An accepted input: the outcome is "ok". */
void fuzz_ok(void);
/* A broken invariant: print "fuzz: " and the message (control characters escaped), abort. */
void fuzz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* A safetensors input with every crc key it holds recomputed (zlib's crc32 of the tensor's
 * byte range, or of the whole data section), malloc'd; or NULL to use the input as it is (no
 * parseable header with crc keys). So that mutations reach the structure behind the
 * checksums instead of stopping at "checksum mismatch". */
uint8_t *fuzz_fix_st_crcs(const uint8_t *data, size_t size, size_t *out_size);

/* "ok" or the last error message: what replay -v prints for each input. */
extern char fuzz_outcome[1024];

/* A config with two levels of two modules (configs/dipaco-2x2.yaml): 4 paths. */
extern const char fuzz_levels_yaml[];

#endif
