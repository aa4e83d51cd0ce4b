# Helpers shared by the benchmark scripts (sourced, not run).

# A free TCP port on loopback.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# redis-server, redis-cli and redis-benchmark, installed when missing.
need_redis() {
    command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null && return 0
    apt-get update -qq && apt-get install -y -qq redis-server redis-tools >/dev/null
}

# The median of its arguments (numbers).
median() { printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"; }

# Certificates for a benchmark, made in DIR: a CA (ca.pem, ca.key) and, for each
# further name, a leaf (NAME.pem, NAME.key) for localhost and 127.0.0.1, good for
# server and client authentication, signed by that CA. P-256 keys, two days.
bench_pki() { # dir leaf...
    local dir=$1 leaf
    shift
    (
        cd "$dir"
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key \
            -out ca.pem -days 2 -subj "/CN=bench ca" 2>/dev/null
        for leaf in "$@"; do
            openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$leaf.key" \
                -out "$leaf.csr" -subj "/CN=$leaf" 2>/dev/null
            printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' >"$leaf.ext"
            openssl x509 -req -in "$leaf.csr" -CA ca.pem -CAkey ca.key -CAcreateserial \
                -out "$leaf.pem" -days 2 -extfile "$leaf.ext" 2>/dev/null
        done
    )
}

# Puts every thread of PID in a new cgroup NAME limited to PERCENT % of one CPU (CFS
# quota over a 10 ms period), so that a server is the bottleneck of a run whatever its
# clients cost. cgroup v1 (cpu controller) or v2; returns 1 where neither is writable.
# Remove the groups with cpu_quota_remove NAME once the processes are gone.
cpu_quota() { # name percent pid
    local name=$1 pct=$2 pid=$3 group task
    if [ -w /sys/fs/cgroup/cpu/cgroup.procs ] 2>/dev/null; then
        group=/sys/fs/cgroup/cpu/$name
        mkdir -p "$group" || return 1
        echo 10000 >"$group/cpu.cfs_period_us"
        echo $((pct * 100)) >"$group/cpu.cfs_quota_us"
        for task in /proc/"$pid"/task/*; do echo "${task##*/}" >"$group/tasks"; done
    elif [ -w /sys/fs/cgroup/cgroup.subtree_control ] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
        echo +cpu >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || return 1
        group=/sys/fs/cgroup/$name
        mkdir -p "$group" || return 1
        echo "$((pct * 100)) 10000" >"$group/cpu.max"
        echo "$pid" >"$group/cgroup.procs"
    else
        return 1
    fi
}
# Holds each PID to QUOTA % of one CPU (0: none), in cgroups named PREFIX-PID: appends
# them to `groups` (remove them with cpu_quota_remove "${groups[@]}") and sets `held`,
# the phrase a report prints. Stops at the first that cannot be held, and says so.
hold_to_quota() { # prefix quota pid...
    local prefix=$1 quota=$2 p
    shift 2
    held="not held to a quota"
    [ "$quota" -gt 0 ] || return 0
    held="each held to $quota% of one CPU"
    for p in "$@"; do
        groups+=("$prefix-$p")
        cpu_quota "$prefix-$p" "$quota" "$p" || {
            held="not held to a quota (no writable cgroup tree)"
            echo "warning: cannot set a CPU quota; the clients may be the bottleneck" >&2
            return 0
        }
    done
}
cpu_quota_remove() { # name...
    local name
    for name in "$@"; do
        rmdir "/sys/fs/cgroup/cpu/$name" "/sys/fs/cgroup/$name" 2>/dev/null || true
    done
}

# Instructions per request of one server under valgrind's callgrind: starts "$@" under
# callgrind (its PID added to the caller's `pids`), waits until URL answers, warms it up
# with wrk for 3 s, zeroes the counters, runs wrk 5 s more (4 kept connections, extra
# arguments WRK_ARGS, split on spaces) and divides the instructions counted by the
# requests wrk completed. Prints a line and sets CG_PER_REQUEST. Output files in DIR.
callgrind_per_request() { # dir label url wrk-args command...
    local dir=$1 label=$2 url=$3 args=$4
    shift 4
    valgrind --tool=callgrind --callgrind-out-file="$dir/cg.$label.%p" "$@" >/dev/null 2>&1 &
    local vpid=$! n ir
    pids+=("$vpid")
    for _ in $(seq 120); do curl -sk -o /dev/null "$url" && break; sleep 0.5; done
    # shellcheck disable=SC2086
    wrk -t1 -c4 -d3s $args "$url" >/dev/null
    callgrind_control -z "$vpid" >/dev/null 2>&1
    # shellcheck disable=SC2086
    n=$(wrk -t1 -c4 -d5s $args "$url" | awk '/requests in/ {print $1}')
    callgrind_control -d "$vpid" >/dev/null 2>&1
    sleep 1
    kill "$vpid" 2>/dev/null || true
    wait "$vpid" 2>/dev/null || true
    ir=$(cat "$dir"/cg."$label".*.1 | awk '/^summary:/ {s += $2} END {print s}')
    CG_PER_REQUEST=$((ir / n))
    printf '%-28s %8d requests %12d instructions %8d per request\n' "$label" "$n" "$ir" "$CG_PER_REQUEST"
}

# Writes FILE: an nginx config (one worker, in the foreground; with MASTER "off", no
# master process, as under valgrind) that proxies /api/ to 127.0.0.1:UPSTREAM on kept
# connections behind a limit_req keyed by X-Api-Key that every request passes (as the
# benchmarks' tollgate routes), on each LISTEN ("PORT" or "PORT ssl"; TLS with
# server.pem and server.key from FILE's directory, as bench_pki makes them).
nginx_bench_conf() { # file upstream master listen...
    local file=$1 upstream=$2 master=$3 dir listen
    shift 3
    dir=$(dirname "$file")
    {
        echo "master_process $master;"
        cat <<EOF
worker_processes 1;
pid $file.pid;
error_log $dir/nginx-error.log crit;
daemon off;
events { worker_connections 1024; }
http {
  access_log off;
  limit_req_zone \$http_x_api_key zone=z:10m rate=1000000r/s;
  upstream up { server 127.0.0.1:$upstream; keepalive 64; }
  server {
EOF
        for listen in "$@"; do echo "    listen 127.0.0.1:$listen;"; done
        cat <<EOF
    ssl_certificate $dir/server.pem;
    ssl_certificate_key $dir/server.key;
    location /api/ {
      limit_req zone=z burst=1000 nodelay;
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
EOF
    } >"$file"
}
