/* fuzz_safetensors_crc.c - fuzz_safetensors with the crc metadata recomputed before parsing
 * (FUZZ_FIX_CRC), so that mutated tensor data and byte ranges pass the checksums and reach
 * the structure checks and the reads behind them. Seeds: corpus/safetensors_crc. */
#define FUZZ_FIX_CRC 1
#include "fuzz_safetensors.c"
