// Command lifeline-images writes Lifeline's container images without a container engine: from binaries already
// cross-compiled, one multi-platform OCI image archive per command, which docker load, kind load image-archive
// and ctr images import accept. make images runs it.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The images' names by default, which the manifests in deploy/ use.
const (
	defaultRepository = "lifeline"
	defaultTag        = "dev"
)

func main() {
	opts := buildOptions{}
	flag.StringVar(&opts.BinDir, "bin-dir", "dist/bin", "directory of the binaries: <bin-dir>/<os>_<arch>/<command>")
	out := flag.String("out", "dist/images", "directory the archives are written to: <out>/<command>.tar")
	flag.StringVar(&opts.Repository, "repository", defaultRepository, "repository the images are named in: <repository>/<command>:<tag>")
	flag.StringVar(&opts.Tag, "tag", defaultTag, "the images' tag")
	flag.StringVar(&opts.Version, "version", "dev", "the version stamped into the binaries (org.opencontainers.image.version)")
	flag.StringVar(&opts.Revision, "revision", "", "the commit the binaries are built from (org.opencontainers.image.revision)")
	flag.StringVar(&opts.Source, "source", "", "the project's repository URL (org.opencontainers.image.source)")
	platforms := flag.String("platforms", "linux/amd64,linux/arm64", "comma-separated platforms, the first one the default")
	epoch := flag.String("source-date-epoch", os.Getenv("SOURCE_DATE_EPOCH"),
		"seconds since 1970 dated on everything the images hold (default: $SOURCE_DATE_EPOCH, else 0)")
	samples := flag.Bool("samples", false, "write the sample images instead (the pod sandbox's and the sample worker under Sedna's example names), for nodes without a registry")
	flag.Parse()

	specs := lifelineImages
	if *samples {
		specs = sampleImages
	}
	if err := run(specs, opts, *out, *platforms, *epoch, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "lifeline-images:", err)
		os.Exit(1)
	}
}

// run writes each spec's archive into out, and a line for each to progress.
func run(specs []imageSpec, opts buildOptions, out, platforms, epoch string, progress io.Writer) error {
	var err error
	if opts.Platforms, err = parsePlatforms(platforms); err != nil {
		return err
	}
	if opts.Created, err = parseEpoch(epoch); err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", out, err)
	}
	for _, spec := range specs {
		file := filepath.Join(out, spec.Name+".tar")
		digest, err := writeImage(spec, opts, file)
		if err != nil {
			return fmt.Errorf("writing %s: %w", file, err)
		}
		// Beside the archive, the digest a chart pins the image to (make release).
		if err := os.WriteFile(filepath.Join(out, spec.Name+".digest"), []byte(digest.String()+"\n"), 0o644); err != nil {
			return fmt.Errorf("writing %s's digest: %w", file, err)
		}
		fmt.Fprintf(progress, "%s: %s@%s (%s)\n", file, opts.reference(spec), digest, platforms)
	}
	return nil
}

// writeImage builds spec's image and writes its archive to file, through a temporary file so a failed build
// leaves no truncated archive behind; it returns the digest of the image's index.
func writeImage(spec imageSpec, opts buildOptions, file string) (v1.Hash, error) {
	idx, err := buildIndex(spec, opts)
	if err != nil {
		return v1.Hash{}, err
	}
	digest, err := idx.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("the index's digest: %w", err)
	}
	return digest, writeArchiveFile(idx, opts.reference(spec), opts.Created, file)
}

// writeArchiveFile writes the archive of idx to file through a temporary file.
func writeArchiveFile(idx v1.ImageIndex, ref string, created time.Time, file string) error {
	name := strings.TrimSuffix(filepath.Base(file), ".tar")
	tmp, err := os.CreateTemp(filepath.Dir(file), "."+name+"-*.tar")
	if err != nil {
		return fmt.Errorf("creating the archive: %w", err)
	}
	defer os.Remove(tmp.Name())
	w := bufio.NewWriterSize(tmp, 1<<20)
	if err := writeArchive(w, idx, ref, created); err != nil {
		tmp.Close()
		return err
	}
	if err := w.Flush(); err != nil {
		tmp.Close()
		return fmt.Errorf("writing the archive: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing the archive: %w", err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("writing the archive: %w", err)
	}
	return os.Rename(tmp.Name(), file)
}

// parsePlatforms reads os/arch[/variant] platforms separated by commas.
func parsePlatforms(s string) ([]v1.Platform, error) {
	var ps []v1.Platform
	for _, f := range strings.Split(s, ",") {
		p, err := v1.ParsePlatform(strings.TrimSpace(f))
		if err != nil || p.OS == "" || p.Architecture == "" {
			return nil, fmt.Errorf("platform %q must be <os>/<arch>", f)
		}
		ps = append(ps, *p)
	}
	return ps, nil
}

// parseEpoch reads SOURCE_DATE_EPOCH: empty is 1970, the reproducible default.
func parseEpoch(s string) (time.Time, error) {
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q must be a count of seconds", s)
	}
	return time.Unix(n, 0).UTC(), nil
}
