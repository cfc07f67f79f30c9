package zmtpguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// Scheme is the zmq4 transport name of a bounded TCP connection:
// "kvgate-tcp://host:port;max=N" (see Endpoint).
const Scheme = "kvgate-tcp"

const maxParam = ";max="

// init registers the transport once, as zmq4 registers its own "tcp": the
// value is stateless (the bound is in each address), so nothing mutable is
// shared between sockets.
func init() {
	if err := zmq4.RegisterTransport(Scheme, tcpTransport{}); err != nil {
		panic(fmt.Sprintf("zmtpguard: register %s transport: %v", Scheme, err))
	}
}

// Endpoint returns the zmq4 endpoint that dials host:port over TCP with every
// frame and message bounded by maxFrame bytes.
func Endpoint(host string, port int, maxFrame uint64) string {
	return Scheme + "://" + net.JoinHostPort(host, strconv.Itoa(port)) + maxParam + strconv.FormatUint(maxFrame, 10)
}

// Wrap turns a "tcp://host:port" endpoint into its bounded form; any other
// scheme is returned unchanged (inproc and ipc peers are local processes).
func Wrap(endpoint string, maxFrame uint64) string {
	hp, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return endpoint
	}
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return endpoint
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return endpoint
	}
	return Endpoint(host, p, maxFrame)
}

// parseAddr splits "host:port;max=N".
func parseAddr(addr string) (hostport string, maxFrame uint64, err error) {
	hostport, m, ok := strings.Cut(addr, maxParam)
	if !ok {
		return "", 0, fmt.Errorf("zmtpguard: address %q has no %q bound", addr, maxParam)
	}
	maxFrame, err = strconv.ParseUint(m, 10, 64)
	if err != nil || maxFrame < MinMaxFrameBytes {
		return "", 0, fmt.Errorf("zmtpguard: address %q: bound must be an integer ≥ %d", addr, MinMaxFrameBytes)
	}
	if _, _, err := net.SplitHostPort(hostport); err != nil {
		return "", 0, fmt.Errorf("zmtpguard: address %q: %w", addr, err)
	}
	return hostport, maxFrame, nil
}

type tcpTransport struct{}

func (tcpTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	hp, maxFrame, err := parseAddr(addr)
	if err != nil {
		return nil, err
	}
	c, err := d.DialContext(ctx, "tcp", hp)
	if err != nil {
		return nil, err
	}
	return NewConn(c, maxFrame), nil
}

// Listen is not offered: kvgate only dials engines. A bounded listener would
// wrap accepted connections the same way if one is ever needed.
func (tcpTransport) Listen(context.Context, string) (net.Listener, error) {
	return nil, errors.New("zmtpguard: listen is not supported; kvgate only dials KV publishers")
}

func (tcpTransport) Addr(ep string) (string, error) {
	if _, _, err := parseAddr(ep); err != nil {
		return "", err
	}
	return ep, nil
}
