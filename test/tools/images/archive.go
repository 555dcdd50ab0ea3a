package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The annotations of index.json through which loaders name what they import.
const (
	// annotationImageName is containerd's: the full, normalized name. containerd's importer (ctr images import,
	// kind load image-archive) and Docker's containerd image store name an imported image after it.
	annotationImageName = "io.containerd.image.name"
	// annotationRefName is the OCI image layout's: the tag only, as Docker and containerd write it, which
	// skopeo's oci-archive:<file>:<tag> selects by.
	annotationRefName = "org.opencontainers.image.ref.name"
)

// dockerManifest is one entry of manifest.json, the file through which Docker's classic image store loads an
// archive: it reads neither index.json nor oci-layout.
type dockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// blob is one file of blobs/sha256/.
type blob struct {
	digest v1.Hash
	size   int64
	open   func() (io.ReadCloser, error)
}

// writeArchive writes idx, named ref, as an OCI image layout in a tar (writeLayout): index.json names the index
// through both annotations, and Docker's manifest.json lists its images.
//
// manifest.json lists every platform under the tag, the first of the index last: Docker's classic store loads
// them all and keeps the tag on the last one loaded, unless docker load --platform picks one.
func writeArchive(w io.Writer, idx v1.ImageIndex, ref string, created time.Time) error {
	normalized, err := normalizeReference(ref)
	if err != nil {
		return err
	}
	tag := normalized[strings.LastIndex(normalized, ":")+1:]
	blobs := map[v1.Hash]blob{}
	add := func(b blob) { blobs[b.digest] = b }

	rawIndex, err := idx.RawManifest()
	if err != nil {
		return fmt.Errorf("reading the index: %w", err)
	}
	indexBlob := rawBlob(rawIndex)
	add(indexBlob)
	im, err := idx.IndexManifest()
	if err != nil {
		return fmt.Errorf("reading the index: %w", err)
	}
	var docker []dockerManifest
	for _, desc := range im.Manifests {
		img, err := idx.Image(desc.Digest)
		if err != nil {
			return fmt.Errorf("reading the image of %s: %w", desc.Platform, err)
		}
		entry, err := addImage(img, add)
		if err != nil {
			return fmt.Errorf("reading the image of %s: %w", desc.Platform, err)
		}
		entry.RepoTags = []string{familiar(normalized)}
		docker = append([]dockerManifest{entry}, docker...)
	}

	dockerJSON, err := json.Marshal(docker)
	if err != nil {
		return fmt.Errorf("encoding manifest.json: %w", err)
	}
	top := v1.Descriptor{
		MediaType: types.OCIImageIndex, Digest: indexBlob.digest, Size: indexBlob.size,
		Annotations: map[string]string{annotationImageName: normalized, annotationRefName: tag},
	}
	return writeLayout(w, top, blobs, created, layoutFile{"manifest.json", dockerJSON})
}

// writeArtifactLayout writes img, an artifact rather than a runnable image, as an OCI image layout in a tar: its
// manifest named by tag in index.json, and its blobs.
func writeArtifactLayout(w io.Writer, img v1.Image, tag string, created time.Time) error {
	blobs := map[v1.Hash]blob{}
	add := func(b blob) { blobs[b.digest] = b }
	if _, err := addImage(img, add); err != nil {
		return err
	}
	top, err := partial.Descriptor(img)
	if err != nil {
		return fmt.Errorf("the artifact's descriptor: %w", err)
	}
	top.Annotations = map[string]string{annotationRefName: tag}
	return writeLayout(w, *top, blobs, created)
}

// layoutFile is a file of an OCI image layout's tar besides its blobs.
type layoutFile struct {
	name string
	data []byte
}

