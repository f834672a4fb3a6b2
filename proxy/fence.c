/* fence.c — pure fencing decisions: key-to-lock rules, write verdicts, the fencing scripts. */
#include "fence.h"

#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define FENCE_MAX_CAPTURES 9  /* "$1".."$9": only the first nine '*' can be named */
#define FENCE_U64_DIGITS   20 /* decimal digits of UINT64_MAX */

/* One compiled rule: copies of the glob and the template, with their lengths. */
struct fence_crule {
    char *glob;
    size_t glen;
    char *tmpl;
    size_t tlen;
};

struct fence_rules {
    struct fence_crule *rules;
    size_t n;
};

/* What one '*' of a glob matched: key[start .. start+len). */
struct fence_span {
    size_t start;
    size_t len;
};

/* ---- Rules --------------------------------------------------------------------------------- */

static char *fence_strdup(const char *s, size_t *len)
{
    size_t n = strlen(s);
    char *p = malloc(n + 1);
    if (p == NULL)
        return NULL;
    memcpy(p, s, n + 1);
    *len = n;
    return p;
}

static size_t fence_count_stars(const char *glob, size_t glen)
{
    size_t n = 0;
    for (size_t i = 0; i < glen; i++)
        if (glob[i] == '*')
            n++;
    return n;
}

/* Checks that every "$N" of a template names a '*' the glob has. "$$" is an escaped '$' and is
 * skipped whole, so "$$1" is the text "$1" and references nothing. Returns 1 if valid, else 0. */
static int fence_template_valid(const char *tmpl, size_t tlen, size_t nstars)
{
    for (size_t i = 0; i < tlen; i++) {
        if (tmpl[i] != '$' || i + 1 >= tlen)
            continue;
        char c = tmpl[i + 1];
        if (c == '$') {
            i++;
        } else if (c >= '1' && c <= '9') {
            if ((size_t)(c - '0') > nstars)
                return 0;
            i++;
        }
    }
    return 1;
}

void fence_rules_free(struct fence_rules *r)
{
    if (r == NULL)
        return;
    for (size_t i = 0; i < r->n; i++) {
        free(r->rules[i].glob);
        free(r->rules[i].tmpl);
    }
    free(r->rules);
    free(r);
}

/* Copies and checks the rules. A rule with a NULL glob or template, or whose template names a
 * '*' its glob lacks, is a configuration error: reporting it at start beats a key that silently
 * maps to a lock nobody can name. */
struct fence_rules *fence_rules_new(const struct fence_rule *rules, size_t n, int *err)
{
    struct fence_rules *r = calloc(1, sizeof(*r));
    if (r == NULL)
        goto nomem;
    if (n > 0) {
        r->rules = calloc(n, sizeof(*r->rules));
        if (r->rules == NULL)
            goto nomem;
    }
    for (size_t i = 0; i < n; i++) {
        if (rules[i].glob == NULL || rules[i].lock_template == NULL)
            goto config;
        struct fence_crule *c = &r->rules[i];
        r->n = i + 1; /* so fence_rules_free releases what this rule gets */
        c->glob = fence_strdup(rules[i].glob, &c->glen);
        c->tmpl = fence_strdup(rules[i].lock_template, &c->tlen);
        if (c->glob == NULL || c->tmpl == NULL)
            goto nomem;
        if (!fence_template_valid(c->tmpl, c->tlen, fence_count_stars(c->glob, c->glen)))
            goto config;
    }
    return r;
nomem:
    fence_rules_free(r);
    if (err != NULL)
        *err = FG_ERR_NOMEM;
    return NULL;
config:
    fence_rules_free(r);
    if (err != NULL)
        *err = FG_ERR_CONFIG;
    return NULL;
}

/* ---- Matching ------------------------------------------------------------------------------ */

/* Matches key against glob ('*' any run of bytes, '?' one byte, the rest literal) and records
 * what each of the first FENCE_MAX_CAPTURES stars matched. Returns 1 on a match, else 0.
 *
 * The two-pointer scan with backtracking to the last star runs in O(glen * klen) at worst, never
 * exponentially. Its captures are leftmost-shortest: each star takes the shortest span that still
 * lets the whole key match, the earlier stars first. So "a:*:b:*" on "a:x:b:y:b:z" gives
 * $1 = "x", $2 = "y:b:z". Backtracking only to the last star is enough because once a later
 * star is reached, any longer choice for an earlier one could be absorbed by the later one. */
static int fence_glob_match(const char *glob, size_t glen, const char *key, size_t klen,
                            struct fence_span *caps)
{
    size_t gi = 0, ki = 0;
    size_t nstar = 0;       /* stars passed so far on the current path */
    bool have_star = false; /* a star to backtrack to */
    size_t star_g = 0;      /* glob index just after that star */
    size_t star_k = 0;      /* key index where its span currently ends */
    size_t star_n = 0;      /* its ordinal */

