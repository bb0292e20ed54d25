# What scripts/lab.sh and scripts/ib-lab.sh share: sourced by both, after they set here (the
# tree), PREFIX, STATE and LAB_NAME (their name, for messages). Node K's daemon has its pid
# in $STATE/nodeK.pid, its log in $STATE/nodeK.log and its control socket at $(sock K).

die() { echo "$LAB_NAME: $*" >&2; exit 2; }

bin() {
    if [ -n "${IPOIB_CM_BIN:-}" ]; then echo "$IPOIB_CM_BIN"; return; fi
    for b in "$here/target/release/ipoib-cm" "$here/target/debug/ipoib-cm"; do
        [ -x "$b" ] && { echo "$b"; return; }
    done
    die "no ipoib-cm binary: run cargo build --release (or set IPOIB_CM_BIN)"
}

ns() { echo "$PREFIX$1"; }
sock() { echo "$STATE/node$1.sock"; }

nodes() { cat "$STATE/nodes" 2>/dev/null || echo 0; }

check_k() {
    [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -ge 1 ] && [ "$1" -le "$(nodes)" ] \
        || die "no node $1 (lab has $(nodes) nodes)"
}

# Waits (at most SECONDS) until node K's daemon answers status; its log's tail when it exits
# or does not answer in time.
wait_ready() {
    local k=$1 secs=$2 i
    for ((i = 0; i < secs * 10; i++)); do
        if "$(bin)" status --control-socket "$(sock "$k")" --json >/dev/null 2>&1; then
            return 0
        fi
        if ! kill -0 "$(cat "$STATE/node$k.pid")" 2>/dev/null; then
            echo "$LAB_NAME: node $k's daemon exited; its log:" >&2
            tail -n 20 "$STATE/node$k.log" >&2 || true
            return 1
        fi
        sleep 0.1
    done
    echo "$LAB_NAME: node $k not ready after $secs s; its log:" >&2
    tail -n 20 "$STATE/node$k.log" >&2 || true
    return 1
}

# SIGTERM to the process whose pid FILE holds, SIGKILL if it is still there after 10 s.
stop_pidfile() {
    local f=$1 pid i
    pid=$(cat "$f" 2>/dev/null || true)
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
}

# The node verbs both labs take: kill K, stop K, start K [-- ARGS], status K (the daemon's
# status document) and exec K CMD... (in node K's namespace). start_node is the lab's own;
# READY_SECS is how long a node may take to answer.
node_verb() {
    local verb=$1 k
    check_k "${2:-}"
    k=$2
    shift 2
    case "$verb" in
        kill) kill -KILL "$(cat "$STATE/node$k.pid")" 2>/dev/null || true ;;
        stop) stop_pidfile "$STATE/node$k.pid" ;;
        start)
            if [ "${1:-}" = "--" ]; then shift; fi
            start_node "$k" "$@"
            wait_ready "$k" "$READY_SECS" ;;
        status) "$(bin)" status --control-socket "$(sock "$k")" --json ;;
        exec) exec ip netns exec "$(ns "$k")" "$@" ;;
        *) die "node_verb: no verb $verb" ;;
    esac
}
