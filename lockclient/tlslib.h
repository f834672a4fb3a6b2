/* tlslib.h — OpenSSL and libevent's OpenSSL bufferevent, loaded at run time (dlopen), and only
 * when a channel is configured for TLS (etcds://). libssl and libcrypto add about as much idle
 * memory as the whole sidecar uses, so fencegate does not link them (pqlib.h does the same for
 * libpq).
 *
 * grpc.c calls them through the table `tls`: tls.SSL_new(ctx), ... Each member has the type of
 * the function it stands for, from the library's own headers (Debian packages libssl-dev and
 * libevent-dev). OpenSSL functions that are macros (SSL_set_tlsext_host_name,
 * SSL_CTX_set_min_proto_version) are reached through the SSL_ctrl / SSL_CTX_ctrl they expand
 * to. */
#ifndef FG_TLSLIB_H
#define FG_TLSLIB_H

#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stddef.h>

#define TLSLIB_SSL_SONAME   "libssl.so.3"
#define TLSLIB_EVENT_SONAME "libevent_openssl-2.1.so.7"
#define TLSLIB_PACKAGES     "libssl3 and libevent-openssl-2.1-7"

/* From libssl.so.3 (libcrypto's symbols are found through it: it depends on libcrypto). */
#define TLSLIB_SSL_FUNCS(X)                                                                        \
    X(TLS_client_method)                                                                           \
    X(SSL_CTX_new)                                                                                 \
    X(SSL_CTX_free)                                                                                \
    X(SSL_CTX_ctrl)                                                                                \
    X(SSL_CTX_set_default_verify_paths)                                                            \
    X(SSL_CTX_load_verify_locations)                                                               \
    X(SSL_CTX_use_certificate_chain_file)                                                          \
    X(SSL_CTX_use_PrivateKey_file)                                                                 \
    X(SSL_CTX_check_private_key)                                                                   \
    X(SSL_CTX_set_verify)                                                                          \
    X(SSL_CTX_set_alpn_protos)                                                                     \
    X(SSL_new)                                                                                     \
    X(SSL_free)                                                                                    \
    X(SSL_ctrl)                                                                                    \
    X(SSL_set1_host)                                                                               \
    X(SSL_get0_param)                                                                              \
    X(SSL_get0_alpn_selected)                                                                      \
    X(SSL_get_verify_result)                                                                       \
    X(X509_VERIFY_PARAM_set1_ip_asc)                                                               \
    X(X509_verify_cert_error_string)                                                               \
    X(ERR_get_error)                                                                               \
    X(ERR_error_string_n)                                                                          \
    X(ERR_clear_error)

/* From libevent_openssl-2.1.so.7. */
#define TLSLIB_EVENT_FUNCS(X)                                                                      \
    X(bufferevent_openssl_socket_new)                                                              \
    X(bufferevent_openssl_get_ssl)                                                                 \
    X(bufferevent_get_openssl_error)                                                               \
    X(bufferevent_openssl_set_allow_dirty_shutdown)

#define TLSLIB_MEMBER(name) __typeof__(name) *name;
struct tlslib {
    TLSLIB_SSL_FUNCS(TLSLIB_MEMBER)
    TLSLIB_EVENT_FUNCS(TLSLIB_MEMBER)
};
#undef TLSLIB_MEMBER

extern struct tlslib tls;

/* Loads both libraries and fills `tls` (once; later calls return 0 at once). Returns 0, or -1
 * with the reason in err: which library or symbol is missing, and the packages that have it. */
int tlslib_load(char *err, size_t errlen);

#endif
