//go:build !linux

package inventory

import "errors"

// mapSlab is Linux only; elsewhere every shard stays on the Go heap.
func mapSlab(int) (raw, mem []byte, err error) {
	return nil, nil, errors.New("inventory: huge-page slabs need Linux")
}

func unmapSlab([]byte) {}

func populateSlab([]byte) {}

func dropPages([]byte) {}