    while (ki < klen) {
        if (gi < glen && glob[gi] == '*') {
            if (nstar < FENCE_MAX_CAPTURES) {
                caps[nstar].start = ki;
                caps[nstar].len = 0;
            }
            have_star = true;
            star_n = nstar++;
            star_g = ++gi;
            star_k = ki;
        } else if (gi < glen && (glob[gi] == '?' || glob[gi] == key[ki])) {
            gi++;
            ki++;
        } else if (have_star) {
            /* Grow the last star by one byte and retry what follows it. */
            star_k++;
            if (star_n < FENCE_MAX_CAPTURES)
                caps[star_n].len = star_k - caps[star_n].start;
            ki = star_k;
            gi = star_g;
            nstar = star_n + 1;
        } else {
            return 0;
        }
    }
    /* The key is used up: only stars, each matching the empty tail, may remain. */
    while (gi < glen && glob[gi] == '*') {
        if (nstar < FENCE_MAX_CAPTURES) {
            caps[nstar].start = klen;
            caps[nstar].len = 0;
        }
        nstar++;
        gi++;
    }
    return gi == glen;
}

/* Output that keeps counting past its capacity, so callers learn the size they would need. */
struct fence_out {
    char *buf;
    size_t cap;
    size_t len;
};

static void fence_put(struct fence_out *o, const void *p, size_t n)
{
    if (n > 0 && o->len < o->cap) {
        size_t room = o->cap - o->len;
        memcpy(o->buf + o->len, p, n < room ? n : room);
    }
    o->len = (n > SIZE_MAX - o->len) ? SIZE_MAX : o->len + n;
}

/* Expands "$1".."$9" with the captures, "$$" to '$'; any other '$' is literal. The template was
 * checked by fence_rules_new, so every "$N" has its capture. */
static void fence_expand(const struct fence_crule *c, const char *key,
                         const struct fence_span *caps, struct fence_out *o)
{
    size_t lit = 0; /* start of the pending literal run */
    for (size_t i = 0; i < c->tlen; i++) {
        if (c->tmpl[i] != '$' || i + 1 >= c->tlen)
            continue;
        char next = c->tmpl[i + 1];
        if (next == '$') {
            fence_put(o, c->tmpl + lit, i + 1 - lit); /* up to and including the first '$' */
            i++;
            lit = i + 1;
        } else if (next >= '1' && next <= '9') {
            const struct fence_span *s = &caps[next - '1'];
            fence_put(o, c->tmpl + lit, i - lit);
            fence_put(o, key + s->start, s->len);
            i++;
            lit = i + 1;
        }
    }
    fence_put(o, c->tmpl + lit, c->tlen - lit);
}

/* How a key came to be claimed by a lock. */
enum { FENCE_BY_RULE = 1, FENCE_BY_TAG = 2 };

/* Resolves key to its lock: the first rule whose glob matches and whose name comes out non-empty,
 * then the hash tag. Writes at most cap bytes of the name and sets *full to its whole length.
 * Returns FENCE_BY_RULE or FENCE_BY_TAG when the key is claimed, 0 when not. An empty name is no
 * lock (as "{}" is no hash tag), so such a rule steps aside for the next one. */
static int fence_resolve(const struct fence_rules *r, const char *key, size_t klen, char *lock,
                         size_t cap, size_t *full)
{
    struct fence_span caps[FENCE_MAX_CAPTURES];
    size_t nrules = r != NULL ? r->n : 0;

    for (size_t i = 0; i < nrules; i++) {
        const struct fence_crule *c = &r->rules[i];
        if (!fence_glob_match(c->glob, c->glen, key, klen, caps))
            continue;
        struct fence_out o = {lock, cap, 0};
        fence_expand(c, key, caps, &o);
        if (o.len > 0) {
            *full = o.len;
            return FENCE_BY_RULE;
        }
    }

    /* Redis Cluster's hash tag: the first '{', then the first '}' after it, non-empty between. */
    const char *open = memchr(key, '{', klen);
    if (open != NULL) {
        size_t from = (size_t)(open - key) + 1;
        const char *close = memchr(key + from, '}', klen - from);
        if (close != NULL && close > key + from) {
            size_t n = (size_t)(close - (key + from));
            if (cap > 0)
                memcpy(lock, key + from, n < cap ? n : cap);
            *full = n;
            return FENCE_BY_TAG;
        }
    }
    *full = 0;
    return 0;
}

int fence_lock_for_key(const struct fence_rules *r, const char *key, size_t klen, char *lock,
                       size_t cap)
{
    size_t full;
    if (!fence_resolve(r, key, klen, lock, cap, &full))
        return 0;
    if (full > cap || full > INT_MAX)
        return FG_ERR_LIMIT;
    return (int)full;
}

/* ---- Decisions ----------------------------------------------------------------------------- */

static void fence_ref_set(struct fence_lock_ref *ref, const char *name, size_t len, uint64_t token)
{
    if (len > sizeof(ref->name)) /* only a caller's corrupt only_lock can get here */
        len = sizeof(ref->name);
    memcpy(ref->name, name, len);
    ref->len = len;
    ref->token = token;
}

/* Adds a lock to the decision unless it is there already. Returns 0, or FG_ERR_LIMIT when it
 * would be lock number FENCE_MAX_LOCKS + 1. */
