/* fuzz_cmdtable.c — libFuzzer target: COMMAND-reply parsing, lookups and key positions. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cmdtable.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Looks up a few names, including container/subcommand pairs, and checks every key index it is
 * given stays below argc: the property the proxy relies on when it reads argv[idx]. */
static void fuzz_probe(const struct cmd_table *t, const char *name, const char *sub)
{
    const struct cmd_info *ci = cmd_lookup(t, name, strlen(name), sub, sub ? strlen(sub) : 0);
    if (ci == NULL)
        return;
    if (strlen(ci->name) >= sizeof(ci->name))
        __builtin_trap();
    for (size_t argc = 0; argc < 12; argc++) {
        size_t idx[16];
        size_t n = cmd_keys(ci, argc, idx, 16);
        for (size_t i = 0; i < n && i < 16; i++) {
            if (idx[i] == 0 || idx[i] >= argc)
                __builtin_trap();
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int err = 0;
    struct cmd_table *t = cmd_table_parse((const char *)data, size, &err);
    if (t == NULL) {
        if (err != FG_ERR_PROTO && err != FG_ERR_NOMEM)
            __builtin_trap();
        return 0;
    }
    if (err != FG_OK)
        __builtin_trap();
    fuzz_probe(t, "set", NULL);
    fuzz_probe(t, "GET", NULL);
    fuzz_probe(t, "mset", NULL);
    fuzz_probe(t, "client", "kill");
    fuzz_probe(t, "XGROUP", "CREATE");
    fuzz_probe(t, "x", "");
    (void)cmd_table_count(t);
    cmd_table_free(t);
    return 0;
}
