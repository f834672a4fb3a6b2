/* appcheck.h — the application's own health check (config app_health): an HTTP GET of its URL
 * every interval, the way a Kubernetes httpGet probe does it. After failure_threshold failed
 * checks in a row the application counts as unhealthy, until one check passes. The HTTP lock API
 * uses it to stop keeping locks for an application that has hung (DESIGN.md §3). */
#ifndef FG_APPCHECK_H
#define FG_APPCHECK_H

#include <stddef.h>

struct event_base;
struct cfg;
struct appcheck;

/* Called when the verdict changes: healthy 0 with the last failure's reason, or healthy 1 (why is
 * then ""). */
typedef void (*appcheck_cb)(void *arg, int healthy, const char *why);

/* Starts checking cfg's app_health.url (the first check right away). Returns NULL when the check
 * is off (no URL) or out of memory (then err says so; err is "" when it is off). */
struct appcheck *appcheck_new(struct event_base *base, const struct cfg *cfg, appcheck_cb cb,
                              void *arg, char *err, size_t errlen);
/* 1 while healthy (also when a is NULL: no check configured). */
int appcheck_healthy(const struct appcheck *a);
/* Why the application counts as unhealthy: the last failure, with the URL ("" while healthy). */
const char *appcheck_why(const struct appcheck *a);
/* Stops checking. NULL is a no-op. */
void appcheck_free(struct appcheck *a);

#endif
