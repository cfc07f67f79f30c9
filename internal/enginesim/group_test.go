package enginesim

import (
	"net"
	"strconv"
	"testing"

	"github.com/kvgate/kvgate/internal/testnet"
)

// TestStartGroup: a port taken on a later engine's host closes the engines
// already started and draws another port; with no attempt left the error
// names the failure and nothing stays bound.
func TestStartGroup(t *testing.T) {
	hosts := []string{testnet.Host(t), testnet.Host(t)}
	taken, err := net.Listen("tcp", net.JoinHostPort(hosts[1], "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	busy := taken.Addr().(*net.TCPAddr).Port
	config := func(i, port int) Config {
		return Config{Host: hosts[i], Port: port, KVEventsEndpoint: "none", Logger: quietLogger()}
	}

	for _, tc := range []struct {
		name      string
		attempts  int
		picks     []int
		wantErr   bool
		wantPort  int
		wantPicks int
	}{
		{"retries-after-a-taken-port", 3, []int{busy, 0}, false, 0, 2},
		{"gives-up", 1, []int{busy}, true, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := 0
			pick := func() (int, error) { n++; return tc.picks[n-1], nil }
			engines, port, err := StartGroup(len(hosts), tc.attempts, pick, config)
			for _, e := range engines {
				e.Close()
			}
			if (err != nil) != tc.wantErr || port != tc.wantPort || n != tc.wantPicks {
				t.Fatalf("err %v port %d picks %d; want error %v port %d picks %d", err, port, n, tc.wantErr, tc.wantPort, tc.wantPicks)
			}
			if !tc.wantErr && len(engines) != len(hosts) {
				t.Fatalf("%d engines, want %d", len(engines), len(hosts))
			}
			// The engine started on the free host before the failure was closed.
			ln, err := net.Listen("tcp", net.JoinHostPort(hosts[0], strconv.Itoa(busy)))
			if err != nil {
				t.Fatalf("the first engine still holds %s:%d: %v", hosts[0], busy, err)
			}
			ln.Close()
		})
	}
}
