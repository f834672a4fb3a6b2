/* cmdtable.c — builds the command metadata table from a COMMAND reply and answers lookups. */
#include "cmdtable.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "resp.h"

/* Declared limits. A real Redis 7 reply holds ~240 commands plus ~130 subcommands; a reply that
 * claims more than this is not from a Redis we can trust, so it is refused as malformed. */
#define CMD_TABLE_MAX_ENTRIES 65536
#define CMD_MAX_SUB_DEPTH     4 /* subcommands of subcommands ... deeper levels are skipped */
#define CMD_MIN_FIELDS        6 /* name, arity, flags, first_key, last_key, step */
#define CMD_FIELD_SUBCOMMANDS 9 /* Redis 7: the tenth field lists the subcommands */
#define CMD_NAME_MAX          (sizeof(((struct cmd_info *)0)->name) - 1)

struct cmd_entry {
    struct cmd_info info;
    size_t name_len;
    uint32_t hash;
    int has_subs; /* a container: "name|sub" entries exist */
};

struct cmd_table {
    struct cmd_entry *entries; /* distinct names, in reply order */
    size_t count;
    size_t alloc;
    uint32_t *slots; /* open addressing: 0 = empty, else index + 1 into entries */
    size_t nslots;   /* a power of two, kept at least twice count */
};

/* Where the walk is in the reply. */
struct cmd_reader {
    const char *buf;
    size_t len;
    size_t pos;
};

static const struct {
    const char *name;
    unsigned flag;
} cmd_flag_names[] = {
    {"write", CMD_WRITE},       {"readonly", CMD_READONLY},
    {"denyoom", CMD_DENYOOM},   {"admin", CMD_ADMIN},
    {"pubsub", CMD_PUBSUB},     {"noscript", CMD_NOSCRIPT},
    {"blocking", CMD_BLOCKING}, {"movablekeys", CMD_MOVABLEKEYS},
    {"loading", CMD_LOADING},   {"stale", CMD_STALE},
    {"fast", CMD_FAST},         {"no_multi", CMD_NO_MULTI},
};

/* ASCII only: command names are ASCII, and the locale must not change what matches. */
static unsigned char cmd_lower(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') ? (unsigned char)(c + ('a' - 'A')) : c;
}

static int cmd_ieq(const char *a, const char *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (cmd_lower((unsigned char)a[i]) != cmd_lower((unsigned char)b[i]))
            return 0;
    }
    return 1;
}

/* FNV-1a over the lower-cased bytes, so a lookup hashes its pieces without copying them. */
static uint32_t cmd_hash_update(uint32_t h, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= cmd_lower((unsigned char)s[i]);
        h *= 16777619u;
    }
    return h;
}

static uint32_t cmd_hash(const char *name, size_t name_len, const char *sub, size_t sub_len)
{
    uint32_t h = cmd_hash_update(2166136261u, name, name_len);
    if (sub != NULL) {
        h = cmd_hash_update(h, "|", 1);
        h = cmd_hash_update(h, sub, sub_len);
    }
    return h;
}

/* Does entry e carry the name "name" or "name|sub" (sub != NULL), ignoring case? */
static int cmd_entry_matches(const struct cmd_entry *e, uint32_t h, const char *name,
                             size_t name_len, const char *sub, size_t sub_len)
{
    if (e->hash != h)
        return 0;
    if (sub == NULL)
        return e->name_len == name_len && cmd_ieq(e->info.name, name, name_len);
    return e->name_len == name_len + 1 + sub_len && cmd_ieq(e->info.name, name, name_len) &&
           e->info.name[name_len] == '|' && cmd_ieq(e->info.name + name_len + 1, sub, sub_len);
}

static const struct cmd_entry *cmd_find(const struct cmd_table *t, const char *name,
                                        size_t name_len, const char *sub, size_t sub_len)
{
    if (t->nslots == 0)
        return NULL;
    uint32_t h = cmd_hash(name, name_len, sub, sub_len);
    size_t mask = t->nslots - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        uint32_t s = t->slots[i];
        if (s == 0)
            return NULL;
        const struct cmd_entry *e = &t->entries[s - 1];
        if (cmd_entry_matches(e, h, name, name_len, sub, sub_len))
            return e;
    }
}

