package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/spf13/cobra"
)

// newGetInventoryCmd is `kvctl get kvinventory --service-id=ID --ep-idx=N`.
func newGetInventoryCmd() *cobra.Command {
	var serviceID, epIdx int
	var summary bool
	c := &cobra.Command{
		Use:     "kvinventory --service-id=ID --ep-idx=N",
		Aliases: []string{"kv-inventory"},
		Short:   "Show one endpoint's mirrored KV block-hash inventory",
		Long: `Show the 64-bit block hashes kvgate mirrors for one KV endpoint (a prefill
endpoint in kvExactMode 1, any endpoint in mode 3), as JSON in the reference
gateway's shape, blocks sorted by hash. service_id is in kvctl get lb.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if serviceID < 1 {
				return badInput("--service-id is required (>= 1; see kvctl get lb)")
			}
			if epIdx < 0 {
				return badInput("--ep-idx is required (>= 0)")
			}
			q := url.Values{"service_id": {strconv.Itoa(serviceID)}, "ep_idx": {strconv.Itoa(epIdx)}}
			b, err := callAPI(cmd, http.MethodGet, "/netlox/v1/config/ai/kv/inventory?"+q.Encode(), nil)
			if err != nil {
				return err
			}
			if summary {
				var inv struct {
					ServiceID int    `json:"service_id"`
					EPIdx     int    `json:"ep_idx"`
					HashAlgo  string `json:"hash_algo"`
					Total     int    `json:"total"`
				}
				if err := json.Unmarshal(b, &inv); err != nil {
					return fmt.Errorf("decoding the API answer: %w", err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "service_id %d ep_idx %d hash_algo %s: %d blocks\n", inv.ServiceID, inv.EPIdx, inv.HashAlgo, inv.Total)
				return nil
			}
			_, err = cmd.OutOrStdout().Write(append(bytes.TrimRight(b, "\n"), '\n'))
			return err
		},
	}
	c.Flags().IntVar(&serviceID, "service-id", 0, "the rule's service_id")
	c.Flags().IntVar(&epIdx, "ep-idx", -1, "the endpoint's ep_idx")
	c.Flags().BoolVar(&summary, "summary", false, "print only the block count")
	return c
}
