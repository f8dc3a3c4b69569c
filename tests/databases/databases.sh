#!/usr/bin/env bash
# The test databases: PostgreSQL, Redis and MariaDB on 127.0.0.1, data under STATE_DIR
# (target/databases by default), for the fencing checks in the databases
# (palisade::fence::postgres, ::redis and ::mysql, tests/postgres/, tests/redis/,
# tests/mysql/, the chaos suite).
#
#   databases.sh up        start all three, or reuse healthy running ones; installs the
#                          Debian packages postgresql, redis-server and mariadb-server
#                          when missing
#   databases.sh down      stop them and remove their state
#   databases.sh status    exit 0 when all three are running and answer
#   databases.sh restart postgres|redis|mysql
#                          PostgreSQL: immediate shutdown (no checkpoint, crash
#                          recovery on start); Redis and MariaDB: SIGKILL. Then start
#                          again on the same data (the chaos suite's database crash).
#
# PostgreSQL: superuser `postgres`, trust authentication, TCP on 127.0.0.1:PG_PORT
# only (the socket lives in the state directory), fsync on. It refuses to run as
# root, so as root it runs as the `postgres` user the package creates.
# Redis: 127.0.0.1:REDIS_PORT, append-only file with `appendfsync always`.
# MariaDB: 127.0.0.1:MYSQL_PORT only (its socket in the state directory), no option
# files read, `root` without a password from 127.0.0.1 and the socket (the test
# rig's trust authentication), InnoDB flushed at every commit, and the binary log on
# with sync_binlog=1, as on a server with replicas, and so
# log_bin_trust_function_creators=1, which creating palisade.fence then needs (see
# sql/palisade-fence-mysql.sql). As root it runs as the `mysql` user the package creates.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
STATE_DIR=${STATE_DIR:-$root/target/databases}
# Absolute: mariadbd changes into its data directory.
[[ $STATE_DIR == /* ]] || STATE_DIR=$PWD/$STATE_DIR
PG_PORT=${PG_PORT:-15432}
REDIS_PORT=${REDIS_PORT:-16379}
MYSQL_PORT=${MYSQL_PORT:-13306}
START_TIMEOUT=${START_TIMEOUT:-60}
PG_VERSION=${PG_VERSION:-15}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/$PG_VERSION/bin}

log() { echo "databases: $*" >&2; }
die() { log "$*"; exit 1; }

pg_dir=$STATE_DIR/postgres
redis_dir=$STATE_DIR/redis
mysql_dir=$STATE_DIR/mariadb

# As root, PostgreSQL runs as the postgres user; otherwise as whoever runs this.
if [[ $(id -u) == 0 ]]; then
  PG_USER=${PG_USER:-postgres}
  as_pg() { runuser -u "$PG_USER" -- "$@"; }
else
  PG_USER=$(id -un)
  as_pg() { "$@"; }
fi

install_packages() {
  local missing=()
  [[ -x $PG_BIN/postgres ]] || missing+=(postgresql)
  command -v redis-server >/dev/null || missing+=(redis-server)
  command -v mariadbd >/dev/null || missing+=(mariadb-server)
  ((${#missing[@]})) || return 0
  [[ $(id -u) == 0 ]] || die "missing ${missing[*]} ($PG_BIN/postgres, redis-server) and not root: install them with apt-get"
  command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
  log "installing ${missing[*]}"
  # Another apt-get may hold the lock (other setup steps): wait for it.
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq >&2 ||
    die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
    "${missing[@]}" >&2 || die "apt-get install ${missing[*]} failed"
  [[ -x $PG_BIN/postgres ]] || die "installed postgresql, but $PG_BIN/postgres is missing (set PG_BIN or PG_VERSION)"
  command -v redis-server >/dev/null || die "installed redis-server, but redis-server is not on PATH"
  command -v mariadbd >/dev/null || die "installed mariadb-server, but mariadbd is not on PATH"
}

pg_ready() {
  [[ -f $pg_dir/data/postmaster.pid ]] &&
    "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -t 2 2>/dev/null
}

# A PostgreSQL on our port that is not ours would take our tests' writes.
pg_ours() {
  [[ -f $pg_dir/data/postmaster.pid ]] || return 1
  local pid
  pid=$(head -n 1 "$pg_dir/data/postmaster.pid")
  kill -0 "$pid" 2>/dev/null
}

redis_pid_alive() {
  [[ -f $redis_dir/redis.pid ]] && kill -0 "$(cat "$redis_dir/redis.pid")" 2>/dev/null
}

redis_ready() {
  redis_pid_alive && [[ $(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null) == PONG ]]
}

mysql_pid_alive() {
  [[ -f $mysql_dir/mariadb.pid ]] && kill -0 "$(cat "$mysql_dir/mariadb.pid")" 2>/dev/null
}

# Ours, and root logs in over TCP, as the tests do (`mariadb-admin ping` would
# succeed on "access denied" too).
mysql_ready() {
  mysql_pid_alive &&
    mariadb --no-defaults --protocol=tcp -h 127.0.0.1 -P "$MYSQL_PORT" -u root \
      --connect-timeout=2 -e 'SELECT 1' >/dev/null 2>&1
}

healthy() { pg_ours && pg_ready && redis_ready && mysql_ready; }

port_taken() { # port
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

wait_until() { # what timeout-message command...
  local what=$1 deadline=$((SECONDS + START_TIMEOUT))
  shift
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

start_postgres() {
  if [[ ! -f $pg_dir/data/PG_VERSION ]]; then
    mkdir -p "$pg_dir"
    chown "$PG_USER" "$pg_dir"
    chmod 700 "$pg_dir"
    as_pg "$PG_BIN/initdb" -D "$pg_dir/data" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 \
      >"$pg_dir/initdb.log" 2>&1 || { tail -n 20 "$pg_dir/initdb.log" >&2; die "initdb failed (log above)"; }
  fi
  # 9>&-: the server must not inherit (and hold) the lock of this script.
  # -m immediate of a restart leaves the pid file of a dead postmaster: pg_ctl copes.
  as_pg "$PG_BIN/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/postgres.log" -w -t "$START_TIMEOUT" \
    -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -c unix_socket_directories=$pg_dir -c fsync=on \
        -c synchronous_commit=on -c max_connections=200 -c shared_buffers=32MB" start >/dev/null 2>&1 9>&- || {
    tail -n 30 "$pg_dir/postgres.log" >&2 2>/dev/null || true
    die "PostgreSQL did not start on 127.0.0.1:$PG_PORT (log above: $pg_dir/postgres.log)"
  }
  wait_until "PostgreSQL" pg_ready || die "PostgreSQL started but does not answer on 127.0.0.1:$PG_PORT"
}

stop_postgres() { # mode: fast|immediate
  [[ -f $pg_dir/data/postmaster.pid ]] || return 0
  as_pg "$PG_BIN/pg_ctl" -D "$pg_dir/data" -m "$1" -w -t 30 stop >/dev/null 2>&1 || true
}

start_redis() {
  mkdir -p "$redis_dir"
  # 9>&-: the server must not inherit (and hold) the lock of this script.
  setsid redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --protected-mode yes \
    --dir "$redis_dir" --appendonly yes --appendfsync always --save "" \
    --daemonize no --logfile "$redis_dir/redis.log" </dev/null >/dev/null 2>&1 9>&- &
  echo $! >"$redis_dir/redis.pid"
  wait_until "Redis" redis_ready || {
    tail -n 20 "$redis_dir/redis.log" >&2 2>/dev/null || true
    die "Redis did not start on 127.0.0.1:$REDIS_PORT (log above: $redis_dir/redis.log)"
  }
}

stop_redis() { # signal: TERM|KILL
  redis_pid_alive || { rm -f "$redis_dir/redis.pid"; return 0; }
  local pid
  pid=$(cat "$redis_dir/redis.pid")
  kill "-$1" "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  rm -f "$redis_dir/redis.pid"
}

# MariaDB as root switches to this user; otherwise it runs as whoever runs this.
mysql_user() { if [[ $(id -u) == 0 ]]; then echo "${MYSQL_USER:-mysql}"; else id -un; fi; }

start_mysql() {
  local user
  user=$(mysql_user)
  if [[ ! -d $mysql_dir/data/mysql ]]; then
    rm -rf "$mysql_dir"
    mkdir -p "$mysql_dir"
    chown "$user" "$mysql_dir"
    chmod 700 "$mysql_dir"
    # root with an empty password at localhost, 127.0.0.1 and ::1: trust, for tests.
    mariadb-install-db --no-defaults --user="$user" --datadir="$mysql_dir/data" \
      --auth-root-authentication-method=normal --skip-test-db >"$mysql_dir/install-db.log" 2>&1 ||
      { tail -n 20 "$mysql_dir/install-db.log" >&2; die "mariadb-install-db failed (log above)"; }
  fi
  # 9>&-: the server must not inherit (and hold) the lock of this script.
  setsid mariadbd --no-defaults --user="$user" --datadir="$mysql_dir/data" \
    --bind-address=127.0.0.1 --port="$MYSQL_PORT" --socket="$mysql_dir/mariadb.sock" \
    --pid-file="$mysql_dir/mariadbd.pid" --log-error="$mysql_dir/mariadb.log" \
    --skip-name-resolve --max-connections=200 --innodb-buffer-pool-size=64M \
    --innodb-flush-log-at-trx-commit=1 --server-id=1 --log-bin=binlog \
    --binlog-format=ROW --sync-binlog=1 --log-bin-trust-function-creators=1 </dev/null >/dev/null 2>&1 9>&- &
  echo $! >"$mysql_dir/mariadb.pid"
  wait_until "MariaDB" mysql_ready || {
    tail -n 20 "$mysql_dir/mariadb.log" >&2 2>/dev/null || true
    die "MariaDB did not start on 127.0.0.1:$MYSQL_PORT (log above: $mysql_dir/mariadb.log)"
  }
}

stop_mysql() { # signal: TERM|KILL
  mysql_pid_alive || { rm -f "$mysql_dir/mariadb.pid"; return 0; }
  local pid
  pid=$(cat "$mysql_dir/mariadb.pid")
  kill "-$1" "$pid" 2>/dev/null || true
  for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  rm -f "$mysql_dir/mariadb.pid"
}

up() {
  if healthy; then
    log "reusing the running PostgreSQL (127.0.0.1:$PG_PORT), Redis (127.0.0.1:$REDIS_PORT) and MariaDB (127.0.0.1:$MYSQL_PORT)"
    return 0
  fi
  install_packages
  mkdir -p "$STATE_DIR"
  chmod 755 "$STATE_DIR"
  local t0=$SECONDS
  if ! (pg_ours && pg_ready); then
    stop_postgres immediate
    ! port_taken "$PG_PORT" || die "127.0.0.1:$PG_PORT is taken by a server that is not ours (set PG_PORT)"
    if [[ $(id -u) == 0 ]] && ! runuser -u "$PG_USER" -- test -x "$STATE_DIR"; then
      die "user $PG_USER cannot reach $STATE_DIR: every parent directory needs o+x (or set STATE_DIR)"
    fi
    start_postgres
  fi
  if ! redis_ready; then
    stop_redis KILL
    ! port_taken "$REDIS_PORT" || die "127.0.0.1:$REDIS_PORT is taken by a server that is not ours (set REDIS_PORT)"
    start_redis
  fi
  if ! mysql_ready; then
    stop_mysql KILL
    ! port_taken "$MYSQL_PORT" || die "127.0.0.1:$MYSQL_PORT is taken by a server that is not ours (set MYSQL_PORT)"
    start_mysql
  fi
  log "PostgreSQL on 127.0.0.1:$PG_PORT, Redis on 127.0.0.1:$REDIS_PORT, MariaDB on 127.0.0.1:$MYSQL_PORT, started in $((SECONDS - t0))s"
}

restart() { # postgres|redis|mysql
  case $1 in
    postgres)
      pg_ours || die "PostgreSQL is not running"
      stop_postgres immediate
      start_postgres
      ;;
    redis)
      redis_pid_alive || die "Redis is not running"
      stop_redis KILL
      start_redis
      ;;
    mysql)
      mysql_pid_alive || die "MariaDB is not running"
      stop_mysql KILL
      start_mysql
      ;;
  esac
  log "restarted $1"
}

down() {
  stop_postgres fast
  stop_redis TERM
  stop_mysql TERM
  rm -rf "$STATE_DIR"
  log "stopped"
}

# One caller at a time: parallel test binaries and make may race to start them.
mkdir -p "$(dirname "$STATE_DIR")"
exec 9>"$STATE_DIR.lock"
flock 9

case ${1:-} in
  up) up ;;
  down) down ;;
  status) healthy ;;
  restart)
    case ${2:-} in
      postgres | redis | mysql) restart "$2" ;;
      *)
        echo "usage: $0 restart postgres|redis|mysql" >&2
        exit 2
        ;;
    esac
    ;;
  *)
    echo "usage: $0 up|down|status|restart postgres|redis|mysql" >&2
    exit 2
    ;;
esac