static void cmd_slot_put(uint32_t *slots, size_t nslots, uint32_t h, uint32_t value)
{
    size_t mask = nslots - 1;
    size_t i = h & mask;
    while (slots[i] != 0)
        i = (i + 1) & mask;
    slots[i] = value;
}

/* Doubles the slot array when it would pass half full, so probes stay short. */
static int cmd_grow_slots(struct cmd_table *t)
{
    if (t->nslots != 0 && (t->count + 1) * 2 <= t->nslots)
        return 0;
    size_t n = t->nslots ? t->nslots * 2 : 64;
    uint32_t *slots = calloc(n, sizeof(*slots));
    if (slots == NULL)
        return FG_ERR_NOMEM;
    for (size_t i = 0; i < t->count; i++)
        cmd_slot_put(slots, n, t->entries[i].hash, (uint32_t)(i + 1));
    free(t->slots);
    t->slots = slots;
    t->nslots = n;
    return 0;
}

/* Adds info unless its name is already known (the first definition wins). */
static int cmd_table_add(struct cmd_table *t, const struct cmd_info *info, size_t name_len)
{
    if (cmd_find(t, info->name, name_len, NULL, 0) != NULL)
        return 0;
    if (t->count >= CMD_TABLE_MAX_ENTRIES)
        return FG_ERR_PROTO;
    int rc = cmd_grow_slots(t);
    if (rc != 0)
        return rc;
    if (t->count == t->alloc) {
        size_t n = t->alloc ? t->alloc * 2 : 256;
        struct cmd_entry *e = realloc(t->entries, n * sizeof(*e));
        if (e == NULL)
            return FG_ERR_NOMEM;
        t->entries = e;
        t->alloc = n;
    }
    struct cmd_entry *e = &t->entries[t->count];
    e->info = *info;
    e->name_len = name_len;
    e->hash = cmd_hash(info->name, name_len, NULL, 0);
    e->has_subs = 0;
    cmd_slot_put(t->slots, t->nslots, e->hash, (uint32_t)(t->count + 1));
    t->count++;
    return 0;
}

/* Marks each entry that "name|sub" entries name as their parent, so lookups of other commands
 * never hash their first argument. A subcommand whose parent is missing leaves nothing marked;
 * cmd_lookup() still finds it. */
static void cmd_mark_containers(struct cmd_table *t)
{
    for (size_t i = 0; i < t->count; i++) {
        const char *bar = memchr(t->entries[i].info.name, '|', t->entries[i].name_len);
        if (bar == NULL)
            continue;
        const struct cmd_entry *p =
            cmd_find(t, t->entries[i].info.name, (size_t)(bar - t->entries[i].info.name), NULL, 0);
        if (p != NULL)
            t->entries[p - t->entries].has_subs = 1;
    }
}

/* Reads one element header; anything short of a whole header is malformed, since the reply is
 * meant to be complete. */
static int cmd_read(struct cmd_reader *r, struct resp_elem *e)
{
    size_t used = 0;
    if (r->pos >= r->len)
        return FG_ERR_PROTO;
    if (resp_read_elem(r->buf + r->pos, r->len - r->pos, e, &used) != RESP_DONE)
        return FG_ERR_PROTO;
    if (used == 0 || used > r->len - r->pos)
        return FG_ERR_PROTO;
    r->pos += used;
    return 0;
}

static int cmd_skip(struct cmd_reader *r)
{
    size_t used = 0;
    if (r->pos >= r->len)
        return FG_ERR_PROTO;
    if (resp_skip_elem(r->buf + r->pos, r->len - r->pos, &used) != RESP_DONE)
        return FG_ERR_PROTO;
    if (used == 0 || used > r->len - r->pos)
        return FG_ERR_PROTO;
    r->pos += used;
    return 0;
}

/* An aggregate header was just read at `start`: step back and let resp_skip_elem() pass over the
 * whole element, so the rules for nested types stay in one place (resp.c). Scalars were already
 * consumed whole. */
static int cmd_skip_rest(struct cmd_reader *r, const struct resp_elem *e, size_t start)
{
    if (e->type != '*' && e->type != '%' && e->type != '~' && e->type != '>' && e->type != '|')
        return 0;
    r->pos = start;
    return cmd_skip(r);
}

