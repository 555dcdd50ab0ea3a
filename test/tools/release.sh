#!/usr/bin/env bash
# Assembles a release in OUT from the image archives `make images` wrote (with their .digest files): the chart,
# packaged at VERSION with both images pinned to their digests, as a tgz and as an OCI artifact; the kubectl plugin
# for linux and darwin on amd64 and arm64, with a krew manifest; SHA256SUMS of it all. Every archive is dated
# SOURCE_DATE_EPOCH, so two releases of one commit are the same bytes.
# Usage: release.sh VERSION IMAGES_DIR OUT HELM GO RELEASE_URL SOURCE_DATE_EPOCH LIFELINE_IMAGES
# IMAGE_REPOSITORY (default lifeline) is where the chart pulls the images from: <IMAGE_REPOSITORY>/lifeline-agent.
# PLUGIN_PLATFORMS (os/arch, space-separated) narrows the plugin's platforms, for a test.
set -euo pipefail
version=$1 images=$2 out=$3 helm=$4 go=$5 url=$6 epoch=$7 images_tool=$8
repository=${IMAGE_REPOSITORY:-lifeline}
plugin_platforms=${PLUGIN_PLATFORMS:-linux/amd64 linux/arm64 darwin/amd64 darwin/arm64}
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$out"
mkdir -p "$out/images" "$out/plugin"

echo "==> release $version: the image archives"
declare -A digest
for name in lifeline-controller lifeline-agent; do
	cp "$images/$name.tar" "$out/images/$name-$version.tar"
	digest[$name]=$(tr -d '\n' <"$images/$name.digest")
	echo "    $name:$version@${digest[$name]}"
done

echo "==> release $version: the chart, its images pinned to $repository/...@<digest>"
cp -r deploy/chart/lifeline "$work/lifeline"
# Each component's image.repository and image.digest, the first such lines under its top-level key.
awk -v c="${digest[lifeline-controller]}" -v a="${digest[lifeline-agent]}" -v r="$repository" '
	/^[a-zA-Z]/ { section = $1; sub(":", "", section) }
	/^    repository: lifeline\/lifeline-(controller|agent)$/ { sub(/lifeline\//, r "/") }
	/^    digest: ""/ && section == "controller" && !done["c"] { sub(/""/, "\"" c "\""); done["c"] = 1 }
	/^    digest: ""/ && section == "agent" && !done["a"] { sub(/""/, "\"" a "\""); done["a"] = 1 }
	{ print }
	END { if (!done["c"] || !done["a"]) { print "release.sh: no image digest line in values.yaml" > "/dev/stderr"; exit 1 } }
' deploy/chart/lifeline/values.yaml >"$work/lifeline/values.yaml"
"$helm" lint "$work/lifeline" --set "broker.advertiseAddress={192.0.2.1}" --set-string nodeIdentity.kubeedgeCA=lint >/dev/null
"$helm" package "$work/lifeline" --version "$version" --app-version "$version" --destination "$work/chart" >/dev/null
# helm package dates each entry now; repack it dated SOURCE_DATE_EPOCH, in name order, for a reproducible archive.
mkdir "$work/unpacked"
tar -xzmf "$work/chart/lifeline-$version.tgz" -C "$work/unpacked"
tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner -C "$work/unpacked" -cf - lifeline |
	gzip -9n >"$out/lifeline-$version.tgz"
"$images_tool" chart --source-date-epoch "$epoch" "$out/lifeline-$version.tgz" "$out/lifeline-$version.oci.tar"

echo "==> release $version: kubectl-lifeline for $plugin_platforms, and its krew manifest"
platforms=""
for platform in $plugin_platforms; do
	os=${platform%/*} arch=${platform#*/}
	dir="$work/plugin/${os}_$arch"
	CGO_ENABLED=0 GOOS=$os GOARCH=$arch GOFLAGS=-trimpath "$go" build -ldflags '-s -w' -o "$dir/kubectl-lifeline" ./cmd/kubectl-lifeline
	archive="kubectl-lifeline_${version}_${os}_$arch.tar.gz"
	tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner -C "$dir" -cf - kubectl-lifeline |
		gzip -9n >"$out/plugin/$archive"
	sum=$(sha256sum "$out/plugin/$archive" | cut -d' ' -f1)
	platforms+="  - selector:
      matchLabels:
        os: $os
        arch: $arch
    uri: $url/$archive
    sha256: $sum
    bin: kubectl-lifeline
"
done
cat >"$out/plugin/lifeline.yaml" <<EOF
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: lifeline
spec:
  version: v$version
  homepage: https://github.com/lifeline-edge/lifeline
  shortDescription: Show Lifeline's edge workers and the liveness of their nodes
  description: |
    kubectl lifeline lists the workers of Sedna's JointInferenceServices and FederatedLearningJobs that Lifeline
    runs, with what the API server and each node's edge agent say of them: alive, dead, or not heard from while
    the node is cut off, and the stand-ins that run in their place.
  platforms:
$platforms
EOF

echo "==> release $version: SHA256SUMS"
(cd "$out" && find . -type f | sed 's|^\./||' | LC_ALL=C sort | xargs sha256sum >"$work/SHA256SUMS")
mv "$work/SHA256SUMS" "$out/SHA256SUMS"
echo "release $version in $out:"
(cd "$out" && find . -type f | sed 's|^\./|    |' | LC_ALL=C sort)
