package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"flag"
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
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// What the test stamps into the binaries and the images.
const (
	testVersion  = "1.2.3-test"
	testRevision = "0123456789abcdef0123456789abcdef01234567"
	testEpoch    = 1700000000
	testSource   = "https://example.com/lifeline"
)

var (
	// binDir holds the binaries cross-compiled once for the whole test: <binDir>/linux_<arch>/<command>.
	binDir string
	// builds are the output directories of two builds from those binaries.
	builds [2]string
	// layouts are the first build's archives unpacked, by image name.
	layouts = map[string]string{}
	created = time.Unix(testEpoch, 0).UTC()
)

var testPlatforms = []v1.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64"}}

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "lifeline-images-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	if err := setUp(tmp); err != nil {
		fmt.Fprintln(os.Stderr, "setting up:", err)
		return 1
	}
	return m.Run()
}

// setUp compiles the commands for the host as make images does, builds the images twice and unpacks the first
// build.
func setUp(tmp string) error {
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		return err
	}
	binDir = filepath.Join(tmp, "bin")
	for _, p := range testPlatforms {
		if err := buildCommands(root, p); err != nil {
			return err
		}
	}
	for i := range builds {
		builds[i] = filepath.Join(tmp, fmt.Sprintf("images-%d", i))
		if err := run(lifelineImages, testOptions(), builds[i], "linux/amd64,linux/arm64", fmt.Sprint(testEpoch), io.Discard); err != nil {
			return fmt.Errorf("build %d: %w", i, err)
		}
	}
	for _, spec := range lifelineImages {
		dir := filepath.Join(tmp, "layout", spec.Name)
		if err := unpack(filepath.Join(builds[0], spec.Name+".tar"), dir); err != nil {
			return fmt.Errorf("unpacking %s: %w", spec.Name, err)
		}
		layouts[spec.Name] = dir
	}
	return nil
}

// buildCommands writes the controller and the agent for platform p into binDir with make images' flags. For a
// platform other than the host's, both are the small static sample worker instead: the builder's handling of a
// foreign architecture is the same whatever the binary, and a cold cross-compilation of the commands would cost CI
// minutes to check only that Go cross-compiles.
func buildCommands(root string, p v1.Platform) error {
	out := filepath.Join(binDir, p.OS+"_"+p.Architecture)
	env := append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture)
	ldflags := "-s -w -X main.version=" + testVersion + " -X main.revision=" + testRevision
	steps := [][]string{{"-o", out + string(filepath.Separator), "./cmd/lifeline-controller", "./cmd/lifeline-agent"}}
	if p.OS != runtime.GOOS || p.Architecture != runtime.GOARCH {
		steps = [][]string{
			{"-o", filepath.Join(out, "lifeline-controller"), "./test/workers"},
			{"-o", filepath.Join(out, "lifeline-agent"), "./test/workers"},
		}
	}
	for _, args := range steps {
		cmd := exec.Command("go", append([]string{"build", "-trimpath", "-ldflags", ldflags}, args...)...)
		cmd.Dir, cmd.Env = root, env
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building %s for %s: %v\n%s", args[len(args)-1], p, err, b)
		}
	}
	return nil
}

func testOptions() buildOptions {
	return buildOptions{Repository: "lifeline", Tag: "dev", Version: testVersion, Revision: testRevision,
		Source: testSource, BinDir: binDir}
}

// wantUsers are the users the images' containers run as.
var wantUsers = map[string]string{"lifeline-controller": "65532:65532", "lifeline-agent": "0:0"}

