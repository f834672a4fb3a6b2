/* lockclient_app.c — a tiny application of lockclient, built with only lock.h (as C and as C++)
 * and the link line lockclient/README.md gives, by lockclient_link.sh. */
#include <event2/event.h>
#include <stdio.h>
#include <string.h>

#include "lock.h"

static void app_on_lost(void *arg, const char *name, uint64_t token, const char *why)
{
    (void)arg;
    printf("lost %s %llu: %s\n", name, (unsigned long long)token, why);
}

int main(void)
{
    char err[256];
    uint64_t token = 0;
    struct event_base *base = event_base_new();
    struct lock_client *c;
    struct lock_session *s;

    if (base == NULL)
        return 1;
    if (lock_client_new(base, "nope://x", NULL, err, sizeof(err)) != NULL || err[0] == '\0')
        return 2;
    if (lock_token_parse("9007199254740993", 16, &token) != 0 || token != 9007199254740993ull)
        return 3;
    /* Both backends: a client connects in the background, so nothing needs to listen. */
    const char *urls[] = {"redis://127.0.0.1:1", "etcd://127.0.0.1:1"};
    for (size_t i = 0; i < sizeof(urls) / sizeof(urls[0]); i++) {
        c = lock_client_new(base, urls[i], NULL, err, sizeof(err));
        if (c == NULL) {
            fprintf(stderr, "%s: %s\n", urls[i], err);
            return 4;
        }
        s = lock_session_new(c, 10000, app_on_lost, NULL);
        if (s == NULL || lock_count(s) != 0)
            return 5;
        lock_session_free(s);
        lock_client_free(c);
    }
    event_base_free(base);
    printf("ok\n");
    return 0;
}
