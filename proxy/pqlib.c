/* pqlib.c — loads libpq with dlopen and fills the table of its functions (pqlib.h). */
#include "pqlib.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "dlsym.h"

struct pqlib pq;

static void *pqlib_handle;

int pqlib_load(char *err, size_t errlen)
{
    const char *why;
    void *h;

    if (pqlib_handle)
        return 0;
    h = dlopen(PQLIB_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        why = dlerror();
        snprintf(err, errlen, "PostgreSQL stores need %s (Debian package %s): %s", PQLIB_SONAME,
                 PQLIB_PACKAGE, why ? why : "dlopen failed");
        return -1;
    }
#define PQLIB_RESOLVE(name)                                                                        \
    if ((why = fg_dlsym(h, #name, &pq.name, sizeof(pq.name))) != NULL) {                           \
        snprintf(err, errlen, "%s lacks %s (PostgreSQL stores need libpq 14 or later): %s",        \
                 PQLIB_SONAME, #name, why);                                                        \
        goto fail;                                                                                 \
    }
    PQLIB_FUNCS(PQLIB_RESOLVE)
#undef PQLIB_RESOLVE
    pqlib_handle = h;
    return 0;
fail:
    memset(&pq, 0, sizeof(pq));
    dlclose(h);
    return -1;
}
