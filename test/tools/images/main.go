// Command lifeline-images writes Lifeline's container images without a container engine: from binaries already
// cross-compiled, one multi-platform OCI image archive per command, which docker load, kind load image-archive
// and ctr images import accept. make images runs it. Its two subcommands serve make release:
//
//	lifeline-images chart [--source-date-epoch N] <chart>.tgz <artifact>.tar   the packaged chart as an OCI artifact
//	lifeline-images push --registry R --version V <release dir>              the release's images and chart to R
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

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// The images' names by default, which the manifests in deploy/ use.
const (
	defaultRepository = "lifeline"
	defaultTag        = "dev"
)

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "chart" || os.Args[1] == "push") {
		command := map[string]func([]string) error{"chart": chartCommand, "push": pushCommand}[os.Args[1]]
		if err := command(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "lifeline-images %s: %v\n", os.Args[1], err)
			os.Exit(1)
		}
		return
	}
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

// chartCommand writes a packaged chart as an OCI artifact archive.
func chartCommand(args []string) error {
	flags := flag.NewFlagSet("chart", flag.ExitOnError)
	epoch := flags.String("source-date-epoch", os.Getenv("SOURCE_DATE_EPOCH"), "seconds since 1970 the artifact is dated (default: $SOURCE_DATE_EPOCH, else 0)")
	_ = flags.Parse(args)
	if flags.NArg() != 2 {
		return fmt.Errorf("usage: lifeline-images chart [--source-date-epoch N] <chart>.tgz <artifact>.tar")
	}
	created, err := parseEpoch(*epoch)
	if err != nil {
		return err
	}
	return writeChartArchive(flags.Arg(0), flags.Arg(1), created)
}

// pushCommand pushes a release's images and chart to a registry, with the credentials docker login, podman
// login or crane auth login left (a registry on a loopback or private address is spoken to over plain HTTP).
func pushCommand(args []string) error {
	flags := flag.NewFlagSet("push", flag.ExitOnError)
	registry := flags.String("registry", "", "the registry and path the release goes to: <registry>/<image>:<version>, <registry>/charts/lifeline:<version>")
	version := flags.String("version", "", "the release's version")
	_ = flags.Parse(args)
	if *registry == "" || *version == "" || flags.NArg() != 1 {
		return fmt.Errorf("usage: lifeline-images push --registry R --version V <release dir>")
	}
	return pushRelease(flags.Arg(0), *registry, *version, os.Stdout, remote.WithAuthFromKeychain(authn.DefaultKeychain))
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
	return digest, writeLayoutFile(file, func(w io.Writer) error { return writeArchive(w, idx, opts.reference(spec), opts.Created) })
}

// writeLayoutFile writes an archive to file through a temporary file.
func writeLayoutFile(file string, write func(io.Writer) error) error {
	name := strings.TrimSuffix(filepath.Base(file), ".tar")
	tmp, err := os.CreateTemp(filepath.Dir(file), "."+name+"-*.tar")
	if err != nil {
		return fmt.Errorf("creating the archive: %w", err)
	}
	defer os.Remove(tmp.Name())
	w := bufio.NewWriterSize(tmp, 1<<20)
	if err := write(w); err != nil {
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
