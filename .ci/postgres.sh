#!/usr/bin/env bash
# A throw-away PostgreSQL for the ledger tests (SPEC §9).
#   eval "$(bash .ci/postgres.sh)"    # install if missing, start, print TOLLGATE_TEST_PG_URL
#   bash .ci/postgres.sh stop         # stop it and delete its data
# The cluster lives in a temp dir owned by the `postgres` user, listens on 127.0.0.1 only, and
# never touches a system cluster. Everything but the final `export` line goes to stderr.
set -euo pipefail

PGPORT="${TOLLGATE_PG_PORT:-54329}"
PGDIR="${TOLLGATE_PG_DIR:-/tmp/tollgate-pg}"
DB=tollgate_test
ROLE=tollgate
PASSWORD=tollgate

log() { echo "postgres.sh: $*" >&2; }

find_bin() {
  local dir
  dir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
  [ -n "$dir" ] && [ -x "$dir/pg_ctl" ] && echo "$dir"
}

as_postgres() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

if [ "${1:-start}" = stop ]; then
  BIN="$(find_bin || true)"
  if [ -n "$BIN" ] && [ -f "$PGDIR/data/PG_VERSION" ]; then
    as_postgres "$BIN/pg_ctl" -D "$PGDIR/data" -m fast stop >&2 || true
  fi
  rm -rf "$PGDIR"
  log "stopped"
  exit 0
fi

BIN="$(find_bin || true)"
if [ -z "$BIN" ]; then
  log "installing PostgreSQL from Debian packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update >&2
  apt-get install -y postgresql >&2
  BIN="$(find_bin)"
fi

if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  useradd --system --home-dir "$PGDIR" postgres
fi

if ! as_postgres "$BIN/pg_ctl" -D "$PGDIR/data" status >/dev/null 2>&1; then
  rm -rf "$PGDIR"
  mkdir -p "$PGDIR"
  [ "$(id -u)" = 0 ] && chown postgres "$PGDIR"
  as_postgres "$BIN/initdb" -D "$PGDIR/data" -U postgres --auth=trust -E UTF8 >/dev/null
  # The socket dir is the temp dir too, so nothing in /var/run is needed.
  as_postgres "$BIN/pg_ctl" -D "$PGDIR/data" -l "$PGDIR/server.log" -w \
    -o "-c listen_addresses=127.0.0.1 -c port=$PGPORT -c unix_socket_directories=$PGDIR -c max_connections=200 -c fsync=off" \
    start >&2
  as_postgres "$BIN/psql" -h 127.0.0.1 -p "$PGPORT" -U postgres -v ON_ERROR_STOP=1 -q -d postgres >&2 <<SQL
CREATE ROLE $ROLE LOGIN PASSWORD '$PASSWORD';
CREATE DATABASE $DB OWNER $ROLE;
SQL
  log "started on 127.0.0.1:$PGPORT (data in $PGDIR)"
else
  log "already running on 127.0.0.1:$PGPORT"
fi

echo "export TOLLGATE_TEST_PG_URL=postgres://$ROLE:$PASSWORD@127.0.0.1:$PGPORT/$DB"
