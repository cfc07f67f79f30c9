//go:build linux

package vip

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// announce broadcasts one gratuitous ARP request for addr from link (sender
// and target IP both addr, RFC 5227 §3), so neighbours and switches move the
// VIP to this host at once instead of waiting for their ARP entries to age
// out. Links without an Ethernet address (lo) have no neighbours to tell.
func announce(link netlink.Link, addr netip.Addr) error {
	attrs := link.Attrs()
	mac := attrs.HardwareAddr
	if len(mac) != 6 || attrs.EncapType == "loopback" {
		return nil
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ARP)))
	if err != nil {
		return fmt.Errorf("packet socket: %w", err)
	}
	defer unix.Close(fd)
	frame := garpFrame(mac, addr)
	sa := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: attrs.Index, Halen: 6}
	copy(sa.Addr[:], broadcast)
	if err := unix.Sendto(fd, frame, 0, sa); err != nil {
		return fmt.Errorf("send gratuitous ARP: %w", err)
	}
	return nil
}

var broadcast = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// garpFrame builds the Ethernet frame of a gratuitous ARP request.
func garpFrame(mac net.HardwareAddr, addr netip.Addr) []byte {
	ip := addr.As4()
	f := make([]byte, 0, 42)
	f = append(f, broadcast...)
	f = append(f, mac...)
	f = binary.BigEndian.AppendUint16(f, unix.ETH_P_ARP)
	f = binary.BigEndian.AppendUint16(f, 1)      // hardware type: Ethernet
	f = binary.BigEndian.AppendUint16(f, 0x0800) // protocol type: IPv4
	f = append(f, 6, 4)                          // address lengths
	f = binary.BigEndian.AppendUint16(f, 1)      // op: request
	f = append(f, mac...)
	f = append(f, ip[:]...)
	f = append(f, 0, 0, 0, 0, 0, 0) // target hardware address: unknown
	f = append(f, ip[:]...)
	return f
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
