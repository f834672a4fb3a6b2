/* test_httpup.c — the HTTP store client connection (httpup.c) against a loopback "store" that the
 * test drives byte by byte: a connection kept alive after a response must carry the next request,
 * whatever its reader did with the last one (paused on its last piece); a reset is not an end. */
#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/keyvalq_struct.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/queue.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "httpup.h"

struct seen {
    struct httpup *up;
    int heads, status, dones, end;
    size_t body;
    int pause_on_body; /* the reader is slow: it pauses on every piece, the last one too */
    int pause_on_head; /* the reader pauses once the head is in */
};

static int on_head(void *arg, int status, const char *reason, const struct evkeyvalq *headers,
                   int64_t length)
{
    struct seen *s = arg;

    (void)reason;
    (void)headers;
    (void)length;
    s->heads++;
    s->status = status;
    if (s->pause_on_head)
        httpup_pause(s->up, 1);
    return 0;
}

static void on_body(void *arg, struct evbuffer *buf)
{
    struct seen *s = arg;

    s->body += evbuffer_get_length(buf);
    evbuffer_drain(buf, evbuffer_get_length(buf));
    if (s->pause_on_body)
        httpup_pause(s->up, 1);
}

static void on_done(void *arg, enum httpup_end end, const char *why)
{
    struct seen *s = arg;

    (void)why;
    s->dones++;
    s->end = (int)end;
}

static const struct httpup_handler handler = {on_head, on_body, on_done, NULL};

/* Runs the loop until *flag is set or about 2 s pass. */
static void run_until(struct event_base *base, const int *flag)
{
    for (int i = 0; i < 200 && !*flag; i++) {
        struct timeval tv = {0, 10000};
        event_base_loopexit(base, &tv);
        event_base_dispatch(base);
    }
}

/* Reads one request head from the store's side of the connection (the loop runs meanwhile). */
static void store_read_head(struct event_base *base, int fd)
{
    char buf[4096];
    size_t n = 0;

    for (int i = 0; i < 200; i++) {
        ssize_t k = recv(fd, buf + n, sizeof(buf) - 1 - n, MSG_DONTWAIT);
        if (k > 0) {
            n += (size_t)k;
            buf[n] = '\0';
            if (strstr(buf, "\r\n\r\n"))
                return;
        }
        struct timeval tv = {0, 10000};
        event_base_loopexit(base, &tv);
        event_base_dispatch(base);
    }
    fail_msg("no request head reached the store");
}

static void store_send(int fd, const char *s)
{
    assert_int_equal(send(fd, s, strlen(s), 0), (ssize_t)strlen(s));
}

/* A loopback "store": a listening socket (*lfd), an httpup connected to it, and the store's side
 * of that connection (*fd). */
static struct httpup *store_pair(struct event_base *base, int *lfd, int *fd)
{
    struct sockaddr_in sa;
    socklen_t salen = sizeof(sa);
    struct httpup *up;
    int one = 1;

    *lfd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(setsockopt(*lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)), 0);
    assert_int_equal(bind(*lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(*lfd, 4), 0);
    assert_int_equal(getsockname(*lfd, (struct sockaddr *)&sa, &salen), 0);
    up = httpup_connect(base, (struct sockaddr *)&sa, salen);
    assert_non_null(up);
    *fd = accept(*lfd, NULL, NULL);
    assert_true(*fd >= 0);
    return up;
}

/* Sends a request (method GET or HEAD) for target on up, read by s, and waits until its head
 * reached the store. */
static void send_request(struct event_base *base, struct httpup *up, int fd, struct seen *s,
                         const char *method, const char *target)
{
    struct evkeyvalq headers;
    int head = strcmp(method, "HEAD") == 0;

    TAILQ_INIT(&headers);
    assert_int_equal(httpup_request(up, method, target, &headers, 0, head, &handler, s), 0);
    store_read_head(base, fd);
}

/* Waits until everything fd sent is acknowledged: queued in the client's socket. */
static void store_sent_all(int fd)
{
    int unacked = -1;

    for (int i = 0; i < 200 && unacked != 0; i++) {
        assert_int_equal(ioctl(fd, SIOCOUTQ, &unacked), 0);
        if (unacked != 0)
            usleep(10000);
    }
    assert_int_equal(unacked, 0);
}

/* A response's last piece paused by its reader (a slow client at the time): the connection goes
 * back idle and the next request on it is answered. */
