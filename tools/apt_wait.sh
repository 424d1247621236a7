# Sourced by tools/setup.sh and tools/test_deps.sh: apt-get that waits while another apt or dpkg run
# (unattended-upgrades, a package manager window, a second setup) holds the
# package locks, instead of failing at once; it gives up after
# GFXBPF_APT_LOCK_TIMEOUT seconds (default 300) and says what to do.

APT_LOCK_TIMEOUT=${GFXBPF_APT_LOCK_TIMEOUT:-300}
APT_RETRY_SECONDS=${GFXBPF_APT_RETRY_SECONDS:-5}

apt_get_waiting() {
    local - # the options below stay in this function
    set -o pipefail
    local deadline=$((SECONDS + APT_LOCK_TIMEOUT)) said=0 log
    log=$(mktemp)
    while :; do
        # apt's own wait covers the dpkg lock; the loop also covers the lists lock.
        if apt-get -o DPkg::Lock::Timeout="$APT_RETRY_SECONDS" "$@" 2>&1 | tee "$log"; then
            rm -f "$log"
            return 0
        fi
        if ! grep -qiE "could not get lock|unable to acquire the dpkg|is another process using it" "$log"; then
            rm -f "$log"
            return 1
        fi
        if ((SECONDS >= deadline)); then
            rm -f "$log"
            echo "setup: another apt or dpkg run held the package lock for ${APT_LOCK_TIMEOUT} s;" \
                "let it finish (ps -C apt-get,apt,dpkg,unattended-upgr), then run this again" \
                "(GFXBPF_APT_LOCK_TIMEOUT=SECONDS waits longer)" >&2
            return 1
        fi
        ((said)) || echo "setup: another apt or dpkg run holds the package lock; waiting up to ${APT_LOCK_TIMEOUT} s"
        said=1
        sleep "$APT_RETRY_SECONDS"
    done
}

# apt_install_missing WHO PACKAGE...: install those of the Debian packages
# that are not installed yet (nothing, not even apt-get update, when all are).
apt_install_missing() {
    local who=$1 p missing=()
    shift
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    echo "$who: installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt_get_waiting update -q
    apt_get_waiting install -y -q --no-install-recommends "${missing[@]}"
}
