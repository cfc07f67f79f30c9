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

// announce tells the link's neighbours that addr now lives here, so they and
// the switches move the VIP at once instead of waiting for their caches to
// age out: a gratuitous ARP request for IPv4 (sender and target IP both addr,
// RFC 5227 §3), an unsolicited neighbour advertisement to all nodes for IPv6
// (RFC 4861 §7.2.6). Links without an Ethernet address (lo) have no
// neighbours to tell.
func announce(link netlink.Link, addr netip.Addr) error {
	attrs := link.Attrs()
	mac := attrs.HardwareAddr
	if len(mac) != 6 || attrs.EncapType == "loopback" {
		return nil
	}
	if addr.Is6() {
		return advertise(attrs.Index, mac, addr)
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

// advertise sends one unsolicited neighbour advertisement for addr out of
// the interface ifindex, to ff02::1 with hop limit 255 (receivers drop any
// other), Override set so caches replace the old link-layer address.
func advertise(ifindex int, mac net.HardwareAddr, addr netip.Addr) error {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6)
	if err != nil {
		return fmt.Errorf("icmpv6 socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_HOPS, 255); err != nil {
		return fmt.Errorf("hop limit: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_IF, ifindex); err != nil {
		return fmt.Errorf("multicast interface: %w", err)
	}
	sa := &unix.SockaddrInet6{Addr: netip.MustParseAddr("ff02::1").As16(), ZoneId: uint32(ifindex)}
	// The kernel fills in the ICMPv6 checksum of raw ICMPv6 sockets.
	if err := unix.Sendto(fd, unsolicitedNA(mac, addr), 0, sa); err != nil {
		return fmt.Errorf("send neighbour advertisement: %w", err)
	}
	return nil
}

// unsolicitedNA builds the ICMPv6 message of an unsolicited neighbour
// advertisement for addr, with its target link-layer address option.
func unsolicitedNA(mac net.HardwareAddr, addr netip.Addr) []byte {
	ip := addr.As16()
	m := make([]byte, 0, 32)
	m = append(m, 136, 0, 0, 0)  // type: neighbour advertisement, code 0, checksum (kernel's)
	m = append(m, 0x20, 0, 0, 0) // flags: Override; not Router, not Solicited
	m = append(m, ip[:]...)      // target address
	m = append(m, 2, 1)          // option: target link-layer address, 8 bytes
	m = append(m, mac...)
	return m
}
