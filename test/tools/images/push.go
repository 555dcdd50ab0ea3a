package main

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// releaseArchive is an archive of a release and the repository it is pushed to.
type releaseArchive struct{ file, repository string }

// releaseArchives are the archives of a release in dir (what make release writes) and where in registry each
// goes: every image as <registry>/<image>, then the chart that pins them as <registry>/charts/<chart>, where
// helm install oci://<registry>/charts/<chart> finds it.
func releaseArchives(dir, registry, version string) []releaseArchive {
	var archives []releaseArchive
	for _, spec := range lifelineImages {
		archives = append(archives, releaseArchive{filepath.Join(dir, "images", spec.Name+"-"+version+".tar"), registry + "/" + spec.Name})
	}
	return append(archives, releaseArchive{filepath.Join(dir, "lifeline-"+version+".oci.tar"), registry + "/charts/lifeline"})
}

// pushRelease pushes each archive of the release in dir to registry, tagged version, as it is: the same
// manifests, so the same digests, as the release's chart pins.
func pushRelease(dir, registry, version string, progress io.Writer, options ...remote.Option) error {
	for _, archive := range releaseArchives(dir, registry, version) {
		ref, err := name.NewTag(archive.repository + ":" + version)
		if err != nil {
			return fmt.Errorf("registry %q: %w", registry, err)
		}
		digest, err := pushArchive(archive.file, ref, options...)
		if err != nil {
			return fmt.Errorf("pushing %s to %s: %w", archive.file, ref, err)
		}
		fmt.Fprintf(progress, "pushed %s@%s\n", ref, digest)
	}
	return nil
}

// pushArchive pushes what the index.json of an OCI layout archive names, an image index or a manifest, to ref.
func pushArchive(archive string, ref name.Reference, options ...remote.Option) (v1.Hash, error) {
	dir, err := os.MkdirTemp("", "lifeline-push-")
	if err != nil {
		return v1.Hash{}, err
	}
	defer os.RemoveAll(dir)
	if err := unpack(archive, dir); err != nil {
		return v1.Hash{}, err
	}
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return v1.Hash{}, err
	}
	im, err := top.IndexManifest()
	if err != nil {
		return v1.Hash{}, err
	}
	if len(im.Manifests) != 1 {
		return v1.Hash{}, fmt.Errorf("index.json names %d manifests, not one", len(im.Manifests))
	}
	desc := im.Manifests[0]
	if desc.MediaType.IsIndex() {
		idx, err := top.ImageIndex(desc.Digest)
		if err != nil {
			return v1.Hash{}, err
		}
		return desc.Digest, remote.WriteIndex(ref, idx, options...)
	}
	img, err := top.Image(desc.Digest)
	if err != nil {
		return v1.Hash{}, err
	}
	return desc.Digest, remote.Write(ref, img, options...)
}

// unpack extracts an OCI layout archive into dir.
func unpack(file, dir string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.FromSlash(hdr.Name))
		if !strings.HasPrefix(p, dir+string(filepath.Separator)) {
			return fmt.Errorf("entry %q leaves the layout", hdr.Name)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			err = writeEntry(p, tr)
		default:
			err = fmt.Errorf("entry %q is neither a file nor a directory", hdr.Name)
		}
		if err != nil {
			return err
		}
	}
}

func writeEntry(file string, r io.Reader) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
