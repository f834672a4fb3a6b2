/* bevread.h — reading a bufferevent's socket in large pieces. libevent 2.1 reads at most 4 KiB
 * per readiness event (EVBUFFER_MAX_READ), so a body streamed through the HTTP endpoint took a
 * turn of the event loop per 4 KiB: epoll_wait, FIONREAD, readv, and epoll_ctl as back-pressure
 * turned reading off and on. */
#ifndef FG_BEVREAD_H
#define FG_BEVREAD_H

#include <stddef.h>

struct bufferevent;

/* Sets bev's read high-water mark (the most its input holds; bevread_ready() fills up to it) and
 * lets it write up to 256 KiB at once (libevent's default: 16 KiB). */
void bevread_setup(struct bufferevent *bev, size_t read_high);

/* For socket bufferevents (bufferevent_socket_new()) set up by bevread_setup(): reads the
 * descriptor itself, and leaves the input's end frozen as such a bufferevent keeps it outside its
 * own reads. Moves what bev's socket holds ready into bev's input buffer, until that buffer holds
 * its read high-water mark. Reads only bytes the socket reports queued (FIONREAD), so an end of
 * stream or an error stays for the bufferevent's own next read to report. For a read callback,
 * before it looks at the input. Returns the bytes moved. */
size_t bevread_ready(struct bufferevent *bev);

#endif
