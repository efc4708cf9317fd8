#!/usr/bin/env bash
# Runs the README's test command (bash scripts/test.sh) on a new machine:
# a fresh Debian bookworm root made with debootstrap, with only Rust in it
# (this machine's rustup toolchain, copied) and a clone of this repository's
# current commit. Not run by CI; run it as root on a Debian host:
#
#   bash scripts/clean-machine-test.sh [ROOT]     # ROOT: /var/tmp/tollgate-clean
#
# The new root runs in a network namespace of its own (ip netns), so its
# PostgreSQL has its own 127.0.0.1:5432 beside this machine's; the
# namespace reaches the network through a veth pair and NAT (iptables),
# for apt, crates.io and PyPI. Nothing in the root is reused from an
# earlier run: it is made anew each time (delete ROOT to reclaim the disk).
# Prints the test command's output, its wall time and its summary line.
#
# Needs: debootstrap, iproute2, iptables, git, and a rustup toolchain in
# ~/.rustup and ~/.cargo (the default toolchain is copied, nothing else).

set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

ROOT=${1:-/var/tmp/tollgate-clean}
NETNS=tollgate-clean
HOST_IF=tgclean0
NS_IF=tgclean1
SUBNET=10.213.0
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

log() { printf '\n==> [%ss] %s\n' "$SECONDS" "$*"; }

if [ "$(id -u)" != 0 ]; then
    echo "scripts/clean-machine-test.sh: run it as root (debootstrap, chroot, ip netns)" >&2
    exit 1
fi
for tool in debootstrap ip iptables git; do
    if ! command -v "$tool" >/dev/null; then
        echo "scripts/clean-machine-test.sh: needs $tool (apt-get install -y debootstrap iproute2 iptables git)" >&2
        exit 1
    fi
done

mounts=(proc sys dev)
cleanup() {
    local m
    for m in "${mounts[@]}"; do
        mountpoint -q "$ROOT/$m" && umount -l "$ROOT/$m"
    done
    # The chroot's services (PostgreSQL) die with the namespace's processes.
    if ip netns list | grep -qw "$NETNS"; then
        local pid
        for pid in $(ip netns pids "$NETNS"); do
            kill -KILL "$pid" 2>/dev/null || true
        done
        ip netns delete "$NETNS"
    fi
    ip link delete "$HOST_IF" 2>/dev/null || true
    iptables -t nat -D POSTROUTING -s "$SUBNET.0/24" -j MASQUERADE 2>/dev/null || true
    iptables -D FORWARD -s "$SUBNET.0/24" -j ACCEPT 2>/dev/null || true
    iptables -D FORWARD -d "$SUBNET.0/24" -j ACCEPT 2>/dev/null || true
}
trap cleanup EXIT
cleanup

log "a new Debian bookworm root in $ROOT"
# Never delete through a mount (a bound /dev is this machine's).
if grep -q " $ROOT/" /proc/mounts; then
    echo "scripts/clean-machine-test.sh: something is still mounted under $ROOT: unmount it first" >&2
    exit 1
fi
rm -rf "$ROOT"
mkdir -p "$ROOT"
debootstrap --variant=minbase bookworm "$ROOT" "$MIRROR" >"$ROOT.debootstrap.log" 2>&1 || {
    tail -n 20 "$ROOT.debootstrap.log" >&2
    exit 1
}

# A network that inspects TLS has a CA of its own, which this machine
# trusts in its bundle and a machine on the same network would trust too:
# the certificates in this machine's bundle that Debian's lacks are added
# to the new root's (apt itself fetches over plain HTTP).
log "this network's extra CA certificates, if any"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
chroot "$ROOT" apt-get update -qq
chroot "$ROOT" apt-get install -y -qq --no-install-recommends ca-certificates >/dev/null
python3 - "$ROOT" <<'PY'
import pathlib, re, sys
root = pathlib.Path(sys.argv[1])
pem = re.compile(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", re.S)
bundle = "etc/ssl/certs/ca-certificates.crt"
ours = set(pem.findall((root / bundle).read_text()))
extra = [c for c in pem.findall(pathlib.Path("/", bundle).read_text()) if c not in ours]
for i, cert in enumerate(extra):
    (root / f"usr/local/share/ca-certificates/host-network-{i}.crt").write_text(cert + "\n")
print(f"{len(extra)} added")
PY
chroot "$ROOT" update-ca-certificates >/dev/null

log "Rust: the default toolchain of ~/.rustup and ~/.cargo/bin"
toolchain=$(rustup default | cut -d' ' -f1)
mkdir -p "$ROOT/root/.rustup/toolchains" "$ROOT/root/.cargo"
cp -a "$HOME/.rustup/settings.toml" "$ROOT/root/.rustup/"
cp -a "$HOME/.rustup/toolchains/$toolchain" "$ROOT/root/.rustup/toolchains/"
cp -a "$HOME/.cargo/bin" "$HOME/.cargo/env" "$ROOT/root/.cargo/"

log "the repository at $(git rev-parse --short HEAD) ($(git rev-parse --abbrev-ref HEAD))"
git clone -q --no-hardlinks "$repo" "$ROOT/root/tollgate"
git -C "$ROOT/root/tollgate" checkout -q "$(git rev-parse HEAD)"

log "network namespace $NETNS (own loopback; NAT to the outside)"
sysctl -q -w net.ipv4.ip_forward=1
ip netns add "$NETNS"
ip link add "$HOST_IF" type veth peer name "$NS_IF"
ip link set "$NS_IF" netns "$NETNS"
ip addr add "$SUBNET.1/24" dev "$HOST_IF"
ip link set "$HOST_IF" up
ip netns exec "$NETNS" ip link set lo up
ip netns exec "$NETNS" ip addr add "$SUBNET.2/24" dev "$NS_IF"
ip netns exec "$NETNS" ip link set "$NS_IF" up
ip netns exec "$NETNS" ip route add default via "$SUBNET.1"
iptables -t nat -A POSTROUTING -s "$SUBNET.0/24" -j MASQUERADE
iptables -A FORWARD -s "$SUBNET.0/24" -j ACCEPT
iptables -A FORWARD -d "$SUBNET.0/24" -j ACCEPT

mount -t proc proc "$ROOT/proc"
mount --rbind /dev "$ROOT/dev"
mount --make-rslave "$ROOT/dev"
mount -t tmpfs shm "$ROOT/dev/shm"
mount --rbind /sys "$ROOT/sys"
mount --make-rslave "$ROOT/sys"

log "the README's test command in the new root"
# The README's quick start: from the repository's directory, the test
# command; a login shell as root with only Rust on its PATH.
start=$SECONDS
set +e
ip netns exec "$NETNS" chroot "$ROOT" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash -c 'cd /root/tollgate && bash scripts/test.sh' 2>&1 | tee "$ROOT.test.log"
status=${PIPESTATUS[0]}
set -e
elapsed=$((SECONDS - start))

echo
echo "clean machine: bash scripts/test.sh exited ${status} after ${elapsed} s (log: $ROOT.test.log)"
grep '^tests: ' "$ROOT.test.log" | tail -n 1
exit "$status"