func TestEachPlatformHoldsItsStaticBinaryAndRunsAsItsUser(t *testing.T) {
	for name, user := range wantUsers {
		idx, err := layout.ImageIndexFromPath(layouts[name])
		if err != nil {
			t.Fatalf("%s: opening the layout: %v", name, err)
		}
		im, err := idx.IndexManifest()
		if err != nil || len(im.Manifests) != 1 {
			t.Fatalf("%s: index.json must name one index, got %+v (%v)", name, im, err)
		}
		images, err := idx.ImageIndex(im.Manifests[0].Digest)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		children, err := images.IndexManifest()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got, want := children.Annotations["org.opencontainers.image.revision"], testRevision; got != want {
			t.Errorf("%s: the index's revision is %q, want %q", name, got, want)
		}
		if len(children.Manifests) != len(testPlatforms) {
			t.Fatalf("%s: %d platforms, want %d", name, len(children.Manifests), len(testPlatforms))
		}
		for i, p := range testPlatforms {
			t.Run(name+"/"+p.Architecture, func(t *testing.T) {
				desc := children.Manifests[i]
				if desc.Platform == nil || desc.Platform.OS != p.OS || desc.Platform.Architecture != p.Architecture {
					t.Fatalf("manifest %d is for %v, want %v", i, desc.Platform, p)
				}
				img, err := images.Image(desc.Digest)
				if err != nil {
					t.Fatal(err)
				}
				cfg, err := img.ConfigFile()
				if err != nil {
					t.Fatal(err)
				}
				if cfg.OS != p.OS || cfg.Architecture != p.Architecture {
					t.Errorf("config is for %s/%s, want %s", cfg.OS, cfg.Architecture, p)
				}
				entrypoint := "/usr/local/bin/" + name
				if cfg.Config.User != user || len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != entrypoint {
					t.Errorf("user %q, entrypoint %q; want %q, [%s]", cfg.Config.User, cfg.Config.Entrypoint, user, entrypoint)
				}
				for k, want := range map[string]string{"org.opencontainers.image.version": testVersion,
					"org.opencontainers.image.revision": testRevision, "org.opencontainers.image.source": testSource} {
					if got := cfg.Config.Labels[k]; got != want {
						t.Errorf("label %s is %q, want %q", k, got, want)
					}
				}
				if !cfg.Created.Equal(created) {
					t.Errorf("created %s, want %s", cfg.Created, created)
				}

				files := filesOf(t, img)
				if passwd := string(files["etc/passwd"].data); !strings.Contains(passwd, "\nnonroot:x:65532:65532:") {
					t.Errorf("/etc/passwd has no nonroot user 65532:\n%s", passwd)
				}
				if group := string(files["etc/group"].data); !strings.Contains(group, "\nnonroot:x:65532:") {
					t.Errorf("/etc/group has no nonroot group 65532:\n%s", group)
				}
				bin, ok := files[strings.TrimPrefix(entrypoint, "/")]
				if !ok {
					t.Fatalf("no %s in the layers", entrypoint)
				}
				if bin.hdr.Mode != 0o755 {
					t.Errorf("%s has mode %o, want 755", entrypoint, bin.hdr.Mode)
				}
				machine, dynamic := elfInfo(t, bin.data)
				if want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[p.Architecture]; machine != want {
					t.Errorf("%s is for %s, want %s", entrypoint, machine, want)
				}
				if dynamic {
					t.Errorf("%s needs a dynamic loader", entrypoint)
				}
				for n, f := range files {
					if !f.hdr.ModTime.Equal(created) || f.hdr.Uid != 0 || f.hdr.Gid != 0 {
						t.Errorf("%s: dated %s, owned by %d:%d; want %s, 0:0", n, f.hdr.ModTime, f.hdr.Uid, f.hdr.Gid, created)
					}
				}
			})
		}
	}
}

