package fullproxy

import (
	"fmt"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"
)

// BenchmarkDepartedClientBeforeHead measures how long after a client
// closes its connection, while kvgate waits for the response head, the
// backend sees its connection close: the 100 ms goal of docs/dataplane.md
// ("Hung engines and departed clients"). Reported as the median and the
// slowest of b.N departures, for a client that leaves at once (the watch
// starts after clientWatchDelay) and one that leaves after 20 ms.
//
//	go test -run '^$' -bench DepartedClientBeforeHead -benchtime 200x ./pkg/fullproxy/
func BenchmarkDepartedClientBeforeHead(b *testing.B) {
	for _, stay := range []time.Duration{0, 20 * time.Millisecond} {
		b.Run(fmt.Sprintf("leaves_after=%s", stay), func(b *testing.B) {
			hung := startHungBackend(b, true)
			hung.release()
			s := benchProxy(b, Config{Handler: NewForward(&staticRouter{addrs: []string{hung.addr}}, nil),
				Limits: Limits{ResponseHeaderTimeout: time.Minute}})
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				c, err := net.Dial("tcp", s.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
				waitCh(b, hung.gotCh, "the request reached the backend", 10*time.Second)
				time.Sleep(stay)
				left := time.Now()
				c.Close()
				waitCh(b, hung.eofCh, "the backend connection closed", 10*time.Second)
				lat = append(lat, hung.lastClosed().Sub(left))
			}
			reportLatencies(b, lat, "departure")
		})
	}
}

// BenchmarkEndpointDownAnswer measures how long after EndpointDown a
// request waiting on the hung endpoint gets its re-routed answer.
//
//	go test -run '^$' -bench EndpointDownAnswer -benchtime 200x ./pkg/fullproxy/
func BenchmarkEndpointDownAnswer(b *testing.B) {
	hung := startHungBackend(b, true)
	hung.release()
	healthy := startBenchBackend(b)
	s := benchProxy(b, Config{Handler: NewForward(&staticRouter{addrs: []string{hung.addr, healthy}}, nil),
		Limits: Limits{ResponseHeaderTimeout: time.Minute}})
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		res := postAsync(s.Addr().String(), `{"prompt":"x"}`, false)
		waitCh(b, hung.gotCh, "the request reached the hung endpoint", 10*time.Second)
		down := time.Now()
		s.EndpointDown(0)
		r := <-res
		if r.status != 200 {
			b.Fatalf("answer %+v", r)
		}
		lat = append(lat, time.Since(down))
		waitCh(b, hung.eofCh, "the hung endpoint's connection closed", 10*time.Second)
	}
	reportLatencies(b, lat, "answer")
}

func reportLatencies(b *testing.B, lat []time.Duration, what string) {
	b.StopTimer()
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), what+"-median-µs")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds()), what+"-max-µs")
}

func benchProxy(b *testing.B, cfg Config) *Server {
	b.Helper()
	cfg.Addr = "127.0.0.1:0"
	cfg.Logger = slog.New(slog.DiscardHandler)
	s, err := Listen(cfg)
	if err != nil {
		b.Fatal(err)
	}
	go s.Serve()
	b.Cleanup(func() { s.Close() })
	return s
}

// startBenchBackend is a minimal HTTP/1.1 backend answering every request
// with a small JSON body.
func startBenchBackend(b *testing.B) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				if _, err := c.Read(buf); err != nil {
					return
				}
				fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nx-engine-id: ep1\r\n\r\n{}")
			}()
		}
	}()
	return ln.Addr().String()
}
