/* bevread.h — reading a bufferevent's socket in large pieces. libevent 2.1 reads at most 4 KiB
 * per readiness event (EVBUFFER_MAX_READ), so a body streamed through the HTTP endpoint took a
 * turn of the event loop per 4 KiB: epoll_wait, FIONREAD, readv, and epoll_ctl as back-pressure
 * turned reading off and on. */
#ifndef FG_BEVREAD_H
#define FG_BEVREAD_H

#include <stddef.h>

struct bufferevent;

/* Largest piece bufferevents of the HTTP endpoint write at once (libevent's default: 16 KiB). */
#define BEVREAD_MAX_WRITE (256 * 1024)

/* For socket bufferevents (bufferevent_socket_new()) only: reads the descriptor itself, and
 * leaves the input's end frozen as such a bufferevent keeps it outside its own reads.
 * Moves what bev's socket holds ready into bev's input buffer, until that buffer holds `limit`
 * bytes (a read high-water mark). Reads only bytes the socket reports queued (FIONREAD), so an
 * end of stream or an error stays for the bufferevent's own next read to report. For a read
 * callback, before it looks at the input. Returns the bytes moved. */
size_t bevread_ready(struct bufferevent *bev, size_t limit);

#endif
