package main

import (
	"fmt"
	"os"
	"sync"
	"time"
)

// sample is the daemon's memory and inventory at one instant.
type sample struct {
	at     time.Duration // since the sampler started
	rss    float64
	hwm    float64
	heap   float64
	goSys  float64
	blocks float64
}

// sampler records RSS, the Go heap and the inventory size every interval.
type sampler struct {
	mu      sync.Mutex
	samples []sample
	quit    chan struct{}
	done    chan struct{}
	once    sync.Once
}

// maxSamples bounds the series (24 h at 1 s).
const maxSamples = 86_400

func startSampler(d *daemon, every time.Duration) *sampler {
	s := &sampler{quit: make(chan struct{}), done: make(chan struct{})}
	t0 := time.Now()
	go func() {
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			m, err := d.scrape()
			if err == nil {
				mem := d.memory(m)
				s.mu.Lock()
				if len(s.samples) < maxSamples {
					s.samples = append(s.samples, sample{at: time.Since(t0), rss: mem.RSS, hwm: mem.HWM, heap: mem.HeapInuse,
						goSys: mem.GoSys, blocks: m.sum("loxilb_pd_kv_blocks", nil)})
				}
				s.mu.Unlock()
			}
			select {
			case <-s.quit:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

func (s *sampler) stop() {
	s.once.Do(func() { close(s.quit) })
	<-s.done
}

func (s *sampler) mark() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.samples)
}

func (s *sampler) since(mark int) []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sample(nil), s.samples[mark:]...)
}

func (s *sampler) peak() memory {
	s.mu.Lock()
	defer s.mu.Unlock()
	var p memory
	for _, x := range s.samples {
		p.RSS = max(p.RSS, x.rss)
		p.HWM = max(p.HWM, x.hwm)
		p.HeapInuse = max(p.HeapInuse, x.heap)
		p.GoSys = max(p.GoSys, x.goSys)
	}
	return p
}

func (s *sampler) writeCSV(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintln(f, "seconds,vm_rss,vm_hwm,go_heap_inuse,go_sys,blocks")
	for _, x := range s.samples {
		fmt.Fprintf(f, "%.1f,%.0f,%.0f,%.0f,%.0f,%.0f\n", x.at.Seconds(), x.rss, x.hwm, x.heap, x.goSys, x.blocks)
	}
	return f.Close()
}
