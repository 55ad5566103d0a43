#!/usr/bin/env bash
# A single-host Ceph with an S3 gateway, for tests and benchmarks: one ceph-mon, one ceph-osd on
# the memstore backend (data in memory), radosgw (beast) on 127.0.0.1. No cephx: the cluster is
# private to one test, and S3 requests are still SigV4-checked by radosgw against its users.
#
#   radosgw.sh start DIR   starts everything under DIR (config, data, logs, pid files), creates an
#                          S3 user and prints, on stdout, one line of shell assignments:
#                          RGW_PORT=... RGW_ACCESS_KEY=... RGW_SECRET_KEY=...
#                          Exit 77 (the ctest "skipped" code) with the reason on stderr when the
#                          Ceph binaries are missing or the gateway does not come up.
#   radosgw.sh stop DIR    stops the daemons started in DIR, by the pids recorded there.
#
# About 13 s from nothing on a 2-core machine. Without `ms mon client mode = crc` and
# `ms client mode = crc` for the gateway, radosgw never authenticates to the monitor.
set -uo pipefail

cmd=${1:?usage: radosgw.sh start|stop DIR}
dir=${2:?usage: radosgw.sh start|stop DIR}

stop() {
  local pidfile pid
  for name in rgw osd mon; do
    pidfile="$dir/$name.pid"
    [[ -f $pidfile ]] || continue
    pid=$(cat "$pidfile")
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
    rm -f "$pidfile"
  done
}

skip() {
  echo "radosgw.sh: skipped: $*" >&2
  for log in "$dir"/log/*.log; do
    [[ -f $log ]] && { echo "--- tail of $log" >&2; tail -n 15 "$log" >&2; }
  done
  stop
  exit 77
}

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

if [[ $cmd == stop ]]; then
  stop
  exit 0
fi
[[ $cmd == start ]] || { echo "radosgw.sh: unknown command $cmd" >&2; exit 2; }

for bin in ceph-mon ceph-osd radosgw radosgw-admin monmaptool ceph; do
  command -v "$bin" >/dev/null || skip "$bin is not installed (bash tools/setup.sh installs it)"
done

mkdir -p "$dir"/{mon,osd,run,log}
conf="$dir/ceph.conf"
fsid=$(cat /proc/sys/kernel/random/uuid)
mon_port=$(free_port)
rgw_port=$(free_port)

cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$mon_port
mon initial members = a
auth cluster required = none
auth service required = none
auth client required = none
ms bind ipv4 = true
ms bind ipv6 = false
public addr = 127.0.0.1
run dir = $dir/run
admin socket = $dir/run/\$name.asok
log file = $dir/log/\$name.log
pid file = $dir/run/\$name.pid
crash dir = $dir/crash
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
[mon.a]
mon data = $dir/mon
[osd.0]
osd data = $dir/osd
osd objectstore = memstore
memstore device bytes = 2147483648
osd journal size = 0
[client.rgw]
rgw frontends = beast endpoint=127.0.0.1:$rgw_port
rgw data = $dir/rgw
rgw enable usage log = false
ms mon client mode = crc
ms client mode = crc
EOF

monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$mon_port]" "$dir/monmap" \
  >"$dir/log/setup.log" 2>&1 || skip "monmaptool failed"
ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" >>"$dir/log/setup.log" 2>&1 ||
  skip "ceph-mon --mkfs failed"
ceph-mon -c "$conf" -i a -f >>"$dir/log/setup.log" 2>&1 &
echo $! >"$dir/mon.pid"

osd_uuid=$(cat /proc/sys/kernel/random/uuid)
ok=0
for _ in $(seq 100); do
  # A monitor that exits at once (it does when its disk has under 5% free: mon_data_avail_crit)
  # would otherwise be asked 100 times, 10 s each.
  kill -0 "$(cat "$dir/mon.pid")" 2>/dev/null ||
    skip "ceph-mon exited (the disk under $dir: $(df -h --output=avail "$dir" | tail -n 1 | xargs) available, $(df --output=pcent "$dir" | tail -n 1 | xargs) used; ceph-mon stops below 5% available)"
  if timeout 10 ceph -c "$conf" osd new "$osd_uuid" 0 >>"$dir/log/setup.log" 2>&1; then ok=1; break; fi
  sleep 0.2
done
((ok)) || skip "the monitor did not answer"
ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" >>"$dir/log/setup.log" 2>&1 ||
  skip "ceph-osd --mkfs failed"
ceph-osd -c "$conf" -i 0 -f >>"$dir/log/setup.log" 2>&1 &
echo $! >"$dir/osd.pid"

radosgw -c "$conf" -n client.rgw -f >>"$dir/log/setup.log" 2>&1 &
echo $! >"$dir/rgw.pid"

# The gateway answers once its pools exist, which needs the osd up.
ok=0
for _ in $(seq 300); do
  kill -0 "$(cat "$dir/rgw.pid")" 2>/dev/null || skip "radosgw exited"
  if curl -s -o /dev/null "http://127.0.0.1:$rgw_port/"; then ok=1; break; fi
  sleep 0.2
done
((ok)) || skip "radosgw did not answer on 127.0.0.1:$rgw_port within 60 s"

user=$(radosgw-admin -c "$conf" -n client.rgw user create --uid=conveyor-test \
  --display-name="conveyor test" 2>>"$dir/log/setup.log") || skip "radosgw-admin user create failed"
keys=$(/usr/bin/python3 -c 'import json,sys; k=json.load(sys.stdin)["keys"][0]; print(k["access_key"], k["secret_key"])' <<<"$user") ||
  skip "unexpected radosgw-admin output"
read -r access secret <<<"$keys"
echo "RGW_PORT=$rgw_port RGW_ACCESS_KEY=$access RGW_SECRET_KEY=$secret"
