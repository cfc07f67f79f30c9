package splice

import (
	"bytes"
	"context"
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
	cmd.Env = append(append(os.Environ(), "CGO_ENABLED=0"), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestCrossBuild: the loader builds for every Linux architecture (both byte
// orders have a generated object) and the userspace fallback builds
// elsewhere. Before both targets were generated, linux/s390x failed with
// "undefined: spliceObjects".
func TestCrossBuild(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("the go command is needed to cross-build: %v", err)
	}
	for _, tc := range []struct {
		goos, goarch string
		generated    string // the bpf2go file the target selects, "" for none
	}{
		{"linux", "amd64", "splice_bpfel.go"},
		{"linux", "arm64", "splice_bpfel.go"},
		{"linux", "s390x", "splice_bpfeb.go"},
		{"darwin", "arm64", ""},
	} {
		t.Run(tc.goos+"/"+tc.goarch, func(t *testing.T) {
			env := []string{"GOOS=" + tc.goos, "GOARCH=" + tc.goarch}
			files, err := goCmd(t, env, "list", "-f", "{{join .GoFiles \" \"}}", ".")
			if err != nil {
				t.Fatalf("go list: %v\n%s", err, files)
			}
			var got []string
			for _, f := range strings.Fields(files) {
				if strings.HasPrefix(f, "splice_bpfe") {
					got = append(got, f)
				}
			}
			if want := strings.Fields(tc.generated); strings.Join(got, " ") != strings.Join(want, " ") {
				t.Errorf("generated files selected: %v, want %v", got, want)
			}
			if out, err := goCmd(t, env, "build", "."); err != nil {
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
