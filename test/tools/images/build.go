package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// imageSpec is one of Lifeline's images: a command of cmd/ and the user its container runs as.
type imageSpec struct {
	// Name is the command's name, its image's name in the repository and its archive's name.
	Name string
	// User is the numeric uid:gid of the container's process. It is numeric so the kubelet can enforce
	// runAsNonRoot without a passwd lookup.
	User string
	// Reference, when set, is the image's whole name instead of <repository>/<Name>:<tag>: the sample
	// images stand in for images of other projects, under their names.
	Reference string
	// Binary is the command the image runs, when it is not Name.
	Binary string
	// Args follow the command in the image's entrypoint, where a pod's args cannot replace them: the sample
	// worker's pause mode.
	Args []string
	// Env is the image's environment, e.g. the sample worker's role.
	Env []string
}

// binary is the command of <bin-dir>/<os>_<arch> the image holds and runs.
func (s imageSpec) binary() string {
	if s.Binary != "" {
		return s.Binary
	}
	return s.Name
}

// lifelineImages are the images make images writes.
var lifelineImages = []imageSpec{
	{Name: "lifeline-controller", User: nonrootUID + ":" + nonrootUID},
	// The agent reads the CRI socket, its state directory and edged's static-pod directory, all owned by root
	// (owner permissions suffice, no capability is needed); its DaemonSet runs it as root with every capability
	// dropped, no privilege escalation and a read-only root.
	{Name: "lifeline-agent", User: "0:0"},
}

// sampleImages are what make images-samples writes for real nodes, which have no registry, all of them the sample
// worker: the pod sandbox's image runs its pause mode, and each name deploy/examples give Sedna's worker images
// runs the role in the image's environment (the examples' own args, such as the transmitter's "-i 1", are left to
// it to ignore).
var sampleImages = append([]imageSpec{
	{Name: "pause", Reference: "registry.k8s.io/pause:3.10", Binary: sampleWorkerBinary, Args: []string{"pause"},
		User: "65535:65535"},
}, sampleWorkerImages(map[string][]string{
	"ji-little": {"joint-inference-helmet-detection-little:v0.3.0", "joint-inference-helmet-detection-little:v0.5.0",
		"joint-inference-answer-generation-little:v0.8.0"},
	"ji-big": {"joint-inference-helmet-detection-big:v0.3.0", "joint-inference-helmet-detection-big:v0.5.0",
		"joint-inference-answer-generation-big:v0.8.0"},
	"fl-aggregator": {"federated-learning-surface-defect-detection-aggregation:v0.3.0",
		"federated-learning-mistnet-yolo-aggregator:v0.4.0"},
	"fl-trainer": {"federated-learning-surface-defect-detection-train:v0.3.0",
		"federated-learning-mistnet-yolo-client:v0.4.0"},
})...)

// sampleWorkerImages names the sample worker kubeedge/sedna-example-<name> for each role's names, in a stable order.
func sampleWorkerImages(byRole map[string][]string) []imageSpec {
	var out []imageSpec
	for _, role := range []string{"ji-little", "ji-big", "fl-aggregator", "fl-trainer"} {
		for _, name := range byRole[role] {
			out = append(out, imageSpec{
				Name:      "sedna-example-" + strings.ReplaceAll(name, ":", "-"),
				Reference: "kubeedge/sedna-example-" + name,
				Binary:    sampleWorkerBinary,
				User:      nonrootUID + ":" + nonrootUID,
				Env:       []string{sampleRoleEnv + "=" + role},
			})
		}
	}
	return out
}

// sampleWorkerBinary is test/workers' command, which every sample image runs.
const sampleWorkerBinary = "lifeline-sampleworker"

// sampleRoleEnv names the sample worker's role in its image (test/workers reads it).
const sampleRoleEnv = "LIFELINE_SAMPLE_ROLE"

// nonrootUID is the unprivileged user of the images' /etc/passwd (distroless' "nonroot").
const nonrootUID = "65532"

// binaryDir is where, inside an image, the command lives.
const binaryDir = "usr/local/bin"

// buildOptions is what every image of one make images run shares.
type buildOptions struct {
	// Repository prefixes each image's name: <Repository>/<Name>:<Tag>.
	Repository string
	Tag        string
	// Version and Revision are the version stamped into the binaries and the commit they are built from.
	Version  string
	Revision string
	// Source is the project's repository URL (org.opencontainers.image.source); empty leaves it out.
	Source string
	// Created is every timestamp the images hold: the config's, the history's and every file's.
	Created time.Time
	// Platforms are the images' platforms, in the order the index lists them.
	Platforms []v1.Platform
	// BinDir holds the binaries, one directory per platform: <BinDir>/<os>_<arch>/<Name>.
	BinDir string
}

// reference is the image's name as a person or a manifest writes it (lifeline/lifeline-controller:dev).
func (o buildOptions) reference(spec imageSpec) string {
	if spec.Reference != "" {
		return spec.Reference
	}
	return strings.TrimSuffix(o.Repository, "/") + "/" + spec.Name + ":" + o.Tag
}

// annotations are the OCI annotations (and config labels) that say where an image comes from.
func (o buildOptions) annotations(spec imageSpec) map[string]string {
	a := map[string]string{
		"org.opencontainers.image.title":   spec.Name,
		"org.opencontainers.image.version": o.Version,
		"org.opencontainers.image.created": o.Created.UTC().Format(time.RFC3339),
	}
	if o.Revision != "" {
		a["org.opencontainers.image.revision"] = o.Revision
	}
	if o.Source != "" {
		a["org.opencontainers.image.source"] = o.Source
	}
	return a
}

