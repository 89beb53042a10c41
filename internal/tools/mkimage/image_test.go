package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
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
		testenv.Missing(t, "linux", "the image's binary runs on linux; this is "+runtime.GOOS)
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

// newImage refuses a dynamically linked binary (one with a program
// interpreter), naming that, and a binary for another architecture; the
// same binary without the interpreter passes the check, so the refusal is
// the interpreter's. The binaries are minimal ELF files written here: the
// test binary itself may be static or not, depending on how it was built.
func TestNewImageRefusesDynamicBinary(t *testing.T) {
	static, dynamic := writeELF(t, elf.EM_X86_64, ""), writeELF(t, elf.EM_X86_64, "/lib64/ld-linux-x86-64.so.2")
	if _, err := newImage(dynamic, Options{Version: "v0", GOARCH: "amd64"}); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Fatalf("newImage of a binary with a program interpreter: %v; want a 'dynamically linked' error", err)
	}
	if b, err := os.ReadFile(static); err != nil || checkStaticELF(b, "amd64") != nil {
		t.Fatalf("the same binary without the interpreter: %v, %v; want it to pass", err, checkStaticELF(b, "amd64"))
	}
	if _, err := newImage(static, Options{Version: "v0", GOARCH: "s390x"}); err == nil || !strings.Contains(err.Error(), "ELF machine") {
		t.Fatalf("newImage for another GOARCH: %v; want an ELF machine error", err)
	}
}

// writeELF writes a minimal 64-bit little-endian ELF executable for machine
// (a header and a PT_LOAD program header, plus PT_INTERP naming interp if
// it is not "") and returns its path.
func writeELF(t *testing.T, machine elf.Machine, interp string) string {
	t.Helper()
	const ehsize, phentsize = 64, 56
	progs := []elf.Prog64{{Type: uint32(elf.PT_LOAD), Flags: uint32(elf.PF_R | elf.PF_X), Align: 0x1000}}
	if interp != "" {
		progs = append(progs, elf.Prog64{Type: uint32(elf.PT_INTERP), Flags: uint32(elf.PF_R), Align: 1,
			Off: ehsize + phentsize*2, Filesz: uint64(len(interp) + 1), Memsz: uint64(len(interp) + 1)})
	}
	h := elf.Header64{Type: uint16(elf.ET_EXEC), Machine: uint16(machine), Version: uint32(elf.EV_CURRENT),
		Phoff: ehsize, Ehsize: ehsize, Phentsize: phentsize, Phnum: uint16(len(progs)), Shentsize: 64}
	copy(h.Ident[:], elf.ELFMAG)
	h.Ident[elf.EI_CLASS], h.Ident[elf.EI_DATA], h.Ident[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	var b bytes.Buffer
	for _, v := range []any{h, progs} {
		if err := binary.Write(&b, binary.LittleEndian, v); err != nil {
			t.Fatal(err)
		}
	}
	if interp != "" {
		b.WriteString(interp + "\x00")
	}
	path := filepath.Join(t.TempDir(), "rangesvc")
	if err := os.WriteFile(path, b.Bytes(), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
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
