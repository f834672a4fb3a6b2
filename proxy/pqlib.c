/* pqlib.c — loads libpq with dlopen and fills the table of its functions (pqlib.h). */
#include "pqlib.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

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
    /* dlsym's result goes through a union: ISO C has no conversion from void * to a function
     * pointer, POSIX guarantees the representation is the same. */
#define PQLIB_RESOLVE(name)                                                                        \
    {                                                                                              \
        union {                                                                                    \
            void *obj;                                                                             \
            __typeof__(name) *fn;                                                                  \
        } sym;                                                                                     \
        dlerror();                                                                                 \
        sym.obj = dlsym(h, #name);                                                                 \
        if (!sym.obj) {                                                                            \
            why = dlerror();                                                                       \
            snprintf(err, errlen, "%s lacks %s (PostgreSQL stores need libpq 14 or later): %s",    \
                     PQLIB_SONAME, #name, why ? why : "symbol is NULL");                           \
            goto fail;                                                                             \
        }                                                                                          \
        pq.name = sym.fn;                                                                          \
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