func TestTwoBuildsWriteTheSameArchives(t *testing.T) {
	for _, spec := range lifelineImages {
		var sums [2]string
		for i, dir := range builds {
			data, err := os.ReadFile(filepath.Join(dir, spec.Name+".tar"))
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(data)
			sums[i] = hex.EncodeToString(sum[:])
		}
		if sums[0] != sums[1] {
			t.Errorf("%s: two builds of the same binaries differ: sha256 %s and %s", spec.Name, sums[0], sums[1])
		}
		idx, err := layout.ImageIndexFromPath(layouts[spec.Name])
		if err != nil {
			t.Fatal(err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: index %s, archive sha256 %s", spec.Name, im.Manifests[0].Digest, sums[0])
	}
}

func TestTheHostsBinaryFromItsLayerRuns(t *testing.T) {
	if runtime.GOOS != "linux" || elfMachines[runtime.GOARCH] == 0 {
		t.Skipf("no image runs on %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	for _, spec := range lifelineImages {
		idx, err := layout.ImageIndexFromPath(layouts[spec.Name])
		if err != nil {
			t.Fatal(err)
		}
		im, _ := idx.IndexManifest()
		images, err := idx.ImageIndex(im.Manifests[0].Digest)
		if err != nil {
			t.Fatal(err)
		}
		children, _ := images.IndexManifest()
		var img v1.Image
		for _, desc := range children.Manifests {
			if desc.Platform.Architecture == runtime.GOARCH {
				img, err = images.Image(desc.Digest)
			}
		}
		if img == nil || err != nil {
			t.Fatalf("%s: no image for %s (%v)", spec.Name, runtime.GOARCH, err)
		}
		bin := filepath.Join(t.TempDir(), spec.Name)
		if err := os.WriteFile(bin, filesOf(t, img)["usr/local/bin/"+spec.Name].data, 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, "--version").CombinedOutput()
		if err != nil {
			t.Fatalf("%s --version: %v\n%s", spec.Name, err, out)
		}
		if got, want := strings.TrimSpace(string(out)), spec.Name+" "+testVersion+" (revision "+testRevision+")"; got != want {
			t.Errorf("%s --version printed %q, want %q", spec.Name, got, want)
		}
	}
}

// TestDockerAndContainerdFindTheName reads the archives as containerd's importer and Docker's classic store do.
func TestDockerAndContainerdFindTheName(t *testing.T) {
	for _, spec := range lifelineImages {
		t.Run(spec.Name, func(t *testing.T) {
			entries := tarEntries(t, filepath.Join(builds[0], spec.Name+".tar"))
			var ociLayout struct{ ImageLayoutVersion string }
			if err := json.Unmarshal(entries["oci-layout"], &ociLayout); err != nil || ociLayout.ImageLayoutVersion != "1.0.0" {
				t.Errorf("oci-layout: %s (%v)", entries["oci-layout"], err)
			}

			// containerd (ctr images import, kind load image-archive, Docker's containerd store) names the
			// image after io.containerd.image.name, which must be the name the kubelet pulls.
			var index v1.IndexManifest
			if err := json.Unmarshal(entries["index.json"], &index); err != nil || len(index.Manifests) != 1 {
				t.Fatalf("index.json: %s (%v)", entries["index.json"], err)
			}
			anns := index.Manifests[0].Annotations
			if got, want := anns["io.containerd.image.name"], "docker.io/lifeline/"+spec.Name+":dev"; got != want {
				t.Errorf("io.containerd.image.name is %q, want %q", got, want)
			}
			if got := anns["org.opencontainers.image.ref.name"]; got != "dev" {
				t.Errorf("org.opencontainers.image.ref.name is %q, want the tag, dev", got)
			}
			for name, data := range entries {
				if hexDigest, ok := strings.CutPrefix(name, "blobs/sha256/"); ok && hexDigest != "" {
					if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != hexDigest {
						t.Errorf("blob %s holds content of digest %x", name, sum)
					}
				}
			}

			// Docker's classic store reads manifest.json only, and keeps the tag on the last entry it loads.
			var docker []dockerManifest
			if err := json.Unmarshal(entries["manifest.json"], &docker); err != nil || len(docker) != len(testPlatforms) {
				t.Fatalf("manifest.json: %s (%v)", entries["manifest.json"], err)
			}
			for i, m := range docker {
				if len(m.RepoTags) != 1 || m.RepoTags[0] != "lifeline/"+spec.Name+":dev" {
					t.Errorf("entry %d is tagged %q, want lifeline/%s:dev", i, m.RepoTags, spec.Name)
				}
				var cfg v1.ConfigFile
				if err := json.Unmarshal(entries[m.Config], &cfg); err != nil {
					t.Fatalf("entry %d: config %s: %v", i, m.Config, err)
				}
				if len(cfg.RootFS.DiffIDs) != len(m.Layers) {
					t.Errorf("entry %d: %d layers for %d diff ids", i, len(m.Layers), len(cfg.RootFS.DiffIDs))
				}
				for _, l := range m.Layers {
					if _, ok := entries[l]; !ok {
						t.Errorf("entry %d: no layer %s in the archive", i, l)
					}
				}
				if i == len(docker)-1 && cfg.Architecture != testPlatforms[0].Architecture {
					t.Errorf("the last entry, which keeps the tag, is for %s, want %s", cfg.Architecture, testPlatforms[0].Architecture)
				}
			}
		})
	}
}

// What make images builds by default is what the plain manifests (the chart rendered) run, and nothing else.
func TestDeployManifestsNameTheImagesByDefault(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "..", "deploy", "manifests", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in deploy/manifests (%v)", err)
	}
	named := map[string]string{}
	image := regexp.MustCompile(`(?m)^\s*(?:-\s*)?image:[ \t]*["']?([^"'\s]+)`)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range image.FindAllStringSubmatch(string(data), -1) {
			named[m[1]] = f
		}
	}
	chart, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "chart", "lifeline", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	appVersion := regexp.MustCompile(`(?m)^appVersion:\s*"?([^"\s]+)`).FindSubmatch(chart)
	if appVersion == nil {
		t.Fatal("Chart.yaml has no appVersion")
	}
	// make images tags the images with the chart's appVersion, which the chart and the plain manifests run.
	opts := buildOptions{Repository: defaultRepository, Tag: string(appVersion[1])}
	for _, spec := range lifelineImages {
		ref := opts.reference(spec)
		if _, ok := named[ref]; !ok {
			t.Errorf("no manifest in deploy/ runs %s, the image make images names by default", ref)
		}
		delete(named, ref)
	}
	for ref, f := range named {
		t.Errorf("%s runs %s, which make images does not build", f, ref)
	}
}

// Every image deploy/examples run has a sample image of that name, running the sample worker in the role the
// image's name says, so the examples apply unchanged to real nodes without a registry.
func TestSampleImagesStandForEveryExampleImage(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "..", "deploy", "examples", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples in deploy/examples (%v)", err)
	}
	samples := map[string]imageSpec{}
	for _, spec := range sampleImages {
		samples[spec.Reference] = spec
	}
	image := regexp.MustCompile(`(?m)^\s*(?:-\s*)?image:[ \t]*["']?([^"'\s]+)`)
	roles := map[string]string{"-little:": "ji-little", "-big:": "ji-big", "-aggregat": "fl-aggregator", "-train:": "fl-trainer",
		"-client:": "fl-trainer"}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range image.FindAllStringSubmatch(string(data), -1) {
			spec, ok := samples[m[1]]
			if !ok {
				t.Errorf("%s runs %s, which has no sample image", f, m[1])
				continue
			}
			want := ""
			for part, role := range roles {
				if strings.Contains(m[1], part) {
					want = role
				}
			}
			if spec.Binary != "lifeline-sampleworker" || len(spec.Env) != 1 || spec.Env[0] != sampleRoleEnv+"="+want {
				t.Errorf("%s: the sample image runs %s with %v, want the sample worker as %s", m[1], spec.Binary, spec.Env, want)
			}
		}
	}
	if pause, ok := samples["registry.k8s.io/pause:3.10"]; !ok || pause.Binary != "lifeline-sampleworker" ||
		!slices.Equal(pause.Args, []string{"pause"}) {
		t.Errorf("pod sandbox image %+v: want the sample worker in its pause mode", pause)
	}
}

