package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/pkg/status"
)

func init() { root.AddCommand(newStatusCmd()) }

// Bounds of --interval: faster than the page's own refresh is pointless,
// slower than an hour is not watching.
const (
	minWatchInterval = 500 * time.Millisecond
	maxWatchInterval = time.Hour
)

// newStatusCmd is `kvctl status [--watch]`: the status page as a table.
func newStatusCmd() *cobra.Command {
	var (
		asJSON, watch bool
		interval      time.Duration
		count         int
	)
	c := &cobra.Command{
		Use:   "status [--watch]",
		Short: "Show the fleet: rules, endpoints, hits, misses and problems (the status page as a table)",
		Long: `Show what kvgate's status page shows (GET /netlox/v1/status): the problems to look at
first, then per rule its mode, contract, parity state, hits and misses by reason over the
last minutes, and per endpoint its role, health, breaker, admin state, in-flight requests,
inventory blocks, subscriber state, last-event age, hits, a hit-rate spark line and the
models its GET /v1/models listed (adapters as name<parent>; when read; a failed read).

--watch redraws every --interval until interrupted (or --count times).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval < minWatchInterval || interval > maxWatchInterval {
				return badInput("--interval %s: want %s to %s", interval, minWatchInterval, maxWatchInterval)
			}
			if count < 0 {
				return badInput("--count %d: want 0 (until interrupted) or more", count)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			out := cmd.OutOrStdout()
			for i := 0; ; i++ {
				b, err := callAPI(cmd, http.MethodGet, "/netlox/v1/status", nil)
				if err != nil {
					return err
				}
				if asJSON {
					_, err = out.Write(append(b, '\n'))
				} else {
					var st status.Status
					if err := json.Unmarshal(b, &st); err != nil {
						return fmt.Errorf("decoding the API answer: %w", err)
					}
					if watch {
						fmt.Fprint(out, "\x1b[H\x1b[2J") // home and clear: redraw in place
					}
					err = printStatus(out, st)
				}
				if err != nil || !watch || (count > 0 && i+1 >= count) {
					return err
				}
				if !sleepCtx(ctx, interval) {
					return nil
				}
			}
		},
	}
	addAPIFlags(c.Flags())
	c.Flags().BoolVar(&asJSON, "json", false, "print the API's JSON")
	c.Flags().BoolVarP(&watch, "watch", "w", false, "redraw every --interval until interrupted")
	c.Flags().DurationVar(&interval, "interval", 2*time.Second, "with --watch, time between redraws")
	c.Flags().IntVar(&count, "count", 0, "with --watch, stop after this many redraws (0: until interrupted)")
	return c
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func printStatus(out io.Writer, st status.Status) error {
	fmt.Fprintf(out, "kvgate  data path %s  window %s  at %s\n\n", orDash(st.Datapath),
		(time.Duration(st.WindowSeconds) * time.Second).String(), st.GeneratedAt.Format(time.RFC3339))
	if len(st.Problems) == 0 {
		fmt.Fprintln(out, "No problems.")
	} else {
		fmt.Fprintln(out, "PROBLEMS")
		for _, p := range st.Problems {
			where := "rule " + strconv.Itoa(p.ServiceID)
			if p.EPIdx != nil {
				where += " ep " + strconv.Itoa(*p.EPIdx)
			}
			fmt.Fprintf(out, "  %-14s %-16s %s\n", where, p.Kind, p.Detail)
		}
	}
	if len(st.Rules) == 0 {
		fmt.Fprintln(out, "\nNo rules.")
		return nil
	}
	for _, r := range st.Rules {
		fmt.Fprintln(out)
		name := ""
		if r.Name != "" {
			name = " (" + r.Name + ")"
		}
		contract := "no KV tier"
		if r.Mode != "plain" {
			seed := "unset"
			if r.Contract.SeedSet {
				seed = "set"
			}
			contract = fmt.Sprintf("%s %s block %d seed %s", r.Contract.Engine, r.Contract.HashAlgo, r.Contract.BlockSize, seed)
		}
		fmt.Fprintf(out, "RULE %d%s  %s  %s  %s  parity %s  path %s\n", r.ServiceID, name, r.VIP, r.Mode, contract, r.Parity, r.Datapath)
		fmt.Fprintf(out, "  hits %s (total %s)  misses %s\n", num(r.HitsWindow), num(r.HitsTotal), misses(r.MissesWindow))
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  EP\tADDRESS\tROLE\tHEALTH\tBREAKER\tADMIN\tIN-FLIGHT\tBLOCKS\tSUBSCRIBER\tLAST EVENT\tHITS\tHIT RATE\tMODELS")
		for _, e := range r.Endpoints {
			sub, last := subscriberColumns(e.Subscriber)
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.EPIdx, e.Addr, e.Role, e.Health, e.Breaker, e.Admin,
				num(e.Inflight), num(e.Blocks), sub, last, num(e.HitsTotal), spark(e.HitRate), modelsColumn(e.Models))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// subscriberColumns are the SUBSCRIBER and LAST EVENT cells of an endpoint:
// "-" for an endpoint without a KV-event subscriber.
func subscriberColumns(s *status.Subscriber) (sub, last string) {
	if s == nil {
		return "-", "-"
	}
	sub = "down"
	if s.Connected {
		sub = "connected"
	}
	last = "never"
	if a := s.LastEventAgeSeconds; a >= 0 {
		last = (time.Duration(a) * time.Second).String() + " ago"
	}
	return sub, last
}

// modelsColumn is the MODELS cell: what the endpoint's /v1/models listed
// (adapters as name<parent>), when it was read, and a failed last read;
// "-" when the rule runs no model discovery.
func modelsColumn(m *status.EndpointModels) string {
	if m == nil {
		return "-"
	}
	names := slices.Clone(m.Served)
	for _, a := range m.Adapters {
		names = append(names, a.Name+"<"+a.Parent+">")
	}
	out := strings.Join(names, ",")
	switch {
	case m.CheckedAgeSeconds < 0:
		return "reading"
	case out == "":
		out = "none"
	}
	out += " (read " + (time.Duration(m.CheckedAgeSeconds) * time.Second).String() + " ago)"
	if m.Error != "" {
		out += " READ FAILED: " + oneLine(m.Error)
	}
	return printable(out)
}

// printable replaces control characters (C0 and C1: a terminal may act on
// them) with '?': the names come from the engines.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return '?'
		}
		return r
	}, s)
}

func misses(m map[string]float64) string {
	if len(m) == 0 {
		return "none"
	}
	reasons := make([]string, 0, len(m))
	for r := range m {
		reasons = append(reasons, r)
	}
	sort.Slice(reasons, func(i, j int) bool {
		return m[reasons[i]] > m[reasons[j]] || (m[reasons[i]] == m[reasons[j]] && reasons[i] < reasons[j])
	})
	parts := make([]string, len(reasons))
	for i, r := range reasons {
		parts[i] = r + " " + num(m[r])
	}
	return strings.Join(parts, ", ")
}

// spark draws values as one line of block characters, scaled to the largest.
func spark(values []float64) string {
	if len(values) == 0 {
		return "-"
	}
	const bars = "▁▂▃▄▅▆▇█"
	runes := []rune(bars)
	maxV := 0.0
	for _, v := range values {
		maxV = max(maxV, v)
	}
	var b strings.Builder
	for _, v := range values {
		i := 0
		if maxV > 0 {
			i = int(v / maxV * float64(len(runes)-1))
		}
		b.WriteRune(runes[i])
	}
	return b.String()
}

func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
