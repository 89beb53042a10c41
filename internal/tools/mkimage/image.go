package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's fixed parts; the Dockerfile says the same (a test checks).
const (
	pkgPath    = "github.com/idrange/idrange/cmd/rangesvc"
	versionVar = "github.com/idrange/idrange/internal/server/buildinfo.Version"
	entrypoint = "/rangesvc"
	user       = "65532:65532"
)

// exposedPorts are serve's ports as the Kubernetes manifests use them:
// gRPC, HTTP/JSON, metrics and probes.
var exposedPorts = []string{"7070/tcp", "7071/tcp", "9090/tcp"}

// Options are the image's variable parts.
type Options struct {
	// Version is the release version, stamped into the binary by the
	// build and written into the image's labels.
	Version string
	// GOARCH is the binary's architecture (the image's too).
	GOARCH string
	// Created is the image's creation time; zero means the Unix epoch, so
	// that the same binary always gives the same image digest.
	Created time.Time
}

// goTool is the go command of the toolchain that runs this program (or
// test), else the one on PATH.
func goTool() string {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); runtime.GOROOT() != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "go"
}

// ldflags are the release build's linker flags: no symbol table or DWARF
// (smaller image), and the version.
func ldflags(version string) string {
	return "-s -w -X " + versionVar + "=" + version
}

// buildBinary builds a static linux rangesvc at out, as the Dockerfile's
// builder stage does. It runs in the current directory, which must be
// inside the idrange module.
func buildBinary(ctx context.Context, out, version, goarch string) error {
	cmd := exec.CommandContext(ctx, goTool(), "build", "-trimpath", "-ldflags", ldflags(version), "-o", out, pkgPath)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return errors.Newf("go build %s: %v: %s", pkgPath, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// newImage is the image: one layer holding the binary at /rangesvc (mode
// 0555, owned by root, so the non-root user cannot change it), on an empty
// base, OCI media types.
func newImage(binary string, o Options) (v1.Image, error) {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	if err := checkStaticELF(bin, o.GOARCH); err != nil {
		return nil, errors.Newf("%s: %w", binary, err)
	}
	created := o.Created
	if created.IsZero() {
		created = time.Unix(0, 0)
	}
	created = created.UTC()
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	if err := tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg, Name: strings.TrimPrefix(entrypoint, "/"), Mode: 0o555, Size: int64(len(bin)),
		ModTime: created, Format: tar.FormatPAX,
	}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := layerTar.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
		Created: v1.Time{Time: created}, CreatedBy: "mkimage: COPY rangesvc " + entrypoint,
		Comment: "static rangesvc, CGO_ENABLED=0 -trimpath",
	}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", o.GOARCH, v1.Time{Time: created}
	ports := map[string]struct{}{}
	for _, p := range exposedPorts {
		ports[p] = struct{}{}
	}
	cf.Config = v1.Config{
		Entrypoint:   []string{entrypoint},
		User:         user,
		WorkingDir:   "/",
		ExposedPorts: ports,
		Labels: map[string]string{
			"org.opencontainers.image.title":       "rangesvc",
			"org.opencontainers.image.description": "idrange range service: 64-bit unique IDs from leased, fenced worker codes",
			"org.opencontainers.image.version":     o.Version,
			"org.opencontainers.image.source":      "https://github.com/idrange/idrange",
			"org.opencontainers.image.licenses":    "Apache-2.0",
		},
	}
	return mutate.ConfigFile(img, cf)
}

func writeTarball(file, tag string, img v1.Image) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return errors.Newf("-tag %q: %w", tag, err)
	}
	return tarball.WriteToFile(file, ref, img)
}

func readTarball(file, tag string) (v1.Image, error) {
	ref, err := name.NewTag(tag)
	if err != nil {
		return nil, err
	}
	return tarball.ImageFromPath(file, &ref)
}

// writeLayout writes img as the only image of an OCI layout at dir,
// annotated with the version as its ref name.
func writeLayout(dir, version string, img v1.Image) error {
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": version}))
}

func readLayout(dir string) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(m.Manifests) != 1 {
		return nil, errors.Newf("OCI layout %s holds %d manifests; want 1", dir, len(m.Manifests))
	}
	return idx.Image(m.Manifests[0].Digest)
}

// ErrBadImage is wrapped by every check Verify makes.
var ErrBadImage = errors.New("bad image")

// shells are files whose presence means the image has a shell.
var shells = []string{"sh", "bash", "ash", "dash", "zsh", "busybox"}

