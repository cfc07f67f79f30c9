// Command kvctl is kvgate's operator CLI: it manages rules over the
// management API and runs the parity tools (hash, events, tokenize) locally.
//
// Each subcommand lives in its own file and registers itself on root from an
// init function, so commands can be added without touching this file.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

var root = &cobra.Command{
	Use:   "kvctl",
	Short: "kvctl: operate kvgate and check vLLM block-hash parity",
	Long: `kvctl manages kvgate's load-balancer rules through its management API and runs
kvgate's parity tools locally: block hashes (hash), KV-event payloads (events)
and tokenization (tokenize).

Exit codes: 0 success, 1 failure (for example an API error), 2 bad input.`,
	SilenceUsage:  true,
	SilenceErrors: true,
}

// inputError marks bad input (a flag value, a file line): kvctl exits 2.
type inputError struct{ msg string }

func (e *inputError) Error() string { return e.msg }

// badInput builds an inputError; the message should name the flag or line.
func badInput(format string, args ...any) error {
	return &inputError{msg: fmt.Sprintf(format, args...)}
}

func main() {
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &inputError{msg: err.Error()} })
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kvctl:", err)
		var in *inputError
		if errors.As(err, &in) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}
