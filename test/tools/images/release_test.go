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
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// make release's assembly (test/tools/release.sh) from the images this package built: both image archives, the
// chart packaged at the release's version with both images pinned to the digests the archives hold (in every
// place the chart names them: the controller, the agent and the stand-ins' gate), the plugin
// archive with its krew manifest naming its checksum, and SHA256SUMS over all of it. The plugin is built for this
// machine's platform only: for the others it is the same Go cross-compilation the images' commands get.
func TestReleasePinsTheChartToTheImagesAndChecksEverything(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	helm := filepath.Join(root, "bin", "helm")
	if _, err := os.Stat(helm); err != nil {
		t.Skipf("no helm in bin/ (make tools builds it): %v", err)
	}
	const version = "1.2.3"
	out := filepath.Join(t.TempDir(), "release")
	cmd := exec.Command(filepath.Join(root, "test", "tools", "release.sh"), version, builds[0], out, helm, "go",
		"https://example.com/download/v1.2.3", fmt.Sprint(testEpoch))
	cmd.Env = append(os.Environ(), "PLUGIN_PLATFORMS="+runtime.GOOS+"/"+runtime.GOARCH)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("release.sh: %v\n%s", err, b)
	}

	want := map[string]string{} // image name -> name:tag@digest, as the chart must name it
	for _, spec := range lifelineImages {
		archive := filepath.Join(out, "images", spec.Name+"-"+version+".tar")
		digest := indexDigest(t, archive)
		if written, _ := os.ReadFile(filepath.Join(builds[0], spec.Name+".digest")); strings.TrimSpace(string(written)) != digest {
			t.Errorf("%s.digest says %q, its archive's index is %s", spec.Name, written, digest)
		}
		want[spec.Name] = "lifeline/" + spec.Name + ":" + version + "@" + digest
	}

	rendered, err := exec.Command(helm, "template", "lifeline", filepath.Join(out, "lifeline-"+version+".tgz"),
		"--set", "broker.advertiseAddress={192.0.2.1}", "--set-string", "nodeIdentity.kubeedgeCA=ca",
	).CombinedOutput()
	if err != nil {
		t.Fatalf("helm template of the packaged chart: %v\n%s", err, rendered)
	}
	named := regexp.MustCompile(`lifeline/lifeline-(controller|agent)[^\s"']*`).FindAllString(string(rendered), -1)
	if len(named) < 3 {
		t.Fatalf("the packaged chart names Lifeline's images %d times: %q", len(named), named)
	}
	for _, ref := range named {
		name := strings.TrimPrefix(strings.SplitN(ref, ":", 2)[0], "lifeline/")
		if ref != want[name] {
			t.Errorf("the packaged chart names %s, want %s", ref, want[name])
		}
	}

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

// indexDigest is the digest of the image index an OCI archive's index.json names.
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
