package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/pkg/preflight"
)

func init() { root.AddCommand(newPreflightCmd()) }

// errChecksFailed is returned, after the table is printed, when a check
// failed: kvctl then exits 1.
var errChecksFailed = errors.New("preflight failed: fix the FAIL rows above and run it again")

// newPreflightCmd is `kvctl preflight --service-id N [--no-probe] [--json]`.
func newPreflightCmd() *cobra.Command {
	var serviceID int
	var noProbe, asJSON bool
	c := &cobra.Command{
		Use:   "preflight --service-id N [--no-probe] [--json]",
		Short: "Check that a KV rule will actually route by cache (the spec's §6 and §9 gate)",
		Long: `Ask kvgate to check a KV rule end to end, since kvctl's host may not reach the
engines: each endpoint's /health and /v1/models, what kvgate's model discovery
read from it (a WARN when the read failed or no served model has a staged
tokenizer), its vLLM metric families and
cache config against the rule (block size, hash algorithm), the KV-event port and
kvgate's subscriber, the staged tokenizer of every served model against the
engine's /tokenize, the live parity state of each endpoint, and a probe: a unique
prompt of at least 3 blocks through the rule's VIP, twice, which must store the
hashes kvgate predicted and then hit the same engine by KV overlap. Each check
prints PASS, WARN, FAIL or SKIP with the fix. Read-only apart from the two probe
requests (--no-probe skips them). See docs/preflight.md.

Exit codes: 0 no check failed, 1 a check failed, 2 the preflight could not run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if serviceID < 1 {
				return badInput("--service-id is required (>= 1; see kvctl get lb)")
			}
			q := url.Values{"service_id": {strconv.Itoa(serviceID)}}
			if noProbe {
				q.Set("probe", "0")
			}
			stop := progress(cmd.ErrOrStderr(), fmt.Sprintf("preflight: running the checks of service %d (probe %v)", serviceID, !noProbe))
			b, err := callAPI(cmd, http.MethodPost, "/netlox/v1/config/ai/kv/preflight?"+q.Encode(), nil)
			stop()
			if err != nil {
				return &inputError{msg: "preflight could not run: " + err.Error()}
			}
			var rep preflight.Report
			if err := json.Unmarshal(b, &rep); err != nil || rep.Result == "" {
				return &inputError{msg: fmt.Sprintf("preflight could not run: the API answer is not a preflight report: %v", err)}
			}
			out := cmd.OutOrStdout()
			if asJSON {
				_, err = out.Write(append(bytes.TrimRight(b, "\n"), '\n'))
			} else {
				err = printPreflight(out, rep)
			}
			if err != nil {
				return err
			}
			if rep.Result == preflight.Fail {
				return errChecksFailed
			}
			return nil
		},
	}
	c.Flags().IntVar(&serviceID, "service-id", 0, "the rule's service_id (see kvctl get lb)")
	c.Flags().BoolVar(&noProbe, "no-probe", false, "skip the two probe requests through the VIP")
	c.Flags().BoolVar(&asJSON, "json", false, "print the API's JSON report")
	addAPIFlags(c.Flags())
	return c
}

// printPreflight prints the report as a table, each fix on the line below its row.
func printPreflight(w io.Writer, rep preflight.Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tEP\tRESULT\tDETAIL")
	for _, c := range rep.Checks {
		ep := "-"
		if c.EPIdx >= 0 {
			ep = strconv.Itoa(c.EPIdx)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.ID, ep, strings.ToUpper(c.Result), oneLine(c.Detail))
		if c.Fix != "" && c.Result != preflight.Pass {
			fmt.Fprintf(tw, "\t\t\tfix: %s\n", oneLine(c.Fix))
		}
	}
	fmt.Fprintf(tw, "\npreflight: %s\n", strings.ToUpper(rep.Result))
	return tw.Flush()
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// progress prints what is running now and then every 2 s how long it has
// taken, so a slow check (the probe waits for the engine) does not look like a
// hang; the returned func stops it.
func progress(w io.Writer, what string) (stop func()) {
	fmt.Fprintln(w, what+"…")
	done := make(chan struct{})
	finished := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(finished)
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fmt.Fprintf(w, "  still running, %.0f s\n", time.Since(start).Seconds())
			}
		}
	}()
	return func() { close(done); <-finished }
}
