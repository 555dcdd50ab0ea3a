#!/usr/bin/env bash
# Builds cloudcore and edgecore into BIN from KubeEdge's source archive (its tree with vendor/, at a pinned commit),
# with no module download: the Go module proxy does not serve github.com/kubeedge/kubeedge. Without the archive it
# says so and builds nothing; the tests that need KubeEdge then skip, saying why.
#   build.sh <archive or empty> <bin dir>
set -euo pipefail
archive=${1:-}
bin=$2
here=$(cd "$(dirname "$0")" && pwd)
want=$(awk '{ print $1 }' "$here/archive.sha256")

if [[ -z $archive || ! -f $archive ]]; then
	echo "==> KubeEdge: no source archive (../shared/kubeedge/kubeedge-*.tar.xz, or KUBEEDGE_ARCHIVE): cloudcore and edgecore not built, the KubeEdge tests skip"
	exit 0
fi
stamp=$bin/.kubeedge-$want
crds=$bin/kubeedge-crds
if [[ -x $bin/cloudcore && -x $bin/edgecore && -f $stamp && -d $crds ]]; then
	exit 0
fi
got=$(sha256sum "$archive" | awk '{ print $1 }')
if [[ $got != "$want" ]]; then
	echo "KubeEdge: $archive has sha256 $got, not the pinned $want (test/tools/kubeedge/archive.sha256)" >&2
	exit 1
fi
# cloudcore's CRDs (devices, rules, node tasks...), which keadm init applies and cloudcore's controllers watch.
if [[ ! -d $crds ]]; then
	tmp=$(mktemp -d)
	tar -xJf "$archive" -C "$tmp" --wildcards 'kubeedge/build/crds/*'
	rm -rf "$crds" && mv "$tmp/kubeedge/build/crds" "$crds" && rm -rf "$tmp"
fi
if [[ -x $bin/cloudcore && -x $bin/edgecore && -f $stamp ]]; then
	exit 0
fi
src=$bin/.kubeedge-src
rm -rf "$src" && mkdir -p "$src"
echo "==> KubeEdge: extracting $(basename "$archive")"
tar -xJf "$archive" -C "$src"
cd "$src"/kubeedge
export GOWORK=off GOFLAGS=-mod=vendor GOPROXY=off
echo "==> KubeEdge: building cloudcore and edgecore from the archive's vendor/ (cold: several minutes on 2 cores)"
"$here/../progress.sh" "cloudcore" env CGO_ENABLED=0 go build -ldflags '-s -w' -o "$bin/cloudcore" ./cloud/cmd/cloudcore
# edgecore's SQLite driver needs cgo; -tags libsqlite3 links Debian's libsqlite3 (libsqlite3-dev), the archive has
# no amalgamation.
"$here/../progress.sh" "edgecore" env CGO_ENABLED=1 go build -tags libsqlite3 -ldflags '-s -w' -o "$bin/edgecore" ./edge/cmd/edgecore
cd / && rm -rf "$src"
rm -f "$bin"/.kubeedge-* && touch "$stamp"
