/* tlslib.c — loads libssl and libevent_openssl with dlopen and fills the table `tls` (tlslib.h). */
#include "tlslib.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "dlsym.h"

struct tlslib tls;

static int tlslib_loaded;

#define TLSLIB_RESOLVE(h, soname, name)                                                            \
    if ((why = fg_dlsym(h, #name, &tls.name, sizeof(tls.name))) != NULL) {                         \
        snprintf(err, errlen, "%s lacks %s (TLS needs OpenSSL 3 and libevent 2.1): %s", soname,    \
                 #name, why);                                                                      \
        goto fail;                                                                                 \
    }

int tlslib_load(char *err, size_t errlen)
{
    const char *why, *soname = TLSLIB_SSL_SONAME;
    void *ssl, *ev = NULL;

    if (tlslib_loaded)
        return 0;
    ssl = dlopen(TLSLIB_SSL_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (ssl) {
        soname = TLSLIB_EVENT_SONAME;
        /* RTLD_GLOBAL for libssl is not needed: libevent_openssl names it as a dependency. */
        ev = dlopen(TLSLIB_EVENT_SONAME, RTLD_NOW | RTLD_LOCAL);
    }
    if (!ssl || !ev) {
        why = dlerror();
        snprintf(err, errlen, "TLS needs %s (Debian packages %s): %s", soname, TLSLIB_PACKAGES,
                 why ? why : "dlopen failed");
        if (ssl)
            dlclose(ssl);
        return -1;
    }
#define TLSLIB_FROM_SSL(name) TLSLIB_RESOLVE(ssl, TLSLIB_SSL_SONAME, name)
#define TLSLIB_FROM_EV(name)  TLSLIB_RESOLVE(ev, TLSLIB_EVENT_SONAME, name)
    TLSLIB_SSL_FUNCS(TLSLIB_FROM_SSL)
    TLSLIB_EVENT_FUNCS(TLSLIB_FROM_EV)
#undef TLSLIB_FROM_SSL
#undef TLSLIB_FROM_EV
    tlslib_loaded = 1;
    return 0;
fail:
    memset(&tls, 0, sizeof(tls));
    dlclose(ev);
    dlclose(ssl);
    return -1;
}
