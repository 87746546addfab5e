/* tensor.c - tensor bookkeeping; the arithmetic lives in the backends. */
#include "common/tensor.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/banned.h"

static const struct {
	const char *name;
	size_t size;
} dtypes[DT_COUNT] = {
	[DT_F32] = {"F32", 4}, [DT_F16] = {"F16", 2}, [DT_BF16] = {"BF16", 2},
	[DT_I32] = {"I32", 4}, [DT_I64] = {"I64", 8}, [DT_U16] = {"U16", 2},
	[DT_U8] = {"U8", 1},
};

size_t dtype_size(enum dtype t) { return (unsigned)t < DT_COUNT ? dtypes[t].size : 0; }
const char *dtype_name(enum dtype t) { return (unsigned)t < DT_COUNT ? dtypes[t].name : "?"; }

int dtype_from_name(const char *s)
{
	for (int i = 0; i < DT_COUNT; i++)
		if (strcmp(s, dtypes[i].name) == 0)
			return i;
	return -1;
}

static void set_shape(struct tensor *t, enum dtype type, int ndim, const int64_t *ne,
		      const char *name)
{
	memset(t, 0, sizeof *t);
	t->type = type;
	t->ndim = ndim;
	size_t stride = dtype_size(type);
	for (int i = ndim - 1; i >= 0; i--) {
		t->ne[i] = ne[i];
		t->nb[i] = stride;
		stride *= (size_t)ne[i];
	}
	if (name) {
		strncpy(t->name, name, TENSOR_NAME_MAX - 1);
		t->name[TENSOR_NAME_MAX - 1] = '\0';
	}
}

int tensor_alloc(struct tensor *t, enum dtype type, int ndim, const int64_t *ne,
		 const char *name)
{
	if (ndim < 0 || ndim > TENSOR_MAX_DIMS || (unsigned)type >= DT_COUNT)
		return err_set(CORE_EUSAGE, NULL, "bad tensor shape for '%s'", name ? name : "");
	set_shape(t, type, ndim, ne, name);
	size_t n = tensor_nbytes(t);
	size_t padded = (n + 63) / 64 * 64;
	t->data = aligned_alloc(64, padded ? padded : 64);
	if (!t->data)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate %zu bytes for '%s'", n, t->name);
	memset(t->data, 0, padded);
	t->owns_data = 1;
	return 0;
}

void tensor_view(struct tensor *t, enum dtype type, int ndim, const int64_t *ne, void *data,
		 const char *name)
{
	set_shape(t, type, ndim, ne, name);
	t->data = data;
}

void tensor_free(struct tensor *t)
{
	if (t->owns_data)
		free(t->data);
	t->data = NULL;
	t->owns_data = 0;
}

int64_t tensor_numel(const struct tensor *t)
{
	int64_t n = 1;
	for (int i = 0; i < t->ndim; i++)
		n *= t->ne[i];
	return n;
}

size_t tensor_nbytes(const struct tensor *t)
{
	return (size_t)tensor_numel(t) * dtype_size(t->type);
}

int tensor_is_contiguous(const struct tensor *t)
{
	size_t stride = dtype_size(t->type);
	for (int i = t->ndim - 1; i >= 0; i--) {
		if (t->nb[i] != stride)
			return 0;
		stride *= (size_t)t->ne[i];
	}
	return 1;
}

