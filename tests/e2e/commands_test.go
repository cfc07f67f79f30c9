package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// commandCache holds the cmd/ binaries the package's tests start. Each is
// built once per test binary, into one directory that TestMain removes: a
// link of the daemon takes seconds, and a dozen tests start it.
type commandCache struct {
	mu    sync.Mutex
	dir   string
	built map[string]error // by command name; a failed build keeps its error
}

var commands commandCache

func TestMain(m *testing.M) {
	code := m.Run()
	commands.remove()
	os.Exit(code)
}

// buildCommands builds the named commands of cmd/ (those not built yet) and
// returns the directory that holds them.
func buildCommands(t *testing.T, names ...string) string {
	t.Helper()
	dir, err := commands.build(names)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func (c *commandCache) build(names []string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dir == "" {
		dir, err := os.MkdirTemp("", "kvgate-e2e-bin")
		if err != nil {
			return "", fmt.Errorf("a directory for the test binaries: %w", err)
		}
		c.dir, c.built = dir, map[string]error{}
	}
	args := []string{"build", "-o", c.dir + string(filepath.Separator)}
	var todo []string
	for _, n := range names {
		if _, ok := c.built[n]; !ok {
			todo = append(todo, n)
			args = append(args, "../../cmd/"+n)
		}
	}
	if len(todo) > 0 {
		out, err := exec.Command("go", args...).CombinedOutput()
		for _, n := range todo {
			c.built[n] = nil
			if err != nil {
				c.built[n] = fmt.Errorf("go build %v: %w\n%s", todo, err, out)
			}
		}
	}
	for _, n := range names {
		if err := c.built[n]; err != nil {
			return "", err
		}
	}
	return c.dir, nil
}

func (c *commandCache) remove() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dir != "" {
		_ = os.RemoveAll(c.dir)
	}
}
