// Command mkimage builds rangesvc's container image without a Docker engine
// and without pulling a base image: a static rangesvc (CGO_ENABLED=0,
// -trimpath, the release version stamped with -ldflags) in one layer on an
// empty image (FROM scratch), run as user 65532, entrypoint /rangesvc, no
// shell. It is the Dockerfile's image, assembled with go-containerregistry,
// for CI and for users without Docker (docs/operations/deploy.md, "Container image
// and Kubernetes").
//
//	go run ./internal/tools/mkimage -version v1.2.3 -tar rangesvc.tar      # docker load / podman load -i
//	go run ./internal/tools/mkimage -version v1.2.3 -oci rangesvc-oci      # OCI image layout (skopeo, crane, oras)
//	go run ./internal/tools/mkimage -version v1.2.3 -tar rangesvc.tar -verify
//
// -verify reads the written image back, checks its config and files,
// extracts /rangesvc and runs `rangesvc version` from it: running the
// container itself needs a container runtime, which CI here does not have.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil:
	case errors.Is(err, errUsage):
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	fs.SetOutput(stderr)
	version := fs.String("version", "", "version stamped into the binary (buildinfo.Version) and the image's labels (required)")
	binary := fs.String("binary", "", "use this static linux rangesvc instead of building one")
	goarch := fs.String("goarch", runtime.GOARCH, "architecture to build for")
	tag := fs.String("tag", "", "image reference written into -tar (default idrange/rangesvc:VERSION)")
	tarPath := fs.String("tar", "", "write a docker-archive tarball here (docker load, podman load)")
	ociDir := fs.String("oci", "", "write an OCI image layout into this directory")
	verify := fs.Bool("verify", false, "read the written image back, check it, and run `rangesvc version` extracted from it")
	if err := fs.Parse(args); err != nil {
		return errors.Newf("%w: %v", errUsage, err)
	}
	switch {
	case fs.NArg() > 0:
		return errors.Newf("%w: unexpected arguments %q", errUsage, fs.Args())
	case *version == "":
		return errors.Newf("%w: -version is required", errUsage)
	case *tarPath == "" && *ociDir == "":
		return errors.Newf("%w: give -tar FILE or -oci DIR (or both)", errUsage)
	}
	if *tag == "" {
		*tag = "idrange/rangesvc:" + strings.TrimPrefix(*version, "+")
	}

	start := time.Now()
	bin := *binary
	if bin == "" {
		dir, err := os.MkdirTemp("", "mkimage-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		bin = filepath.Join(dir, "rangesvc")
		if err := buildBinary(ctx, bin, *version, *goarch); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "built %s (CGO_ENABLED=0 -trimpath, version %s) in %v\n", bin, *version, time.Since(start).Round(time.Millisecond))
	}
	img, err := newImage(bin, Options{Version: *version, GOARCH: *goarch})
	if err != nil {
		return err
	}
	if *tarPath != "" {
		if err := writeTarball(*tarPath, *tag, img); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s (%s)\n", *tarPath, *tag)
		if *verify {
			back, err := readTarball(*tarPath, *tag)
			if err != nil {
				return err
			}
			if err := Verify(ctx, back, *version, stdout); err != nil {
				return errors.Newf("%s: %w", *tarPath, err)
			}
		}
	}
	if *ociDir != "" {
		if err := writeLayout(*ociDir, *version, img); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote OCI layout %s\n", *ociDir)
		if *verify {
			back, err := readLayout(*ociDir)
			if err != nil {
				return err
			}
			if err := Verify(ctx, back, *version, stdout); err != nil {
				return errors.Newf("%s: %w", *ociDir, err)
			}
		}
	}
	return nil
}
