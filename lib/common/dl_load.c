/* dl_load.c - see dl_load.h. */
#include "common/dl_load.h"

#include <dlfcn.h>
#include <stdio.h>

#include "common/banned.h"

void *dl_load(const char *soname, const char *dir, const struct dl_sym *sym, size_t nsym,
	      char *why, size_t why_len)
{
	void *lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
	if (!lib && dir) {
		char path[512];
		snprintf(path, sizeof path, "%s/%s", dir, soname);
		lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	}
	if (!lib) {
		const char *e = dlerror();
		snprintf(why, why_len, "cannot load %s (%s)", soname, e ? e : "not found");
		return NULL;
	}
	for (size_t i = 0; i < nsym; i++) {
		*sym[i].slot = dlsym(lib, sym[i].name);
		if (!*sym[i].slot) {
			snprintf(why, why_len, "%s has no %s", soname, sym[i].name);
			dlclose(lib);
			return NULL;
		}
	}
	return lib;
}
