// Package testpy runs interoperability tests against Debian's Python
// packages (python3-zmq for real libzmq, python3-msgpack, python3-cbor2).
package testpy

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Python is Debian's interpreter: the python3 on PATH may lack its modules.
const Python = "/usr/bin/python3"

// Require skips the test unless Python imports every module; with
// KVGATE_REQUIRE_INTEROP set (as CI sets it) it fails instead.
func Require(t testing.TB, modules ...string) {
	t.Helper()
	list := strings.Join(modules, ", ")
	out, err := exec.Command(Python, "-c", "import "+list).CombinedOutput()
	if err == nil {
		return
	}
	if os.Getenv("KVGATE_REQUIRE_INTEROP") != "" {
		t.Fatalf("KVGATE_REQUIRE_INTEROP is set but %s cannot import %s: %v\n%s", Python, list, err, out)
	}
	t.Skipf("%s cannot import %s (install the python3- packages or set KVGATE_REQUIRE_INTEROP=1 to fail instead): %v", Python, list, err)
}
