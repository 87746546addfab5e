/* dl_load.h - loading a CUDA library (cuBLAS, NCCL) with dlopen instead of linking it
 * (kernels/cublas_dl.c, kernels/nccl_dl.c say why), shared by its two users. */
#ifndef CORE_KERNELS_DL_LOAD_H
#define CORE_KERNELS_DL_LOAD_H

#include <stddef.h>

/* One entry point to resolve: its name and where its address goes. */
struct dl_sym {
	const char *name;
	void **slot;
};

/* dlopen soname (the program's run path, LD_LIBRARY_PATH and the loader's cache, then
 * /usr/local/cuda/lib64) and fill every slot; the handle, or NULL with a one-line reason in
 * why ("cannot load libx.so.1 (...)", "libx.so.1 has no f") and no slot to rely on. */
void *dl_load(const char *soname, const struct dl_sym *sym, size_t nsym, char *why,
	      size_t why_len);

#endif