// buildIndex assembles the multi-platform image of spec from its binaries.
func buildIndex(spec imageSpec, opts buildOptions) (v1.ImageIndex, error) {
	base, err := baseLayer(opts.Created)
	if err != nil {
		return nil, fmt.Errorf("building the base layer: %w", err)
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range opts.Platforms {
		img, err := buildImage(spec, opts, p, base)
		if err != nil {
			return nil, fmt.Errorf("building %s for %s: %w", spec.Name, p, err)
		}
		platform := p
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: image{img}, Descriptor: v1.Descriptor{Platform: &platform}})
	}
	return mutate.Annotations(idx, opts.annotations(spec)).(v1.ImageIndex), nil
}

// buildImage assembles spec's image for one platform: the base layer, then a layer with the binary.
func buildImage(spec imageSpec, opts buildOptions, p v1.Platform, base v1.Layer) (v1.Image, error) {
	binPath := filepath.Join(opts.BinDir, p.OS+"_"+p.Architecture, spec.binary())
	bin, err := os.ReadFile(binPath)
	if err != nil {
		return nil, fmt.Errorf("reading the binary: %w", err)
	}
	if err := checkBinary(bin, p); err != nil {
		return nil, fmt.Errorf("checking %s: %w", binPath, err)
	}
	app, err := layer(opts.Created, []file{
		{Name: "usr/", Mode: 0o755},
		{Name: "usr/local/", Mode: 0o755},
		{Name: binaryDir + "/", Mode: 0o755},
		{Name: path.Join(binaryDir, spec.binary()), Mode: 0o755, Data: bin},
	})
	if err != nil {
		return nil, fmt.Errorf("building the binary's layer: %w", err)
	}
	created := v1.Time{Time: opts.Created}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, MediaType: types.OCILayer,
			History: v1.History{Created: created, CreatedBy: "lifeline-images: /etc/passwd and /etc/group (root, nonroot " + nonrootUID + ")"}},
		mutate.Addendum{Layer: app, MediaType: types.OCILayer,
			History: v1.History{Created: created, CreatedBy: "lifeline-images: /" + path.Join(binaryDir, spec.binary())}},
	)
	if err != nil {
		return nil, fmt.Errorf("appending the layers: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the config: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture, cfg.Variant = p.OS, p.Architecture, p.Variant
	cfg.Created = created
	cfg.Config = v1.Config{
		User:       spec.User,
		Entrypoint: append([]string{"/" + path.Join(binaryDir, spec.binary())}, spec.Args...),
		Env:        spec.Env,
		WorkingDir: "/",
		Labels:     opts.annotations(spec),
	}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return nil, fmt.Errorf("writing the config: %w", err)
	}
	return mutate.Annotations(img, opts.annotations(spec)).(v1.Image), nil
}

// image is an image the index describes as one: without the artifactType go-containerregistry derives from the
// config's media type, which marks an artifact, not an image, in an index (as buildx and containerd write them).
type image struct{ v1.Image }

// ArtifactType is empty: an image is no artifact.
func (image) ArtifactType() (string, error) { return "", nil }

// elfMachines are the ELF machines of the architectures Lifeline is built for.
var elfMachines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// checkBinary refuses a binary that would not run in the image: one of another architecture, or one that needs
// a dynamic loader and libraries the image does not have.
func checkBinary(bin []byte, p v1.Platform) error {
	want, ok := elfMachines[p.Architecture]
	if p.OS != "linux" || !ok {
		return fmt.Errorf("platform %s is not supported", p)
	}
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return fmt.Errorf("reading the ELF header: %w", err)
	}
	defer f.Close()
	if f.Machine != want {
		return fmt.Errorf("the binary is for %s, not %s", f.Machine, p.Architecture)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("the binary is dynamically linked (build it with CGO_ENABLED=0)")
		}
	}
	return nil
}

// baseLayer holds what the images have besides their binary: the users and groups the containers may run as.
func baseLayer(created time.Time) (v1.Layer, error) {
	return layer(created, []file{
		{Name: "etc/", Mode: 0o755},
		{Name: "etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnonroot:x:" + nonrootUID + ":\n")},
		{Name: "etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/sbin/nologin\n" +
			"nonroot:x:" + nonrootUID + ":" + nonrootUID + ":nonroot:/home/nonroot:/sbin/nologin\n")},
	})
}

// file is one entry of a layer; a name ending in / is a directory.
type file struct {
	Name string
	Mode int64
	Data []byte
}

// layer writes files, in order, into a gzipped tar layer whose every entry is root's and dated created, so
// the same files always give the same digest.
func layer(created time.Time, files []file) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		hdr := &tar.Header{Name: f.Name, Mode: f.Mode, ModTime: created, Format: tar.FormatPAX}
		if strings.HasSuffix(f.Name, "/") {
			hdr.Typeflag = tar.TypeDir
		} else {
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(f.Data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("writing %s: %w", f.Name, err)
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, fmt.Errorf("writing %s: %w", f.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("closing the layer: %w", err)
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.DefaultCompression),
		tarball.WithCompressedCaching)
}
