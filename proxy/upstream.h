/* upstream.h — the upstream Redis as a whole: address, health probe with backoff, command table. */
#ifndef FG_UPSTREAM_H
#define FG_UPSTREAM_H

#include <stddef.h>

#include "fg_error.h"
#include "net.h"

struct event_base;
struct cfg_url;
struct cmd_table;
struct upstream;

/* Creates the upstream for url and starts probing it at once (PING, and COMMAND after each
 * connect). Returns NULL with a reason in err when out of memory. */
struct upstream *upstream_new(struct event_base *base, const struct cfg_url *url, char *err,
                              size_t errlen);
void upstream_free(struct upstream *u); /* NULL is a no-op */

/* 1 when the last probe got an answer; sessions only try to connect while this holds. */
int upstream_is_up(const struct upstream *u);
/* "redis://127.0.0.1:6379" (never the password). */
const char *upstream_name(const struct upstream *u);
/* Why the upstream is down ("connection refused", ...); "" when up. */
const char *upstream_error(const struct upstream *u);
/* The address sessions connect to: the one the probe last resolved the host to (off the loop,
 * resolve.h) and connected to. NULL until the first lookup succeeded. */
const struct net_addr *upstream_addr(const struct upstream *u);
/* Command metadata from the upstream's COMMAND reply; NULL until the first probe fetched it. */
const struct cmd_table *upstream_commands(const struct upstream *u);
/* Whether the upstream's maxmemory may refuse writes (INFO memory, read by every probe: a limit
 * whose policy is not allkeys-*, or unknown). Redis checks it only before a script's first
 * write, so fenced writes then go one script call each. */
int upstream_oom_possible(const struct upstream *u);
/* Bytes each new upstream connection must send first (AUTH / SELECT from the URL), and how many
 * replies they produce; *len is 0 when there is nothing to send. */
const char *upstream_prelude(const struct upstream *u, size_t *len, int *nreplies);

/* A session failed to reach the upstream: mark it down now and probe again soon. */
void upstream_report_failure(struct upstream *u, const char *why);
/* Bytes came from the upstream on a data connection. A probe whose PING went unanswered marked it
 * down (a partition looks the same as a busy Redis: DEBUG SLEEP, a long command); these bytes
 * say it was busy, so it is up again at once, not after the probe's next round. */
void upstream_report_alive(struct upstream *u);
/* Calls cb(arg) once, when the first probe has an outcome (up, or down and why), and returns 0;
 * returns 1 without keeping cb when that has happened already. A NULL cb forgets the one kept.
 * The Redis endpoint accepts connections from then on: Redis serves what a client sends once
 * its port accepts, and a command sent before the first probe would be refused unprobed. */
int upstream_on_first_probe(struct upstream *u, void (*cb)(void *arg), void *arg);
/* A client was refused because the upstream is down: probe now instead of at the end of the
 * backoff (at most every 100 ms), so that once Redis is back the next request finds it up. */
void upstream_wake(struct upstream *u);

#endif
