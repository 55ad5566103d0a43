#!/bin/bash
# Run by deb_install_test.sh inside a clean Debian 12 root where `apt-get install ./conveyor*.deb`
# has just run: what a user of the package gets, with nothing from the build tree.
set -euo pipefail
source /tmp/common.sh
cd /tmp
echo "\$ conveyor --version"; conveyor --version
[[ "$(command -v conveyor)" == /usr/bin/conveyor ]] || fail "conveyor is not /usr/bin/conveyor"
version_text="$(conveyor --version)"
version="$(sed -n '1s/^[^ ]* \([^ ]*\).*/\1/p' <<< "$version_text")"
grep -Eq '^schedule versions: 1( [0-9]+)*' <<< "$version_text" || fail "--version lists no schedule versions"

CONFIG=/usr/share/conveyor/examples/pipeline.yaml
conveyor synth --out /tmp/ds --episodes 3 --episode-seconds 4:6 --seed 5 > /dev/null
conveyor serve /tmp/ds --config "$CONFIG" --listen 127.0.0.1:0 --ready-file /tmp/ready 2> /tmp/serve.log &
server=$!
trap 'kill -KILL $server 2>/dev/null || true' EXIT
wait_ready /tmp/ready "$server" || { cat /tmp/serve.log; fail "conveyor serve did not start"; }
addr="$(cut -d' ' -f1 /tmp/ready)"
conveyor batches /tmp/ds --config "$CONFIG" --steps 4 --digest > offline.txt
conveyor fetch --servers "$addr" --steps 4 --digest > served.txt
[[ $(wc -l < served.txt) -eq 4 ]] || fail "expected 4 batches"
diff offline.txt served.txt || fail "fetch --digest differs from batches --digest"
echo "ok: conveyor fetch --digest (4 batches from $addr) equals conveyor batches --digest"

# A C++ program against the installed client: find_package(Conveyor), Conveyor::client.
cmake -S /usr/share/conveyor/examples/cpp_consumer -B /tmp/consumer -DCMAKE_BUILD_TYPE=Release > /tmp/cmake.log 2>&1 ||
  { cat /tmp/cmake.log; fail "configuring examples/cpp_consumer with find_package(Conveyor) failed"; }
cmake --build /tmp/consumer > /tmp/make.log 2>&1 || { cat /tmp/make.log; fail "building the consumer failed"; }
# (/lib is /usr/lib on Debian 12: the loader's cache may name either.)
grep -Eq 'libconveyor_client.so.1 => (/usr)?/lib/x86_64-linux-gnu/libconveyor_client.so.1' <<< "$(ldd /tmp/consumer/conveyor_consumer)" ||
  fail "the consumer does not load the package's libconveyor_client.so.1: $(ldd /tmp/consumer/conveyor_consumer | grep conveyor)"
/tmp/consumer/conveyor_consumer --servers "$addr" --steps 4 > consumer.txt
conveyor fetch --servers "$addr" --steps 4 --ids > ids.txt
cat consumer.txt
diff <(ids_of_fetch ids.txt) <(ids_of_consumer consumer.txt) ||
  fail "the C++ consumer's batches differ from conveyor fetch --ids"
echo "ok: a find_package(Conveyor) consumer receives the batches conveyor fetch lists"

# Python: Debian's python3 finds the package in /usr/lib/python3/dist-packages.
pkg=/usr/lib/python3/dist-packages/conveyor
[[ -f $pkg/__init__.py ]] || fail "no $pkg/__init__.py"
[[ "$(python3 -c 'import sys; sys.path.insert(0, "/usr/lib/python3/dist-packages/conveyor"); import _version; print(_version.__version__)')" == "$version" ]] ||
  fail "conveyor/_version.py does not say $version"
# The package reaches the C++ client through the C ABI library (libconveyor_c.so.1, loaded with
# ctypes from the loader's path): the Loader streams the served batches, equal to fetch --digest.
[[ -e /usr/lib/x86_64-linux-gnu/libconveyor_c.so.1 ]] || fail "the package installs no libconveyor_c.so.1"
[[ -e /usr/lib/x86_64-linux-gnu/libconveyor_video.so.1 ]] || fail "the package installs no libconveyor_video.so.1"
# conveyor.video finds its library on the loader's path too, and only when it is used.
(cd / && python3 - <<'PY') || fail "conveyor.video's library is not found, or import conveyor loads it"
from pathlib import Path
import conveyor
assert "libconveyor_video" not in Path("/proc/self/maps").read_text(), "import conveyor loaded it"
from conveyor import video
video._library()
assert "libconveyor_video.so.1" in Path("/proc/self/maps").read_text()
PY
echo "ok: conveyor.video loads the package's libconveyor_video.so.1 when used"
got="$(cd / && python3 -c 'import conveyor; print(conveyor.__version__)')" || fail "python3 -c 'import conveyor' failed"
[[ "$got" == "$version" ]] || fail "conveyor.__version__ is $got, conveyor --version $version"
echo "ok: python3 -c 'import conveyor' (__version__ $got)"
(cd / && python3 - "$addr" > /tmp/python.txt <<'PY') || fail "conveyor.Loader against the server failed"
import hashlib, sys
import conveyor
for b in conveyor.Loader(servers=[sys.argv[1]], max_batches=4):
    h = hashlib.sha256()
    for name, a in conveyor.tensors(b).items():
        h.update(f"{name}|{a.dtype.name}|{''.join(f'{d},' for d in a.shape)}".encode())
        h.update(a.tobytes())
    print(b["_cursor"][0], b["_cursor"][1], h.hexdigest())
PY
diff <(awk '{split($1, c, ":"); print c[1], c[2], $NF}' served.txt) /tmp/python.txt ||
  fail "conveyor.Loader's batches differ from conveyor fetch --digest"
echo "ok: conveyor.Loader in Debian's python3 reads the 4 batches fetch --digest lists"

kill -TERM "$server"; wait "$server" || fail "conveyor serve did not exit cleanly on SIGTERM"
trap - EXIT
