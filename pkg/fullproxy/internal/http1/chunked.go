package http1

import (
	"bufio"
	"bytes"
	"errors"
	"io"
)

// ChunkedReader decodes a chunked body (RFC 9112 §7.1), bounding chunk-size
// lines and trailers. It reads request bodies and the response bodies a
// handler buffers; a relayed response body is followed byte by byte by
// BodyFraming instead (bodyend.go says why the two stay apart).
type ChunkedReader struct {
	br        *bufio.Reader
	remaining int64 // bytes left in the current chunk
	started   bool
	done      bool
	err       error
}

const maxChunkLine = 4096

// NewChunkedReader decodes the chunked body that follows on br.
func NewChunkedReader(br *bufio.Reader) *ChunkedReader { return &ChunkedReader{br: br} }

func (c *ChunkedReader) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if c.done {
		return 0, io.EOF
	}
	for c.remaining == 0 {
		if c.started {
			if err := c.expectCRLF(); err != nil {
				c.err = err
				return 0, err
			}
		}
		c.started = true
		size, err := c.readSize()
		if err != nil {
			c.err = err
			return 0, err
		}
		if size == 0 {
			if err := c.skipTrailers(); err != nil {
				c.err = err
				return 0, err
			}
			c.done = true
			return 0, io.EOF
		}
		c.remaining = size
	}
	if int64(len(p)) > c.remaining {
		p = p[:c.remaining]
	}
	n, err := c.br.Read(p)
	c.remaining -= int64(n)
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		c.err = err
	}
	return n, err
}

func (c *ChunkedReader) expectCRLF() error {
	line, err := readLine(c.br, 2)
	if err != nil {
		if errors.Is(err, ErrHeadTooLarge) {
			return badRequest("chunk data longer than its size")
		}
		return err
	}
	if !isBlank(line) {
		return badRequest("chunk data longer than its size")
	}
	return nil
}

func (c *ChunkedReader) readSize() (int64, error) {
	line, err := readLine(c.br, maxChunkLine)
	if err != nil {
		if errors.Is(err, ErrHeadTooLarge) {
			return 0, badRequest("chunk-size line too long")
		}
		return 0, err
	}
	line = bytes.TrimRight(line, "\r\n")
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i]
	}
	line = bytes.TrimRight(line, " \t")
	if len(line) == 0 || len(line) > 15 {
		return 0, badRequest("invalid chunk size")
	}
	var n int64
	for _, ch := range line {
		d := hexVal(ch) // the same digits BodyFraming takes
		if d < 0 {
			return 0, badRequest("invalid chunk size")
		}
		n = n<<4 | int64(d)
	}
	return n, nil
}

func (c *ChunkedReader) skipTrailers() error {
	total := 0
	for {
		line, err := readLine(c.br, maxChunkLine)
		if err != nil {
			if errors.Is(err, ErrHeadTooLarge) {
				return badRequest("trailer line too long")
			}
			return err
		}
		if isBlank(line) {
			return nil
		}
		if total += len(line); total > 16*maxChunkLine {
			return badRequest("trailers too large")
		}
	}
}

// LimitedBody fails with ErrBodyTooLarge once more than N bytes were read.
type LimitedBody struct {
	R   io.Reader
	N   int64 // bytes still allowed
	err error
}

func (l *LimitedBody) Read(p []byte) (int, error) {
	if l.err != nil {
		return 0, l.err
	}
	if int64(len(p)) > l.N+1 {
		p = p[:l.N+1]
	}
	n, err := l.R.Read(p)
	if int64(n) > l.N {
		l.err = ErrBodyTooLarge
		return int(l.N), l.err
	}
	l.N -= int64(n)
	return n, err
}