/* Reads one integer field that must fit an int. */
static int cmd_read_int(struct cmd_reader *r, int *out)
{
    struct resp_elem e;
    int rc = cmd_read(r, &e);
    if (rc != 0)
        return rc;
    if (e.type != ':' || e.ival < INT_MIN || e.ival > INT_MAX)
        return FG_ERR_PROTO;
    *out = (int)e.ival;
    return 0;
}

/* Reads the flag list; flags this proxy has no use for are ignored. */
static int cmd_read_flags(struct cmd_reader *r, unsigned *flags)
{
    struct resp_elem e;
    int rc = cmd_read(r, &e);
    if (rc != 0)
        return rc;
    if (e.type != '*' && e.type != '~')
        return FG_ERR_PROTO;
    *flags = 0;
    for (long long i = 0; i < e.count; i++) {
        struct resp_elem f;
        size_t start = r->pos;
        if ((rc = cmd_read(r, &f)) != 0)
            return rc;
        if ((f.type != '+' && f.type != '$') || f.str == NULL) {
            if ((rc = cmd_skip_rest(r, &f, start)) != 0)
                return rc;
            continue;
        }
        for (size_t k = 0; k < sizeof(cmd_flag_names) / sizeof(cmd_flag_names[0]); k++) {
            const char *n = cmd_flag_names[k].name;
            if (strlen(n) == f.len && cmd_ieq(n, f.str, f.len)) {
                *flags |= cmd_flag_names[k].flag;
                break;
            }
        }
    }
    return 0;
}

/* Copies a command name lower-cased into info->name. Returns 1 when it fits and is usable, 0 when
 * the entry must be left out of the table (too long to store, or holding a NUL byte). */
static int cmd_set_name(struct cmd_info *info, const struct resp_elem *e, size_t *name_len)
{
    if (e->len == 0 || e->len > CMD_NAME_MAX || memchr(e->str, '\0', e->len) != NULL)
        return 0;
    for (size_t i = 0; i < e->len; i++)
        info->name[i] = (char)cmd_lower((unsigned char)e->str[i]);
    info->name[e->len] = '\0';
    *name_len = e->len;
    return 1;
}

static int cmd_parse_entry(struct cmd_table *t, struct cmd_reader *r, int depth);

