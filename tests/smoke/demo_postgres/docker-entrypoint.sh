#!/bin/sh
# The official postgres image's entrypoint contract, reduced to what the chart's demo Postgres uses:
# on an empty PGDATA, initdb as POSTGRES_USER with POSTGRES_PASSWORD (local socket: trust; TCP:
# scram-sha-256), create POSTGRES_DB, run /docker-entrypoint-initdb.d (*.sh executed when
# executable, sourced otherwise; *.sql through psql) against a server on the socket only; then
# exec the server listening on every address.
set -eu
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set}"
export POSTGRES_USER POSTGRES_DB PGDATA

if [ "${1:-postgres}" = "postgres" ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
    mkdir -p "$PGDATA"
    chmod 700 "$PGDATA"
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 >/dev/null
    rm -f "$pwfile"
    printf 'host all all all scram-sha-256\n' >> "$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -c unix_socket_directories=/var/run/postgresql" -w start >/dev/null
    if [ "$POSTGRES_DB" != "postgres" ]; then
        psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
            --set db="$POSTGRES_DB" -c 'CREATE DATABASE :"db"' >/dev/null
    fi
    for f in /docker-entrypoint-initdb.d/*; do
        [ -e "$f" ] || continue
        case "$f" in
            *.sh)  if [ -x "$f" ]; then "$f"; else . "$f"; fi ;;
            *.sql) psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" -f "$f" ;;
            *)     echo "ignoring $f" ;;
        esac
    done
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi

if [ "${1:-postgres}" = "postgres" ]; then
    shift || true
    exec postgres -c listen_addresses='*' -c unix_socket_directories=/var/run/postgresql "$@"
fi
exec "$@"
