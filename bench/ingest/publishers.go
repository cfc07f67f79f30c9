package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"sync"
	"time"
)

// publisher is one /usr/bin/python3 publisher.py process.
type publisher struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

type publishers struct{ list []*publisher }

type pubResult struct {
	OK      bool    `json:"ok"`
	Error   string  `json:"error"`
	Hashes  int     `json:"hashes"`
	Seconds float64 `json:"seconds"`
	CPU     float64 `json:"cpu"`
}

func startPublishers(repo string, n *network, c config) (*publishers, error) {
	ps := &publishers{}
	script := filepath.Join(repo, "bench/ingest/publisher.py")
	for i, ip := range n.epIPs {
		cmd := exec.Command("/usr/bin/python3", script, fmt.Sprintf("tcp://%s:%d", ip, n.zmqPort),
			fmt.Sprintf("tcp://%s:%d", ip, n.zmqPort+replayOffset), fmt.Sprint(i+1))
		in, err := cmd.StdinPipe()
		if err != nil {
			ps.stop()
			return nil, err
		}
		outPipe, err := cmd.StdoutPipe()
		if err != nil {
			ps.stop()
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			ps.stop()
			return nil, fmt.Errorf("start publisher %d: %w", i, err)
		}
		sc := bufio.NewScanner(outPipe)
		sc.Buffer(make([]byte, 0, 4096), 1<<20)
		ps.list = append(ps.list, &publisher{cmd: cmd, in: in, out: sc})
	}
	for i, p := range ps.list {
		if _, err := p.read(30 * time.Second); err != nil {
			ps.stop()
			return nil, fmt.Errorf("publisher %d: %w", i, err)
		}
	}
	gen := map[string]any{"op": "gen", "live": c.perEndpoint(), "pool": c.poolBatches() * c.batch, "batch": c.batch, "tokens": c.tokens}
	if err := ps.all(gen, nil); err != nil {
		ps.stop()
		return nil, err
	}
	return ps, nil
}

// read waits for the publisher's next answer line, bounded by d.
func (p *publisher) read(d time.Duration) (pubResult, error) {
	type line struct {
		r   pubResult
		err error
	}
	ch := make(chan line, 1)
	go func() {
		if !p.out.Scan() {
			err := p.out.Err()
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			ch <- line{err: fmt.Errorf("publisher exited: %w", err)}
			return
		}
		var r pubResult
		if err := json.Unmarshal(p.out.Bytes(), &r); err != nil {
			ch <- line{err: fmt.Errorf("publisher answer %q: %w", p.out.Text(), err)}
			return
		}
		if !r.OK {
			ch <- line{err: fmt.Errorf("publisher: %s", r.Error)}
			return
		}
		ch <- line{r: r}
	}()
	select {
	case l := <-ch:
		return l.r, l.err
	case <-time.After(d):
		// The reader goroutine ends when stop kills the process.
		return pubResult{}, fmt.Errorf("no answer from the publisher in %s", d)
	}
}

// all sends cmd to every publisher at once and collects their answers.
func (ps *publishers) all(cmd map[string]any, out *[]pubResult) error {
	line, _ := json.Marshal(cmd)
	line = append(line, '\n')
	wait := 30 * time.Minute // the longest command: encoding 12.5M hashes, or a churn phase
	if s, ok := cmd["seconds"].(float64); ok {
		wait += time.Duration(s * float64(time.Second))
	}
	res := make([]pubResult, len(ps.list))
	errs := make([]error, len(ps.list))
	var wg sync.WaitGroup
	for i, p := range ps.list {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := p.in.Write(line); err != nil {
				errs[i] = fmt.Errorf("publisher %d: %w", i, err)
				return
			}
			res[i], errs[i] = p.read(wait)
		}()
	}
	wg.Wait()
	if out != nil {
		*out = res
	}
	return errors.Join(errs...)
}

func (ps *publishers) stop() {
	for _, p := range ps.list {
		_ = p.in.Close()
	}
	for _, p := range ps.list {
		done := make(chan struct{})
		go func() { _ = p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
		}
	}
}
