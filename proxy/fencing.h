/* fencing.h — lock commands (FENCE.*) on the RESP endpoint and the fencing of writes. */
#ifndef FG_FENCING_H
#define FG_FENCING_H

#include "client.h"

/* Handles a FENCE.* command: answers it (possibly later, for FENCE.ACQUIRE, holding back the
 * requests after it) and returns REQ_SKIP; returns REQ_IDLE for a FENCE.RELEASE while replies
 * to earlier requests are due (the writes before it must land while the lock is held), and
 * REQ_FORWARD for a FENCE.* name it does not know, so Redis answers it. */
enum req_action fencing_command(struct client *c, const char *m, const struct resp_request *r);
/* 1 when name is a command fencing_command() answers itself (FENCE.ACQUIRE, .RELEASE, .TOKEN,
 * .LOCKS), in any case. */
int fencing_is_command(const char *name, size_t nlen);

/* Decides whether a request is a write to fence. Returns REQ_FORWARD (send it unchanged), or
 * REQ_SKIP when it was handled: refused with a local error, or sent as a fenced script (after
 * flushing sp, so the pipeline keeps its order) with its op queued. */
enum req_action fencing_write(struct client *c, const char *m, const struct resp_request *r,
                              struct span *sp);

/* A fenced write came back "-NOSCRIPT": the script cache was flushed. Returns 1 when the write was
 * sent again (as EVAL, so nothing is reordered: it was the last request in flight) and its op
 * stays queued; 0 when the op must be answered with the error fencing_noscript_error() wrote. */
int fencing_noscript(struct client *c, struct op *o);

/* Takes note of a fenced write's reply, or of a refusal's text without its '-': STALE and LOCKLOST
 * refusals by the store are counted, and after a LOCKLOST the session renews at once. */
void fencing_on_reply(struct client *c, const char *r, size_t n);

/* 1 when a write of this connection may need fencing (protect rules exist, or it holds or lost
 * a lock). MULTI is then held back until EXEC. */
int fencing_active(struct client *c);

/* MULTI of a connection where fencing is active: answers +OK and holds the block back. Returns 0
 * or -1 (out of memory: the client is dead). */
int fencing_txn_begin(struct client *c, const char *m, size_t len);

/* Drops a held-back block unsent: RESET and QUIT run at once inside MULTI and end it. */
void fencing_txn_drop(struct client *c);

/* A request inside a held-back MULTI: queued (+QUEUED), refused (the block will abort, as Redis
 * aborts a block with a bad command), or EXEC / DISCARD. Always REQ_SKIP. */
enum req_action fencing_txn_queue(struct client *c, const char *m, const struct resp_request *r,
                                  struct span *sp);

/* EXEC of a held-back block (called by fencing_txn_queue). Without fenced writes it is sent at
 * once; with them, WATCH + a check go first and the block waits for the check's answer. */
void fencing_txn_exec(struct client *c, struct span *sp);

/* The check's reply arrived (its op is at the head of the queue). Returns 1 when the block was
 * sent (the check's own reply is not for the application); 0 when the check refused it (the
 * reply, a STALE error, is EXEC's answer). */
int fencing_txn_checked(struct client *c, const char *r, size_t n);

/* The connection is closing: its session's locks are released. */
void fencing_close(struct client *c);

#endif