static int fence_add_lock(struct fence_decision *d, const char *name, size_t len, uint64_t token)
{
    for (size_t i = 0; i < d->nlocks; i++)
        if (d->locks[i].len == len && memcmp(d->locks[i].name, name, len) == 0)
            return 0;
    if (d->nlocks == FENCE_MAX_LOCKS)
        return FG_ERR_LIMIT;
    fence_ref_set(&d->locks[d->nlocks++], name, len, token);
    return 0;
}

static int fence_has_lock(const struct fence_decision *d, const char *name, size_t len)
{
    for (size_t i = 0; i < d->nlocks; i++)
        if (d->locks[i].len == len && memcmp(d->locks[i].name, name, len) == 0)
            return 1;
    return 0;
}

/* Stops the decision on key k with a refusal naming lock. */
static void fence_refuse(struct fence_decision *d, enum fence_verdict v, size_t k, const char *name,
                         size_t len)
{
    d->verdict = v;
    d->key_index = k;
    fence_ref_set(&d->offending, name, len, 0);
    d->offending_full = len;
}

/* Keys are judged in order and the first refusal wins, so the error names the first key at
 * fault. Failing closed: a key whose lock name is longer than FENCE_MAX_LOCK cannot be fenced,
 * so it is refused with FENCE_NOLOCK and `offending` holds the first FENCE_MAX_LOCK bytes of the
 * name. FENCE_TOOMANY also sets key_index and offending, to the first lock that did not fit. */
void fence_decide(const struct fence_rules *r, const char *const *argv, const size_t *lens,
                  const size_t *key_idx, size_t nkeys, const struct fence_lock_ref *only_lock,
                  fence_lookup_fn lookup, void *lookup_arg, struct fence_decision *out)
{
    char name[FENCE_MAX_LOCK];

    out->verdict = FENCE_PASS;
    out->owner = NULL;
    out->nlocks = 0;
    out->key_index = 0;
    out->offending.len = 0;
    out->offending.token = 0;

    for (size_t i = 0; i < nkeys; i++) {
        size_t k = key_idx[i];
        size_t full;
        size_t len;
        uint64_t token = 0;
        int claim = fence_resolve(r, argv[k], lens[k], name, sizeof(name), &full);
        enum fence_lock_state st = FENCE_NOT_HELD;

        if (claim == FENCE_BY_TAG && full <= sizeof(name) && !fence_has_lock(out, name, full)) {
            /* A hash tag guards its key only for a session that holds (or lost) that lock:
             * applications use tags to place keys in one Cluster slot, and those keys must keep
             * working for connections that never heard of fencing. */
            st = lookup(lookup_arg, name, full, &token);
            if (st == FENCE_NOT_HELD)
                claim = 0;
        }
        if (!claim) {
            if (only_lock == NULL)
                continue; /* unprotected key */
            if (fence_add_lock(out, only_lock->name, only_lock->len, only_lock->token) < 0) {
                fence_refuse(out, FENCE_TOOMANY, k, only_lock->name, only_lock->len);
                return;
            }
            continue;
        }
        len = full < sizeof(name) ? full : sizeof(name);
        if (full > sizeof(name)) {
            fence_refuse(out, FENCE_NOLOCK, k, name, len);
            out->offending_full = full;
            return;
        }
        if (fence_has_lock(out, name, len))
            continue;
        if (claim == FENCE_BY_RULE)
            st = lookup(lookup_arg, name, len, &token);
        switch (st) {
        case FENCE_HELD:
            if (fence_add_lock(out, name, len, token) < 0) {
                fence_refuse(out, FENCE_TOOMANY, k, name, len);
                return;
            }
            break;
        case FENCE_LOST:
            fence_refuse(out, FENCE_LOCKLOST, k, name, len);
            out->offending.token = token; /* the token the session had: the error names it */
            return;
        case FENCE_NOT_HELD:
        default:
            fence_refuse(out, FENCE_NOLOCK, k, name, len);
            return;
        }
    }
    if (nkeys == 0 && only_lock != NULL) /* a keyless write: the one-lock rule covers it too */
        fence_add_lock(out, only_lock->name, only_lock->len, only_lock->token);
    out->verdict = out->nlocks > 0 ? FENCE_APPLY : FENCE_PASS;
}

/* ---- Scripts ------------------------------------------------------------------------------- */

/* Tokens and marks are compared as decimal strings without leading zeros (shorter is smaller,
 * then byte by byte): Lua numbers are doubles, which cannot tell 2^53 from 2^53 + 1, and tokens go
 * up to 2^63 - 1. Anything else in a mark (a sign, a leading zero, an exponent) is reported, not
 * judged. A write needs each mark to equal its token, and raises none: fence on acquire set the
 * mark to the token before the token was handed out, and only a newer grant moves it. Above the
 * token: STALE, a newer holder exists. Below it, or missing: the mark set at the grant is gone (a
 * failover to a replica that missed it, a deleted key), and nothing proves that no former holder
 * wrote since: LOCKLOST "... is above its high-water mark ...", on which the sidecar gives the
 * lock up (lock_forfeit()) so that the next FENCE.ACQUIRE gets a new token and a new mark. A mark
 * that cannot be read is reported as fencegate's own error, not mistaken for the command's; the
 * command runs under pcall so its own error (WRONGTYPE, ...) comes back as its reply.
 *
 * one() judges and applies one fenced write, for the single and the grouped script alike:
 * ARGV[a] = n, ARGV[a + 1] = the owner id ("": none), then n tokens, n lock names, and the
 * command up to ARGV[last]; the write's keys after KEYS[k] are its n marks, then with an owner
 * its n lock keys. It is the scripts' only function: Redis runs a script's body at every call,
 * and each function defined there is made anew each time. */