// Verify checks a built image as a user's platform would see it: OCI
// config with entrypoint /rangesvc and a numeric non-root user, linux, one
// file in the layers (/rangesvc: executable, static) and no shell; then it
// extracts /rangesvc and runs `rangesvc version` (when the image's
// architecture is this machine's), whose version must be wantVersion. It
// writes what it saw to w.
func Verify(ctx context.Context, img v1.Image, wantVersion string, w io.Writer) error {
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	mt, err := img.MediaType()
	if err != nil {
		return err
	}
	uid, _, _ := strings.Cut(cf.Config.User, ":")
	switch n, err := strconv.Atoi(uid); {
	case mt != types.OCIManifestSchema1 && mt != types.DockerManifestSchema2: // docker-archive tarballs read back as Docker's
		return errors.Newf("%w: manifest media type %s; want %s", ErrBadImage, mt, types.OCIManifestSchema1)
	case !slices.Equal(cf.Config.Entrypoint, []string{entrypoint}):
		return errors.Newf("%w: entrypoint %q; want [%s]", ErrBadImage, cf.Config.Entrypoint, entrypoint)
	case err != nil:
		return errors.Newf("%w: user %q is not numeric (a scratch image has no /etc/passwd; runAsNonRoot needs a number)", ErrBadImage, cf.Config.User)
	case n == 0:
		return errors.Newf("%w: user %q is root", ErrBadImage, cf.Config.User)
	case cf.OS != "linux":
		return errors.Newf("%w: os %q", ErrBadImage, cf.OS)
	case cf.Config.Labels["org.opencontainers.image.version"] != wantVersion:
		return errors.Newf("%w: version label %q; want %q", ErrBadImage, cf.Config.Labels["org.opencontainers.image.version"], wantVersion)
	}
	fmt.Fprintf(w, "image %s: os/arch %s/%s, entrypoint %q, user %s, version label %s\n",
		digest, cf.OS, cf.Architecture, cf.Config.Entrypoint, cf.Config.User, wantVersion)

	files, err := layerFiles(img)
	if err != nil {
		return err
	}
	var names []string
	for n := range files {
		names = append(names, n)
		if slices.Contains(shells, path.Base(n)) {
			return errors.Newf("%w: the image has a shell: /%s", ErrBadImage, n)
		}
	}
	slices.Sort(names)
	bin, ok := files[strings.TrimPrefix(entrypoint, "/")]
	switch {
	case !ok:
		return errors.Newf("%w: no %s in the layers (files: %q)", ErrBadImage, entrypoint, names)
	case len(files) != 1:
		return errors.Newf("%w: files besides %s in the layers: %q", ErrBadImage, entrypoint, names)
	case bin.mode&0o111 == 0:
		return errors.Newf("%w: %s is not executable (mode %o)", ErrBadImage, entrypoint, bin.mode)
	}
	if err := checkStaticELF(bin.data, cf.Architecture); err != nil {
		return errors.Newf("%w: %s: %v", ErrBadImage, entrypoint, err)
	}
	fmt.Fprintf(w, "layers hold only %s (mode %04o, %.1f MiB, static ELF, no shell)\n", entrypoint, bin.mode, float64(len(bin.data))/(1<<20))

	if cf.Architecture != runtime.GOARCH || runtime.GOOS != "linux" {
		fmt.Fprintf(w, "not running %s: the image is %s/%s, this machine %s/%s\n", entrypoint, cf.OS, cf.Architecture, runtime.GOOS, runtime.GOARCH)
		return nil
	}
	dir, err := os.MkdirTemp("", "mkimage-verify-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	exe := filepath.Join(dir, "rangesvc")
	if err := os.WriteFile(exe, bin.data, 0o555); err != nil {
		return err
	}
	text, err := runVersion(ctx, exe)
	if err != nil {
		return err
	}
	js, err := runVersion(ctx, exe, "-o", "json")
	if err != nil {
		return err
	}
	var info struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(js, &info); err != nil {
		return errors.Newf("%w: rangesvc version -o json: %v", ErrBadImage, err)
	}
	if info.Version != wantVersion {
		return errors.Newf("%w: rangesvc version says %q; want %q", ErrBadImage, info.Version, wantVersion)
	}
	fmt.Fprintf(w, "$ rangesvc version   # %s extracted from the image and run directly (no container runtime here)\n%s", entrypoint, text)
	return nil
}

func runVersion(ctx context.Context, exe string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, exe, append([]string{"version"}, args...)...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, errors.Newf("%w: rangesvc version %s: %v: %s", ErrBadImage, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

type layerFile struct {
	mode int64
	data []byte
}

// layerFiles is the image's file system: every regular file, symlink or
// hard link of every layer, by path without the leading slash (later
// layers win; whiteouts are not expected in a one-layer image and are
// refused).
func layerFiles(img v1.Image) (map[string]layerFile, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	files := map[string]layerFile{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return nil, err
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				rc.Close()
				return nil, err
			}
			n := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
			switch {
			case strings.HasPrefix(path.Base(n), ".wh."):
				rc.Close()
				return nil, errors.Newf("%w: whiteout %s", ErrBadImage, h.Name)
			case h.Typeflag == tar.TypeDir:
				continue
			}
			data, err := io.ReadAll(tr)
			if err != nil {
				rc.Close()
				return nil, err
			}
			files[n] = layerFile{mode: h.Mode, data: data}
		}
		rc.Close()
	}
	return files, nil
}

// goarchMachine maps GOARCH to the ELF machine a binary for it has.
var goarchMachine = map[string]elf.Machine{
	"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "arm": elf.EM_ARM,
	"386": elf.EM_386, "ppc64le": elf.EM_PPC64, "s390x": elf.EM_S390, "riscv64": elf.EM_RISCV,
}

// checkStaticELF checks that b is a linux ELF executable for goarch with no
// program interpreter (statically linked: nothing else in the image).
func checkStaticELF(b []byte, goarch string) error {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return errors.Newf("not an ELF executable: %v", err)
	}
	defer f.Close()
	if want, ok := goarchMachine[goarch]; ok && f.Machine != want {
		return errors.Newf("ELF machine %v; want %v for GOARCH %s", f.Machine, want, goarch)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("dynamically linked (has a PT_INTERP program header): build with CGO_ENABLED=0")
		}
	}
	return nil
}
