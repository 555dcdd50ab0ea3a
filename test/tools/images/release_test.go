package main

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// make release's assembly (test/tools/release.sh) from the images this package built: both image archives, the
// chart packaged at the release's version with both images pinned to the digests the archives hold (in every
// place the chart names them: the controller, the agent and the stand-ins' gate), the plugin
// archive with its krew manifest naming its checksum, and SHA256SUMS over all of it. The plugin is built for this
// machine's platform only: for the others it is the same Go cross-compilation the images' commands get.
func TestReleasePinsTheChartToTheImagesAndChecksEverything(t *testing.T) {
	const version = "1.2.3"
	out := filepath.Join(t.TempDir(), "release")
	helm := release(t, version, "lifeline", out)
	want := pinnedImages(t, version, "lifeline", out)
	rendered, err := exec.Command(helm, "template", "lifeline", filepath.Join(out, "lifeline-"+version+".tgz"),
		"--set", "broker.advertiseAddress={192.0.2.1}", "--set-string", "nodeIdentity.kubeedgeCA=ca",
	).CombinedOutput()
	if err != nil {
		t.Fatalf("helm template of the packaged chart: %v\n%s", err, rendered)
	}
	checkImagesNamed(t, "lifeline", string(rendered), want)

	manifest, err := os.ReadFile(filepath.Join(out, "plugin", "lifeline.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	archive := fmt.Sprintf("kubectl-lifeline_%s_%s_%s.tar.gz", version, runtime.GOOS, runtime.GOARCH)
	sum := fileSHA256(t, filepath.Join(out, "plugin", archive))
	for _, line := range []string{"version: v" + version, "uri: https://example.com/download/v1.2.3/" + archive,
		"sha256: " + sum, "os: " + runtime.GOOS, "arch: " + runtime.GOARCH} {
		if !strings.Contains(string(manifest), line) {
			t.Errorf("the krew manifest lacks %q:\n%s", line, manifest)
		}
	}
	if bin := pluginBinary(t, filepath.Join(out, "plugin", archive)); runtime.GOOS == "linux" {
		f, err := elf.NewFile(strings.NewReader(string(bin)))
		if err != nil || f.Machine != map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[runtime.GOARCH] {
			t.Errorf("the plugin archive's kubectl-lifeline is no %s binary (%v)", runtime.GOARCH, err)
		}
	}

	var listed []string
	sums, err := os.Open(filepath.Join(out, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer sums.Close()
	for s := bufio.NewScanner(sums); s.Scan(); {
		sum, file, ok := strings.Cut(s.Text(), "  ")
		if !ok || fileSHA256(t, filepath.Join(out, file)) != sum {
			t.Errorf("SHA256SUMS line %q does not match its file", s.Text())
		}
		listed = append(listed, file)
	}
	var files []string
	_ = filepath.WalkDir(out, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() != "SHA256SUMS" {
			rel, _ := filepath.Rel(out, path)
			files = append(files, rel)
		}
		return err
	})
	slices.Sort(files)
	if !slices.Equal(listed, files) {
		t.Errorf("SHA256SUMS lists %q, the release holds %q", listed, files)
	}
}

// A release pushed to a registry, as make release REGISTRY=... pushes it, is what Helm and a container runtime
// pull: helm pull gets the very chart package of the release from its OCI artifact, helm template of it names the
// images in that registry at the digests the registry serves for their tags, each an index of both platforms.
func TestAReleasePushedToARegistryInstallsFromIt(t *testing.T) {
	server := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer server.Close()
	const version = "2.0.0-rc.1"
	repository := strings.TrimPrefix(server.URL, "http://") + "/team/lifeline"
	out := filepath.Join(t.TempDir(), "release")
	helm := release(t, version, repository, out)
	if b, err := exec.Command(imagesTool(t), "push", "--registry", repository, "--version", version, out).CombinedOutput(); err != nil {
		t.Fatalf("lifeline-images push: %v\n%s", err, b)
	}

	want := pinnedImages(t, version, repository, out)
	for _, spec := range lifelineImages {
		ref, err := name.ParseReference(repository + "/" + spec.Name + ":" + version)
		if err != nil {
			t.Fatal(err)
		}
		idx, err := remote.Index(ref)
		if err != nil {
			t.Fatalf("pulling %s: %v", ref, err)
		}
		digest, _ := idx.Digest()
		if pinned := ref.String() + "@" + digest.String(); pinned != want[spec.Name] {
			t.Errorf("the registry serves %s, the chart pins %s", pinned, want[spec.Name])
		}
		im, _ := idx.IndexManifest()
		if len(im.Manifests) != len(testPlatforms) {
			t.Errorf("%s is an index of %d images, want one per platform (%d)", ref, len(im.Manifests), len(testPlatforms))
		}
	}
	chartRef, err := name.ParseReference(repository + "/charts/lifeline:" + version)
	if err != nil {
		t.Fatal(err)
	}
	pushed, err := remote.Get(chartRef)
	if err != nil {
		t.Fatalf("pulling the chart's artifact %s: %v", chartRef, err)
	}
	if archived := indexDigest(t, filepath.Join(out, "lifeline-"+version+".oci.tar")); pushed.Digest.String() != archived {
		t.Errorf("the registry serves the chart as %s, the release's artifact is %s", pushed.Digest, archived)
	}

	pulled := t.TempDir()
	if b, err := exec.Command(helm, "pull", "oci://"+repository+"/charts/lifeline", "--version", version, "--plain-http", "-d", pulled).CombinedOutput(); err != nil {
		t.Fatalf("helm pull: %v\n%s", err, b)
	}
	if got, want := fileSHA256(t, filepath.Join(pulled, "lifeline-"+version+".tgz")), fileSHA256(t, filepath.Join(out, "lifeline-"+version+".tgz")); got != want {
		t.Errorf("helm pull got a chart package of sha256 %s, the release's is %s", got, want)
	}
	rendered, err := exec.Command(helm, "template", "lifeline", "oci://"+repository+"/charts/lifeline", "--version", version, "--plain-http",
		"--set", "broker.advertiseAddress={192.0.2.1}", "--set-string", "nodeIdentity.kubeedgeCA=ca",
	).CombinedOutput()
	if err != nil {
		t.Fatalf("helm template oci://: %v\n%s", err, rendered)
	}
	checkImagesNamed(t, repository, string(rendered), want)
}

// release runs make release's assembly (release.sh) of the first build's images into out, the chart pulling them
// from repository, and returns the helm it used; without helm in bin/ the test skips.
func release(t *testing.T, version, repository, out string) (helm string) {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	helm = filepath.Join(root, "bin", "helm")
	if _, err := os.Stat(helm); err != nil {
		t.Skipf("no helm in bin/ (make tools builds it): %v", err)
	}
	cmd := exec.Command(filepath.Join(root, "test", "tools", "release.sh"), version, builds[0], out, helm, "go",
		"https://example.com/download/v"+version, fmt.Sprint(testEpoch), imagesTool(t))
	cmd.Env = append(os.Environ(), "PLUGIN_PLATFORMS="+runtime.GOOS+"/"+runtime.GOARCH, "IMAGE_REPOSITORY="+repository)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("release.sh: %v\n%s", err, b)
	}
	return helm
}

// pinnedImages is each image's reference as the release's chart must name it, <repository>/<image>:<version>@<the
// digest of the index in its archive>, the archive's digest checked against the build's .digest file.
func pinnedImages(t *testing.T, version, repository, out string) map[string]string {
	t.Helper()
	want := map[string]string{}
	for _, spec := range lifelineImages {
		archive := filepath.Join(out, "images", spec.Name+"-"+version+".tar")
		digest := indexDigest(t, archive)
		if written, _ := os.ReadFile(filepath.Join(builds[0], spec.Name+".digest")); strings.TrimSpace(string(written)) != digest {
			t.Errorf("%s.digest says %q, its archive's index is %s", spec.Name, written, digest)
		}
		want[spec.Name] = repository + "/" + spec.Name + ":" + version + "@" + digest
	}
	return want
}

// checkImagesNamed checks that every place a rendered chart names Lifeline's images (the controller, the agent
// and the stand-ins' gate) names them as want does.
func checkImagesNamed(t *testing.T, repository, rendered string, want map[string]string) {
	t.Helper()
	named := regexp.MustCompile(regexp.QuoteMeta(repository)+`/lifeline-(controller|agent)[^\s"']*`).FindAllString(rendered, -1)
	if len(named) < 3 {
		t.Fatalf("the packaged chart names Lifeline's images in %s %d times: %q", repository, len(named), named)
	}
	for _, ref := range named {
		image := strings.SplitN(strings.TrimPrefix(ref, repository+"/"), ":", 2)[0]
		if ref != want[image] {
			t.Errorf("the packaged chart names %s, want %s", ref, want[image])
		}
	}
}

// imagesTool is this package's command, built once for the tests that run it as make release does.
func imagesTool(t *testing.T) string {
	t.Helper()
	file, err := buildImagesTool()
	if err != nil {
		t.Fatalf("go build lifeline-images: %v", err)
	}
	return file
}

var buildImagesTool = sync.OnceValues(func() (string, error) {
	file := filepath.Join(binDir, "lifeline-images")
	if b, err := exec.Command("go", "build", "-o", file, ".").CombinedOutput(); err != nil {
		return "", fmt.Errorf("%w\n%s", err, b)
	}
	return file, nil
})

// indexDigest is the digest of the index or manifest an OCI archive's index.json names.
func indexDigest(t *testing.T, archive string) string {
	t.Helper()
	var index struct{ Manifests []struct{ Digest string } }
	if err := json.Unmarshal(tarEntries(t, archive)["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json of %s: %v (%d manifests)", archive, err, len(index.Manifests))
	}
	return index.Manifests[0].Digest
}

func fileSHA256(t *testing.T, file string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// pluginBinary is the kubectl-lifeline a plugin archive holds.
func pluginBinary(t *testing.T, archive string) []byte {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	for {
		hdr, err := tr.Next()
		if err != nil {
			t.Fatalf("%s holds no kubectl-lifeline: %v", archive, err)
		}
		if hdr.Name == "kubectl-lifeline" {
			bin, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return bin
		}
	}
}
