/* dl_load.h - loading a library with dlopen instead of linking it: cuBLAS and NCCL
 * (lib/backend/cuda/cublas_dl.c and nccl_dl.c say why) and the cpu backend's matrix-product
 * library (lib/backend/cpu/cpu_blas.c: chosen at run time). */
#ifndef CORE_COMMON_DL_LOAD_H
#define CORE_COMMON_DL_LOAD_H

#include <stddef.h>

/* One entry point to resolve: its name and where its address goes. */
struct dl_sym {
	const char *name;
	void **slot;
};

/* dlopen soname (RTLD_LOCAL; a path when it has a slash, else the program's run path,
 * LD_LIBRARY_PATH and the loader's cache, then dir/soname when dir is not NULL) and fill
 * every slot; the handle, or NULL with a one-line reason in why ("cannot load libx.so.1
 * (...)", "libx.so.1 has no f") and no slot to rely on. */
void *dl_load(const char *soname, const char *dir, const struct dl_sym *sym, size_t nsym,
	      char *why, size_t why_len);

#endif
