#!/bin/sh
# lockclient_link.sh SRC_DIR OUT_DIR — builds tests/link/lockclient_app.c outside CMake with the
# command lockclient/README.md gives ("Linking"), as C and, when a C++ compiler is there, as C++
# (lock.h must declare C linkage), and runs both. Keep the command in step with the README.
# Word splitting of $files, $libs and pkg-config's output is wanted throughout.
# shellcheck disable=SC2086,SC2046
set -eu
src=$(cd "$1" && pwd)
mkdir -p "$2"
cd "$2"
lc=$src/lockclient
files="$lc/lock.c $lc/lock_redis.c $lc/lock_etcd.c $lc/etcdpb.c $lc/grpc.c $lc/tlslib.c
       $lc/resolve.c"
libs=$(pkg-config --libs libevent hiredis libnghttp2)

# The README's line, as an application in C would run it.
cc "$src/tests/link/lockclient_app.c" $files -I"$lc" \
    $(pkg-config --cflags libevent hiredis libnghttp2) $libs -ldl -pthread -o lockclient_app
./lockclient_app

# A C++ application: the library compiled as C, the application as C++, against lock.h alone.
if command -v c++ >/dev/null 2>&1; then
    cc -c $files -I"$lc" $(pkg-config --cflags libevent hiredis libnghttp2)
    c++ -x c++ -Wall -Wextra -Werror -c "$src/tests/link/lockclient_app.c" -I"$lc" \
        $(pkg-config --cflags libevent) -o lockclient_app_cc.o
    c++ lockclient_app_cc.o lock.o lock_redis.o lock_etcd.o grpc.o etcdpb.o tlslib.o resolve.o \
        $libs -ldl -pthread -o lockclient_app_cc
    ./lockclient_app_cc
fi
