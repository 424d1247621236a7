#!/usr/bin/env bash
# The viewers whose own readers test gfxclient profile's files
# (tests/unit/test_profile_viewers.py), installed under $GFXBPF_TOOLS
# (default /opt/gfxbpf/tools), readable by every user:
#   pprof       Google's pprof, built from Debian's source package
#               (golang-github-google-pprof-dev) with Debian's Go, offline:
#               GOPATH mode over /usr/share/gocode, where Debian's Go
#               source packages put their code and dependencies.
#   speedscope/ the npm package `speedscope` (its page and importer), a pinned version.
# Run by tools/test_deps.sh after the Debian packages; idempotent: a second run
# only checks the versions it recorded.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${GFXBPF_TOOLS:-/opt/gfxbpf/tools}
SPEEDSCOPE_VERSION=1.25.0
mkdir -p "$DEST"

# Rebuilt when Debian updates the source or the compiler.
want=$(dpkg-query -W -f='${Package}=${Version} ' golang-github-google-pprof-dev golang-go)
if [ ! -x "$DEST/pprof" ] || [ "$(cat "$DEST/pprof.version" 2>/dev/null)" != "$want" ]; then
    echo "setup: building Google's pprof ($want) into $DEST/pprof"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    GOPATH="$work/gopath:/usr/share/gocode" GO111MODULE=off GOFLAGS= GOPROXY=off \
        GOCACHE="$work/cache" go build -o "$work/pprof" github.com/google/pprof
    install -m 0755 "$work/pprof" "$DEST/pprof"
    echo "$want" >"$DEST/pprof.version"
fi

package=$DEST/speedscope/node_modules/speedscope/package.json
if ! grep -q "\"version\": \"$SPEEDSCOPE_VERSION\"" "$package" 2>/dev/null; then
    if ! command -v npm >/dev/null; then
        # Debian's npm; not beside a nodejs that bundles its own (NodeSource's conflicts with it).
        . tools/apt_wait.sh
        DEBIAN_FRONTEND=noninteractive apt_get_waiting install -y -q --no-install-recommends npm
    fi
    # npm trusts its own CA list; with no cafile configured, give it the system's
    # (which may hold a proxy's CA, as pip's does: tools/debian13.sh copies it in).
    trust=()
    system_ca=/etc/ssl/certs/ca-certificates.crt
    if [ -s "$system_ca" ] && [[ "$(npm config get cafile)" =~ ^(null|undefined|)$ ]]; then
        trust=(--cafile "$system_ca")
    fi
    echo "setup: installing speedscope $SPEEDSCOPE_VERSION into $DEST/speedscope"
    npm install --prefix "$DEST/speedscope" --no-audit --no-fund --no-save -q "${trust[@]}" \
        "speedscope@$SPEEDSCOPE_VERSION"
fi
chmod -R a+rX "$DEST"
