package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// replayOffset is LLB_KV_REPLAY_PORT_OFFSET's default: each publisher binds
// its replay ROUTER there, as vLLM does.
const replayOffset = 1000

// network is where one run listens: loopback addresses of a /16 of 127/8
// the other suites do not use, one per endpoint, so every endpoint can
// publish on the rule's one kvZmqPort.
type network struct {
	api, vip string
	vipPort  int
	epIPs    []string
	zmqPort  int
}

func pickNetwork(endpoints int) (*network, error) {
	n := &network{}
	for i := range endpoints {
		n.epIPs = append(n.epIPs, fmt.Sprintf("127.79.1.%d", i+1))
	}
	for range 50 {
		p := 20000 + rand.IntN(20000)
		if free("127.79.0.2", p) && free("127.79.0.1", p+1) && n.allFree(p) {
			n.api = net.JoinHostPort("127.79.0.2", strconv.Itoa(p))
			n.vip, n.vipPort = "127.79.0.1", p+1
			n.zmqPort = p + 2
			return n, nil
		}
	}
	return nil, errors.New("no free port set on 127.79.0.0/16 after 50 tries")
}

func (n *network) allFree(p int) bool {
	for _, ip := range n.epIPs {
		if !free(ip, p+2) || !free(ip, p+2+replayOffset) {
			return false
		}
	}
	return true
}

func free(host string, port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// daemon is the kvgate process under test.
type daemon struct {
	api    string
	cmd    *exec.Cmd
	logs   *os.File
	exited chan struct{}
	err    error
	client *http.Client
}

func startDaemon(bin, repo, tmp string, n *network, env []string) (*daemon, error) {
	tokDir := filepath.Join(tmp, "tokenizers")
	if err := os.MkdirAll(tokDir, 0o755); err != nil {
		return nil, err
	}
	if err := os.Symlink(filepath.Join(repo, "pkg/tokenizer/testdata/qwen3"), filepath.Join(tokDir, "Qwen__Qwen3-0.6B")); err != nil {
		return nil, err
	}
	logs, err := os.Create(filepath.Join(tmp, "kvgate.log"))
	if err != nil {
		return nil, err
	}
	d := &daemon{api: "http://" + n.api, logs: logs, exited: make(chan struct{}), client: &http.Client{Timeout: 10 * time.Second}}
	d.cmd = exec.Command(bin, "--api", n.api, "--state-dir", filepath.Join(tmp, "state"), "--tokenizer-dir", tokDir,
		"--datapath", "userspace", "--log-level", "warn")
	d.cmd.Env = append(append(os.Environ(), "LLB_KV_NONE_HASH_SEED=0"), env...)
	d.cmd.Stdout, d.cmd.Stderr = logs, logs
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start kvgate: %w", err)
	}
	go func() { d.err = d.cmd.Wait(); close(d.exited) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := d.alive(); err != nil {
			return nil, err
		}
		resp, err := d.client.Get(d.api + "/netlox/v1/config/loadbalancer/all")
		if err == nil {
			_ = resp.Body.Close()
			return d, nil
		}
		if time.Now().After(deadline) {
			d.stop()
			return nil, fmt.Errorf("kvgate API not up after 30 s: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (d *daemon) alive() error {
	select {
	case <-d.exited:
		return fmt.Errorf("kvgate exited: %w\n%s", d.err, d.tail())
	default:
		return nil
	}
}

func (d *daemon) tail() string {
	b, _ := os.ReadFile(d.logs.Name())
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func (d *daemon) stop() {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(15 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
	_ = d.logs.Close()
}

// createRule makes one kvExactMode-3 rule over every endpoint. The
// endpoints' HTTP ports have no server: health probes fail, and probe-down
// endpoints keep their subscribers and inventories (docs/ingest.md).
func (d *daemon) createRule(n *network) error {
	var eps []map[string]any
	for _, ip := range n.epIPs {
		eps = append(eps, map[string]any{"endpointIP": ip, "targetPort": n.vipPort, "weight": 1})
	}
	args := map[string]any{"externalIP": n.vip, "port": n.vipPort, "protocol": "tcp", "sel": 0, "mode": 4,
		"kvExactMode": 3, "kvZmqPort": n.zmqPort, "kvHashAlgo": "sha256_cbor", "kvBlockSize": 16}
	body, _ := json.Marshal(map[string]any{"serviceArguments": args, "endpoints": eps})
	resp, err := d.client.Post(d.api+"/netlox/v1/config/loadbalancer", "application/json", bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("create rule: %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("create rule: HTTP %d: %s", resp.StatusCode, b)
	}
	return nil
}

// metrics is one scrape of /netlox/v1/metrics: every sample line, by name.
type metrics map[string][]metricSample

type metricSample struct {
	labels string // the text between the braces
	value  float64
}

func (d *daemon) scrape() (metrics, error) {
	resp, err := d.client.Get(d.api + "/netlox/v1/metrics")
	if err != nil {
		return nil, fmt.Errorf("scrape: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape: HTTP %d", resp.StatusCode)
	}
	m := metrics{}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 64<<20))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		name, labels := line[:sp], ""
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name, labels = name[:i], name[i+1:len(name)-1]
		}
		m[name] = append(m[name], metricSample{labels, v})
	}
	return m, sc.Err()
}

// sum adds the samples of name whose labels include every pair of want.
func (m metrics) sum(name string, want map[string]string) float64 {
	var s float64
	for _, x := range m[name] {
		if x.has(want) {
			s += x.value
		}
	}
	return s
}

func (m metrics) count(name string, ok func(float64) bool) int {
	n := 0
	for _, x := range m[name] {
		if ok(x.value) {
			n++
		}
	}
	return n
}

func (x metricSample) has(want map[string]string) bool {
	for k, v := range want {
		if !strings.Contains(x.labels, k+`="`+v+`"`) {
			return false
		}
	}
	return true
}

func (d *daemon) memory(m metrics) memory {
	rss, hwm := procStatus(d.cmd.Process.Pid)
	return memory{RSS: rss, HWM: hwm, HeapInuse: m.sum("go_memstats_heap_inuse_bytes", nil),
		HeapIdle: m.sum("go_memstats_heap_idle_bytes", nil), Released: m.sum("go_memstats_heap_released_bytes", nil),
		GoSys: m.sum("go_memstats_sys_bytes", nil)}
}

// procStatus reads VmRSS and VmHWM (bytes) from /proc/PID/status.
func procStatus(pid int) (rss, hwm float64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb * 1024
		case "VmHWM:":
			hwm = kb * 1024
		}
	}
	return rss, hwm
}

// cpu is the daemon's user + system CPU seconds from /proc/PID/stat
// (clock ticks of 1/100 s, Linux's USER_HZ).
func (d *daemon) cpu() float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", d.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (u + st) / 100
}
