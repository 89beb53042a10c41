package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/idrange/idrange/internal/testing/testenv"
)

// builtBinary builds rangesvc once for the tests below, as a release
// would: static, -trimpath, the version stamped.
func builtBinary(t *testing.T, version string) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skipf("the image is linux; this is %s", runtime.GOOS)
	}
	bin := filepath.Join(t.TempDir(), "rangesvc")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	if err := buildBinary(ctx, bin, version, runtime.GOARCH); err != nil {
		t.Fatal(err)
	}
	t.Logf("go build (CGO_ENABLED=0 -trimpath) took %v", time.Since(start).Round(time.Millisecond))
	return bin
}

// The image acceptance test, in the fallback this machine allows (no
// container runtime): build the image, write it as a docker-archive
// tarball and as an OCI layout, read both back, check the config and the
// files, and run `rangesvc version` extracted from the image.
//
// Run without -race (scripts/test does, with -v, so CI's log shows the
// version output): under the race detector hashing and compressing the
// layer takes most of a minute.
func TestImageRunsVersion(t *testing.T) {
	testenv.SkipUnderRace(t, "gzip and sha256 of the 26 MiB layer take ~45 s under the race detector (~6 s without)")
	const version = "v0.0.0-imagetest"
	bin := builtBinary(t, version)
	dir := t.TempDir()
	var out bytes.Buffer
	err := run(context.Background(), []string{
		"-version", version, "-binary", bin,
		"-tar", filepath.Join(dir, "rangesvc.tar"), "-oci", filepath.Join(dir, "oci"), "-verify",
	}, &out, &out)
	t.Logf("mkimage output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "version:  "+version+"\n"); n != 2 {
		t.Fatalf("`rangesvc version` from the image printed version %s %d times; want 2 (tarball and OCI layout)", version, n)
	}

	// The same binary gives the same image (Created is fixed), so a
	// release's digest can be reproduced.
	a, err := newImage(bin, Options{Version: version, GOARCH: runtime.GOARCH})
	if err != nil {
		t.Fatal(err)
	}
	b, err := newImage(bin, Options{Version: version, GOARCH: runtime.GOARCH})
	if err != nil {
		t.Fatal(err)
	}
	da, _ := a.Digest()
	db, _ := b.Digest()
	if da != db {
		t.Fatalf("two builds of the same binary: digests %s and %s", da, db)
	}

	// Verify can fail: a root user, another entrypoint, a shell in a
	// layer, a wrong version.
	for _, tc := range []struct {
		name string
		edit func(*v1.ConfigFile)
		add  string
		want string
		ver  string
	}{
		{name: "root", edit: func(c *v1.ConfigFile) { c.Config.User = "0:0" }, want: "is root"},
		{name: "user by name", edit: func(c *v1.ConfigFile) { c.Config.User = "nobody" }, want: "not numeric"},
		{name: "entrypoint", edit: func(c *v1.ConfigFile) { c.Config.Entrypoint = []string{"/bin/sh", "-c", "/rangesvc"} }, want: "entrypoint"},
		{name: "shell", add: "bin/sh", want: "has a shell"},
		{name: "extra file", add: "etc/motd", want: "files besides"},
		{name: "version", ver: "v9.9.9", want: "version label"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img := a
			if tc.edit != nil {
				cf, _ := img.ConfigFile()
				cf = cf.DeepCopy()
				tc.edit(cf)
				if img, err = mutate.ConfigFile(img, cf); err != nil {
					t.Fatal(err)
				}
			}
			if tc.add != "" {
				img = appendFile(t, img, tc.add)
			}
			want := version
			if tc.ver != "" {
				want = tc.ver
			}
			err := Verify(context.Background(), img, want, io.Discard)
			if !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Verify = %v; want ErrBadImage naming %q", err, tc.want)
			}
		})
	}
}

func appendFile(t *testing.T, img v1.Image, name string) v1.Image {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: 2, Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte("#!"))
	tw.Close()
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.AppendLayers(img, l)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestNewImageRefusesDynamicBinary(t *testing.T) {
	exe, err := os.Executable() // this test binary: may be dynamic (cgo, -race)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newImage(exe, Options{Version: "v0", GOARCH: runtime.GOARCH}); err == nil {
		b, _ := os.ReadFile(exe)
		if checkStaticELF(b, runtime.GOARCH) == nil {
			t.Skip("this test binary is static itself; nothing to refuse")
		}
		t.Fatal("newImage took a dynamically linked binary")
	}
	if _, err := newImage(exe, Options{Version: "v0", GOARCH: "s390x"}); err == nil || !strings.Contains(err.Error(), "ELF machine") {
		t.Fatalf("newImage for another GOARCH: %v; want an ELF machine error", err)
	}
}

// The Dockerfile builds the same image: the same build flags, a scratch
// final stage, the same user, entrypoint and ports.
func TestDockerfileMatches(t *testing.T) {
	b, err := os.ReadFile("../../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	froms := regexp.MustCompile(`(?m)^FROM\s+(\S+)`).FindAllStringSubmatch(df, -1)
	if len(froms) < 2 || froms[len(froms)-1][1] != "scratch" {
		t.Errorf("Dockerfile stages %q: want a builder stage and a final FROM scratch", froms)
	}
	for _, want := range []string{
		"CGO_ENABLED=0", "-trimpath", "-X " + versionVar + "=${VERSION}", "-s -w",
		"USER " + user + "\n", `ENTRYPOINT ["` + entrypoint + `"]`, "COPY --from=build /out/rangesvc " + entrypoint + "\n",
		"EXPOSE " + strings.ReplaceAll(strings.Join(exposedPorts, " "), "/tcp", "") + "\n",
	} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile does not say %q", want)
		}
	}
	if regexp.MustCompile(`(?m)^(RUN|SHELL|CMD)\b`).MatchString(df[strings.LastIndex(df, "\nFROM "):]) {
		t.Error("the final stage runs commands: it has no shell")
	}
}

func TestRunUsage(t *testing.T) {
	for _, args := range [][]string{{}, {"-version", "v1"}, {"-tar", "x.tar"}, {"-version", "v1", "-tar", "x", "extra"}} {
		if err := run(context.Background(), args, io.Discard, io.Discard); !errors.Is(err, errUsage) {
			t.Errorf("run(%q) = %v; want a usage error", args, err)
		}
	}
}
