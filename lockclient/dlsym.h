/* dlsym.h — one symbol of a dlopen()ed library into a function pointer (tlslib.c, pqlib.c). */
#ifndef FG_DLSYM_H
#define FG_DLSYM_H

#include <dlfcn.h>
#include <string.h>

/* Looks name up in h and stores it in the function pointer at fn (of fn_size bytes). Returns
 * NULL, or why it is missing. dlsym's result is copied: ISO C has no conversion from void * to a
 * function pointer, POSIX guarantees the representation is the same. */
static inline const char *fg_dlsym(void *h, const char *name, void *fn, size_t fn_size)
{
    void *obj;
    const char *why;

    dlerror();
    obj = dlsym(h, name);
    if (obj == NULL) {
        why = dlerror();
        return why ? why : "symbol is NULL";
    }
    memcpy(fn, &obj, fn_size < sizeof(obj) ? fn_size : sizeof(obj));
    return NULL;
}

#endif
