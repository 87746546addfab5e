/* fuzz_tokfile_crc.c - fuzz_tokfile with the body crc (header bytes 36..39) and then the
 * header crc (60..63) recomputed before parsing (FUZZ_FIX_CRC), so that mutated counts,
 * offsets, tokens and metadata reach the checks behind the checksums. Seeds:
 * corpus/tokfile_crc. */
#define FUZZ_FIX_CRC 1
#include "fuzz_tokfile.c"
