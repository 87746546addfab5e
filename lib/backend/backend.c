/* backend.c - the registry of backends built into this binary; see backend.h. */
#include "backend/backend.h"

#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "common/err.h"
#include "common/banned.h"

static const struct {
	const char *name;
	int (*init)(struct backend *be, const struct backend_params *params);
} registry[] = {
	{"cpu", backend_cpu_init},
	{"ref", backend_ref_init},
#ifdef CORE_HAVE_CUDA
	{"cuda", backend_cuda_init},
#endif
};
#define NREG (sizeof registry / sizeof registry[0])

/* Backends the project knows but this build left out, and why. */
static const struct {
	const char *name, *why;
} unbuilt[] = {
#ifndef CORE_HAVE_CUDA
	{"cuda", "it was built without nvcc"},
#endif
	{NULL, NULL},
};

const char *backend_names(void)
{
#ifdef CORE_HAVE_CUDA
	return "cpu, ref, cuda";
#else
	return "cpu, ref";
#endif
}

int backend_open(struct backend **out, const char *name, const struct backend_params *params)
{
	static const struct backend_params defaults = {0};

	*out = NULL;
	for (size_t i = 0; i < NREG; i++) {
		if (strcmp(name, registry[i].name) != 0)
			continue;
		struct backend *be = calloc(1, sizeof *be);
		if (!be)
			return err_set(CORE_ENOMEM, NULL, "cannot allocate the '%s' backend", name);
		be->name = registry[i].name;
		int rc = registry[i].init(be, params ? params : &defaults);
		if (rc < 0) {
			free(be);
			return rc;
		}
		*out = be;
		return 0;
	}
	for (size_t i = 0; unbuilt[i].name; i++)
		if (strcmp(name, unbuilt[i].name) == 0)
			return err_set(CORE_EUSAGE, NULL, "device '%s' is not built into this binary "
				       "(%s; built: %s)", name, unbuilt[i].why, backend_names());
	return err_set(CORE_EUSAGE, NULL, "unknown device '%s' (built: %s)", name,
		       backend_names());
}

void backend_close(struct backend *be)
{
	if (!be)
		return;
	be->op->close(be);
	free(be);
}

int backend_alloc_zero(struct backend *be, void **ptr, size_t bytes)
{
	*ptr = NULL;
	ERR_FORWARD(be->op->alloc(be, ptr, bytes));
	int rc = be->op->memset(be, *ptr, 0, bytes);
	if (rc < 0) {
		be->op->free(be, *ptr);
		*ptr = NULL;
	}
	return rc;
}
