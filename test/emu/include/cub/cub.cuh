/* cub/cub.cuh (test/emu) - CUB's DeviceRadixSort::SortPairs, on the CPU.
 *
 * As CUB: the keys are ordered by bits [begin_bit, end_bit) of their radix form (unsigned as
 * they are, signed with the sign bit flipped, floats as CUB twiddles them) and by nothing else,
 * stably (equal key bits keep their input order); the full keys and their values are written to
 * the outputs. A call with d_temp_storage NULL only sets temp_storage_bytes; the sort uses that
 * storage as scratch, so whatever the caller placed there is overwritten as on a GPU, and
 * returns cudaErrorInvalidValue when it is smaller than the query said. Ranges outside device
 * memory, or outputs overlapping inputs or the scratch, stop the program (emu.cpp).
 */
#ifndef CORE_EMU_CUB_CUH
#define CORE_EMU_CUB_CUH

#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

/* The scratch bytes a sort of n pairs needs (what the query answers). */
size_t emu_sort_temp_bytes(long long n);
/* cudaSuccess, or cudaErrorInvalidValue (said on stderr) for too little scratch or a bit range
 * outside the key; stops the program on memory that is not the device's or that overlaps. */
cudaError_t emu_sort_check(void *tmp, size_t tmp_bytes, const void *keys_in, void *keys_out,
			   size_t key_size, const void *values_in, void *values_out,
			   size_t value_size, long long n, int begin_bit, int end_bit,
			   cudaStream_t stream);

namespace cub {

struct DeviceRadixSort {
	template <typename KeyT, typename ValueT, typename NumItemsT>
	static cudaError_t SortPairs(void *d_temp_storage, size_t &temp_storage_bytes,
				     const KeyT *d_keys_in, KeyT *d_keys_out,
				     const ValueT *d_values_in, ValueT *d_values_out,
				     NumItemsT num_items, int begin_bit = 0,
				     int end_bit = sizeof(KeyT) * 8, cudaStream_t stream = 0)
	{
		static_assert(std::is_arithmetic_v<KeyT>, "radix sort keys are numbers");
		const long long n = (long long)num_items;
		if (!d_temp_storage) {
			temp_storage_bytes = emu_sort_temp_bytes(n);
			return cudaSuccess;
		}
		cudaError_t e = emu_sort_check(d_temp_storage, temp_storage_bytes, d_keys_in,
					       d_keys_out, sizeof(KeyT), d_values_in, d_values_out,
					       sizeof(ValueT), n, begin_bit, end_bit, stream);
		if (e != cudaSuccess || n <= 0)
			return e;
		emu_enqueue(stream, [=] {
			/* scratch: the digits, then the order */
			unsigned long long *digit = (unsigned long long *)d_temp_storage;
			long long *order = (long long *)(digit + n);
			const int nbits = end_bit - begin_bit;
			const unsigned long long mask = nbits >= 64 ? ~0ull : (1ull << nbits) - 1;
			for (long long i = 0; i < n; i++) {
				digit[i] = (radix(d_keys_in[i]) >> begin_bit) & mask;
				order[i] = i;
			}
			std::stable_sort(order, order + n, [&](long long a, long long b) {
				return digit[a] < digit[b];
			});
			for (long long i = 0; i < n; i++) {
				d_keys_out[i] = d_keys_in[order[i]];
				d_values_out[i] = d_values_in[order[i]];
			}
		});
		return cudaSuccess;
	}

private:
	/* CUB's unsigned form of a key, whose order as an unsigned number is the key's order */
	template <typename KeyT>
	static unsigned long long radix(KeyT k)
	{
		typedef std::conditional_t<sizeof(KeyT) == 8, unsigned long long,
					   std::conditional_t<sizeof(KeyT) == 4, unsigned,
							      std::conditional_t<sizeof(KeyT) == 2,
										 unsigned short,
										 unsigned char>>>
			bits_t;
		const bits_t high = (bits_t)((bits_t)1 << (8 * sizeof(KeyT) - 1));
		bits_t u;
		memcpy(&u, &k, sizeof u);
		if (std::is_floating_point_v<KeyT>)
			u = (u & high) ? (bits_t)~u : (bits_t)(u | high);
		else if (std::is_signed_v<KeyT>)
			u = (bits_t)(u ^ high);
		return u;
	}
};

} /* namespace cub */

#endif
