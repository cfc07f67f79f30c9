package splice

import (
	"bytes"
	"context"
	"go/build"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// goCmd runs the go command in this package's directory with extra
// environment, bounded so a wedged toolchain cannot hang the test.
func goCmd(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestGeneratedFilePerArch: every Linux architecture the toolchain knows
// (and Android, which implies the linux tag) selects exactly one generated
// file, the one of its byte order, and other systems select none (other.go's userspace fallback stands alone). Build
// constraints are evaluated in process (go/build), so this covers every
// GOOS/GOARCH pair for free.
func TestGeneratedFilePerArch(t *testing.T) {
	out, err := goCmd(t, nil, "tool", "dist", "list")
	if err != nil {
		t.Fatalf("go tool dist list: %v\n%s", err, out)
	}
	bigEndian := map[string]bool{"mips": true, "mips64": true, "ppc64": true, "s390x": true}
	n := 0
	for _, pair := range strings.Fields(out) {
		goos, goarch, ok := strings.Cut(pair, "/")
		if !ok {
			continue
		}
		ctx := build.Default
		ctx.GOOS, ctx.GOARCH, ctx.CgoEnabled = goos, goarch, false
		pkg, err := ctx.ImportDir(".", 0)
		if err != nil {
			t.Errorf("%s: %v", pair, err)
			continue
		}
		var got []string
		for _, f := range pkg.GoFiles {
			if strings.HasPrefix(f, "splice_bpfe") {
				got = append(got, f)
			}
		}
		want := ""
		// GOOS=android implies the linux build tag, so it gets the loader too.
		if goos == "linux" || goos == "android" {
			n++
			want = "splice_bpfel.go"
			if bigEndian[goarch] {
				want = "splice_bpfeb.go"
			}
		}
		if strings.Join(got, " ") != want {
			t.Errorf("%s selects %v, want %q", pair, got, want)
		}
	}
	if n < 10 {
		t.Fatalf("only %d Linux targets listed: %q", n, out)
	}
}

// TestCrossBuild compiles the package for a little- and a big-endian Linux
// architecture and for a non-Linux system (linux/amd64 is this test's own
// build). Before both byte orders were generated, linux/s390x failed with
// "undefined: spliceObjects".
func TestCrossBuild(t *testing.T) {
	for _, target := range []string{"linux/arm64", "linux/s390x", "darwin/arm64"} {
		t.Run(target, func(t *testing.T) {
			goos, goarch, _ := strings.Cut(target, "/")
			if out, err := goCmd(t, []string{"GOOS=" + goos, "GOARCH=" + goarch, "CGO_ENABLED=0"}, "build", "."); err != nil {
				t.Fatalf("go build: %v\n%s", err, out)
			}
		})
	}
}

// TestGeneratedObjectsMatchSource: `make generate` (gen.go's bpf2go line)
// reproduces the committed objects and Go files byte for byte, so what is
// committed is what bpf/splice.c says. It needs Debian's clang, llvm-strip
// and libbpf-dev; without them it skips, unless
// KVGATE_REQUIRE_BPF_TOOLCHAIN=1 makes that a failure (CI).
func TestGeneratedObjectsMatchSource(t *testing.T) {
	for _, tool := range []string{"clang", "llvm-strip"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("KVGATE_REQUIRE_BPF_TOOLCHAIN") == "1" {
				t.Fatalf("%s not found: %v", tool, err)
			}
			t.Skipf("%s not found (KVGATE_REQUIRE_BPF_TOOLCHAIN=1 makes this a failure): %v", tool, err)
		}
	}
	if _, err := os.Stat("/usr/include/bpf/bpf_helpers.h"); err != nil {
		if os.Getenv("KVGATE_REQUIRE_BPF_TOOLCHAIN") == "1" {
			t.Fatalf("libbpf-dev headers: %v", err)
		}
		t.Skipf("libbpf-dev headers missing (KVGATE_REQUIRE_BPF_TOOLCHAIN=1 makes this a failure): %v", err)
	}
	// Byte identity holds only for the clang the objects were built with.
	if out, err := exec.Command("clang", "--version").Output(); err != nil || !strings.HasPrefix(string(out), generatedWith) {
		first, _, _ := strings.Cut(string(out), "\n")
		if os.Getenv("KVGATE_REQUIRE_BPF_TOOLCHAIN") == "1" {
			t.Fatalf("clang is %q (%v); the committed objects were built with %q", first, err, generatedWith)
		}
		t.Skipf("clang is %q, the committed objects were built with %q: byte identity needs that clang (KVGATE_REQUIRE_BPF_TOOLCHAIN=1 makes this a failure)", first, generatedWith)
	}
	src, err := os.ReadFile("gen.go")
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, line := range strings.Split(string(src), "\n") {
		if rest, ok := strings.CutPrefix(line, "//go:generate go "); ok {
			args = splitQuoted(rest)
		}
	}
	if len(args) == 0 {
		t.Fatal("gen.go has no //go:generate go … line")
	}
	dir := t.TempDir()
	abs, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	// Same command, from this directory (its relative paths), writing into dir.
	args = append(args[:2:2], append([]string{"-output-dir", dir, "-go-package", "splice"}, args[2:]...)...)
	cmd := exec.Command("go", args...)
	cmd.Dir = abs
	cmd.Env = append(os.Environ(), "GOPACKAGE=splice")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("bpf2go: %v\n%s", err, out)
	}
	for _, f := range []string{"splice_bpfel.o", "splice_bpfeb.o", "splice_bpfel.go", "splice_bpfeb.go"} {
		want, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from a fresh `make generate` (%d bytes, committed %d): regenerate and commit it", f, len(got), len(want))
		}
	}
}

// generatedWith is the first line of `clang --version` of the toolchain that
// built the committed objects (Debian 12's). Update it with the objects.
const generatedWith = "Debian clang version 14.0.6"

// splitQuoted splits a go:generate line into words, keeping "double-quoted"
// words together, as the go command does.
func splitQuoted(s string) []string {
	var words []string
	var cur strings.Builder
	in, have := false, false
	for _, r := range s {
		switch {
		case r == '"':
			in, have = !in, true
		case (r == ' ' || r == '\t') && !in:
			if have {
				words = append(words, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteRune(r)
			have = true
		}
	}
	if have {
		words = append(words, cur.String())
	}
	return words
}
