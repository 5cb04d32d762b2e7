# Sourced by ./lab (test) and bench/run: start_postgres, a throwaway PostgreSQL cluster.
# shellcheck shell=bash

start_postgres() {  # a throwaway PostgreSQL, stopped when the calling script ends; DEVICE_LOOP_TEST_POSTGRES says where
  [ -n "${DEVICE_LOOP_TEST_POSTGRES:-}" ] && return
  local bin dir port as=()
  bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  if [ -z "$bin" ]; then
    echo "PostgreSQL is not installed: SQLite only (sudo apt-get install postgresql)" >&2
    return
  fi
  dir=$(mktemp -d /var/tmp/device-loop-pg.XXXXXX)
  chmod 755 "$dir"
  if [ "$(id -u)" = 0 ]; then  # initdb refuses root: the cluster is the postgres account's
    install -d -o postgres -g postgres -m 700 "$dir/data" "$dir/sock"
    as=(runuser -u postgres --)
  else
    install -d -m 700 "$dir/data" "$dir/sock"
  fi
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  # (bash runs one EXIT trap: this one stops the server and removes its files)
  trap "${as[*]} '$bin/pg_ctl' -D '$dir/data' -m immediate stop >/dev/null 2>&1; rm -rf '$dir'" EXIT
  (  # from /: the postgres account may not enter the folder we run in
    cd /
    "${as[@]}" "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 --no-sync >"$dir/initdb.log"
    "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/data/server.log" -w -t 30 \
      -o "-p $port -k $dir/sock -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300" start >/dev/null
  )
  export DEVICE_LOOP_TEST_POSTGRES="postgresql://postgres@127.0.0.1:$port/postgres"
}
