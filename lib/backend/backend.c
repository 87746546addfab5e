/* backend.c - the registry of backends built into this binary; see backend.h. */
#include "backend/backend.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "common/err.h"
#include "common/banned.h"

#define PREC(p) (1u << (p))

/* The one list of backends: every name, precision list and test loop derives from it. */
static const struct {
	const char *name;
	int (*init)(struct backend *be, const struct backend_params *params);
	unsigned precisions; /* PREC(p) for each enum backend_precision p it has */
} registry[] = {
	/* bf16 where oneDNN and the CPU have it; elsewhere backend_open says why not */
	{"cpu", backend_cpu_init, PREC(BACKEND_FP32) | PREC(BACKEND_BF16)},
	{"ref", backend_ref_init, PREC(BACKEND_FP32)},
#ifdef CORE_HAVE_CUDA
	{"cuda", backend_cuda_init, PREC(BACKEND_FP32) | PREC(BACKEND_TF32) | PREC(BACKEND_BF16)},
#endif
};
#define NREG (sizeof registry / sizeof registry[0])
#define NPREC (sizeof precision_names / sizeof precision_names[0])

static const char *const precision_names[] = {"fp32", "tf32", "bf16"};

/* The registry's names and each entry's precisions as comma-separated text, made once. */
static char names_text[NREG * 16 + 1], prec_text[NREG][NPREC * 6 + 1];
static pthread_once_t text_once = PTHREAD_ONCE_INIT;

static void join(char *buf, size_t n, const char *word)
{
	size_t k = strlen(buf);
	snprintf(buf + k, n - k, "%s%s", k ? ", " : "", word);
}

static void make_text(void)
{
	for (size_t i = 0; i < NREG; i++) {
		join(names_text, sizeof names_text, registry[i].name);
		for (size_t p = 0; p < NPREC; p++)
			if (registry[i].precisions & PREC(p))
				join(prec_text[i], sizeof prec_text[i], precision_names[p]);
	}
}

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
	pthread_once(&text_once, make_text);
	return names_text;
}

const char *backend_precision_name(enum backend_precision p)
{
	return (unsigned)p < NPREC ? precision_names[p] : "unknown";
}

int backend_precision_from_name(const char *name)
{
	for (size_t i = 0; i < NPREC; i++)
		if (strcmp(name, precision_names[i]) == 0)
			return (int)i;
	return -1;
}

const char *backend_precisions(const char *name)
{
	pthread_once(&text_once, make_text);
	for (size_t i = 0; i < NREG; i++)
		if (strcmp(name, registry[i].name) == 0)
			return prec_text[i];
	return NULL;
}

int backend_open(struct backend **out, const char *name, const struct backend_params *params)
{
	static const struct backend_params defaults = {0};

	*out = NULL;
	if (!params)
		params = &defaults;
	for (size_t i = 0; i < NREG; i++) {
		if (strcmp(name, registry[i].name) != 0)
			continue;
		if ((unsigned)params->precision >= 32 ||
		    !(registry[i].precisions & PREC(params->precision)))
			return err_set(CORE_EUSAGE, NULL, "device '%s' has no %s matrix products "
				       "(it has: %s)", name,
				       backend_precision_name(params->precision),
				       backend_precisions(name));
		struct backend *be = calloc(1, sizeof *be);
		if (!be)
			return err_set(CORE_ENOMEM, NULL, "cannot allocate the '%s' backend", name);
		be->name = registry[i].name;
		be->precision = params->precision;
		int rc = registry[i].init(be, params);
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
