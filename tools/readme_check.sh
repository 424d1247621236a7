#!/usr/bin/env bash
# Run the README as a new user would, exactly as written: every code block
# marked `<!-- readme-check: root -->` as root from the top of the checkout,
# then every block marked `<!-- readme-check: as USER -->` in a login shell
# of USER (su -: the PATH and home that user really gets). Then check what
# the blocks promise (the flame graph) and stop the broker they left running.
#
#   tools/readme_check.sh        (as root; tests/kernel/test_readme.py runs it)
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "readme_check: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (the quick start is written for root)"

# The text of the ```sh blocks after each marker line equal to $1.
blocks() {
    awk -v marker="<!-- readme-check: $1 -->" '
        $0 == marker { armed = 1; next }
        armed && /^```sh$/ { inside = 1; armed = 0; next }
        inside && /^```$/ { inside = 0; next }
        inside { print }
    ' README.md
}

users=$(sed -n 's/^<!-- readme-check: as \([a-z_][a-z0-9_-]*\) -->$/\1/p' README.md | sort -u)
root_block=$(blocks root)
[ -n "$root_block" ] || die "README.md has no block marked readme-check: root"
[ -n "$users" ] || die "README.md has no block marked readme-check: as USER"

cleanup() { tools/broker.sh stop >/dev/null 2>&1 || true; }
trap cleanup EXIT

echo "readme_check: as root:"
echo "$root_block" | sed 's/^/  | /'
bash -euo pipefail -c "$root_block"

for user in $users; do
    home=$(getent passwd "$user" | cut -d: -f6)
    [ -n "$home" ] || die "the quick start did not create user $user"
    rm -f "$home/cpu.svg"
    user_block=$(blocks "as $user")
    echo "readme_check: as $user (su - $user):"
    echo "$user_block" | sed 's/^/  | /'
    su - "$user" -c "set -eu
$user_block"
    # The profile line's promise: a flame graph the user can open.
    if grep -q -- "-o cpu.svg" <<<"$user_block"; then
        [ -s "$home/cpu.svg" ] || die "no $home/cpu.svg after the profile"
        grep -q "<svg" "$home/cpu.svg" || die "$home/cpu.svg is not an SVG"
        [ "$(stat -c %U "$home/cpu.svg")" = "$user" ] || die "cpu.svg is not $user's"
    fi
done
echo "readme_check: OK"
