/* crc.c - see crc.h. */
#include "common/crc.h"

#if HAVE_LIBDEFLATE
#include <libdeflate.h>
#else
#include <zlib.h>
#endif

#include "common/banned.h"

uint32_t crc32_update(uint32_t crc, const void *buf, size_t n)
{
#if HAVE_LIBDEFLATE
	return libdeflate_crc32(crc, buf, n);
#else
	return (uint32_t)crc32_z(crc, buf, n);
#endif
}
