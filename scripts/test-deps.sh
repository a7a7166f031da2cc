#!/usr/bin/env bash
# Installs what prefixd's tests need on a fresh Debian machine: a real
# redis-server, real libzmq publishers (python3-zmq, python3-msgpack) and
# the libraries vLLM's CBOR block hashes call (python3-cbor2, python3-xxhash),
# for the system interpreter /usr/bin/python3. Needs root, or sudo.
set -euo pipefail
pkgs=(redis-server python3-zmq python3-msgpack python3-cbor2 python3-xxhash)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
	exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
echo "installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
