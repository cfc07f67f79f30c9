package selector

import (
	"fmt"
	"sync"
	"testing"
)

// TestConcurrentUse exercises Decide, Commit, DropEndpoint and SetRule from
// several goroutines (run with -race).
func TestConcurrentUse(t *testing.T) {
	r := pdRule([]int{0, 1, 2, 3}, []int{4, 5})
	r.CacheAware = true
	s, err := New(r, DefaultOptions(), Deps{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				req := &Request{SessionKey: fmt.Sprint("k", i%37), TrieText: fmt.Sprint("text ", i%11), HasText: true, Model: "m", Hashes: []uint64{1, 2}}
				a := s.Begin(req)
				d := a.Decide()
				if d.Endpoint >= 0 && i%5 == 0 {
					a.Exclude(d.Endpoint)
					a.Decide()
				}
				a.Commit()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 200; i++ {
			s.DropEndpoint(i % 6)
			if i%50 == 0 {
				_ = s.SetRule(r)
			}
		}
	}()
	wg.Wait()
}