func TestRefusesABinaryThatWouldNotRun(t *testing.T) {
	hostTrue, err := exec.LookPath("true")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, binary, platform, want string
	}{
		{"another architecture", filepath.Join(binDir, "linux_amd64", "lifeline-agent"), "arm64", "not arm64"},
		{"dynamically linked", hostTrue, "amd64", "dynamically linked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			data, err := os.ReadFile(tc.binary)
			if err != nil {
				t.Fatal(err)
			}
			if tc.platform == "amd64" && !bytes.Equal(data[18:20], []byte{0x3e, 0}) {
				t.Skipf("%s is not an x86-64 binary", tc.binary)
			}
			for _, spec := range lifelineImages {
				p := filepath.Join(dir, "linux_"+tc.platform, spec.Name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, data, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			opts := testOptions()
			opts.BinDir = dir
			out := t.TempDir()
			err = run(lifelineImages, opts, out, "linux/"+tc.platform, "0", io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("building from %s as linux/%s: %v, want an error saying %q", tc.binary, tc.platform, err, tc.want)
			}
			if left, _ := os.ReadDir(out); len(left) != 0 {
				t.Errorf("a failed build left %d files in %s", len(left), out)
			}
		})
	}
}

func TestNormalizeReference(t *testing.T) {
	for _, tc := range []struct{ ref, want, familiar string }{
		{"lifeline/lifeline-agent:dev", "docker.io/lifeline/lifeline-agent:dev", "lifeline/lifeline-agent:dev"},
		{"busybox:1", "docker.io/library/busybox:1", "busybox:1"},
		{"ghcr.io/acme/lifeline-agent:v1", "ghcr.io/acme/lifeline-agent:v1", "ghcr.io/acme/lifeline-agent:v1"},
		{"localhost:5000/lifeline-agent:v1", "localhost:5000/lifeline-agent:v1", "localhost:5000/lifeline-agent:v1"},
		{"localhost/lifeline-agent:v1", "localhost/lifeline-agent:v1", "localhost/lifeline-agent:v1"},
		{"lifeline/lifeline-agent", "", ""},
		{"localhost:5000/lifeline-agent", "", ""},
		{"Lifeline/agent:dev", "", ""},
		{"lifeline/agent:", "", ""},
	} {
		got, err := normalizeReference(tc.ref)
		if (err != nil) != (tc.want == "") || got != tc.want {
			t.Errorf("normalizeReference(%q) = %q, %v; want %q", tc.ref, got, err, tc.want)
		}
		if tc.want != "" && familiar(got) != tc.familiar {
			t.Errorf("familiar(%q) = %q, want %q", got, familiar(got), tc.familiar)
		}
	}
}

