/* fuzz_safetensors.c - the safetensors reader (lib/io/safetensors.c): the 8-byte length, the
 * JSON header (entries, dtypes, shapes, byte ranges that must tile the data section, our crc
 * metadata), whole-file verification, and reading every tensor.
 *
 * Each input is opened twice: with verify=1 (st_open reads all data against "crc32" and the
 * per-tensor crcs), and with verify=0, after which every tensor is read with st_read (which
 * checks that tensor's own crc32) and again with st_read_raw. Every failure must keep the
 * error contract naming the input file; a file that verified must read in full, and both
 * reads must give the same bytes.
 *
 * Built with FUZZ_FIX_CRC (fuzz_safetensors_crc.c), the harness first rewrites the header
 * with every crc key it already holds recomputed (zlib's crc32 of the tensor's byte range,
 * or of the whole data section), so that mutations reach the structure behind the
 * checksums instead of stopping at "checksum mismatch". Seeds: corpus/safetensors. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "common/tensor.h"
#include "io/safetensors.h"
#include "common/banned.h"


/* Read every tensor of an open file; verified: st_open(verify=1) accepted the same file. */
static void read_all(struct st_file *f, const char *path, int verified)
{
	for (int i = 0; i < f->n; i++) {
		const struct st_entry *e = &f->entries[i];
		struct tensor t;
		int rc = tensor_alloc(&t, e->type, e->ndim, e->ne, e->name);
		if (rc != 0)
			fuzz_fail("tensor_alloc of '%s' (%llu bytes in the file) failed: %d", e->name,
				  (unsigned long long)(e->end - e->begin), rc);
		size_t nb = (size_t)(e->end - e->begin);
		if (tensor_nbytes(&t) != nb)
			fuzz_fail("tensor '%s': %zu bytes by its shape, %zu by its data_offsets",
				  e->name, tensor_nbytes(&t), nb);
		rc = st_read(f, e->name, &t);
		if (rc != 0) {
			if (verified)
				fuzz_fail("st_read of '%s' failed (%d) in a file that verified",
					  e->name, rc);
			fuzz_check_error("st_read", rc, path);
			tensor_free(&t);
			continue;
		}
		unsigned char *raw = malloc(nb ? nb : 1);
		if (!raw)
			fuzz_fail("out of memory");
		if ((rc = st_read_raw(f, e, 0, raw, nb)) != 0)
			fuzz_fail("st_read_raw of '%s' failed (%d) after st_read succeeded", e->name,
				  rc);
		if (memcmp(raw, t.data, nb) != 0)
			fuzz_fail("st_read and st_read_raw of '%s' differ", e->name);
		free(raw);
		tensor_free(&t);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct st_file f;
	uint8_t *fixed = NULL;
	int rc, verified = 0;

#ifdef FUZZ_FIX_CRC
	size_t fixed_size = 0;
	if ((fixed = fuzz_fix_st_crcs(data, size, &fixed_size)) != NULL) {
		data = fixed;
		size = fixed_size;
	}
#endif
	const char *path = fuzz_write("input.safetensors", data, size);
	free(fixed);

	if ((rc = st_open(&f, path, 1)) != 0) {
		fuzz_check_error("st_open(verify)", rc, path);
	} else {
		verified = 1;
		read_all(&f, path, 1);
		st_close(&f);
	}
	if ((rc = st_open(&f, path, 0)) != 0) {
		if (verified)
			fuzz_fail("st_open without verify failed (%d) on a file that verified", rc);
		fuzz_check_error("st_open", rc, path);
		return 0;
	}
	read_all(&f, path, verified);
	st_close(&f);
	if (verified)
		fuzz_ok();
	return 0;
}
