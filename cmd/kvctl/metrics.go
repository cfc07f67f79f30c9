package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"regexp"

	"github.com/spf13/cobra"
)

// newGetMetricsCmd is `kvctl get metrics [--grep RE]`.
func newGetMetricsCmd() *cobra.Command {
	var pattern string
	c := &cobra.Command{
		Use:   "metrics [--grep RE]",
		Short: "Print kvgate's Prometheus metrics, optionally only lines matching RE",
		Long: `Print GET /netlox/v1/metrics. With --grep, only the lines matching the regular
expression (Go syntax, like grep -E), e.g. the engagement check of docs/deploy.md:
  kvctl get metrics --grep 'loxilb_pd_kv|kv_subscriber_connected'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var re *regexp.Regexp
			if pattern != "" {
				var err error
				if re, err = regexp.Compile(pattern); err != nil {
					return badInput("--grep %q: %v", pattern, err)
				}
			}
			b, err := callAPI(cmd, http.MethodGet, "/netlox/v1/metrics", nil)
			if err != nil {
				return err
			}
			out := bufio.NewWriter(cmd.OutOrStdout())
			sc := bufio.NewScanner(bytes.NewReader(b))
			sc.Buffer(make([]byte, 64<<10), 16<<20)
			for sc.Scan() {
				if re == nil || re.Match(sc.Bytes()) {
					out.Write(sc.Bytes())
					out.WriteByte('\n')
				}
			}
			if err := sc.Err(); err != nil {
				return fmt.Errorf("reading metrics: %w", err)
			}
			return out.Flush()
		},
	}
	c.Flags().StringVar(&pattern, "grep", "", "only print lines matching this regular expression")
	return c
}