type layerFile struct {
	hdr  *tar.Header
	data []byte
}

// filesOf reads every file of an image's layers, the last layer's winning.
func filesOf(t *testing.T, img v1.Image) map[string]layerFile {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]layerFile{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			hdr, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[hdr.Name] = layerFile{hdr: hdr, data: data}
		}
		rc.Close()
	}
	return files
}

// elfInfo returns a binary's machine and whether it asks for a dynamic loader.
func elfInfo(t *testing.T, data []byte) (elf.Machine, bool) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("reading the ELF header: %v", err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return f.Machine, true
		}
	}
	return f.Machine, false
}

// tarEntries reads an archive's regular files by name.
func tarEntries(t *testing.T, file string) map[string][]byte {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	entries := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return entries
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if entries[hdr.Name], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestParsePlatformsAndEpoch(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []v1.Platform
	}{
		{"linux/amd64,linux/arm64", testPlatforms},
		{" linux/arm64 ", []v1.Platform{{OS: "linux", Architecture: "arm64"}}},
		{"linux", nil},
		{"linux/amd64,", nil},
	} {
		got, err := parsePlatforms(tc.in)
		if (err != nil) != (tc.want == nil) || len(got) != len(tc.want) {
			t.Errorf("parsePlatforms(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			continue
		}
		for i := range got {
			if got[i].OS != tc.want[i].OS || got[i].Architecture != tc.want[i].Architecture {
				t.Errorf("parsePlatforms(%q)[%d] = %v, want %v", tc.in, i, got[i], tc.want[i])
			}
		}
	}
	for _, tc := range []struct {
		in   string
		want time.Time
		ok   bool
	}{
		{"", time.Unix(0, 0), true},
		{"1700000000", time.Unix(1700000000, 0), true},
		{"-1", time.Time{}, false},
		{"yesterday", time.Time{}, false},
	} {
		got, err := parseEpoch(tc.in)
		if (err == nil) != tc.ok || !got.Equal(tc.want) {
			t.Errorf("parseEpoch(%q) = %s, %v; want %s (ok %t)", tc.in, got, err, tc.want, tc.ok)
		}
	}
}
