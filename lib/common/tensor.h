/* tensor.h - the one tensor struct every module shares.
 *
 * A tensor is a typed, strided view of memory it may or may not own. Sizes are given
 * innermost-last as in PyTorch (ne[0] is the outermost dimension), strides in bytes. The
 * names ne/nb are ggml's, the order is not: ggml's ne[0] is the innermost (contiguous)
 * dimension, ours is the outermost, so ggml's ne[0] is our ne[ndim - 1]. The
 * backend pointer says where the data lives; device details stay behind it (backend.h).
 */
#ifndef CORE_TENSOR_H
#define CORE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#define TENSOR_MAX_DIMS 4
#define TENSOR_NAME_MAX 128

enum dtype { DT_F32, DT_F16, DT_BF16, DT_I32, DT_I64, DT_U16, DT_U8, DT_COUNT };

struct backend;

struct tensor {
	enum dtype type;
	int ndim;
	int64_t ne[TENSOR_MAX_DIMS]; /* sizes, outermost first */
	size_t nb[TENSOR_MAX_DIMS];  /* strides in bytes */
	void *data;
	int owns_data;
	const struct backend *be; /* NULL means host memory */
	char name[TENSOR_NAME_MAX];
};

size_t dtype_size(enum dtype t);
/* Safetensors spelling of a dtype ("F32", "BF16", ...) and back; -1 if unknown. */
const char *dtype_name(enum dtype t);
int dtype_from_name(const char *s);

/* Contiguous host tensor of the given shape, zero-filled, 64-byte aligned. */
int tensor_alloc(struct tensor *t, enum dtype type, int ndim, const int64_t *ne,
		 const char *name);
/* View over memory the caller keeps alive; contiguous strides. */
void tensor_view(struct tensor *t, enum dtype type, int ndim, const int64_t *ne, void *data,
		 const char *name);
void tensor_free(struct tensor *t);
int64_t tensor_numel(const struct tensor *t);
size_t tensor_nbytes(const struct tensor *t);
int tensor_is_contiguous(const struct tensor *t);

#endif
