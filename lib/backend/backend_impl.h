/* backend_impl.h - what the registry (backend.c) needs from each backend implementation.
 * Private to lib/backend: programs and the layers above use backend.h only.
 *
 * An init function fills be->op, be->host_visible, be->threads and be->ctx (be->name is set
 * by the registry) or returns a negative CORE_E* code with the detail set and leaves nothing
 * allocated.
 */
#ifndef CORE_BACKEND_IMPL_H
#define CORE_BACKEND_IMPL_H

#include "backend/backend.h"

int backend_cpu_init(struct backend *be, const struct backend_params *params);
int backend_ref_init(struct backend *be, const struct backend_params *params);
/* kernels/backend_cuda.cu, linked when the build found nvcc (CORE_HAVE_CUDA). */
int backend_cuda_init(struct backend *be, const struct backend_params *params);

#endif