static void test_paused_on_last_piece_then_reused(void **state)
{
    struct event_base *base = event_base_new();
    int lfd, fd;
    struct httpup *up = store_pair(base, &lfd, &fd);
    struct seen s1 = {.up = up, .pause_on_body = 1}, s2 = {.up = up};

    (void)state;
    send_request(base, up, fd, &s1, "GET", "/first");
    store_send(fd, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789");
    run_until(base, &s1.dones);
    assert_int_equal(s1.dones, 1);
    assert_int_equal(s1.end, HTTPUP_OK);
    assert_int_equal(s1.body, 10);
    assert_true(httpup_reusable(up));

    send_request(base, up, fd, &s2, "GET", "/second");
    store_send(fd, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    run_until(base, &s2.dones);
    assert_int_equal(s2.heads, 1); /* was 0: the response was never read (paused) */
    assert_int_equal(s2.dones, 1);
    assert_int_equal(s2.end, HTTPUP_OK);
    assert_int_equal(s2.body, 2);

    httpup_free(up);
    close(fd);
    close(lfd);
    event_base_free(base);
}

/* The same, and the store closes the idle connection meanwhile: httpup_reusable() sees it. */
static void test_paused_on_last_piece_then_store_closes(void **state)
{
    struct event_base *base = event_base_new();
    int lfd, fd, gone = 0;
    struct httpup *up = store_pair(base, &lfd, &fd);
    struct seen s1 = {.up = up, .pause_on_body = 1};

    (void)state;
    send_request(base, up, fd, &s1, "GET", "/first");
    store_send(fd, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc");
    run_until(base, &s1.dones);
    assert_int_equal(s1.dones, 1);
    close(fd);
    run_until(base, &gone); /* about 2 s of loop: the close is read */
    assert_false(httpup_reusable(up));

    httpup_free(up);
    close(lfd);
    event_base_free(base);
}

/* A body that runs to the close, all of it queued in the client's socket when the store resets
 * the connection: every byte is delivered, and the response is not taken as whole (a reset is not
 * an end of stream). Reading ahead of libevent (bevread.c) must leave the reset for the
 * bufferevent to see. */
static void test_body_to_close_cut_by_reset_is_not_whole(void **state)
{
    static char body[48 * 1024]; /* more than libevent's 4 KiB read; within the receive window */
    static const char head[] = "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n";
    struct event_base *base = event_base_new();
    int lfd, fd, unacked = -1;
    struct linger abort_close = {1, 0};
    struct httpup *up = store_pair(base, &lfd, &fd);
    struct seen s1 = {.up = up, .pause_on_head = 1};

    (void)state;
    memset(body, 'b', sizeof(body));
    send_request(base, up, fd, &s1, "GET", "/big");
    store_send(fd, head);
    run_until(base, &s1.heads); /* the reader is paused now */
    assert_int_equal(send(fd, body, sizeof(body), MSG_DONTWAIT), (ssize_t)sizeof(body));
    for (int i = 0; i < 200 && unacked != 0; i++) { /* all of it in the client's socket */
        assert_int_equal(ioctl(fd, SIOCOUTQ, &unacked), 0);
        usleep(10000);
    }
    assert_int_equal(unacked, 0);
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort_close, sizeof(abort_close)), 0);
    close(fd); /* with a zero linger: a reset */
    httpup_pause(up, 0);
    run_until(base, &s1.dones);
    assert_int_equal(s1.dones, 1);
    assert_int_equal(s1.body, sizeof(body));
    assert_int_equal(s1.end, HTTPUP_CLOSED); /* not HTTPUP_OK: the body was cut */

    httpup_free(up);
    close(lfd);
    event_base_free(base);
}

/* Bytes after the end of a response (read with it, past its Content-Length or after a HEAD's
 * head; or queued in the socket after it, not yet read): the connection is not reusable, or the
 * next request would take them for its response. A HEAD's response has no body whatever its
 * Content-Length says. */
static void test_bytes_left_after_the_response_forbid_reuse(void **state)
{
    static const char *const extra = "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsmuggl";
    static const struct {
        const char *method, *answer, *later;
        size_t body;
    } cases[] = {
        {"GET", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", NULL, 2},
        {"GET", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", "x", 2},
        {"GET", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", "", 2}, /* a close */
        {"GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", NULL,
         2},
        {"HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n", NULL, 0},
        {"GET", "HTTP/1.1 204 No Content\r\nContent-Length: 6\r\n\r\n", NULL, 0},
        {"GET", "HTTP/1.1 304 Not Modified\r\nContent-Length: 6\r\n\r\n", NULL, 0},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct event_base *base = event_base_new();
        int lfd, fd;
        struct httpup *up = store_pair(base, &lfd, &fd);
        struct seen s1 = {.up = up};
        char answer[256];

        print_message("case %zu\n", i);
        send_request(base, up, fd, &s1, cases[i].method, "/first");
        snprintf(answer, sizeof(answer), "%s%s", cases[i].answer, cases[i].later ? "" : extra);
        store_send(fd, answer); /* one segment: read at once */
        run_until(base, &s1.dones);
        assert_int_equal(s1.dones, 1);
        assert_int_equal(s1.end, HTTPUP_OK);
        assert_int_equal(s1.body, cases[i].body);
        if (cases[i].later) {
            assert_true(httpup_reusable(up)); /* nothing came after it yet */
            if (*cases[i].later)
                store_send(fd, cases[i].later);
            else
                shutdown(fd, SHUT_WR);
            store_sent_all(fd); /* in the client's socket; the loop has not read it */
        }
        assert_false(httpup_reusable(up));

        httpup_free(up);
        close(fd);
        close(lfd);
        event_base_free(base);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paused_on_last_piece_then_reused),
        cmocka_unit_test(test_paused_on_last_piece_then_store_closes),
        cmocka_unit_test(test_body_to_close_cut_by_reset_is_not_whole),
        cmocka_unit_test(test_bytes_left_after_the_response_forbid_reuse),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
