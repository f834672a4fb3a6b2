/* injector.h — `fencegate injector`: the HTTPS server of the mutating admission webhook. */
#ifndef FG_INJECTOR_H
#define FG_INJECTOR_H

/* Runs the webhook server until SIGTERM or SIGINT (after --shutdown-delay seconds of answering
 * with Connection: close; a second signal ends it at once). argv[0] is "injector"; the flags
 * are --listen HOST:PORT, --cert FILE, --key FILE (PEM; the certificate file may hold the
 * chain), --log-level L and --shutdown-delay SECONDS; the sidecar it injects is set by the
 * FENCEGATE_INJECT_* variables.
 * Returns the process exit code: 0 after a signal or --help, 2 for a bad flag, variable,
 * certificate or key (the message names which), 1 when it cannot listen or run. */
int injector_main(int argc, char **argv);

#endif