// writeLayout writes an OCI image layout in a tar: oci-layout, index.json naming top, the extra files and every
// blob. Entries are sorted and dated created, so the same content always gives the same bytes.
func writeLayout(w io.Writer, top v1.Descriptor, blobs map[v1.Hash]blob, created time.Time, extra ...layoutFile) error {
	ociIndex, err := json.Marshal(v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex, Manifests: []v1.Descriptor{top}})
	if err != nil {
		return fmt.Errorf("encoding index.json: %w", err)
	}
	tw := tar.NewWriter(w)
	header := func(name string, size int64) *tar.Header {
		hdr := &tar.Header{Name: name, Mode: 0o644, Size: size, ModTime: created, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if strings.HasSuffix(name, "/") {
			hdr.Mode, hdr.Typeflag = 0o755, tar.TypeDir
		}
		return hdr
	}
	files := append([]layoutFile{{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)}, {"index.json", ociIndex}}, extra...)
	files = append(files, layoutFile{"blobs/", nil}, layoutFile{"blobs/sha256/", nil})
	for _, f := range files {
		if err := tw.WriteHeader(header(f.name, int64(len(f.data)))); err != nil {
			return fmt.Errorf("writing %s: %w", f.name, err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return fmt.Errorf("writing %s: %w", f.name, err)
		}
	}
	digests := make([]v1.Hash, 0, len(blobs))
	for h := range blobs {
		digests = append(digests, h)
	}
	slices.SortFunc(digests, func(a, b v1.Hash) int { return strings.Compare(a.Hex, b.Hex) })
	for _, h := range digests {
		if err := writeBlob(tw, header(blobPath(h), blobs[h].size), blobs[h]); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("closing the archive: %w", err)
	}
	return nil
}

// addImage adds an image's manifest, config and layers to the blobs, and returns its entry of manifest.json.
func addImage(img v1.Image, add func(blob)) (dockerManifest, error) {
	manifest, err := img.RawManifest()
	if err != nil {
		return dockerManifest{}, fmt.Errorf("reading the manifest: %w", err)
	}
	add(rawBlob(manifest))
	config, err := img.RawConfigFile()
	if err != nil {
		return dockerManifest{}, fmt.Errorf("reading the config: %w", err)
	}
	cb := rawBlob(config)
	add(cb)
	entry := dockerManifest{Config: blobPath(cb.digest)}
	layers, err := img.Layers()
	if err != nil {
		return dockerManifest{}, fmt.Errorf("reading the layers: %w", err)
	}
	for _, l := range layers {
		h, err := l.Digest()
		if err != nil {
			return dockerManifest{}, fmt.Errorf("reading a layer's digest: %w", err)
		}
		size, err := l.Size()
		if err != nil {
			return dockerManifest{}, fmt.Errorf("reading the size of layer %s: %w", h, err)
		}
		add(blob{digest: h, size: size, open: l.Compressed})
		entry.Layers = append(entry.Layers, blobPath(h))
	}
	return entry, nil
}

func writeBlob(tw *tar.Writer, hdr *tar.Header, b blob) error {
	rc, err := b.open()
	if err != nil {
		return fmt.Errorf("opening blob %s: %w", b.digest, err)
	}
	defer rc.Close()
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("writing blob %s: %w", b.digest, err)
	}
	n, err := io.Copy(tw, rc)
	if err != nil {
		return fmt.Errorf("writing blob %s: %w", b.digest, err)
	}
	if n != b.size {
		return fmt.Errorf("writing blob %s: %d bytes, its descriptor says %d", b.digest, n, b.size)
	}
	return nil
}

// rawBlob is a blob of data in memory.
func rawBlob(data []byte) blob {
	h, n, _ := v1.SHA256(bytes.NewReader(data))
	return blob{digest: h, size: n, open: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }}
}

func blobPath(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

// normalizeReference returns ref as containerd and the kubelet name it: with its registry, and library/ for an
// official image (lifeline/lifeline-agent:dev is docker.io/lifeline/lifeline-agent:dev).
func normalizeReference(ref string) (string, error) {
	slash := strings.LastIndex(ref, "/")
	colon := strings.LastIndex(ref, ":")
	if colon <= slash || colon == len(ref)-1 || strings.Contains(ref, "@") || ref != strings.ToLower(ref[:colon])+ref[colon:] {
		return "", fmt.Errorf("image reference %q must be <name>:<tag>, its name lowercase, without a digest", ref)
	}
	first, _, found := strings.Cut(ref, "/")
	if !found || !strings.ContainsAny(first, ".:") && first != "localhost" {
		if !found {
			ref = "library/" + ref
		}
		ref = "docker.io/" + ref
	}
	return ref, nil
}

// familiar is a normalized reference as Docker shows it (docker.io/lifeline/x:dev is lifeline/x:dev).
func familiar(normalized string) string {
	if rest, ok := strings.CutPrefix(normalized, "docker.io/"); ok {
		return strings.TrimPrefix(rest, "library/")
	}
	return normalized
}
