/* bevread.c — see bevread.h. */
#include "bevread.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define BEVREAD_MAX_WRITE (256 * 1024)

void bevread_setup(struct bufferevent *bev, size_t read_high)
{
    bufferevent_setwatermark(bev, EV_READ, 0, read_high);
    bufferevent_set_max_single_write(bev, BEVREAD_MAX_WRITE);
}

size_t bevread_ready(struct bufferevent *bev)
{
    evutil_socket_t fd = bufferevent_getfd(bev);
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t moved = 0, limit = 0;

    bufferevent_getwatermark(bev, EV_READ, NULL, &limit);

    for (;;) {
        size_t have = evbuffer_get_length(in), want, left;
        struct evbuffer_iovec v[2];
        struct iovec iov[2];
        int ready = 0, n;
        ssize_t got;

        if (fd < 0 || have >= limit || ioctl(fd, FIONREAD, &ready) != 0 || ready <= 0)
            return moved;
        want = (size_t)ready < limit - have ? (size_t)ready : limit - have;
        evbuffer_unfreeze(in, 0); /* a socket bufferevent keeps its input's end frozen */
        n = evbuffer_reserve_space(in, (ev_ssize_t)want, v, 2);
        if (n <= 0) {
            evbuffer_freeze(in, 0);
            return moved;
        }
        left = want;
        for (int i = 0; i < n; i++) {
            iov[i].iov_base = v[i].iov_base;
            iov[i].iov_len = v[i].iov_len < left ? v[i].iov_len : left;
            left -= iov[i].iov_len;
        }
        got = readv(fd, iov, n);
        if (got <= 0) {
            evbuffer_commit_space(in, v, 0);
            evbuffer_freeze(in, 0);
            return moved;
        }
        left = (size_t)got;
        int used = 0;
        while (used < n && left > 0) {
            v[used].iov_len = iov[used].iov_len < left ? iov[used].iov_len : left;
            left -= v[used++].iov_len;
        }
        if (evbuffer_commit_space(in, v, used) != 0) {
            /* Cannot happen with the reservation just made; if it did, bytes taken off the
             * socket would be lost: end the connection rather than go on without them. */
            evbuffer_freeze(in, 0);
            shutdown(fd, SHUT_RDWR);
            return moved;
        }
        evbuffer_freeze(in, 0);
        moved += (size_t)got;
    }
}