static int cmd_parse_list(struct cmd_table *t, struct cmd_reader *r, long long count, int depth)
{
    for (long long i = 0; i < count; i++) {
        int rc = cmd_parse_entry(t, r, depth);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Parses one command entry (and, from Redis 7, its subcommands) at the reader's position. */
static int cmd_parse_entry(struct cmd_table *t, struct cmd_reader *r, int depth)
{
    struct resp_elem e;
    int rc = cmd_read(r, &e);
    if (rc != 0)
        return rc;
    if (e.type == '*' && e.count == -1)
        return 0; /* COMMAND INFO answers nil for a name it does not know */
    if (e.type != '*' || e.count < CMD_MIN_FIELDS)
        return FG_ERR_PROTO;

    struct cmd_info info;
    memset(&info, 0, sizeof(info));
    size_t name_len = 0;
    struct resp_elem n;
    if ((rc = cmd_read(r, &n)) != 0)
        return rc;
    if ((n.type != '$' && n.type != '+') || n.str == NULL)
        return FG_ERR_PROTO;
    int keep = cmd_set_name(&info, &n, &name_len);
    if ((rc = cmd_read_int(r, &info.arity)) != 0 || (rc = cmd_read_flags(r, &info.flags)) != 0 ||
        (rc = cmd_read_int(r, &info.first_key)) != 0 ||
        (rc = cmd_read_int(r, &info.last_key)) != 0 || (rc = cmd_read_int(r, &info.step)) != 0)
        return rc;
    /* Add the parent before its subcommands, so a table lists "client" before "client|kill". */
    if (keep && (rc = cmd_table_add(t, &info, name_len)) != 0)
        return rc;

    for (long long i = CMD_MIN_FIELDS; i < e.count; i++) {
        if (i != CMD_FIELD_SUBCOMMANDS) {
            if ((rc = cmd_skip(r)) != 0)
                return rc;
            continue;
        }
        struct resp_elem s;
        size_t start = r->pos;
        if ((rc = cmd_read(r, &s)) != 0)
            return rc;
        if (s.type == '*' && depth < CMD_MAX_SUB_DEPTH)
            rc = cmd_parse_list(t, r, s.count, depth + 1);
        else
            rc = cmd_skip_rest(r, &s, start);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Builds a table from one complete COMMAND reply. The reply must be exactly len bytes: trailing
 * bytes mean the caller framed it wrongly, which is reported as FG_ERR_PROTO rather than guessed
 * at. Returns the table (free with cmd_table_free()) or NULL with *err set to FG_ERR_PROTO
 * (malformed, truncated, an error reply, or more than CMD_TABLE_MAX_ENTRIES commands) or
 * FG_ERR_NOMEM. */
struct cmd_table *cmd_table_parse(const char *reply, size_t len, int *err)
{
    int dummy;
    if (err == NULL)
        err = &dummy;
    *err = FG_ERR_PROTO;
    if (reply == NULL || len == 0)
        return NULL;

    struct cmd_table *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        *err = FG_ERR_NOMEM;
        return NULL;
    }
    struct cmd_reader r = {reply, len, 0};
    struct resp_elem top;
    int rc = cmd_read(&r, &top);
    if (rc == 0 && (top.type != '*' || top.count < 0))
        rc = FG_ERR_PROTO;
    if (rc == 0)
        rc = cmd_parse_list(t, &r, top.count, 0);
    if (rc == 0 && r.pos != len)
        rc = FG_ERR_PROTO;
    if (rc != 0) {
        cmd_table_free(t);
        *err = rc;
        return NULL;
    }
    cmd_mark_containers(t);
    *err = FG_OK;
    return t;
}

/* Frees the table and every cmd_info it handed out; NULL is a no-op. */
void cmd_table_free(struct cmd_table *t)
{
    if (t == NULL)
        return;
    free(t->entries);
    free(t->slots);
    free(t);
}

/* Returns the number of distinct commands, subcommands included ("client|kill" counts once,
 * "client" once more). 0 for NULL. */
size_t cmd_table_count(const struct cmd_table *t)
{
    return t ? t->count : 0;
}

/* Looks up "name", and "name|sub" when sub is given and "name" is a container (or unknown):
 * the subcommand's entry when there is one, else the parent's. Never allocates: the key is hashed
 * and compared piecewise. Returns a pointer owned by the table (valid until cmd_table_free()), or
 * NULL when unknown or when t or name is NULL. */
const struct cmd_info *cmd_lookup(const struct cmd_table *t, const char *name, size_t name_len,
                                  const char *sub, size_t sub_len)
{
    if (t == NULL || name == NULL || name_len == 0 || name_len > CMD_NAME_MAX)
        return NULL;
    const struct cmd_entry *e = cmd_find(t, name, name_len, NULL, 0), *s = NULL;
    if ((e == NULL || e->has_subs) && sub != NULL && sub_len > 0 &&
        sub_len < CMD_NAME_MAX - name_len)
        s = cmd_find(t, name, name_len, sub, sub_len);
    return s ? &s->info : e ? &e->info : NULL;
}

/* Key indexes from the legacy (first, last, step) range, as Redis computes it: a negative last
 * counts from the end (last = argc + last). Indexes are clamped below argc, so a call with too
 * few arguments yields fewer keys rather than out-of-range ones. Writes at most max indexes and
 * returns the full count; 0 for NULL ci, no keys, or a range that is empty for this argc. */
size_t cmd_keys(const struct cmd_info *ci, size_t argc, size_t *idx, size_t max)
{
    if (ci == NULL || ci->first_key <= 0 || argc == 0)
        return 0;
    size_t first = (size_t)ci->first_key;
    size_t last;
    if (ci->last_key < 0) {
        size_t back = (size_t)(-(long long)ci->last_key);
        if (back > argc)
            return 0;
        last = argc - back;
    } else {
        last = (size_t)ci->last_key;
    }
    if (last >= argc)
        last = argc - 1;
    if (first > last)
        return 0;
    /* A step of 0 would list the first key forever; read it as "every argument" instead. */
    size_t step = ci->step > 0 ? (size_t)ci->step : 1;
    size_t count = (last - first) / step + 1;
    for (size_t i = 0; i < count && i < max && idx != NULL; i++)
        idx[i] = first + i * step;
    return count;
}

int cmd_table_has_subcommands(const struct cmd_table *t)
{
    const struct cmd_info *ci = t ? cmd_lookup(t, "client", 6, "list", 4) : NULL;

    return ci && strchr(ci->name, '|') != NULL;
}