#define FENCE_ONE_LUA                                                                              \
    "local function one(k, a, last, db)\n"                                                         \
    "  local n, owner = tonumber(ARGV[a]), ARGV[a + 1]\n"                                          \
    "  if n == nil or owner == nil or k + (owner == '' and n or 2 * n) > #KEYS then\n"             \
    "    return redis.error_reply('ERR fencegate write script: ' .. #KEYS .. ' keys for '\n"       \
    "      .. tostring(ARGV[a]) .. ' more locks (a fencegate bug; report it)')\n"                  \
    "  end\n"                                                                                      \
    "  for i = 1, n do\n"                                                                          \
    "    local tok, name, key = ARGV[a + 1 + i], ARGV[a + 1 + n + i], KEYS[k + i]\n"               \
    "    local mark = redis.pcall('GET', key)\n"                                                   \
    "    if type(mark) == 'table' then\n"                                                          \
    "      return redis.error_reply('ERR fencegate write script: mark ' .. key .. ' of lock '\n"   \
    "        .. name .. ': ' .. tostring(mark.err) .. ' (delete or repair that key)')\n"           \
    "    end\n"                                                                                    \
    "    mark = mark or '0'\n"                                                                     \
    "    if not (string.find(tok, '^[1-9]%d*$') and (mark == '0'\n"                                \
    "        or string.find(mark, '^[1-9]%d*$'))) then\n"                                          \
    "      return redis.error_reply('ERR fencegate write script: lock ' .. name .. ' token '\n"    \
    "        .. tok .. ' or mark ' .. mark .. ' is not a number (check key ' .. key .. ')')\n"     \
    "    end\n"                                                                                    \
    "    if #tok < #mark or (#tok == #mark and tok < mark) then\n"                                 \
    "      return redis.error_reply('STALE lock ' .. name .. ' token ' .. tok\n"                   \
    "        .. ' < high-water mark ' .. mark .. ' (a newer holder exists; re-acquire)')\n"        \
    "    end\n"                                                                                    \
    "    if owner ~= '' then\n"                                                                    \
    "      local holder = redis.pcall('GET', KEYS[k + n + i])\n"                                   \
    "      if holder ~= owner then\n"                                                              \
    "        return redis.error_reply('LOCKLOST lock ' .. name .. ' (token ' .. tok\n"             \
    "          .. ') is not held in the store: ' .. (holder and 'another holder has it'\n"         \
    "          or 'its lease ran out there') .. ' (the store lost data in a failover, or this '\n" \
    "          .. 'sidecar fell behind); re-acquire')\n"                                           \
    "      end\n"                                                                                  \
    "    end\n"                                                                                    \
    "    if tok ~= mark then\n"                                                                    \
    "      return redis.error_reply('LOCKLOST lock ' .. name .. ' (token ' .. tok\n"               \
    "        .. ') is above its high-water mark ' .. mark .. ': the mark set when it was '\n"      \
    "        .. 'granted is gone (the store lost data in a failover, or ' .. key .. ' was '\n"     \
    "        .. 'deleted), so a former holder may have written since; re-acquire')\n"              \
    "    end\n"                                                                                    \
    "  end\n"                                                                                      \
    "  if db then redis.call('SELECT', db) end\n"                                                  \
    "  return redis.pcall(unpack(ARGV, a + 2 * n + 2, last))\n"                                    \
    "end\n"

static const char fence_write_lua[] =
    "-- fencegate fenced write: KEYS = marks[, lock keys]; ARGV = n, owner, tokens, lock names,\n"
    "-- command\n"
    /* defines one() */ FENCE_ONE_LUA /* then: */
    "if (ARGV[2] == '' and 1 or 2) * (tonumber(ARGV[1]) or -1) ~= #KEYS then\n"
    "  return redis.error_reply('ERR fencegate write script: ' .. #KEYS .. ' keys for '\n"
    "    .. tostring(ARGV[1]) .. ' locks (a fencegate bug; report it)')\n"
    "end\n"
    "return one(0, 1, #ARGV)\n";

/* A write from a connection in another database than the store's, where the marks live (a
 * script's SELECT does not outlast it). Selecting the client's database first makes one it
 * cannot use fail before anything is written. */
static const char fence_write_db_lua[] =
    "-- fencegate fenced write in another database: KEYS = marks[, lock keys]; ARGV = the marks'\n"
    "-- database, the command's, then as the write script\n"
    /* defines one() */ FENCE_ONE_LUA /* then: */
    "if (ARGV[4] == '' and 1 or 2) * (tonumber(ARGV[3]) or -1) ~= #KEYS then\n"
    "  return redis.error_reply('ERR fencegate write script: ' .. #KEYS .. ' keys for '\n"
    "    .. tostring(ARGV[3]) .. ' locks (a fencegate bug; report it)')\n"
    "end\n"
    "redis.call('SELECT', ARGV[2])\n"
    "redis.call('SELECT', ARGV[1])\n"
    "return one(0, 3, #ARGV, ARGV[2])\n";

