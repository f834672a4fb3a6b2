/* cmdtable.h — command metadata (key positions, write flags) read from the upstream's COMMAND
 * reply. */
#ifndef FG_CMDTABLE_H
#define FG_CMDTABLE_H

#include <stddef.h>

#include "fg_error.h"

/* Flags taken from COMMAND's flag list. */
enum cmd_flag {
    CMD_WRITE = 1 << 0,
    CMD_READONLY = 1 << 1,
    CMD_DENYOOM = 1 << 2,
    CMD_ADMIN = 1 << 3,
    CMD_PUBSUB = 1 << 4,
    CMD_NOSCRIPT = 1 << 5,
    CMD_BLOCKING = 1 << 6,
    CMD_MOVABLEKEYS = 1 << 7, /* key positions depend on the arguments: see cmd_keys() */
    CMD_LOADING = 1 << 8,
    CMD_STALE = 1 << 9,
    CMD_FAST = 1 << 10,
    CMD_NO_MULTI = 1 << 11, /* refused inside MULTI (SAVE, SHUTDOWN, ...) */
};

struct cmd_info {
    char name[64];  /* lower case; a subcommand is "parent|sub", as Redis 7 names it */
    int arity;      /* as COMMAND reports: n = exactly n args, -n = at least n */
    unsigned flags; /* enum cmd_flag bits */
    int first_key;  /* legacy key range: 1-based argv index, 0 = no keys */
    int last_key;   /* negative counts from the end (-1 = last argument) */
    int step;
};

struct cmd_table;

/* Builds a table from one complete COMMAND reply (RESP2 bytes, as Redis 6 or 7 send it). Unknown
 * extra fields are ignored. Returns NULL with *err set (FG_ERR_PROTO or FG_ERR_NOMEM). */
struct cmd_table *cmd_table_parse(const char *reply, size_t len, int *err);
void cmd_table_free(struct cmd_table *t); /* NULL is a no-op */
size_t cmd_table_count(const struct cmd_table *t);

/* Looks a command up by name (any case, not NUL-terminated). For container commands (CLIENT,
 * CONFIG, XGROUP, ...) pass the subcommand too (sub may be NULL): "xgroup"+"create" finds
 * "xgroup|create", falling back to the parent. Returns NULL when unknown. */
const struct cmd_info *cmd_lookup(const struct cmd_table *t, const char *name, size_t name_len,
                                  const char *sub, size_t sub_len);

/* Whether the table lists subcommands ("client|list"), as Redis 7 and later's does. */
int cmd_table_has_subcommands(const struct cmd_table *t);

/* Key argument indexes of a call with argc arguments, from the legacy key range (does not handle
 * CMD_MOVABLEKEYS: the caller must treat those as "keys unknown"). Writes at most max indexes
 * into idx and returns how many keys the call has (may exceed max). */
size_t cmd_keys(const struct cmd_info *ci, size_t argc, size_t *idx, size_t max);

#endif
