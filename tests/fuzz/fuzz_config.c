/* fuzz_config.c — libFuzzer target: arbitrary bytes as a config file, URL, address and argv. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"

#define FUZZ_MAX_ARGS 16

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A message must be NUL-terminated inside its buffer and start with what the caller relies on. */
static void check_msg(const struct cfg_error *err, const char *prefix)
{
    if (strnlen(err->msg, sizeof err->msg) >= sizeof err->msg)
        abort();
    if (strncmp(err->msg, prefix, strlen(prefix)) != 0)
        abort();
}

static void check_addr(const struct cfg_addr *a)
{
    if (a->port < 1 || a->port > 65535 || a->host[0] == '\0')
        abort();
    if (strnlen(a->host, sizeof a->host) >= sizeof a->host)
        abort();
}

static void check_url(const struct cfg_url *u)
{
    if (u->kind < CFG_URL_REDIS || u->kind > CFG_URL_HTTP)
        abort();
    if (u->nhosts < 1 || u->nhosts > CFG_MAX_HOSTS)
        abort();
    if (u->kind != CFG_URL_ETCD && u->kind != CFG_URL_POSTGRES && u->nhosts != 1)
        abort();
    for (int i = 0; i < u->nhosts; i++)
        check_addr(&u->hosts[i]);
    if (u->db < 0)
        abort();
}

/* Once cfg_finish() accepts a config, the proxy relies on these. */
static void check_finished(const struct cfg *c)
{
    int upstream_is_store = 0;

    check_addr(&c->listen_resp);
    check_addr(&c->listen_http);
    check_url(&c->upstream);
    check_url(&c->backend);
    if (c->upstream.kind != CFG_URL_REDIS)
        abort();
    if (c->backend.kind != CFG_URL_REDIS && c->backend.kind != CFG_URL_ETCD)
        abort();
    if (c->nstores < 1 || c->nstores > CFG_MAX_STORES || c->nprotect < 0 ||
        c->nprotect > CFG_MAX_PROTECT)
        abort();
    for (int i = 0; i < c->nstores; i++) {
        check_url(&c->stores[i].url);
        if (c->stores[i].url.kind == CFG_URL_ETCD)
            abort();
        if (c->stores[i].url.kind == CFG_URL_REDIS &&
            strcasecmp(c->stores[i].url.hosts[0].host, c->upstream.hosts[0].host) == 0 &&
            c->stores[i].url.hosts[0].port == c->upstream.hosts[0].port)
            upstream_is_store = 1;
        for (int j = 0; j < i; j++)
            if (strcmp(c->stores[i].name, c->stores[j].name) == 0)
                abort();
    }
    if (!upstream_is_store)
        abort();
    for (int i = 0; i < c->nprotect; i++) {
        int found = 0;

        for (int j = 0; j < c->nstores; j++) {
            const struct cfg_url *u = &c->stores[j].url;

            /* a rule on a Redis store is the Redis endpoint's: its store is the upstream */
            if (strcmp(c->protect[i].store, c->stores[j].name) == 0)
                found = u->kind != CFG_URL_REDIS || cfg_is_upstream(c, u);
        }
        if (!found || !c->protect[i].keys[0] || !c->protect[i].lock[0])
            abort();
    }
    if (c->session_ttl_ms < 500 || c->session_ttl_ms > 3600000 || c->max_clients < 1 ||
        c->max_clients > 1000000 || c->max_args < 1 || c->max_request_bytes < 1024 ||
        c->max_pending_bytes < 4096 || c->shutdown_grace_ms < 0 || c->shutdown_grace_ms > 600000)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct cfg *cfg; /* about 1 MB: allocated once, refilled per input */
    struct cfg_error err;
    struct cfg_url url;
    struct cfg_addr addr;
    char *s, *argv[FUZZ_MAX_ARGS + 2];
    enum cfg_action action;
    int argc = 1;

    if (!cfg && !(cfg = malloc(sizeof *cfg)))
        abort();

    /* The bytes as a whole config file. */
    cfg_defaults(cfg);
    memset(&err, 0, sizeof err);
    if (cfg_parse_yaml(cfg, (const char *)data, size, "fuzz.yaml", &err) == FG_OK) {
        if (cfg_finish(cfg, &err) == FG_OK)
            check_finished(cfg);
    } else {
        check_msg(&err, "fuzz.yaml:");
    }

    /* The bytes as one string. */
    s = malloc(size + 1);
    if (!s)
        abort();
    memcpy(s, data, size);
    s[size] = '\0';
    if (cfg_parse_url(s, &url, &err) == FG_OK)
        check_url(&url);
    else
        check_msg(&err, "bad URL '");
    if (cfg_parse_addr(s, &addr, &err) == FG_OK)
        check_addr(&addr);
    else
        check_msg(&err, "bad address '");

    /* The bytes as lines of argv, and again as an environment. */
    argv[0] = "fencegate";
    for (char *p = s; argc <= FUZZ_MAX_ARGS && p;) {
        char *nl = strchr(p, '\n');

        if (nl)
            *nl = '\0';
        argv[argc++] = p;
        p = nl ? nl + 1 : NULL;
    }
    argv[argc] = NULL;
    cfg_defaults(cfg);
    (void)cfg_config_path(argc, argv, argv + 1);
    if (cfg_apply_args(cfg, argc, argv, &action, &err) == FG_OK &&
        cfg_apply_env(cfg, argv + 1, &err) == FG_OK && action == CFG_RUN &&
        cfg_finish(cfg, &err) == FG_OK)
        check_finished(cfg);
    free(s);
    return 0;
}