/* Writes that were pipelined back to back, in one script: each is judged and applied on its own,
 * in order, exactly as the single script would, and its reply is one element of the array. A
 * write that raises a Lua error (too many arguments for unpack, say) gets that error as its reply
 * instead of ending the script: the writes before it were applied and must be answered so. */
static const char fence_group_lua[] =
    "-- fencegate fenced writes, grouped: KEYS = the keys of every write, in order;\n"
    "-- ARGV = the number of writes, then per write its argument count and ARGV as above\n"
    /* defines one() */ FENCE_ONE_LUA /* then: */
    "local out, k, a = {}, 0, 2\n"
    "for w = 1, tonumber(ARGV[1]) do\n"
    "  local last = a + tonumber(ARGV[a])\n"
    "  local ok, r = pcall(one, k, a + 1, last)\n"
    "  if not ok then\n"
    "    r = redis.error_reply('ERR fencegate write script: '\n"
    "      .. tostring(type(r) == 'table' and r.err or r))\n"
    "  end\n"
    "  out[w] = r\n"
    "  k = k + (ARGV[a + 2] == '' and 1 or 2) * tonumber(ARGV[a + 1])\n"
    "  a = last + 1\n"
    "end\n"
    "return out\n";

static const char fence_raise_lua[] =
    "-- fencegate fence on acquire: KEYS[1] = the mark, ARGV[1] = the new token. Returns 0\n"
    "-- (raised) or the mark at or above it, as a string\n"
    "local mark = redis.pcall('GET', KEYS[1])\n"
    "if type(mark) == 'table' then\n"
    "  return redis.error_reply('ERR fencegate raise script: mark ' .. KEYS[1] .. ': '\n"
    "    .. tostring(mark.err) .. ' (delete or repair that key)')\n"
    "end\n"
    "mark = mark or '0'\n"
    "local t = ARGV[1]\n"
    "if not (string.find(t, '^[1-9]%d*$') and (mark == '0' or string.find(mark, '^[1-9]%d*$')))\n"
    "then\n"
    "  return redis.error_reply('ERR fencegate raise script: token ' .. t\n"
    "    .. ' or mark ' .. mark .. ' is not a number (check key ' .. KEYS[1] .. ')')\n"
    "end\n"
    "if #t > #mark or (#t == #mark and t > mark) then\n"
    "  redis.call('SET', KEYS[1], t)\n"
    "  return 0\n"
    "end\n"
    "return mark\n";

static int name_eq(const char *p, size_t n, const char *lit)
{
    return strlen(lit) == n && strncasecmp(p, lit, n) == 0;
}

int fence_null_is_array(const char *const *argv, const size_t *lens, size_t argc)
{
    if (argc == 3 && (name_eq(argv[0], lens[0], "lpop") || name_eq(argv[0], lens[0], "rpop")))
        return 1;
    return argc > 0 && (name_eq(argv[0], lens[0], "lmpop") || name_eq(argv[0], lens[0], "zmpop") ||
                        name_eq(argv[0], lens[0], "xreadgroup"));
}

const char *fence_write_script(void)
{
    return fence_write_lua;
}

const char *fence_write_db_script(void)
{
    return fence_write_db_lua;
}

const char *fence_group_script(void)
{
    return fence_group_lua;
}

const char *fence_raise_script(void)
{
    return fence_raise_lua;
}

/* The checks before a transaction go with their bodies every time (a flushed script cache must not
 * skip them), and Redis hashes a body at every EVAL: 1.6 KiB of it cost Redis as much as 7 of the
 * 16 SETs of a pipelined run (its CPU per SET, one connection), so these are written tight, one
 * statement a line, no indentation. FENCE_CHECK_LUA judges the locks as one() does, mark first,
 * and leaves the refusal in `w` (nil when all pass); `lost` words the two LOCKLOST refusals. */
#define FENCE_CHECK_LUA                                                                            \
    "local n,o,w=tonumber(ARGV[1]),ARGV[2]\n"                                                      \
    "local function lost(l,t,x) return 'LOCKLOST lock '..l..' (token '..t..') is '..x end\n"       \
    "for i=1,n do\n"                                                                               \
    "local t,l,m=ARGV[2+i],ARGV[2+n+i],redis.pcall('GET',KEYS[i])\n"                               \
    "if type(m)~='table' then m=m or '0' end\n"                                                    \
    "if type(m)=='table' or not string.find(t,'^[1-9]%d*$')"                                       \
    " or m~='0' and not string.find(m,'^[1-9]%d*$') then\n"                                        \
    "w='ERR fencegate write check: mark '..KEYS[i]..' of lock '..l"                                \
    "..' is not a number (delete or repair that key)'\n"                                           \
    "elseif #t<#m or #t==#m and t<m then\n"                                                        \
    "w='STALE lock '..l..' token '..t..' < high-water mark '..m"                                   \
    "..' (a newer holder exists; re-acquire)'\n"                                                   \
    "elseif o~='' then\n"                                                                          \
    "local h=redis.pcall('GET',KEYS[n+i])\n"                                                       \
    "if h~=o then w=lost(l,t,'not held in the store: '..(h and 'another holder has it'"            \
    " or 'its lease ran out there')..'; re-acquire') end\n"                                        \
    "end\n"                                                                                        \
    "if not w and t~=m then w=lost(l,t,'above its high-water mark '..m"                            \
    "..': its mark is gone (failover? deleted?); re-acquire') end\n"                               \
    "if w then break end\n"                                                                        \
    "end\n"

