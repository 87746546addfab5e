/* jsonfmt.h - the one number format of the JSON the programs write (stdout, --json files,
 * metrics.jsonl): 9 significant digits, so that every float32 reads back to the same bits
 * and a double keeps what the float32 computations it summarises can mean. */
#ifndef CORE_JSONFMT_H
#define CORE_JSONFMT_H

#define CORE_JSON_DIGITS 9
/* jansson's flag for it (JSON_REAL_PRECISION(CORE_JSON_DIGITS) without needing jansson.h) */
#define CORE_JSON_REAL (((size_t)CORE_JSON_DIGITS & 0x1F) << 11)

#endif
