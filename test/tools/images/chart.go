package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"sigs.k8s.io/yaml"
)

// The media types through which Helm recognises a chart in a registry: helm pull and helm install oci://... refuse
// a manifest without both.
const (
	helmConfigMediaType types.MediaType = "application/vnd.cncf.helm.config.v1+json"
	helmChartMediaType  types.MediaType = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
)

// chartMetadata is what a packaged chart's manifest tells of it before anything is pulled.
type chartMetadata struct {
	Name        string   `json:"name"`
	Version     string   `json:"version"`
	Description string   `json:"description"`
	Home        string   `json:"home"`
	Sources     []string `json:"sources"`
}

// chartArtifact is a packaged chart as Helm pushes it to a registry: a manifest whose config is the chart's
// Chart.yaml as JSON and whose one layer is the package itself, annotated as helm push annotates it, dated created.
type chartArtifact struct {
	version                 string
	config, manifest, chart []byte
}

// newChartArtifact reads Chart.yaml from the package tgz.
func newChartArtifact(tgz []byte, created time.Time) (*chartArtifact, error) {
	chartYAML, err := chartFile(tgz)
	if err != nil {
		return nil, err
	}
	config, err := yaml.YAMLToJSON(chartYAML)
	if err != nil {
		return nil, fmt.Errorf("reading Chart.yaml: %w", err)
	}
	var meta chartMetadata
	if err := json.Unmarshal(config, &meta); err != nil || meta.Name == "" || meta.Version == "" {
		return nil, fmt.Errorf("the chart package's Chart.yaml names no chart and version (%v)", err)
	}
	annotations := map[string]string{
		"org.opencontainers.image.title":   meta.Name,
		"org.opencontainers.image.version": meta.Version,
		"org.opencontainers.image.created": created.Format(time.RFC3339),
	}
	for key, value := range map[string]string{
		"org.opencontainers.image.description": meta.Description,
		"org.opencontainers.image.url":         meta.Home,
	} {
		if value != "" {
			annotations[key] = value
		}
	}
	if len(meta.Sources) > 0 {
		annotations["org.opencontainers.image.source"] = meta.Sources[0]
	}
	descriptor := func(mediaType types.MediaType, data []byte) v1.Descriptor {
		b := rawBlob(data)
		return v1.Descriptor{MediaType: mediaType, Digest: b.digest, Size: b.size}
	}
	manifest, err := json.Marshal(v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		Config:        descriptor(helmConfigMediaType, config),
		Layers:        []v1.Descriptor{descriptor(helmChartMediaType, tgz)},
		Annotations:   annotations,
	})
	if err != nil {
		return nil, fmt.Errorf("encoding the chart's manifest: %w", err)
	}
	return &chartArtifact{version: meta.Version, config: config, manifest: manifest, chart: tgz}, nil
}

// chartFile is <chart>/Chart.yaml of a packaged chart.
func chartFile(tgz []byte) ([]byte, error) {
	gz, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		return nil, fmt.Errorf("reading the chart package: %w", err)
	}
	tr := tar.NewReader(gz)
	for {
		hdr, err := tr.Next()
		if err != nil {
			return nil, fmt.Errorf("the chart package holds no <chart>/Chart.yaml: %w", err)
		}
		if strings.Count(hdr.Name, "/") == 1 && strings.HasSuffix(hdr.Name, "/Chart.yaml") {
			return io.ReadAll(io.LimitReader(tr, 1<<20))
		}
	}
}

// image is the artifact as go-containerregistry pushes and archives images.
func (a *chartArtifact) image() (v1.Image, error) {
	return partial.CompressedToImage(chartImageCore{a})
}

// chartImageCore is the least go-containerregistry needs to derive an image from.
type chartImageCore struct{ *chartArtifact }

func (c chartImageCore) RawConfigFile() ([]byte, error)      { return c.config, nil }
func (c chartImageCore) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }
func (c chartImageCore) RawManifest() ([]byte, error)        { return c.manifest, nil }
func (c chartImageCore) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	if d, _, _ := v1.SHA256(bytes.NewReader(c.chart)); d == h {
		return chartLayer{c.chart, d}, nil
	}
	return nil, fmt.Errorf("the chart's artifact has no layer %s", h)
}

// chartLayer is the package as the artifact's layer: stored as it is, never decompressed.
type chartLayer struct {
	data   []byte
	digest v1.Hash
}

func (l chartLayer) Digest() (v1.Hash, error) { return l.digest, nil }
func (l chartLayer) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(l.data)), nil
}
func (l chartLayer) Size() (int64, error)                { return int64(len(l.data)), nil }
func (l chartLayer) MediaType() (types.MediaType, error) { return helmChartMediaType, nil }

// writeChartArchive writes the packaged chart tgzFile as an OCI artifact, in an OCI image layout in a tar at file,
// tagged with the chart's version: what make release pushes to a registry, and what oras or any OCI-layout tool
// can copy there.
func writeChartArchive(tgzFile, file string, created time.Time) error {
	tgz, err := os.ReadFile(tgzFile)
	if err != nil {
		return err
	}
	artifact, err := newChartArtifact(tgz, created)
	if err != nil {
		return fmt.Errorf("%s: %w", tgzFile, err)
	}
	img, err := artifact.image()
	if err != nil {
		return err
	}
	return writeLayoutFile(file, func(w io.Writer) error { return writeArtifactLayout(w, img, artifact.version, created) })
}