/* Checks, and raises nothing: no write does (fence on acquire set the marks). KEYS = the marks[,
 * the lock keys]; ARGV = n, the owner id ("": none), the n tokens, the n lock names. */
static const char fence_check_lua[] =
    "-- fencegate transaction check\n"
    /* sets w */ FENCE_CHECK_LUA /* then: */
    "if w then return redis.error_reply(w..'; the transaction was not applied') end\n"
    "return 0\n";

const char *fence_check_script(void)
{
    return fence_check_lua;
}

/* The pipelined transaction's check runs between WATCH and MULTI. It cannot stop what follows, so
 * when it refuses it modifies the first mark and puts it back as it was (RENAME there and back
 * works whatever the key holds; a missing one is set and deleted): EXEC, watching the marks,
 * applies nothing. KEYS and ARGV as fence_check_lua's. */
static const char fence_txn_check_lua[] =
    "-- fencegate pipelined writes, check\n"
    /* sets w */ FENCE_CHECK_LUA /* then: */
    "if w then\n"
    "local k=KEYS[1]\n"
    "if redis.call('EXISTS',k)==1 then redis.call('RENAME',k,k..':moving')"
    " redis.call('RENAME',k..':moving',k)\n"
    "else redis.call('SET',k,'0') redis.call('DEL',k) end\n"
    "return redis.error_reply(w)\n"
    "end\n"
    "return 0\n";

const char *fence_txn_check_script(void)
{
    return fence_txn_check_lua;
}

/* ---- SHA-1 (FIPS 180-4), just enough to name a script the way SCRIPT LOAD does ------------- */

struct fence_sha1 {
    uint32_t h[5];
    unsigned char block[64];
    size_t used;    /* bytes in block */
    uint64_t total; /* bytes hashed so far */
};

static uint32_t fence_rol(uint32_t x, unsigned n)
{
    return (x << n) | (x >> (32 - n));
}

static void fence_sha1_block(struct fence_sha1 *s, const unsigned char *p)
{
    uint32_t w[80];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 80; i++)
        w[i] = fence_rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);

    uint32_t a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4];
    for (int i = 0; i < 80; i++) {
        uint32_t f, k;
        if (i < 20) {
            f = (b & c) | (~b & d);
            k = 0x5A827999u;
        } else if (i < 40) {
            f = b ^ c ^ d;
            k = 0x6ED9EBA1u;
        } else if (i < 60) {
            f = (b & c) | (b & d) | (c & d);
            k = 0x8F1BBCDCu;
        } else {
            f = b ^ c ^ d;
            k = 0xCA62C1D6u;
        }
        uint32_t t = fence_rol(a, 5) + f + e + k + w[i];
        e = d;
        d = c;
        c = fence_rol(b, 30);
        b = a;
        a = t;
    }
    s->h[0] += a;
    s->h[1] += b;
    s->h[2] += c;
    s->h[3] += d;
    s->h[4] += e;
}

static void fence_sha1_update(struct fence_sha1 *s, const unsigned char *p, size_t n)
{
    s->total += n;
    while (n > 0) {
        size_t take = sizeof(s->block) - s->used;
        if (take > n)
            take = n;
        memcpy(s->block + s->used, p, take);
        s->used += take;
        p += take;
        n -= take;
        if (s->used == sizeof(s->block)) {
            fence_sha1_block(s, s->block);
            s->used = 0;
        }
    }
}

/* Pads with 0x80, zeros, and the message length in bits (big-endian) to a whole block. */
static void fence_sha1_final(struct fence_sha1 *s, unsigned char digest[20])
{
    uint64_t bits = s->total * 8;
    unsigned char pad = 0x80;
    unsigned char zero = 0;
    unsigned char len[8];

    fence_sha1_update(s, &pad, 1);
    while (s->used != 56)
        fence_sha1_update(s, &zero, 1);
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)(bits >> (56 - 8 * i));
    fence_sha1_update(s, len, sizeof(len));
    for (int i = 0; i < 5; i++) {
        digest[4 * i] = (unsigned char)(s->h[i] >> 24);
        digest[4 * i + 1] = (unsigned char)(s->h[i] >> 16);
        digest[4 * i + 2] = (unsigned char)(s->h[i] >> 8);
        digest[4 * i + 3] = (unsigned char)s->h[i];
    }
}

