package inventory

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mapSlab maps size bytes of anonymous memory starting on a huge-page
// boundary, advised for transparent huge pages. THP "madvise" mode (the
// default of most distributions) honours the advice; "never" leaves 4 KiB
// pages, which still works. raw is the whole mapping, for unmapSlab: it is
// one huge page longer than mem so mem can be aligned; the unaligned head and
// tail are never touched and cost no memory.
func mapSlab(size int) (raw, mem []byte, err error) {
	raw, err = unix.Mmap(-1, 0, size+hugePageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, nil, fmt.Errorf("inventory: map %d bytes: %w", size, err)
	}
	head := (hugePageSize - int(uintptr(unsafe.Pointer(&raw[0])))%hugePageSize) % hugePageSize
	mem = raw[head : head+size : head+size]
	// Advise whole huge pages only: a partial last page stays on 4 KiB pages,
	// so it is resident only as far as it is used. Advice failure only costs
	// the huge pages.
	if whole := size &^ (hugePageSize - 1); whole > 0 {
		_ = unix.Madvise(mem[:whole], unix.MADV_HUGEPAGE)
	}
	return raw, mem, nil
}

func unmapSlab(raw []byte) {
	if len(raw) > 0 {
		_ = unix.Munmap(raw)
	}
}

// populateSlab faults mem in for writing (MADV_POPULATE_WRITE, Linux ≥ 5.14),
// so the writer that later fills it does not pay the kernel's zeroing.
// Failure (an older kernel) only leaves the pages to be faulted on first
// touch, as without it.
func populateSlab(mem []byte) {
	if len(mem) > 0 {
		_ = unix.Madvise(mem, unix.MADV_POPULATE_WRITE)
	}
}

// dropPages returns mem's pages to the kernel; they read as zero after.
func dropPages(mem []byte) {
	if len(mem) > 0 {
		_ = unix.Madvise(mem, unix.MADV_DONTNEED)
	}
}
