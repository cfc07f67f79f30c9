package enginesim

import (
	"errors"
	"fmt"
)

// StartGroup starts n engines that publish KV events on one port, as the
// engines behind one rule do (a rule has one kvZmqPort). pickPort draws a
// candidate port; config(i, port) is engine i's configuration with that KV
// port. When an engine cannot start (the port is taken on its host), the
// engines started so far are closed and another port is drawn, up to
// attempts times. It returns the engines and their KV port.
func StartGroup(n, attempts int, pickPort func() (int, error), config func(i, port int) Config) ([]*Engine, int, error) {
	lastErr := errors.New("no attempt made")
	for range attempts {
		port, err := pickPort()
		if err != nil {
			return nil, 0, err
		}
		engines := make([]*Engine, 0, n)
		for i := range n {
			e, err := New(config(i, port))
			if err != nil {
				lastErr = err
				break
			}
			engines = append(engines, e)
		}
		if len(engines) == n {
			return engines, port, nil
		}
		for _, e := range engines {
			e.Close()
		}
	}
	return nil, 0, fmt.Errorf("start %d engines: %w", n, lastErr)
}