void fence_script_sha(const char *script, char out[41])
{
    static const char hex[] = "0123456789abcdef";
    struct fence_sha1 s = {
        {0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u, 0xC3D2E1F0u}, {0}, 0, 0};
    unsigned char digest[20];

    fence_sha1_update(&s, (const unsigned char *)script, strlen(script));
    fence_sha1_final(&s, digest);
    for (int i = 0; i < 20; i++) {
        out[2 * i] = hex[digest[i] >> 4];
        out[2 * i + 1] = hex[digest[i] & 15];
    }
    out[40] = '\0';
}

/* ---- Encoding ------------------------------------------------------------------------------ */

/* Not NUL-terminated: lock names may hold any byte. */
int fence_hwm_key(const char *lock, size_t len, char *out, size_t cap)
{
    size_t plen = sizeof(FENCE_HWM_PREFIX) - 1;
    if (len > cap || cap - len < plen + 2 || plen + 2 + len > INT_MAX)
        return FG_ERR_LIMIT;
    memcpy(out, FENCE_HWM_PREFIX "{", plen + 1);
    memcpy(out + plen + 1, lock, len);
    out[plen + 1 + len] = '}';
    return (int)(plen + 2 + len);
}

/* Writes v in decimal into buf (at least FENCE_U64_DIGITS bytes); returns the digit count. */
static size_t fence_u64_dec(uint64_t v, char *buf)
{
    char tmp[FENCE_U64_DIGITS];
    size_t n = 0;

    if (v < 100) { /* most headers: a length or a count */
        buf[0] = (char)('0' + (v < 10 ? v : v / 10));
        buf[1] = (char)('0' + v % 10);
        return v < 10 ? 1 : 2;
    }
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v > 0);
    for (size_t i = 0; i < n; i++)
        buf[i] = tmp[n - 1 - i];
    return n;
}

/* "$<len>\r\n" (or "*<count>\r\n" with type '*'), straight into the output when it has room:
 * made on the stack and copied, it was the top of fencegate's own profile under pipelined fenced
 * writes (the copy's wide loads waited for the bytes just stored). */
static void fence_put_header(struct fence_out *o, char type, size_t n)
{
    char buf[1 + FENCE_U64_DIGITS + 2], *p = buf;
    int direct = o->len < o->cap && o->cap - o->len >= sizeof(buf);
    size_t len = 0;

    if (direct)
        p = o->buf + o->len;
    p[len++] = type;
    len += fence_u64_dec((uint64_t)n, p + len);
    p[len++] = '\r';
    p[len++] = '\n';
    if (direct)
        o->len += len;
    else
        fence_put(o, buf, len);
}

static void fence_put_bulk(struct fence_out *o, const char *p, size_t n)
{
    fence_put_header(o, '$', n);
    fence_put(o, p, n);
    fence_put(o, "\r\n", 2);
}

static void fence_put_bulk_u64(struct fence_out *o, uint64_t v)
{
    char buf[FENCE_U64_DIGITS];
    fence_put_bulk(o, buf, fence_u64_dec(v, buf));
}

/* "<prefix>{<lock>}" as a bulk string. */
static void fence_put_key(struct fence_out *o, const char *prefix, size_t plen,
                          const struct fence_lock_ref *l)
{
    fence_put_header(o, '$', plen + 2 + l->len);
    fence_put(o, prefix, plen);
    fence_put(o, "{", 1);
    fence_put(o, l->name, l->len);
    fence_put(o, "}\r\n", 3);
}

/* The write script's call: verb and its first argument (a SHA or the body), then the marks and
 * (with an owner) the lock keys, then the numbers in pre (leading ARGV), n, the owner, the
 * tokens, the lock names and the command. Marks are spelled out piece by piece rather than
 * through fence_hwm_key() so no buffer limit applies here; the layout is the same. */
static size_t fence_encode(const char *verb, const char *head, size_t hlen, const uint64_t *pre,
                           size_t npre, const struct fence_decision *d, const char *const *argv,
                           const size_t *lens, size_t argc, char *out, size_t cap,
                           struct fence_layout *lay)
{
    struct fence_out o = {out, cap, 0};
    const struct fence_owner *own = d->owner;
    size_t n = d->nlocks, nkeys = own ? 2 * n : n;

    if (lay)
        lay->start = 0;
    fence_put_header(&o, '*', 3 + nkeys + npre + 2 + 2 * n + argc);
    fence_put_bulk(&o, verb, strlen(verb));
    fence_put_bulk(&o, head, hlen);
    fence_put_bulk_u64(&o, nkeys);
    if (lay) {
        lay->keys_off = o.len;
        lay->nlocks = n;
        lay->nkeys = nkeys;
        lay->nargv = npre + 2 + 2 * n + argc;
    }
    for (size_t i = 0; i < n; i++)
        fence_put_key(&o, FENCE_HWM_PREFIX, sizeof(FENCE_HWM_PREFIX) - 1, &d->locks[i]);
    if (lay)
        lay->marks_end = o.len;
    for (size_t i = 0; own && i < n; i++)
        fence_put_key(&o, own->key_prefix, own->plen, &d->locks[i]);
    if (lay)
        lay->argv_off = o.len;
    for (size_t i = 0; i < npre; i++)
        fence_put_bulk_u64(&o, pre[i]);
    fence_put_bulk_u64(&o, n);
    fence_put_bulk(&o, own ? own->id : "", own ? own->idlen : 0);
    for (size_t i = 0; i < n; i++)
        fence_put_bulk_u64(&o, d->locks[i].token);
    for (size_t i = 0; i < n; i++)
        fence_put_bulk(&o, d->locks[i].name, d->locks[i].len);
    if (lay) {
        lay->cmd_off = o.len;
        lay->argc = argc;
    }
    for (size_t i = 0; i < argc; i++)
        fence_put_bulk(&o, argv[i], lens[i]);
    if (lay)
        lay->end = o.len;
    return o.len;
}

