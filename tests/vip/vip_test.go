//go:build linux

// Package vip_test runs the real kvgate binary with --vip-dev inside a network
// namespace made by the test, with a client in a second namespace across a
// veth pair: a rule's VIP answers the client once the rule exists, stops
// answering once it is deleted, an address added by hand survives kvgate's
// exit, and a kvgate killed with SIGKILL gives its VIPs back after a restart.
// Every address lives inside the two namespaces.
package vip_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// netNS is one named namespace made by the test.
type netNS struct {
	name string
	h    netns.NsHandle
}

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func newNS(t *testing.T, name string) *netNS {
	t.Helper()
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	run(t, "ip", "-n", name, "link", "set", "lo", "up")
	return &netNS{name: name, h: h}
}

// do runs fn with the calling goroutine's thread inside ns: sockets fn
// creates belong to ns for their whole life.
func (ns *netNS) do(fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	if err := netns.Set(ns.h); err != nil {
		return err
	}
	defer func() { _ = netns.Set(orig) }()
	return fn()
}

func (ns *netNS) client(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := ns.do(func() error {
				var err error
				c, err = (&net.Dialer{Timeout: timeout}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
}

type fixture struct {
	gw, cl   *netNS
	dev      string // the gateway side of the veth pair
	subnet   string // "10.213.N."
	bin      string
	stateDir string
	api      string
	backend  string
}

func setup(t *testing.T) *fixture {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("KVGATE_REQUIRE_BPF") != "" {
			t.Fatal("the VIP test needs root (network namespaces)")
		}
		t.Skip("the VIP test needs root (network namespaces)")
	}
	id := fmt.Sprintf("%d%04d", os.Getpid()%1000, rand.IntN(10000))
	f := &fixture{gw: newNS(t, "kvgvip-gw-"+id), cl: newNS(t, "kvgvip-cl-"+id),
		dev: "kvgv" + id[:6], subnet: fmt.Sprintf("10.213.%d.", 1+rand.IntN(250))}
	run(t, "ip", "link", "add", f.dev, "netns", f.gw.name, "type", "veth", "peer", "name", "kvgc"+id[:6], "netns", f.cl.name)
	run(t, "ip", "-n", f.gw.name, "addr", "add", f.subnet+"1/24", "dev", f.dev)
	run(t, "ip", "-n", f.gw.name, "link", "set", f.dev, "up")
	run(t, "ip", "-n", f.cl.name, "addr", "add", f.subnet+"2/24", "dev", "kvgc"+id[:6])
	run(t, "ip", "-n", f.cl.name, "link", "set", "kvgc"+id[:6], "up")

	f.bin = filepath.Join(t.TempDir(), "kvgate")
	build := exec.Command("go", "build", "-o", f.bin, "github.com/kvgate/kvgate/cmd/kvgate")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	f.stateDir = t.TempDir()

	// The engine stand-in: a plain HTTP server on the gateway namespace's lo.
	var ln net.Listener
	if err := f.gw.do(func() error {
		var err error
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "engine says hi")
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	f.backend = ln.Addr().String()
	f.api = "127.0.0.1:11311"
	return f
}

// start runs kvgate inside the gateway namespace and waits for its API.
func (f *fixture) start(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", f.gw.name, f.bin, "--api", f.api, "--state-dir", f.stateDir,
		"--tokenizer-dir", t.TempDir(), "--datapath", "userspace", "--vip-dev", f.dev, "--shutdown-grace", "2s")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if t.Failed() {
			t.Logf("kvgate log:\n%s", logs.String())
		}
	})
	c := f.gw.client(time.Second)
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := c.Get("http://" + f.api + "/netlox/v1/config/loadbalancer/all")
		if err == nil {
			resp.Body.Close()
			return cmd
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvgate API did not come up: %v\n%s", err, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (f *fixture) api1(t *testing.T, method, path, body string) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+f.api+"/netlox/v1/config/loadbalancer"+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := f.gw.client(5 * time.Second).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
}

func (f *fixture) createRule(t *testing.T, vip string) {
	host, port, _ := net.SplitHostPort(f.backend)
	f.api1(t, "POST", "", fmt.Sprintf(`{"serviceArguments":{"externalIP":%q,"port":8080,"protocol":"tcp","sel":0,"mode":4},
		"endpoints":[{"endpointIP":%q,"targetPort":%s,"weight":1}]}`, vip, host, port))
}

func (f *fixture) deleteRule(t *testing.T, vip string) {
	f.api1(t, "DELETE", "/externalipaddress/"+vip+"/port/8080/protocol/tcp", "")
}

// answers reports whether the client namespace gets the engine's answer
// through vip:8080.
func (f *fixture) answers(vip string) bool {
	resp, err := f.cl.client(time.Second).Get("http://" + vip + ":8080/")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode == http.StatusOK && string(b) == "engine says hi"
}

func (f *fixture) onDevice(t *testing.T, vip string) bool {
	t.Helper()
	out, err := exec.Command("ip", "-n", f.gw.name, "-o", "addr", "show", "dev", f.dev).CombinedOutput()
	if err != nil {
		t.Fatalf("ip addr: %v\n%s", err, out)
	}
	return strings.Contains(string(out), " "+vip+"/32 ")
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestVIPPlumbing(t *testing.T) {
	f := setup(t)
	vip, byHand := f.subnet+"100", f.subnet+"101"
	run(t, "ip", "-n", f.gw.name, "addr", "add", byHand+"/32", "dev", f.dev)

	cmd := f.start(t)
	if f.answers(vip) {
		t.Fatal("the VIP answers before any rule exists")
	}
	f.createRule(t, vip)
	eventually(t, "the VIP answers once the rule exists", func() bool { return f.answers(vip) })
	f.deleteRule(t, vip)
	if f.onDevice(t, vip) {
		t.Fatal("the VIP is still on the device after its rule was deleted")
	}
	eventually(t, "the VIP stops answering once the rule is deleted", func() bool { return !f.answers(vip) })

	// A rule on an address the operator added: served, and never removed.
	f.createRule(t, byHand)
	eventually(t, "the hand-added VIP answers", func() bool { return f.answers(byHand) })
	f.createRule(t, vip)
	eventually(t, "the VIP answers again", func() bool { return f.answers(vip) })
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("kvgate exit: %v", err)
	}
	if f.onDevice(t, vip) {
		t.Fatal("kvgate left its VIP on the device at exit")
	}
	if !f.onDevice(t, byHand) {
		t.Fatal("kvgate removed an address it did not add")
	}

	// A restart restores both persisted rules; SIGKILL then leaves the owned
	// VIP behind, and the next start takes it back without stealing the
	// hand-added one.
	cmd = f.start(t)
	eventually(t, "the restored rule answers", func() bool { return f.answers(vip) })
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if !f.onDevice(t, vip) {
		t.Fatal("expected the VIP to survive SIGKILL (nothing ran at exit)")
	}
	cmd = f.start(t)
	f.deleteRule(t, vip)
	f.deleteRule(t, byHand)
	if f.onDevice(t, vip) {
		t.Fatal("the VIP kvgate added before the crash was not removed with its rule")
	}
	if !f.onDevice(t, byHand) {
		t.Fatal("the hand-added address was removed with its rule")
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Wait()
}
