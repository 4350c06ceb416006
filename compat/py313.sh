#!/usr/bin/env bash
# The Python 3.13 row of the support matrix. Python 3.13 comes from Debian 13 (trixie): debootstrap
# makes a small root with its python3.13 (about 270 MB), and each command runs in that root with
# `unshare --mount` + `chroot`, the repository bind-mounted at /src. The mounts live in a private
# mount namespace and vanish with the command, so nothing of the host changes. Only Debian's and
# PyPI's registries are used (no interpreter downloads from elsewhere). Needs root.
#
#   compat/py313.sh root        make .venv-py313/root (installs debootstrap with apt-get if missing)
#   compat/py313.sh venv        make the venv /venv in the root: custom_fit editable, pinned stack
#   compat/py313.sh run CMD...  run CMD in /src inside the root, with /venv/bin first on PATH
#
# `make test-py313` calls these (the Makefile keeps the stamps); see compat/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
dir=$repo/.venv-py313
root=$dir/root
mirror=${PY313_MIRROR:-http://deb.debian.org/debian}
# The host's pip cache, shared with the root (downloads are reused, the root stays small).
pip_cache=${XDG_CACHE_HOME:-$HOME/.cache}/pip

die() {
    echo "compat/py313.sh: $*" >&2
    exit 1
}

[[ $EUID -eq 0 ]] || die "needs root (debootstrap, unshare --mount and chroot); run it as root or with sudo"

# Nothing may be mounted under the root before it is removed (only a running command's private
# namespace mounts there, and those mounts are not visible here; this guards against the rest).
assert_unmounted() {
    if findmnt -rn -o TARGET | grep -q -F "$dir/"; then
        die "something is mounted under $dir (findmnt); unmount it before the root is made again"
    fi
}

make_root() {
    if ! command -v debootstrap > /dev/null; then
        echo "installing debootstrap with apt-get"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap > /dev/null
    fi
    assert_unmounted
    rm -rf "$root" "$root.tmp"
    mkdir -p "$dir"
    # debootstrap mounts /proc and /sys in the new root while it works: in a private namespace,
    # an interrupted run leaves no mount behind on the host.
    unshare --mount --propagation private \
        debootstrap --variant=minbase --include=python3.13,python3.13-venv,ca-certificates,make \
        trixie "$root.tmp" "$mirror" > "$dir/debootstrap.log" 2>&1 ||
        { tail -n 20 "$dir/debootstrap.log"; die "debootstrap failed (log: $dir/debootstrap.log)"; }
    mv "$root.tmp" "$root"
}

run() {
    [[ -x $root/usr/bin/python3.13 ]] || die "no root at $root: run \`make py313-venv\` first"
    mkdir -p "$root/src" "$root/root/.cache/pip" "$pip_cache"
    # Name resolution as on the host (a copy: the host's file may be a link into its /run).
    rm -f "$root/etc/resolv.conf"
    cat /etc/resolv.conf > "$root/etc/resolv.conf"
    # A clean environment: the host's PYTHONPATH, pip configuration and paths mean nothing in there.
    local -a env=(HOME=/root LANG=C.UTF-8 PATH=/venv/bin:/usr/local/bin:/usr/bin:/bin)
    # The root trusts the certificates the host trusts (a host may add its own CA, as a proxy
    # that inspects HTTPS needs): the host's bundle replaces Debian's stock one in there.
    local ca_bundle=/etc/ssl/certs/ca-certificates.crt host_ca=
    if [[ -f $ca_bundle ]]; then
        host_ca=$ca_bundle
        env+=("PIP_CERT=$ca_bundle")
    fi
    local name
    for name in $(compgen -e); do
        case $name in
            TF_USE_LEGACY_KERAS | TF_CPP_MIN_LOG_LEVEL | CUSTOM_FIT_* | PYTEST_ADDOPTS | CI | TERM | \
                PYTHONDONTWRITEBYTECODE | PYTHONUNBUFFERED | PYTHONHASHSEED | \
                PIP_INDEX_URL | PIP_EXTRA_INDEX_URL | PIP_DEFAULT_TIMEOUT | http_proxy | https_proxy | no_proxy)
                env+=("$name=${!name}")
                ;;
        esac
    done
    # shellcheck disable=SC2016  # expanded by the inner shells
    unshare --mount --propagation private -- bash -c '
        set -e
        root=$1 repo=$2 pip_cache=$3 host_ca=$4
        shift 4
        mount --bind "$repo" "$root/src"
        mount -t proc proc "$root/proc"
        mount --rbind /dev "$root/dev"
        mount --rbind /sys "$root/sys"
        mount --bind "$pip_cache" "$root/root/.cache/pip"
        if [[ -n $host_ca ]]; then mount --bind "$host_ca" "$root$host_ca"; fi
        exec chroot "$root" /usr/bin/env -i "$@"
    ' bash "$root" "$repo" "$pip_cache" "$host_ca" "${env[@]}" bash -c 'cd /src && exec "$@"' bash "$@"
}

make_venv() {
    rm -rf "$root/venv"
    run python3.13 -m venv /venv
    run python -m pip install --quiet --upgrade pip
    run python -m pip install --quiet -c constraints.txt -e ".[test,keras2,demo]"
}

case ${1:-} in
    root) make_root ;;
    venv) make_venv ;;
    run)
        shift
        (($#)) || die "run: which command? (e.g. compat/py313.sh run python -m pytest tests/test_model.py)"
        run "$@"
        ;;
    *) die "expected root, venv or run CMD..., got '${1:-}'" ;;
esac
