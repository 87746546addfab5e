/* cuda_bf16.h (test/emu) - the bfloat16 type of CUDA and the conversions kernels/ uses, on the
 * CPU. bfloat16 is the upper half of an IEEE float32: 8 exponent bits, 7 stored mantissa bits.
 * __float2bfloat16_rn rounds to nearest, ties to even, and keeps a NaN a (quiet) NaN, as CUDA's
 * does; __bfloat162float is exact; __bfloat16_as_ushort and __ushort_as_bfloat16 give and
 * take the bits.
 */
#ifndef CORE_EMU_CUDA_BF16_H
#define CORE_EMU_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
	uint16_t __x;
};

static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	__nv_bfloat16 h;
	if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: quiet it, keep the sign */
		h.__x = (uint16_t)((u >> 16) | 0x0040u);
	else
		h.__x = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
	return h;
}

static inline float __bfloat162float(__nv_bfloat16 h)
{
	uint32_t u = (uint32_t)h.__x << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* The bits, both ways. */
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h)
{
	return h.__x;
}

static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u)
{
	__nv_bfloat16 h;
	h.__x = u;
	return h;
}

#endif
