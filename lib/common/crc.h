/* crc.h - the crc32 of every file's integrity data: zlib's crc32 (the gzip polynomial,
 * 0 to start, as crc32(0, NULL, 0) gives), computed by libdeflate's carry-less-multiply code
 * when the build has it (about 3x zlib's speed on this project's machines: checkpoints are
 * read and written at memory speed) and by zlib otherwise. The values are the same either
 * way; zlib still combines crcs (crc32_combine). */
#ifndef CORE_CRC_H
#define CORE_CRC_H

#include <stddef.h>
#include <stdint.h>

/* crc of buf[0..n) continuing from crc (0 for a new one); any n. */
uint32_t crc32_update(uint32_t crc, const void *buf, size_t n);

#endif