void fence_layout_shift(struct fence_layout *l, size_t by)
{
    l->start += by;
    l->keys_off += by;
    l->marks_end += by;
    l->argv_off += by;
    l->cmd_off += by;
    l->end += by;
}

size_t fence_encode_write(const char sha[41], const struct fence_decision *d,
                          const char *const *argv, const size_t *lens, size_t argc, char *out,
                          size_t cap, struct fence_layout *lay)
{
    return fence_encode("EVALSHA", sha, 40, NULL, 0, d, argv, lens, argc, out, cap, lay);
}

size_t fence_encode_eval(const char *script, const struct fence_decision *d,
                         const char *const *argv, const size_t *lens, size_t argc, char *out,
                         size_t cap)
{
    return fence_encode("EVAL", script, strlen(script), NULL, 0, d, argv, lens, argc, out, cap,
                        NULL);
}

size_t fence_encode_write_db(unsigned mark_db, unsigned cmd_db, const struct fence_decision *d,
                             const char *const *argv, const size_t *lens, size_t argc, char *out,
                             size_t cap)
{
    const uint64_t pre[2] = {mark_db, cmd_db};

    return fence_encode("EVAL", fence_write_db_lua, sizeof(fence_write_db_lua) - 1, pre, 2, d, argv,
                        lens, argc, out, cap, NULL);
}

size_t fence_encode_group(const char sha[41], const char *reqs, const struct fence_layout *lay,
                          size_t k, char *out, size_t cap)
{
    struct fence_out o = {out, cap, 0};
    size_t nkeys = 0, nargv = 1;

    for (size_t i = 0; i < k; i++) {
        nkeys += lay[i].nkeys;
        nargv += 1 + lay[i].nargv;
    }
    fence_put_header(&o, '*', 3 + nkeys + nargv);
    if (sha) {
        fence_put_bulk(&o, "EVALSHA", 7);
        fence_put_bulk(&o, sha, 40);
    } else {
        fence_put_bulk(&o, "EVAL", 4);
        fence_put_bulk(&o, fence_group_lua, sizeof(fence_group_lua) - 1);
    }
    fence_put_bulk_u64(&o, nkeys);
    for (size_t i = 0; i < k; i++)
        fence_put(&o, reqs + lay[i].keys_off, lay[i].argv_off - lay[i].keys_off);
    fence_put_bulk_u64(&o, k);
    for (size_t i = 0; i < k; i++) {
        fence_put_bulk_u64(&o, lay[i].nargv);
        fence_put(&o, reqs + lay[i].argv_off, lay[i].end - lay[i].argv_off);
    }
    return o.len;
}

int fence_same_locks(const char *ra, const struct fence_layout *a, const char *rb,
                     const struct fence_layout *b)
{
    size_t marks = a->argv_off - a->keys_off, locks = a->cmd_off - a->argv_off;

    return b->argv_off - b->keys_off == marks && b->cmd_off - b->argv_off == locks &&
           memcmp(ra + a->keys_off, rb + b->keys_off, marks) == 0 &&
           memcmp(ra + a->argv_off, rb + b->argv_off, locks) == 0;
}

size_t fence_encode_txn(const char *reqs, const struct fence_layout *lay, size_t k, char *out,
                        size_t cap)
{
    struct fence_out o = {out, cap, 0};
    const struct fence_layout *l = &lay[0]; /* its keys and locks are every write's */

    fence_put_header(&o, '*', 1 + l->nlocks);
    fence_put_bulk(&o, "WATCH", 5);
    fence_put(&o, reqs + l->keys_off, l->marks_end - l->keys_off);
    /* The check, over the keys and (n, owner, tokens, names) as the first write has them. */
    fence_put_header(&o, '*', 3 + l->nkeys + 2 + 2 * l->nlocks);
    fence_put_bulk(&o, "EVAL", 4);
    fence_put_bulk(&o, fence_txn_check_lua, sizeof(fence_txn_check_lua) - 1);
    fence_put_bulk_u64(&o, l->nkeys);
    fence_put(&o, reqs + l->keys_off, l->cmd_off - l->keys_off);
    fence_put(&o, "*1\r\n$5\r\nMULTI\r\n", 15);
    for (size_t i = 0; i < k; i++) {
        fence_put_header(&o, '*', lay[i].argc);
        fence_put(&o, reqs + lay[i].cmd_off, lay[i].end - lay[i].cmd_off);
    }
    fence_put(&o, "*1\r\n$4\r\nEXEC\r\n", 14);
    return o.len;
}
